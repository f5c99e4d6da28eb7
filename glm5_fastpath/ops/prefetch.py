"""L2 prefetch of weights ahead of the kernel that reads them, as the torch.library op `glm5_fastpath::l2_prefetch`.

The idea: in a decode step many kernels are latency-bound (the attention core, the indexer top-k, the MoE router
and plan) and leave HBM idle, while the weight-bound kernel after them streams tens of MB (o_proj 100 MB, the
MoE's shared expert 37.7 MB). Issued just before the idle window, this op pulls (part of) those weights into
L2 so the weight-bound kernel finds them there. It is a hint: it writes nothing, so results are bitwise the
same with or without it.

MEASURED NOT TO PAY (H200, 2026-11-30, `glm5-fastpath bench l2-prefetch`, benchmarks/results/
2026-11-30_h200_session6/l2_prefetch): in every form (bulk or line prefetches, in the PDL chain or on a side
stream) and at every site tried (o_proj K-prefix + W_UV ahead of the sparse MLA; the shared expert ahead of
the router), the sequence got SLOWER, by 1.5-19 us; even a 32 MB read after a 15 us idle window did not get
faster. The line form, evenly spread over the SMs, was among them, so the finding stands; the bulk form's
numbers came from a build that spread its pieces over few CTAs (below). The engine does not use the op; it and
the benchmark stay so the finding can be re-checked.

What is prefetched, per tensor and fraction f in (0, 1]:
- a 2-D tensor with a contiguous last dim and f < 1: the first f of every row (a K-prefix of a row-major
  [N, K] weight: a GEMM's CTAs all start at k = 0, so that prefix is what they read first);
- anything else: the first f of the byte span the tensor covers (strides honoured, so a transposed view
  prefetches its storage).
Addresses are cut to 16-byte multiples (the instruction's granule); empty or < 16-byte ranges are skipped.

Kernel (csrc/prefetch/l2_prefetch.cu, csrc/common/l2_prefetch.cuh): up to MAX_RANGES ranges per launch, spread
over up to one CTA per SM, in one of two forms (`bulk`):
- False (default): one `prefetch.global.L2` per 128-byte line, through the load/store units;
- True: 16 KB `cp.async.bulk.prefetch.L2` pieces through the SMs' bulk-copy (TMA) units. Measured on an H200
  (bench l2-prefetch, 2026-11-30) in a PDL chain: 37.7 MB ahead of the MoE cost +122 us in the first version
  and +17-19 us in the second; both numbered the pieces thread-fastest, so the 1.5-2.3 K pieces of a call sat on
  the first 12-48 CTAs only (found in review; the work is now dealt out CTA-fastest, not yet re-measured).
With pdl=True it sits in the stream's PDL chain: it lets the next kernel launch at once, issues the prefetches,
then griddepcontrol.wait-s for the kernel before it, so stream order is kept for the kernels after it (note in
the .cu). `SideStream` instead issues it (pdl=False) on a side stream forked from the current one, so no
kernel of the main stream waits for it until `join()`.

CPU tensors: nothing to do (returns at once), so a CPU model shares the call sites. Under torch.compile the op
(no outputs) may be dropped as dead code; it is a hint, results do not change.

Errors: wrong types, a fraction outside (0, 1], more than MAX_RANGES tensors, tensors on different devices ->
L2PrefetchInputError (a ValueError) naming the op; a pre-sm_90 GPU -> RuntimeError.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import torch

from ..jit import KernelSpec
from ._device import device_index as _device_index, require_hopper

OP = "glm5_fastpath.l2_prefetch"
SOURCE = "prefetch/l2_prefetch.cu"
FUNCTION = "glm5_l2_prefetch"
SPEC = KernelSpec(FUNCTION, source=SOURCE)
MAX_RANGES = 4          # kMaxRanges in the .cu
THREADS = 128           # kThreads in the .cu
CHUNK = 16384           # L2PrefetchTile::kChunk: bytes per bulk prefetch instruction
LINE = 128              # L2PrefetchTile::kLine: bytes per line prefetch
GRANULE = 16            # cp.async.bulk.prefetch: 16-byte aligned address and size


class L2PrefetchInputError(ValueError):
    """l2_prefetch got an argument of the wrong type or value."""


def _fail(msg: str) -> L2PrefetchInputError:
    return L2PrefetchInputError(f"{OP}: {msg}")


@dataclass(frozen=True)
class Range:
    """rows x row_bytes bytes at base, rows row_stride bytes apart (csrc/common/l2_prefetch.cuh L2Range)."""
    base: int
    row_stride: int
    row_bytes: int
    rows: int

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.rows

    @property
    def pieces(self) -> int:
        return -(-self.row_bytes // CHUNK) * self.rows


def _down(x: int) -> int:
    return x // GRANULE * GRANULE


def _up(x: int) -> int:
    return -(-x // GRANULE) * GRANULE


def range_for(addr: int, shape: Sequence[int], stride: Sequence[int], itemsize: int, fraction: float) -> Range | None:
    """The prefetch range of one tensor (module doc), from its address, shape, strides and item size; None
    when nothing of >= 16 bytes is left. Pure arithmetic, so it is tested without a GPU."""
    if any(n == 0 for n in shape):
        return None
    if len(shape) == 2 and stride[1] == 1 and fraction < 1.0 and shape[0] > 1:
        row_stride = stride[0] * itemsize
        if addr % GRANULE == 0 and row_stride % GRANULE == 0:
            row_bytes = _down(int(fraction * shape[1] * itemsize))
            return Range(addr, row_stride, row_bytes, shape[0]) if row_bytes >= GRANULE else None
    extent = (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * itemsize
    lo, hi = _up(addr), _down(addr + int(fraction * extent))
    return Range(lo, hi - lo, hi - lo, 1) if hi - lo >= GRANULE else None


def plan(tensors: Sequence[torch.Tensor], fractions: Sequence[float]) -> list[Range]:
    """Validated ranges for `tensors` (one fraction each): the launch's work, shared by the op and the tests."""
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise _fail(f"tensors must be a list of torch.Tensor, got {type(tensors).__name__}")
    if not isinstance(fractions, (list, tuple)) or len(fractions) != len(tensors):
        raise _fail(f"fractions must be a list with one float per tensor ({len(tensors)}), got {fractions!r}")
    if len(tensors) > MAX_RANGES:
        raise _fail(f"at most {MAX_RANGES} tensors per call, got {len(tensors)}")
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < float(f) <= 1.0:
            raise _fail(f"each fraction must be in (0, 1], got {f!r}")
    if len({t.device for t in tensors}) > 1:
        raise _fail(f"tensors must be on one device, got {sorted({str(t.device) for t in tensors})}")
    out = []
    for t, f in zip(tensors, fractions):
        r = range_for(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), float(f))
        if r is not None:
            out.append(r)
    return out


