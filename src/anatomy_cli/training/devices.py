"""Where tensors live and at what precision: every device decision of training, evaluation and sampling.

  resolve_device     'auto' | 'cpu' | 'cuda' | 'mps' -> torch.device (auto: CUDA, then MPS, then CPU)
  require_memory     refuse, with the estimate, what cannot fit in the device's free memory
  autocast           the run's dtype as a context: bf16 autocast, or nothing at all for fp32
  configure          per-device numerics set once per run (TF32 matmuls on CUDA)
  matmul_precision   what fp32 matmuls really ran at: 'fp32', 'tf32' or 'bf16-autocast'
  sdpa_kernel        which scaled_dot_product_attention kernel family the run's shapes dispatch to
  compile_model      torch.compile with a fresh dynamo cache per run
  share_compile_cache / device_workers    concurrent sweep runs sharing one GPU
  hardware / cpu_capability   what a run ran on: the device's name, the CPU's vector instruction set
  available_bytes / peak_memory / keep_freed_memory   memory: what is free, what a run used, glibc reuse

Host-side tensors (the id arrays, the sampling generator, RoPE tables while they are built) stay
on the CPU in whatever dtype is exact there; they are cast and moved once, never rebuilt on the
device: MPS has no float64. tests/training/test_devices.py runs training, eval and sampling on a fake
accelerator that fails on any tensor left behind and on any float64 tensor on the device.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from pathlib import Path

import torch

from anatomy_cli.spec.config import ConfigError


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """The device `name` asks for; an unavailable one is a ConfigError naming `option` (what the user set)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{option}: cuda requested but no CUDA device is available")
    if name == "mps" and not mps_available():
        raise ConfigError(f"{option}: mps requested but MPS is not available")
    return torch.device(name)


def require_memory(need: int, device: torch.device, what: str) -> None:
    """Refuse, with the estimate, work whose allocation cannot fit (instead of an allocator crash or a
    machine swapping itself to a halt): `what` names the sizes and options that ask for it."""
    have = available_bytes(torch.device(device))
    if have is not None and need > have:
        raise ConfigError(f"{what} needs about {need / 2**30:,.1f} GiB; {have / 2**30:,.1f} GiB is available on "
                          f"{device}")


