"""Run ids do not move: the id of every run a shipped spec plans is pinned here, and every config
field added after the first hashed set must carry the config.NEW mark (config.new(...): left out of
the hash at its default) or, when it never changes results, the config.NO_RESULT mark
(config.no_result(...): left out at any value), so that a new field cannot silently rename every finished run (and a
rerun retrain them all).

When a change is MEANT to move ids (a default changed, so the trained model changes), update the
pins in the same commit and say why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from anatomy_cli.spec.components import label
from anatomy_cli.spec.config import (
    ANY,
    NEW,
    NO_RESULT,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    hash_neutral,
    load_run_config,
)
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import expand, load_spec

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"

# The fields that have always been in the hash (at any value). Every other field must be NEW-marked.
HASHED = {
    "": {"name", "seed"},
    "model": {"vocab_size", "d_model", "n_layer", "n_head", "n_kv_head", "ctx_len", "norm_type", "norm_pos",
              "pos_type", "ffn_type", "rope_base", "norm_eps", "rope_variant"},
    "train": {"steps", "batch_size", "lr", "min_lr_frac", "schedule", "warmup", "weight_decay", "beta1", "beta2",
              "grad_clip", "eval_interval", "eval_batches", "log_interval", "diverge_factor", "device", "dtype",
              "compile", "compile_mode", "threads", "sample_prefix", "sample_temp", "sample_len"},
    "data": {"source", "val_frac"},
}
SECTIONS = {"": RunConfig, "model": ModelConfig, "train": TrainConfig, "data": DataConfig}

PINNED_IDS = {
    "ci-regression": [
        "2017+gqa-s1337-adee5096", "2017+prenorm-s1337-1c827b70", "2017+rmsnorm-s1337-25e5d07a",
        "2017+rope-s1337-71730bb9", "2017+swiglu-s1337-a2d66acc", "2017-s1337-01654518",
        "llama-gqa-s1337-d9440539", "llama-prenorm-s1337-0f519a5e", "llama-rmsnorm-s1337-bcc988c6",
        "llama-rope-s1337-af0e84d5", "llama-s1337-9ee2439b", "llama-swiglu-s1337-702f9da8",
    ],
    "cs336": [
        "reference+nonorm-s1337-a675840f", "reference+nonorm-s1338-37d129b0", "reference+nonorm-s1339-a2e16d7a",
        "reference+nope-s1337-c783088c", "reference+nope-s1338-1df9705b", "reference+nope-s1339-b32e5663",
        "reference+postnorm-s1337-eeb16ab1", "reference+postnorm-s1338-802c4f86",
        "reference+postnorm-s1339-8dc72dcb", "reference+silu-s1337-1dc6b150", "reference+silu-s1338-814697a3",
        "reference+silu-s1339-981d2c3e", "reference-s1337-f3e2fdb9", "reference-s1338-cea4f0b0",
        "reference-s1339-2c668323"
    ],
    "demo": [
        "2017+gqa-s1337-88bb20af", "2017+gqa-s1338-7006eb1f", "2017+gqa-s1339-c6210f4e", "2017+prenorm-s1337-622b9035",
        "2017+prenorm-s1338-d4727464", "2017+prenorm-s1339-2df98b16", "2017+rmsnorm-s1337-7e629ddf",
        "2017+rmsnorm-s1338-b186f137", "2017+rmsnorm-s1339-474f55ed", "2017+rope-s1337-3cb006dd",
        "2017+rope-s1338-811ad058", "2017+rope-s1339-f0f94728", "2017+swiglu-s1337-424f7ad3",
        "2017+swiglu-s1338-371e72f8", "2017+swiglu-s1339-3c3776ab", "2017-s1337-676b9f59", "2017-s1338-793b7feb",
        "2017-s1339-6aa59319", "llama-gqa-s1337-737e3d0a", "llama-gqa-s1338-e7829bdb", "llama-gqa-s1339-9f5a4bfd",
        "llama-prenorm-s1337-8748099a", "llama-prenorm-s1338-6f37cb74", "llama-prenorm-s1339-a69eb055",
        "llama-rmsnorm-s1337-5174340e", "llama-rmsnorm-s1338-e939b6ff", "llama-rmsnorm-s1339-d4ea4b58",
        "llama-rope-s1337-e734ca3c", "llama-rope-s1338-209bbd5f", "llama-rope-s1339-1f9547b9", "llama-s1337-1cc163e5",
        "llama-s1338-738ccb00", "llama-s1339-769b3e38", "llama-swiglu-s1337-658a71a6", "llama-swiglu-s1338-0b5d6b0c",
        "llama-swiglu-s1339-50c4e15f",
    ],
    "demo-tuned": [
        "2017+gqa-s1337-36865667", "2017+gqa-s1338-c7995aef", "2017+gqa-s1339-a350213b",
        "2017+prenorm-s1337-2ca43daf", "2017+prenorm-s1338-77dfb575", "2017+prenorm-s1339-ab782a59",
        "2017+rmsnorm-s1337-5dd8160c", "2017+rmsnorm-s1338-742c2f32", "2017+rmsnorm-s1339-a77f0554",
        "2017+rope-s1337-9a43126e", "2017+rope-s1338-de79db70", "2017+rope-s1339-803f59d9",
        "2017+swiglu-s1337-5a7e5a2e", "2017+swiglu-s1338-1a7dff2f", "2017+swiglu-s1339-c7de8e78",
        "2017-s1337-811c4a75", "2017-s1338-0508ecca", "2017-s1339-5ac2bee3",
        "llama-gqa-s1337-2192503c", "llama-gqa-s1338-94b3db73", "llama-gqa-s1339-9773d0c6",
        "llama-prenorm-s1337-e7b40260", "llama-prenorm-s1338-a014327e", "llama-prenorm-s1339-38da7131",
        "llama-rmsnorm-s1337-928aa01a", "llama-rmsnorm-s1338-7dab4517", "llama-rmsnorm-s1339-a86571ab",
        "llama-rope-s1337-5abad50b", "llama-rope-s1338-e38b0342", "llama-rope-s1339-1145912f",
        "llama-s1337-30dc1821", "llama-s1338-ec125582", "llama-s1339-48736647",
        "llama-swiglu-s1337-8706705a", "llama-swiglu-s1338-c08de3f6", "llama-swiglu-s1339-8f8439bd",
    ],
    "depth-stability": [
        "post-norm-s1337-17c13f33", "post-norm-s1338-7e6ffede", "post-norm-s1339-0f15bd10",
        "pre-norm-s1337-6d736339", "pre-norm-s1338-48cb9a98", "pre-norm-s1339-1b2168ca",
    ],
    "five-flips-seed": [
        "2017+gqa-s1337-05efd8a7", "2017+prenorm-s1337-eb624f56", "2017+rmsnorm-s1337-a36e5628",
        "2017+rope-s1337-b45db6dd", "2017+swiglu-s1337-e67fe45c", "2017-s1337-aa29626e",
        "llama-gqa-s1337-7ee6188a", "llama-prenorm-s1337-df5582c2", "llama-rmsnorm-s1337-1ec625e3",
        "llama-rope-s1337-592207f1", "llama-s1337-012c6e87", "llama-swiglu-s1337-a4fed945",
    ],
    "five-flips": [
        "2017+gqa-s1337-f163aa07", "2017+prenorm-s1337-90dd7a7c", "2017+rmsnorm-s1337-912d2bd0",
        "2017+rope-s1337-b2375d72", "2017+swiglu-s1337-59c09043", "2017-s1337-46b897f2",
        "llama-gqa-s1337-5b14c2f0", "llama-prenorm-s1337-1fca8d95", "llama-rmsnorm-s1337-d8408cf9",
        "llama-rope-s1337-53666033", "llama-s1337-56118034", "llama-swiglu-s1337-42e4e50d",
    ],
    "frontier": [
        "reference+gattn-s1337-818dd765", "reference+gattn-s1338-c762bcd6", "reference+gattn-s1339-fdbaf563",
        "reference+gdn-s1337-ecfec8d8", "reference+gdn-s1338-bfaa2682", "reference+gdn-s1339-d513596b",
        "reference+mla-s1337-4f5d2e81", "reference+mla-s1338-00cf03f6", "reference+mla-s1339-e7fa91ac",
        "reference+moe-s1337-2e7ad035", "reference+moe-s1338-201ffb34", "reference+moe-s1339-f55ce16c",
        "reference+partrope-s1337-b813b471", "reference+partrope-s1338-4bfa9633", "reference+partrope-s1339-bb9b5805",
        "reference+sinks-s1337-e94d3b75", "reference+sinks-s1338-6b7291da", "reference+sinks-s1339-2ff8326b",
        "reference+swa-s1337-76a84961", "reference+swa-s1338-51ac18a1", "reference+swa-s1339-c1024748",
        "reference-s1337-5cabdddd", "reference-s1338-f0d06a56", "reference-s1339-f268e66b",
    ],
    "long-context": [
        "reference+dsa64-s1337-b6291549", "reference+dsa64-s1338-12480273", "reference+dsa64-s1339-139dbce2",
        "reference+gdn-s1337-c899cc5f", "reference+gdn-s1338-03083434", "reference+gdn-s1339-e94cc5ab",
        "reference+swa64-s1337-109aae8e", "reference+swa64-s1338-0f847dca", "reference+swa64-s1339-9d487eed",
        "reference-s1337-417bfde1", "reference-s1338-fdc5bbae", "reference-s1339-4754ad97",
    ],
    "modern": [
        "reference+nope-s1337-a833906e", "reference+nope-s1338-2de69002", "reference+nope-s1339-0ca37b26",
        "reference+parallel-s1337-4d0a0bab", "reference+parallel-s1338-b1c521aa",
        "reference+parallel-s1339-9cf326a2", "reference+qknorm-s1337-2f589f45",
        "reference+qknorm-s1338-0baa4cd1", "reference+qknorm-s1339-0f5e33e8",
        "reference+softcap-s1337-c537cab5", "reference+softcap-s1338-b9d07633",
        "reference+softcap-s1339-60a59229", "reference+tied-s1337-5ccb8192", "reference+tied-s1338-08255927",
        "reference+tied-s1339-d7d0e0aa", "reference+zloss-s1337-0fdec345", "reference+zloss-s1338-a6fae1b7",
        "reference+zloss-s1339-c4eceb41", "reference-s1337-61c67967", "reference-s1338-c1673dd4",
        "reference-s1339-b6f1d65b",
    ],
    "scale": [
        "L_2017+gqa-s1337-c0f0c179", "L_2017+gqa-s1338-0daee170", "L_2017+gqa-s1339-b537f3e2",
        "L_2017+prenorm-s1337-7a2846b5", "L_2017+prenorm-s1338-e4e7d756", "L_2017+prenorm-s1339-910c6b45",
        "L_2017+rmsnorm-s1337-823d96d3", "L_2017+rmsnorm-s1338-c5f468a9", "L_2017+rmsnorm-s1339-5c2896f8",
        "L_2017+rope-s1337-9eab6a0f", "L_2017+rope-s1338-7772c1af", "L_2017+rope-s1339-5c50f9ce",
        "L_2017+swiglu-s1337-f05110b4", "L_2017+swiglu-s1338-8e414bf2", "L_2017+swiglu-s1339-927168d5",
        "L_2017-s1337-fa51b4f4", "L_2017-s1338-567a2b62", "L_2017-s1339-e6fa2c2c", "L_llama-gqa-s1337-3043b0a4",
        "L_llama-gqa-s1338-9e3c6c0d", "L_llama-gqa-s1339-88058395", "L_llama-prenorm-s1337-390200c8",
        "L_llama-prenorm-s1338-7a11b729", "L_llama-prenorm-s1339-ec7e63d4", "L_llama-rmsnorm-s1337-3e9e9416",
        "L_llama-rmsnorm-s1338-bba77137", "L_llama-rmsnorm-s1339-058420cf", "L_llama-rope-s1337-3a5cd7a9",
        "L_llama-rope-s1338-19b714c8", "L_llama-rope-s1339-3a78a8b8", "L_llama-s1337-6bd0cfc9",
        "L_llama-s1338-7ac7b5b4", "L_llama-s1339-ea87c78c", "L_llama-swiglu-s1337-c374bb35",
        "L_llama-swiglu-s1338-6792ca27", "L_llama-swiglu-s1339-34e6a990", "M_2017+gqa-s1337-380e2502",
        "M_2017+gqa-s1338-49e73c0b", "M_2017+gqa-s1339-81ac4300", "M_2017+prenorm-s1337-d00d9e49",
        "M_2017+prenorm-s1338-7085ed4e", "M_2017+prenorm-s1339-1358b381", "M_2017+rmsnorm-s1337-5e94f8ea",
        "M_2017+rmsnorm-s1338-44f41d95", "M_2017+rmsnorm-s1339-8d159f75", "M_2017+rope-s1337-0d830cdc",
        "M_2017+rope-s1338-5c2b57b9", "M_2017+rope-s1339-5e5fcb09", "M_2017+swiglu-s1337-28e6aa61",
        "M_2017+swiglu-s1338-f39a3179", "M_2017+swiglu-s1339-3d095e85", "M_2017-s1337-deb0afdd",
        "M_2017-s1338-cc4d2c4c", "M_2017-s1339-05e68066", "M_llama-gqa-s1337-3fb7b9fb",
        "M_llama-gqa-s1338-0375fed8", "M_llama-gqa-s1339-d40f7013", "M_llama-prenorm-s1337-ce7c7544",
        "M_llama-prenorm-s1338-bae09b69", "M_llama-prenorm-s1339-cbb55dd4", "M_llama-rmsnorm-s1337-f01e8185",
        "M_llama-rmsnorm-s1338-5c560065", "M_llama-rmsnorm-s1339-5d854c81", "M_llama-rope-s1337-6584425c",
        "M_llama-rope-s1338-0262cac4", "M_llama-rope-s1339-8c0c7ff8", "M_llama-s1337-97c7cf0b",
        "M_llama-s1338-4f3e2bb0", "M_llama-s1339-f2d6c2d1", "M_llama-swiglu-s1337-e12aecf6",
        "M_llama-swiglu-s1338-0b6fd066", "M_llama-swiglu-s1339-0a862745", "S_2017+gqa-s1337-e4485557",
        "S_2017+gqa-s1338-5d37f494", "S_2017+gqa-s1339-8a3bd77c", "S_2017+prenorm-s1337-ac45758d",
        "S_2017+prenorm-s1338-8ed4bc32", "S_2017+prenorm-s1339-3c7bf40f", "S_2017+rmsnorm-s1337-d7bc66f4",
        "S_2017+rmsnorm-s1338-220fcb88", "S_2017+rmsnorm-s1339-bd992488", "S_2017+rope-s1337-687b795a",
        "S_2017+rope-s1338-63518cf5", "S_2017+rope-s1339-1d4eb76e", "S_2017+swiglu-s1337-fcaaeae4",
        "S_2017+swiglu-s1338-92e9436b", "S_2017+swiglu-s1339-a5587edf", "S_2017-s1337-d1849aa9",
        "S_2017-s1338-cc10bc07", "S_2017-s1339-51575218", "S_llama-gqa-s1337-d8f26293",
        "S_llama-gqa-s1338-725acdb5", "S_llama-gqa-s1339-f4c99154", "S_llama-prenorm-s1337-fe9b543e",
        "S_llama-prenorm-s1338-d6892e4b", "S_llama-prenorm-s1339-e8b01592", "S_llama-rmsnorm-s1337-a0a36f1a",
        "S_llama-rmsnorm-s1338-2d0a2b25", "S_llama-rmsnorm-s1339-7ebc7063", "S_llama-rope-s1337-73b9b5ee",
        "S_llama-rope-s1338-e5f3855e", "S_llama-rope-s1339-ea29231f", "S_llama-s1337-f86265f2",
        "S_llama-s1338-87c0ef65", "S_llama-s1339-f39dcd5e", "S_llama-swiglu-s1337-55b4bd0d",
        "S_llama-swiglu-s1338-5e65c96f", "S_llama-swiglu-s1339-7899c3de",
    ],
    "scale-gpu": [
        "L_2017+gqa-s1337-4bbb37f7", "L_2017+gqa-s1338-705edd17", "L_2017+gqa-s1339-ce80f425",
        "L_2017+prenorm-s1337-ae13d9b5", "L_2017+prenorm-s1338-dc3b99d4", "L_2017+prenorm-s1339-980a5f13",
        "L_2017+rmsnorm-s1337-9ad44cf4", "L_2017+rmsnorm-s1338-84ab77a6", "L_2017+rmsnorm-s1339-bf8a01a6",
        "L_2017+rope-s1337-9e83cb6d", "L_2017+rope-s1338-ae82fdf0", "L_2017+rope-s1339-d4384a23",
        "L_2017+swiglu-s1337-9d61be0d", "L_2017+swiglu-s1338-19e97ed6", "L_2017+swiglu-s1339-aa9f591c",
        "L_2017-s1337-d7e76d14", "L_2017-s1338-c08669db", "L_2017-s1339-5cbe0457", "L_llama-gqa-s1337-510cf1f9",
        "L_llama-gqa-s1338-2a3da7fc", "L_llama-gqa-s1339-35cddd06", "L_llama-prenorm-s1337-dc4d64ad",
        "L_llama-prenorm-s1338-cdaa0fd7", "L_llama-prenorm-s1339-7f2c92ec", "L_llama-rmsnorm-s1337-55194410",
        "L_llama-rmsnorm-s1338-3e8c64c5", "L_llama-rmsnorm-s1339-f1ac2f86", "L_llama-rope-s1337-1be06c23",
        "L_llama-rope-s1338-03a52046", "L_llama-rope-s1339-d90d30e2", "L_llama-s1337-d741916f",
        "L_llama-s1338-17e1b24b", "L_llama-s1339-20fedc64", "L_llama-swiglu-s1337-2b694f88",
        "L_llama-swiglu-s1338-576a4bba", "L_llama-swiglu-s1339-6af8af92", "M_2017+gqa-s1337-36b9236f",
        "M_2017+gqa-s1338-3021a2cf", "M_2017+gqa-s1339-f9a0cb33", "M_2017+prenorm-s1337-85ad62ae",
        "M_2017+prenorm-s1338-bac9a69e", "M_2017+prenorm-s1339-dd3e292c", "M_2017+rmsnorm-s1337-5a35ae2d",
        "M_2017+rmsnorm-s1338-680f3ce9", "M_2017+rmsnorm-s1339-d6ae8eee", "M_2017+rope-s1337-e1017633",
        "M_2017+rope-s1338-33c02b6c", "M_2017+rope-s1339-878d51ae", "M_2017+swiglu-s1337-76787200",
        "M_2017+swiglu-s1338-562efd0e", "M_2017+swiglu-s1339-2b176a34", "M_2017-s1337-e6b34abb",
        "M_2017-s1338-712eb983", "M_2017-s1339-e8e168fd", "M_llama-gqa-s1337-e7d95182",
        "M_llama-gqa-s1338-59d2ecf1", "M_llama-gqa-s1339-051403b6", "M_llama-prenorm-s1337-fa52a2af",
        "M_llama-prenorm-s1338-8009d407", "M_llama-prenorm-s1339-bcb9cef5", "M_llama-rmsnorm-s1337-3a7f2ec3",
        "M_llama-rmsnorm-s1338-1e2ff86d", "M_llama-rmsnorm-s1339-d1885b45", "M_llama-rope-s1337-c5ba96f7",
        "M_llama-rope-s1338-1746283e", "M_llama-rope-s1339-a176e0b0", "M_llama-s1337-b337a552",
        "M_llama-s1338-4e6a47f0", "M_llama-s1339-ff141078", "M_llama-swiglu-s1337-b7f6b5e0",
        "M_llama-swiglu-s1338-f2055543", "M_llama-swiglu-s1339-66d6fe8a", "S_2017+gqa-s1337-ae62f8f4",
        "S_2017+gqa-s1338-d9358d0a", "S_2017+gqa-s1339-8dbf158c", "S_2017+prenorm-s1337-54fb2d72",
        "S_2017+prenorm-s1338-70f51913", "S_2017+prenorm-s1339-f85a4556", "S_2017+rmsnorm-s1337-4b0fc065",
        "S_2017+rmsnorm-s1338-a710458e", "S_2017+rmsnorm-s1339-b4f2a83d", "S_2017+rope-s1337-ddbd8423",
        "S_2017+rope-s1338-cf62d48f", "S_2017+rope-s1339-2681ad16", "S_2017+swiglu-s1337-fe224bdf",
        "S_2017+swiglu-s1338-c2a5ee3e", "S_2017+swiglu-s1339-1a3ab817", "S_2017-s1337-413735d7",
        "S_2017-s1338-e9056f43", "S_2017-s1339-19377cd3", "S_llama-gqa-s1337-16c0dea1",
        "S_llama-gqa-s1338-eaf8bb4b", "S_llama-gqa-s1339-6cdaa569", "S_llama-prenorm-s1337-c20b7082",
        "S_llama-prenorm-s1338-00d57031", "S_llama-prenorm-s1339-93a9c325", "S_llama-rmsnorm-s1337-d634cf38",
        "S_llama-rmsnorm-s1338-feeaa455", "S_llama-rmsnorm-s1339-a39c2d9f", "S_llama-rope-s1337-5a3c3072",
        "S_llama-rope-s1338-f6280221", "S_llama-rope-s1339-e6abc93e", "S_llama-s1337-8fa564b7",
        "S_llama-s1338-bc2dcd93", "S_llama-s1339-7e7cb78e", "S_llama-swiglu-s1337-82872a6e",
        "S_llama-swiglu-s1338-6fab3470", "S_llama-swiglu-s1339-187e83c6",
    ],
    "seed-protocol": [
        "2017-s1337-7aea066c", "llama-s1337-8f0d88ce",
    ],
    "tokenizers": [
        "bpe512_2017+prenorm-s1337-685fb47a", "bpe512_2017+prenorm-s1338-56a59210",
        "bpe512_2017+prenorm-s1339-bebd0a52", "bpe512_2017+rope-s1337-7b2e54d1", "bpe512_2017+rope-s1338-1ff9dc78",
        "bpe512_2017+rope-s1339-ea1af84a", "bpe512_2017+swiglu-s1337-a849e02a", "bpe512_2017+swiglu-s1338-4442ebb0",
        "bpe512_2017+swiglu-s1339-9dc2f9db", "bpe512_2017-s1337-9bc557b0", "bpe512_2017-s1338-7f006fc1",
        "bpe512_2017-s1339-68fe19b2", "char_2017+prenorm-s1337-d3bd5723", "char_2017+prenorm-s1338-08cbffc5",
        "char_2017+prenorm-s1339-3e744e0d", "char_2017+rope-s1337-b9f40411", "char_2017+rope-s1338-0b57fa1e",
        "char_2017+rope-s1339-29b1715a", "char_2017+swiglu-s1337-0aefc760", "char_2017+swiglu-s1338-9d581a29",
        "char_2017+swiglu-s1339-fcb1e9fc", "char_2017-s1337-43ac5684", "char_2017-s1338-a80a9a3d",
        "char_2017-s1339-966df216"
    ],
    "train-default": [
        "run-2017-s1337-68ea5046",
    ],
    "worth-budgets": [
        "b100_2017+swiglu-s1337-fb27aa8b",
        "b100_2017+swiglu-s1338-5ebc42b2",
        "b100_2017+swiglu-s1339-e2978f55",
        "b100_2017-s1337-4d34363f",
        "b100_2017-s1338-2aa9d726",
        "b100_2017-s1339-93f91ce8",
        "b150_2017+swiglu-s1337-5aa7bbad",
        "b150_2017+swiglu-s1338-103ad792",
        "b150_2017+swiglu-s1339-f48660f9",
        "b150_2017-s1337-562f8c29",
        "b150_2017-s1338-504b0680",
        "b150_2017-s1339-ad018168",
        "b200_2017+swiglu-s1337-14d0b1d4",
        "b200_2017+swiglu-s1338-248c7c56",
        "b200_2017+swiglu-s1339-9808b41f",
        "b200_2017-s1337-cff20684",
        "b200_2017-s1338-c421d9f7",
        "b200_2017-s1339-5f3d1c27",
        "b300_2017+swiglu-s1337-4458a9b3",
        "b300_2017+swiglu-s1338-c92f92c2",
        "b300_2017+swiglu-s1339-2a98ea25",
        "b300_2017-s1337-cf669831",
        "b300_2017-s1338-c96ef2bf",
        "b300_2017-s1339-caeb27fe",
    ],
}

def planned_ids() -> dict[str, list[str]]:
    out = {path.stem: sorted(p.run_id for p in expand(load_spec(path))) for path in sorted(EXPERIMENTS.glob("*.toml"))}
    cfg = load_run_config(None, [])  # `anatomy train` with no spec
    out["train-default"] = [runs.run_id(f"{cfg.name}-{label(cfg)}", cfg.seed, cfg.model_dump(mode="json"))]
    return out


def test_every_shipped_spec_plans_the_pinned_run_ids():
    assert planned_ids() == PINNED_IDS
    assert "2017-s1337-01654518" in PINNED_IDS["ci-regression"]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_field_added_after_the_hashed_set_is_marked_new(section):
    fields = {name for name, info in SECTIONS[section].model_fields.items()
              if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))}
    unmarked = {name for name in fields - HASHED[section]
                if SECTIONS[section].model_fields[name].json_schema_extra not in (NEW, NO_RESULT)}
    assert not unmarked, (f"{section or 'run'} fields {sorted(unmarked)} are not in the first hashed set: mark each "
                          f"config.new(<the default that reproduces today's model>, **bounds)")
    marked = {name for name in fields if SECTIONS[section].model_fields[name].json_schema_extra in (NEW, NO_RESULT)}
    assert not marked & HASHED[section], "a field that was always hashed cannot become neutral: its ids would move"
    assert set(hash_neutral().get(section, {}) if section else
               {k for k, v in hash_neutral().items() if not isinstance(v, dict)}) == marked


def test_a_marked_field_changes_the_id_only_off_its_default():
    cfg = RunConfig().model_dump(mode="json")
    base = runs.config_hash(cfg)
    for section, fields in hash_neutral().items():
        if not isinstance(fields, dict):  # a run-level field (plugins: left out at any value)
            assert fields == ANY and runs.config_hash({**cfg, section: ["/somewhere/parts.py"]}) == base
            assert runs.config_hash({k: v for k, v in cfg.items() if k != section}) == base
            continue
        for name, default in fields.items():
            assert runs.config_hash({**cfg, section: {**cfg[section], name: default}}) == base
            dropped = {**cfg, section: {k: v for k, v in cfg[section].items() if k != name}}
            assert runs.config_hash(dropped) == base  # a config.json written before the field existed
    on = {**cfg, "model": {**cfg["model"], "qk_norm": True}}
    assert runs.config_hash(on) != base
    often = {**cfg, "train": {**cfg["train"], "checkpoint_every": 7, "checkpoint_minutes": 0.5}}
    assert hash_neutral()["train"]["checkpoint_every"] == ANY and runs.config_hash(often) == base


@pytest.mark.parametrize("text, shared", [("", True), ("shared = false", False), ("shared = true", True)])
def test_a_tune_table_s_shared_is_a_strict_bool_on_by_default(tmp_path, text, shared):
    from toy_data import write_spec

    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text() + f"[tune]\n{text}\n")
    assert load_spec(spec).tune.shared is shared


@pytest.mark.parametrize("value", ["0", '"no"', "1"])
def test_a_tune_table_s_shared_is_not_a_number_or_a_word(tmp_path, value):
    from toy_data import write_spec

    from anatomy_cli.spec.config import ConfigError

    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text() + f"[tune]\nshared = {value}\n")
    with pytest.raises(ConfigError, match="tune.shared: Input should be a valid boolean"):
        load_spec(spec)


def test_the_wsd_schedule_s_fields_keep_ids_and_do_nothing_elsewhere():
    from anatomy_cli.spec.config import ConfigError, validate

    cfg = RunConfig().model_dump(mode="json")
    kept = {**cfg, "train": {**cfg["train"], "keep_checkpoints": [5, 9]}}
    assert runs.config_hash(kept) == runs.config_hash(cfg)  # kept checkpoints never move results
    wsd = validate(RunConfig, {"train": {"schedule": "wsd", "decay_frac": 0.3, "decay_shape": "linear",
                                         "keep_checkpoints": [5, 9]}})
    assert wsd.train.keep_checkpoints == (5, 9) and wsd.train.decay_steps == 600
    from anatomy_cli.spec.config import parse_value, validate_field

    assert validate_field("train.keep_checkpoints", parse_value("[80, 160]")) == [80, 160]  # --set's path
    with pytest.raises(ConfigError, match="decay_frac=0.3 does nothing here: .*train.schedule='cosine'"):
        validate(RunConfig, {"train": {"decay_frac": 0.3}})
    for steps, why in (([9, 5], "increasing"), ([0], "above 0"), ([2000], "below steps=2000")):
        with pytest.raises(ConfigError, match=why):
            validate(RunConfig, {"train": {"keep_checkpoints": steps}})
