"""export.py: LLaMA-shaped runs -> LlamaForCausalLM folders that generate what anatomy generates.

Runs are trained for real (a few steps on a tiny text) so norm weights are off their init, and
loaded back through transformers offline. RoPE base and RMSNorm eps are set away from both
libraries' defaults, so a config field that transformers ignored would show in the logits. The logits
themselves are compared for every Llama-expressible component row and state in test_rows.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers/huggingface_hub read it at import
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import LLAMA_MHA  # noqa: E402

transformers = pytest.importorskip("transformers")

from anatomy_cli.exams.export import (  # noqa: E402
    ExportError,
    check_llama_shaped,
    export_hf,
    llama_config,
    state_dict_to_hf,
)
from anatomy_cli.model import LM  # noqa: E402
from anatomy_cli.model.generate import generate  # noqa: E402
from anatomy_cli.spec.config import ModelConfig, RunConfig  # noqa: E402
from anatomy_cli.store.runs import RunError  # noqa: E402
from anatomy_cli.training.checkpoint import load_run  # noqa: E402
from anatomy_cli.training.run import train  # noqa: E402

TEXT = (
    "## The anatomy of a language model\n\n"
    "A transformer block has attention and a feed-forward layer. RMSNorm scales; LayerNorm centres.\n"
    "RoPE rotates queries and keys by position; SwiGLU gates the hidden units.\n"
) * 12

TWENTY17 = dict(norm_type="layernorm", norm_pos="post", pos_type="learned", ffn_type="gelu")
PART_NAMES = {
    "norm_type": "LayerNorm (needs rmsnorm)",
    "norm_pos": "post-norm (needs pre)",
    "pos_type": "learned positions (needs rope)",
    "ffn_type": "GELU FFN (needs swiglu)",
}
CTX = 32
EXAMPLES_RELU2 = Path(__file__).resolve().parents[2] / "examples" / "parts" / "relu2.py"


def model_kwargs(n_kv_head: int = 2, **parts) -> dict:
    return dict(d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, ctx_len=CTX,
                rope_base=500.0, norm_eps=1e-4, **{**LLAMA_MHA, **parts})


def train_run(root, name: str, train_opts: dict | None = None, **model) -> object:
    """Train a few real steps into root/name (train_opts: extra train settings); return the run dir."""
    src = root / "text.txt"
    if not src.exists():
        src.write_text(TEXT, encoding="utf-8")
    cfg = RunConfig.model_validate({
        "name": name, "seed": 7, "model": model,
        "train": {"steps": 5, "batch_size": 4, "lr": 1e-2, "warmup": 0, "eval_interval": 5,
                  "eval_batches": 2, "log_interval": 5, "sample_len": 0, "device": "cpu", "threads": 2,
                  **(train_opts or {})},
        "data": {"source": str(src)},
    })
    run_dir = root / name
    summary = train(cfg, run_dir)
    assert summary["status"] == "completed"
    return run_dir


def load_hf(out_dir):
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(out_dir), dtype=torch.float32, local_files_only=True)
    return hf.eval()


# (n_kv_head, extra model settings, extra train settings); z_loss changes training, not the network
EXPORTED = {"gqa-kv2": (2, {}, {}), "mha-kv4": (4, {}, {}),
            "tied-zloss": (2, {"tie_embeddings": True}, {"z_loss": 1e-2, "steps": 20})}  # 5 steps: one id


@pytest.fixture(scope="module", params=list(EXPORTED))
def exported(request, tmp_path_factory):
    """(anatomy model, HF model, out_dir, export result) for one trained LLaMA-shaped run."""
    n_kv_head, parts, train_opts = EXPORTED[request.param]
    root = tmp_path_factory.mktemp(request.param)
    run_dir = train_run(root, "llama", train_opts, **model_kwargs(n_kv_head, **parts))
    result = export_hf(run_dir, root / "hf")
    _, _, model = load_run(run_dir, "best")
    return model, load_hf(root / "hf"), root / "hf", result


# ------------------------------------------------------------------------------- parity


@torch.no_grad()
def test_greedy_generation_matches(exported):
    model, hf, _, _ = exported
    prompt = [3, 1, 4, 1]
    new = CTX - len(prompt) - 4  # stays inside the window: no context shift on anatomy's side
    ours = list(generate(model, prompt, new, temp=0))
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
    assert out[0, len(prompt):].tolist() == ours
    assert len(set(ours)) > 1  # a constant generation would prove little


@torch.no_grad()
def test_rope_theta_is_honoured(exported):
    """The same weights under transformers' default base give different logits: the base is read."""
    model, hf, out_dir, _ = exported
    assert hf.config.rope_parameters["rope_theta"] == 500.0
    assert hf.config.rms_norm_eps == 1e-4
    wrong = transformers.LlamaConfig.from_pretrained(str(out_dir))
    wrong.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    other = transformers.LlamaForCausalLM.from_pretrained(
        str(out_dir), config=wrong, dtype=torch.float32, local_files_only=True).eval()
    ids = torch.arange(CTX).remainder(model.cfg.vocab_size)[None]
    assert (other(ids).logits - hf(ids).logits).abs().max() > 1e-4


