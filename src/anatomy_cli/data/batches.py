"""Batches (torch): training windows from a generator seeded by the run seed alone, fixed validation windows.

Fairness: the training batch sequence depends only on (seed, data), through its own
torch.Generator, so every model config trained with one seed sees identical batches. Validation
uses fixed, evenly spaced windows that depend on nothing but the data. Batches are gathered from
the compact id arrays without an int64 copy of the corpus, then moved to the model's device.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------- batches (torch)


def as_numpy(ids):
    """A zero-copy numpy view of an id array in its own compact dtype."""
    import numpy as np

    return ids if isinstance(ids, np.ndarray) else np.frombuffer(ids, dtype=np.dtype(ids.typecode))


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
        window = gather(self.data, starts, self.ctx_len + 1)  # [B, T + 1]
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
