"""GLM5_FASTPATH_MOE_WARM_CODE=1: the router's decode kernel and MegaMoE's plan kernel run their post-wait code once,
dry, before their PDL wait (router_kernels.cuh / megamoe.cuh GLM5_WARM_CODE). The dry pass stores nothing, so every
output must be bit for bit the default build's, launch after launch, also under PDL behind a late producer and in
CUDA-graph replays; the builds are separate cubins (the default's key and SASS are unchanged).

A whole-file run with the variable set (GLM5_FASTPATH_MOE_WARM_CODE=1 pytest -m gpu tests/ops/test_moe_router.py
tests/moe/test_megamoe.py) runs every router / MegaMoE GPU test on the warm builds as well."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.moe import megamoe as M
from glm5_fastpath.ops import moe_router as R
from glm5_fastpath.testing.numerics import assert_equal

ENV = "GLM5_FASTPATH_MOE_WARM_CODE"
WARM = ("GLM5_WARM_CODE", "1")
GLM5 = Glm5Config.preset("glm5")


# ---- CPU: which builds carry the define ---------------------------------------------------------------------

def test_router_spec_carries_the_define_only_when_asked(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert WARM not in R.config_for(6144, 256, 8).spec.defines
    monkeypatch.setenv(ENV, "1")
    warm = R.config_for(6144, 256, 8)
    assert WARM in warm.spec.defines and WARM in warm.phase_spec.defines


def test_megamoe_spec_carries_the_define_only_when_asked_and_never_for_ep(monkeypatch):
    cfg = M.MegaMoEConfig.from_name("bn8_s6_g512_w4_lf")
    monkeypatch.delenv(ENV, raising=False)
    base = cfg.spec(6144, 2048)
    assert WARM not in base.defines
    monkeypatch.setenv(ENV, "1")
    assert WARM in cfg.spec(6144, 2048).defines and cfg.spec(6144, 2048) != base
    pool = M.MegaMoEConfig.from_name("bn8_s6_g512_w4_lf_p")
    assert WARM not in pool.spec(6144, 2048, ep=True).defines  # the EP plan gathers across ranks: no dry run


def test_warm_builds_compile_without_spills(nvcc_jit, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    specs = [R.config_for(6144, 256, 8).spec, M.MegaMoEConfig.from_name("bn8_s6_g512_w4_lf").spec(6144, 2048),
             M.MegaMoEConfig.from_name("bn16_s6_g512_w4_lf").spec(6144, 2048)]
    for spec in specs:
        assert WARM in spec.defines
        for fn, res in nvcc_jit(spec).resources().items():
            assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0, (spec.describe(), fn, res)


# ---- GPU -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def glm5_router():
    from glm5_fastpath.weights import random_layer
    mlp = random_layer(GLM5, 3, 4321, device="cuda").mlp
    return mlp.gate.contiguous(), mlp.e_score_correction_bias.contiguous()


def _h(m, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, GLM5.hidden_size, generator=g) * 0.5).to(torch.bfloat16).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("m, decode", [(1, True), (2, True), (4, True), (16, True), (1, False), (8, False),
                                       (33, False), (64, False)])
def test_gpu_warm_router_equals_the_default_build(m, decode, seed, glm5_router, monkeypatch, no_pdl_override):
    """Both router kernels (decode: one arrival level; split-K: two, several token tiles from 33 tokens)."""
    gate, bias = glm5_router
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(R, "_kernels", {})
    hs = [_h(m, seed + i) for i in range(4)]
    want = [R.moe_route_scaled(h, gate, bias, GLM5, decode=decode) for h in hs]
    torch.cuda.synchronize()
    assert R._kernels and not any(WARM in k.module.compiled.spec.defines for k in R._kernels.values())
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(R, "_kernels", {})  # the next launch loads the warm build
    for rep in range(5):
        for i, h in enumerate(hs):
            got = R.moe_route_scaled(h, gate, bias, GLM5, decode=decode)
            torch.cuda.synchronize()
            for a, b, name in zip(got, want[i], ("ids", "weights", "logits", "scaled")):
                assert_equal("moe_route (warm build)", a, b, context=f"{name} {m=} {decode=} input {i} rep {rep}")
    assert R._kernels and all(WARM in k.module.compiled.spec.defines for k in R._kernels.values()), "not the warm build"


@pytest.mark.gpu
def test_gpu_warm_decode_router_behind_a_late_producer(seed, glm5_router, monkeypatch, no_pdl_override):
    """The dry pass runs before griddepcontrol.wait: it must leave the outputs to the real pass, which reads h only
    after the producer's write."""
    from glm5_fastpath.testing.pdl import late_producer, produce

    gate, bias = glm5_router
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(R, "_kernels", {})
    h_true = _h(1, seed)
    want = R.moe_route_scaled(h_true, gate, bias, GLM5, decode=True)
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(R, "_kernels", {})
    producer = late_producer()
    h = torch.full_like(h_true, 7.0)
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        got = R.moe_route_scaled(h, gate, bias, GLM5, pdl=True, decode=True)
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            assert_equal("moe_route (warm build, late producer)", a, b)
    assert all(WARM in k.module.compiled.spec.defines for k in R._kernels.values()), "not the warm build"