def test_export_writes_the_files(exported):
    model, _, out_dir, result = exported
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(result["files"])
    assert json.loads((out_dir / "vocab.json").read_text(encoding="utf-8")) == sorted(set(TEXT))
    cfg = json.loads((out_dir / "config.json").read_text())
    assert cfg == result["config"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert result["params"] == model.num_params() == model.cfg.num_params()
    assert cfg["tie_word_embeddings"] is model.cfg.tie_embeddings


def test_tied_export_writes_the_embedding_once(exported):
    model, hf, out_dir, _ = exported
    from safetensors import safe_open

    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys
    assert ("lm_head.weight" in keys) is not model.cfg.tie_embeddings
    tied = hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert tied is model.cfg.tie_embeddings
    torch.testing.assert_close(hf.lm_head.weight, model.head.weight, atol=0, rtol=0)


def test_readme_example_runs(exported, monkeypatch, capsys):
    model, _, out_dir, _ = exported
    readme = (out_dir / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) == 5
    monkeypatch.chdir(out_dir)
    exec(code, {})
    text = capsys.readouterr().out.rstrip("\n")
    prompt = "## "
    ours = generate(model, [sorted(set(TEXT)).index(c) for c in prompt], CTX - len(prompt), temp=0)
    assert text == prompt + "".join(sorted(set(TEXT))[i] for i in ours)


# ------------------------------------------------------------------------------- pure functions


def test_llama_config_fields():
    cfg = ModelConfig(vocab_size=50, **model_kwargs(2))
    c = llama_config(cfg)
    assert c["hidden_size"] == 32 and c["intermediate_size"] == cfg.ffn_hidden == 96
    heads = (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"])
    assert c["num_hidden_layers"] == 2 and heads == (4, 2, 8)
    assert c["max_position_embeddings"] == CTX and c["rms_norm_eps"] == 1e-4
    assert c["rope_theta"] == 500.0 and c["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    assert c["tie_word_embeddings"] is False and c["attention_bias"] is False and c["mlp_bias"] is False
    assert c["bos_token_id"] is None and c["eos_token_id"] is None and c["pad_token_id"] is None
    hf_cfg = transformers.LlamaConfig(**c)
    assert hf_cfg.rope_parameters["rope_theta"] == 500.0 and hf_cfg.head_dim == 8


@pytest.mark.parametrize("tied", [False, True])
def test_state_dict_to_hf_matches_llama_names_and_shapes(tied):
    cfg = ModelConfig(vocab_size=50, tie_embeddings=tied, **model_kwargs(1))
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_config(cfg)))
    tensors = state_dict_to_hf(LM(cfg).state_dict(), cfg)
    # a tied HF model lists lm_head.weight too, as a second name of embed_tokens.weight
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == want
    assert all(t.is_contiguous() for t in tensors.values())


def test_state_dict_to_hf_rejects_foreign_keys():
    cfg = ModelConfig(vocab_size=50, **model_kwargs(2))
    state = LM(cfg).state_dict()
    state["positions.table.weight"] = torch.zeros(CTX, 32)
    with pytest.raises(ExportError, match="unexpected positions.table.weight"):
        state_dict_to_hf(state, cfg)


# ------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("field", list(PART_NAMES))
def test_a_2017_part_is_refused(tmp_path, field):
    run_dir = train_run(tmp_path, f"with-{field}", **model_kwargs(2, **{field: TWENTY17[field]}))
    with pytest.raises(ExportError) as err:
        export_hf(run_dir, tmp_path / "hf")
    assert str(err.value) == f"cannot export to Llama: {PART_NAMES[field]} has no Llama equivalent"
    assert not (tmp_path / "hf").exists()


def test_every_2017_part_is_named():
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(vocab_size=50, **model_kwargs(4, **TWENTY17)))
    assert str(err.value) == (
        "cannot export to Llama: LayerNorm (needs rmsnorm), post-norm (needs pre), "
        "learned positions (needs rope), GELU FFN (needs swiglu) have no Llama equivalent"
    )


