"""Two CUDA-only paths, decided and exercised on the CPU: GQA attention with K/V expanded to the
query heads where SDPA has no fused enable_gqa kernel (decided from a capability table), and the
CUDA-graph step boundaries of compile_mode "reduce-overhead" (the same step code runs here)."""

from __future__ import annotations

import pytest
import torch
from helpers import LLAMA_MHA
from lm_checks import decode_in_chunks, tokens
from toy_data import TINY_MODEL, write_corpus

from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.training.devices import expand_gqa, sdpa_kernel, sdpa_probe
from anatomy_cli.training.run import resolve_config
from anatomy_cli.training.trainer import Trainer, set_expand_kv, uses_graphs

CUDA = torch.device("cuda")


def table(rows: dict):
    """A fake capability table: K/V heads (4 = the query heads: no enable_gqa) -> kernel, as
    sdpa_probe's kernel answers."""
    return lambda G, window=0, qk_dim=None, v_dim=None: rows[G]


@pytest.mark.parametrize("rows,device,want,kernel", [
    ({2: "math", 4: "efficient"}, "cuda", True, "efficient"),  # fp32 on CUDA, torch 2.x
    ({2: "flash", 4: "flash"}, "cuda", False, "flash"),  # bf16: fused GQA exists
    ({2: "math", 4: "math"}, "cuda", False, "math"),  # nothing fused either way
    ({2: "math", 4: "flash"}, "cpu", False, "math"),  # never on the CPU (CI baseline)
], ids=["fp32-cuda", "bf16-cuda", "no-fused", "cpu"])
def test_expand_choice_from_a_capability_table(make_config, rows, device, want, kernel):
    cfg = make_config(n_kv_head=2)
    assert expand_gqa(cfg, table(rows), device) is want
    assert sdpa_kernel(cfg, 4, torch.device(device), "float32", kernel=table(rows)) == kernel
    mha = make_config(n_kv_head=4)
    assert expand_gqa(mha, table({4: "efficient"}), device) is False


def test_the_real_probe_answers_on_this_cpu(make_config):
    cfg = make_config(n_kv_head=2)
    kernel = sdpa_probe(cfg, 2, torch.device("cpu"), "float32")
    assert kernel(2) in ("flash", "math") and kernel(4) in ("flash", "math")
    assert kernel(2, window=4) in ("flash", "math")


@pytest.mark.parametrize("parts", [{}, LLAMA_MHA, {**LLAMA_MHA, "qk_norm": True}], ids=["2017", "llama", "qk-norm"])
@pytest.mark.parametrize("n_kv_head", [2, 1], ids=["gqa2", "mqa"])
def test_expanded_kv_equals_enable_gqa_and_the_cache_keeps_g_heads(make_lm, parts, n_kv_head):
    model = make_lm(n_kv_head=n_kv_head, **parts)
    idx = tokens(2, 16)
    with torch.no_grad():
        want, _ = model(idx)
        set_expand_kv(model, True)
        assert all(b.attn.expand_kv for b in model.blocks)
        got, _ = model(idx)
        cached, cache = decode_in_chunks(model, idx, [6, 3] + [1] * 7)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached, want, atol=1e-5, rtol=1e-5)
    assert all(s.k.shape[1] == n_kv_head and s.v.shape[1] == n_kv_head for s in cache.states)  # KV memory unchanged


# ------------------------------------------------------------------ CUDA-graph step boundaries
def test_uses_graphs_only_for_compiled_reduce_overhead():
    def t(**kw):
        return validate(RunConfig, {"train": kw}).train

    assert uses_graphs(t(compile=True, compile_mode="reduce-overhead"))
    assert not uses_graphs(t(compile=False, compile_mode="reduce-overhead"))
    assert not uses_graphs(t(compile=True))


def test_graph_steps_mark_boundaries_and_keep_clones(tmp_path, monkeypatch):
    """The step code of reduce-overhead, run eagerly on the CPU (compiling it here takes minutes): a
    step boundary before each training step and each evaluation batch, and step records that hold
    copies, never the forward's own output tensors (a later replay overwrites those)."""
    corpus_path = write_corpus(tmp_path)
    cfg = validate(RunConfig, {"model": TINY_MODEL, "train": {"steps": 3, "batch_size": 2, "eval_batches": 2,
                                                               "device": "cpu", "sample_len": 0},
                               "data": {"source": str(corpus_path)}})
    corpus = load_corpus(str(corpus_path), cfg.data.val_frac, cfg.model.ctx_len)
    tr = Trainer(resolve_config(cfg, corpus), tmp_path / "run", corpus)
    tr.graphs = True  # what uses_graphs says for compile=True, compile_mode="reduce-overhead"
    marks, outputs = [], []
    real_mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: (marks.append(1), real_mark()))
    real_terms = tr.forward_terms  # the step's forward: (total, loss, terms, aux)
    monkeypatch.setattr(tr, "forward_terms", lambda x, y: outputs.append(real_terms(x, y)) or outputs[-1])
    rec = tr.train_step()
    assert len(marks) == 1
    assert rec.loss.data_ptr() != outputs[-1][1].data_ptr() and torch.equal(rec.loss, outputs[-1][1].detach())
    tr.evaluate()
    assert len(marks) == 1 + len(tr.val)
    tr.graphs = False
    rec = tr.train_step()
    assert len(marks) == 1 + len(tr.val) and rec.loss.data_ptr() == outputs[-1][1].data_ptr()
