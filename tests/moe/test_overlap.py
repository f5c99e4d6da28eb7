"""The shared expert overlapped with the routing (glm5_fastpath.moe.overlap).

Two MegaMoE launches replace one: the shared expert's (FLAG_SHARED_ONLY, on part of the GPU, while the router and the
routed pairs' plan run on a side stream) and the routed experts' (FLAG_ROUTED_ONLY), which combine through one slot
buffer. The result must be bit for bit the one-launch chain with the same router kernel:

    ids, w = ops.moe_router.moe_route(h, gate, bias, decode=True)
    out    = moe.mega_moe(x8, xs, ids, w, experts)

GPU tests compare with that over token counts, shared-launch grids, many launches alternating with the one-launch
path (shared workspaces), CUDA-graph replays with a late producer of h, and check that every counter is back at
rest. CPU tests: the rule of which calls it takes, the grid rule, the kernel's flag values, the fake implementation,
input errors.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.moe import megamoe as MM
from glm5_fastpath.moe import overlap as OV
from glm5_fastpath.ops import moe_router as R
from glm5_fastpath.testing.numerics import assert_equal

OP = "routed_mega_moe_overlap"
BF16 = torch.bfloat16
GLM5 = Glm5Config.preset("glm5")
H, I = GLM5.hidden_size, GLM5.moe_intermediate_size
CUH = Path(__file__).resolve().parents[2] / "csrc" / "moe" / "megamoe.cuh"


# ---- CPU ----------------------------------------------------------------------------------------------------

def test_supported_rule():
    rc = R.config_for(H, 256, 8)
    cfg = MM.default_config(1, 256, 8, 1)
    assert [m for m in (0, 1, 8, 32, 33, 256) if OV.supported(m, rc, cfg, 1)] == [1, 8, 32]
    assert not OV.supported(1, rc, cfg, 0)  # no shared expert: nothing to overlap
    pool = MM.default_config(4096, 32, 8, 1)
    assert pool.pool and not OV.supported(8, rc, pool, 1)  # the pool build needs every CTA resident at once


def test_default_shared_grid_leaves_the_router_its_sms():
    assert OV.default_shared_grid(132) == 132 - OV.ROUTER_SMS
    assert OV.ROUTER_SMS * 3 >= R.config_for(H, 256, 8).decode_ctas  # one wave of the router at 3 CTAs per SM
    assert OV.default_shared_grid(40) == 16


def test_plan_flags_match_the_kernel():
    src = CUH.read_text()
    for name, value in (("kFlagSharedOnly", MM.FLAG_SHARED_ONLY), ("kFlagRoutedOnly", MM.FLAG_ROUTED_ONLY),
                        ("kFlagEndCombine", MM.FLAG_END_COMBINE)):
        m = re.search(rf"constexpr int32_t {name} = (\d+);", src)
        assert m and int(m.group(1)) == value, name
    assert len({MM.FLAG_FC1_ONLY, MM.FLAG_NO_COMBINE, MM.FLAG_END_COMBINE, MM.FLAG_SHARED_ONLY,
                MM.FLAG_ROUTED_ONLY}) == 5


def _meta(m=3, e=32, k=8, h=H, inter=I):
    d = "meta"
    return dict(h=torch.empty(m, h, dtype=BF16, device=d), x8=torch.empty(m, h, dtype=MM.FP8, device=d),
                xs=torch.empty(m, h // 128, device=d), gate=torch.empty(e, h, dtype=BF16, device=d),
                bias=torch.empty(e, device=d), w13=torch.empty(e + 1, 2 * inter, h, dtype=MM.FP8, device=d),
                s13=torch.empty(e + 1, 2 * inter // 128, h // 128, device=d),
                w2=torch.empty(e + 1, h, inter, dtype=MM.FP8, device=d),
                s2=torch.empty(e + 1, h // 128, inter // 128, device=d), k=k)


def test_fake_shapes():
    d = _meta(m=5)
    out, ids, w = torch.ops.glm5_fastpath.routed_mega_moe_overlap(
        d["h"], d["x8"], d["xs"], d["gate"], d["bias"], d["k"], d["w13"], d["s13"], d["w2"], d["s2"], 1, 2.5, 16, 6,
        512, 4, True, False, 88)
    assert out.shape == (5, H) and out.dtype == BF16
    assert ids.shape == (5, 8) and ids.dtype == torch.int32 and w.shape == (5, 8) and w.dtype == torch.float32


def test_input_errors():
    d = _meta(m=3, e=32)
    wt = MM.MegaMoEWeights(d["w13"], d["s13"], d["w2"], d["s2"], 32, 1)
    with pytest.raises(ValueError, match="routed_mega_moe_overlap.*64 experts"):
        OV.routed_mega_moe_overlap(d["h"], d["x8"], d["xs"], torch.empty(64, H, dtype=BF16, device="meta"),
                                   torch.empty(64, device="meta"), GLM5, wt)
    with pytest.raises(ValueError, match="MegaMoEWeights"):
        OV.routed_mega_moe_overlap(d["h"], d["x8"], d["xs"], d["gate"], d["bias"], GLM5, object())
    pool = MM.default_config(4096, 32, 8, 1)
    with pytest.raises(ValueError, match="not taken"):
        OV.routed_mega_moe_overlap(d["h"], d["x8"], d["xs"], d["gate"], d["bias"], GLM5, wt, config=pool)
    d33 = _meta(m=33, e=32)
    with pytest.raises(ValueError, match="not taken"):
        OV.routed_mega_moe_overlap(d33["h"], d33["x8"], d33["xs"], d33["gate"], d33["bias"], GLM5, wt)


def test_bench_overlap_grids_option():
    from glm5_fastpath.bench.moe_layer import parse_overlap_grids

    assert parse_overlap_grids("default", 132) == [OV.default_shared_grid(132)]
    assert parse_overlap_grids("64, default,64", 132) == [64, 88]
    assert parse_overlap_grids("none", 132) == []
    with pytest.raises(ValueError, match="outside"):
        parse_overlap_grids("200", 132)
    with pytest.raises(ValueError, match="integers"):
        parse_overlap_grids("many", 132)


# ---- GPU ----------------------------------------------------------------------------------------------------

_W: dict = {}


def _setup(e: int):
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
    return x.to(BF16).cuda()


def _poison_pool(nbytes: int = 64 << 20) -> None:
    junk = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del junk


def _one_launch(h, gate, bias, wt, cfg):
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    ids, w, _ = R.moe_route(h, gate, bias, GLM5, decode=True)
    x8, xs = act_quant_fp8(h)
    return MM.mega_moe(x8, xs, ids, w, wt, routed_scaling_factor=GLM5.routed_scaling_factor, config=cfg), ids, w


def _overlap(h, gate, bias, wt, cfg, grid=None):
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    x8, xs = act_quant_fp8(h)
    return OV.routed_mega_moe_overlap(h, x8, xs, gate, bias, GLM5, wt, config=cfg, shared_grid=grid)


def _check(got, want, ctx):
    for name, a, b in zip(("out", "topk_ids", "topk_weights"), got, want):
        assert_equal(OP + " " + name, a, b, context=ctx)


def _at_rest(wt):
    for ws in R._workspaces.values():
        assert int(ws.counters.abs().sum()) == 0, f"router arrival counters not reset: {ws.counters.tolist()}"
    ws_r = MM.workspace_for("cuda", wt, 8)
    assert int(ws_r.combine_ctr.abs().sum()) == 0, "combine counters not back at rest"
    assert int(ws_r.split_ctr.abs().sum()) == 0, "split-K counters not back at rest"


@pytest.mark.gpu
@pytest.mark.parametrize("e", [32, 256])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16, 31, 32])
@pytest.mark.parametrize("grid", [None, 16, "all"])
def test_gpu_equals_the_one_launch_chain_bitwise(e, m, grid):
    gate, bias, wt = _setup(e)
    cfg = MM.default_config(m, e, 8, 1)
    g = MM._sms(torch.device("cuda")) if grid == "all" else grid
    for seed in (m, m + 100):
        h = _h(m, seed)
        want = _one_launch(h, gate, bias, wt, cfg)
        _poison_pool()
        got = _overlap(h, gate, bias, wt, cfg, g)
        torch.cuda.synchronize()
        _check(got, want, f"{e=} {m=} {grid=} {seed=} {cfg.name}")
    _at_rest(wt)


@pytest.mark.gpu
def test_gpu_many_launches_alternating_with_the_one_launch_path():
    """Back-to-back launches of varying M, overlap and one-launch interleaved on one stream (the routed launch shares
    the one-launch path's workspace): every overlap result equals its one-launch twin, counters end at rest."""
    gate, bias, wt = _setup(256)
    ms = [1, 8, 3, 32, 2, 16, 5, 1, 31, 4] * 3
    hs = [_h(m, 1000 + i) for i, m in enumerate(ms)]
    cfgs = [MM.default_config(m, 256, 8, 1) for m in ms]
    want = [_one_launch(h, gate, bias, wt, c) for h, c in zip(hs, cfgs)]
    torch.cuda.synchronize()
    got = []
    for i, (h, c) in enumerate(zip(hs, cfgs)):
        got.append(_overlap(h, gate, bias, wt, c))
        if i % 3 == 1:
            _one_launch(h, gate, bias, wt, c)
    torch.cuda.synchronize()
    for i, (g, w) in enumerate(zip(got, want)):
        _check(g, w, f"launch {i} m={ms[i]}")
    _at_rest(wt)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32])
