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
