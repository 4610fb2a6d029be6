"""Exam commands registered on the main app: eval, stability, bench-decode and kv-budget.

Each parses options, calls one function of exams.py, and renders a rich table or JSON. torch is
imported only inside eval and bench-decode; kv-budget is pure Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from anatomy_cli.cli.app import JsonOut, Plugins, app, console, err_console, handle_errors, load_parts
from anatomy_cli.exams import decode, kv_budget
from anatomy_cli.exams import lengths as lengths_mod
from anatomy_cli.exams import stability as stability_mod
from anatomy_cli.spec.components import model_settings
from anatomy_cli.spec.config import ConfigError, ModelConfig, choose, validate

DEVICES = ("auto", "cpu", "cuda", "mps")
Device = Annotated[str, typer.Option(help="auto | cpu | cuda | mps")]


def _device(name: str):
    choose(name, "--device", DEVICES)
    from anatomy_cli.training.devices import resolve_device

    return resolve_device(name, "--device")


def _print_json(obj) -> None:
    console.print_json(json.dumps(kv_budget.jsonable(obj)))


def _num(v, fmt: str = "{:,.4f}") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return fmt.format(v)


# ----------------------------------------------------------------------------------- eval


@app.command("eval")
@handle_errors
def eval_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory, or a sweep directory (every completed run in it).")],
    ctx: Annotated[str, typer.Option("--ctx", help="Context lengths, e.g. 128,256,512, or multiples of each run's "
                                                   "ctx_len, e.g. 1x,2x,4x.")] = "1x,2x,4x",
    batches: Annotated[Optional[int], typer.Option(
        min=1, help="Batches per length (default: the run's eval_batches).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        min=1, help="Windows per batch (default: the run's batch_size).")] = None,
    device: Device = "cpu",
    json_out: JsonOut = False,
    plugin: Plugins = None,
):
    """Length extrapolation: best-weights val loss (nats per token, and bits per byte) over fixed windows of
    each length (in tokens) -> eval.json.

    RoPE runs are evaluated past their training length; a learned position table ends at ctx_len,
    so longer lengths are reported as n/a (null in eval.json), never cropped. A length the val
    split is too short for is skipped with an n/a note. `anatomy report` then shows one
    val_loss_ctx_<N> column per length.
    """
    lengths = lengths_mod.parse_ctx_list(ctx)
    dev = _device(device)
    load_parts(plugin)

    def on_run(path: Path, result: dict) -> None:
        if not json_out:
            err_console.print(f"  evaluated {path}", highlight=False)

    out = lengths_mod.eval_tree(run_dir, lengths, batches, batch_size, dev, on_run)
    if json_out:
        return _print_json(out)
    console.print(_eval_table(out["runs"]))
    for r in out["runs"]:
        for n, note in r["notes"].items():
            console.print(f"{Path(r['run_dir']).name} ctx {n}: {note}", highlight=False, soft_wrap=True)
    for s in out["skipped"]:
        console.print(f"skipped {s['run_dir']} ({s['status']})", highlight=False)


def _eval_table(results: list[dict]) -> Table:
    import math

    table = Table(title="val loss by context length (best weights)")
    for col in ("run", "label", "pos", "train ctx", "ctx", "val loss", "bits/token", "bits/byte", "vs train ctx"):
        table.add_column(col, justify="left" if col in ("run", "label", "pos") else "right")
    for r in results:
        ref = r["val_loss_by_ctx"].get(str(r["ctx_len"]))
        for n, loss in r["val_loss_by_ctx"].items():
            cells = [_num(loss), _num(loss / math.log(2)) if loss is not None else "-",
                     _num((r.get("val_bpb_by_ctx") or {}).get(n)),
                     f"{loss - ref:+.4f}" if loss is not None and ref is not None else "-"]
            if loss is None:
                cells = ["n/a", "", "", ""]  # the reason is printed under the table
            table.add_row(Path(r["run_dir"]).name, r["label"], r["pos_type"], str(r["ctx_len"]), n, *cells)
    return table


# ----------------------------------------------------------------------------------- stability


@app.command()
@handle_errors
def stability(
    sweep_dir: Annotated[Path, typer.Argument(help="A sweep directory, e.g. runs/depth-stability.")],
    json_out: JsonOut = False,
):
    """Depth stability: per label, runs, diverged, mean loss spikes, max grad norm, mean best val loss.

    Made for experiments/depth-stability.toml (12 layers, no warmup, post- vs pre-norm).
    """
    from anatomy_cli.cli.render import frame_table
    from anatomy_cli.report.frames import load_runs

    frame, _ = load_runs(sweep_dir)
    table = stability_mod.stability_table(frame)
    per_run = ["run_id", "label", "seed", "status", "best_val_loss", "max_grad_norm", "loss_spikes", "diverged_at"]
    if json_out:
        records = json.loads(table.to_json(orient="records"))
        return _print_json({"stability": records, "runs": json.loads(frame[per_run].to_json(orient="records"))})
    console.print(frame_table(frame, per_run, "runs"))
    console.print(frame_table(table, list(table.columns), "stability by label"))
    console.print("loss_spikes: logged train losses above 1.5x the lowest before them (or non-finite), "
                  "counted from the end of warmup; max_grad_norm: pre-clip; best_val_loss_mean: completed runs.",
                  highlight=False)


# ----------------------------------------------------------------------------------- bench-decode

SIZE_DEFAULTS = {"d_model": 128, "n_layer": 4, "n_head": 4, "ctx_len": 512, "vocab_size": 96}
PARTS = ("llama", "2017")


SIZE_OPTIONS = {"d_model": "--d-model", "n_layer": "--n-layer", "n_head": "--n-head", "ctx_len": "--ctx",
                "vocab_size": "--vocab"}  # the size options and the model fields they set


def _sized_model(sizes: dict, parts: str | None) -> ModelConfig:
    parts = parts or "llama"
    if parts not in PARTS:
        raise ConfigError(f"--parts must be llama or 2017, got {parts!r}")
    data = {k: v if v is not None else SIZE_DEFAULTS[k] for k, v in sizes.items()}
    if parts == "llama":
        data |= model_settings(model=data)
    try:
        return validate(ModelConfig, data | {"n_kv_head": data["n_head"]}, prefix="model.")
    except ConfigError as err:  # named as typed: --ctx, not model.ctx_len
        lines = str(err).splitlines()
        for key, flag in SIZE_OPTIONS.items():
            if sizes.get(key) is not None:
                lines = [flag + line[len(f"model.{key}"):] if line.startswith(f"model.{key}:") else line
                         for line in lines]
        raise ConfigError("\n".join(lines)) from None


@app.command("bench-decode")
@handle_errors
def bench_decode_cmd(
    run_dir: Annotated[Optional[Path], typer.Argument(help="A run directory; omit to time an untrained model "
                                                           "built from the size options.")] = None,
    new: Annotated[int, typer.Option(help="Tokens to decode.")] = 200,
    prefix_len: Annotated[int, typer.Option(help="Prompt length (prefilled in one forward).")] = 64,
    kv_heads: Annotated[Optional[str], typer.Option(help="n_kv_head values and/or rows by name, e.g. 4,2,1,mla,dsa "
                                                         "(default H, H/2, 1, mla, dsa, sinks, gattn, partrope: "
                                                         "latent attention, sparse latent attention, and the model's "
                                                         "own attention with that part on).")] = None,
    windows: Annotated[Optional[str], typer.Option(help="Sliding windows to compare, e.g. 0,16 (0 = global; "
                                                         "default: the model's own).")] = None,
    window_pattern: Annotated[Optional[str], typer.Option(help="L local / G global per layer, repeated (default: "
                                                                "the model's own, L without a run).")] = None,
    d_model: Annotated[Optional[int], typer.Option(
        help=f"Without a run: d_model (default {SIZE_DEFAULTS['d_model']}).")] = None,
    n_layer: Annotated[Optional[int], typer.Option(
        help=f"Without a run: layers (default {SIZE_DEFAULTS['n_layer']}).")] = None,
    n_head: Annotated[Optional[int], typer.Option(
        help=f"Without a run: query heads (default {SIZE_DEFAULTS['n_head']}).")] = None,
    ctx: Annotated[Optional[int], typer.Option(
        help=f"Without a run: ctx_len (default {SIZE_DEFAULTS['ctx_len']}).")] = None,
    vocab: Annotated[Optional[int], typer.Option(
        help=f"Without a run: vocab size (default {SIZE_DEFAULTS['vocab_size']}).")] = None,
    parts: Annotated[Optional[str], typer.Option(
        help="Without a run: llama (RoPE, default) or 2017 (learned positions).")] = None,
    device: Device = "cpu",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16 (weights and cache).")] = "float32",
    json_out: JsonOut = False,
    plugin: Plugins = None,
):
    """Inference cost: prefill and decode tokens/s with and without the KV cache, KV bytes, memory.

    Sweeps n_kv_head over MHA / GQA / MQA, and --windows over sliding windows, then MLA (latent
    attention, global: a window leaves its layers be), DSA (MLA plus its indexer's keys, top-k
    ctx/4), and the model's own attention with sinks, the output gate (gattn) or partial RoPE
    (partrope). With a run dir, its own configuration uses
    the trained weights and the others an untrained model of the same sizes (speed does not need
    training). KV bytes are measured from each layer's state tensors.
    """
    sizes = {"d_model": d_model, "n_layer": n_layer, "n_head": n_head, "ctx_len": ctx, "vocab_size": vocab}
    dev = _device(device)
    load_parts(plugin)
    trained = None
    if run_dir is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in {**sizes, "parts": parts}.items() if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: size options build a model without a run dir; a run has its own "
                              f"sizes")
        from anatomy_cli.training.checkpoint import load_run

        cfg, _, trained = load_run(run_dir, "best", dev)
        model_cfg = cfg.model
    else:
        model_cfg = _sized_model(sizes, parts)
    heads = decode.kv_head_list(model_cfg.n_head, kv_heads) if kv_heads is not None else None  # None: default rows
    sliding = decode.window_list(windows, model_cfg.window)
    out = decode.bench_decode(model_cfg, trained, heads, new, prefix_len, dev, dtype, windows=sliding,
                             window_pattern=window_pattern)
    out["run_dir"] = str(run_dir) if run_dir else None
    if json_out:
        return _print_json(out)
    _render_bench(out)


def _render_bench(out: dict) -> None:
    m = out["model"]
    speed = Table(title=f"decode speed: d_model {m['d_model']}, {m['n_layer']} layers, {m['n_head']} heads, "
                        f"{m['pos_type']}, prefix {out['prefix_len']} + {out['new']} new, {out['device']} "
                        f"{out['dtype']}")
    memory = Table(title=f"KV cache and memory (B=1, T={out['window']})")
    for table, cols in ((speed, ("attn", "weights", "prefill tok/s", "decode cached", "uncached", "speed-up", "same")),
                        (memory, ("attn", "KV bytes/token", "KV total", "per layer", "model+cache",
                                  "peak"))):
        for col in cols:
            table.add_column(col, justify="left" if col in ("attn", "weights") else "right")
    for r in out["rows"]:
        attn = _attn_label(r)
        speed.add_row(attn, r["weights"].split(" (")[0], f"{r['prefill_tok_s']:,.0f}",
                      f"{r['decode_tok_s_cached']:,.0f}", f"{r['decode_tok_s_uncached']:,.0f}", f"{r['speedup']:.2f}x",
                      "yes" if r["same_output"] else "no")
        memory.add_row(attn, f"{r['kv_bytes_per_token']:,}",
                       f"{r['kv_cache_bytes']:,} ({kv_budget.fmt_bytes(r['kv_cache_bytes'])})",
                       _layer_text(r["layer_states"], out["window"]), kv_budget.fmt_bytes(r["model_cache_bytes"]),
                       kv_budget.fmt_bytes(r.get("peak_cuda_bytes", r.get("peak_rss_bytes"))))
    console.print(speed)
    console.print(memory)
    _render_long_context(out["rows"])
    cuda = "peak_cuda_bytes" in out["rows"][0]
    console.print(f"tok/s: prefill = prompt tokens / one forward; decode = greedy model.generate forwards per second "
                  f"(window = prefix + new, no context shift); untrained = random weights of the same sizes (speed "
                  f"needs no training). KV total = 2 x L x B x G x T x hd x bytes for global layers; a local "
                  f"(sliding-window) layer holds window - 1 positions whatever T; an MLA layer L x B x (r + p) x T "
                  f"x bytes (the latent and the shared rope key); a DSA layer adds its indexer's key, "
                  f"L x B x (r + p + D) x T x bytes; sinks, gattn and partrope change no state. "
                  f"peak = {'CUDA max allocated' if cuda else 'process peak RSS (whole process so far)'}.",
                  highlight=False)
    if out["note"]:
        console.print(f"note: {out['note']}", highlight=False)


def _attn_label(row: dict) -> str:
    if row["attention"] == "DSA":
        return f"DSA r+p+D={row['latent']} top-k {row['top_k']}"
    if row["latent"]:
        return f"MLA r+p={row['latent']}"
    swa = f" SWA {row['sliding_window']} {row['window_pattern']}" if row["sliding_window"] else ""
    return f"{row['attention']} G={row['n_kv_head']}{swa}"


def _render_long_context(rows: list[dict]) -> None:
    """Decode-state bytes at 4k and 32k positions, per layer kind, against attention in every layer."""
    kinds = list(dict.fromkeys(k for r in rows for k in r["long_context"][0]["per_layer"]))  # attn, local, mla, gdn
    table = Table(title="decode state at long contexts (B=1, formula)")
    for col in ("attn", "positions", *(f"{k} per layer" for k in kinds), "total", "attention everywhere"):
        table.add_column(col, justify="left" if col == "attn" else "right")
    for r in rows:
        for at in r["long_context"]:
            table.add_row(_attn_label(r), f"{at['positions']:,}",
                          *(f"{kv_budget.fmt_bytes(at['per_layer'][k])} x{at['layers'][k]}" if k in at["layers"]
                            else "-" for k in kinds),
                          kv_budget.fmt_bytes(at["total"]), kv_budget.fmt_bytes(at["all_attention"]))
    console.print(table)


def _layer_text(states: dict, window: int) -> str:
    """'attn 256 B/token, local 3,840 B': a growing state per token, a bounded one in total."""
    return ", ".join(f"{kind} {s['bytes']:,} B" if s["bounded"] else f"{kind} {s['bytes'] // window:,} B/token"
                     for kind, s in states.items())


# ----------------------------------------------------------------------------------- kv-budget


@app.command("kv-budget")
@handle_errors
def kv_budget_cmd(
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="A Hugging Face config.json (or its folder).")] = None,
    layers: Annotated[Optional[int], typer.Option(help="num_hidden_layers (overrides --config).")] = None,
    heads: Annotated[Optional[int], typer.Option(help="num_attention_heads.")] = None,
    kv_heads: Annotated[Optional[int], typer.Option(help="num_key_value_heads (default: heads).")] = None,
    head_dim: Annotated[Optional[int], typer.Option(help="head_dim (default: hidden / heads).")] = None,
    hidden: Annotated[Optional[int], typer.Option(help="hidden_size.")] = None,
    window: Annotated[Optional[int], typer.Option(help="sliding_window of the local layers (0: none; default: "
                                                       "the config's).")] = None,
    window_pattern: Annotated[Optional[str], typer.Option(help="L local / G global per layer, repeated (default: "
                                                                "the config's layer_types, else every layer).")] = None,
    kv_lora_rank: Annotated[Optional[int], typer.Option(help="MLA: kv_lora_rank, the cached latent "
                                                             "(with --rope-dim).")] = None,
    rope_dim: Annotated[Optional[int], typer.Option(help="MLA: qk_rope_head_dim, the cached shared rope key.")] = None,
    seq: Annotated[int, typer.Option(help="Sequence length T (tokens in the cache).")] = 4096,
    batch: Annotated[int, typer.Option(help="Batch size B.")] = 1,
    dtype: Annotated[str, typer.Option(help="bf16 | fp16 | fp32 | fp8")] = "bf16",
    json_out: JsonOut = False,
):
    """KV-cache budget: MHA vs the config's GQA vs MQA (vs MLA), in exact bytes and MiB/GiB (no torch).

    Sliding-window layers (the config's layer_types, or --window with --window-pattern) hold at most
    window - 1 positions each, whatever the sequence length. MLA (a DeepSeek config, or
    --kv-lora-rank with --rope-dim) caches one latent and one rope key per token per layer.
    """
    shape = kv_budget.attn_shape(config, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                 hidden=hidden, window=window, window_pattern=window_pattern,
                                 kv_lora_rank=kv_lora_rank, rope_dim=rope_dim)
    out = kv_budget.kv_budget(shape, seq, batch, dtype)
    if json_out:
        return _print_json(out)
    swa = (f", sliding window {shape.window} on {shape.local_layers} of {shape.layers} layers" if shape.local_layers
           else "")
    table = Table(title=f"KV cache: {shape.layers} layers, {shape.heads} heads x {shape.head_dim}, T={seq}, "
                        f"B={batch}, {dtype}{swa} ({shape.source})")
    cols = ("attention", "kv heads", "bytes", "size", "per token", "vs MHA") + (("all global",) if swa else ())
    for col in cols:
        table.add_column(col, justify="left" if col == "attention" else "right", no_wrap=True)
    for r in out["rows"]:
        name = f"{r['attention']} (config)" if r["is_config"] else r["attention"]
        g = str(r["kv_heads"]) if r["kv_heads"] else f"latent {shape.kv_lora_rank}+{shape.rope_dim}"
        vs_mha = f"1/{r['mha_over']:.3g}" if r["mha_over"] > 1 else f"{r['ratio_to_mha']:.3g}"  # MLA may exceed MHA
        cells = [name, g, f"{r['bytes']:,}", r["human"], f"{r['bytes_per_token']:,}", vs_mha]
        table.add_row(*cells, *([kv_budget.fmt_bytes(r["bytes_all_global"])] if swa else []))
    console.print(table)
    console.print(f"bytes = {out['formula']}", highlight=False)
