"""The battery a part passes before a study trusts it, on the CPU in seconds, at toy sizes.

anatomy's own rows pass it (tests/model/test_rows.py runs it over every row of the component table)
and `anatomy components check FILE` runs it on a plugin's parts, at both ends of a study where the
part fits (the 2017 end and the LLaMA end, its slot's field set to it). The checks, each a function
of one toy model config that raises CheckFailed (an AssertionError) with its first failing case:

  shapes       the whole model's logits [B, T, V] and finite in fp32, the part's own output x's shape
  causal       changing token t never changes a logit before t, and moves every logit from t on (fp64)
  decode       decoding through the cache (a prefill then single tokens, ragged chunks, single tokens
               throughout) == the full forward, fp32 and fp64; a part that keeps no cache: a note
  determinism  the same seed gives the same init, bit for bit, and the same losses over a few steps
  params       the declared count (the config's formulas, the part's own) == the module's
  gradients    every parameter receives a gradient from the training loss (aux terms included)
  bf16         a bfloat16 autocast forward is finite and near the fp32 one
  stack        two seeds stacked by vmap (training/stacked.py) give each one's logits alone; a part that
               vmap cannot batch: a note saying why (its runs train alone)

A part that leaks the next token trains to a wonderful loss and a false "helps": `ablate` refuses a
plugin part that fails the causality or shape checks before it trains (refuse_broken).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from anatomy_cli.model import LM
from anatomy_cli.spec import components
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import ConfigError, ModelConfig, TrainConfig, validate
from anatomy_cli.spec.parts import PartError
from anatomy_cli.training.trainer import add_terms

# d 32, 4 heads, vocab 50; RoPE base and norm eps away from both libraries' defaults (test_rows' TOY).
TOY = {"vocab_size": 50, "d_model": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 4, "ctx_len": 16,
       "rope_base": 500.0, "norm_eps": 1e-4}
ENDS = ("2017", "llama")
PASS, FAIL, NOTE = "pass", "FAIL", "note"
# Cached decode against the full forward, per dtype (tests/lm_checks.py says why: two summation orders).
DECODE_ATOL = {torch.float32: 1e-4, torch.float64: 1e-10}
# bf16 keeps 8 bits of mantissa: the median logit moves by at most 0.0037 of the logits' range over every
# row of the component table at toy size (gdn's recurrence the most); a discrete choice (an MoE route, a
# top-k key) may flip at a few positions and move those by a third of it, so the median, not the max.
# A part that breaks under bf16 (overflow, a wrong cast) moves it by O(1) of the range.
BF16_MEDIAN = 0.02


class CheckFailed(AssertionError):
    """A check's first failing case, in one line."""


@dataclass(frozen=True)
class Result:
    check: str
    end: str
    status: str  # PASS, FAIL or NOTE
    detail: str = ""


