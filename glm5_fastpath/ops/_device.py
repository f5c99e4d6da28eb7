"""Device checks shared by every op: a CUDA device of compute capability >= 9.0 (Hopper).

Checked once per device index and cached; the result is a clear error naming the op, never a
launch that computes garbage on an older GPU.
"""
from __future__ import annotations

from typing import Callable

import torch

_capability_ok: dict[int, bool] = {}


def device_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


def require_hopper(op: str, dev: torch.device, fail: Callable[[str], Exception]) -> int:
    """-> the device index; `fail(msg)` builds the error for a non-CUDA device (the op's input error type),
    a pre-sm_90 GPU raises RuntimeError."""
    if dev.type != "cuda":
        raise fail(f"tensors must be on a CUDA device, got {dev}")
    idx = device_index(dev)
    ok = _capability_ok.get(idx)
    if ok is None:
        major, minor = torch.cuda.get_device_capability(idx)
        ok = _capability_ok[idx] = major >= 9
        if not ok:
            raise RuntimeError(f"{op}: needs a Hopper (sm_90) or newer GPU; cuda:{idx} is sm_{major}{minor}")
    elif not ok:
        raise RuntimeError(f"{op}: needs a Hopper (sm_90) or newer GPU; cuda:{idx} is older")
    return idx


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last+1) byte addresses a (possibly strided) tensor touches."""
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' byte ranges intersect (an output aliasing an input it still reads)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def require_aligned(fail: Callable[[str], Exception], named: dict[str, torch.Tensor], align: int = 16) -> None:
    """16-byte vector loads/stores need 16-byte aligned data; a sliced view is the usual culprit."""
    for name, t in named.items():
        if t.numel() and t.data_ptr() % align:
            raise fail(f"{name} data must be {align}-byte aligned (got address {t.data_ptr():#x}; a sliced view?)")
