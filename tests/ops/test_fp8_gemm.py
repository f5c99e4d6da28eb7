"""Skinny FP8 GEMM family (glm5_fastpath.ops.fp8_gemm) against glm5_fastpath.ref.

CPU tests (top): the config heuristic and the impl choice (tuned table / GLM5_FASTPATH_FP8_GEMM_IMPL /
default), the kernel ABI size, the shared-memory formulas against the headers, input validation and
the fake implementations. GPU tests (marked gpu), each with BOTH mainloops (impl "mma" and "wgmma",
forced through GLM5_FASTPATH_FP8_GEMM_IMPL): every op against the reference with the same FP8
inputs at the GLM-5 dims and M in {1, 2, 3, 8, 16, 31, 64, 128, 256}, into outputs allocated from
a poisoned allocator pool; split-K determinism; the index-K cache changes only at the target slots;
PDL with a late producer; CUDA-graph capture + replay with changing inputs; the small preset;
wgmma pipeline corner cases (ring wrap-around, one K group per split, stages > K groups, two
token blocks of 128); error cases.

Bars: GEMM outputs and everything rounded to bf16 -> kind "bf16" (the kernel sums in another
order than torch, so a rare bf16 rounding flips); FP8 outputs are compared dequantized against the
reference's dequantized FP8 with kind "fp8_same_quant" (a flipped bf16 / fp32 input may move one
e4m3 ulp); the untouched cache bytes must be bitwise equal.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops._device import weights_hint_defines
from glm5_fastpath.ref import fp8 as rfp8
from glm5_fastpath.ref import prefix as ref
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

F = importlib.import_module("glm5_fastpath.ops.fp8_gemm")
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]
GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")


# ---- CPU: heuristic ---------------------------------------------------------------------------------

def _shapes(cfg):
    return [(F.EPI_QKV_A, cfg.qkv_a_out, cfg.hidden_size), (F.EPI_Q_B, cfg.num_attention_heads * cfg.qk_head_dim, cfg.q_lora_rank),
            (F.EPI_IDX_Q, cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank), (F.EPI_IDX_K, cfg.index_head_dim, cfg.hidden_size),
            (F.EPI_PLAIN, cfg.qkv_a_out, cfg.hidden_size), (F.EPI_PLAIN, 128, cfg.hidden_size)]


@pytest.mark.parametrize("impl", [None, "mma", "wgmma"])
@pytest.mark.parametrize("cfg", [GLM5, SMALL], ids=["glm5", "small"])
def test_config_valid_for_every_m(cfg, impl):
    for epi, n, k in _shapes(cfg):
        pf, ci = F._max_workspace(n, k, epi, 132)
        for m in range(1, 257):
            c = F.config_for(m, n, k, epi, impl=impl)
            ctx = f"{epi=} {m=} {n=} {k=} {impl=} -> {c}"
            assert c.impl in F.IMPLS and (impl is None or c.impl == impl), ctx
            assert c.tm in F.token_blocks(c.impl, epi) and c.tiles_m * c.tm >= m, ctx
            assert 1 <= c.splits <= k // 128 and c.gmax * c.splits >= k // 128, ctx
            assert c.smem_bytes <= F.SMEM_LIMIT, ctx
            assert c.partial_floats * 4 <= F.WORKSPACE_CAP_BYTES, ctx
            if c.impl == "mma":
                assert 3 <= c.stages <= F.STAGES[c.tm], ctx
            else:
                assert 2 <= c.stages <= F.WGMMA_STAGES[c.tm], ctx
            assert c.partial_floats <= pf and c.counter_ints <= ci, ctx


def test_config_choices_glm5_decode():
    """On 132 SMs the measured table decides (tests the lookup, not the numbers); elsewhere the heuristic."""
    import json

    table = json.loads(F.TUNED_TABLE.read_text())
    assert table["num_sms"] == 132 and table["entries"]
    for e in table["entries"]:
        epi = {v: k for k, v in F.EPI_NAMES.items()}[e["epi"]]
        for m in (e["m_max"], max(1, e["m_max"] // 2)):
            smaller = [x["m_max"] for x in table["entries"] if (x["epi"], x["n"], x["k"]) == (e["epi"], e["n"], e["k"])
                       and x["m_max"] >= m]
            if min(smaller) != e["m_max"]:
                continue  # m falls into a smaller bucket
            c = F.config_for(m, e["n"], e["k"], epi)
            assert (c.impl, c.tm, c.splits, c.stages, c.minb) == (e.get("impl", "mma"), e["tm"], e["splits"], e["stages"],
                                                                  e.get("minb", 1)), (e, m)
    # past the table's largest bucket, and on another SM count, the cost-model heuristic picks:
    # wgmma on sm_90 by default, mma when asked for (or on a GPU without wgmma)
    qkv = F.config_for(200, 2624, 6144, F.EPI_QKV_A, impl="mma")
    assert qkv.stages == F.STAGES[qkv.tm] and qkv.impl == "mma"
    other = F.config_for(16, 2624, 6144, F.EPI_QKV_A, num_sms=114, impl="mma")
    assert other.stages == F.STAGES[other.tm] and other.tm == 16, other.describe()
    one = F.config_for(1, 2624, 6144, F.EPI_PLAIN, num_sms=114, impl="mma")
    assert one.tm == 8, one.describe()
    wg = F.config_for(200, 2624, 6144, F.EPI_QKV_A, num_sms=114)
    assert wg.impl == "wgmma" and wg.tm == 128 and wg.tiles_m == 2, wg.describe()
    assert F.config_for(16, 2624, 6144, F.EPI_PLAIN, num_sms=114).tm == 16
    assert F.config_for(1, 2624, 6144, F.EPI_PLAIN, num_sms=114).tm == 8
    assert F.config_for(16, 2624, 6144, F.EPI_PLAIN, num_sms=114, cc=(10, 0)).impl == "mma"


def test_print_configs(monkeypatch, capsys):
    monkeypatch.setenv("GLM5_FASTPATH_PRINT_CONFIGS", "1")
    from glm5_fastpath.jit import env
    c = F.config_for(5, 2624, 6144, F.EPI_PLAIN)
    env.print_config("fp8_gemm_skinny", {"M": 5, "N": 2624, "K": 6144, "test": id(c)}, c.describe())
    assert "tm=" in capsys.readouterr().err


def test_params_abi_size():
    assert F.PARAMS_BYTES == 232 and ctypes.sizeof(F._Params) % 8 == 0


def test_smem_formula_matches_header():
    c = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 6, 6)
    assert c.gmax == 8
    assert c.smem_bytes == 6 * 16384 + 6 * 16 * 128 + 3 * 8 * 16 * 4 + 16 + 32 + 8 * 16 * 4
    w = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 6, 10, impl="wgmma")
    assert w.threads == 288 and c.threads == 256
    assert w.smem_bytes == 10 * (16384 + 16 * 128) + 16 * 10 + 3 * 8 * 16 * 4 + 16 + 32 + 8 * 16 * 4 + 1024


_SMEM_CHECK = r"""
#include "attn_pre/fp8_gemm_wgmma.cuh"
using namespace glm5::attn_pre::skinny;
%s
extern "C" __global__ void smem_formula_check() {}
"""


def test_smem_formulas_compile_against_the_headers(nvcc_jit):
    """static_asserts of SkinnySmem / WgmmaSmem sizes against the Python formulas (nvcc, no GPU)."""
    from glm5_fastpath.jit import KernelSpec
    lines = []
    for tm, st, g in ((8, 6, 48), (16, 3, 8), (64, 4, 16), (32, 5, 1)):
        c = F.SkinnyConfig(F.EPI_PLAIN, 1, 128, g * 128, tm, 1, st)
        lines.append(f"static_assert(SkinnySmem<{tm}, {st}>::bytes({g}) == {c.smem_bytes}, \"mma {tm} {st} {g}\");")
    for tm, st, g in ((8, 10, 48), (16, 12, 8), (32, 8, 16), (64, 6, 3), (128, 5, 48), (128, 2, 1)):
        c = F.SkinnyConfig(F.EPI_PLAIN, 1, 128, g * 128, tm, 1, st, impl="wgmma")
        lines.append(f"static_assert(WgmmaSmem<{tm}, {st}>::launch_bytes({g}) == {c.smem_bytes}, \"wgmma {tm} {st} {g}\");")
    spec = KernelSpec("fp8_gemm_smem_check", code=_SMEM_CHECK % "\n".join(lines), functions=("smem_formula_check",))
    assert nvcc_jit(spec).cubin


def test_wgmma_stages_fit():
    for tm in F.WGMMA_TOKEN_BLOCKS:
        for g in (1, 8, 16, 48, 64, 128):
            st = F.wgmma_stages(tm, g)
            assert 2 <= st <= F.WGMMA_STAGES[tm]
            assert F.wgmma_smem_bytes(tm, st, g) <= F.SMEM_LIMIT or st == 2, (tm, g, st)
    assert F.wgmma_stages(16, 8) == F.WGMMA_STAGES[16]


# ---- CPU: validation + fake -------------------------------------------------------------------------

def _cpu_gemm_inputs(m=4, n=256, k=512):
    x8 = torch.zeros(m, k, dtype=FP8)
    xs = torch.ones(m, k // 128)
    w = torch.zeros(n, k, dtype=FP8)
    ws = torch.ones(-(-n // 128), k // 128)
    return x8, xs, w, ws


@pytest.mark.parametrize("mutate, match", [
    (lambda x8, xs, w, ws: (x8.float(), xs, w, ws), "x_fp8 must be float8_e4m3fn"),
    (lambda x8, xs, w, ws: (x8, xs[:, :2].contiguous(), w, ws), "x_scale must have shape"),
    (lambda x8, xs, w, ws: (x8, xs, w[:, :384].contiguous(), ws), "weight must have shape"),
    (lambda x8, xs, w, ws: (x8, xs, w, ws[:1]), "scale_inv must have shape"),
    (lambda x8, xs, w, ws: (torch.zeros(300, 512, dtype=FP8), torch.ones(300, 4), w, ws), "exceeds the decode limit"),
    (lambda x8, xs, w, ws: (x8, xs.t().contiguous().t(), w, ws), "must be contiguous"),
    (lambda x8, xs, w, ws: (x8, xs, w, ws), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(mutate, match):
    x8, xs, w, ws = mutate(*_cpu_gemm_inputs())
    with pytest.raises(ValueError, match=match) as ei:
        F.fp8_gemm_skinny(x8, xs, rfp8_linear(w, ws))
    assert "glm5_fastpath.fp8_gemm_skinny" in str(ei.value)


def rfp8_linear(w, ws):
    from glm5_fastpath.weights import Fp8Linear
    return Fp8Linear(w, ws)


def test_config_rejects_bad_problem():
    with pytest.raises(ValueError, match="M=0"):
        F.config_for(0, 128, 128)
    with pytest.raises(ValueError, match="K=100"):
        F.config_for(1, 128, 100)
    with pytest.raises(ValueError, match="N=7"):
        F.config_for(1, 7, 128)


def test_b1_rejects_bf16_gemm_and_missing_indexer():
    x8, xs, _, _ = _cpu_gemm_inputs(k=512)
    pos = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="only gemm='fp8'"):
        F.b1_indexer_k(None, x8, xs, object(), pos, pos, torch.zeros(1, 64 * 68, dtype=torch.uint8), SMALL, gemm="bf16")
    with pytest.raises(ValueError, match="no indexer"):
        F.b1_indexer_k(None, x8, xs, None, pos, pos, torch.zeros(1, 64 * 68, dtype=torch.uint8), SMALL)
    with pytest.raises(ValueError, match="no indexer"):
        F.d1_indexer_q(x8, xs, torch.zeros(4, 4, dtype=BF16), None, pos, SMALL)


def test_tuning_knobs_default_to_the_production_kernel():
    c = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 6, 6)
    assert (c.minb, c.diag, c.impl) == (1, 0, "mma")
    w = F.SkinnyConfig(F.EPI_QKV_A, 16, 2624, 6144, 128, 6, 5, impl="wgmma").spec()
    assert (w.name, w.source) == (F.WGMMA_FUNCTION, F.WGMMA_SOURCE)
    hint = weights_hint_defines(16)  # evict-first weights at M <= 16 (GLM5_FASTPATH_W_EVICT_FIRST=auto)
    assert dict(w.defines) == {"GLM5_SKINNY_TM": "128", "GLM5_SKINNY_STAGES": "5", "GLM5_SKINNY_EPI": "1", **dict(hint)}
    with pytest.raises(ValueError, match="impl="):
        F.kernel_spec(16, 4, 0, impl="tma")
    assert c.spec() == F.kernel_spec(16, 6, F.EPI_PLAIN, hints=hint)  # no MINB / DIAG defines: cache keys unchanged
    assert {k for k, _ in c.spec().defines} == {"GLM5_SKINNY_TM", "GLM5_SKINNY_STAGES", "GLM5_SKINNY_EPI"} | set(dict(hint))
    d = dict(F.kernel_spec(8, 4, F.EPI_PLAIN, 2, F.DIAG_LOADS_ONLY).defines)
    assert d["GLM5_SKINNY_MINB"] == "2" and d["GLM5_SKINNY_DIAG"] == "1"


def test_grid_cap_hook():
    """grid_cap(N) (the CMP cap:OP=N modes): a config with more than N units becomes a persistent launch on N
    CTAs; smaller grids stay as they are; configs without a persistent launch raise, naming the op."""
    c = F.SkinnyConfig(F.EPI_Q_B, 16, 16384, 2048, 16, 1, 8, impl="wgmma")
    assert F._apply_launch_overrides(F.EPI_Q_B, c) is c  # no cap set
    with F.grid_cap(64):
        p = F._apply_launch_overrides(F.EPI_Q_B, c)
        assert (p.persist, p.ctas, p.grid, p.units) == (64, 64, (64, 1, 1), 128)
        assert dict(p.spec().defines)["GLM5_SKINNY_PERSIST"] == "1"
        with F.grid_cap(200):  # nests, restores; a grid already within the cap is unchanged
            assert F._apply_launch_overrides(F.EPI_Q_B, c) is c
        assert F._apply_launch_overrides(F.EPI_Q_B, c).persist == 64
        g = F.SkinnyConfig(F.EPI_QKV_A, 16, 2624, 6144, 16, 4, 6, impl="wgmma")  # global split-K reduce: fine
        assert F._apply_launch_overrides(F.EPI_QKV_A, g).persist == 64
        for bad in (dataclasses.replace(g, reduce="cluster"), F.SkinnyConfig(F.EPI_Q_B, 16, 16384, 2048, 16, 1, 6)):
            with pytest.raises(F.Fp8GemmInputError, match="grid_cap"):
                F._apply_launch_overrides(F.EPI_Q_B, bad)
    assert F._apply_launch_overrides(F.EPI_Q_B, c) is c
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError, match="grid_cap"):
            F.grid_cap(bad)


def test_stage_cap_hook():
    """stage_cap(N) (the CMP stages:OP=N modes): fewer ring stages, less shared memory, same work split."""
    c = F.SkinnyConfig(F.EPI_Q_B, 16, 16384, 2048, 16, 1, 8, impl="wgmma")
    with F.stage_cap(4):
        p = F._apply_launch_overrides(F.EPI_Q_B, c)
        assert (p.stages, p.tm, p.splits, p.grid) == (4, 16, 1, c.grid) and p.smem_bytes < c.smem_bytes
        assert dict(p.spec().defines)["GLM5_SKINNY_STAGES"] == "4"
        small = dataclasses.replace(c, stages=3)
        assert F._apply_launch_overrides(F.EPI_Q_B, small) is small  # already within the cap
        with F.grid_cap(64):  # both: fewer stages and a persistent launch
            q = F._apply_launch_overrides(F.EPI_Q_B, c)
            assert (q.stages, q.persist) == (4, 64)
    assert F._apply_launch_overrides(F.EPI_Q_B, c) is c
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match="stage_cap"):
            F.stage_cap(bad)


def test_phase_build_hook_and_spec():
    """phase_build() (bench gemm-phases): wgmma configs get the GLM5_SKINNY_PHASES build; nothing else changes."""
    c = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 4, 6, impl="wgmma", reduce="cluster")
    assert "GLM5_SKINNY_PHASES" not in dict(c.spec().defines)
    with F.phase_build():
        p = F._apply_launch_overrides(F.EPI_PLAIN, c)
        assert p.phases == 1 and dataclasses.replace(p, phases=0) == c
        assert dict(p.spec().defines)["GLM5_SKINNY_PHASES"] == "1"
        mma = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 4, 6)
        assert F._apply_launch_overrides(F.EPI_PLAIN, mma) is mma  # the mma.sync mainloop has no marks
    assert F._apply_launch_overrides(F.EPI_PLAIN, c) is c
    with pytest.raises(ValueError, match="phase marks"):
        F.kernel_spec(16, 4, F.EPI_PLAIN, impl="mma", phases=True)
    with pytest.raises(ValueError, match="phase marks"):
        F.kernel_spec(16, 4, F.EPI_PLAIN, impl="wgmma", persist=True, phases=True)
    assert F.PHASE_NAMES[0] == "entry" and len(F.PHASE_NAMES) == 6


def test_kblock_major_layout_plumbing():
    """k-block-major weights ([K/128, N, 128], kblock_major): a pure permutation of the row-major bytes; the ops
    accept the 3-D weight (N from weight_rows), its config gets the GLM5_SKINNY_WKB build, mma.sync refuses it."""
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-100, 100, (300, 384), generator=g).to(torch.int8).view(FP8)
    kb = F.kblock_major(w)
    assert tuple(kb.shape) == (3, 300, 128) and kb.is_contiguous() and F.weight_rows(kb) == 300 == F.weight_rows(w)
    for n in (0, 7, 299):
        for j in range(3):
            assert torch.equal(kb[j, n].view(torch.int8), w[n, j * 128:(j + 1) * 128].view(torch.int8))
    with pytest.raises(F.Fp8GemmInputError, match="multiple of 128"):
        F.kblock_major(w[:, :200])
    c = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 4, 6, impl="wgmma", reduce="cluster")
    assert "GLM5_SKINNY_WKB" not in dict(c.spec().defines)
    k3 = F._with_layout(F.EPI_PLAIN, c, torch.empty(48, 2624, 128, dtype=FP8, device="meta"))
    assert k3.wkb == 1 and dict(k3.spec().defines)["GLM5_SKINNY_WKB"] == "1" and k3.describe()["wkb"] == 1
    assert F._with_layout(F.EPI_PLAIN, c, torch.empty(2624, 6144, dtype=FP8, device="meta")) is c
    with pytest.raises(F.Fp8GemmInputError, match="k-block-major weight needs the wgmma"):
        F._with_layout(F.EPI_QKV_A, dataclasses.replace(c, impl="mma", reduce="global"),
                       torch.empty(48, 2624, 128, dtype=FP8, device="meta"))
    with pytest.raises(ValueError, match="wgmma mainloop only"):
        F.kernel_spec(16, 4, F.EPI_PLAIN, impl="mma", wkb=True)
    # the fake implementations see N through weight_rows
    x8 = torch.empty(5, 6144, dtype=FP8, device="meta")
    xs = torch.empty(5, 48, device="meta")
    y = torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, torch.empty(48, 2624, 128, dtype=FP8, device="meta"),
                                                torch.empty(21, 48, device="meta"), True)
    assert tuple(y.shape) == (5, 2624)
    with pytest.raises(F.Fp8GemmInputError, match="k-block-major"):  # K / 128 must match x's K
        torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, torch.empty(47, 2624, 128, dtype=FP8, device="meta"),
                                                torch.empty(21, 48, device="meta"), True)
    assert any(dict(sp.defines).get("GLM5_SKINNY_WKB") == "1" for sp in F.compile_check_specs())


def test_forced_config_hook():
    assert F._forced_config_for(16, 2624, 6144, F.EPI_PLAIN) is None
    with F.forced_config(32, 4, 3, minb=2, diag=F.DIAG_NO_REDUCE):
        c = F._forced_config_for(16, 2624, 6144, F.EPI_PLAIN)
        assert (c.tm, c.splits, c.stages, c.minb, c.diag, c.m) == (32, 4, 3, 2, 2, 16)
        with pytest.raises(ValueError, match="plain GEMM only"):
            F._forced_config_for(16, 2624, 6144, F.EPI_QKV_A)
        with F.forced_config(8, 1, 6):  # nests, restores
            assert F._forced_config_for(1, 128, 6144, F.EPI_IDX_K).tm == 8
        assert F._forced_config_for(1, 128, 6144, F.EPI_PLAIN).tm == 32
    assert F._forced_config_for(16, 2624, 6144, F.EPI_PLAIN) is None
    with F.forced_config(8, 17, 4), pytest.raises(ValueError, match="splits"):
        F._forced_config_for(1, 4096, 2048, F.EPI_PLAIN)
    with pytest.raises(ValueError):
        F.forced_config(12, 1, 4)
    with F.forced_config(128, 2, 4, impl="wgmma"):
        c = F._forced_config_for(200, 16384, 2048, F.EPI_Q_B)
        assert (c.impl, c.tm, c.stages, c.threads) == ("wgmma", 128, 4, 288)
        with pytest.raises(ValueError, match="token block 128"):
            F._forced_config_for(200, 128, 6144, F.EPI_IDX_K)
    with pytest.raises(ValueError):
        F.forced_config(128, 1, 4)  # mma has no 128-token block
    with pytest.raises(ValueError):
        F.forced_config(16, 1, 17, impl="wgmma")
    with pytest.raises(ValueError):
        F.forced_config(16, 1, 4, impl="tma")
    with F.forced_config(128, 1, 16, impl="wgmma"), pytest.raises(ValueError, match="shared memory"):
        F._forced_config_for(200, 16384, 2048, F.EPI_PLAIN)


def _table_file(tmp_path, entries):
    import json
    p = tmp_path / "table.json"
    p.write_text(json.dumps({"source": "test", "arch": "sm_90", "num_sms": 132, "entries": entries}))
    return p


@pytest.fixture
def fresh_configs(monkeypatch):
    """Config caches emptied before and after (a test swaps the tuned table)."""
    F._tuned_entries.cache_clear()
    monkeypatch.setattr(F, "_configs", {})
    yield
    F._tuned_entries.cache_clear()


def test_impl_selection_table_env_default(tmp_path, monkeypatch, fresh_configs):
    """Tuned table (old entries = mma, new ones name their impl) > default heuristic (wgmma on sm_90);
    an explicit impl filters the table; GLM5_FASTPATH_FP8_GEMM_IMPL is read per call and validated."""
    e = dict(epi="fp8_gemm_skinny", n=2624, k=6144)
    table = _table_file(tmp_path, [
        dict(e, m_max=1, tm=8, splits=12, stages=3),                              # old format: mma
        dict(e, m_max=16, tm=16, splits=6, stages=8, impl="wgmma"),
        dict(e, m_max=16, tm=16, splits=4, stages=4, impl="mma", minb=2),          # same bucket, other impl
        dict(e, m_max=64, tm=64, splits=6, stages=6, impl="wgmma"),
    ])
    monkeypatch.setattr(F, "TUNED_TABLE", table)
    c = F.config_for(1, 2624, 6144)
    assert (c.impl, c.tm, c.splits, c.stages, c.minb) == ("mma", 8, 12, 3, 1)
    c = F.config_for(9, 2624, 6144)
    assert (c.impl, c.tm, c.splits, c.stages) == ("wgmma", 16, 6, 8)       # first entry of the bucket
    c = F.config_for(9, 2624, 6144, impl="mma")
    assert (c.impl, c.tm, c.splits, c.stages, c.minb) == ("mma", 16, 4, 4, 2)
    c = F.config_for(1, 2624, 6144, impl="wgmma")
    assert (c.impl, c.tm, c.splits, c.stages) == ("wgmma", 16, 6, 8)       # smallest wgmma bucket >= 1
    c = F.config_for(40, 2624, 6144, impl="mma")                            # no mma entry >= 40: heuristic
    assert c.impl == "mma" and c.stages == F.STAGES[c.tm]
    c = F.config_for(100, 2624, 6144)                                       # past the table: default impl
    assert c.impl == "wgmma" and c.tm == 128
    assert F.config_for(9, 2624, 6144, cc=(10, 0)).impl == "mma"            # wgmma entries skipped off sm_90
    with pytest.raises(ValueError, match="sm_90"):
        F.config_for(9, 2624, 6144, impl="wgmma", cc=(10, 0))
    with pytest.raises(ValueError, match="impl="):
        F.config_for(9, 2624, 6144, impl="cutlass")
    assert F.default_impl((9, 0)) == "wgmma" and F.default_impl((10, 0)) == "mma"
    # the environment variable
    monkeypatch.delenv(F.IMPL_ENV, raising=False)
    assert F.env_impl() is None
    monkeypatch.setenv(F.IMPL_ENV, "WGMMA")
    assert F.env_impl() == "wgmma"
    monkeypatch.setenv(F.IMPL_ENV, "")
    assert F.env_impl() is None
    monkeypatch.setenv(F.IMPL_ENV, "tma")
    with pytest.raises(ValueError, match="GLM5_FASTPATH_FP8_GEMM_IMPL='tma'") as ei:
        F.env_impl(F.EPI_Q_B)
    assert "glm5_fastpath.d0_q_b" in str(ei.value)
    from glm5_fastpath.jit import env
    assert F.IMPL_ENV in env.VARS


def test_tuned_table_rejects_unknown_impl(tmp_path, monkeypatch, fresh_configs):
    monkeypatch.setattr(F, "TUNED_TABLE", _table_file(tmp_path, [dict(epi="fp8_gemm_skinny", n=128, k=6144, m_max=1,
                                                                      tm=8, splits=1, stages=3, impl="tcgen05")]))
    with pytest.raises(ValueError, match="tcgen05"):
        F.config_for(1, 128, 6144)


def test_shipped_table_entries_are_launchable():
    import json
    for e in json.loads(F.TUNED_TABLE.read_text())["entries"]:
        impl = e.get("impl", "mma")
        epi = {v: k for k, v in F.EPI_NAMES.items()}[e["epi"]]
        assert impl in F.IMPLS and e["tm"] in F.token_blocks(impl, epi), e
        c = F.SkinnyConfig(epi, e["m_max"], e["n"], e["k"], e["tm"], e["splits"], e["stages"], e.get("minb", 1), 0, impl)
        assert c.smem_bytes <= F.SMEM_LIMIT and c.splits <= e["k"] // 128, e


def test_compile_check_specs_cover_both_impls():
    specs = F.compile_check_specs()
    names = {s.name for s in specs}
    assert {F.FUNCTION, F.WGMMA_FUNCTION, F.ROW_FUNCTION} <= names
    wg = {(dict(s.defines)["GLM5_SKINNY_TM"], dict(s.defines)["GLM5_SKINNY_EPI"]) for s in specs if s.name == F.WGMMA_FUNCTION}
    for epi in F.EPI_NAMES:
        for tm in F.token_blocks("wgmma", epi):
            assert (str(tm), str(epi)) in wg
    assert ("128", str(F.EPI_IDX_K)) not in wg


def test_diag_variants_compile(nvcc_jit):
    """The sweep's diagnostic / minb=2 variants build for sm_90a (needs nvcc, not a GPU)."""
    specs = [F.kernel_spec(tm, F.STAGES[tm], F.EPI_PLAIN, 1, d) for d in (1, 2, 3) for tm in (8, 64)]
    specs += [F.kernel_spec(32, 4, F.EPI_PLAIN, 2, 0), F.kernel_spec(16, 3, F.EPI_QKV_A, 2, 0)]
    specs += [F.kernel_spec(tm, F.WGMMA_STAGES[tm], F.EPI_PLAIN, 1, d, "wgmma") for d in (1, 2, 3) for tm in (8, 128)]
    specs += [F.kernel_spec(16, 4, F.EPI_PLAIN, 2, 0, "wgmma")]
    for spec in specs:
        assert nvcc_jit(spec).cubin, spec.describe()


