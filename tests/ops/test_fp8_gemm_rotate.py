"""D1 / B1 with the Walsh-Hadamard rotation option (rotate=True: SGLang 0.5.14's indexer format).

CPU: the kernel option's spec / cache key / shared memory (formulas checked against the headers by nvcc),
argument plumbing through the Python wrappers and the torch.library ops (fake shapes on the meta device),
validation, the compile-check / precompile variants, and a CPU model of the epilogue's data flow (the
fragment -> shared memory -> row transpose, the butterflies, the per-row amax and the store addresses of
SkinnyFinish::rotated_rows + wht::transform_rows4) against glm5_fastpath.ref.hadamard.fwht, bit for bit.

GPU (marked gpu, both mainloops): each op against the reference with rotate=True at M in {1, 3, 16, 64, 256}
(FP8 judged against the same-quantisation reference, like test_fp8_gemm.py), the index-K cache bytes, PDL with
a late producer, a CUDA-graph replay, and the small preset (64-point rotation).
"""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops._device import weights_hint_defines
from glm5_fastpath.ref import fp8 as rfp8
from glm5_fastpath.ref import prefix as ref
from glm5_fastpath.ref.hadamard import fwht
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_

F = importlib.import_module("glm5_fastpath.ops.fp8_gemm")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")
ROT_M = [1, 3, 16, 64, 256]


# ---- CPU: spec, config, shared memory ----------------------------------------------------------------------

def test_rotation_spec_and_cache_key():
    base = F.kernel_spec(16, 6, F.EPI_IDX_K)
    rot = F.kernel_spec(16, 6, F.EPI_IDX_K, rot=128)
    assert "GLM5_SKINNY_ROT" not in dict(base.defines)  # the unrotated kernels' cache keys do not change
    assert dict(rot.defines)["GLM5_SKINNY_ROT"] == "128" and rot != base
    assert dict(F.kernel_spec(64, 6, F.EPI_IDX_Q, impl="wgmma", rot=64).defines)["GLM5_SKINNY_ROT"] == "64"
    for bad in (dict(epi=F.EPI_Q_B, rot=128), dict(epi=F.EPI_IDX_K, rot=96), dict(epi=F.EPI_IDX_K, rot=256)):
        with pytest.raises(ValueError, match="rot="):
            F.kernel_spec(16, 6, bad["epi"], rot=bad["rot"])
    c = F.SkinnyConfig(F.EPI_IDX_Q, 16, 4096, 2048, 16, 2, 6)
    r = F.rotated(c, 128)
    assert r.rot == 128 and r.spec() == F.kernel_spec(16, 6, F.EPI_IDX_Q, rot=128, hints=weights_hint_defines(16))
    assert (r.tm, r.splits, r.grid, r.partial_floats, r.counter_ints) == (c.tm, c.splits, c.grid, c.partial_floats,
                                                                          c.counter_ints)
    assert r.smem_bytes == c.smem_bytes + F.ROT_SCRATCH_BYTES == c.smem_bytes + 8448
    assert F.rotated(c, 0) is c and r.describe()["rot"] == 128 and "rot" not in c.describe()
    with pytest.raises(ValueError, match="D1 / B1"):
        F.rotated(F.SkinnyConfig(F.EPI_Q_B, 16, 16384, 2048, 16, 1, 6), 128)


def test_rotation_reduces_the_ring_only_when_it_must():
    big = F.SkinnyConfig(F.EPI_IDX_Q, 200, 4096, 2048, 128, 1, 5, impl="wgmma")
    assert big.smem_bytes <= F.SMEM_LIMIT
    r = F.rotated(big, 128)
    assert r.smem_bytes <= F.SMEM_LIMIT and r.stages <= big.stages
    assert r.stages == big.stages or F.wgmma_smem_bytes(128, r.stages + 1, big.gmax, F.EPI_IDX_Q, 128) > F.SMEM_LIMIT
    deep = F.SkinnyConfig(F.EPI_IDX_K, 64, 128, 6144, 64, 1, 8)  # 8 cp.async stages of 24 KB: over 227 KB rotated
    rd = F.rotated(deep, 128)
    assert rd.stages < 8 and rd.smem_bytes <= F.SMEM_LIMIT
    assert dataclasses.replace(rd, stages=rd.stages + 1).smem_bytes > F.SMEM_LIMIT
    # every config the GLM-5 / small shapes pick fits once rotated, with either mainloop
    for cfg in (GLM5, SMALL):
        for impl in (None, "mma", "wgmma"):
            for v in F._rotated_variants(cfg, 132, impl):
                assert v[-1] == cfg.index_head_dim