MODERN_NAMES = {
    "qk_norm": (True, "QK-norm (qknorm)"),
    "parallel_block": (True, "parallel block (parallel)"),
    "logit_softcap": (30.0, "soft-capped logits (softcap)"),
    "pos_type": ("nope", "NoPE (nope)"),
    "gdn_pattern": ("DA", "Gated DeltaNet hybrid (gdn)"),  # any pattern: "DA" is not the row's DDDA
    "moe": (True, "mixture of experts (moe)"),
}


@pytest.mark.parametrize("field", list(MODERN_NAMES))
def test_a_post_llama_part_is_refused(field):
    value, name = MODERN_NAMES[field]
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(vocab_size=50, **model_kwargs(2, **{field: value})))
    assert str(err.value) == f"cannot export to Llama: {name} has no Llama equivalent"


def test_every_post_llama_part_is_named_in_one_line(tmp_path):
    parts = {field: value for field, (value, _) in MODERN_NAMES.items()}
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(vocab_size=50, **model_kwargs(2, **parts)))
    order = ("qk_norm", "parallel_block", "logit_softcap", "pos_type", "gdn_pattern", "moe")  # the table's
    names = [MODERN_NAMES[f][1] for f in order]
    assert str(err.value) == f"cannot export to Llama: {', '.join(names)} have no Llama equivalent"
    assert "\n" not in str(err.value)
    run_dir = train_run(tmp_path, "qknorm", **model_kwargs(2, qk_norm=True))  # refused before any file
    with pytest.raises(ExportError, match="QK-norm"):
        export_hf(run_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_part_at_another_setting_than_its_row_is_refused_too():
    """Neither the row's on nor its off (a cap of 10, not 30): still nothing Llama can express."""
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(vocab_size=50, **model_kwargs(2, logit_softcap=10.0)))
    assert str(err.value) == "cannot export to Llama: soft-capped logits (softcap) has no Llama equivalent"


@pytest.mark.parametrize("variant", ["q_only", "k_interleaved"])
def test_a_broken_rope_variant_is_refused(variant):
    with pytest.raises(ExportError, match=f"RoPE variant '{variant}' \\(needs standard\\)"):
        check_llama_shaped(ModelConfig(vocab_size=50, rope_variant=variant, **model_kwargs(2)))


def test_non_empty_out_dir_is_refused_unless_overwrite(tmp_path):
    run_dir = train_run(tmp_path, "llama", **model_kwargs(2))
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_hf(run_dir, out)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    export_hf(run_dir, out, which="last", overwrite=True)
    assert (out / "model.safetensors").is_file() and (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="run directory itself"):
        export_hf(run_dir, run_dir, overwrite=True)


def test_empty_out_dir_is_fine_and_bad_inputs_are_errors(tmp_path):
    run_dir = train_run(tmp_path, "llama", **model_kwargs(2))
    (tmp_path / "empty").mkdir()
    assert export_hf(run_dir, tmp_path / "empty")["tensors"] == 3 + 2 * 9
    with pytest.raises(ExportError, match="which"):
        export_hf(run_dir, tmp_path / "x", which="final")
    with pytest.raises(RunError, match="not found"):
        export_hf(tmp_path / "nope", tmp_path / "y")


# ------------------------------------------------------------------------------- a tokenizer's run

BPE_TEXT = "".join(f"{i}: attention 注意力 rotates queries; the norm keeps the scale (café, naïve).\n"
                   for i in range(80))