def grid_for(ranges: Sequence[Range], num_sms: int, bulk: bool = True) -> int:
    """CTAs: one per SM at most, none for nothing to do; bulk: one thread per 16 KB piece is enough to fill
    the grid; lines: THREADS lines per CTA at least."""
    if bulk:
        return min(num_sms, sum(r.pieces for r in ranges))
    lines = sum((-(-r.row_bytes // LINE) + 1) * r.rows for r in ranges)  # L2PrefetchTile::lines_per_row
    return min(num_sms, -(-lines // THREADS))


class _L2Range(ctypes.Structure):
    _fields_ = [("base", ctypes.c_uint64), ("row_stride", ctypes.c_int64), ("row_bytes", ctypes.c_int64),
                ("rows", ctypes.c_int64)]


class _Params(ctypes.Structure):
    _fields_ = [("r", _L2Range * MAX_RANGES), ("num_ranges", ctypes.c_int32), ("bulk", ctypes.c_int32),
                ("wait_prev", ctypes.c_int32)]


def _params(ranges: Sequence[Range], bulk: bool, wait_prev: bool) -> _Params:
    p = _Params()
    for i, r in enumerate(ranges):
        p.r[i] = _L2Range(r.base, r.row_stride, r.row_bytes, r.rows)
    p.num_ranges, p.bulk, p.wait_prev = len(ranges), int(bulk), int(wait_prev)
    return p


_kernels: dict = {}
_sms: dict = {}


def _kernel(idx: int):
    k = _kernels.get(idx)
    if k is None:
        from ..jit.runtime import get_kernel
        k = _kernels[idx] = get_kernel(SPEC, device=torch.device("cuda", idx))
    return k


def _num_sms(idx: int) -> int:
    n = _sms.get(idx)
    if n is None:
        n = _sms[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


@torch.library.custom_op("glm5_fastpath::l2_prefetch", mutates_args=())
def _l2_prefetch(tensors: list[torch.Tensor], fractions: list[float], pdl: bool = True, bulk: bool = False) -> None:
    ranges = plan(tensors, fractions)
    if not ranges or tensors[0].device.type != "cuda":
        return
    idx = require_hopper(OP, tensors[0].device, _fail)
    _kernel(idx).launch((grid_for(ranges, _num_sms(idx), bulk), 1, 1), (THREADS, 1, 1),
                        (_params(ranges, bulk, pdl),), pdl=pdl)


@_l2_prefetch.register_fake
def _l2_prefetch_fake(tensors, fractions, pdl=True, bulk=False) -> None:
    return None


def _check_flags(pdl: object, bulk: object) -> None:
    for name, v in (("pdl", pdl), ("bulk", bulk)):
        if not isinstance(v, bool):
            raise _fail(f"{name} must be a bool, got {v!r}")


def _fractions(tensors, fractions) -> list:
    if fractions is None:
        return [1.0] * len(tensors)
    try:
        return [float(f) if not isinstance(f, bool) else f for f in fractions]
    except (TypeError, ValueError):
        raise _fail(f"fractions must be numbers in (0, 1], got {fractions!r}") from None


def l2_prefetch(tensors: Sequence[torch.Tensor], fractions: Sequence[float] | None = None, *, pdl: bool = True,
                bulk: bool = False) -> None:
    """Prefetch (the first `fractions` of) `tensors` into L2 on the current stream (module doc). fractions: one
    per tensor, default 1.0 each."""
    fr = _fractions(tensors, fractions)
    plan(list(tensors), fr)  # errors name this op before the dispatcher
    _check_flags(pdl, bulk)
    if tensors:
        torch.ops.glm5_fastpath.l2_prefetch(list(tensors), fr, pdl, bulk)


class SideStream:
    """l2_prefetch on a side stream per device, forked from the current stream (capture-safe: the fork and the
    join are stream waits, which CUDA-graph capture turns into graph edges). Every issue must be joined back
    (`join()`) before a capture ends; a join makes the current stream's next kernel wait for the prefetch
    launch, so put it where that launch is long done."""

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._pending: dict[int, torch.cuda.Stream] = {}

    def issue(self, tensors: Sequence[torch.Tensor], fractions: Sequence[float] | None = None, *,
              bulk: bool = False) -> bool:
        if not tensors or not isinstance(tensors[0], torch.Tensor) or tensors[0].device.type != "cuda":
            l2_prefetch(tensors, fractions, pdl=False, bulk=bulk)  # validates (errors name the op); no launch
            return False
        idx = _device_index(tensors[0].device)
        cur = torch.cuda.current_stream(idx)
        side = self._streams.get(idx)
        if side is None:
            side = self._streams[idx] = torch.cuda.Stream(device=idx)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            l2_prefetch(tensors, fractions, pdl=False, bulk=bulk)
        self._pending[idx] = side
        return True

    def join(self) -> None:
        """The current stream (of each device with an issue outstanding) waits for the side stream."""
        for idx, side in list(self._pending.items()):
            torch.cuda.current_stream(idx).wait_stream(side)
        self._pending.clear()

    @property
    def pending(self) -> bool:
        return bool(self._pending)


def precompile(device: object = None) -> None:
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    idx = _device_index(dev)
    _kernel(idx)
    _num_sms(idx)


def compile_check_specs() -> list[KernelSpec]:
    return [SPEC]
