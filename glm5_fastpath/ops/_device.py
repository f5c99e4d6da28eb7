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


# ---- PDL wait point (csrc/common/pdl.cuh GLM5_PDL_WAIT_AT) ------------------------------------------

# pdl_wait= value -> GLM5_PDL_WAIT_AT: where the kernel executes its first griddepcontrol.wait
# (glm5_fastpath.attn_pre.cmp.modes.WAIT_POINTS names the same points, earliest first).
PDL_WAIT_POINTS = {"entry": 0, "after_prologue": 1, "after_prefetch": 2}
PDL_WAIT_NATIVE = 2  # each kernel's own wait (after its weight prefetch); its spec carries no define


def pdl_wait_code(op: str, pdl_wait: object, fail: Callable[[str], Exception] | None = None) -> int:
    """pdl_wait ("entry" | "after_prologue" | "after_prefetch" | None = native) -> GLM5_PDL_WAIT_AT;
    anything else raises (`fail(msg)`, default ValueError) naming the op."""
    if pdl_wait is None:
        return PDL_WAIT_NATIVE
    if not isinstance(pdl_wait, str) or pdl_wait not in PDL_WAIT_POINTS:
        msg = f"pdl_wait={pdl_wait!r}: expected one of {', '.join(map(repr, PDL_WAIT_POINTS))} or None (native)"
        raise fail(msg) if fail is not None else ValueError(f"{op}: {msg}")
    return PDL_WAIT_POINTS[pdl_wait]


def check_wait_at(op: str, wait_at: object) -> int:
    """The custom ops' int argument (GLM5_PDL_WAIT_AT, 0..2)."""
    if isinstance(wait_at, bool) or not isinstance(wait_at, int) or wait_at not in PDL_WAIT_POINTS.values():
        raise ValueError(f"{op}: pdl_wait_at={wait_at!r}: expected 0 (entry), 1 (after_prologue) or 2 (native)")
    return wait_at


# Standalone weight loads evict-first up to this many tokens (GLM5_FASTPATH_W_EVICT_FIRST unset / "auto"). Session
# 22 call 3, CMP's whole prefix, same call: -10 % at 1 token, -7 % at 16, +3 % at 64 (not measured between).
W_EVICT_FIRST_MAX_M = 16


def weights_evict_first(m: int) -> bool:
    """Whether the standalone FP8 GEMMs (both mainloops) and D2 at `m` tokens load their weights with an L2
    evict-first hint. GLM5_FASTPATH_W_EVICT_FIRST: unset / "auto" -> m <= W_EVICT_FIRST_MAX_M; "1" always; "0" never."""
    from ..jit import env
    raw = (env.text("GLM5_FASTPATH_W_EVICT_FIRST") or "auto").strip().lower()
    if raw == "auto":
        return m <= W_EVICT_FIRST_MAX_M
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"GLM5_FASTPATH_W_EVICT_FIRST={raw!r}: expected auto, 0 or 1")


# The define of the weight loads' evict-first hint (csrc/common/ptx_cp_async.cuh cp_async_16_weights; the wgmma
# tile's load_w); every build that takes the hint (standalone ops, the MegaRTP megakernel) adds exactly this.
WEIGHTS_HINT_DEFINES: tuple[tuple[str, str], ...] = (("GLM5_WEIGHTS_EVICT_FIRST", "1"),)


def weights_hint_defines(m: int) -> tuple[tuple[str, str], ...]:
    """WEIGHTS_HINT_DEFINES (part of the JIT cache key) when weights_evict_first(m); else nothing: the cache keys
    and SASS of before. Read when a kernel's spec is built."""
    return WEIGHTS_HINT_DEFINES if weights_evict_first(m) else ()


def wait_defines(wait_at: int) -> tuple[tuple[str, str], ...]:
    """The KernelSpec define of a wait point: none for the native one (default specs and cache keys unchanged)."""
    return () if wait_at == PDL_WAIT_NATIVE else (("GLM5_PDL_WAIT_AT", str(wait_at)),)
