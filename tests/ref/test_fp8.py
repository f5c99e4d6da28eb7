"""FP8 helpers: quantization round trips, the block GEMM formula, and the index-K cache page layout byte for byte."""
import struct

import pytest
import torch

from glm5_fastpath.ref import fp8
from glm5_fastpath.testing.numerics import assert_close, assert_equal


@pytest.mark.parametrize("n,k", [(256, 256), (300, 260), (2624, 6144), (1, 128), (129, 127)])
def test_weight_block_quant_roundtrip(seed, n, k):
    w = torch.randn(n, k, dtype=torch.float64) * 0.02
    w8, s = fp8.quant_weight_block(w)
    assert w8.dtype == torch.float8_e4m3fn and w8.shape == (n, k)
    assert s.dtype == torch.float32 and s.shape == (-(-n // 128), -(-k // 128))
    # every block's amax maps to 448 exactly (scale = amax/448)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            blk = w[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            assert s[bi, bj].item() == pytest.approx(blk.abs().max().item() / 448, rel=1e-6)
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 per element (normal range)
    assert_close("quant_weight_block", fp8.dequant_weight_block(w8, s), w, tol=0.04)
    # re-quantizing the dequantized weight is idempotent
    w8b, sb = fp8.quant_weight_block(fp8.dequant_weight_block(w8, s))
    assert_equal("requant", w8b, w8)


def test_weight_zero_block_and_saturation():
    w = torch.zeros(128, 256)
    w[:, 128:] = 1000.0
    w8, s = fp8.quant_weight_block(w)
    assert s[0, 0] == 1.0 and (w8[:, :128].float() == 0).all()
    assert (w8[:, 128:].float() == 448).all() and s[0, 1].item() == pytest.approx(1000 / 448)


def test_cast_is_round_nearest_even_saturating():
    # 1.0625 lies exactly between 1.0 and 1.125 in e4m3 -> even mantissa (1.0); 1.1875 -> 1.25
    x = torch.tensor([1.0625, 1.1875, 500.0, -1e9, 0.0])
    assert fp8.cast_fp8(x).float().tolist() == [1.0, 1.25, 448.0, -448.0, 0.0]


@pytest.mark.parametrize("m", [1, 3, 16, 37])
def test_act_quant_per_token(seed, m):
    x = torch.randn(m, 6144) * torch.rand(m, 1) * 3
    x8, s = fp8.quant_act_per_token(x)
    assert x8.shape == x.shape and s.shape == (m, 48)
    ref_s = x.double().view(m, 48, 128).abs().amax(-1) / 448
    assert_close("act scale", s, ref_s, kind="fp32")
    assert (x8.float().view(m, 48, 128).abs().amax(-1) == 448).all()
    assert_close("act quant", fp8.dequant_act(x8, s), x, tol=0.04)
    with pytest.raises(ValueError, match="multiple of the group"):
        fp8.quant_act_per_token(torch.randn(2, 100))


def test_act_quant_zero_row_uses_eps():
    x8, s = fp8.quant_act_per_token(torch.zeros(1, 128))
    assert s.item() == pytest.approx(1e-10 / 448) and (x8.float() == 0).all()


@pytest.mark.parametrize("m,n,k", [(1, 2624, 6144), (3, 300, 256), (16, 128, 2048), (37, 4096, 2048)])
def test_block_fp8_linear_vs_float64(seed, m, n, k):
    x8, xs = fp8.quant_act_per_token(torch.randn(m, k))
    w8, ws = fp8.quant_weight_block(torch.randn(n, k) * k ** -0.5)
    y = fp8.block_fp8_linear(x8, xs, w8, ws)
    # independent formulation: dequantize both sides to float64, one matmul
    xd = x8.double().view(m, k // 128, 128) * xs.double()[..., None]
    wd = torch.zeros(n, k, dtype=torch.float64)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            wd[i:i + 128, j:j + 128] = w8[i:i + 128, j:j + 128].double() * ws[i // 128, j // 128].item()
    assert_close("block_fp8_linear", y, xd.view(m, k) @ wd.t(), kind="fp32", context=f"{m=} {n=} {k=}")


def test_index_k_cache_page_layout_byte_for_byte(seed):
    d, page = 128, 64
    cache = fp8.new_index_k_cache(4, d)
    assert cache.shape == (4, 8448) and cache.dtype == torch.uint8
    k8, ks = fp8.quant_per_row(torch.randn(5, d))
    slots = torch.tensor([0, 63, 64, 200, 255])
    fp8.index_k_cache_store(cache, slots, k8, ks)
    raw = cache.numpy().tobytes()
    for i, slot in enumerate(slots.tolist()):
        pg, off = divmod(slot, page)
        base = pg * 8448
        # fp8 values: token-major block of 64 x 128 bytes at the start of the page
        assert raw[base + off * d: base + (off + 1) * d] == k8[i].view(torch.uint8).numpy().tobytes()
        # scale: fp32 little-endian after the 8192-byte value block, 4 bytes per token
        (sv,) = struct.unpack_from("<f", raw, base + page * d + off * 4)
        assert sv == ks[i].item()
    written = {(s // page, s % page) for s in slots.tolist()}
    for pg in range(4):
        for off in range(page):
            if (pg, off) not in written:
                assert not cache[pg, off * d:(off + 1) * d].any() and not cache[pg, 8192 + off * 4: 8196 + off * 4].any()
    k8b, ksb = fp8.index_k_cache_load(cache, slots, d)
    assert_equal("index_k load", k8b, k8)
    assert_equal("index_k scale load", ksb, ks)
    kv, sv = fp8.index_k_cache_views(cache, d)
    assert kv.shape == (4, 64, 128) and sv.shape == (4, 64)
    assert_equal("view", kv[3, 8], k8[3])
    assert sv[3, 63].item() == ks[4].item()
    assert sv.data_ptr() == cache.data_ptr() + 8192  # a view, not a copy


def test_quant_per_row_floor():
    x8, s = fp8.quant_per_row(torch.zeros(2, 128))
    assert torch.allclose(s, torch.full((2,), 1e-4 / 448))
