"""A fake accelerator for CPU-only machines: tensors that report the `meta` device while their data
lives in a CPU tensor, and a dispatch mode that sees every aten op and records what a real GPU or
MPS device would refuse.

Inside `with FakeDevice() as fd:` every op runs for real on the CPU (so losses are the CPU's), but
  * a tensor created on or moved to `meta` reports device `meta` (an OnDevice wrapper);
  * an op that mixes such tensors with a host tensor of one or more dimensions is recorded in
    fd.problems (CUDA and MPS accept host *scalars* only, so 0-dim host tensors are allowed);
  * a float64 tensor on the device is recorded too (MPS has no float64).
Explicit transfers (.to / .cpu / copy_ / item) are what code should use, and are allowed.
`meta` stands in for the accelerator because it is a non-CPU device type every torch build
accepts (on a CPU-only build `mps` and `cuda` fail before dispatch).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
DEVICE = torch.device("meta")


class OnDevice(torch.Tensor):
    """A CPU tensor (`inner`) that says it lives on the fake device."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=DEVICE, requires_grad=inner.requires_grad)
        r.inner = inner
        return r

    def __repr__(self):
        return f"OnDevice({self.inner!r})"

    def tolist(self):  # a host read, as on CUDA (which copies to the host and converts)
        return self.inner.tolist()

    @property
    def is_meta(self) -> bool:  # it holds real data: load_state_dict must copy into it, not skip it
        return False

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on an OnDevice tensor outside FakeDevice")


def _unwrap(t):
    return t.inner if isinstance(t, OnDevice) else t


def _wrap(t):
    return OnDevice(t) if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice) else t


class FakeDevice(TorchDispatchMode):
    HOST_ONLY = {aten._local_scalar_dense.default}  # .item(), float(), int(): a read back to the host

    def __init__(self, no_float64: bool = True):
        super().__init__()
        self.no_float64 = no_float64
        self.problems: list[str] = []
        self.device_ops = 0  # ops that ran on the fake device (a test can check it saw real work)

    def __enter__(self):
        # torch.tensor(data, device=...) builds its tensor below the dispatcher's Python key, so this
        # mode never sees it: route it through an explicit host -> device copy instead.
        self._tensor = torch.tensor

        def tensor(data, *a, device=None, **kw):
            t = self._tensor(data, *a, **kw)
            return t.to(device) if device is not None else t

        torch.tensor = tensor
        return super().__enter__()

    def __exit__(self, *exc):
        torch.tensor = self._tensor
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        flat, _ = tree_flatten((args, kwargs))
        if any(type(t) is torch.Tensor and t.device == DEVICE for t in flat):  # no data: results are garbage
            raise RuntimeError(f"{func}: a real meta tensor (made on the device behind FakeDevice's back)")
        on_dev = any(isinstance(t, OnDevice) for t in flat)
        host = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice) and t.dim() > 0]
        target = kwargs.get("device")
        to_dev = target is not None and torch.device(target).type == DEVICE.type
        if to_dev:
            kwargs["device"] = torch.device("cpu")
        if func in (aten.pin_memory.default, aten._pin_memory.default):
            return args[0]
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if func is aten._to_copy.default:  # .to(): lands where it was asked, else stays put
            place = to_dev or (target is None and on_dev)
        elif func is aten.copy_.default:  # copy_ into a tensor: stays where the destination is
            place = isinstance(args[0], OnDevice)
        else:
            place = on_dev or to_dev
            if on_dev and host:
                t = host[0]
                self.problems.append(f"{func}: a host tensor {tuple(t.shape)} {t.dtype} mixed with device tensors")
        if not place or func in self.HOST_ONLY:
            return out
        self.device_ops += 1
        if self.no_float64:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                    self.problems.append(f"{func}: a float64 tensor {tuple(t.shape)} on the device (MPS has none)")
        return tree_map(_wrap, out)
