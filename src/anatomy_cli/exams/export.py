"""Export a LLaMA-shaped run as a Hugging Face `LlamaForCausalLM` folder (no transformers import).

A run with the four LLaMA parts the component table marks as needed (rmsnorm, prenorm, rope in its
standard variant, swiglu) and none it marks as inexpressible (qknorm, parallel, softcap, nope) is a
dense LLaMA, any n_kv_head. The mapping is a pure rename, plus one split:

    tok.weight                    -> model.embed_tokens.weight
    blocks.{i}.norm1.weight       -> model.layers.{i}.input_layernorm.weight
    blocks.{i}.attn.qkv.weight    -> model.layers.{i}.self_attn.{q,k,v}_proj.weight  (rows split
                                     [n_head*hd, n_kv_head*hd, n_kv_head*hd])
    blocks.{i}.attn.out.weight    -> model.layers.{i}.self_attn.o_proj.weight
    blocks.{i}.norm2.weight       -> model.layers.{i}.post_attention_layernorm.weight
    blocks.{i}.ffn.{gate,up,down} -> model.layers.{i}.mlp.{gate,up,down}_proj.weight
    final_norm.weight             -> model.norm.weight
    head.weight                   -> lm_head.weight  (untied; a tied run writes embed_tokens only
                                     and says tie_word_embeddings: true)

The FFN's and the norms' names come from their parts' `hf` mappings (spec/parts.py: SwiGLU's gate, up,
down; RMSNorm's weight), so a plugin part that declares one (its parameter names onto the Llama
layer's) exports as the Llama part of its slot; a plugin part without one is refused by name.

Both sides rotate with the half-split RoPE pairing (dimension i with i + head_dim/2), so Q/K rows
need no permutation (the Meta -> HF conversion script permutes because Meta's code pairs
neighbours). The char vocabulary goes out as vocab.json (a JSON list; id = index) with a README
that shows how to encode and decode: there is no `tokenizers` tokenizer for it. Any other tokenizer
(data.tokenizer bpe:N, a tokenizer.json, hf:NAME) goes out as the run's tokenizer.json beside a
tokenizer_config.json naming PreTrainedTokenizerFast, so `AutoTokenizer.from_pretrained(out)` loads
it and `LlamaForCausalLM.generate` on its ids gives `anatomy sample`'s greedy text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from anatomy_cli.spec import components
from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.errors import InputError
from anatomy_cli.store import runs
from anatomy_cli.training.checkpoint import load_run, load_run_config

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VOCAB_FILE = "vocab.json"
README_FILE = "README.md"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
EXPORT_FILES = (CONFIG_FILE, WEIGHTS_FILE, VOCAB_FILE, README_FILE)  # a char run's
TOKEN_EXPORT_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG, README_FILE)  # any other's


# anatomy block-local names -> HF layer-local names of anatomy's own attention (the qkv split is handled
# separately); the norms' and the FFN's come from their parts' hf mappings (layer_renames)
ATTN_RENAMES: dict[str, str] = {"attn.out.weight": "self_attn.o_proj.weight"}
NORM_PLACES = {"norm1.": "input_layernorm.", "norm2.": "post_attention_layernorm."}
# QK-norm weights have no place in a Llama (export refuses qknorm); Qwen3, OLMo 2 and Gemma 3 name
# them so, which the parity tests of parts Llama lacks (tests/model/test_swa.py) map onto.
QK_NORM_RENAMES: dict[str, str] = {"attn.q_norm.weight": "self_attn.q_norm.weight",
                                   "attn.k_norm.weight": "self_attn.k_norm.weight"}
GLOBAL_RENAMES: dict[str, str] = {
    "tok.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
}


def hf_names(model_cfg, slot: str) -> dict[str, str]:
    """The hf mapping of the part model_cfg's `slot` names ({} when it has none: an export refuses it first)."""
    part = registry.find(slot, getattr(model_cfg, registry.SLOTS[slot].field))
    return dict(part.hf or {}) if part is not None else {}


def layer_renames(model_cfg) -> dict[str, str]:
    """Block-local anatomy names -> HF layer-local names: the attention's (a plugin mixer's own mapping, else
    anatomy's out projection), each norm at its place, and the FFN's, from their parts' hf mappings."""
    mixer = registry.find("mixer", model_cfg.attn_type)
    out = {f"attn.{k}": v for k, v in (mixer.hf or {}).items()} if mixer is not None else dict(ATTN_RENAMES)
    for ours, theirs in NORM_PLACES.items():
        out |= {ours + k: theirs + v for k, v in hf_names(model_cfg, "norm").items()}
    return out | {f"ffn.{k}": v for k, v in hf_names(model_cfg, "ffn").items()}