def autocast(device: torch.device, dtype: str):
    """bf16 autocast for dtype 'bfloat16' (weights stay fp32); no context at all for fp32."""
    if dtype == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def configure(device: torch.device) -> None:
    """Per-device numerics, once per run: TF32 for fp32 matmuls on CUDA (recorded by matmul_precision).

    The CUDA-only flags are set through the legacy allow_tf32 attributes (not
    set_float32_matmul_precision, which would also switch the CPU's oneDNN matmuls to TF32).
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _fp32_mode(backend) -> str:
    """'ieee' | 'tf32' | 'bf16' of a torch.backends.<x>.matmul: its fp32_precision (torch >= 2.9; 'none'
    inherits torch.backends.fp32_precision), else the legacy allow_tf32 flag (older torch)."""
    try:
        mode = backend.fp32_precision
    except AttributeError:  # torch < 2.9 (or no such backend): only the legacy flag
        return "tf32" if getattr(backend, "allow_tf32", False) else "ieee"
    if mode == "none":
        mode = getattr(torch.backends, "fp32_precision", "none")
    return "ieee" if mode == "none" else mode


def matmul_precision(device: torch.device, dtype: str) -> str:
    """What fp32 matmuls effectively ran at: 'bf16-autocast', 'tf32', 'bf16x3', 'fp32' ('unknown' if
    torch refuses to say: it raises when a program mixed the legacy and the new precision flags)."""
    if dtype == "bfloat16":
        return "bf16-autocast"
    backend = {"cuda": torch.backends.cuda, "cpu": torch.backends.mkldnn}.get(device.type)
    try:
        mode = _fp32_mode(getattr(backend, "matmul", None)) if backend is not None else "ieee"
    except RuntimeError:
        return "unknown"
    return {"ieee": "fp32", "tf32": "tf32", "bf16": "bf16x3"}.get(mode, mode)


def sdpa_probe(cfg, batch: int, device: torch.device, dtype: str):
    """kernel(G, window=0, qk_dim=head_dim, v_dim=head_dim) -> the SDPA kernel family ('flash',
    'efficient', 'cudnn', 'math', ...) torch dispatches causal training attention to, for q
    [B, H, T, qk_dim], k [B, G, T, qk_dim], v [B, G, T, v_dim] of the autocast dtype (enable_gqa
    when G < H) and a sliding window's band mask (window > 0): torch._fused_sdp_choice. On CPU
    'flash' is the CPU flash kernel. Under torch.compile inductor lowers to the same aten kernel."""
    from torch.nn.attention import SDPBackend

    from anatomy_cli.model.attention import attention_mask

    choose = getattr(torch, "_fused_sdp_choice", None)
    tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    T, H = cfg.ctx_len, cfg.n_head

    def kernel(G: int, window: int = 0, qk_dim: int | None = None, v_dim: int | None = None) -> str:
        if device.type not in ("cpu", "cuda"):  # MPS and others: torch's math path (MPS: its own math kernel)
            return "math"
        if choose is None:
            return "unknown"
        qk_dim, v_dim = qk_dim or cfg.head_dim, v_dim or cfg.head_dim
        q = torch.zeros(batch, H, T, qk_dim, device=device, dtype=tdtype)
        k = torch.zeros(batch, G, T, qk_dim, device=device, dtype=tdtype)
        v = torch.zeros(batch, G, T, v_dim, device=device, dtype=tdtype)
        mask = attention_mask(0, T, T, window, device)  # None: SDPA's causal flag
        try:
            choice = choose(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=G != H)
            return SDPBackend(choice).name.lower().removesuffix("_attention")
        except (RuntimeError, TypeError, ValueError):
            return "unknown"

    return kernel


def expand_gqa(cfg, kernel, device_type: str) -> bool:
    """Whether GQA attention should repeat K/V to the query heads before SDPA: on CUDA, where the
    installed SDPA has no fused kernel for enable_gqa at the run's dtype (fp32/TF32, torch 2.x: math
    only, T x T scores materialised) but has one for the expanded heads (global attention layers
    decide; a model with only local ones, its window). kernel: sdpa_probe's. Never on the CPU: its
    flash kernel takes enable_gqa, and CPU results (the CI baseline) stay put."""
    if cfg.n_kv_head == cfg.n_head or device_type != "cuda":
        return False
    window = 0 if "attn" in cfg.layer_kinds else cfg.window
    return kernel(cfg.n_kv_head, window) == "math" and kernel(cfg.n_head, window) not in ("math", "unknown")


def sdpa_kernel(cfg, batch: int, device: torch.device, dtype: str, kernel=None) -> str:
    """The kernel family the run's training attention runs on, per kind of attention layer (K/V
    expanded where expand_gqa says). Sliding-window layers pass a band mask, which CUDA's flash
    kernel does not take: with both kinds it reads 'flash, local: efficient'. MLA layers ask with
    q, k [B, H, T, nope + rope] and v [B, H, T, v_head_dim] ('mla: ...')."""
    if device.type not in ("cpu", "cuda"):  # MPS and others: torch's math path (MPS: its own math kernel)
        return "math"
    kernel = kernel or sdpa_probe(cfg, batch, device, dtype)
    G, hd = (cfg.n_head if expand_gqa(cfg, kernel, device.type) else cfg.n_kv_head), cfg.head_dim
    shapes = {"attn": (G, 0, hd, hd), "local": (G, cfg.window, hd, hd)}  # G, window, qk, v
    if cfg.attn_type == "mla":  # every head gets its own K and V from the latent
        m = cfg.mla_dims
        shapes["mla"] = (cfg.n_head, 0, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim)
    names = {kind: kernel(*shape) for kind, shape in shapes.items() if kind in cfg.layer_kinds}
    return ", ".join(name if kind == "attn" else f"{kind}: {name}" for kind, name in names.items())


# ----------------------------------------------------------------------- what a run ran on


def accelerator_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple {platform.machine()} (mps)"
    return str(device)


def hardware(device: torch.device) -> str:
    """The accelerator's name, or the CPU's model name and torch's thread count ('AMD EPYC (2 threads)')."""
    if device.type != "cpu":
        return accelerator_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def cpu_capability() -> str | None:
    """The vector instruction set torch's CPU kernels dispatch to: 'AVX2', 'AVX512', 'DEFAULT', ...

    One CPU model name can hide different ones (a VM may mask AVX-512), and each kernel family
    accumulates floats in its own order, so CPU results are bitwise reproducible only within one.
    """
    probe = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)  # torch >= 2.1
    return probe() if probe else None


