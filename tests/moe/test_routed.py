"""The fused router + MegaMoE plan (glm5_fastpath.moe.routed, csrc/moe/router_plan.cu).

Its outputs must be bit for bit those of the separate kernels it replaces, which tests/ops/test_moe_router.py,
tests/ops/test_act_quant.py and tests/moe/test_megamoe.py judge against the references:

    ids, w   = ops.moe_router.moe_route(h, gate, bias)      (same router tile code)
    x8, xs   = ops.act_quant.act_quant_fp8(h)                (the router's quant ride-along: same group tile)
    out      = moe.mega_moe(x8, xs, ids, w, experts)         (same plan code, in the router's last CTA)

so the GPU tests compare with those bitwise, with outputs poisoned through the caching allocator, over token counts
that take both router kernels, many launches alternating with the separate path (shared workspaces), CUDA-graph
replays with changing inputs, and a late producer of h under PDL. CPU tests: the rule of which M it takes, the fake
implementation, input errors, the kernel spec, and a compile without spills.
"""
from __future__ import annotations

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.moe import megamoe as MM
from glm5_fastpath.moe import routed
from glm5_fastpath.ops import moe_router as R
from glm5_fastpath.testing.numerics import assert_equal

OP = "routed_mega_moe"
BF16 = torch.bfloat16
GLM5 = Glm5Config.preset("glm5")
H, I = GLM5.hidden_size, GLM5.moe_intermediate_size


# ---- CPU ----------------------------------------------------------------------------------------------------

def test_supported_rule(monkeypatch):
    monkeypatch.delenv(R.ENV_DECODE, raising=False)
    rc = R.config_for(H, 256, 8)
    assert [m for m in (0, 1, 4, 5, 32, 33, 64, 256, 257) if routed.supported(m, rc)] == [1, 4, 5, 32]
    assert routed.supported(33, rc, decode=True) is False  # the decode kernel is chosen up to 32 tokens only
    assert routed.supported(8, rc, decode=False) and not routed.supported(40, rc, decode=False)


def test_kernel_spec_carries_both_builds():
    rc = R.config_for(H, 256, 8)
    cfg = MM.MegaMoEConfig.from_name("bn16_s6_g512_w4_lf")
    spec = routed.kernel_spec(rc, cfg.spec(H, I))
    d = dict(spec.defines)
    assert d["GLM5_ROUTER_EXPERTS"] == "256" and d["GLM5_ROUTER_TOPK"] == "8" and d["GLM5_MEGAMOE_BN"] == "16"
    assert d["GLM5_MEGAMOE_LEAN_FENCES"] == "1" and spec.source == routed.SOURCE
    assert set(spec.functions) == {routed.FUNCTION, routed.FUNCTION_DECODE}
    ep = MM.MegaMoEConfig.from_name("bn8_s6_g512_w4_lf_p").spec(H, I, ep=True)
    with pytest.raises(ValueError, match="expert-parallel"):
        routed.kernel_spec(rc, ep)


def _meta(m=3, e=32, k=8, h=H, inter=I):
    d = "meta"
    return dict(h=torch.empty(m, h, dtype=BF16, device=d), gate=torch.empty(e, h, dtype=BF16, device=d),
                bias=torch.empty(e, device=d), w13=torch.empty(e + 1, 2 * inter, h, dtype=MM.FP8, device=d),
                s13=torch.empty(e + 1, 2 * inter // 128, h // 128, device=d),
                w2=torch.empty(e + 1, h, inter, dtype=MM.FP8, device=d), s2=torch.empty(e + 1, h // 128, inter // 128,
                                                                                         device=d), k=k)


def test_fake_shapes():
    d = _meta(m=5)
    out, ids, w = torch.ops.glm5_fastpath.routed_mega_moe(d["h"], d["gate"], d["bias"], d["k"], d["w13"], d["s13"],
                                                          d["w2"], d["s2"], 1, 2.5, 16, 6, 512, 4)
    assert out.shape == (5, H) and out.dtype == BF16
    assert ids.shape == (5, 8) and ids.dtype == torch.int32 and w.shape == (5, 8) and w.dtype == torch.float32


def test_input_errors():
    from glm5_fastpath.moe.megamoe import MegaMoEWeights

    d = _meta(m=3, e=32)
    wt = MegaMoEWeights(d["w13"], d["s13"], d["w2"], d["s2"], 32, 1)
    with pytest.raises(ValueError, match="routed_mega_moe.*64 experts but the expert weights hold 32"):
        routed.routed_mega_moe(d["h"], torch.empty(64, H, dtype=BF16, device="meta"),
                               torch.empty(64, device="meta"), GLM5, wt)
    with pytest.raises(ValueError, match="decode must be None or a bool"):
        routed.routed_mega_moe(d["h"], d["gate"], d["bias"], GLM5, wt, decode=1)
    with pytest.raises(ValueError, match="MegaMoEWeights"):
        routed.routed_mega_moe(d["h"], d["gate"], d["bias"], GLM5, object())


def test_compiles_without_spills(nvcc_jit):
    for spec in routed.compile_check_specs():
        res = nvcc_jit(spec).resources()
        for fn in (routed.FUNCTION, routed.FUNCTION_DECODE):
            r = res[fn]
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (spec.describe(), fn, r)
        # the decode kernel keeps 3 CTAs per SM (<= 85 registers): its grid is one wave
        assert res[routed.FUNCTION_DECODE].registers <= 85, res[routed.FUNCTION_DECODE]


# ---- GPU ----------------------------------------------------------------------------------------------------

_W: dict = {}


def _setup(e: int):
    """Router gate / bias (random, realistic scale) and GLM-5-sized experts (e routed + 1 shared), once per e."""
    if e not in _W:
        from glm5_fastpath.testing.moe_data import make_experts

        g = torch.Generator().manual_seed(e)
        gate = (torch.randn(e, H, generator=g) * 0.02).to(BF16).cuda()
        bias = (torch.randn(e, generator=g) * 0.01).float().cuda()
        w13, s13, w2, s2 = make_experts(e + 1, H, I, seed=e, device="cuda")
        _W[e] = gate, bias, MM.prepare_weights(w13, s13, w2, s2, 1)
    return _W[e]


def _h(m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, H, generator=g) * (1 + 3 * torch.rand(1, H, generator=g) ** 8)
    if m >= 3:
        x[2].zero_()  # selection by the bias alone
    return x.to(BF16).cuda()


def _poison_pool(nbytes: int = 64 << 20) -> None:
    """Fill freed caching-allocator blocks with NaN bytes, so outputs the kernels fail to write show up."""
    junk = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del junk


def _separate(h, gate, bias, wt, cfg, decode):
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    ids, w, _ = R.moe_route(h, gate, bias, GLM5, decode=decode)
    x8, xs = act_quant_fp8(h)
    return MM.mega_moe(x8, xs, ids, w, wt, routed_scaling_factor=GLM5.routed_scaling_factor, config=cfg), ids, w


def _check(got, want, ctx):
    for name, a, b in zip(("out", "topk_ids", "topk_weights"), got, want):
        assert_equal(OP + " " + name, a, b, context=ctx)


def _counters_at_rest():
    for ws in R._workspaces.values():
        assert int(ws.counters.abs().sum()) == 0, f"router arrival counters not reset: {ws.counters.tolist()}"


@pytest.mark.gpu
@pytest.mark.parametrize("e", [32, 256])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 16, 31, 32])
@pytest.mark.parametrize("decode", [None, True, False])
def test_gpu_equals_the_separate_kernels_bitwise(e, m, decode):
    gate, bias, wt = _setup(e)
    cfg = MM.default_config(m, e, 8, 1)
    for seed in (m, m + 100):
        h = _h(m, seed)
        want = _separate(h, gate, bias, wt, cfg, decode)
        _poison_pool()
        got = routed.routed_mega_moe(h, gate, bias, GLM5, wt, config=cfg, decode=decode)
        torch.cuda.synchronize()
        _check(got, want, f"{e=} {m=} {decode=} {seed=} {cfg.name}")
    _counters_at_rest()


