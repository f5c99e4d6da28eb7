"""TMA tensor maps (CUtensorMap) for kernels that load with cp.async.bulk.tensor (csrc/common/sm90_tma.cuh).

`tensor_map_2d(t, box_inner, box_outer, swizzle=128)` encodes a 2-D tiled tensor map of a CUDA
tensor with cuTensorMapEncodeTiled (cuda-python's driver bindings, via glm5_fastpath.jit.runtime.driver())
and returns it as a `CUtensorMap` ctypes structure (128 bytes) that a launch passes by value to a
`const __grid_constant__ CUtensorMap` kernel parameter:

    w_map = tensor_map_2d(weight, 128, 128)          # [N, K] e4m3 -> 128 K-bytes x 128 rows boxes
    kernel.launch(grid, block, [params, w_map, ...])

Dimension order follows the tensor: t is [outer, inner] with the inner dimension contiguous; the
kernel addresses a box by (c_inner, c_outer) in elements. Elements outside the tensor read as zero.

Maps are cached by (data pointer, shape, strides, dtype, box, swizzle), so steady-state calls (and
CUDA-graph capture, whose parameters are copied at capture time) cost a dictionary lookup. A map
only holds the address, shape and strides, so a new tensor at a cached pointer with the same
geometry gets a correct (identical) map. Encoding needs the CUDA driver but no current context.

`tensor_map_strided(t, sizes, strides, box)` encodes an N-D (<= 5) map over an as_strided view of t
(outermost first, element strides, in any order): MegaMoE's gate/up gather uses it.

Argument errors raise TensorMapError (a ValueError) naming the tensor and the violated rule
(misaligned base or row stride, box too large for the swizzle, non-contiguous inner dimension, ...).
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any

SWIZZLES = (0, 32, 64, 128)
MAX_BOX = 256
CACHE_ENTRIES = 4096


class TensorMapError(ValueError):
    """A tensor map cannot be built for these arguments."""


class CUtensorMap(ctypes.Structure):
    """The 128-byte opaque CUtensorMap, passed by value as a kernel parameter.

    The device parameter is 64-byte aligned by the kernel's declaration; this host copy needs no
    alignment (the driver copies parameter bytes at launch; Python < 3.13 ctypes cannot align it)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]

    def __repr__(self) -> str:
        return f"CUtensorMap({' '.join(f'{w:016x}' for w in self.opaque[:4])} ...)"


assert ctypes.sizeof(CUtensorMap) == 128


def _dtype_info(dtype: Any) -> tuple[str, int]:
    """(CUtensorMapDataType member name, element bytes) of a torch dtype."""
    import torch
    table = {
        torch.uint8: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
        torch.int8: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
        torch.float8_e4m3fn: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
        torch.float8_e5m2: ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1),
        torch.bfloat16: ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2),
        torch.float16: ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2),
        torch.int16: ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2),
        torch.float32: ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 4),
        torch.int32: ("CU_TENSOR_MAP_DATA_TYPE_INT32", 4),
        torch.int64: ("CU_TENSOR_MAP_DATA_TYPE_INT64", 8),
    }
    try:
        return table[dtype]
    except KeyError:
        raise TensorMapError(f"tensor_map_2d: dtype {dtype} is not supported "
                             f"(one of {', '.join(sorted(str(d) for d in table))})") from None


def check_args(shape: tuple[int, ...], strides: tuple[int, ...], elem_bytes: int, data_ptr: int, box_inner: int,
               box_outer: int, swizzle: int, name: str = "tensor") -> None:
    """Validate a 2-D tensor map request (pure Python; the rules of cuTensorMapEncodeTiled plus the
    swizzle's inner-box limit). strides are in elements, like torch's."""
    where = f"tensor_map_2d({name}: shape {list(shape)}, strides {list(strides)}, box {box_inner}x{box_outer}, swizzle {swizzle})"
    if len(shape) != 2 or len(strides) != 2:
        raise TensorMapError(f"{where}: needs a 2-D tensor [outer, inner]")
    outer, inner = shape
    if outer < 1 or inner < 1:
        raise TensorMapError(f"{where}: empty tensor (every dimension must be >= 1)")
    if inner > 2**32 or outer > 2**32:
        raise TensorMapError(f"{where}: a dimension exceeds 2^32")
    if strides[1] != 1:
        raise TensorMapError(f"{where}: the inner dimension must be contiguous (stride 1), got stride {strides[1]}")
    row_bytes = strides[0] * elem_bytes
    if outer > 1 and (row_bytes % 16 or row_bytes <= 0):
        raise TensorMapError(f"{where}: the row stride {row_bytes} bytes must be a positive multiple of 16")
    if outer > 1 and row_bytes >= 2**40:
        raise TensorMapError(f"{where}: the row stride {row_bytes} bytes must be < 2^40")
    if outer > 1 and strides[0] < inner:
        raise TensorMapError(f"{where}: rows overlap (row stride {strides[0]} < inner size {inner})")
    if data_ptr % 16:
        raise TensorMapError(f"{where}: base address 0x{data_ptr:x} is not 16-byte aligned")
    if swizzle not in SWIZZLES:
        raise TensorMapError(f"{where}: swizzle must be one of {SWIZZLES} (bytes)")
    for what, b in (("box_inner", box_inner), ("box_outer", box_outer)):
        if not isinstance(b, int) or not 1 <= b <= MAX_BOX:
            raise TensorMapError(f"{where}: {what}={b!r} must be an int in 1..{MAX_BOX}")
    box_bytes = box_inner * elem_bytes
    if box_bytes % 16:
        raise TensorMapError(f"{where}: the inner box is {box_bytes} bytes; it must be a multiple of 16")
    if swizzle and box_bytes > swizzle:
        raise TensorMapError(f"{where}: box too large: the inner box is {box_bytes} bytes but swizzle {swizzle} allows "
                             f"at most {swizzle} bytes per row")