# ---- CPU: B0 mode selection (fused / split) --------------------------------------------------------------

def test_b0_mode_selection(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_B0_MODE", raising=False)
    assert F.B0_MODES == ("fused", "split") and F.B0_DEFAULT_MODE in F.B0_MODES
    assert F.b0_mode() == F.B0_DEFAULT_MODE
    monkeypatch.setattr(F, "B0_DEFAULT_MODE", "split")
    assert F.b0_mode() == "split"
    monkeypatch.setenv("GLM5_FASTPATH_B0_MODE", "Fused")  # read at call time, case-insensitive
    assert F.b0_mode() == "fused"
    monkeypatch.setenv("GLM5_FASTPATH_B0_MODE", "")  # empty = unset
    assert F.b0_mode() == "split"
    monkeypatch.setenv("GLM5_FASTPATH_B0_MODE", "split")
    assert F.b0_mode("fused") == "fused"  # an explicit mode wins over the variable
    monkeypatch.setenv("GLM5_FASTPATH_B0_MODE", "two_kernels")
    with pytest.raises(ValueError, match="GLM5_FASTPATH_B0_MODE='two_kernels'") as ei:
        F.b0_mode()
    assert "glm5_fastpath.b0_qkv_a" in str(ei.value)
    monkeypatch.delenv("GLM5_FASTPATH_B0_MODE")
    for bad in ("Split", "", 1):
        with pytest.raises(ValueError, match="mode=") as ei:
            F.b0_mode(bad)
        assert "glm5_fastpath.b0_qkv_a" in str(ei.value)


def _meta_b0_weights(c):
    from types import SimpleNamespace
    dev = "meta"
    lin = rfp8_linear(torch.empty(c.qkv_a_out, c.hidden_size, dtype=FP8, device=dev),
                      torch.empty(-(-c.qkv_a_out // 128), c.hidden_size // 128, device=dev))
    return SimpleNamespace(qkv_a=lin, q_a_norm=torch.empty(c.q_lora_rank, dtype=BF16, device=dev),
                           kv_a_norm=torch.empty(c.kv_lora_rank, dtype=BF16, device=dev))


@pytest.mark.parametrize("cfg", [GLM5, SMALL], ids=["glm5", "small"])
def test_b0_modes_fake_shapes_meta(cfg, monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_B0_MODE", raising=False)
    m, c = 5, cfg
    x8 = torch.empty(m, c.hidden_size, dtype=FP8, device="meta")
    xs = torch.empty(m, c.hidden_size // 128, device="meta")
    w = _meta_b0_weights(c)
    want = {"q_lora": ((m, c.q_lora_rank), BF16), "q_lora_fp8": ((m, c.q_lora_rank), FP8),
            "q_lora_scale": ((m, c.q_lora_rank // 128), torch.float32), "c_kv": ((m, c.kv_lora_rank), BF16),
            "k_pe": ((m, c.qk_rope_head_dim), BF16)}
    for mode in F.B0_MODES:
        out = F.b0_qkv_a(x8, xs, w, c, mode=mode)
        assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == want, mode
        assert out["q_lora_scale"].stride() == (c.q_lora_rank // 128, 1), mode  # row-major in both modes
    monkeypatch.setenv("GLM5_FASTPATH_B0_MODE", "bogus")
    with pytest.raises(ValueError, match="glm5_fastpath.b0_qkv_a: GLM5_FASTPATH_B0_MODE='bogus'"):
        F.b0_qkv_a(x8, xs, w, c)
    qkv = torch.empty(m, c.qkv_a_out, dtype=BF16, device="meta")
    outs = torch.ops.glm5_fastpath.b0_row_norms(qkv, w.q_a_norm, w.kv_a_norm, c.q_lora_rank, c.kv_lora_rank,
                                                c.qk_rope_head_dim, 1e-5, True)
    assert [tuple(o.shape) for o in outs] == [v[0] for v in want.values()]
    with pytest.raises(ValueError, match="qkv must have shape"):
        torch.ops.glm5_fastpath.b0_row_norms(qkv[:, 1:], w.q_a_norm, w.kv_a_norm, c.q_lora_rank, c.kv_lora_rank,
                                             c.qk_rope_head_dim, 1e-5, True)


def test_b0_row_kernel_specs():
    specs = {dict(s.defines)["GLM5_B0N_Q"]: s for s in F.compile_check_specs() if s.name == F.ROW_FUNCTION}
    assert set(specs) == {"2048", "256"}
    assert dict(specs["2048"].defines)["GLM5_B0N_THREADS"] == "256"
    assert dict(specs["256"].defines)["GLM5_B0N_THREADS"] == "32"
    with pytest.raises(ValueError, match="multiple of 8"):
        F._check_row_dims(256, 128, 36)


def test_dims_checks():
    with pytest.raises(ValueError, match="head_dim=96"):
        F._check_head_dims(F.EPI_IDX_Q, 96 * 4, 4, 96, 32)
    with pytest.raises(ValueError, match="q_lora_rank=200"):
        F._check_qkv_a_dims(200, 128, 32, 360)


def test_fake_shapes_meta():
    m, c = 5, GLM5
    dev = "meta"
    x8 = torch.empty(m, c.hidden_size, dtype=FP8, device=dev)
    xs = torch.empty(m, c.hidden_size // 128, device=dev)
    w = torch.empty(c.qkv_a_out, c.hidden_size, dtype=FP8, device=dev)
    ws = torch.empty(21, 48, device=dev)
    y = torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, w, ws, True)
    assert tuple(y.shape) == (m, c.qkv_a_out) and y.dtype == BF16
    outs = torch.ops.glm5_fastpath.fp8_qkv_a(x8, xs, w, ws, torch.empty(2048, dtype=BF16, device=dev),
                                             torch.empty(512, dtype=BF16, device=dev), 2048, 512, 64, 1e-5, True)
    assert [tuple(o.shape) for o in outs] == [(m, 2048), (m, 2048), (m, 16), (m, 512), (m, 64)]
    ql8 = torch.empty(m, 2048, dtype=FP8, device=dev)
    qls = torch.empty(m, 16, device=dev)
    pos = torch.empty(m, dtype=torch.int64, device=dev)
    tab = torch.empty(10, 32, 2, device=dev)
    qn, qp = torch.ops.glm5_fastpath.fp8_q_b_rope(ql8, qls, torch.empty(16384, 2048, dtype=FP8, device=dev),
                                                  torch.empty(128, 16, device=dev), pos, tab, 64, 192, 64, 1e6, True)
    assert tuple(qn.shape) == (m, 64, 192) and tuple(qp.shape) == (m, 64, 64)
    q8, s, hw = torch.ops.glm5_fastpath.fp8_indexer_q(ql8, qls, torch.empty(4096, 2048, dtype=FP8, device=dev),
                                                      torch.empty(32, 16, device=dev), torch.empty(m, 32, dtype=BF16, device=dev),
                                                      pos, tab, 32, 128, 64, 0.0156, 1e6, True)
    assert tuple(q8.shape) == (m, 32, 128) and tuple(s.shape) == (m, 32) and tuple(hw.shape) == (m, 32)


# ---- GPU fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layer():
    from glm5_fastpath.weights import random_layer
    return random_layer(GLM5, 3, 1234, device="cuda")


@pytest.fixture(scope="module")
def small_layer():
    from glm5_fastpath.weights import random_layer
    return random_layer(SMALL, 1, 99, device="cuda")


def poison_pool():
    """Fill freed blocks of torch's caching allocator (small and large pools) with 0xFF bytes (NaN in
    bf16 / fp32 / e4m3fn), so the op outputs allocated next start poisoned: an element the kernel
    never writes fails assert_no_poison."""
    bufs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in [256 << 10] * 16 + [16 << 20] * 4]
    for b in bufs:
        b.fill_(0xFF)
    del bufs


def make_x(m, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, cfg.hidden_size, generator=g) * (1 + 3 * torch.rand(1, cfg.hidden_size, generator=g) ** 8)
    x = x.to(BF16).cuda()
    x8, xs = rfp8.quant_act_per_token(x)
    return x, x8, xs


def make_positions(m, cfg, seed, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed + 1)
    pos = torch.randint(0, cfg.max_position_embeddings, (m,), generator=g)
    if m >= 3:
        pos[1] = 0
        pos[2] = cfg.max_position_embeddings + 12345  # outside the table: float64 fallback on the device
    return pos.to(dtype).cuda()


def q_lora_inputs(m, cfg, lw, seed):
    _, x8, xs = make_x(m, cfg, seed)
    r = ref.b0_qkv_a(x8, xs, lw.attn, cfg)
    return r["q_lora_fp8"], r["q_lora_scale"]


def deq_rows(q8, s):
    return q8.float() * s.unsqueeze(-1).float()


# ---- GPU: each op vs the reference ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_plain_gemm_matches_reference(m, layer, no_pdl_override, impl):
    c = GLM5
    _, x8, xs = make_x(m, c, 10 + m)
    for lin, name in ((layer.attn.qkv_a, "qkv_a"), (layer.attn.q_b, "q_b"), (layer.attn.indexer.wk, "wk")):
        if lin.weight.shape[1] != x8.shape[1]:
            x8b, xsb = q_lora_inputs(m, c, layer, 20 + m)
        else:
            x8b, xsb = x8, xs
        poison_pool()
        y = F.fp8_gemm_skinny(x8b, xsb, lin)
        want = rfp8.block_fp8_linear(x8b, xsb, lin.weight, lin.scale_inv)
        torch.cuda.synchronize()
        assert_no_poison("fp8_gemm_skinny", y, names=[name])
        assert_close("fp8_gemm_skinny", y, want.to(BF16), kind="bf16", context=f"{name} {impl} {m=}")
        assert_close("fp8_gemm_skinny", y.float(), want, tol=5e-3, context=f"{name} {impl} {m=} vs fp32")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 16, 64, 256])
def test_split_k_deterministic_and_pdl_off_equal(m, layer, impl):
    _, x8, xs = make_x(m, GLM5, 30 + m)
    for lin in (layer.attn.qkv_a, layer.attn.indexer.wk):
        a = F.fp8_gemm_skinny(x8, xs, lin)
        b = F.fp8_gemm_skinny(x8, xs, lin)
        c = F.fp8_gemm_skinny(x8, xs, lin, pdl=False)
        torch.cuda.synchronize()
        assert_equal("fp8_gemm_skinny", a, b, context=f"run twice {m=}")
        assert_equal("fp8_gemm_skinny", a, c, context=f"pdl off {m=}")


def check_b0(got, want, ctx):
    assert set(got) == set(want)
    assert_no_poison("b0_qkv_a", *got.values(), names=list(got))
    for k in ("q_lora", "c_kv", "k_pe"):
        assert got[k].dtype == BF16 and got[k].shape == want[k].shape
        assert_close("b0_qkv_a", got[k], want[k], kind="bf16", context=f"{ctx} {k}")
    assert_close("b0_qkv_a", got["q_lora_scale"], want["q_lora_scale"], kind="fp8_same_quant", context=f"{ctx} scale")
    assert_close("b0_qkv_a", rfp8.dequant_act(got["q_lora_fp8"], got["q_lora_scale"]),
                 rfp8.dequant_act(want["q_lora_fp8"], want["q_lora_scale"]), kind="fp8_same_quant", context=f"{ctx} fp8")
    # the fp8 must be the exact quantization of the kernel's own bf16 q_lora
    q8, qs = rfp8.quant_act_per_token(got["q_lora"])
    assert_close("b0_qkv_a", got["q_lora_scale"], qs, tol=1e-7, context=f"{ctx} own scale")
    assert_close("b0_qkv_a", rfp8.dequant_act(got["q_lora_fp8"], got["q_lora_scale"]), rfp8.dequant_act(q8, qs),
                 tol=1e-3, context=f"{ctx} own quant")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fused", "split"])
@pytest.mark.parametrize("m", M_VALUES)
def test_b0_qkv_a(m, mode, layer, no_pdl_override, impl):
    _, x8, xs = make_x(m, GLM5, 40 + m)
    poison_pool()
    got = F.b0_qkv_a(x8, xs, layer.attn, GLM5, mode=mode)
    want = ref.b0_qkv_a(x8, xs, layer.attn, GLM5)
    torch.cuda.synchronize()
    check_b0(got, want, f"{mode} {impl} {m=}")
    again = F.b0_qkv_a(x8, xs, layer.attn, GLM5, mode=mode)
    for k in got:
        assert_equal("b0_qkv_a", again[k], got[k], context=f"deterministic {mode} {k} {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 256])
def test_b0_row_norms_exact_on_the_gemm_output(m, layer, no_pdl_override):
    """Split mode's row kernel alone: given the same bf16 GEMM output, q_lora / c_kv are the reference
    RMSNorm up to the sum order (bf16 bar), k_pe is a bitwise copy, and the FP8 is the exact
    quantization of the kernel's own q_lora; pdl on/off and the env variable agree bitwise."""
    c = GLM5
    _, x8, xs = make_x(m, c, 45 + m)
    qkv = F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a)
    q, kv, r = c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim
    outs = torch.ops.glm5_fastpath.b0_row_norms(qkv, layer.attn.q_a_norm, layer.attn.kv_a_norm, q, kv, r,
                                                float(c.rms_norm_eps), True)
    torch.cuda.synchronize()
    got = dict(zip(("q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe"), outs))
    assert_no_poison("b0_row_norms", *outs, names=list(got))
    assert_close("b0_row_norms", got["q_lora"], ref._rmsnorm_bf16(qkv[:, :q], layer.attn.q_a_norm, c.rms_norm_eps),
                 kind="bf16", context=f"q_lora {m=}")
    assert_close("b0_row_norms", got["c_kv"], ref._rmsnorm_bf16(qkv[:, q:q + kv], layer.attn.kv_a_norm, c.rms_norm_eps),
                 kind="bf16", context=f"c_kv {m=}")
    assert_equal("b0_row_norms", got["k_pe"], qkv[:, q + kv:], context=f"k_pe {m=}")
    q8, qs = rfp8.quant_act_per_token(got["q_lora"])
    assert_close("b0_row_norms", got["q_lora_scale"], qs, tol=1e-7, context=f"own scale {m=}")
    assert_close("b0_row_norms", rfp8.dequant_act(got["q_lora_fp8"], got["q_lora_scale"]), rfp8.dequant_act(q8, qs),
                 tol=1e-3, context=f"own quant {m=}")

    off = torch.ops.glm5_fastpath.b0_row_norms(qkv, layer.attn.q_a_norm, layer.attn.kv_a_norm, q, kv, r,
                                               float(c.rms_norm_eps), False)
    torch.cuda.synchronize()
    for a, b, k in zip(outs, off, got):
        assert_equal("b0_row_norms", a, b, context=f"pdl off {k} {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_d0_q_b(m, layer, no_pdl_override, impl):
    ql8, qls = q_lora_inputs(m, GLM5, layer, 50 + m)
    pos = make_positions(m, GLM5, m)
    poison_pool()
    qn, qp = F.d0_q_b(ql8, qls, layer.attn, pos, GLM5)
    rn, rp = ref.d0_q_b(ql8, qls, layer.attn, pos, GLM5)
    torch.cuda.synchronize()
    assert_no_poison("d0_q_b", qn, qp, names=["q_nope", "q_pe"])
    assert qn.shape == rn.shape and qp.shape == rp.shape and qn.dtype == qp.dtype == BF16
    assert_close("d0_q_b", qn, rn, kind="bf16", context=f"q_nope {m=}")
    assert_close("d0_q_b", qp, rp, kind="bf16", context=f"q_pe {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_d1_indexer_q(m, layer, no_pdl_override, impl):
    ql8, qls = q_lora_inputs(m, GLM5, layer, 60 + m)
    pos = make_positions(m, GLM5, m, torch.int32 if m % 2 else torch.int64)
    w_raw = (torch.randn(m, GLM5.index_n_heads, generator=torch.Generator().manual_seed(m)) * 3).to(BF16).cuda()
    poison_pool()
    q8, s, hw = F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, GLM5)
    r8, rs, rhw = ref.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, GLM5)
    torch.cuda.synchronize()
    assert_no_poison("d1_indexer_q", q8, s, hw, names=["q8", "q_scale", "head_w"])
    assert q8.shape == r8.shape and q8.dtype == FP8 and s.shape == rs.shape and hw.shape == rhw.shape
    assert_close("d1_indexer_q", s, rs, kind="fp8_same_quant", context=f"scale {m=}")
    assert_close("d1_indexer_q", hw, rhw, kind="fp8_same_quant", context=f"head_w {m=}")
    assert_close("d1_indexer_q", deq_rows(q8, s), deq_rows(r8, rs), kind="fp8_same_quant", context=f"q {m=}")
    # head_w = (w_raw * c) * s exactly, given the kernel's own s
    c32 = torch.tensor(GLM5.index_weight_scale, dtype=torch.float32).item()
    assert_equal("d1_indexer_q", hw, (w_raw.float() * c32) * s, context=f"head_w from own scale {m=}")


def make_cache(m, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    pages = 2 * m + 3
    cache = torch.randint(0, 256, (pages, cfg.index_k_page_bytes), generator=g, dtype=torch.uint8).cuda()
    slots = torch.randperm(pages * 64, generator=g)[:m].cuda()
    return cache, slots


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_b1_indexer_k(m, layer, no_pdl_override, impl):
    c = GLM5
    x, x8, xs = make_x(m, c, 70 + m)
    pos = make_positions(m, c, m)
    cache, slots = make_cache(m, c, m)
    slots = slots.to(torch.int32) if m % 2 else slots
    cache_ref = cache.clone()
    before = cache.clone()
    poison_pool()
    k8, ks = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache, c)
    r8, rs = ref.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache_ref, c)
    torch.cuda.synchronize()
    assert_no_poison("b1_indexer_k", k8, ks, names=["k8", "k_scale"])
    assert k8.shape == r8.shape and k8.dtype == FP8 and ks.shape == rs.shape
    assert_close("b1_indexer_k", ks, rs, kind="fp8_same_quant", context=f"scale {m=}")
    assert_close("b1_indexer_k", deq_rows(k8, ks), deq_rows(r8, rs), kind="fp8_same_quant", context=f"k {m=}")
    # only the target slots changed, and they hold exactly this call's k8 / scale
    ck8, cks = rfp8.index_k_cache_load(cache, slots, c.index_head_dim)
    assert_equal("b1_indexer_k", ck8, k8, context=f"cache k8 {m=}")
    assert_equal("b1_indexer_k", cks, ks, context=f"cache scale {m=}")
    touched = torch.zeros_like(cache, dtype=torch.bool)
    pg, off = slots.long() // 64, slots.long() % 64
    d = c.index_head_dim
    cols = torch.cat([off[:, None] * d + torch.arange(d, device="cuda"), 64 * d + off[:, None] * 4 + torch.arange(4, device="cuda")], 1)
    touched[pg[:, None], cols] = True
    assert_equal("b1_indexer_k", cache[~touched], before[~touched], context=f"untouched cache bytes {m=}")


# ---- GPU: small preset -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 40])
def test_small_preset_all_ops(m, small_layer, impl):
    c, lw = SMALL, small_layer
    x, x8, xs = make_x(m, c, m)
    for mode in ("fused", "split"):
        check_b0(F.b0_qkv_a(x8, xs, lw.attn, c, mode=mode), ref.b0_qkv_a(x8, xs, lw.attn, c), f"small {mode} {m=}")
    ql8, qls = q_lora_inputs(m, c, lw, m)
    pos = make_positions(m, c, m)
    for a, b in zip(F.d0_q_b(ql8, qls, lw.attn, pos, c), ref.d0_q_b(ql8, qls, lw.attn, pos, c)):
        assert_close("d0_q_b", a, b, kind="bf16", context=f"small {m=}")
    w_raw = torch.randn(m, c.index_n_heads).to(BF16).cuda()
    q8, s, hw = F.d1_indexer_q(ql8, qls, w_raw, lw.attn.indexer, pos, c)
    r8, rs, rhw = ref.d1_indexer_q(ql8, qls, w_raw, lw.attn.indexer, pos, c)
    assert_close("d1_indexer_q", deq_rows(q8, s), deq_rows(r8, rs), kind="fp8_same_quant", context=f"small {m=}")
    assert_close("d1_indexer_q", hw, rhw, kind="fp8_same_quant", context=f"small head_w {m=}")
    cache, slots = make_cache(m, c, m)
    cache_ref = cache.clone()
    k8, ks = F.b1_indexer_k(x, x8, xs, lw.attn.indexer, pos, slots, cache, c)
    r8, rs = ref.b1_indexer_k(x, x8, xs, lw.attn.indexer, pos, slots, cache_ref, c)
    torch.cuda.synchronize()
    assert_close("b1_indexer_k", deq_rows(k8, ks), deq_rows(r8, rs), kind="fp8_same_quant", context=f"small {m=}")
    y = F.fp8_gemm_skinny(x8, xs, lw.attn.qkv_a)  # N = 416: a ragged last n tile
    assert_close("fp8_gemm_skinny", y, rfp8.block_fp8_linear(x8, xs, lw.attn.qkv_a.weight, lw.attn.qkv_a.scale_inv).to(BF16),
                 kind="bf16", context=f"small plain {m=}")


@pytest.mark.gpu
def test_empty_batch(layer, impl):
    _, x8, xs = make_x(0, GLM5, 0)
    assert tuple(F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a).shape) == (0, 2624)
    for mode in ("fused", "split"):
        out = F.b0_qkv_a(x8, xs, layer.attn, GLM5, mode=mode)
        assert tuple(out["q_lora_scale"].shape) == (0, 16) and tuple(out["k_pe"].shape) == (0, 64), mode


# wgmma pipeline corner cases: (tm, splits, stages) on (N, K, M) chosen so that the ring wraps many times
# (mbarrier phase flips), each split has a single K group, the ring is deeper than the split (all loads
# issued before griddepcontrol.wait), tokens span two 128-token blocks, and N leaves a ragged last tile.
WGMMA_CORNERS = [
    ((8, 1, 2), (2624, 6144, 1)),      # 48 K groups through a 2-stage ring: 24 wraps
    ((16, 6, 3), (2624, 6144, 16)),    # 8 groups per split, 3 stages
    ((8, 48, 4), (128, 6144, 5)),      # one K group per split, 48 splits: the last-CTA reduce
    ((32, 4, 8), (4096, 2048, 32)),    # ring deeper than the split (4 groups): prefill only
    ((128, 2, 5), (16384, 2048, 256)),  # two token blocks of 128
    ((64, 3, 6), (2624, 6144, 100)),   # partial token block, ragged N tile
    ((128, 1, 2), (416, 512, 130)),    # small K, ragged N, 2 stages
]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs, shape", WGMMA_CORNERS, ids=[f"tm{k[0]}_s{k[1]}_st{k[2]}_n{s[0]}_k{s[1]}_m{s[2]}"
                                                            for k, s in WGMMA_CORNERS])
def test_wgmma_pipeline_corner_cases(knobs, shape):
    tm, splits, stages = knobs
    n, k, m = shape
    g = torch.Generator().manual_seed(n + k + m)
    x = (torch.randn(m, k, generator=g) * 2).to(BF16).cuda()
    x8, xs = rfp8.quant_act_per_token(x)
    w = (torch.randn(n, k, generator=g) * 0.5).to(FP8).cuda()
    ws = (torch.rand(-(-n // 128), k // 128, generator=g) * 0.02 + 0.001).cuda()
    want = rfp8.block_fp8_linear(x8, xs, w, ws)
    outs = []
    for rep in range(2):
        poison_pool()
        with F.forced_config(tm, splits, stages, impl="wgmma"):
            y = torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, w, ws, rep == 0)
        torch.cuda.synchronize()
        ctx = f"wgmma {tm=} {splits=} {stages=} {n=} {k=} {m=} {'pdl' if rep == 0 else 'no pdl'}"
        assert_no_poison("fp8_gemm_skinny", y, names=["y"])
        assert_close("fp8_gemm_skinny", y, want.to(BF16), kind="bf16", context=ctx)
        outs.append(y)
    assert_equal("fp8_gemm_skinny", outs[0], outs[1], context=f"wgmma deterministic {knobs} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_mma_and_wgmma_agree(m, layer, monkeypatch):
    """Both mainloops compute the same math: equal up to the fp32 summation order (bf16 bar), at the
    shapes of every op."""
    c = GLM5
    _, x8, xs = make_x(m, c, 200 + m)
    ql8, qls = q_lora_inputs(m, c, layer, 210 + m)
    outs = {}
    for impl in F.IMPLS:
        monkeypatch.setenv(F.IMPL_ENV, impl)
        outs[impl] = [F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a), F.fp8_gemm_skinny(ql8, qls, layer.attn.q_b),
                      F.fp8_gemm_skinny(ql8, qls, layer.attn.indexer.wq_b), F.fp8_gemm_skinny(x8, xs, layer.attn.indexer.wk)]
    torch.cuda.synchronize()
    for name, a, b in zip(("qkv_a", "q_b", "wq_b", "wk"), outs["mma"], outs["wgmma"]):
        assert_close("fp8_gemm_skinny", b, a, kind="bf16", context=f"wgmma vs mma {name} {m=}")


# ---- GPU: PDL late producer --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_pdl_late_producer(m, layer, no_pdl_override, impl):
    prod = late_producer()
    c = GLM5
    x, x8_true, xs = make_x(m, c, 80 + m)
    want_y = F.fp8_gemm_skinny(x8_true, xs, layer.attn.qkv_a)
    want_b0 = F.b0_qkv_a(x8_true, xs, layer.attn, c, mode="fused")
    want_b0_split = F.b0_qkv_a(x8_true, xs, layer.attn, c, mode="split")
    qkv_true = want_y.clone()  # the plain GEMM's output = the split mode's intermediate
    qkv = torch.empty_like(qkv_true)
    pos = make_positions(m, c, m)
    cache, slots = make_cache(m, c, m)
    want_k8, _ = F.b1_indexer_k(x, x8_true, xs, layer.attn.indexer, pos, slots, cache.clone(), c)
    x8 = torch.empty_like(x8_true)
    for _ in range(3):
        x8.view(torch.uint8).fill_(0x38)  # stale: all 1.0 until the producer overwrites it
        torch.cuda.synchronize()
        produce(prod, x8_true, x8)
        y = F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a, pdl=True)
        torch.cuda.synchronize()
        assert_equal("fp8_gemm_skinny", y, want_y, context=f"PDL late producer {m=}")
        x8.view(torch.uint8).fill_(0x38)
        torch.cuda.synchronize()
        produce(prod, x8_true, x8)
        got = F.b0_qkv_a(x8, xs, layer.attn, c, mode="fused")
        torch.cuda.synchronize()
        for k in got:
            assert_equal("b0_qkv_a", got[k], want_b0[k], context=f"PDL late producer {k} {m=}")
        x8.view(torch.uint8).fill_(0x38)
        torch.cuda.synchronize()
        produce(prod, x8_true, x8)
        got = F.b0_qkv_a(x8, xs, layer.attn, c, mode="split")
        torch.cuda.synchronize()
        for k in got:
            assert_equal("b0_qkv_a", got[k], want_b0_split[k], context=f"PDL late producer split {k} {m=}")
        # the row kernel itself behind a late producer of its bf16 input
        qkv.fill_(1.0)
        torch.cuda.synchronize()
        produce(prod, qkv_true, qkv)
        outs = torch.ops.glm5_fastpath.b0_row_norms(qkv, layer.attn.q_a_norm, layer.attn.kv_a_norm, c.q_lora_rank,
                                                    c.kv_lora_rank, c.qk_rope_head_dim, float(c.rms_norm_eps), True)
        torch.cuda.synchronize()
        for k, o in zip(("q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe"), outs):
            assert_equal("b0_row_norms", o, want_b0_split[k], context=f"PDL late producer row kernel {k} {m=}")
        x8.view(torch.uint8).fill_(0x38)
        torch.cuda.synchronize()
        produce(prod, x8_true, x8)
        k8, _ = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache, c)
        torch.cuda.synchronize()
        assert_equal("b1_indexer_k", k8, want_k8, context=f"PDL late producer {m=}")


# ---- GPU: CUDA graphs -------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 16, 64])
def test_cuda_graph_replay_with_changing_inputs(m, layer, no_pdl_override, impl):
    c = GLM5
    F.precompile(cfg=c)
    x0, x8_0, xs_0 = make_x(m, c, 90)
    sx8, sxs = x8_0.clone(), xs_0.clone()
    pos = make_positions(m, c, 5)
    cache, slots = make_cache(m, c, 5)
    w_raw = torch.randn(m, c.index_n_heads).to(BF16).cuda()
    # warm up (compile, workspaces, rope table) outside capture
    F.b0_qkv_a(sx8, sxs, layer.attn, c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = F.fp8_gemm_skinny(sx8, sxs, layer.attn.qkv_a)
        b0 = F.b0_qkv_a(sx8, sxs, layer.attn, c, mode="fused")
        b0s = F.b0_qkv_a(sx8, sxs, layer.attn, c, mode="split")
        qn, qp = F.d0_q_b(b0["q_lora_fp8"], b0["q_lora_scale"], layer.attn, pos, c)
        q8, qs, hw = F.d1_indexer_q(b0["q_lora_fp8"], b0["q_lora_scale"], w_raw, layer.attn.indexer, pos, c)
        k8, ks = F.b1_indexer_k(None, sx8, sxs, layer.attn.indexer, pos, slots, cache, c)
    for step in range(3):
        x, x8, xs = make_x(m, c, 100 + step)
        sx8.copy_(x8)
        sxs.copy_(xs)
        for t in (y, qn, qp, qs, hw, k8, ks, *b0.values(), *b0s.values()):
            poison_(t)
        g.replay()
        torch.cuda.synchronize()
        ctx = f"graph replay {step} {m=}"
        assert_close("fp8_gemm_skinny", y, rfp8.block_fp8_linear(x8, xs, layer.attn.qkv_a.weight, layer.attn.qkv_a.scale_inv).to(BF16),
                     kind="bf16", context=ctx)
        want = ref.b0_qkv_a(x8, xs, layer.attn, c)
        check_b0(b0, want, ctx)
        check_b0(b0s, want, f"{ctx} split")
        rn, rp = ref.d0_q_b(b0["q_lora_fp8"], b0["q_lora_scale"], layer.attn, pos, c)
        assert_close("d0_q_b", qn, rn, kind="bf16", context=ctx)
        assert_close("d0_q_b", qp, rp, kind="bf16", context=ctx)
        r8, rs, rhw = ref.d1_indexer_q(b0["q_lora_fp8"], b0["q_lora_scale"], w_raw, layer.attn.indexer, pos, c)
        assert_close("d1_indexer_q", deq_rows(q8, qs), deq_rows(r8, rs), kind="fp8_same_quant", context=ctx)
        cache_ref = cache.clone()
        rk8, rks = ref.b1_indexer_k(None, x8, xs, layer.attn.indexer, pos, slots, cache_ref, c)
        assert_close("b1_indexer_k", deq_rows(k8, ks), deq_rows(rk8, rks), kind="fp8_same_quant", context=ctx)


# ---- GPU: errors and resources --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_error_cases(layer, monkeypatch):
    c = GLM5
    _, x8, xs = make_x(4, c, 0)
    buf = torch.empty(4 * 6144 + 16, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        F.fp8_gemm_skinny(buf[8:8 + 4 * 6144].view(FP8).view(4, 6144), xs, layer.attn.qkv_a)
    with pytest.raises(ValueError, match="one device"):
        F.fp8_gemm_skinny(x8, xs.cpu(), layer.attn.qkv_a)
    with pytest.raises(ValueError, match="weight must have shape"):
        F.fp8_gemm_skinny(x8, xs, layer.attn.q_b)  # K = 2048 weight with a K = 6144 activation
    pos = make_positions(4, c, 0)
    with pytest.raises(ValueError, match="positions must have shape"):
        F.d0_q_b(*q_lora_inputs(4, c, layer, 0), layer.attn, pos[:2], c)
    cache, slots = make_cache(4, c, 0)
    with pytest.raises(ValueError, match="index_k_cache must have shape"):
        F.b1_indexer_k(None, x8, xs, layer.attn.indexer, pos, slots, cache[:, :100].contiguous(), c)
    monkeypatch.setattr(importlib.import_module("glm5_fastpath.ops._device"), "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(RuntimeError, match="Hopper"):
        F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a)


@pytest.mark.gpu
def test_kernel_resources():
    from glm5_fastpath.jit import get_kernel
    for spec in F.compile_check_specs():
        k = get_kernel(spec)
        if spec.name == F.ROW_FUNCTION:  # B0 split mode's row kernel: no stack, 10 parameters
            assert k.local_bytes == 0, k
            continue

        epi = int(dict(spec.defines)["GLM5_SKINNY_EPI"])
        # the RoPE epilogues call double sin/cos whose rare slow path (|angle| huge) keeps a small stack
        assert k.local_bytes <= (64 if epi in (F.EPI_Q_B, F.EPI_IDX_Q, F.EPI_IDX_K) else 0), k
        if spec.name == F.WGMMA_FUNCTION:  # SkinnyParams + two CUtensorMaps (128 bytes each)
            assert k.max_threads >= F.WGMMA_THREADS, k
            assert k.param_sizes is None or k.param_sizes == (F.PARAMS_BYTES, 128, 128), k.param_sizes
        else:
            assert k.param_sizes is None or k.param_sizes == (F.PARAMS_BYTES,), k.param_sizes


# ---- GPU: wgmma options (consumer pipelining, cluster split-K) -----------------------------------------------
# Each option changes neither the arithmetic nor its order: results must be BITWISE equal to the
# baseline wgmma kernel (pipe=0, reduce="global") at the same (tm, splits, stages), for the plain GEMM
# and every fused epilogue (whose outputs the tests above check against the reference).
# Select with -k wgmma_options (about 30 s on an H200).
WGMMA_OPTION_CASES = [  # (op, m, tm, splits, stages)
    ("plain_qkv_a", 16, 16, 4, 6), ("plain_qkv_a", 64, 32, 3, 6), ("plain_wk", 5, 8, 8, 4), ("plain_wk", 1, 8, 12, 4),
    ("plain_q_b", 100, 64, 2, 4), ("d0", 16, 16, 1, 8), ("d0", 64, 64, 2, 4), ("d1", 16, 8, 2, 4), ("d1", 64, 32, 1, 8),
    ("b1", 16, 8, 8, 4), ("b1", 64, 32, 6, 4), ("b0", 16, 16, 4, 6),
]
WGMMA_OPTIONS = [(1, "global"), (0, "cluster"), (1, "cluster"), (2, "global"), (2, "cluster")]


def _run_op(op, m, layer, seed):
    c = GLM5
    x, x8, xs = make_x(m, c, seed)
    ql8, qls = q_lora_inputs(m, c, layer, seed + 1)
    pos = make_positions(m, c, m)
    if op == "plain_qkv_a":
        return [F.fp8_gemm_skinny(x8, xs, layer.attn.qkv_a)]
    if op == "plain_wk":
        return [F.fp8_gemm_skinny(x8, xs, layer.attn.indexer.wk)]
    if op == "plain_q_b":
        return [F.fp8_gemm_skinny(ql8, qls, layer.attn.q_b)]
    if op == "d0":
        return list(F.d0_q_b(ql8, qls, layer.attn, pos, c))
    if op == "d1":
        w_raw = (torch.randn(m, c.index_n_heads, generator=torch.Generator().manual_seed(seed)) * 3).to(BF16).cuda()
        return list(F.d1_indexer_q(ql8, qls, w_raw, layer.attn.indexer, pos, c))
    if op == "b1":
        cache, slots = make_cache(m, c, seed)
        k8, ks = F.b1_indexer_k(x, x8, xs, layer.attn.indexer, pos, slots, cache, c)
        return [k8, ks, cache]
    out = F.b0_qkv_a(x8, xs, layer.attn, c, mode="fused")
    return [out[k] for k in sorted(out)]


@pytest.mark.gpu
@pytest.mark.parametrize("pipe, reduce", WGMMA_OPTIONS, ids=[f"pipe{p}_{r}" for p, r in WGMMA_OPTIONS])
@pytest.mark.parametrize("case", WGMMA_OPTION_CASES, ids=[f"{c[0]}_m{c[1]}_tm{c[2]}_s{c[3]}" for c in WGMMA_OPTION_CASES])
def test_wgmma_options_bitwise_equal(case, pipe, reduce, layer, no_pdl_override):
    op, m, tm, splits, stages = case
    if reduce == "cluster" and not 1 < splits <= F.MAX_CLUSTER_SPLITS:
        pytest.skip(f"cluster reduce needs 1 < splits <= {F.MAX_CLUSTER_SPLITS} (forced_config rejects it)")
    with F.forced_config(tm, splits, stages, impl="wgmma"):
        base = _run_op(op, m, layer, 300 + m)
    with F.forced_config(tm, splits, stages, impl="wgmma", pipe=pipe, reduce=reduce):
        got = _run_op(op, m, layer, 300 + m)
        again = _run_op(op, m, layer, 300 + m)
    torch.cuda.synchronize()
    for i, (a, b, b2) in enumerate(zip(base, got, again)):
        ctx = f"{op} {m=} {tm=} {splits=} {stages=} {pipe=} {reduce=} output {i}"
        assert_equal(op, b.view(torch.uint8) if b.dtype == FP8 else b, a.view(torch.uint8) if a.dtype == FP8 else a,
                     context=ctx)
        assert_equal(op, b2.view(torch.uint8) if b2.dtype == FP8 else b2, a.view(torch.uint8) if a.dtype == FP8 else a,
                     context=ctx + " (repeat)")


def test_wgmma_option_specs_and_configs():
    """CPU: the option defines, the cluster dims, and the validation of impossible combinations."""
    c = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 4, 6, impl="wgmma", pipe=1, reduce="cluster")
    d = dict(c.spec().defines)
    assert d["GLM5_SKINNY_PIPE"] == "1" and d["GLM5_SKINNY_REDUCE"] == "1"
    assert c.cluster == (1, 4, 1) and c.partial_floats == 0
    one = F.SkinnyConfig(F.EPI_PLAIN, 16, 2624, 6144, 16, 1, 6, impl="wgmma", reduce="cluster")
    assert one.cluster is None and "GLM5_SKINNY_REDUCE" not in dict(one.spec().defines)
    assert "GLM5_SKINNY_PIPE" not in dict(F.kernel_spec(16, 6, 0, impl="wgmma").defines)
    for bad in (dict(impl="mma", pipe=1), dict(impl="mma", reduce="cluster"), dict(impl="wgmma", reduce="dsmem")):
        with pytest.raises(ValueError):
            F.kernel_spec(16, 6, 0, **bad)
    with pytest.raises(ValueError):
        F.forced_config(8, 12, 4, impl="wgmma", reduce="cluster")  # > 8 CTAs per cluster
    with pytest.raises(ValueError):
        F.forced_config(128, 1, 4, impl="wgmma", pipe=1)
    for bad in (dict(pipe=3), dict(pipe=2, tm=128)):
        kw = dict(tm=16, splits=1, stages=4, impl="wgmma") | bad
        with pytest.raises(ValueError):
            F.forced_config(**kw)
    assert dict(F.kernel_spec(16, 6, 0, impl="wgmma", pipe=2).defines)["GLM5_SKINNY_PIPE"] == "2"
    # the fused epilogues' staged inputs are part of the smem carve-up
    assert F.scratch_bytes(64, F.EPI_Q_B) == F.scratch_bytes(64) + 64 * 32 * 8 + 64 * 8
    assert F.wgmma_smem_bytes(16, 6, 8, F.EPI_IDX_K) - F.wgmma_smem_bytes(16, 6, 8) == 16 * (32 * 8 + 16)


# ---- GPU: persistent launch ------------------------------------------------------------------------------------
# persist=P deals the (n tile, split, token block) units over P CTAs (unit u to CTA u % P) through one TMA ring per
# CTA, the stage counter running on across units (ring slots and parities wrap mid-unit). Every unit computes the
# same partial in the same order and the split-K finish sums in split order, so the result must be BITWISE equal
# to the one-CTA-per-unit launch at the same (tm, splits, stages), for the plain GEMM and the fused epilogues
# (B0's per-token-block row counters, D0 / D1 / B1's staged RoPE inputs run once per unit). P is chosen so that
# units do not divide evenly and some CTAs take more units than others.
PERSIST_CASES = [  # (op, m, tm, splits, stages, persist, pipe)
    ("plain_qkv_a", 16, 16, 4, 6, 5, 0), ("plain_qkv_a", 1, 8, 6, 4, 132, 0), ("plain_wk", 5, 8, 8, 4, 3, 0),
    ("plain_wk", 1, 8, 12, 4, 1, 2), ("plain_q_b", 100, 64, 2, 4, 132, 0), ("plain_q_b", 37, 32, 3, 6, 61, 2),
    ("d0", 16, 16, 1, 8, 7, 0), ("d1", 64, 32, 1, 8, 5, 0), ("b1", 16, 8, 8, 4, 3, 2), ("b0", 16, 16, 4, 6, 9, 0),
    ("b0", 64, 32, 3, 6, 40, 2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", PERSIST_CASES, ids=[f"{c[0]}_m{c[1]}_tm{c[2]}_s{c[3]}_p{c[5]}_pipe{c[6]}"
                                                    for c in PERSIST_CASES])
def test_wgmma_persistent_bitwise_equal(case, layer, no_pdl_override):
    op, m, tm, splits, stages, persist, pipe = case
    with F.forced_config(tm, splits, stages, impl="wgmma"):
        base = _run_op(op, m, layer, 700 + m)
    with F.forced_config(tm, splits, stages, impl="wgmma", pipe=pipe, persist=persist):
        got = _run_op(op, m, layer, 700 + m)
        again = _run_op(op, m, layer, 700 + m)  # counters self-reset between launches
    torch.cuda.synchronize()
    for i, (a, b, b2) in enumerate(zip(base, got, again)):
        ctx = f"{op} {m=} {tm=} {splits=} {stages=} {persist=} {pipe=} output {i}"
        u8 = (lambda t: t.view(torch.uint8) if t.dtype == FP8 else t)
        assert_equal(op, u8(b), u8(a), context=ctx)
        assert_equal(op, u8(b2), u8(a), context=ctx + " (repeat)")


def test_persistent_configs():
    """CPU: grid / spec / validation of the persistent launch; the heuristic never picks it (measured slower)."""
    c = F.SkinnyConfig(F.EPI_PLAIN, 1, 6144, 16384, 8, 11, 10, impl="wgmma", persist=132)
    assert c.units == 48 * 11 and c.ctas == 132 and c.grid == (132, 1, 1)
    assert dict(c.spec().defines)["GLM5_SKINNY_PERSIST"] == "1" and c.describe()["persist"] == 132
    plain = F.SkinnyConfig(F.EPI_PLAIN, 1, 6144, 16384, 8, 11, 10, impl="wgmma")
    assert plain.grid == (48, 11, 1) and "GLM5_SKINNY_PERSIST" not in dict(plain.spec().defines)
    for bad in (dict(impl="mma"), dict(impl="wgmma", reduce="cluster"), dict(impl="wgmma", diag=1)):
        with pytest.raises(ValueError):
            F.kernel_spec(8, 4, 0, persist=True, **bad)
        with pytest.raises(ValueError):
            F.forced_config(8, 4, 4, persist=4, **bad)
    with F.forced_config(8, 2, 4, impl="wgmma", persist=1000):  # never more CTAs than units
        assert F._forced_config_for(1, 256, 1024, F.EPI_PLAIN).persist == 2 * 2
    # the heuristic never picks it (measured slower at the multi-wave FP8-linear shapes); the cost model takes it
    big = F.config_for(128, 6144, 16384, F.EPI_PLAIN, 132, "wgmma")  # M = 128: not in the tuned table (heuristic)
    assert big.persist == 0 and big.units > 132
    assert F.estimate_us(dataclasses.replace(big, persist=132)) > 0


def test_env_pipe_override(monkeypatch):
    """GLM5_FASTPATH_FP8_GEMM_PIPE sets the wgmma consumer mode of the chosen config where it applies; junk raises."""
    c = F.config_for(16, 2624, 6144, F.EPI_QKV_A, 132, "wgmma")
    monkeypatch.delenv(F.PIPE_ENV, raising=False)
    assert F.env_pipe() is None and F.with_env_pipe(c) is c
    monkeypatch.setenv(F.PIPE_ENV, "2")
    assert F.with_env_pipe(c).pipe == 2 and F.with_env_pipe(c).tm == c.tm
    assert F.with_env_pipe(dataclasses.replace(c, tm=128)).pipe == c.pipe  # 128 tokens: no room for two partials
    mma = F.SkinnyConfig(F.EPI_PLAIN, 1, 256, 1024, 8, 1, 3)
    assert F.with_env_pipe(mma) is mma
    monkeypatch.setenv(F.PIPE_ENV, "fast")
    with pytest.raises(F.Fp8GemmInputError, match="GLM5_FASTPATH_FP8_GEMM_PIPE"):
        F.with_env_pipe(c)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 64, 256])
def test_kblock_major_weights_bitwise_equal(m, layer, no_pdl_override):
    """Every wgmma GEMM op with k-block-major weights gives the row-major launch's bits (same smem bytes, only the
    weight TMA boxes come from another address pattern); outputs poisoned first."""
    c = GLM5
    if F.config_for(m, c.qkv_a_out, c.hidden_size).impl != "wgmma":
        pytest.skip("the default config of this M runs the mma.sync mainloop")
    _, x8, xs = make_x(m, c, 90 + m)
    ql8, qls = q_lora_inputs(m, c, layer, 91 + m)
    a = layer.attn

    def kb(lin):
        return dataclasses.replace(lin, weight=F.kblock_major(lin.weight))

    for name, lin, xx, sx in (("qkv_a", a.qkv_a, x8, xs), ("q_b", a.q_b, ql8, qls), ("wq_b", a.indexer.wq_b, ql8, qls)):
        if F.config_for(m, F.weight_rows(lin.weight), lin.weight.shape[1]).impl != "wgmma":
            continue
        poison_pool()
        got = F.fp8_gemm_skinny(xx, sx, kb(lin))
        want = F.fp8_gemm_skinny(xx, sx, lin)
        torch.cuda.synchronize()
        assert_no_poison("fp8_gemm_skinny", got, names=[name])
        assert_equal("fp8_gemm_skinny", got, want, context=f"k-block-major {name} {m=}")
    kb_attn = dataclasses.replace(a, qkv_a=kb(a.qkv_a), q_b=kb(a.q_b))
    poison_pool()
    got = F.b0_qkv_a(x8, xs, kb_attn, c, mode="fused")
    want = F.b0_qkv_a(x8, xs, a, c, mode="fused")
    torch.cuda.synchronize()
    for k in want:
        assert_equal("b0_qkv_a", got[k], want[k], context=f"k-block-major {k} {m=}")
    pos = make_positions(m, c, m)
    qn, qp = F.d0_q_b(ql8, qls, kb_attn, pos, c)
    rn, rp = F.d0_q_b(ql8, qls, a, pos, c)
    torch.cuda.synchronize()
    assert_equal("d0_q_b", qn, rn, context=f"k-block-major q_nope {m=}")
    assert_equal("d0_q_b", qp, rp, context=f"k-block-major q_pe {m=}")


@pytest.mark.parametrize("m", [1, 16, 17, 64])
def test_weights_evict_first_switch_adds_only_its_define(monkeypatch, m):
    """GLM5_FASTPATH_W_EVICT_FIRST (auto: M <= 16; 1 always; 0 never): the standalone GEMM (both mainloops) and D2
    specs gain -DGLM5_WEIGHTS_EVICT_FIRST=1 and nothing else; without it the specs (cache keys) are those of before."""
    from glm5_fastpath.ops import d2_absorb
    from glm5_fastpath.ops._device import W_EVICT_FIRST_MAX_M
    from glm5_fastpath.ops.fp8_gemm import SkinnyConfig

    def specs():
        gemms = [SkinnyConfig(epi=0, m=m, n=4096, k=2048, tm=16, splits=1, stages=6, impl=i) for i in ("mma", "wgmma")]
        return [dict(c.spec().defines) for c in gemms] + [dict(d2_absorb.config_for(192, 512, 64, m).spec.defines)]

    monkeypatch.setenv("GLM5_FASTPATH_W_EVICT_FIRST", "0")
    off = specs()
    assert all("GLM5_WEIGHTS_EVICT_FIRST" not in d for d in off)
    monkeypatch.setenv("GLM5_FASTPATH_W_EVICT_FIRST", "1")
    on = specs()
    for b, o in zip(off, on):
        assert o.pop("GLM5_WEIGHTS_EVICT_FIRST") == "1" and o == b
    monkeypatch.delenv("GLM5_FASTPATH_W_EVICT_FIRST")
    auto = specs()
    assert all(("GLM5_WEIGHTS_EVICT_FIRST" in d) == (m <= W_EVICT_FIRST_MAX_M) for d in auto)
    monkeypatch.setenv("GLM5_FASTPATH_W_EVICT_FIRST", "yes")
    with pytest.raises(ValueError, match="GLM5_FASTPATH_W_EVICT_FIRST"):
        specs()