def _moe_inputs(m, e, seed, pad_rows=()):
    from glm5_fastpath.ref.fp8 import quant_act_per_token

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, 6144, generator=g).to(torch.bfloat16).cuda()
    x8, xs = quant_act_per_token(h)
    ids = torch.stack([torch.randperm(e, generator=g)[:8] for _ in range(m)]).to(torch.int32)
    for r in pad_rows:
        ids[r] = -1  # SGLang's CUDA-graph padding rows: no pairs, a zero output row
    w = torch.rand(m, 8, generator=g) + 0.05
    return x8, xs, ids.cuda(), (w / w.sum(-1, keepdim=True)).float().cuda()


@pytest.fixture(scope="module")
def experts_256():
    import test_megamoe as TM  # the MegaMoE tests' GLM-5-sized experts (built once per process)

    return TM._weights(256)[1]


@pytest.mark.gpu
@pytest.mark.parametrize("m, pad", [(1, ()), (3, (1,)), (8, ()), (16, (0, 15))])
def test_gpu_warm_plan_equals_the_default_build_over_many_launches(m, pad, experts_256, monkeypatch):
    wt = experts_256
    cfg = M.default_config(m, 256, 8, 1)
    monkeypatch.delenv(ENV, raising=False)
    ins = [_moe_inputs(m, 256, 100 * m + i, pad) for i in range(3)]
    want = [M.mega_moe(*x, wt, config=cfg) for x in ins]
    torch.cuda.synchronize()
    monkeypatch.setenv(ENV, "1")
    assert WARM in cfg.spec(6144, 2048).defines
    for rep in range(10):
        for i, x in enumerate(ins):
            got = M.mega_moe(*x, wt, config=cfg)
            torch.cuda.synchronize()
            assert_equal("mega_moe (warm plan build)", got, want[i], context=f"{m=} {pad=} input {i} rep {rep}")
    assert any(WARM in spec.defines for spec, _ in M._kernels), "the warm plan build never loaded"


@pytest.mark.gpu
def test_gpu_warm_plan_cuda_graph_replay(experts_256, monkeypatch):
    wt = experts_256
    m = 4
    cfg = M.default_config(m, 256, 8, 1)
    monkeypatch.delenv(ENV, raising=False)
    x8, xs, ids, wts = _moe_inputs(m, 256, 7)
    new = [_moe_inputs(m, 256, 70 + i) for i in range(3)]
    want = [M.mega_moe(*x, wt, config=cfg).clone() for x in new]
    monkeypatch.setenv(ENV, "1")
    M.mega_moe(x8, xs, ids, wts, wt, config=cfg)  # load the warm build outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = M.mega_moe(x8, xs, ids, wts, wt, config=cfg)
    for i, x in enumerate(new):
        for dst, src in zip((x8, xs, ids, wts), x):
            dst.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert_equal("mega_moe (warm plan build, graph replay)", out, want[i], context=f"replay {i}")