def tokens(B: int, T: int, seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def seeded_lm(cfg: ModelConfig, seed: int = 0) -> LM:
    """An LM of cfg built as a run builds it (torch.manual_seed, then keyed init's key), fp32, eval."""
    torch.manual_seed(seed)
    return LM(cfg, seed).float().eval()


@torch.no_grad()
def unit_gain(model: LM, seed: int = 0) -> LM:
    """Every weight re-drawn at unit gain (matrices std 1/sqrt(fan_in), vectors 1 +- 0.1, biases +- 0.1)
    from its own generator: logits O(1) and every parameter matters, where GPT-2's N(0, 0.02) init leaves
    them near uniform and a leak or a wrong cache below any tolerance."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model


# ------------------------------------------------------------------------------ the checks


def causal(model: LM, T: int | None = None) -> None:
    """Changing token t leaves every logit before t as it was and moves every logit from t on, in fp64
    (fp32 rounding can move earlier logits by 1e-6 where a changed token changes a kernel's shapes, an
    MoE expert's batch; in fp64 that is ~1e-15, and a real leak is 1e-3)."""
    T = T or model.cfg.ctx_len
    idx = tokens(2, T, seed=3, vocab=model.cfg.vocab_size)
    model.double()
    try:
        with torch.no_grad():
            ref, _ = model(idx)
            for t in (0, min(6, T - 1), T - 1):
                changed = idx.clone()
                changed[:, t] = (changed[:, t] + 1) % model.cfg.vocab_size
                logits, _ = model(changed)
                before = float((logits[:, :t] - ref[:, :t]).abs().max()) if t else 0.0
                if before > 1e-10:
                    raise CheckFailed(f"changing token {t} moved a logit before it by {before:.2g} (reads the future)")
                per_pos = (logits[:, t:] - ref[:, t:]).abs().amax(dim=(0, 2))  # [T - t]
                if per_pos.min() <= 1e-3:
                    late = t + int(per_pos.argmin())
                    raise CheckFailed(f"token {t} did not reach position {late} (moved it {float(per_pos.min()):.2g})")
    finally:
        model.float()


def ragged(T: int) -> list[int]:
    """Chunks 5, 3, 1, 4, 1, 2, 5, ... summing to T: queries against more keys than queries."""
    out = []
    for n in itertools.cycle((5, 3, 1, 4, 1, 2)):
        if sum(out) == T:
            return out
        out.append(min(n, T - sum(out)))


def decode_in_chunks(model: LM, idx: torch.Tensor, chunks: list[int], max_len: int | None = None):
    """idx through one cache (for max_len positions, default idx's length) in chunks of the given sizes:
    the concatenated logits and the cache."""
    cache = model.new_cache(idx.shape[0], max_len or idx.shape[1])
    out, t = [], 0
    for n in chunks:
        if cache.past_len != t:
            raise CheckFailed(f"the cache says {cache.past_len} positions after {t} were decoded")
        logits, _ = model(idx[:, t: t + n], cache=cache)
        out.append(logits)
        t += n
    if t != idx.shape[1]:
        raise CheckFailed(f"chunks {chunks} decode {t} of {idx.shape[1]} positions")
    return torch.cat(out, dim=1), cache


def decodes_like_full(model: LM, idx: torch.Tensor, plans: list[list[int]]) -> None:
    """Decoding idx through one cache in each plan's chunks == one full forward, fp32 and fp64."""
    try:
        for dtype, atol in DECODE_ATOL.items():
            model.to(dtype)
            with torch.no_grad():
                full, _ = model(idx)
                for chunks in plans:
                    decoded, cache = decode_in_chunks(model, idx, chunks)
                    gap = float((decoded - full).abs().max())
                    if cache.past_len != idx.shape[1] or not gap <= atol:
                        raise CheckFailed(f"decoding in chunks {chunks[:6]}{'...' if len(chunks) > 6 else ''} differs "
                                          f"from the full forward by {gap:.2g} in {str(dtype).removeprefix('torch.')} "
                                          f"(at most {atol:g})")
    finally:
        model.float()


def decode(model: LM) -> str | None:
    """A prefill then single tokens, ragged chunks, and single tokens throughout == the full forward; a
    note when the model keeps no cache (a mixer declared cache=False)."""
    if not model.can_cache:
        return "no cache declared (decoding runs the full forward)"
    T = model.cfg.ctx_len
    decodes_like_full(model, tokens(2, T, seed=1, vocab=model.cfg.vocab_size),
                      [[T // 3] + [1] * (T - T // 3), ragged(T), [1] * T])
    return None


def shapes(model: LM) -> None:
    """Logits [B, T, V], finite, in fp32 (the part's own shape is checked when it is built)."""
    cfg = model.cfg
    idx = tokens(2, cfg.ctx_len, seed=4, vocab=cfg.vocab_size)
    with torch.no_grad():
        logits, _ = model(idx)
    if tuple(logits.shape) != (2, cfg.ctx_len, cfg.vocab_size):
        raise CheckFailed(f"logits are {list(logits.shape)}, not [2, {cfg.ctx_len}, {cfg.vocab_size}]")
    if not bool(torch.isfinite(logits).all()):
        raise CheckFailed("the fp32 logits are not all finite")


def training_loss(model: LM, idx: torch.Tensor) -> torch.Tensor:
    """The loss a run minimises on idx (next-token cross-entropy plus the aux terms of the defaults)."""
    logits, loss, aux = model(idx[:, :-1], idx[:, 1:], aux=True)
    return add_terms(TrainConfig(), logits, loss, {k: v for k, v in aux.items() if k != "expert_counts"})[0]


def gradients(model: LM) -> None:
    """Every parameter gets a gradient, somewhere, from the training loss of a batch of 4 x ctx tokens."""
    model.zero_grad(set_to_none=True)
    training_loss(model.train(), tokens(4, model.cfg.ctx_len + 1, seed=5, vocab=model.cfg.vocab_size)).backward()
    model.eval()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    model.zero_grad(set_to_none=True)
    if dead:
        raise CheckFailed(f"no gradient reaches {', '.join(dead[:3])}{' ...' if len(dead) > 3 else ''} (a dead "
                          f"parameter: unused in the forward, or cut off from the loss)")


def determinism(cfg: ModelConfig, steps: int = 3) -> None:
    """Two builds under one seed: the same init bit for bit, and the same losses over a few AdamW steps."""
    runs = []
    for _ in range(2):
        model = seeded_lm(cfg, seed=11).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step in range(steps):
            loss = training_loss(model, tokens(2, cfg.ctx_len + 1, seed=20 + step, vocab=cfg.vocab_size))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        runs.append((seeded_lm(cfg, seed=11).state_dict(), losses))
    (init_a, la), (init_b, lb) = runs
    for (name, a), b in zip(init_a.items(), init_b.values()):
        if not torch.equal(a, b):
            raise CheckFailed(f"{name} differs between two builds under one seed")
    if la != lb or not all(math.isfinite(v) for v in la):
        raise CheckFailed(f"losses under one seed differ or are not finite: {la} vs {lb}")


def params(cfg: ModelConfig, model: LM) -> str:
    """The config's count == the module's, and each registered part's declared count == its module's."""
    said = []
    for name, (module, part_) in part_modules(model).items():  # the part's own first: the more telling line
        own = sum(p.numel() for p in module.parameters())
        want = part_.params(cfg, registry.options(part_, (cfg.part_options or {}).get(part_.name)))
        if own != want:
            raise CheckFailed(f"{name} declares {want:,} parameters, its module has {own:,}")
        said.append(f"{name} {own:,}")
    declared, counted = cfg.num_params(), model.num_params()
    if declared != counted:
        raise CheckFailed(f"declared {declared:,} parameters, counted {counted:,} ({counted - declared:+,})")
    return f"{counted:,}" + (f" ({', '.join(said[:1])} each)" if said else "")


def part_modules(model: LM) -> dict[str, tuple[torch.nn.Module, registry.Part]]:
    """{where: (module, part)} of one module of each plugin part the model holds (its first layer's)."""
    cfg, out = model.cfg, {}
    block = model.blocks[0]
    for slot, module in (("mixer", block.attn), ("ffn", block.ffn), ("norm", block.norm1),
                         ("positions", model.positions)):
        name = getattr(cfg, registry.SLOTS[slot].field)
        part_ = registry.find(slot, name)
        if part_ is not None and part_.plugin and not (slot == "ffn" and cfg.moe):
            out[f"{name} ({slot})"] = (module, part_)
    return out


def bf16(model: LM) -> None:
    """A bfloat16 autocast forward (CPU): finite, and its median logit within BF16_MEDIAN of the fp32
    logits' range of fp32's."""
    idx = tokens(2, model.cfg.ctx_len, seed=6, vocab=model.cfg.vocab_size)
    with torch.no_grad():
        ref, _ = model(idx)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, _ = model(idx)
    low = low.float()
    if not bool(torch.isfinite(low).all()):
        raise CheckFailed("the bf16 logits are not all finite")
    gap, scale = float((low - ref).abs().median()), float(ref.max() - ref.min())
    if gap > BF16_MEDIAN * max(scale, 1.0):
        raise CheckFailed(f"bf16 logits are a median {gap:.3g} from fp32's (range {scale:.3g}: at most "
                          f"{BF16_MEDIAN:g} of it)")


def stack(cfg: ModelConfig) -> str | None:
    """Two seeds stacked (stack_module_state + vmap(functional_call), as training/stacked.py) give the
    logits and loss gradients of each alone; a note when vmap cannot batch the part, or it says so."""
    from torch.func import functional_call, stack_module_state, vmap

    said = [p.stack for p in registry.used(cfg.model_dump(), {}).values() if p.stack]
    if said:
        return f"cannot stack: {said[0]} (its runs train alone)"
    members = [unit_gain(seeded_lm(cfg, seed=s), seed=s) for s in (1, 2)]
    stacked, buffers = stack_module_state(members)
    idx = tokens(2, cfg.ctx_len, seed=7, vocab=cfg.vocab_size)
    try:
        with torch.no_grad():
            logits = vmap(lambda p, b, x: functional_call(members[0], (p, b), (x,))[0], in_dims=(0, 0, None))(
                stacked, buffers, idx)
    except Exception as err:  # noqa: BLE001 - vmap's own words say why
        return f"cannot stack: {err.__class__.__name__}: {' '.join(str(err).split())[:160]} (its runs train alone)"
    for i, member in enumerate(members):
        with torch.no_grad():
            alone, _ = member(idx)
        gap = float((logits[i] - alone).abs().max())
        if gap > 1e-4:
            raise CheckFailed(f"stacked member {i}'s logits are {gap:.2g} from its model's alone")
    return None


# ------------------------------------------------------------------------------ the battery

CHECKS = ("shapes", "causal", "decode", "determinism", "params", "gradients", "bf16", "stack")


def run(cfg: ModelConfig, end: str = "") -> list[Result]:
    """Every check on one toy config, in CHECKS' order: a failure is one line and the others still run;
    a model that does not build fails `shapes` and leaves the others not run."""
    try:
        model = unit_gain(seeded_lm(cfg))
    except Exception as err:  # noqa: BLE001 - the part's own code raised while building: its failure
        said = str(err) if isinstance(err, PartError) else f"{err.__class__.__name__}: {err}"
        return [Result("shapes", end, FAIL, f"the model does not build: {' '.join(said.split())[:240]}")] + [
            Result(c, end, NOTE, "not run (the model does not build)") for c in CHECKS[1:]]
    steps: dict[str, Callable[[], str | None]] = {
        "shapes": lambda: shapes(model), "causal": lambda: causal(model), "decode": lambda: decode(model),
        "determinism": lambda: determinism(cfg), "params": lambda: params(cfg, model),
        "gradients": lambda: gradients(model), "bf16": lambda: bf16(model), "stack": lambda: stack(cfg)}
    out = []
    for name in CHECKS:
        try:
            said = steps[name]()
        except CheckFailed as err:
            out.append(Result(name, end, FAIL, str(err)))
            continue
        except Exception as err:  # noqa: BLE001 - the part's own code raised: that is its failure
            out.append(Result(name, end, FAIL, f"{err.__class__.__name__}: {' '.join(str(err).split())[:200]}"))
            continue
        note = said if name in ("decode", "stack") and said else None
        out.append(Result(name, end, NOTE if note else PASS, note or (said if isinstance(said, str) else "")))
    return out


def end_config(part_: registry.Part, end: str, options: dict | None = None) -> ModelConfig:
    """The toy model of `end` ('2017': the five LLaMA parts off; 'llama': on, with 2 of 4 K/V heads) with
    the part in its slot (and its options). ConfigError where it does not fit there."""
    model = TOY | components.model_settings(components.FIVE, on=end == "llama", model=TOY)
    model[registry.SLOTS[part_.slot].field] = part_.name
    if options:
        model["part_options"] = {part_.name: options}
    return validate(ModelConfig, model)


def check_part(name: str, options: dict | None = None, ends: tuple[str, ...] = ENDS) -> list[Result]:
    """The battery on a registered part at each end where it fits; an end where it does not fit is a note
    (a failure when it fits at none)."""
    part_ = registry.REGISTRY.get(name)
    if part_ is None:
        raise PartError(f"no part named {name!r} is loaded")
    out, fitted = [], 0
    for end in ends:
        try:
            cfg = end_config(part_, end, options)
        except ConfigError as err:
            out.append(Result("fits", end, NOTE, f"does not fit: {err}"))
            continue
        fitted += 1
        out += run(cfg, end)
    if not fitted:
        out.append(Result("fits", "", FAIL, "the part fits at no end of a study (2017, LLaMA)"))
    return out


def failed(results: list[Result]) -> list[Result]:
    return [r for r in results if r.status == FAIL]


def refuse_broken(configs, checks: tuple[str, ...] = ("shapes", "causal")) -> None:
    """Before a study trains: each plugin part its configs use passes the shape and causality checks on its
    own model config (at the study's sizes, vocabulary as given or 64), else PartError in one line naming
    the part and its first failure. For the lead to call from study/ablation before training; configs are
    RunConfigs (a plan's)."""
    seen: set[str] = set()
    for cfg in configs:
        model = cfg.model
        used = [p for p in registry.used(model.model_dump(), {}).values() if p.plugin]
        if not used:
            continue
        key = model.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        sized = model if model.vocab_size else model.model_copy(update={"vocab_size": 64})
        try:
            lm = unit_gain(seeded_lm(sized))
        except PartError as err:
            raise PartError(f"{used[0].where()} does not build: {err}") from None
        for name in checks:
            try:
                {"shapes": lambda: shapes(lm), "causal": lambda: causal(lm, min(sized.ctx_len, 16))}[name]()
            except CheckFailed as err:
                raise PartError(f"{', '.join(p.where() for p in used)} fails the {name} check, so the study would "
                                f"measure a broken part: {err} (anatomy components check {used[0].origin})") from None


@dataclass(frozen=True)
class Checked:
    """check_file's answer: each part's results, the parts, and the failures of them all."""

    results: dict[str, list[Result]]
    parts: dict[str, registry.Part]

    @property
    def failures(self) -> list[Result]:
        return [r for rs in self.results.values() for r in failed(rs)]


def check_file(path, only: str | None = None) -> Checked:
    """Load a plugin file (afresh) and run the battery on each part it declares, or on `only`; one torch
    thread (toy sizes: more only synchronise). PartError for a file that does not load or a part it lacks."""
    plugin = registry.load_plugins([path])[0]
    names = plugin.parts if only is None else [only]
    if only is not None and only not in plugin.parts:
        raise PartError(f"{path} declares no part named {only!r}; it declares {', '.join(plugin.parts)}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {name: check_part(name) for name in names}
    finally:
        torch.set_num_threads(before)
    return Checked(results, {name: registry.REGISTRY[name] for name in names})


def counted_change(c: components.Component, end_on: bool) -> tuple[int, int] | None:
    """(total, active) parameters a plugin part's component adds at the reference size from an end, the
    total counted from the built models (the declared formula is the battery's to check), the active
    from the formulas; None where it does not fit."""
    from anatomy_cli.spec import reference

    size = reference.REFERENCE_SIZE
    model = size | components.model_settings(components.FIVE, on=end_on, model=size)
    flat = components.flatten({"model": model})
    counts = []
    for state in (True, False):
        settings = {k.removeprefix("model."): v for k, v in c.settings(state, flat).items() if k.startswith("model.")}
        try:
            cfg = validate(ModelConfig, model | settings)
            counts.append((LM(cfg).num_params(), cfg.active_params()))
        except (ConfigError, PartError, ValueError):
            return None
    return counts[0][0] - counts[1][0], counts[0][1] - counts[1][1]