# ----------------------------------------------------------------------- memory


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can get: free GPU memory, or MemAvailable on Linux (None if unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def peak_rss_bytes() -> int:
    """The process's peak resident set: ru_maxrss is KiB on Linux but bytes on macOS."""
    import resource
    import sys

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)


def peak_memory(device: torch.device) -> int:
    """Peak bytes of a run: CUDA's allocator peak, else the process's peak RSS (MPS memory is the
    OS's: no separate peak counter)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def keep_freed_memory() -> bool:
    """Let glibc keep freed activation buffers for reuse instead of handing them back to the OS.

    By default glibc serves large blocks with mmap and returns freed heap tops with brk, so every CPU
    training step page-faults its activations in again: ~9,000 faults and ~25 ms of system time per
    seed-size step on the 2-core dev machine. With the mmap threshold at its 32 MiB maximum and
    trimming off, a step faults ~100 times and runs 2-4% faster (the same effect jemalloc/tcmalloc
    give). The price is that the process keeps its peak heap. Linux glibc only; False elsewhere.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def compile_model(model: torch.nn.Module, mode: str):
    """torch.compile with dynamo's in-memory cache reset first.

    A sweep trains many configs in one process; without the reset every new LM recompiles the same
    forward code objects until dynamo's recompile limit (8) is hit, after which the remaining runs
    silently fall back to eager. The on-disk inductor cache (share_compile_cache) still applies.
    """
    torch._dynamo.reset()
    return torch.compile(model, mode=mode)


# ----------------------------------------------------------------------- concurrent runs on one GPU

CACHE_DIR = ".compile-cache"


def share_compile_cache(root: Path, workers: int = 1) -> Path:
    """Point inductor's FX-graph and AOT-autograd caches at root/.compile-cache (unless the user set
    TORCHINDUCTOR_CACHE_DIR): worker processes spawned after this inherit it, so a graph compiled by
    one run is loaded, not recompiled, by every other run of the same shape. With several workers,
    each one's pool of kernel-compile processes gets its share of the cores, not all of them."""
    path = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or Path(root) / CACHE_DIR)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.resolve())
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    if workers > 1:
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    return path


PROCESS_BYTES = 1 << 30  # per worker: CUDA context (~0.5 GiB) + allocator and compile slack
MEMORY_FILL = 0.8  # fraction of free GPU memory the sweep may plan to use


def run_bytes(cfg, vocab_size: int) -> int:
    """Estimated peak CUDA bytes of one training run (x2 for allocator caching), not counting the context.

    Weights, grads and Adam's two moments: 16 bytes a parameter. Activations saved for backward per
    layer ~ B*T*(16*d + 3*active_hidden) values; the loss head ~ 3 * B*T*V_padded (logits, fp32 copy,
    gradient). Values are 4 bytes (fp32 master paths dominate even under bf16 autocast).
    """
    m = cfg.model.model_copy(update={"vocab_size": vocab_size})
    t = cfg.train
    tokens = t.batch_size * m.ctx_len
    vpad = -(-vocab_size // 64) * 64
    act = tokens * (m.n_layer * (16 * m.d_model + 3 * m.active_hidden) + 3 * vpad) * 4
    return 2 * (16 * m.num_params() + act)


def device_workers(device: torch.device, configs: list, vocab_size: dict, n_runs: int) -> int:
    """Concurrent runs: CPU -> one per core; MPS -> 1; CUDA -> as many as fit in MEMORY_FILL of free memory
    (torch.cuda.mem_get_info) at the largest run's estimate, at most one per core (each process
    needs a core to launch its kernels) and one per run."""
    cores = os.cpu_count() or 1
    limit = max(1, min(cores, n_runs))
    if device.type == "mps":  # one GPU whose memory the OS shares; concurrency there is unmeasured
        return 1
    if device.type != "cuda" or not configs:
        return limit
    free, _ = torch.cuda.mem_get_info(device)
    per_run = max(run_bytes(c, vocab_size[c.data.corpus_key]) for c in configs) + PROCESS_BYTES
    return max(1, min(limit, int(MEMORY_FILL * free // per_run)))