_SMEM_CHECK = r"""
#include "attn_pre/fp8_gemm_wgmma.cuh"
using namespace glm5::attn_pre::skinny;
static_assert(epi_with_rot(kEpiIdxK, 0) == kEpiIdxK && epi_with_rot(kEpiIdxQ, 128) == (kEpiIdxQ | (7 << 4)), "ids");
static_assert(epi_base(epi_with_rot(kEpiIdxK, 64)) == kEpiIdxK && epi_rot(epi_with_rot(kEpiIdxK, 64)) == 64, "ids");
static_assert(glm5::wht::inv_sqrt_pow2(128) == 0.088388346f && glm5::wht::inv_sqrt_pow2(64) == 0.125f, "scale");
%s
extern "C" __global__ void smem_formula_check() {}
"""


def test_rotation_smem_formulas_compile_against_the_headers(nvcc_jit):
    from glm5_fastpath.jit import KernelSpec
    lines = []
    for epi in F.ROT_EPIS:
        for tm, st, g, rot in ((8, 6, 48, 128), (64, 4, 16, 128), (16, 3, 8, 64)):
            c = F.SkinnyConfig(epi, 1, 128, g * 128, tm, 1, st, rot=rot)
            lines.append(f"static_assert(SkinnySmem<{tm}, {st}, epi_with_rot({epi}, {rot})>::bytes({g}) == "
                         f"{c.smem_bytes}, \"mma {epi} {tm} {rot}\");")
        for tm, st, g, rot in ((8, 10, 48, 128), (128, 5, 16, 128), (32, 8, 4, 64)):
            c = F.SkinnyConfig(epi, 1, 128, g * 128, tm, 1, st, impl="wgmma", rot=rot)
            lines.append(f"static_assert(WgmmaSmem<{tm}, {st}, epi_with_rot({epi}, {rot})>::launch_bytes({g}) == "
                         f"{c.smem_bytes}, \"wgmma {epi} {tm} {rot}\");")
    spec = KernelSpec("fp8_gemm_rot_smem_check", code=_SMEM_CHECK % "\n".join(lines), functions=("smem_formula_check",))
    assert nvcc_jit(spec).cubin


def test_rotated_variants_are_compile_checked():
    specs = [s for s in F.compile_check_specs() if "GLM5_SKINNY_ROT" in dict(s.defines)]
    got = {(s.name, int(dict(s.defines)["GLM5_SKINNY_EPI"]), int(dict(s.defines)["GLM5_SKINNY_TM"]),
            int(dict(s.defines)["GLM5_SKINNY_ROT"])) for s in specs}
    for epi in F.ROT_EPIS:
        for tm in F.token_blocks("mma", epi):
            assert (F.FUNCTION, epi, tm, 128) in got
        for tm in F.token_blocks("wgmma", epi):
            assert (F.WGMMA_FUNCTION, epi, tm, 128) in got
        assert any(e == epi and r == 64 for _, e, _, r in got)  # the small preset's 64-point rotation
    heur = {(impl, tm, st, epi, rot) for impl, tm, st, epi, _, rot in F._rotated_variants(GLM5, 132, "wgmma")}
    on = {(("wgmma" if s.name == F.WGMMA_FUNCTION else "mma"), int(dict(s.defines)["GLM5_SKINNY_TM"]),
           int(dict(s.defines)["GLM5_SKINNY_STAGES"]), int(dict(s.defines)["GLM5_SKINNY_EPI"]),
           int(dict(s.defines)["GLM5_SKINNY_ROT"])) for s in specs}
    assert heur <= on


# ---- CPU: argument plumbing and fakes ----------------------------------------------------------------------