def global_renames(model_cfg) -> dict[str, str]:
    """Model-level names: embeddings, head, and the final norm (its part's mapping under model.norm)."""
    return GLOBAL_RENAMES | {f"final_norm.{k}": f"model.norm.{v}" for k, v in hf_names(model_cfg, "norm").items()}


class ExportError(InputError):
    """A run that cannot be exported (not LLaMA-shaped, unexpected weights, or a busy out_dir)."""


# ------------------------------------------------------------------------------- checks


def llama_mismatches(model_cfg) -> list[str]:
    """The parts of `model_cfg` with no Llama equivalent, e.g. ['LayerNorm (needs rmsnorm)'].

    Read from the component table: a part Llama needs (`llama="on"`) that is off, and a part it
    cannot express (`llama="off"`) that is not off: on, or set to another value than the table's
    (a soft cap of 10, a gdn_pattern of "DA"). Parts marked "either" (GQA, tied embeddings, z-loss)
    export as they are. A plugin part counts as the Llama part of its slot when it declares a Hugging
    Face mapping (Part.hf), and is named here when it does not.
    """
    flat = components.flat_config(model_cfg)
    used = registry.used(model_cfg.model_dump(), {}).values()
    bad = [f"{p.name} (a plugin {p.slot} part from {p.origin}, which declares no Hugging Face mapping: "
           f"@part(..., hf={{its parameter: the Llama layer's}}))" for p in used if p.plugin and p.hf is None]
    plugin_fields = {f"model.{registry.SLOTS[p.slot].field}" for p in used if p.plugin}
    for c in components.BUILTINS:
        on = c.state(flat)
        if on is None and plugin_fields & set(c.keys):  # neither on nor off: a plugin part holds its slot
            continue
        if c.llama == "on" and on is False:
            bad.append(f"{c.parts[0]} (needs {'/'.join(str(v) for v in c.on.values())})")
        elif c.llama == "off" and on is not False:
            bad.append(f"{c.parts[1]} ({c.name})")
    if model_cfg.moe and model_cfg.moe_router != "softmax-topk":  # a router choice, not a row of its own
        bad.append(f"DeepSeek-V3's router (moe_router {model_cfg.moe_router!r})")
    if model_cfg.rope_variant != "standard":
        bad.append(f"RoPE variant {model_cfg.rope_variant!r} (needs standard)")
    return bad


def check_llama_shaped(model_cfg) -> None:
    """Raise ExportError naming every part that keeps `model_cfg` from being a Llama."""
    bad = llama_mismatches(model_cfg)
    if bad:
        verb = "has" if len(bad) == 1 else "have"
        raise ExportError(f"cannot export to Llama: {', '.join(bad)} {verb} no Llama equivalent")
    if model_cfg.vocab_size is None:
        raise ExportError("cannot export to Llama: model.vocab_size is not set")


# ------------------------------------------------------------------------------- config


def llama_config(model_cfg) -> dict[str, Any]:
    """A LlamaConfig-compatible config.json dict for a LLaMA-shaped ModelConfig.

    RoPE base: transformers >= 5 reads `rope_parameters.rope_theta`; 4.x reads top-level
    `rope_theta` (and ignores the unknown `rope_parameters`). Both are written, so either honours
    the base. `dtype` is the 5.x name of 4.x's `torch_dtype`; both are written for the same reason.
    """
    check_llama_shaped(model_cfg)
    return decoder_config(model_cfg)


def decoder_config(model_cfg) -> dict[str, Any]:
    """llama_config's fields, unchecked (Mistral and Qwen3 configs take the same ones)."""
    theta = float(model_cfg.rope_base)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model_cfg.vocab_size,
        "hidden_size": model_cfg.d_model,
        "intermediate_size": model_cfg.ffn_hidden,
        "num_hidden_layers": model_cfg.n_layer,
        "num_attention_heads": model_cfg.n_head,
        "num_key_value_heads": model_cfg.n_kv_head,
        "head_dim": model_cfg.head_dim,
        "max_position_embeddings": model_cfg.ctx_len,
        "rms_norm_eps": float(model_cfg.norm_eps),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(model_cfg.tie_embeddings),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
        "dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


# ------------------------------------------------------------------------------- weights


def expected_keys(model_cfg) -> set[str]:
    """The state-dict keys of a LLaMA-shaped anatomy LM."""
    keys = set(global_renames(model_cfg))
    own_attention = registry.find("mixer", model_cfg.attn_type) is None
    for i in range(model_cfg.n_layer):
        keys |= {f"blocks.{i}.attn.qkv.weight"} if own_attention else set()
        keys.update(f"blocks.{i}.{local}" for local in layer_renames(model_cfg))
    return keys