_cache: "OrderedDict[tuple, CUtensorMap]" = OrderedDict()
_lock = threading.Lock()


def _as_map(raw: Any) -> CUtensorMap:
    """The driver's CUtensorMap object as our ctypes structure."""
    out = CUtensorMap()
    words = getattr(raw, "opaque", None)
    if words is not None and len(words) == 16:
        for i, w in enumerate(words):
            out.opaque[i] = int(w) & 0xFFFFFFFFFFFFFFFF
    else:  # an older binding without .opaque: copy the 128 bytes it points at
        ctypes.memmove(ctypes.addressof(out), int(raw.getPtr()), 128)
    return out


def _encode(dtype_name: str, ptr: int, inner: int, outer: int, row_bytes: int, box_inner: int, box_outer: int,
            swizzle: int) -> CUtensorMap:
    from .runtime import check, driver
    d = driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    sw = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B", 64: "CU_TENSOR_MAP_SWIZZLE_64B",
          128: "CU_TENSOR_MAP_SWIZZLE_128B"}[swizzle]
    # NOTES: the stride of a 1-row tensor is irrelevant to addressing but must still be a valid
    # value for the driver: use the row's own size rounded up to 16 bytes.
    raw = check(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, dtype_name), 2, ptr,
        [u64(inner), u64(outer)], [u64(row_bytes)], [u32(box_inner), u32(box_outer)], [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, getattr(d.CUtensorMapSwizzle, sw),
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled(ptr=0x{ptr:x}, dims=[{inner}, {outer}], row={row_bytes} B, box={box_inner}x{box_outer}, "
        f"swizzle={swizzle})")
    return _as_map(raw)


def tensor_map_2d(t: Any, box_inner: int, box_outer: int, swizzle: int = 128, *, name: str = "tensor") -> CUtensorMap:
    """A cached 2-D tiled CUtensorMap of torch tensor t [outer, inner] (inner contiguous) whose loads
    copy box_inner x box_outer elements into shared memory with `swizzle` (0/32/64/128 bytes)."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise TensorMapError(f"tensor_map_2d({name}): expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise TensorMapError(f"tensor_map_2d({name}): the tensor must be on a CUDA device, got {t.device}")
    dtype_name, eb = _dtype_info(t.dtype)
    shape, strides, ptr = tuple(t.shape), tuple(t.stride()), int(t.data_ptr())
    key = (ptr, shape, strides, t.dtype, box_inner, box_outer, swizzle)
    m = _cache.get(key)
    if m is not None:
        return m
    check_args(shape, strides, eb, ptr, box_inner, box_outer, swizzle, name)
    outer, inner = shape
    row_bytes = strides[0] * eb if outer > 1 else -(-inner * eb // 16) * 16
    m = _encode(dtype_name, ptr, inner, outer, row_bytes, box_inner, box_outer, swizzle)
    with _lock:
        _cache[key] = m
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return m


def check_strided(sizes: tuple[int, ...], strides: tuple[int, ...], elem_bytes: int, data_ptr: int,
                  box: tuple[int, ...], swizzle: int, storage_elems: int, name: str = "tensor") -> None:
    """Validate an N-D (1..5) tensor map over an as_strided view (sizes/strides outermost first, in
    elements, like torch): the rules of cuTensorMapEncodeTiled plus the swizzle's inner-box limit, and
    that the view stays inside the tensor's `storage_elems` elements."""
    where = (f"tensor_map_strided({name}: sizes {list(sizes)}, strides {list(strides)}, box {list(box)}, "
             f"swizzle {swizzle})")
    n = len(sizes)
    if not 1 <= n <= 5 or len(strides) != n or len(box) != n:
        raise TensorMapError(f"{where}: sizes, strides and box need the same rank, 1..5")
    if strides[-1] != 1:
        raise TensorMapError(f"{where}: the innermost dimension must be contiguous (stride 1)")
    if any(d < 1 or d > 2**32 for d in sizes):
        raise TensorMapError(f"{where}: every size must be in 1..2^32")
    for d, st in zip(sizes[:-1], strides[:-1]):
        b = st * elem_bytes
        if d > 1 and (b <= 0 or b % 16 or b >= 2**40):
            raise TensorMapError(f"{where}: stride {b} bytes must be a positive multiple of 16 below 2^40")
    if data_ptr % 16:
        raise TensorMapError(f"{where}: base address 0x{data_ptr:x} is not 16-byte aligned")
    if swizzle not in SWIZZLES:
        raise TensorMapError(f"{where}: swizzle must be one of {SWIZZLES} (bytes)")
    for d, b in zip(sizes, box):
        if not isinstance(b, int) or not 1 <= b <= min(MAX_BOX, d):
            raise TensorMapError(f"{where}: box entry {b!r} must be an int in 1..min({MAX_BOX}, size {d})")
    inner = box[-1] * elem_bytes
    if inner % 16:
        raise TensorMapError(f"{where}: the inner box is {inner} bytes; it must be a multiple of 16")
    if swizzle and inner > swizzle:
        raise TensorMapError(f"{where}: the inner box is {inner} bytes but swizzle {swizzle} allows at most {swizzle}")
    last = sum((d - 1) * st for d, st in zip(sizes, strides))
    if last >= storage_elems:
        raise TensorMapError(f"{where}: the view reaches element {last}, past the tensor's {storage_elems} elements")


def tensor_map_strided(t: Any, sizes: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
                       swizzle: int = 128, *, name: str = "tensor") -> CUtensorMap:
    """A cached N-D (1..5) tiled CUtensorMap over torch.as_strided(t, sizes, strides) (outermost first,
    element strides; t contiguous). Strides need not be ordered, so one box can gather rows of several
    row sets in an interleaved order. A kernel passes coordinates innermost first (tma_load_5d)."""
    import torch
    if not isinstance(t, torch.Tensor):
        raise TensorMapError(f"tensor_map_strided({name}): expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise TensorMapError(f"tensor_map_strided({name}): the tensor must be on a CUDA device, got {t.device}")
    if not t.is_contiguous():
        raise TensorMapError(f"tensor_map_strided({name}): the tensor must be contiguous")
    dtype_name, eb = _dtype_info(t.dtype)
    sizes, strides, box, ptr = tuple(map(int, sizes)), tuple(map(int, strides)), tuple(map(int, box)), int(t.data_ptr())
    key = ("nd", ptr, t.numel(), sizes, strides, t.dtype, box, swizzle)
    m = _cache.get(key)
    if m is not None:
        return m
    check_strided(sizes, strides, eb, ptr, box, swizzle, t.numel(), name)
    from .runtime import check, driver
    d = driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    n = len(sizes)
    dims = [u64(x) for x in reversed(sizes)]
    # cuTensorMapEncodeTiled takes the strides of dims 1..n-1 in bytes (dim 0 is the contiguous one);
    # a size-1 dim's stride is unused but must be valid: use 16.
    gstr = [u64(st * eb if sz > 1 else 16) for sz, st in zip(reversed(sizes[:-1]), reversed(strides[:-1]))]
    sw = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B", 64: "CU_TENSOR_MAP_SWIZZLE_64B",
          128: "CU_TENSOR_MAP_SWIZZLE_128B"}[swizzle]
    raw = check(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, dtype_name), n, ptr, dims, gstr, [u32(x) for x in reversed(box)],
        [u32(1)] * n, d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, getattr(d.CUtensorMapSwizzle, sw),
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({name}: ptr=0x{ptr:x}, sizes={list(sizes)}, strides={list(strides)}, box={list(box)})")
    out = _as_map(raw)
    with _lock:
        _cache[key] = out
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return out


def cache_clear() -> None:
    with _lock:
        _cache.clear()


__all__ = ["CUtensorMap", "SWIZZLES", "TensorMapError", "cache_clear", "check_args", "check_strided", "tensor_map_2d",
           "tensor_map_strided"]