def test_a_bpe_run_exports_its_tokenizer_and_generates_what_sample_prints(tmp_path):
    """data.tokenizer bpe:300 (trained here, on the run's train split): the export holds tokenizer.json, and
    AutoTokenizer.from_pretrained(out) + LlamaForCausalLM.generate give `anatomy sample`'s greedy text."""
    from helpers import invoke

    src = tmp_path / "text.txt"
    src.write_text(BPE_TEXT, encoding="utf-8")
    cfg = RunConfig.model_validate({
        "name": "bpe", "seed": 7, "model": model_kwargs(),
        "train": {"steps": 20, "batch_size": 4, "lr": 1e-2, "warmup": 0, "eval_interval": 10, "eval_batches": 2,
                  "log_interval": 10, "sample_len": 0, "device": "cpu", "threads": 2},
        "data": {"source": str(src), "tokenizer": "bpe:300"}})
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    result = export_hf(tmp_path / "run", tmp_path / "hf")
    assert result["files"] == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                               "README.md"]
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (tmp_path / "run" / "tokenizer.json").read_bytes()
    prompt, new = "注意 the norm", 16
    sampled = invoke("sample", tmp_path / "run", "--prefix", prompt, "--temp", "0", "--max-new", new)
    assert sampled.exit_code == 0, sampled.output
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    assert ids.shape[1] + new <= CTX  # inside the window: no context shift on anatomy's side
    out = load_hf(tmp_path / "hf").generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                            do_sample=False, pad_token_id=0)
    assert tok.decode(out[0].tolist(), skip_special_tokens=False) + "\n" == sampled.stdout
    assert len(set(out[0, ids.shape[1]:].tolist())) > 1  # a constant generation would prove little


# ------------------------------------------------------------------------------- plugin parts

PLUGIN_SWIGLU = '''
import torch.nn.functional as F
from torch import nn
from anatomy_cli.model.parts import part


@part("w123", slot="ffn", params=lambda cfg, o: 3 * cfg.d_model * 40, about="SwiGLU, its matrices named w1 w2 w3",
      hf={"w1.weight": "mlp.gate_proj.weight", "w3.weight": "mlp.up_proj.weight", "w2.weight": "mlp.down_proj.weight"})
class W123(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1, self.w3 = nn.Linear(cfg.d_model, 40, bias=False), nn.Linear(cfg.d_model, 40, bias=False)
        self.w2 = nn.Linear(40, cfg.d_model, bias=False)

    def forward(self, x, stats=None):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
'''


def test_a_plugin_part_that_declares_its_hugging_face_mapping_exports_and_matches(tmp_path):
    """SwiGLU written as a plugin with other names (and its own width, 40) maps onto Llama's MLP by its
    declared hf names: the exported folder gives anatomy's logits."""
    (tmp_path / "w123.py").write_text(PLUGIN_SWIGLU, encoding="utf-8")
    from anatomy_cli.spec import parts as registry

    registry.load_plugins([tmp_path / "w123.py"])
    run_dir = train_run(tmp_path, "plugin", **model_kwargs(2, ffn_type="w123"))
    result = export_hf(run_dir, tmp_path / "hf")
    assert result["config"]["intermediate_size"] == 40
    _, _, ours = load_run(run_dir, "best")
    idx = torch.randint(0, ours.cfg.vocab_size, (2, CTX), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = float((load_hf(tmp_path / "hf")(idx).logits - ours(idx)[0]).abs().max())
    assert gap < 1e-5


def test_a_plugin_part_without_a_mapping_is_refused_by_name(tmp_path):
    from anatomy_cli.spec import parts as registry

    registry.load_plugins([EXAMPLES_RELU2])
    cfg = ModelConfig(**model_kwargs(2, ffn_type="relu2"), vocab_size=50)
    with pytest.raises(ExportError, match=r"cannot export to Llama: relu2 \(a plugin ffn part from .*relu2\.py, "
                                          r"which declares no Hugging Face mapping"):
        check_llama_shaped(cfg)


def test_a_plugin_mixer_without_a_mapping_is_named_alone():
    """Its slot's rows (mla: attn_type) read neither on nor off: the refusal names the plugin part only."""
    from anatomy_cli.spec import parts as registry

    registry.load_plugins([EXAMPLES_RELU2.parent / "ssmax.py"])
    with pytest.raises(ExportError) as err:
        check_llama_shaped(ModelConfig(**model_kwargs(2, attn_type="ssmax"), vocab_size=50))
    assert str(err.value).startswith("cannot export to Llama: ssmax (a plugin mixer part from ")
    assert "latent attention" not in str(err.value) and str(err.value).endswith("has no Llama equivalent")