def check_keys(state_dict: dict, model_cfg) -> None:
    want, have = expected_keys(model_cfg), set(state_dict)
    missing, extra = sorted(want - have), sorted(have - want)
    if missing or extra:
        parts = [f"missing {', '.join(missing[:5])}" if missing else "",
                 f"unexpected {', '.join(extra[:5])}" if extra else ""]
        raise ExportError(f"state dict is not a LLaMA-shaped anatomy LM: {'; '.join(p for p in parts if p)}")


def split_qkv(qkv: torch.Tensor, model_cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[ (H + 2G) * hd, d ] -> q [H*hd, d], k [G*hd, d], v [G*hd, d] (rows, in the fused order)."""
    hd = model_cfg.head_dim
    sizes = [model_cfg.n_head * hd, model_cfg.n_kv_head * hd, model_cfg.n_kv_head * hd]
    if qkv.shape[0] != sum(sizes):
        raise ExportError(f"qkv weight has {qkv.shape[0]} rows, the config implies {sum(sizes)}")
    q, k, v = qkv.split(sizes, dim=0)
    return q, k, v


def own_tensor(t: torch.Tensor) -> torch.Tensor:
    """Detached, contiguous, on the CPU, with its own storage (safetensors refuses shared ones)."""
    return t.detach().to("cpu").contiguous().clone()


def state_dict_to_hf(state_dict: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """Rename (and split qkv) an anatomy LM state dict into LlamaForCausalLM weight names."""
    check_llama_shaped(model_cfg)
    check_keys(state_dict, model_cfg)
    return rename_to_hf(state_dict, model_cfg)


def rename_to_hf(state_dict: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """The rename alone, unchecked: the decoder names Llama, Mistral and Qwen3 share (a qk_norm
    model's norms included), for parity tests of parts a Llama cannot express."""
    out = {hf: own_tensor(state_dict[ours]) for ours, hf in global_renames(model_cfg).items() if ours in state_dict}
    if model_cfg.tie_embeddings:  # HF ties lm_head to embed_tokens on load (tie_word_embeddings)
        del out["lm_head.weight"]
    for i in range(model_cfg.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        if f"{src}attn.qkv.weight" in state_dict:  # anatomy's attention: its fused Q, K, V split
            q, k, v = split_qkv(state_dict[f"{src}attn.qkv.weight"], model_cfg)
            for name, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                out[f"{dst}self_attn.{name}.weight"] = own_tensor(t)
        for ours, hf in (layer_renames(model_cfg) | QK_NORM_RENAMES).items():
            if src + ours in state_dict:  # the Llama keys are all there (check_keys); QK-norms when on
                out[dst + hf] = own_tensor(state_dict[src + ours])
    return out


# ------------------------------------------------------------------------------- files


def check_out_dir(out_dir: Path, run_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"export target is not a directory: {out_dir}")
    if out_dir.resolve() == run_dir.resolve():
        raise ExportError(f"export target is the run directory itself: {out_dir}")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ExportError(f"export target {out_dir} exists and is not empty (pass --overwrite to replace it)")


def tokenizer_config(vocab) -> dict[str, Any]:
    """tokenizer_config.json for a run's tokenizer.json: the fast tokenizer class, its specials, no
    clean-up of spaces (decode gives the text the ids stand for, as anatomy's sample prints it) and no
    BOS/EOS added (the model never saw them)."""
    specials = [t.content for t in vocab.tok.get_added_tokens_decoder().values() if t.special]
    eos = specials[0] if specials else None
    return {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False, "eos_token": eos,
            "model_max_length": None, "anatomy_tokenizer": vocab.spec}


def readme_prompt(run_cfg, chars: list[str]) -> str:
    """The run's sample prefix, kept to characters the vocabulary has (else its first character)."""
    known = set(chars)
    return "".join(c for c in run_cfg.train.sample_prefix if c in known) or chars[0]


def readme_text(run_cfg, chars: list[str], run_dir: Path, which: str, n_params: int, hidden: int | None = None) -> str:
    m = run_cfg.model
    hidden = hidden or m.ffn_hidden
    prompt = readme_prompt(run_cfg, chars)
    n_new = max(1, m.ctx_len - len(prompt))
    tied = ", the LM head tied to the token embedding" if m.tie_embeddings else ""
    return f"""# {run_cfg.name} ({components.label(run_cfg)}): a char-level Llama exported by anatomy

Exported from the anatomy run `{run_dir.name}` ({which} weights) as a plain
`LlamaForCausalLM`: {m.n_layer} layers, d_model {m.d_model}, {m.n_head} query heads,
{m.n_kv_head} key/value heads, SwiGLU hidden {hidden}, RoPE base {m.rope_base:g},
RMSNorm eps {m.norm_eps:g}, trained context {m.ctx_len}, {n_params:,} parameters (float32){tied}.

## Tokenizer: one character = one id

There is no `tokenizers` tokenizer. `vocab.json` is a JSON list of {m.vocab_size} characters and
a character's id is its index in that list; text with characters outside the list cannot be
encoded. There are no BOS/EOS/PAD tokens, so `generate` runs for exactly `max_new_tokens`.
Run from this folder:

```python
import json, pathlib, torch; from transformers import LlamaForCausalLM
chars = json.loads(pathlib.Path("vocab.json").read_text(encoding="utf-8")); stoi = {{c: i for i, c in enumerate(chars)}}
model = LlamaForCausalLM.from_pretrained(".").eval()
ids = model.generate(torch.tensor([[stoi[c] for c in {prompt!r}]]), max_new_tokens={n_new}, do_sample=False)
print("".join(chars[i] for i in ids[0].tolist()))
```

The model saw windows of {m.ctx_len} characters in training; RoPE runs past that, but quality
beyond it is untested (anatomy's own sampler drops the oldest half of the window instead).
"""


def token_readme(run_cfg, vocab, run_dir: Path, which: str, n_params: int) -> str:
    """README of a run whose tokenizer is not char: how to load both and generate."""
    m = run_cfg.model
    prompt = run_cfg.train.sample_prefix or "\n"
    tied = ", the LM head tied to the token embedding" if m.tie_embeddings else ""
    return f"""# {run_cfg.name} ({components.label(run_cfg)}): a Llama exported by anatomy ({vocab.spec})

Exported from the anatomy run `{run_dir.name}` ({which} weights) as a plain
`LlamaForCausalLM`: {m.n_layer} layers, d_model {m.d_model}, {m.n_head} query heads,
{m.n_kv_head} key/value heads, SwiGLU hidden {m.ffn_hidden}, RoPE base {m.rope_base:g},
RMSNorm eps {m.norm_eps:g}, trained context {m.ctx_len} tokens, {n_params:,} parameters (float32){tied}.

## Tokenizer: {vocab.spec}, {m.vocab_size:,} tokens

`tokenizer.json` is the run's own tokenizer (sha256 {vocab.sha256[:16]}...). The model never saw BOS/EOS
tokens (none is added), so `generate` runs for exactly `max_new_tokens`. Run from this folder:

```python
import torch; from transformers import AutoTokenizer, LlamaForCausalLM
tok = AutoTokenizer.from_pretrained("."); model = LlamaForCausalLM.from_pretrained(".").eval()
ids = tok({prompt!r}, return_tensors="pt", add_special_tokens=False).input_ids
out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
print(tok.decode(out[0], skip_special_tokens=False))
```

The model saw windows of {m.ctx_len} tokens in training; RoPE runs past that, but quality beyond it is
untested (anatomy's own sampler drops the oldest half of the window instead).
"""


def export_hf(run_dir: Path | str, out_dir: Path | str, which: str = "best",
              overwrite: bool = False) -> dict[str, Any]:
    """Write a LlamaForCausalLM folder for a LLaMA-shaped run; return what was written.

    out_dir may not exist yet or be empty; a non-empty one is refused unless overwrite=True, which
    replaces the export's files and leaves any others there untouched.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if which not in ("best", "last"):
        raise ExportError(f"which must be 'best' or 'last', got {which!r}")
    check_out_dir(out_dir, run_dir, overwrite)
    check_llama_shaped(load_run_config(run_dir).model)  # before reading any weights
    run_cfg, vocab, model = load_run(run_dir, which)
    config = llama_config(run_cfg.model)
    tensors = state_dict_to_hf(model.state_dict(), run_cfg.model)
    config["intermediate_size"] = tensors["model.layers.0.mlp.down_proj.weight"].shape[1]  # a plugin FFN's own width
    n_params = sum(t.numel() for t in tensors.values())

    out_dir.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_json(out_dir / CONFIG_FILE, config)
    runs.atomic_write_bytes(out_dir / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
    if vocab.spec == "char":
        files = EXPORT_FILES
        runs.atomic_write_json(out_dir / VOCAB_FILE, vocab.chars)
        runs.atomic_write_text(out_dir / README_FILE, readme_text(run_cfg, vocab.chars, run_dir, which, n_params,
                                                                   config["intermediate_size"]))
    else:
        files = TOKEN_EXPORT_FILES
        vocab.save(out_dir / TOKENIZER_FILE)
        runs.atomic_write_json(out_dir / TOKENIZER_CONFIG, tokenizer_config(vocab))
        runs.atomic_write_text(out_dir / README_FILE, token_readme(run_cfg, vocab, run_dir, which, n_params))
    return {
        "out_dir": str(out_dir),
        "files": list(files),
        "run_dir": str(run_dir),
        "which": which,
        "label": components.label(run_cfg),
        "params": n_params,
        "tensors": len(tensors),
        "config": config,
    }
