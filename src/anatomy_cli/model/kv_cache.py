"""Decode state: prefill once, then one token per step, each layer keeping what its mixer needs.

KVCache is a container: one state per layer, each made by that layer's token mixer
(`mixer.new_state(batch, max_len, device, dtype)`), plus `past_len`, the positions already decoded,
shared by every layer (the LM advances it after the last layer). The container knows nothing of
what a state holds; every state answers three things:

    capacity   positions it can hold, or None for any number (a window's buffer, a recurrent state)
    nbytes()   bytes of its tensors, measured (bench-decode and the KV reports print the sum)
    reset()    forget everything (generation's context shift starts over at position 0)

and its own mixer calls its own update. Softmax attention's state is KV below: K and V of every
position, of the n_kv_head (G) heads only; SDPA expands them to n_head at attention time, so GQA's
memory saving is real. Size: 2 (K and V) * B * G * T_max * head_dim * bytes per element per layer.
A sliding-window layer's is WindowKV: the same, for its window - 1 latest positions only.
"""

from __future__ import annotations

import torch

from anatomy_cli.spec.errors import InputError


class CacheFullError(InputError):
    """More positions were asked of the cache than it was allocated for."""


class KVCache:
    def __init__(self, states: list):
        self.states = states  # one per layer, made by that layer's mixer
        caps = [s.capacity for s in states if s.capacity is not None]
        self.capacity = min(caps) if caps else None  # None: no layer limits the positions
        self.past_len = 0  # positions already written (shared by all layers)

    def __getitem__(self, layer: int):
        return self.states[layer]

    def __len__(self) -> int:
        return len(self.states)

    def check_room(self, n_new: int) -> None:
        if self.capacity is not None and self.past_len + n_new > self.capacity:
            raise CacheFullError(
                f"KV cache holds {self.capacity} positions; {self.past_len} used, {n_new} more asked"
            )

    def advance(self, n: int) -> None:
        self.past_len += n

    def reset(self) -> None:
        self.past_len = 0
        for state in self.states:
            state.reset()

    def layer_bytes(self) -> list[int]:
        """Bytes of each layer's state, measured from its tensors."""
        return [state.nbytes() for state in self.states]

    def cache_bytes(self) -> int:
        return sum(self.layer_bytes())


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class KV:
    """Softmax attention's state: K and V of every position, [B, G, max_len, hd] each."""

    def __init__(self, batch: int, n_kv_head: int, max_len: int, head_dim: int, device=None,
                 dtype=torch.float32):
        shape = (batch, n_kv_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = max_len

    def update(self, k: torch.Tensor, v: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, G, T, hd]) at positions past..past+T-1; return the keys and values of
        positions 0..past+T-1 ([B, G, past + T, hd] views)."""
        end = past + k.shape[2]
        self.k[:, :, past:end] = k
        self.v[:, :, past:end] = v
        # cast back only when the cache's dtype differs (e.g. a bf16 cache)
        return self.k[:, :, :end].to(k.dtype), self.v[:, :, :end].to(v.dtype)

    def nbytes(self) -> int:
        return tensor_bytes(self.k, self.v)

    def reset(self) -> None:
        pass  # positions past past_len are never read: nothing to clear



class WindowKV:
    """A sliding-window layer's state: K and V of the window - 1 latest positions, oldest first,
    [B, G, window - 1, hd] each (a rolling buffer, as transformers' DynamicSlidingWindowLayer keeps).

    A query sees itself and the window - 1 positions before it, so nothing older is read again:
    memory is O(window) whatever the length, and any number of positions fits (capacity None).
    """

    capacity = None

    def __init__(self, batch: int, n_kv_head: int, window: int, head_dim: int, device=None,
                 dtype=torch.float32):
        self.size = window - 1
        shape = (batch, n_kv_head, self.size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def update(self, k: torch.Tensor, v: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Take k, v ([B, G, T, hd]) of positions past..past+T-1; return the keys and values of
        positions past-n..past+T-1 ([B, G, n + T, hd], n = min(past, window - 1) kept ones first)
        and keep the newest window - 1 of them. `past` counts positions since the last reset."""
        n = min(past, self.size)  # the buffer's last n slots hold positions past-n..past-1
        k_all = torch.cat((self.k[:, :, self.size - n :].to(k.dtype), k), dim=2)  # [B, G, n + T, hd]
        v_all = torch.cat((self.v[:, :, self.size - n :].to(v.dtype), v), dim=2)
        keep = min(self.size, k_all.shape[2])
        if keep:  # right-aligned: the newest position sits in the last slot
            self.k[:, :, self.size - keep :] = k_all[:, :, -keep:]
            self.v[:, :, self.size - keep :] = v_all[:, :, -keep:]
        return k_all, v_all

    def nbytes(self) -> int:
        return tensor_bytes(self.k, self.v)

    def reset(self) -> None:
        pass  # update reads only the min(past, window - 1) slots written since the reset