@pytest.mark.gpu
@pytest.mark.parametrize("e", [32, 256])
def test_gpu_many_launches_alternating_with_the_separate_path(e):
    """Back-to-back launches of varying M, fused and separate interleaved on one stream (shared router and MegaMoE
    workspaces, PDL between them): every fused result equals its separate twin."""
    gate, bias, wt = _setup(e)
    ms = [1, 8, 3, 32, 2, 16, 5, 1, 31, 4] * 3
    hs = [_h(m, 1000 + i) for i, m in enumerate(ms)]
    cfgs = [MM.default_config(m, e, 8, 1) for m in ms]
    want = [_separate(h, gate, bias, wt, c, None) for h, c in zip(hs, cfgs)]
    torch.cuda.synchronize()
    got = []
    for i, (h, c) in enumerate(zip(hs, cfgs)):
        got.append(routed.routed_mega_moe(h, gate, bias, GLM5, wt, config=c))
        if i % 3 == 1:
            _separate(h, gate, bias, wt, c, None)
    torch.cuda.synchronize()
    for i, (g, w) in enumerate(zip(got, want)):
        _check(g, w, f"launch {i} m={ms[i]}")
    _counters_at_rest()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32])
def test_gpu_cuda_graph_replays(m):
    """One graph of (late producer of h -> fused op -> fused op), replayed with new inputs: both launches equal the
    separate kernels on the producer's h (the router waits for its producer; the second launch's router may start
    while the first MegaMoE runs and must not disturb its plan)."""
    from glm5_fastpath.testing.pdl import late_producer, produce

    gate, bias, wt = _setup(256)
    cfg = MM.default_config(m, 256, 8, 1)
    producer = late_producer()
    src = _h(m, 7)
    static_h = torch.empty_like(src)
    routed.routed_mega_moe(src, gate, bias, GLM5, wt, config=cfg)  # compile, load, workspaces outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, src, static_h)
        first = routed.routed_mega_moe(static_h, gate, bias, GLM5, wt, config=cfg)
        second = routed.routed_mega_moe(static_h, gate, bias, GLM5, wt, config=cfg)
    for step in range(6):
        src.copy_(_h(m, 300 + step))
        static_h.fill_(7.0)
        for t in (*first, *second):
            t.fill_(-1) if t.dtype == torch.int32 else t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = _separate(src.clone(), gate, bias, wt, cfg, None)
        torch.cuda.synchronize()
        _check(first, want, f"replay {step} first")
        _check(second, want, f"replay {step} second")
    _counters_at_rest()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 8, 32])
def test_gpu_waits_for_a_late_producer(m):
    """The producer writes h after ~50 us; the fused router launched with PDL right behind it must read only the
    fresh h (its plan, too, must see only the ids of this launch)."""
    from glm5_fastpath.testing.pdl import late_producer, produce

    gate, bias, wt = _setup(256)
    cfg = MM.default_config(m, 256, 8, 1)
    producer = late_producer()
    h_true = _h(m, 55)
    want = _separate(h_true, gate, bias, wt, cfg, None)
    h = torch.full_like(h_true, 7.0)
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        got = routed.routed_mega_moe(h, gate, bias, GLM5, wt, config=cfg, pdl=True)
        torch.cuda.synchronize()
        _check(got, want, f"late producer {m=}")
