"""Batches (torch): training windows from a generator seeded by the run seed alone, fixed validation windows,
and what those windows' targets weigh in bytes (bits per byte).

Fairness: the training batch sequence depends only on (seed, data), through its own
torch.Generator, so every model config trained with one seed sees identical batches. Validation
uses fixed, evenly spaced windows that depend on nothing but the data. Batches are gathered from
the compact id arrays (or a prepared folder's np.memmap) without an int64 copy of the corpus, then
moved to the model's device.

Bits per byte (nanochat's evaluate_bpb; the unit in which a character model and a BPE model sit on one
axis). The val loss is the mean nats per target over the fixed windows (every batch the same shape, so
the mean of batch means is the mean), so its sum is val_loss x val_tokens; bits per byte is that sum
over ln 2 x the UTF-8 bytes the targets stand for (each token's bytes from its tokenizer:
token_bytes). The windows are fixed, so (val_tokens, val_bytes) is a constant of (corpus, tokenizer,
ctx_len, batch_size, eval_batches): eval_counts computes it from those alone, for a run that recorded
it and for one older than it alike.
"""

from __future__ import annotations

import math

# ------------------------------------------------------------------------------- batches (torch)


def as_numpy(ids):
    """A zero-copy numpy view of an id array in its own compact dtype."""
    import numpy as np

    return ids if isinstance(ids, np.ndarray) else np.frombuffer(ids, dtype=np.dtype(ids.typecode))


REMAP_BYTES = 1 << 30  # a memmapped split larger than this is mapped anew for each batch (fresh_map)


def fresh_map(data):
    """A memmapped split of more than REMAP_BYTES mapped anew (nanoGPT's get_batch does so for every
    split, every batch): the pages one batch touches leave this process with its map, so a long run's
    resident memory does not grow toward a corpus larger than memory (they stay in the page cache, the
    kernel's to keep or drop). A smaller split keeps its one map: at most its file's pages stay resident,
    and a batch pays no page faults for its windows. An array in memory as it is."""
    fd = getattr(data, "fd", None)  # a prepared split's open file (prepared.map_ids): this very file
    if fd is None or data.nbytes <= REMAP_BYTES:
        return data
    import numpy as np

    with open(fd, "rb", closefd=False) as f:
        return np.memmap(f, dtype=data.dtype, mode="r", offset=data.offset, shape=data.shape)


def gather(data, starts, length: int):
    """[N] start positions -> [N, length] int64 windows of `data`, widened only here (never the corpus)."""
    import numpy as np
    import torch

    offsets = starts[:, None] + torch.arange(length)  # [N, length]
    return torch.from_numpy(data[offsets.numpy()].astype(np.int64))


def to_device(t, device):
    """Move a host tensor to `device` (a torch.device): pinned + non-blocking on CUDA, a plain copy elsewhere."""
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class BatchSampler:
    """Random training windows from a generator seeded by the run seed alone."""

    def __init__(self, ids, batch_size: int, ctx_len: int, seed: int, device="cpu"):
        import torch

        self.torch = torch
        self.data = as_numpy(ids)
        self.batch_size, self.ctx_len, self.device = batch_size, ctx_len, torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        torch = self.torch
        starts = torch.randint(len(self.data) - self.ctx_len, (self.batch_size,), generator=self.gen)
        window = gather(fresh_map(self.data), starts, self.ctx_len + 1)  # [B, T + 1]
        x, y = window[:, :-1], window[:, 1:]  # [B, T] inputs and next-token targets
        return to_device(x, self.device), to_device(y, self.device)  # whatever the device: CUDA, MPS, CPU

    def state(self):
        return self.gen.get_state()

    def set_state(self, state) -> None:
        self.gen.set_state(state)


def window_starts(n_ids: int, ctx_len: int, n: int):
    """n evenly spaced starts of (ctx_len + 1)-id windows over n_ids ids, as a LongTensor.

    float32 linspace, as the windows have always been placed (so validation sets do not move), then
    clamped: past 2^24 a float32 cannot hold every integer and the last start could round up past
    the end of the data.
    """
    import torch

    last = max(n_ids - ctx_len - 1, 0)
    return torch.linspace(0, last, n).long().clamp_(max=last)


def fixed_windows(ids, batch_size: int, ctx_len: int, n_batches: int, device="cpu"):
    """n_batches of evenly spaced windows over `ids`: the same for every run and seed."""
    data = as_numpy(ids)
    window = gather(data, window_starts(len(data), ctx_len, batch_size * n_batches), ctx_len + 1).to(device)
    return [(w[:, :-1], w[:, 1:]) for w in window.split(batch_size)]


# ------------------------------------------------------------------------------- bits per byte


def eval_counts(corpus, ctx_len: int, batch_size: int, eval_batches: int) -> tuple[int, int]:
    """(val_tokens, val_bytes): how many targets the fixed validation windows of a run with these
    settings hold (fixed_windows over the val split, batch_size, ctx_len, eval_batches), and the UTF-8
    bytes they stand for (the vocabulary's token_bytes: a character's bytes, a BPE token's own; specials 0).
    A target that two overlapping windows hold is counted twice, as its loss is."""
    import numpy as np

    data, sizes = as_numpy(corpus.val), corpus.vocab.token_bytes()
    starts = window_starts(len(data), ctx_len, batch_size * eval_batches).numpy()
    offsets = np.arange(1, ctx_len + 1)  # the targets: each window's ids after its first
    total = 0
    for block in range(0, len(starts), 1024):  # [1024, ctx_len] targets at a time
        total += int(sizes[data[starts[block : block + 1024, None] + offsets]].sum())
    return len(starts) * ctx_len, total


def run_eval_counts(corpus, cfg) -> tuple[int, int]:
    """eval_counts for a RunConfig's ctx_len, batch_size and eval_batches: what a run trained with cfg on
    `corpus` records (summary val_tokens, val_bytes), and what the report computes for a run that did not."""
    return eval_counts(corpus, cfg.model.ctx_len, cfg.train.batch_size, cfg.train.eval_batches)


def bits_per_byte(val_loss: float, val_tokens: int, val_bytes: int) -> float:
    """A mean val loss in nats per token -> bits per byte: summed nats / (ln 2 x bytes)."""
    return val_loss * val_tokens / (math.log(2) * val_bytes)
