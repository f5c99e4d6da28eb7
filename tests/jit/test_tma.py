"""glm5_fastpath.jit.tma without a GPU: the argument rules of tensor_map_2d (clear errors for a
misaligned base / row stride, a box too large for the swizzle, ...), and the call it makes to
cuTensorMapEncodeTiled (dimension order, strides in bytes, box, swizzle) through a fake driver, plus
the cache. The encoded map itself is exercised on the GPU by tests/ops/test_sm90_primitives.py."""
from __future__ import annotations

import ctypes

import pytest
import torch

FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("kw, match", [
    (dict(shape=(4,), strides=(1,)), "2-D"),
    (dict(shape=(4, 256), strides=(1, 4)), "contiguous"),
    (dict(shape=(4, 200), strides=(200, 1)), "multiple of 16"),
    (dict(shape=(4, 256), strides=(256, 1), ptr=0x10008), "not 16-byte aligned"),
    (dict(shape=(4, 256), strides=(256, 1), box=(256, 8)), "box too large"),
    (dict(shape=(4, 256), strides=(256, 1), box=(128, 300)), "box_outer=300"),
    (dict(shape=(4, 256), strides=(256, 1), box=(8, 8)), "multiple of 16"),
    (dict(shape=(4, 256), strides=(256, 1), swizzle=96), "swizzle must be one of"),
    (dict(shape=(4, 256), strides=(128, 1)), "rows overlap"),
    (dict(shape=(0, 256), strides=(256, 1)), "empty"),
])
def test_tensor_map_argument_checks(kw, match):
    from glm5_fastpath.jit.tma import TensorMapError, check_args
    box = kw.pop("box", (128, 64))
    ptr = kw.pop("ptr", 0x10000)
    sw = kw.pop("swizzle", 128)
    with pytest.raises(TensorMapError, match=match) as ei:
        check_args(kw["shape"], kw["strides"], 1, ptr, box[0], box[1], sw, name="w")
    assert "tensor_map_2d(w" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_tensor_map_valid_args_pass():
    from glm5_fastpath.jit.tma import check_args
    check_args((2624, 6144), (6144, 1), 1, 0x7f0000000000, 128, 128, 128)
    check_args((1, 2048), (2048, 1), 1, 0x7f0000000010, 128, 8, 128)  # box taller than the tensor: zero fill
    check_args((16, 64), (64, 1), 2, 0x10000, 64, 16, 128)            # bf16: 128-byte rows
    check_args((16, 64), (64, 1), 2, 0x10000, 64, 16, 0)


def test_tensor_map_encode_and_cache(monkeypatch):
    """tensor_map_2d calls cuTensorMapEncodeTiled with (inner, outer) order, the row stride in bytes,
    the box and the swizzle enum; a second call with the same geometry is a cache hit."""
    import glm5_fastpath.jit.runtime as rt
    import glm5_fastpath.jit.tma as tma

    calls = []

    class E:  # enum namespace: attribute name -> itself
        def __getattr__(self, k):
            return k

    class FakeMap:
        opaque = list(range(16))

    class D:
        CUtensorMapDataType = CUtensorMapInterleave = CUtensorMapSwizzle = E()
        CUtensorMapL2promotion = CUtensorMapFloatOOBfill = E()

        @staticmethod
        def cuuint64_t(v):
            return ("u64", v)

        @staticmethod
        def cuuint32_t(v):
            return ("u32", v)

        @staticmethod
        def cuTensorMapEncodeTiled(*a):
            calls.append(a)
            return (0, FakeMap())

    monkeypatch.setattr(rt, "_driver", D())
    tma.cache_clear()
    t = torch.empty(40, 6144, dtype=FP8)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
    m = tma.tensor_map_2d(t, 128, 64)
    assert isinstance(m, tma.CUtensorMap) and ctypes.sizeof(m) == 128 and list(m.opaque) == list(range(16))
    (dt, rank, ptr, dims, strides, box, es, il, sw, l2, oob), = calls
    assert (dt, rank, ptr) == ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 2, t.data_ptr())
    assert dims == [("u64", 6144), ("u64", 40)] and strides == [("u64", 6144)]
    assert box == [("u32", 128), ("u32", 64)] and es == [("u32", 1), ("u32", 1)]
    assert sw == "CU_TENSOR_MAP_SWIZZLE_128B" and oob == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    assert tma.tensor_map_2d(t, 128, 64) is m and len(calls) == 1
    tma.tensor_map_2d(t, 128, 128)
    assert len(calls) == 2
    tma.cache_clear()
