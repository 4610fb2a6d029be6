"""Every row of components.BUILTINS, on and off, at the 2017 end and at the LLaMA end, through one set
of checks. A new row gets them all by being in the table: the cases are read from it.

For each case (row, end, state): the battery a plugin's part passes (exams/parts_check.py: shapes,
causality, cached decode, determinism, declared vs counted parameters, gradients, bf16, stacking) passes;
the config validates and the table reads the state back; the
parameter formulas equal the module's counts (total, and active: what one token's gradient reaches);
a change at position t never changes an output before t; decoding through `LM.new_cache` (prefill
then one token at a time, ragged chunks, single tokens) equals the full forward, fp32 and fp64; the
same seed gives the same init and the same losses, and the row's two states train differently; and
where the row's `llama` field makes the case a plain Llama, the exported Hugging Face folder gives
anatomy's logits (fp32, and fp64 to rounding), else the export refuses it naming the part. Every
part is checked at both ends, as `anatomy components` reports its change from both.

Sizes come from the row itself (toy_sizes), not from a table of special cases. The checks are plain
functions that raise AssertionError, so the last tests break a row on purpose and watch them fail.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub read them at import
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lm_checks import assert_causal, assert_decodes_like_full, tokens, train_losses, trainer  # noqa: E402
from toy_data import write_corpus  # noqa: E402

from anatomy_cli.exams import parts_check  # noqa: E402
from anatomy_cli.exams.export import ExportError, check_llama_shaped, export_hf  # noqa: E402
from anatomy_cli.model import LM, attention, kv_cache  # noqa: E402
from anatomy_cli.spec import components  # noqa: E402
from anatomy_cli.spec.components import BUILTINS, FIVE, Component  # noqa: E402
from anatomy_cli.spec.config import ModelConfig, RunConfig, apply_overrides, validate  # noqa: E402
from anatomy_cli.training.checkpoint import load_run  # noqa: E402
from anatomy_cli.training.run import train  # noqa: E402

pytestmark = [pytest.mark.usefixtures("single_thread")]

# d 32, 4 heads, vocab 50 (lm_checks' tokens); RoPE base and norm eps away from both libraries'
# defaults, so an exported config field that transformers ignored shows in the logits.
TOY = {"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 16,
       "rope_base": 500.0, "norm_eps": 1e-4}
ENDS = ("2017", "llama")  # the five LLaMA parts all off, all on
# A few real steps at a high rate, so exported norm weights are off their init.
EXPORT_TRAIN = {"steps": 5, "batch_size": 4, "lr": 1e-2, "warmup": 0, "eval_interval": 5, "eval_batches": 2,
                "log_interval": 5, "sample_len": 0, "device": "cpu"}


@dataclasses.dataclass(frozen=True)
class Case:
    row: Component
    end: str
    on: bool

    @property
    def id(self) -> str:
        return f"{self.row.name}-{self.end}-{'on' if self.on else 'off'}"

    def flipped(self) -> Case:
        return dataclasses.replace(self, on=not self.on)


CASES = [Case(row, end, on) for row in BUILTINS for end in ENDS for on in (True, False)]
EACH = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


def toy_sizes(row: Component) -> dict:
    """TOY, grown only as far as the row needs: n_layer a multiple of every layer pattern it sets
    (gdn's "DDDA": 4), ctx_len twice any window it sets (so the window binds, in training and decode)."""
    settings = [*row.on.items(), *(row.off or {}).items()]
    patterns = [len(v) for k, v in settings if k.endswith("_pattern") and isinstance(v, str) and v]
    windows = [v for k, v in settings if k.endswith("window") and type(v) is int]
    return TOY | {"n_layer": math.lcm(TOY["n_layer"], *patterns),
                  "ctx_len": max([TOY["ctx_len"], *(2 * w for w in windows)])}


def run_data(case: Case) -> dict:
    """The case as a run-config dict: toy sizes, the end's five parts, then the row's own state."""
    sizes = toy_sizes(case.row)
    data = {"model": sizes | components.model_settings(FIVE, on=case.end == "llama", model=sizes)}
    return apply_overrides(data, case.row.settings(case.on, components.flat_config(data)))


def model_config(case: Case) -> ModelConfig:
    return validate(RunConfig, run_data(case)).model


def trainer_settings(case: Case) -> tuple[dict, dict]:
    """(model fields, train settings) for lm_checks.trainer; its corpus sets the vocabulary."""
    data = run_data(case)
    return {k: v for k, v in data["model"].items() if k != "vocab_size"}, data.get("train", {})


def key(case: Case) -> str:
    return json.dumps(run_data(case), sort_keys=True)


# ------------------------------------------------------------------------------ the checks


def check_config(case: Case) -> None:
    """Validates; the row reads back in its state; every row on other fields keeps the end's state."""
    states = components.states(validate(RunConfig, run_data(case)))
    assert states[case.row.name] is case.on, f"{case.id} reads as {states[case.row.name]}"
    for c in BUILTINS:
        if c is not case.row and not set(c.keys) & set(case.row.keys):
            want = case.end == "llama" and c.name in FIVE
            assert states[c.name] is want, f"{case.id} moved {c.name} to {states[c.name]}"


# A gradient element below this fraction of the largest one is zero. In float64 a gradient that
# is zero in exact arithmetic (a softmax over one key: q and k of a lone token) comes out as rounding,
# exactly 0 or not by the kernel's summation order: at most 2.5e-16 of the largest over every case,
# under ATEN_CPU_CAPABILITY=avx2, where fp32 showed it as nonzero. A real one is at least 9.6e-10
# of it at these unit-gain weights. 1e-12 sits ~1000x from both; fp32's rounding (1e-7) would not.
REACH_RTOL = 1e-12


def reach(tr, x: torch.Tensor, p: int = 0) -> dict[str, torch.Tensor]:
    """Which parameter elements the training loss reaches, of the tokens x [B, 1] each alone at
    position p: float64 gradients above REACH_RTOL of the largest, never an exact fp32 zero."""
    tr.fwd = functools.partial(tr.model, pos=torch.tensor([p]))
    tr.model.zero_grad(set_to_none=True)
    tr.losses(x, (x + 1) % tr.cfg.model.vocab_size)[0].backward()
    grads = {n: torch.zeros_like(q) if q.grad is None else q.grad.abs() for n, q in tr.model.named_parameters()}
    scale = max(float(g.max()) for g in grads.values())
    return {n: g > REACH_RTOL * scale for n, g in grads.items()}


def check_params(case: Case, tmp_path, make_lm) -> None:
    """num_params() == the module's count; active_params() == num_params() less what one token's
    gradient skips but another token's, at any position, reaches (a routed part's other experts).
    Zeros that every lone token shares (the keys and memory a first position does not have) are not
    skipped; lookup tables (nn.Embedding) count whole, as in the formulas. Unit-gain weights."""
    cfg = model_config(case)
    assert cfg.num_params() == LM(cfg).num_params()
    model, opts = trainer_settings(case)
    tr = trainer(tmp_path, "active", model, **opts)  # its losses: what training minimises, aux terms too
    cfg = tr.cfg.model
    tr.model.load_state_dict(make_lm(**cfg.model_dump()).state_dict())
    tr.model.double()  # reach() reads float64 gradients
    lookups = {f"{n}.weight" for n, m in tr.model.named_modules() if isinstance(m, torch.nn.Embedding)}
    every, each_token = {}, torch.arange(cfg.vocab_size)[:, None]  # [V, 1]
    for p in range(cfg.ctx_len):  # every token alone, at every position
        every = {n: r | every.get(n, r) for n, r in reach(tr, each_token, p).items()}
    for i in (0, 7, 19):
        alone = reach(tr, torch.tensor([[i]]))
        skipped = sum(int((every[n] & ~alone[n]).sum()) for n in every if n not in lookups)
        assert cfg.active_params() == cfg.num_params() - skipped, f"token {i} skips {skipped}"


def ragged(T: int) -> list[int]:
    """Chunks 5, 3, 1, 4, 1, 2, 5, ... summing to T: queries against more keys than queries."""
    out = []
    for n in itertools.cycle((5, 3, 1, 4, 1, 2)):
        if sum(out) == T:
            return out
        out.append(min(n, T - sum(out)))


def check_decode(model: LM) -> None:
    """A prefill then single tokens, ragged chunks, and single tokens throughout == the full forward."""
    T = model.cfg.ctx_len
    assert_decodes_like_full(model, tokens(2, T, seed=1), [[T // 3] + [1] * (T - T // 3), ragged(T), [1] * T])


def check_determinism(case: Case, tmp_path) -> list[float]:
    """Same seed: the same init bit for bit and the same losses after a few steps; returns them."""
    model, opts = trainer_settings(case)
    a, b = (trainer(tmp_path, f"{case.id}-{n}", model, **opts) for n in "ab")
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), f"{name} differs at init"
    first, second = train_losses(a), train_losses(b)
    assert first == second and all(math.isfinite(v) for v in first)
    return first


def exportable(case: Case) -> bool:
    """What the row's llama field says: a Llama has every LLaMA part on, and this row as it allows."""
    return case.end == "llama" and case.row.llama in ("either", "on" if case.on else "off")


def rms_norm_in_input_dtype(self, x):
    """HF's LlamaRMSNorm without its cast to fp32 (which caps an fp64 comparison at ~1e-7)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def rope_tables_like_anatomys(self, x, position_ids):
    """HF's (cos, sin) from float64 angles rounded to fp32, as anatomy's tables are (HF computes its
    angles in fp32): fp64 then compares everything else to rounding."""
    dim, base = 2 * self.inv_freq.shape[0], self.config.rope_parameters["rope_theta"]
    angles = position_ids[..., None].double() / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    emb = torch.cat((angles, angles), dim=-1)  # [B, T, hd]
    return emb.cos().float().to(x.dtype), emb.sin().float().to(x.dtype)


def export_run(case: Case, corpus) -> RunConfig:
    model, opts = trainer_settings(case)
    return validate(RunConfig, {"seed": 7, "model": model, "train": EXPORT_TRAIN | opts,
                                "data": {"source": str(corpus)}})


def export_parity(run: RunConfig, root) -> tuple[float, float]:
    """Train a few steps, export, load the folder in transformers: max |logit difference| from
    anatomy's model in fp32 (transformers as it is) and in fp64 (its two fp32 casts lifted)."""
    transformers = pytest.importorskip("transformers")
    llama = transformers.models.llama.modeling_llama
    train(run, root / "run")
    export_hf(root / "run", root / "hf")
    _, _, ours = load_run(root / "run")
    idx = tokens(2, run.model.ctx_len, seed=2, vocab=ours.cfg.vocab_size)
    diffs = []
    for dtype in (torch.float32, torch.float64):
        with pytest.MonkeyPatch.context() as mp, torch.no_grad():
            if dtype == torch.float64:
                mp.setattr(llama.LlamaRMSNorm, "forward", rms_norm_in_input_dtype)
                mp.setattr(llama.LlamaRotaryEmbedding, "forward", rope_tables_like_anatomys)
            hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", dtype=dtype,
                                                               local_files_only=True)
            theirs, mine = hf.eval()(idx).logits, ours.to(dtype)(idx)[0]
        assert mine.std() > 0.05  # not an all-equal output that would match trivially
        diffs.append(float((theirs - mine).abs().max()))
    return diffs[0], diffs[1]


def check_export(case: Case, parity) -> None:
    """Llama-expressible: the export reproduces anatomy's logits. Else it refuses, naming the part."""
    cfg = model_config(case)
    if not exportable(case):
        with pytest.raises(ExportError) as err:
            check_llama_shaped(cfg)
        if case.end == "llama":  # every other part is Llama's here: the refusal names this row's
            assert case.row.parts[case.on] in str(err.value)
        return
    fp32, fp64 = parity(case)
    assert fp32 < 1e-5 and fp64 < 1e-12, (fp32, fp64)


# ------------------------------------------------------------------------------ every row


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def parity(tmp_path_factory, corpus):
    """export_parity, once per distinct run (most Llama-expressible cases are the LLaMA end itself)."""
    @functools.cache
    def measured(run: str) -> tuple[float, float]:
        return export_parity(validate(RunConfig, json.loads(run)), tmp_path_factory.mktemp("export"))

    return lambda case: measured(json.dumps(export_run(case, corpus).model_dump(mode="json"), sort_keys=True))


@pytest.fixture(scope="module")
def losses():
    """check_determinism's losses by config: the ends recur in many cases."""
    return {}


def test_every_row_is_a_case_at_both_ends():
    assert [(c.row.name, c.end, c.on) for c in CASES[:4]] == [(BUILTINS[0].name, e, on) for e in ENDS
                                                              for on in (True, False)]
    assert sorted({c.row.name for c in CASES}) == sorted(components.BUILTIN_NAMES)
    assert len(CASES) == 4 * len(BUILTINS)


@EACH
def test_config(case):
    check_config(case)


@EACH
def test_param_counts(case, tmp_path, make_lm):
    check_params(case, tmp_path, make_lm)


@EACH
def test_causal(case, make_lm):
    assert_causal(make_lm(**model_config(case).model_dump()), T=toy_sizes(case.row)["ctx_len"])


@EACH
def test_decode_equals_full_forward(case, make_lm):
    check_decode(make_lm(**model_config(case).model_dump()))


@EACH
def test_determinism(case, tmp_path, losses):
    """Same seed, same init and losses; and the row's two states train differently."""
    for c in (case, case.flipped()):
        if key(c) not in losses:
            losses[key(c)] = check_determinism(c, tmp_path)
    assert losses[key(case)] != losses[key(case.flipped())]


@EACH
def test_export(case, parity):
    check_export(case, parity)


@pytest.fixture(scope="module")
def battery():
    """parts_check.run's results by config: the ends recur in many cases."""
    return {}


@EACH
def test_the_parts_battery_passes(case, battery):
    """The battery `anatomy components check` runs on a plugin's part, on this row's model: nothing fails,
    and only decode (no cache) or stacking (vmap cannot batch it) may be a note."""
    if key(case) not in battery:
        battery[key(case)] = parts_check.run(model_config(case), case.end)
    results = battery[key(case)]
    assert [r.check for r in results] == list(parts_check.CHECKS)
    assert not parts_check.failed(results), parts_check.failed(results)
    assert {r.check for r in results if r.status == parts_check.NOTE} <= {"stack"}, results


# ------------------------------------------------------------------------------ a broken row fails


def one(name: str, end: str = "llama", on: bool = True) -> Case:
    return Case(components.BY_NAME[name], end, on)


def test_a_wrong_param_term_fails(monkeypatch, tmp_path, make_lm):
    norm = ModelConfig.norm_params
    monkeypatch.setattr(ModelConfig, "norm_params", property(lambda self: norm.fget(self) + 1))
    with pytest.raises(AssertionError):
        check_params(one("rmsnorm"), tmp_path, make_lm)


def test_a_wrong_active_count_fails(monkeypatch, tmp_path, make_lm):
    monkeypatch.setattr(ModelConfig, "active_params", lambda self: self.num_params() - 1)
    with pytest.raises(AssertionError, match="skips 0"):
        check_params(one("swiglu"), tmp_path, make_lm)


def test_a_mask_that_peeks_fails(monkeypatch, make_lm):
    """Attention that also sees the next position: the causality check fails."""
    sdpa = F.scaled_dot_product_attention

    def peek(q, k, v, attn_mask=None, is_causal=False, **kw):
        T, S = q.shape[2], k.shape[2]
        return sdpa(q, k, v, attn_mask=torch.ones(T, S, dtype=torch.bool).tril(S - T + 1), **kw)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", peek)
    with pytest.raises(AssertionError):
        assert_causal(make_lm(**model_config(one("rope", "2017")).model_dump()))


def test_a_cache_that_drops_a_position_fails(monkeypatch, make_lm):
    """A K/V state that never keeps position 3: cached decode no longer equals the full forward."""
    update = kv_cache.KV.update

    def drop(self, k, v, past):
        keep = (torch.arange(past, past + k.shape[2]) != 3).to(k.dtype)[:, None]  # [T, 1]
        return update(self, k * keep, v * keep, past)
    monkeypatch.setattr(kv_cache.KV, "update", drop)
    with pytest.raises(AssertionError):
        check_decode(make_lm(**model_config(one("gqa")).model_dump()))


def test_a_row_whose_states_coincide_fails():
    broken = dataclasses.replace(components.BY_NAME["qknorm"], off={"model.qk_norm": True})
    with pytest.raises(AssertionError, match="reads as True"):
        check_config(Case(broken, "llama", False))


def test_a_row_that_forgets_its_llama_flag_fails(monkeypatch, corpus, tmp_path):
    """Soft-capping marked 'either': the export writes a Llama that ignores the cap."""
    broken = dataclasses.replace(components.BY_NAME["softcap"], llama="either")
    monkeypatch.setattr(components, "BUILTINS", tuple(broken if c.name == "softcap" else c for c in BUILTINS))
    with pytest.raises(AssertionError):
        check_export(Case(broken, "llama", True), lambda c: export_parity(export_run(c, corpus), tmp_path))
