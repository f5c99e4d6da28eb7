"""ops.fp8_gemm_chain (two dependent GEMMs in one persistent launch): host checks on CPU; bitwise equality with two
forced-config launches, repeated launches and graph replays (the self-resetting chain counter) on an H200."""
import dataclasses

import pytest
import torch

from glm5_fastpath.ops import fp8_gemm as F
from glm5_fastpath.ops import fp8_gemm_chain as C

FP8 = torch.float8_e4m3fn


def test_spec_and_config_checks():
    assert dict(C.chain_spec(16, 6).defines) == {"GLM5_SKINNY_TM": "16", "GLM5_SKINNY_STAGES": "6"}
    with pytest.raises(C.GemmChainInputError, match="token block"):
        C.chain_spec(12, 6)
    with pytest.raises(C.GemmChainInputError, match="stages"):
        C.chain_spec(16, 1)
    meta = dict(device="meta")
    lin = type("L", (), {"weight": torch.empty(2624, 6144, dtype=FP8, **meta), "scale_inv": torch.empty(21, 48, **meta)})
    g = C.ChainGemm(torch.empty(16, 6144, dtype=FP8, **meta), torch.empty(16, 48, **meta), lin, splits=4)
    c = C._config(g, 16, 6, "A")
    assert (c.units, c.gmax, c.wkb) == (84, 12, 0)
    with pytest.raises(C.GemmChainInputError, match="splits=49"):
        C._config(dataclasses.replace(g, splits=49), 16, 6, "A")
    b = C._config(C.ChainGemm(torch.empty(16, 2048, dtype=FP8, **meta), torch.empty(16, 16, **meta),
                              type("L", (), {"weight": torch.empty(16, 4096, 128, dtype=FP8, **meta),
                                             "scale_inv": torch.empty(32, 16, **meta)}), 2), 16, 6, "B")
    assert (b.n, b.k, b.units, b.wkb) == (4096, 2048, 64, 1)
    assert C.chain_units(c, b) == 148 and C.smem_bytes(c, b) == F.wgmma_smem_bytes(16, 6, 12)
    assert {s.source for s in C.compile_check_specs()} == {C.SOURCE}
    assert dict(C.chain_spec(16, 6, tile=True).defines)["GLM5_CHAIN_TILE"] == "1"
    C.check_dep("tile", c, b)  # B's 16 k blocks <= A's 21 tiles
    with pytest.raises(C.GemmChainInputError, match="expected one of"):
        C.check_dep("wave", c, b)
    with pytest.raises(C.GemmChainInputError, match="must be <= A's n tiles"):
        C.check_dep("tile", b, c)  # A with 32 tiles feeding B with K / 128 = 48
    assert dict(C.chain_spec(8, 6, wkb=True, phases=True).defines)["GLM5_CHAIN_PHASES"] == "1"


def test_bench_markdown():
    from glm5_fastpath.bench import gemm_chain as GC

    rep = {"device": "NVIDIA H200", "date": "2026-11-30", "commit": "abc", "copy_tbs": 4.16, "rows": [
        {"pair": "qkv_a>index_q", "M": 16, "mb": 24.9, "floor_us": 6.0, "a_us": 9.0, "b_us": 7.0, "separate_us": 16.0,
         "separate_pdl_us": 14.0, "chains": [{"cfg": "tm16 st6 s4/s2", "us": 10.0, "bitwise": True},
                                             {"cfg": "tm16 st6 s6/s4", "skipped": "smem"}]}]}
    md = GC.render_markdown(rep)
    assert "| qkv_a>index_q | 16 | 24.9 | 6.00 | 9.00 | 7.00 | 16.00 | 14.00 | 10.00 | tm16 st6 s4/s2 | 1.40 | 1.67 | yes |" in md
    ph = GC.summarize_phases([[1000, 3000, 4000, 6000, 7000, 9000, 5000, 3], [1500, 0, 0, 6500, 7500, 9500, 5500, 4],
                              [0] * 8])
    assert ph["ctas"] == 2 and ph["a_loop_done"] == (2.0, 2.0) and ph["last_unit_done"] == (8.25, 8.5)
    rep["rows"][0]["chains"][0]["phases"] = ph
    assert "| qkv_a>index_q | 16 | tm16 st6 s4/s2 | 2.00 / 2.00 | 3.00 / 3.00 |" in GC.render_markdown(rep)
    assert GC.chain_configs(16)[0][0] == 16 and GC.chain_configs(1)[0][0] == 8
    assert {c[5] for c in GC.chain_configs(16)} == set(C.DEPS)


def _pair(m, dev, seed, kb=False):
    from glm5_fastpath.bench.gemm_inputs import random_fp8_act, random_fp8_linear
    g = torch.Generator(device=dev).manual_seed(seed)

    def lin(n, k):
        r = random_fp8_linear(n, k, g, dev)
        return dataclasses.replace(r, weight=F.kblock_major(r.weight)) if kb else r
    return lin(2624, 6144), random_fp8_act(m, 6144, g, dev), lin(4096, 2048), random_fp8_act(m, 2048, g, dev)


@pytest.mark.gpu
@pytest.mark.parametrize("m,tm,sa,sb,kb,dep", [(1, 8, 4, 2, False, "grid"), (3, 8, 6, 4, False, "grid"),
                                               (16, 16, 4, 2, False, "grid"), (16, 16, 4, 1, True, "grid"),
                                               (31, 32, 3, 2, False, "grid"), (1, 8, 12, 4, False, "tile"),
                                               (16, 16, 12, 2, False, "tile"), (40, 32, 6, 4, True, "tile")])
def test_chain_equals_two_launches_and_replays(m, tm, sa, sb, kb, dep):
    la, xa, lb, xb = _pair(m, "cuda", 7 + m, kb)
    a, b = C.ChainGemm(*xa, la, sa), C.ChainGemm(*xb, lb, sb)
    ya = torch.full((m, 2624), float("nan"), dtype=torch.bfloat16, device="cuda")
    with F.forced_config(tm, sa, 6, impl="wgmma"):
        ra = F.fp8_gemm_skinny(*xa, la, pdl=False)
    with F.forced_config(tm, sb, 6, impl="wgmma"):
        rb = F.fp8_gemm_skinny(*xb, lb, pdl=False)
    for _ in range(5):  # the chain counters reset themselves: every launch must see a fresh dependency
        ya, yb = C.gemm_chain(a, b, tm=tm, stages=6, dep=dep)
        torch.cuda.synchronize()
        assert torch.equal(ya.view(torch.int16), ra.view(torch.int16))
        assert torch.equal(yb.view(torch.int16), rb.view(torch.int16))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ga, gb = C.gemm_chain(a, b, tm=tm, stages=6, ctas=64, dep=dep)
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ga.view(torch.int16), ra.view(torch.int16)) and torch.equal(gb.view(torch.int16), rb.view(torch.int16))
    assert int(C._chain_counter(torch.device("cuda")).abs().sum()) == 0