def test_gpu_cuda_graph_replays_with_a_late_producer(m):
    """One graph of (late producer of h -> quant -> overlap -> quant -> overlap), replayed with new inputs: both
    layers equal the one-launch chain on the producer's h (the side stream's router waits for the producer; the second
    layer's shared launch may start while the first layer's routed launch finishes and must not disturb it)."""
    from glm5_fastpath.ops.act_quant import act_quant_fp8
    from glm5_fastpath.testing.pdl import late_producer, produce

    gate, bias, wt = _setup(256)
    cfg = MM.default_config(m, 256, 8, 1)
    OV.precompile(wt, 8, [cfg], m)
    producer = late_producer()
    src = _h(m, 7)
    static_h = torch.empty_like(src)
    _overlap(src, gate, bias, wt, cfg)  # compile, load outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, src, static_h)
        x8, xs = act_quant_fp8(static_h)
        first = OV.routed_mega_moe_overlap(static_h, x8, xs, gate, bias, GLM5, wt, config=cfg)
        x8b, xsb = act_quant_fp8(static_h)
        second = OV.routed_mega_moe_overlap(static_h, x8b, xsb, gate, bias, GLM5, wt, config=cfg)
    for step in range(6):
        src.copy_(_h(m, 300 + step))
        static_h.fill_(7.0)
        for t in (*first, *second):
            t.fill_(-1) if t.dtype == torch.int32 else t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = _one_launch(src.clone(), gate, bias, wt, cfg)
        torch.cuda.synchronize()
        _check(first, want, f"replay {step} first")
        _check(second, want, f"replay {step} second")
    _at_rest(wt)