def _meta_idx(cfg):
    from types import SimpleNamespace

    from glm5_fastpath.weights import Fp8Linear
    dev, d, h = "meta", cfg.index_head_dim, cfg.hidden_size
    return SimpleNamespace(
        wq_b=Fp8Linear(torch.empty(cfg.index_n_heads * d, cfg.q_lora_rank, dtype=FP8, device=dev),
                       torch.empty(-(-cfg.index_n_heads * d // 128), cfg.q_lora_rank // 128, device=dev)),
        wk=Fp8Linear(torch.empty(d, h, dtype=FP8, device=dev), torch.empty(1, h // 128, device=dev)),
        k_norm_weight=torch.empty(d, device=dev), k_norm_bias=torch.empty(d, device=dev))


@pytest.mark.parametrize("cfg", [GLM5, SMALL], ids=["glm5", "small"])
def test_rotate_reaches_the_ops_and_fakes(cfg, monkeypatch):
    m, dev = 5, "meta"
    seen = []
    real = F._rot_of
    monkeypatch.setattr(F, "_rot_of", lambda epi, rotate, d: seen.append((epi, rotate, d)) or real(epi, rotate, d))
    idx = _meta_idx(cfg)
    ql8 = torch.empty(m, cfg.q_lora_rank, dtype=FP8, device=dev)
    qls = torch.empty(m, cfg.q_lora_rank // 128, device=dev)
    pos = torch.empty(m, dtype=torch.int64, device=dev)
    w_raw = torch.empty(m, cfg.index_n_heads, dtype=BF16, device=dev)
    for rotate in (False, True):
        q8, s, hw = F.d1_indexer_q(ql8, qls, w_raw, idx, pos, cfg, rotate=rotate)
        assert (tuple(q8.shape), q8.dtype, tuple(s.shape), tuple(hw.shape)) == (
            (m, cfg.index_n_heads, cfg.index_head_dim), FP8, (m, cfg.index_n_heads), (m, cfg.index_n_heads))
    x8 = torch.empty(m, cfg.hidden_size, dtype=FP8, device=dev)
    xs = torch.empty(m, cfg.hidden_size // 128, device=dev)
    cache = torch.empty(3, cfg.index_k_page_bytes, dtype=torch.uint8, device=dev)
    for rotate in (False, True):
        k8, ks = F.b1_indexer_k(None, x8, xs, idx, pos, pos, cache, cfg, "fp8", rotate)
        assert (tuple(k8.shape), k8.dtype, tuple(ks.shape)) == ((m, cfg.index_head_dim), FP8, (m,))
    d = cfg.index_head_dim
    assert seen == [(F.EPI_IDX_Q, False, d), (F.EPI_IDX_Q, True, d), (F.EPI_IDX_K, False, d), (F.EPI_IDX_K, True, d)]
    # the ops' positional schema: rotate is the last argument, default False
    schema = str(torch.ops.glm5_fastpath.fp8_indexer_k.default._schema)
    assert "bool rotate=False" in schema and schema.index("rotate") > schema.index("pdl_wait_at")
    assert "bool rotate=False" in str(torch.ops.glm5_fastpath.fp8_indexer_q.default._schema)


def test_rotate_validation():
    with pytest.raises(ValueError, match="rotate must be a bool"):
        F._rot_of(F.EPI_IDX_Q, 1, 128)
    with pytest.raises(ValueError, match="head_dim in"):
        F._rot_of(F.EPI_IDX_K, True, 48)
    assert F._rot_of(F.EPI_IDX_K, False, 48) == 0 and F._rot_of(F.EPI_IDX_Q, True, 128) == 128


# ---- CPU: a model of the rotated epilogue's data flow ---------------------------------------------------------

KROW = 132  # kRotRowStride


def _xor_lanes(v: torch.Tensor, mask: int) -> torch.Tensor:
    """__shfl_xor_sync over dim 0 (lanes) of v [32, ...]."""
    return v[torch.arange(32) ^ mask]


def _kernel_model(tile: torch.Tensor, rot: int):
    """SkinnyFinish::rotated_rows + wht::transform_rows4 + row_amax, as the device code does it, on one n8 tile:
    tile [8 tokens, 128 features] fp32 -> (rows [8, 128] rotated, amax [8, 128] per lane's row group)."""
    buf = torch.full((8 * KROW,), float("nan"))
    for warp in range(8):  # fragment layout -> shared memory (float2 per (e): features 2g, 2g+1)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for e in range(2):
                x0 = tile[2 * t + e, 16 * warp + 2 * g]        # x[j][e]
                x1 = tile[2 * t + e, 16 * warp + 2 * g + 1]    # x[j][e + 2]
                base = (2 * t + e) * KROW + 16 * warp + 2 * g
                buf[base], buf[base + 1] = x0, x1
    out, amax = torch.empty(8, 128), torch.empty(8, 128)
    for warp in range(8):  # warp w: token row w, lane l: features 4l .. 4l+3 (float4)
        v = torch.stack([buf[warp * KROW + 4 * lane: warp * KROW + 4 * lane + 4] for lane in range(32)])  # [32, 4]
        v = v.clone()
        a, b = v[:, 0] + v[:, 1], v[:, 0] - v[:, 1]
        c, d = v[:, 2] + v[:, 3], v[:, 2] - v[:, 3]
        v = torch.stack([a, b, c, d], 1)
        a, c = v[:, 0] + v[:, 2], v[:, 0] - v[:, 2]
        b, d = v[:, 1] + v[:, 3], v[:, 1] - v[:, 3]
        v = torch.stack([a, b, c, d], 1)
        mask = 1
        while mask < rot // 4:
            upper = (torch.arange(32) & mask != 0)[:, None]
            o = _xor_lanes(v, mask)
            v = torch.where(upper, o - v, v + o)
            mask <<= 1
        v = v * torch.tensor(2.0 ** -3.5 if rot == 128 else rot ** -0.5, dtype=torch.float32)
        am = v.abs().amax(1)
        mask = 1
        while mask < rot // 4:
            am = torch.maximum(am, _xor_lanes(am, mask))
            mask <<= 1
        out[warp] = v.reshape(128)
        amax[warp] = am.repeat_interleave(4)
    return out, amax


@pytest.mark.parametrize("rot", [128, 64, 32, 16])
def test_kernel_dataflow_model_is_fwht_bitwise(rot):
    g = torch.Generator().manual_seed(rot)
    tile = (torch.randn(8, 128, generator=g) * 7).to(BF16).float()
    got, amax = _kernel_model(tile, rot)
    want = fwht(tile.view(8, 128 // rot, rot)).view(8, 128)
    assert torch.equal(got, want)
    want_amax = want.view(8, 128 // rot, rot).abs().amax(-1).repeat_interleave(rot, 1)
    assert torch.equal(amax, want_amax)


def test_rotation_buffer_stores_are_bank_conflict_free():
    """The float2 stores of a half-warp (16 lanes) hit 16 distinct 8-byte bank slots; the float4 row reads are
    16-byte aligned."""
    for warp in range(8):
        for e in range(2):
            for half in range(2):
                slots = set()
                for lane in range(16 * half, 16 * half + 16):
                    g, t = lane >> 2, lane & 3
                    byte = 4 * ((2 * t + e) * KROW + 16 * warp + 2 * g)
                    slots.add((byte // 8) % 16)
                assert len(slots) == 16, (warp, e, half)
    assert (KROW * 4) % 16 == 0 and F.ROT_SCRATCH_BYTES == 2 * 8 * KROW * 4


# ---- GPU --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layer():
    from glm5_fastpath.weights import random_layer
    return random_layer(GLM5, 3, 4321, device="cuda")


@pytest.fixture(scope="module")
def small_layer():
    from glm5_fastpath.weights import random_layer
    return random_layer(SMALL, 1, 77, device="cuda")


def _fp8_gemm_tests():
    return importlib.import_module("test_fp8_gemm")


def _deq(q8, s):
    return q8.float() * s.unsqueeze(-1).float()


@pytest.mark.gpu
@pytest.mark.parametrize("m", ROT_M)
def test_d1_indexer_q_rotated(m, layer, no_pdl_override, impl):
    T = _fp8_gemm_tests()
    c = GLM5
    ql8, qls = T.q_lora_inputs(m, c, layer, 160 + m)
    pos = T.make_positions(m, c, m, torch.int32 if m % 2 else torch.int64)
    w_raw = (torch.randn(m, c.index_n_heads, generator=torch.Generator().manual_seed(m)) * 3).to(BF16).cuda()
    T.poison_pool()
    q8, s, hw = F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
    r8, rs, rhw = ref.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
    u8, us, _ = F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c)
    torch.cuda.synchronize()
    ctx = f"rotated {impl} {m=}"
    assert_no_poison("d1_indexer_q", q8, s, hw, names=["q8", "q_scale", "head_w"])
    assert q8.shape == r8.shape and q8.dtype == FP8
    assert_close("d1_indexer_q", s, rs, kind="fp8_same_quant", context=f"scale {ctx}")
    assert_close("d1_indexer_q", hw, rhw, kind="fp8_same_quant", context=f"head_w {ctx}")
    assert_close("d1_indexer_q", _deq(q8, s), _deq(r8, rs), kind="fp8_same_quant", context=f"q {ctx}")
    c32 = torch.tensor(c.index_weight_scale, dtype=torch.float32).item()
    assert_equal("d1_indexer_q", hw, (w_raw.float() * c32) * s, context=f"head_w from own scale {ctx}")
    # the option really rotates: un-rotating the kernel's q gives its unrotated q (FP8 noise)
    assert not torch.equal(q8.view(torch.uint8), u8.view(torch.uint8))
    assert_close("d1_indexer_q", fwht(_deq(q8, s)), _deq(u8, us), kind="fp8_vs_exact", context=f"un-rotated {ctx}")
    again = F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
    for a, b in zip(again, (q8, s, hw)):
        assert_equal("d1_indexer_q", a.view(torch.uint8) if a.dtype == FP8 else a,
                     b.view(torch.uint8) if b.dtype == FP8 else b, context=f"deterministic {ctx}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", ROT_M)
def test_b1_indexer_k_rotated(m, layer, no_pdl_override, impl):
    T = _fp8_gemm_tests()
    c = GLM5
    x, x8, xs = T.make_x(m, c, 170 + m)
    pos = T.make_positions(m, c, m)
    cache, slots = T.make_cache(m, c, m)
    slots = slots.to(torch.int32) if m % 2 else slots
    cache_ref, before = cache.clone(), cache.clone()
    T.poison_pool()
    k8, ks = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache, c, rotate=True)
    r8, rs = ref.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache_ref, c, rotate=True)
    u8, us = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, before.clone(), c)
    torch.cuda.synchronize()
    ctx = f"rotated {impl} {m=}"
    assert_no_poison("b1_indexer_k", k8, ks, names=["k8", "k_scale"])
    assert k8.shape == r8.shape and k8.dtype == FP8
    assert_close("b1_indexer_k", ks, rs, kind="fp8_same_quant", context=f"scale {ctx}")
    assert_close("b1_indexer_k", _deq(k8, ks), _deq(r8, rs), kind="fp8_same_quant", context=f"k {ctx}")
    assert not torch.equal(k8.view(torch.uint8), u8.view(torch.uint8))
    assert_close("b1_indexer_k", fwht(_deq(k8, ks)), _deq(u8, us), kind="fp8_vs_exact", context=f"un-rotated {ctx}")
    ck8, cks = rfp8.index_k_cache_load(cache, slots, c.index_head_dim)
    assert_equal("b1_indexer_k", ck8, k8, context=f"cache k8 {ctx}")
    assert_equal("b1_indexer_k", cks, ks, context=f"cache scale {ctx}")
    touched = torch.zeros_like(cache, dtype=torch.bool)
    pg, off = slots.long() // 64, slots.long() % 64
    d = c.index_head_dim
    cols = torch.cat([off[:, None] * d + torch.arange(d, device="cuda"),
                      64 * d + off[:, None] * 4 + torch.arange(4, device="cuda")], 1)
    touched[pg[:, None], cols] = True
    assert_equal("b1_indexer_k", cache[~touched], before[~touched], context=f"untouched cache bytes {ctx}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 40])
def test_rotated_small_preset(m, small_layer, impl):
    T = _fp8_gemm_tests()
    c, lw = SMALL, small_layer  # index_head_dim 64: the 64-point rotation, two heads per D1 tile
    x, x8, xs = T.make_x(m, c, m)
    ql8, qls = T.q_lora_inputs(m, c, lw, m)
    pos = T.make_positions(m, c, m)
    w_raw = torch.randn(m, c.index_n_heads).to(BF16).cuda()
    q8, s, hw = F.d1_indexer_q(ql8, qls, w_raw, lw.attn.indexer, pos, c, rotate=True)
    r8, rs, rhw = ref.d1_indexer_q(ql8, qls, w_raw, lw.attn.indexer, pos, c, rotate=True)
    assert_close("d1_indexer_q", _deq(q8, s), _deq(r8, rs), kind="fp8_same_quant", context=f"small rotated {m=}")
    assert_close("d1_indexer_q", hw, rhw, kind="fp8_same_quant", context=f"small rotated head_w {m=}")
    cache, slots = T.make_cache(m, c, m)
    cache_ref = cache.clone()
    k8, ks = F.b1_indexer_k(x, x8, xs, lw.attn.indexer, pos, slots, cache, c, rotate=True)
    r8, rs = ref.b1_indexer_k(x, x8, xs, lw.attn.indexer, pos, slots, cache_ref, c, rotate=True)
    torch.cuda.synchronize()
    assert_close("b1_indexer_k", _deq(k8, ks), _deq(r8, rs), kind="fp8_same_quant", context=f"small rotated {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_rotated_pdl_late_producer(m, layer, no_pdl_override, impl):
    from glm5_fastpath.testing.pdl import late_producer, produce

    T = _fp8_gemm_tests()
    prod = late_producer()
    c = GLM5
    x, x8_true, xs = T.make_x(m, c, 180 + m)
    ql8_true, qls = T.q_lora_inputs(m, c, layer, 190 + m)
    pos = T.make_positions(m, c, m)
    w_raw = torch.randn(m, c.index_n_heads).to(BF16).cuda()
    cache, slots = T.make_cache(m, c, m)
    want_k8, want_ks = F.b1_indexer_k(x, x8_true, xs, layer.attn.indexer, pos, slots, cache.clone(), c, rotate=True)
    want_q = F.d1_indexer_q(ql8_true, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
    x8, ql8 = torch.empty_like(x8_true), torch.empty_like(ql8_true)
    for _ in range(3):
        x8.view(torch.uint8).fill_(0x38)  # stale: all 1.0 until the producer overwrites it
        torch.cuda.synchronize()
        produce(prod, x8_true, x8)
        k8, ks = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache, c, rotate=True)
        torch.cuda.synchronize()
        assert_equal("b1_indexer_k", k8.view(torch.uint8), want_k8.view(torch.uint8), context=f"PDL rotated {m=}")
        assert_equal("b1_indexer_k", ks, want_ks, context=f"PDL rotated scale {m=}")
        ql8.view(torch.uint8).fill_(0x38)
        torch.cuda.synchronize()
        produce(prod, ql8_true, ql8)
        got = F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
        torch.cuda.synchronize()
        for a, b, name in zip(got, want_q, ("q8", "q_scale", "head_w")):
            assert_equal("d1_indexer_q", a.view(torch.uint8) if a.dtype == FP8 else a,
                         b.view(torch.uint8) if b.dtype == FP8 else b, context=f"PDL rotated {name} {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 64])
def test_rotated_cuda_graph_replay(m, layer, no_pdl_override, impl):
    T = _fp8_gemm_tests()
    c = GLM5
    F.precompile(cfg=c, rotate=True)
    _, x8_0, xs_0 = T.make_x(m, c, 200)
    sx8, sxs = x8_0.clone(), xs_0.clone()
    ql8_0, qls_0 = T.q_lora_inputs(m, c, layer, 201)
    sql8, sqls = ql8_0.clone(), qls_0.clone()
    pos = T.make_positions(m, c, 7)
    cache, slots = T.make_cache(m, c, 7)
    w_raw = torch.randn(m, c.index_n_heads).to(BF16).cuda()
    F.d1_indexer_q(sql8, sqls, w_raw, layer.attn.indexer, pos, c, rotate=True)  # warm-up outside capture
    F.b1_indexer_k(None, sx8, sxs, layer.attn.indexer, pos, slots, cache, c, rotate=True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q8, qs, hw = F.d1_indexer_q(sql8, sqls, w_raw, layer.attn.indexer, pos, c, rotate=True)
        k8, ks = F.b1_indexer_k(None, sx8, sxs, layer.attn.indexer, pos, slots, cache, c, rotate=True)
    for step in range(3):
        _, x8, xs = T.make_x(m, c, 210 + step)
        ql8, qls = T.q_lora_inputs(m, c, layer, 220 + step)
        sx8.copy_(x8)
        sxs.copy_(xs)
        sql8.copy_(ql8)
        sqls.copy_(qls)
        for t in (qs, hw, ks):
            poison_(t)
        g.replay()
        torch.cuda.synchronize()
        ctx = f"rotated graph replay {step} {m=}"
        r8, rs, _ = ref.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c, rotate=True)
        assert_close("d1_indexer_q", _deq(q8, qs), _deq(r8, rs), kind="fp8_same_quant", context=ctx)
        rk8, rks = ref.b1_indexer_k(None, x8, xs, layer.attn.indexer, pos, slots, cache.clone(), c, rotate=True)
        assert_close("b1_indexer_k", _deq(k8, ks), _deq(rk8, rks), kind="fp8_same_quant", context=ctx)
