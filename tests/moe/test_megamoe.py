"""MegaMoE (glm5_fastpath.moe.megamoe, csrc/moe/megamoe.{cuh,cu}) against the reference MoE.

CPU tests: gate/up interleave round trip and definition, prepare_weights, config / smem mirror /
heuristic, input validation and the fake implementation, the kernels' compile (no spills) with
static_asserts that the Python mirrors (smem layout, task encoding) match the C++, the plan mirror's
invariants, a discrete-event simulation of the dynamic task schedule (dependencies, counters, no
deadlock), and a CPU emulation of the kernel's tile math (interleaved rows, per-128-K scale folding,
SwiGLU + requant per 128-channel tile, transposed activation scales, slot buffer, ordered combine)
against ref.moe.moe_forward on the small preset.

GPU tests (marked gpu; need an sm_90 GPU, nvcc, cuda-bindings), smallest and most diagnostic first:
  1. test_gpu_fc1_single_expert: 1 expert, 1 token block, FC1 only -> a8 / scales vs reference.
  2. test_gpu_vs_reference: token counts 1..1024, uniform and skewed routing, settings (a) 32 local
     experts top-8 + shared and (b) 256 + shared; vs a float64-dequantised reference with the same
     FP8 roundings (kind fp8_same_quant), workspace poisoned first.
  3. determinism (many repeats bitwise identical), counters zero at rest, CUDA-graph replay.
"""
from __future__ import annotations

import dataclasses
import heapq

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.moe import megamoe as M
from glm5_fastpath.ref.fp8 import FP8, quant_act_per_token
from glm5_fastpath.ref.moe import moe_forward
from glm5_fastpath.testing.moe_data import make_experts
from glm5_fastpath.testing.numerics import THRESHOLDS, assert_close, assert_equal, poison_, rel_err
from glm5_fastpath.weights import ExpertStore, Fp8Linear, MoEWeights

OP = "mega_moe"
BF16 = torch.bfloat16
SMALL = Glm5Config.preset("small")
GLM5 = Glm5Config.preset("glm5")


# ---- helpers ---------------------------------------------------------------------------------------------

def routing(m: int, e: int, k: int, seed: int, kind: str = "uniform"):
    """(topk_ids [m, k] int32, topk_weights [m, k] fp32 summing to 1). uniform: k distinct experts per token.
    skewed: expert 0 in every token (one expert with most tokens), 3 of 4 tokens pick the rest from a hot
    set of 2k experts, the others from the lower half; the upper half of the experts gets no token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(m, k, dtype=torch.long)
    for t in range(m):
        if kind == "uniform":
            ids[t] = torch.randperm(e, generator=g)[:k]
        elif kind == "skewed":
            pool = min(2 * k, e - 1) if t % 4 else max(k, e // 2) - 1
            ids[t, 0] = 0
            ids[t, 1:] = torch.randperm(pool, generator=g)[: k - 1] + 1
        else:
            raise ValueError(kind)
    w = torch.rand(m, k, generator=g) + 0.05
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def ref_weights(w13, s13, w2, s2, num_routed: int) -> MoEWeights:
    store = ExpertStore(w13.shape[0], lambda e: (Fp8Linear(w13[e], s13[e]), Fp8Linear(w2[e], s2[e])))
    return MoEWeights(torch.zeros(num_routed, w13.shape[2], dtype=BF16), torch.zeros(num_routed), store)


def cfg_for(hidden: int, inter: int, e: int, k: int, shared: int) -> Glm5Config:
    return dataclasses.replace(SMALL, hidden_size=hidden, moe_intermediate_size=inter, n_routed_experts=e,
                               num_experts_per_tok=k, n_shared_experts=shared)


# ---- interleave / prepare_weights -----------------------------------------------------------------------

def test_interleave_definition_and_round_trip():
    inter, k = 64, 16
    w = torch.randn(3, 2 * inter, k)
    wi = M.interleave_gate_up(w)
    for r in range(2 * inter):
        ch = 8 * (r // 16) + r % 8
        src = ch if r % 16 < 8 else inter + ch
        assert torch.equal(wi[:, r], w[:, src]), r
    assert torch.equal(M.deinterleave_gate_up(wi), w)
    # An FP8 tensor survives bit for bit.
    w8 = (torch.randn(256, 128) * 100).clamp(-448, 448).to(FP8)
    assert torch.equal(M.deinterleave_gate_up(M.interleave_gate_up(w8)).view(torch.uint8), w8.view(torch.uint8))


def test_interleave_maps_tiles_to_quant_groups():
    """A 256-row tile rt of the interleaved weight = gate and up rows of channels [128 rt, 128 rt + 128)."""
    inter = 512
    rows = torch.arange(2 * inter).view(2 * inter, 1).float()
    wi = M.interleave_gate_up(rows.unsqueeze(0))[0, :, 0].long()
    for rt in range(2 * inter // 256):
        tile = wi[256 * rt: 256 * rt + 256]
        gate = tile[tile < inter]
        up = tile[tile >= inter] - inter
        assert sorted(gate.tolist()) == list(range(128 * rt, 128 * rt + 128))
        assert torch.equal(gate, up)  # same channel order: thread rows g / g + 8 pair up
        # the kernel's channel formula for row R of the tile: 8 * (R // 16) + R % 8
        R = torch.arange(256)
        assert torch.equal(tile[(R % 16) < 8] - 128 * rt, (8 * (R // 16) + R % 8)[(R % 16) < 8])


@pytest.mark.parametrize("rows", [256, 128])
@pytest.mark.parametrize("e_tot,inter,hidden", [(1, 128, 256), (3, 256, 512), (2, 2048, 384)])
def test_w13_map_geometry_gathers_the_interleaved_rows(e_tot, inter, hidden, rows):
    """The FC1 TMA view over the natural gate||up layout, read box by box in the kernel's order (coordinates
    (k, 0, 0, 16 rt + 8 q, e) for pass q of tile rt: q = 0 only with 256-row boxes, q = 0, 1 with the wide mode's
    128-row boxes), yields exactly interleave_gate_up's tiles: the kernel reads SGLang's w13 in place."""
    w = torch.arange(e_tot * 2 * inter * hidden, dtype=torch.float64).view(e_tot, 2 * inter, hidden)
    sizes, strides, box = M.w13_map_geometry(e_tot, inter, hidden, rows)
    view = w.as_strided(sizes, strides)
    ref = M.interleave_gate_up(w)
    assert box[1] * box[2] * box[3] == rows and box[4] == M.BK
    for e in range(e_tot):
        for rt in range(2 * inter // M.TILE_ROWS):
            for q in range(M.TILE_ROWS // rows):
                for kb in range(hidden // M.BK):
                    g0, k0 = rt * (M.TILE_ROWS // 16) + q * (rows // 16), kb * M.BK
                    tile = view[e, g0:g0 + box[1], :, :, k0:k0 + M.BK].reshape(rows, M.BK)
                    r0 = rt * M.TILE_ROWS + q * rows
                    assert torch.equal(tile, ref[e, r0:r0 + rows, k0:k0 + M.BK]), (e, rt, q, kb)
    # the view stays inside the tensor and satisfies the tensor-map rules (16-byte strides for e4m3)
    from glm5_fastpath.jit.tma import check_strided
    check_strided(sizes, strides, 1, 0, box, 128, w.numel(), "w13")


def test_prepare_weights_layout_and_errors():
    w13, s13, w2, s2 = make_experts(3, 256, 128, 0)
    wt = M.prepare_weights(w13, s13, w2, s2, num_shared=1)
    assert (wt.num_experts, wt.num_shared, wt.num_total, wt.hidden, wt.inter) == (2, 1, 3, 256, 128)
    assert tuple(wt.w13.shape) == (3, 256, 256) and tuple(wt.w2.shape) == (3, 256, 128)
    assert wt.w13.data_ptr() == w13.data_ptr() and wt.w2.data_ptr() == w2.data_ptr()  # no copies
    with pytest.raises(M.MegaMoEInputError, match="w2 must be"):
        M.prepare_weights(w13, s13, w2[:, :128], s2, 1)
    with pytest.raises(M.MegaMoEInputError, match="num_shared"):
        M.prepare_weights(w13, s13, w2, s2, 2)
    with pytest.raises(M.MegaMoEInputError, match="w13 must be a 3-D"):
        M.prepare_weights(w13.float(), s13, w2, s2, 1)


# ---- config -----------------------------------------------------------------------------------------------

def test_config_smem_and_validation():
    for bn in M.BLOCK_NS:
        s = M.max_stages(bn)
        assert 4 <= s <= 8 and M.smem_bytes(bn, s) <= M.SMEM_LIMIT < M.smem_bytes(bn, s + 1) or s == 8
        M.MegaMoEConfig(bn, s).validate()
    with pytest.raises(M.MegaMoEInputError, match="block_n=256"):
        M.MegaMoEConfig(256, 4).validate()
    with pytest.raises(M.MegaMoEInputError, match="block_n=96"):
        M.MegaMoEConfig.from_name("bn96")
    # the wide block: 16 KB weight stages (128 rows), and its name round-trips
    assert M.stage_rows(128) == 128 and all(M.stage_rows(b) == M.TILE_ROWS for b in M.BLOCK_NS if b != 128)
    assert M.MegaMoEConfig.from_name(M.MegaMoEConfig(128, 6, 4, 0).name) == M.MegaMoEConfig(128, 6, 4, 0)
    with pytest.raises(M.MegaMoEInputError, match="shared memory"):
        M.MegaMoEConfig(64, 8).validate()
    with pytest.raises(M.MegaMoEInputError, match="group_size"):
        M.MegaMoEConfig(8, 4, 0).validate()


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 33, 64, 128, 256, 1024, 4096])
@pytest.mark.parametrize("experts", [32, 256])
def test_default_config(m, experts):
    c = M.default_config(m, experts, 8, 1)
    assert c.block_n in M.BLOCK_NS and c.stages == M.max_stages(c.block_n)
    if m <= 32:  # the shared expert's tokens fit one block: every weight tile streams once
        assert c.block_n >= m
    elif m <= 128 and M.expected_max_load(m, experts, 8) <= 32:
        # measured faster on an H200 at 64 / 128 tokens than the block that holds every token (256 experts)
        assert c.block_n == 32
    elif m <= 128:  # 32 experts: the routed experts themselves need more than 32 rows per block
        assert c.block_n == 64
    assert c.group_size == M.MAX_EXPERTS and c.split_waves == (4 if m == 1 else 0)  # split-K pays at 1 token only
    with pytest.raises(M.MegaMoEInputError):
        M.default_config(0, experts, 8, 1)


# ---- validation / fake -------------------------------------------------------------------------------------

def _meta_inputs(m=5, h=512, inter=128, e_tot=5, k=4, dev="meta"):
    return dict(
        x=torch.empty(m, h, dtype=FP8, device=dev), x_scale=torch.empty(m, h // 128, device=dev),
        topk_ids=torch.empty(m, k, dtype=torch.int32, device=dev), topk_weights=torch.empty(m, k, device=dev),
        w13=torch.empty(e_tot, 2 * inter, h, dtype=FP8, device=dev),
        w13_scale=torch.empty(e_tot, 2 * inter // 128, h // 128, device=dev),
        w2=torch.empty(e_tot, h, inter, dtype=FP8, device=dev), w2_scale=torch.empty(e_tot, h // 128, inter // 128, device=dev))


def _call(d, shared=1, rsf=2.5, bn=8, st=6, g=8):
    return torch.ops.glm5_fastpath.mega_moe(d["x"], d["x_scale"], d["topk_ids"], d["topk_weights"], d["w13"],
                                            d["w13_scale"], d["w2"], d["w2_scale"], shared, rsf, bn, st, g, True)


def test_op_refuses_an_unsupported_build():
    """The op validates the whole config (token_major / diag included) before anything compiles or launches."""
    d = _meta_inputs()
    with pytest.raises(M.MegaMoEInputError, match="token_major"):
        torch.ops.glm5_fastpath.mega_moe(*d.values(), 1, 2.5, 32, M.max_stages(32), 8, 0, True, True, True, 0, True)
    with pytest.raises(M.MegaMoEInputError, match="diag"):
        torch.ops.glm5_fastpath.mega_moe(*d.values(), 1, 2.5, 8, 6, 8, 0, True, False, False, 9, False)


def test_fake_shape_and_compile():
    d = _meta_inputs()
    out = _call(d)
    assert tuple(out.shape) == (5, 512) and out.dtype == BF16
    f = torch.compile(lambda *a: _call(dict(zip(d.keys(), a))), backend="aot_eager", fullgraph=True)
    assert tuple(f(*d.values()).shape) == (5, 512)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(x=torch.empty(5, 512, dtype=BF16, device="meta")), "x \\(FP8 activations\\) must be float8_e4m3fn"),
    (lambda d: d.update(topk_ids=torch.empty(5, 4, dtype=torch.int16, device="meta")), "topk_ids must be int32 or int64"),
    (lambda d: d.update(topk_weights=torch.empty(5, 3, device="meta")), "topk_weights"),
    (lambda d: d.update(x_scale=torch.empty(5, 3, device="meta")), "x_scale must be"),
    (lambda d: d.update(w2=torch.empty(5, 512, 256, dtype=FP8, device="meta")), "w13 must be|w2 must be"),
    (lambda d: d.update(w13=torch.empty(5 * 256, 512, dtype=FP8, device="meta")), "w13 \\(gate\\|\\|up\\) must be 3-D"),
    (lambda d: d.update(w13_scale=torch.empty(5, 2, 3, device="meta")), "w13_scale must be"),
    (lambda d: d.update(topk_ids=torch.empty(5, 5, dtype=torch.int32, device="meta"),
                        topk_weights=torch.empty(5, 5, device="meta")), "top-k=5"),
])
def test_input_errors(mutate, match):
    d = _meta_inputs()
    mutate(d)
    with pytest.raises(M.MegaMoEInputError, match=match):
        _call(d)


def test_token_count_and_config_errors():
    d = _meta_inputs(m=M.MAX_TOKENS + 1)
    with pytest.raises(M.MegaMoEInputError, match=f"exceeds the supported maximum of {M.MAX_TOKENS}"):
        _call(d)
    d = _meta_inputs()
    with pytest.raises(M.MegaMoEInputError, match="block_n=12"):
        _call(d, bn=12)
    with pytest.raises(M.MegaMoEInputError, match="routed_scaling_factor"):
        _call(d, rsf=0.0)
    with pytest.raises(M.MegaMoEInputError, match="num_shared"):
        _call(d, shared=2)


def test_cpu_tensors_are_refused():
    d = _meta_inputs(dev="cpu")
    with pytest.raises(M.MegaMoEInputError, match="CUDA device"):
        _call(d)


# ---- compile: no spills, Python mirrors == C++ ----------------------------------------------------------

def test_workspace_tags_keep_separate_workspaces(monkeypatch):
    """workspace_tag: launches under a tag get their own workspace (the SGLang route's prefill passes), sized by their
    own calls; the untagged one (decode) is neither grown nor replaced by them."""
    made = []

    def alloc(shape, dev):
        made.append(shape.max_tokens)
        return M.Workspace(shape, *([None] * 15))

    monkeypatch.setattr(M, "_alloc_workspace", alloc)
    monkeypatch.setattr(M, "_sms", lambda dev: 132)
    monkeypatch.setattr(M, "_workspaces", {})
    dev = torch.device("cuda", 0)
    dec = M.get_workspace(dev, 6144, 2048, 257, 9, 64)
    with M.workspace_tag("prefill"):
        pre = M.get_workspace(dev, 6144, 2048, 257, 9, 4096)
        assert M.get_workspace(dev, 6144, 2048, 257, 9, 100) is pre
    assert M.get_workspace(dev, 6144, 2048, 257, 9, 64) is dec and pre is not dec
    assert (dec.shape.max_tokens, pre.shape.max_tokens, made) == (64, 4096, [64, 4096])
    with M.workspace_tag("prefill"):
        with M.workspace_tag("other"):
            M.get_workspace(dev, 6144, 2048, 257, 9, 8)
        assert M.get_workspace(dev, 6144, 2048, 257, 9, 8) is pre  # the outer tag is back
    assert len(M._workspaces) == 3


def test_compile_specs_without_spills(nvcc_jit):
    for spec in M.compile_check_specs():
        res = nvcc_jit(spec).resources()
        for fn in (M.FUNCTION, M.PLAN_FUNCTION):
            r = res[fn]
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (spec.describe(), fn, r)
        assert res[M.FUNCTION].stack_bytes == 0, (spec.describe(), res[M.FUNCTION])
        if M.TRACE_FUNCTION in res:  # the diagnostic build: its loader's spin stamps cost a few bytes (sm_90a, nvcc 13)
            assert res[M.TRACE_FUNCTION].spill_store_bytes <= 16, (spec.describe(), res[M.TRACE_FUNCTION])


def test_python_mirrors_match_cpp(nvcc_jit):
    from glm5_fastpath.jit import KernelSpec
    lines = ['#include "moe/megamoe.cuh"', "namespace mm = glm5::moe::megamoe;"]
    for bn in M.BLOCK_NS:
        for st in range(2, M.max_stages(bn) + 1):
            lines.append(f"static_assert(mm::Smem<{bn}, {st}>::kAlloc == {M.smem_bytes(bn, st)}, \"smem {bn} {st}\");")
    for fc2, e, rt, b in [(0, 0, 0, 0), (1, 256, 23, 511), (1, 511, 63, 65535), (0, 32, 15, 7)]:
        lines.append(f"static_assert(mm::encode_task({fc2}, {e}, {rt}, {b}) == {M.encode_task(fc2, e, rt, b)}, \"task\");")
    consts = {"kThreads": M.THREADS, "kPlanThreads": M.PLAN_THREADS, "kTileRows": M.TILE_ROWS, "kBK": M.BK,
              "kTaskSlots": M.TASK_SLOTS, "kMaxExperts": M.MAX_EXPERTS, "kMaxSlots": M.MAX_SLOTS,
              "kPairAlign": M.PAIR_ALIGN, "kFlagFc1Only": M.FLAG_FC1_ONLY, "kFlagNoCombine": M.FLAG_NO_COMBINE,
              "kTaskEnd": M.TASK_END, "kTraceCols": M.TRACE_COLS, "kLoaderWarps": M.LOADER_WARPS,
              "kPoolCopyWarps": M.POOL_COPY_WARPS, "kMaxRanks": M.EP_MAX_RANKS}
    lines += [f"static_assert(mm::{k} == {v}, \"{k}\");" for k, v in consts.items()]
    # The kernel's end-of-list test rejects every descriptor a plan can hold (FC2 ones are negative int32).
    ids, _ = routing(3, 32, 8, seed=4)
    plan = M.plan_reference(ids, 32, 1, 8, 8, 6144, 2048, split_max_tiles=528)
    uniq = sorted(set(plan.tasks))
    for d in uniq[:: max(1, len(uniq) // 64)] + [plan.tasks[-1], M.encode_task(1, 511, 63, 16383)]:
        lines.append(f"static_assert(!mm::task_is_end({d}), \"task {d} is not the end\");")
    lines.append(f"static_assert(mm::task_is_end({M.TASK_END}), \"end\");")
    lines.append(f"static_assert(sizeof(mm::Params) == {M.PARAMS_BYTES}, \"Params ABI\");")
    # the CTA-pair build's layout (its own macro: one more translation unit)
    pair = ['#define GLM5_MEGAMOE_PAIR 1', '#include "moe/megamoe.cuh"', "namespace mm = glm5::moe::megamoe;"]
    for bn in (8, 16):
        for st in range(2, M.max_stages(bn, True) + 1):
            pair.append(f"static_assert(mm::Smem<{bn}, {st}>::kAlloc == {M.smem_bytes(bn, st, True)}, \"pair {bn} {st}\");")
    assert nvcc_jit(KernelSpec("megamoe_pair_mirror_check", code="\n".join(pair) + "\n")).cubin is not None
    for name, _ in M._Params._fields_:
        off = getattr(M._Params, name).offset
        lines.append(f"static_assert(offsetof(mm::Params, {name}) == {off}, \"Params.{name}\");")
    code = "#include <stddef.h>\n" + "\n".join(lines) + "\n"
    assert nvcc_jit(KernelSpec("megamoe_mirror_check", code=code)).cubin is not None


# ---- the plan (CPU mirror) --------------------------------------------------------------------------------

@pytest.mark.parametrize("m, e, k, shared, bn, kind, split_tiles", [
    (1, 32, 8, 1, 8, "uniform", 0), (1, 32, 8, 1, 8, "uniform", 396), (33, 32, 8, 1, 32, "uniform", 0),
    (200, 256, 8, 1, 64, "skewed", 0), (64, 16, 4, 0, 16, "skewed", 396),
])
def test_plan_invariants(m, e, k, shared, bn, kind, split_tiles):
    ids, _ = routing(m, e, k, seed=m * 7 + e, kind=kind)
    H, I = 6144, 2048
    p = M.plan_reference(ids, e, shared, bn, 8, H, I, split_max_tiles=split_tiles)
    t1, t2 = 2 * I // 256, H // 256
    assert sum(p.counts) == m * (k + shared)
    assert all(o % M.PAIR_ALIGN == 0 for o in p.offsets)
    blocks = sum(M._cdiv(c, bn) for c in p.counts)
    split = 2 if blocks * t1 <= split_tiles else 1
    seen = {}
    for pos, d in enumerate(p.tasks):
        fc2, ex, rt, b = M.decode_task(d)
        sp, half = M.task_split_half(d)
        assert M.encode_task(fc2, ex, rt, b, sp, half) == d and sp == (split == 2 and not fc2)
        assert (fc2, ex, rt, b, half) not in seen
        seen[(fc2, ex, rt, b, half)] = pos
        if half:  # the two halves of a split tile are claimed back to back
            assert seen[(fc2, ex, rt, b, 0)] == pos - 1
        seen.setdefault((fc2, ex, rt, b), pos)
        seen[(fc2, ex, rt, b)] = max(seen[(fc2, ex, rt, b)], pos)
    want = blocks * (t1 * split + t2)
    assert len(p.tasks) == want
    for ex, c in enumerate(p.counts):
        for b in range(M._cdiv(c, bn)):
            last_fc1 = max(seen[(0, ex, rt, b)] for rt in range(t1))
            first_fc2 = min(seen[(1, ex, rt, b)] for rt in range(t2))
            assert last_fc1 < first_fc2, (ex, b)  # dependencies point backwards in claim order
    if shared:  # the shared expert (most tokens) goes first
        assert M.decode_task(p.tasks[0])[1] == e
    fc1 = M.plan_reference(ids, e, shared, bn, 8, H, I, fc1_only=True, split_max_tiles=split_tiles)
    assert all(M.decode_task(d)[0] == 0 for d in fc1.tasks) and len(fc1.tasks) == blocks * t1 * split


@pytest.mark.parametrize("m, e, shared, bn, split_tiles", [(1, 32, 1, 8, 528), (1, 32, 1, 8, 0), (64, 256, 1, 64, 0),
                                                         (1024, 16, 0, 8, 528), (7, 2, 1, 16, 528)])
def test_plan_tasks_are_not_the_end_sentinel(m, e, shared, bn, split_tiles):
    """Regression (first H200 run): the kernel ended its task loop at `desc < 0`, but FC2 descriptors set
    bit 31 (negative int32), so every CTA stopped at its first FC2 claim and the output was never written.
    The end is now the one value TASK_END, which no descriptor a plan holds can equal."""
    ids, _ = routing(m, e, min(8, e), seed=m + e, kind="uniform")
    plan = M.plan_reference(ids, e, shared, bn, 8, 6144, 2048, split_max_tiles=split_tiles)
    fc2 = [d for d in plan.tasks if M.decode_task(d)[0]]
    assert fc2 and all(d < 0 for d in fc2)  # why a sign test is wrong
    assert M.TASK_END not in plan.tasks
    assert all(-2**31 <= d < 2**31 for d in plan.tasks)


def simulate_schedule(plan: M.Plan, block_n: int, num_ctas: int, hidden: int, inter: int,
                      bw_per_cta: float = 4.27e12 / 132):
    """Discrete-event model of the persistent kernel: each CTA claims the next task from the global list
    when it is free, streams the task's
    weights at bw_per_cta, and for FC2 cannot start its math before fc1_done of (expert, block) reaches
    I/128. Returns (makespan_s, fc1_done, combine counts). Raises on a deadlock."""
    t1 = 2 * inter // 256
    fc2_bytes = 256 * inter
    fc1_done: dict[tuple[int, int], int] = {}
    halves: dict[tuple[int, int, int], int] = {}
    combine: dict[tuple[int, int], int] = {}
    # Claim order = list order; the earliest free CTA claims next; dependencies are honoured in time.
    free = [(0.0, c) for c in range(num_ctas)]
    heapq.heapify(free)
    done_time: dict[tuple, float] = {}
    makespan = 0.0
    for d in plan.tasks:
        fc2, e, rt, b = M.decode_task(d)
        split, _ = M.task_split_half(d)
        start, cta = heapq.heappop(free)
        stream = (fc2_bytes if fc2 else 256 * hidden // (1 + split)) / bw_per_cta
        if fc2:
            deps = [done_time.get((0, e, r, b)) for r in range(t1)]
            if any(x is None for x in deps):
                raise AssertionError(f"deadlock: FC2 {(e, rt, b)} claimed before all its FC1 tasks were claimed")
            start_math = max(start, max(deps))  # weights stream meanwhile (producer never waits)
            end = max(start + stream, start_math + 1e-7)
        else:
            end = start + stream
        key4 = (fc2, e, rt, b)
        done_time[key4] = max(end, done_time.get(key4, 0.0))
        if split:  # the tile is done (and reports) when its second half is
            halves[(e, rt, b)] = halves.get((e, rt, b), 0) + 1
            if halves[(e, rt, b)] == 1:
                makespan = max(makespan, end)
                heapq.heappush(free, (end, cta))
                continue
        if fc2:
            for code in plan.pairs[e][b * block_n: (b + 1) * block_n]:
                key = (code >> 4, rt)
                combine[key] = combine.get(key, 0) + 1
        else:
            fc1_done[(e, b)] = fc1_done.get((e, b), 0) + 1
        makespan = max(makespan, end)
        heapq.heappush(free, (end, cta))
    return makespan, fc1_done, combine


@pytest.mark.parametrize("m, e, kind, bound", [(1, 32, "uniform", 1.06), (8, 32, "uniform", 1.06), (32, 32, "uniform", 1.03),
                                               (128, 32, "uniform", 1.03), (128, 32, "skewed", 1.06),
                                               (1, 256, "uniform", 1.06), (16, 256, "uniform", 1.03),
                                               (256, 256, "uniform", 1.03)])
def test_schedule_simulation(m, e, kind, bound):
    """Every FC1 tile reports once per (expert, block), every (token, FC2 tile) gets exactly S
    contributions (so exactly one last contributor), no dependency points forward, and the modelled
    makespan (weights at 4.27 TB/s / 132 per CTA, no L2 reuse credit) stays within `bound` of the
    weight-bytes floor of the experts touched."""
    H, I, k, shared = 6144, 2048, 8, 1
    ids, _ = routing(m, e, k, seed=11 + m, kind=kind)
    cfg = M.default_config(m, e, k, shared)
    plan = M.plan_reference(ids, e, shared, cfg.block_n, cfg.group_size, H, I, split_max_tiles=cfg.split_max_tiles(132))
    makespan, fc1_done, combine = simulate_schedule(plan, cfg.block_n, 132, H, I)
    assert all(v == 2 * I // 256 for v in fc1_done.values())
    assert len(combine) == m * (H // 256) and all(v == k + shared for v in combine.values())
    touched = sum(1 for c in plan.counts if c)
    floor = touched * (3 * H * I) / 4.27e12
    blocks = sum(M._cdiv(c, cfg.block_n) for c in plan.counts)
    floor_blocks = blocks * (3 * H * I) / 4.27e12  # what the model streams (extra blocks re-read weights)
    print(f"m={m} e={e} {kind}: bn={cfg.block_n} touched={touched} blocks={blocks} makespan={makespan * 1e6:.1f} us "
          f"floor={floor * 1e6:.1f} us ratio={makespan / floor:.3f} (vs streamed {makespan / floor_blocks:.3f})")
    assert makespan / floor_blocks <= bound


# ---- CPU emulation of the kernel's tile math ----------------------------------------------------------

def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(BF16).to(x.dtype)


def emulate_megamoe(x8, xs, ids, wts, wt: M.MegaMoEWeights, rsf: float, block_n: int) -> torch.Tensor:
    """The kernel's data flow on the CPU, tile by tile, using the same index formulas as megamoe.cuh:
    interleaved W13 rows, gate/up block-scale rows rt and I/128 + rt, act_scale[kb][pair], the slot buffer
    [M, S, H] and the ordered combine. Accumulation in float64 (the kernel: fp32)."""
    m, k = ids.shape
    H, I = wt.hidden, wt.inter
    S = k + wt.num_shared
    plan = M.plan_reference(ids, wt.num_experts, wt.num_shared, block_n, 8, H, I)
    act8 = torch.zeros(plan.total_rows + block_n, I)
    act_scale = torch.zeros(I // 128, plan.total_rows + block_n)
    slots = torch.full((m, S, H), float("nan"))
    w13 = M.interleave_gate_up(wt.w13.float()).double()  # the row order the 5-D TMA box delivers
    w2 = wt.w2.float().double()
    s13, s2 = wt.w13_scale.double(), wt.w2_scale.double()
    shared_w = torch.tensor(1.0 / rsf, dtype=torch.float32).item()
    R = torch.arange(256)
    for d in plan.tasks:
        fc2, e, rt, b = M.decode_task(d)
        codes = plan.pairs[e][b * block_n:(b + 1) * block_n]
        cnt = len(codes)
        p0 = plan.offsets[e] + b * block_n
        toks = torch.tensor([c >> 4 for c in codes])
        slot_j = torch.tensor([c & 15 for c in codes])
        if not fc2:
            rows = w13[e, 256 * rt: 256 * rt + 256]                         # [256, H]
            is_gate = (R % 16) < 8
            srow = torch.where(is_gate, torch.full_like(R, rt), torch.full_like(R, I // 128 + rt))
            acc = torch.zeros(256, cnt, dtype=torch.float64)
            for kb in range(H // 128):
                part = rows[:, 128 * kb:128 * kb + 128] @ x8[toks, 128 * kb:128 * kb + 128].double().t()
                acc += part * xs[toks, kb].double()[None, :] * s13[e, srow, kb][:, None]
            acc = acc.float()
            ch = 8 * (R // 16) + R % 8
            g = _bf16(acc[is_gate])                                         # [128, cnt] channel order ch[is_gate]
            u = _bf16(acc[~is_gate])
            a = _bf16(torch.nn.functional.silu(g) * u)
            amax = a.abs().amax(dim=0).clamp_min(1e-10)
            sc = (amax.double() / 448.0).float()
            q = (a / sc[None, :]).clamp(-448, 448).to(FP8).float()
            cols = 128 * rt + ch[is_gate]
            act8[p0:p0 + cnt][:, cols] = q.t()
            act_scale[rt, p0:p0 + cnt] = sc
        else:
            rows = w2[e, 256 * rt: 256 * rt + 256]                          # [256, I]
            acc = torch.zeros(256, cnt, dtype=torch.float64)
            for kb in range(I // 128):
                part = rows[:, 128 * kb:128 * kb + 128] @ act8[p0:p0 + cnt, 128 * kb:128 * kb + 128].double().t()
                acc += part * act_scale[kb, p0:p0 + cnt].double()[None, :] * s2[e, (256 * rt + R) // 128, kb][:, None]
            w = torch.tensor([float(wts[t, j]) if j < k else shared_w for t, j in zip(toks.tolist(), slot_j.tolist())])
            y = _bf16(acc.float() * w[None, :].float())
            slots[toks, slot_j, 256 * rt: 256 * rt + 256] = y.t()
    acc = torch.zeros(m, H)
    for j in range(S):
        acc = acc + slots[:, j].float()
    return (acc * rsf).to(BF16)


@pytest.mark.parametrize("m, kind, bn", [(1, "uniform", 8), (5, "skewed", 8), (19, "uniform", 16), (40, "skewed", 16)])
def test_cpu_emulation_matches_reference(m, kind, bn):
    H, I, E, k, rsf = 512, 256, 8, 3, 2.5
    w13, s13, w2, s2 = make_experts(E + 1, H, I, seed=5)
    wt = M.prepare_weights(w13, s13, w2, s2, 1)
    cfg = cfg_for(H, I, E, k, 1)
    g = torch.Generator().manual_seed(m)
    h = (torch.randn(m, H, generator=g) * 2).to(BF16)
    x8, xs = quant_act_per_token(h)
    ids, wts = routing(m, E, k, seed=m, kind=kind)
    out = emulate_megamoe(x8, xs, ids, wts, wt, rsf, bn)
    ref = moe_forward(h, ref_weights(w13, s13, w2, s2, E), cfg, ids, wts)
    assert_close(OP, out.float(), ref.float(), kind="fp8_same_quant", context=f"{m=} {kind=} {bn=}")


# =========================================== GPU ===========================================================

def _gpu_setup(e_local: int, shared: int, hidden: int = 6144, inter: int = 2048, seed: int = 0):
    w13, s13, w2, s2 = make_experts(e_local + shared, hidden, inter, seed, device="cuda")
    return (w13, s13, w2, s2), M.prepare_weights(w13, s13, w2, s2, shared)


def _lin_f64(x8, xs, w8, ws):
    """Block-FP8 linear with float64 accumulation: x8 [n, K] e4m3 + xs [n, K/128], w8 [N, K] + ws [N/128, K/128]
    -> fp32 [n, N] (one rounding, as the fp32 accumulators of the kernel up to summation order)."""
    g = x8.shape[1] // 128
    xg = x8.double().view(-1, g, 128)
    wg = w8.double().view(w8.shape[0], g, 128)
    part = torch.einsum("mgk,ngk->gmn", xg, wg)
    wsr = ws.double().repeat_interleave(128, 0)[: w8.shape[0]]
    return (part * xs.double().t()[:, :, None] * wsr.t()[:, None, :]).sum(0).float()


def _combine_slots(slots: torch.Tensor, rsf: float) -> torch.Tensor:
    """The combine: fp32 sum of the bf16 slots in slot order, times rsf, to bf16 (= the kernel's)."""
    acc = torch.zeros(slots.shape[0], slots.shape[2], dtype=torch.float32, device=slots.device)
    for j in range(slots.shape[1]):
        acc = acc + slots[:, j].float()
    return (acc * rsf).to(BF16)


def ref_pairs(h8, hs, ids, wts, raw, num_routed: int, shared: int, rsf: float, k_a8=None, k_as=None) -> dict:
    """ref.moe's math per pair (t, j) with float64 GEMM accumulation and the same bf16 / FP8 rounding
    points: a8 [m, S, I] + a_scale [m, S, I/128] (FC1 + SwiGLU + requant), slots [m, S, H] (bf16 routing-
    weighted FC2 output), out [m, H]; given the kernel's own FC1 output (k_a8, k_as [m, S, ...]) also
    slots_k: the reference FC2 applied to it (separates FC2 errors from FC1 ones)."""
    w13, s13, w2, s2 = raw
    m, k = ids.shape
    H = h8.shape[1]
    I = w2.shape[2]
    idsl = ids.long()
    if shared:
        idsl = torch.cat([idsl, torch.full((m, 1), num_routed, dtype=torch.long, device=ids.device)], 1)
        wts = torch.cat([wts, torch.full((m, 1), 1.0 / rsf, dtype=torch.float32, device=ids.device)], 1)
    S = idsl.shape[1]
    dev = h8.device
    slots = torch.zeros(m, S, H, dtype=BF16, device=dev)
    a8_all = torch.zeros(m, S, I, dtype=FP8, device=dev)
    as_all = torch.zeros(m, S, I // 128, dtype=torch.float32, device=dev)
    slots_k = torch.zeros(m, S, H, dtype=BF16, device=dev) if k_a8 is not None else None
    for e in torch.unique(idsl).tolist():
        tok, slot = (idsl == e).nonzero(as_tuple=True)
        gu = _lin_f64(h8[tok], hs[tok], w13[e], s13[e]).to(BF16)
        a = (torch.nn.functional.silu(gu[:, :I].float()) * gu[:, I:].float()).to(BF16)
        a8, a_s = quant_act_per_token(a)
        a8_all[tok, slot], as_all[tok, slot] = a8, a_s
        w = wts[tok, slot].unsqueeze(1)
        slots[tok, slot] = (_lin_f64(a8, a_s, w2[e], s2[e]) * w).to(BF16)
        if k_a8 is not None:
            slots_k[tok, slot] = (_lin_f64(k_a8[tok, slot], k_as[tok, slot], w2[e], s2[e]) * w).to(BF16)
    return {"a8": a8_all, "a_scale": as_all, "slots": slots, "slots_k": slots_k, "out": _combine_slots(slots, rsf)}


def ref_f64(h8, hs, ids, wts, raw, num_routed: int, shared: int, rsf: float) -> torch.Tensor:
    """ref.moe's math with float64 GEMM accumulation and the same bf16 / FP8 rounding points."""
    return ref_pairs(h8, hs, ids, wts, raw, num_routed, shared, rsf)["out"]


def _inputs(m: int, e_local: int, k: int, kind: str, seed: int, hidden: int = 6144):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(m, hidden, generator=g) * (1 + 3 * torch.rand(1, hidden, generator=g) ** 8)).to(BF16).cuda()
    x8, xs = quant_act_per_token(h)
    ids, wts = routing(m, e_local, k, seed, kind)
    return x8, xs, ids.cuda(), wts.cuda()


_WEIGHTS: dict = {}


def _weights(e_local: int):
    """GLM-5-sized experts (e_local routed + 1 shared), built once per process and kept (the tests
    alternate settings; 32 + 1: 2.1 GB, 256 + 1: 16.2 GB with the interleaved copy)."""
    if e_local not in _WEIGHTS:
        _WEIGHTS[e_local] = _gpu_setup(e_local, 1, seed=e_local)
    return _WEIGHTS[e_local]


@pytest.mark.gpu
@pytest.mark.parametrize("split_waves", [0, 4], ids=["whole-K", "split-K"])
def test_gpu_fc1_single_expert(split_waves):
    """Diagnostic first test: 1 routed expert (top-1, no shared), 8 tokens = 1 token block, FC1 only:
    the kernel's a8 rows and scales vs the reference's SwiGLU + 1x128 requant of the same FP8 GEMM.
    whole-K first (plain mainloop + epilogue), then split-K (two K halves + partial exchange)."""
    raw, wt = _gpu_setup(1, 0)
    m = 8
    x8, xs, _, _ = _inputs(m, 1, 1, "uniform", 3)
    ids = torch.zeros(m, 1, dtype=torch.int32, device="cuda")
    wts = torch.ones(m, 1, device="cuda")
    cfg = M.MegaMoEConfig(8, M.max_stages(8), 8, split_waves)
    got = M.fc1_only(x8, xs, ids, wts, wt, config=cfg)
    assert int(got["counts"][0]) == m
    w13, s13, _, _ = raw
    I = wt.inter
    # reference FC1 (fp32 GEMM, as ref.moe) and requant
    from glm5_fastpath.ref.fp8 import block_fp8_linear
    gu = block_fp8_linear(x8, xs, w13[0], s13[0]).to(BF16)
    a = (torch.nn.functional.silu(gu[:, :I].float()) * gu[:, I:].float()).to(BF16)
    a8, a_s = quant_act_per_token(a)
    assert_close(OP + " fc1 scales", got["a_scale"][:, 0], a_s, kind="fp8_same_quant")
    deq = got["a8"][:, 0].float().view(m, I // 128, 128) * got["a_scale"][:, 0, :, None]
    ref = a8.float().view(m, I // 128, 128) * a_s[:, :, None]
    assert_close(OP + " fc1 a8", deq.view(m, I), ref.view(m, I), kind="fp8_same_quant")


# ---- GPU diagnostics: one run localises a failure to FC1 / FC2 / combine / scheduling --------------------

def _stage(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> tuple[bool, str]:
    """One comparison stage: rel_err, max abs error, non-finite count with the first indices, and the
    4 worst elements (index, got, want). Prints one line; returns (ok, line)."""
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    bad = ~torch.isfinite(g)
    n_bad = int(bad.sum())
    gf = torch.where(bad, torch.zeros_like(g), g)
    d = (gf - w).abs()
    err = rel_err(gf, w)
    line = (f"{name}: rel_err={err:.3e} (tol {tol:.0e}) max_abs={d.max().item():.3e} "
            f"|want|max={w.abs().max().item():.3e} nonfinite={n_bad}")
    if n_bad:
        line += f" first nonfinite at {bad.nonzero()[:4].tolist()}"
    worst = d.flatten().topk(min(4, d.numel())).indices
    pts = []
    for f in worst.tolist():
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(f), tuple(g.shape)))
        pts.append(f"{list(idx)}: {g[idx].item():.4g} vs {w[idx].item():.4g}")
    line += " | worst " + "; ".join(pts)
    ok = n_bad == 0 and err <= tol
    print(("  ok   " if ok else "  FAIL ") + line)
    return ok, line


def _diagnose(label: str, x8, xs, ids, wts, raw, wt, num_routed: int, shared: int, rsf: float,
              cfg: M.MegaMoEConfig) -> None:
    """Two eager debug launches (no combine, then combine) with stages in data-flow order; prints every
    stage and fails naming the first failing one (the earliest broken piece)."""
    m, k = ids.shape
    H, I = wt.hidden, wt.inter
    tol = THRESHOLDS["fp8_same_quant"]
    results: list[tuple[bool, str]] = []

    def fact(name: str, ok: bool, detail: str) -> None:
        line = f"{name}: {detail}"
        print(("  ok   " if ok else "  FAIL ") + line)
        results.append((ok, line))

    d = M.debug_run(x8, xs, ids, wts, wt, config=cfg, routed_scaling_factor=rsf, combine=False)
    c = d["ctrl"]
    active = [(e, int(n)) for e, n in enumerate(d["counts"].tolist()) if n]
    print(f"\n[{label}] {cfg.name} m={m} k={k} shared={shared} grid={d['grid']} experts(count)={active} ctrl={c}")
    fact("counters, no combine", c["tasks_done"] == c["num_tasks"] and c["claims"] == c["num_tasks"] + d["grid"]
         and c["tiles_combined"] == 0 and d["combine_ctr_sum"] == 0,
         f"tasks finished {c['tasks_done']} of {c['num_tasks']}, claims {c['claims']} "
         f"(want {c['num_tasks'] + d['grid']}), "
         f"tiles combined {c['tiles_combined']} (want 0), combine_ctr sum {d['combine_ctr_sum']}")
    fd = d["fc1_done"]
    fact("fc1_done", bool((fd == I // 128).all()),
         f"{fd.tolist()[:16]}{' ...' if fd.numel() > 16 else ''} (want all {I // 128})")
    fact("out untouched without combine", bool(torch.isnan(d["out"].float()).all()), "out stays NaN (poison)")
    ref = ref_pairs(x8, xs, ids, wts, raw, num_routed, shared, rsf, k_a8=d["a8"], k_as=d["a_scale"])
    results.append(_stage("FC1 a_scale [t, j, I/128]", d["a_scale"], ref["a_scale"], tol))
    deq = lambda a8, sc: (a8.float().view(m, -1, I // 128, 128) * sc[..., None]).view(m, -1, I)  # noqa: E731
    results.append(_stage("FC1 a8 dequantised [t, j, I]", deq(d["a8"], d["a_scale"]), deq(ref["a8"], ref["a_scale"]),
                          tol))
    results.append(_stage("FC2 slots on the kernel's own FC1 output [t, j, H]", d["slots"].float(),
                          ref["slots_k"].float(), tol))
    results.append(_stage("FC2 slots vs reference [t, j, H]", d["slots"].float(), ref["slots"].float(), tol))
    if not results[-1][0]:  # which slots (experts) are wrong
        idsl = ids.long().cpu()
        for j in range(d["slots"].shape[1]):
            e = int(idsl[0, j]) if j < k else num_routed
            _stage(f"    slot {j} (token 0, expert {e})", d["slots"][:1, j].float(), ref["slots"][:1, j].float(), tol)

    d2 = M.debug_run(x8, xs, ids, wts, wt, config=cfg, routed_scaling_factor=rsf, combine=True)
    c2 = d2["ctrl"]
    fact("counters, combine", c2["tasks_done"] == c2["num_tasks"] and c2["tiles_combined"] == m * H // 256
         and d2["combine_ctr_sum"] == 0,
         f"tasks finished {c2['tasks_done']} of {c2['num_tasks']}, tiles combined {c2['tiles_combined']} "
         f"(want {m * H // 256}), combine_ctr sum {d2['combine_ctr_sum']} (want 0)")
    same = d2["slots"].view(torch.int16) == d["slots"].view(torch.int16)
    fact("slots identical in both runs", bool(same.all()), f"{int((~same).sum())} differing bf16 values")
    results.append(_stage("combine: out vs the combine of the kernel's own slots", d2["out"].float(),
                          _combine_slots(d2["slots"], rsf).float(), 1e-6))
    results.append(_stage("out vs reference [t, H]", d2["out"].float(), ref["out"].float(), tol))
    failed = [line for ok, line in results if not ok]
    assert not failed, f"[{label} {cfg.name}] first failing stage: {failed[0]}\n" + "\n".join(l for _, l in results)


_DIAG_WEIGHTS: dict = {}


def _diag_weights(e_local: int, shared: int):
    if (e_local, shared) not in _DIAG_WEIGHTS:
        _DIAG_WEIGHTS[(e_local, shared)] = _gpu_setup(e_local, shared, seed=100 + e_local)
    return _DIAG_WEIGHTS[(e_local, shared)]


@pytest.mark.gpu
@pytest.mark.parametrize("split_waves", [0, 4], ids=["whole-K", "split-K"])
def test_gpu_diag_1_one_expert_one_token(split_waves):
    """Diagnostic: 1 routed expert, top-1, no shared expert, 1 token (S = 1, 16 FC1 + 24 FC2 tasks):
    FC1 -> FC2 slot -> combine, stage by stage."""
    raw, wt = _diag_weights(1, 0)
    x8, xs, _, _ = _inputs(1, 1, 1, "uniform", 3)
    ids = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    wts = torch.full((1, 1), 0.75, device="cuda")
    cfg = M.MegaMoEConfig(8, M.max_stages(8), M.MAX_EXPERTS, split_waves)
    _diagnose("diag1 one expert, one token", x8, xs, ids, wts, raw, wt, 1, 0, 2.5, cfg)


@pytest.mark.gpu
def test_gpu_diag_2_m1_two_experts_and_shared():
    """Diagnostic: 1 token, top-2 over 2 routed experts + the shared expert (S = 3): several experts,
    pair rows at offsets 0 / 8 / 16, token blocks 0..2, a 3-way combine."""
    raw, wt = _diag_weights(2, 1)
    x8, xs, ids, wts = _inputs(1, 2, 2, "uniform", seed=1001)
    _diagnose("diag2 m=1 top-2 of 2 + shared", x8, xs, ids, wts, raw, wt, 2, 1, 2.5, M.default_config(1, 2, 2, 1))


@pytest.mark.gpu
def test_gpu_diag_3_m1_32_experts():
    """Diagnostic: the first case of test_gpu_vs_reference (m = 1, uniform, 32 local experts top-8 +
    shared, default config), stage by stage."""
    raw, wt = _weights(32)
    x8, xs, ids, wts = _inputs(1, 32, 8, "uniform", seed=1001)
    _diagnose("diag3 m=1 top-8 of 32 + shared", x8, xs, ids, wts, raw, wt, 32, 1, 2.5, M.default_config(1, 32, 8, 1))


def _split_of(cfg: M.MegaMoEConfig, ids, e_local: int, shared: int, num_sms: int) -> int:
    plan = M.plan_reference(ids, e_local, shared, cfg.block_n, cfg.group_size, 6144, 2048, fc1_only=True,
                            split_max_tiles=cfg.split_max_tiles(num_sms))
    return M.task_split_half(plan.tasks[0])[0]


def _other_config(cfg: M.MegaMoEConfig, ids, e_local: int, shared: int, num_sms: int) -> M.MegaMoEConfig | None:
    """Another token block (and group size 3) whose FC1 tiles are split-K exactly when cfg's are: the two
    K halves are summed as (a + b), not in one K sweep, so only then may the bits be compared."""
    want = _split_of(cfg, ids, e_local, shared, num_sms)
    for bn in (32, 8, 16, 64):
        if bn == cfg.block_n:
            continue
        c = M.MegaMoEConfig(bn, M.max_stages(bn), 3, cfg.split_waves if want else 0)
        if _split_of(c, ids, e_local, shared, num_sms) == want:
            return c
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("e_local", [32, 256])
@pytest.mark.parametrize("kind", ["uniform", "skewed"])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 33, 64, 128, 256, 1024])
def test_gpu_vs_reference(m, kind, e_local):
    raw, wt = _weights(e_local)
    k, rsf = 8, 2.5
    x8, xs, ids, wts = _inputs(m, e_local, k, kind, seed=1000 + m)
    cfg = M.default_config(m, e_local, k, 1)
    # Poison the workspace: every value the output depends on must be written in this call.
    ws = M.get_workspace(x8.device, wt.hidden, wt.inter, wt.num_total, k + 1, m)
    poison_(ws.act), poison_(ws.act_scale), poison_(ws.slots)
    out = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=cfg)
    ctrl = ws.ctrl.cpu().tolist()
    tiles = m * M.fc2_tiles(wt.hidden, cfg.block_n)
    assert ctrl[M.CTRL_TASKS_DONE] == ctrl[M.CTRL_NUM_TASKS] and ctrl[M.CTRL_TILES_COMBINED] == tiles, (
        f"{m=} {kind=} {e_local=} {cfg.name}: tasks finished {ctrl[M.CTRL_TASKS_DONE]} of {ctrl[M.CTRL_NUM_TASKS]}, "
        f"output tiles combined {ctrl[M.CTRL_TILES_COMBINED]} of {tiles} (ctrl {ctrl})")
    ref = ref_f64(x8, xs, ids, wts, raw, e_local, 1, rsf)
    assert_close(OP, out.float(), ref.float(), kind="fp8_same_quant", context=f"{m=} {kind=} {e_local=} {cfg.name}")
    assert int(ws.combine_ctr.abs().sum()) == 0, "combine counters must return to zero"
    # a second config (other token block, same FC1 K split) gives the same bits: columns are computed independently
    other = _other_config(cfg, ids, e_local, 1, M._sms(x8.device))
    if other is None:  # no block size with the same K split: the sums differ in order, compare numerically
        other = M.MegaMoEConfig(8 if cfg.block_n != 8 else 32, M.max_stages(8 if cfg.block_n != 8 else 32), 3)
        out2 = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=other)
        assert_close(OP, out2.float(), ref.float(), kind="fp8_same_quant",
                     context=f"{m=} {kind=} {e_local=} {other.name}")
    else:
        out2 = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=other)
        assert_equal(OP + " block size independence", out2, out, context=f"{m=} {cfg.name} vs {other.name}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 64, 256])
def test_gpu_repeats_bitwise(m):
    raw, wt = _weights(32)
    x8, xs, ids, wts = _inputs(m, 32, 8, "skewed", seed=7 + m)
    first = M.mega_moe(x8, xs, ids, wts, wt)
    for i in range(30):
        again = M.mega_moe(x8, xs, ids, wts, wt)
        assert_equal(OP + " repeat", again, first, context=f"{m=} run {i}")


@pytest.mark.gpu
def test_gpu_int64_ids_and_no_shared():
    raw, wt0 = _gpu_setup(16, 0, seed=3)
    x8, xs, ids, wts = _inputs(24, 16, 8, "uniform", seed=9)
    out32 = M.mega_moe(x8, xs, ids, wts, wt0)
    out64 = M.mega_moe(x8, xs, ids.long(), wts, wt0)
    assert_equal(OP + " int64 ids", out64, out32)
    ref = ref_f64(x8, xs, ids, wts, raw, 16, 0, 2.5)
    assert_close(OP + " no shared", out32.float(), ref.float(), kind="fp8_same_quant")


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    raw, wt = _weights(32)
    m = 16
    M.precompile(wt, topk=8, max_tokens=64)
    x8, xs, ids, wts = _inputs(m, 32, 8, "uniform", seed=21)
    sx8, sxs, sids, swts = x8.clone(), xs.clone(), ids.clone(), wts.clone()
    M.mega_moe(sx8, sxs, sids, swts, wt)  # warm-up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = M.mega_moe(sx8, sxs, sids, swts, wt)
    for seed in (22, 23, 24):
        nx8, nxs, nids, nwts = _inputs(m, 32, 8, "skewed" if seed % 2 else "uniform", seed=seed)
        sx8.copy_(nx8), sxs.copy_(nxs), sids.copy_(nids), swts.copy_(nwts)
        g.replay()
        torch.cuda.synchronize()
        eager = M.mega_moe(nx8, nxs, nids, nwts, wt)
        assert_equal(OP + " graph replay", out, eager, context=f"{seed=}")


def test_plan_reference_skips_padding_tokens():
    """A row whose first id is negative (SGLang's CUDA-graph padding mask) takes no pairs, not even the
    shared expert's; the other rows plan exactly as without the padding rows."""
    ids = torch.tensor([[0, 1], [-1, -1], [1, 2], [-1, -1]], dtype=torch.int32)
    p = M.plan_reference(ids, 3, 1, 8, 8, 256, 128)
    assert p.counts == [1, 2, 1, 2]  # expert 0, 1, 2, shared
    assert sorted(c >> 4 for e in range(4) for c in p.pairs[e]) == [0, 0, 0, 2, 2, 2]
    with pytest.raises(M.MegaMoEInputError, match=r"topk_ids\[0\]\[1\] = -1"):
        M.plan_reference(torch.tensor([[0, -1]], dtype=torch.int32), 3, 1, 8, 8, 256, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [5, 64, 300])  # 300: the token-major pool default with the end combine
def test_gpu_padding_rows_are_zero_and_the_rest_unchanged(m):
    """SGLang pads a decode batch to its CUDA-graph bucket and sets topk_ids of the padding rows to -1:
    those rows come out zero (the end combine skips them too), take no expert work, and the real rows are what they
    are alone (within FP8 noise: the real rows alone may take another token block)."""
    raw, wt = _weights(32)
    x8, xs, ids, wts = _inputs(m, 32, 8, "uniform", seed=50 + m)
    pad = torch.zeros(m, dtype=torch.bool, device=ids.device)
    pad[1::3] = True
    ids_p = ids.clone()
    ids_p[pad] = -1
    ws = M.get_workspace(x8.device, wt.hidden, wt.inter, wt.num_total, 9, m)
    out = M.mega_moe(x8, xs, ids_p, wts, wt)
    real = (~pad).nonzero().squeeze(1)
    alone = M.mega_moe(x8[real].contiguous(), xs[real].contiguous(), ids[real].contiguous(), wts[real].contiguous(), wt)
    assert int(out[pad].abs().float().sum()) == 0, "padding rows must be zero"
    assert_close(OP + " padded batch", out[real].float(), alone.float(), kind="fp8_same_quant")
    assert int(ws.combine_ctr.abs().sum()) == 0, "combine counters must return to zero"
    again = M.mega_moe(x8, xs, ids, wts, wt)  # and the next unpadded call is unaffected
    ref = ref_f64(x8, xs, ids, wts, raw, 32, 1, 2.5)
    assert_close(OP + " after padding", again.float(), ref.float(), kind="fp8_same_quant")


# ---- trace build ------------------------------------------------------------------------------------------

def test_trace_summary_from_synthetic_rows():
    """summarize_trace on hand-made rows (SM clock 2 GHz: cycles = 2 x ns): per-kind wait / MMA / epilogue sums
    from the cycle stamps, the fc1_done spin, the span (first claim -> last epilogue, global ns), the clock it
    calibrates, the math busy share and the tail; unwritten rows are ignored."""
    r = torch.zeros(2, 4, M.TRACE_COLS, dtype=torch.int64)
    fc1, fc2 = M.encode_task(0, 1, 0, 0), M.encode_task(1, 1, 0, 0)

    from glm5_fastpath.testing.megamoe_trace import put_trace_row as row  # ns; clocks at 2 cycles / ns
    row(r, 0, 0, 1000, 1100, 2100, 5100, 5600, fc1, stage_wait=500, producer_wait=100, loader_wait=50,
        phases=(5200, 5350, 5500), mma_wait=1200, fold=900)
    row(r, 0, 1, 1200, 5600, 6600, 8600, 9100, fc2, spin=(5000, 6000), phases=(8700, 8900, 0))
    row(r, 1, 0, 1050, 1150, 1650, 4650, 5150, fc1)
    r[1, 1, 0], r[1, 1, 7] = 1300, fc2  # claimed, never finished: not a task row
    s = M.summarize_trace(r)
    assert (s["fc2"]["epi_phase_tasks"], s["fc2"]["epi_slots_us"], s["fc2"]["epi_counters_us"],
            s["fc2"]["epi_combine_us"]) == (1, pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.2))
    assert "slot stores 0.10 us, combine counters 0.20, combine 0.20" in M.trace_markdown(s)
    r2 = r.clone()
    row(r2, 1, 1, 1300, 5650, 6150, 7150, 7650, fc2)
    assert M.summarize_trace(r2)["fc2"]["gap_us"] == pytest.approx(0.5)  # CTA 1 idle 5150 -> 5650 ns
    assert s["tasks"] == 3 and s["span_us"] == pytest.approx(8.1) and s["sm_ghz"] == pytest.approx(2.0)
    assert s["fc1"] == {"tasks": 2, "wait_us": pytest.approx(1.5), "mma_us": pytest.approx(6.0),
                        "epi_us": pytest.approx(1.0), "spin_us": 0.0, "spun_tasks": 0,
                        "claim_lead_us": pytest.approx(0.2), "gap_us": 0.0, "mma_stage_wait_us": pytest.approx(0.5),
                        "producer_wait_us": pytest.approx(0.1), "loader_wait_us": pytest.approx(0.05),
                        "mma_wgmma_wait_us": pytest.approx(1.2), "mma_fold_us": pytest.approx(0.9),
                        # the FC1 epilogue phases: only the task that stamped them (CTA 0's)
                        "epi_phase_tasks": 1, "epi_amax_us": pytest.approx(0.1), "epi_quant_us": pytest.approx(0.15),
                        "epi_store_us": pytest.approx(0.15), "epi_release_us": pytest.approx(0.1)}
    assert s["fc2"]["claim_lead_us"] == pytest.approx(4.4) and s["fc2"]["gap_us"] == 0.0  # back to back
    assert s["fc2"]["spin_us"] == pytest.approx(1.0) and s["fc2"]["spun_tasks"] == 1
    assert s["math_busy_share"] == pytest.approx(12.0 / (8.1 * 2))
    assert s["tail_us"] == pytest.approx(3.95)
    md = M.trace_markdown(s)
    assert "FC1 2 tasks" in md and "fc1_done spin 1.0 us over 1 tasks" in md
    assert "of which waiting for stages 6 %" in md and "weight producer 0.1 us, activation loader 0.1 us" in md
    assert "SwiGLU + amax 0.10 us, quant 0.15, a8 stores 0.15, release 0.10" in md
    assert "K loop: wgmma waits 14 %, fold issue 11 %" in md  # 1.2 / 0.9 us of the FC1 tasks' 8.5 us
    assert M.summarize_trace(torch.zeros(1, 2, M.TRACE_COLS, dtype=torch.int64)) == {"tasks": 0}
    zero = dict(s, fc1={"tasks": 1, "wait_us": 0.0, "mma_us": 0.0, "epi_us": 0.0, "spin_us": 0.0, "spun_tasks": 0})
    assert "FC1 1 tasks: first-stage wait 0 %" in M.trace_markdown(zero)  # no ZeroDivisionError


def test_trace_build_is_its_own_cubin():
    base = M.kernel_spec(6144, 2048, 64, M.max_stages(64))
    tr = M.trace_spec(6144, 2048, 64, M.max_stages(64))
    assert ("GLM5_MEGAMOE_TRACE", "1") in tr.defines and ("GLM5_MEGAMOE_TRACE", "1") not in base.defines
    assert M.TRACE_FUNCTION in tr.functions and M.PLAN_FUNCTION in tr.functions
    assert tr in M.compile_check_specs()


@pytest.mark.gpu
@pytest.mark.parametrize("m, wide", [(16, False), (256, False), (256, True), (256, "token_major")])
def test_gpu_trace_run_matches_the_normal_build(m, wide):
    """The trace build computes the same output bitwise as the normal build, and stamps every planned task
    exactly once (one finished row per task, math start <= first stage <= last fold <= epilogue end); also in the
    wide mode (two K loops per FC1 task)."""
    _, wt = _weights(32)
    x8, xs, ids, wts = _inputs(m, 32, 8, "uniform", 7)
    cfg = (M.MegaMoEConfig(128, M.max_stages(128), split_waves=0, lean_fences=True, token_major=wide == "token_major")
           if wide else M.default_config(m, 32, 8, 1))
    want = M.mega_moe(x8, xs, ids, wts, wt, config=cfg)
    got = M.trace_run(x8, xs, ids, wts, wt, config=cfg, cap=1024)
    torch.cuda.synchronize()
    assert_equal(OP + " trace build", got["out"], want)
    r = got["rows"]
    done = (r[..., 3] > 0) & (r[..., 6] > 0) & (r[..., 8] > 0) & (r[..., 9] > 0)
    ws = M.workspace_for("cuda", wt, 8)
    assert int(done.sum()) == int(ws.ctrl[M.CTRL_NUM_TASKS])
    d = r[done]
    assert bool(((d[:, 4] >= d[:, 3]) & (d[:, 5] >= d[:, 4]) & (d[:, 6] >= d[:, 5]) & (d[:, 9] >= d[:, 8])).all())
    # the K loop's parts (stage waits, wgmma waits, fold issue: columns 10 / 16 / 17) fit inside its span; every task
    # folds at least one stage
    assert bool((d[:, 17] > 0).all()) and bool((d[:, 16] >= 0).all())
    assert bool((d[:, 10] + d[:, 16] + d[:, 17] <= d[:, 5] - d[:, 4]).all())
    gt = torch.sort(torch.unique(torch.cat([d[:, 8], d[:, 9]]))).values
    print(f"smallest %globaltimer step seen: {int((gt[1:] - gt[:-1]).min()) if gt.numel() > 1 else '-'} ns")
    s = got["summary"]
    assert s["tasks"] == int(done.sum()) and 0 < s["math_busy_share"] <= 1.0
    # the plan kernel's phase stamps: every phase stamped, in order, the body a few us at most
    plan = s["plan"]
    assert all(plan[n + "_us"] >= 0 for n in M.PLAN_PHASES) and 0 < plan["body_us"] < 1000
    print(M.trace_markdown(s))


def test_plan_phases_from_synthetic_ctrl_words():
    """plan_phases turns the trace build's ctrl stamps (start global timer, then cumulative cycles per phase) into
    per-phase us at the given SM clock, and the plan start -> first task claim from the rows' claim stamps (low 32 bits
    of the global timer, wrap-safe)."""
    ctrl = [0] * M.CTRL_WORDS
    start = (1 << 32) - 500  # the low word wraps between the plan start and the first claim
    ctrl[M.CTRL_PLAN_STAMPS] = start - (1 << 32)  # stored as int32
    cum = [100 * (i + 1) for i in range(len(M.PLAN_PHASES))]
    ctrl[M.CTRL_PLAN_STAMPS + 1:M.CTRL_PLAN_STAMPS + 1 + len(cum)] = cum
    rows = torch.zeros((2, 3, M.TRACE_COLS), dtype=torch.int64)
    rows[0, 0, 0] = (7 << 32) + 1500  # claim 2000 ns after the start (across the wrap)
    rows[1, 0, 0] = (7 << 32) + 2500
    out = M.plan_phases(ctrl, rows, ghz=2.0)
    assert out["zero_us"] == pytest.approx(0.05) and out["stores_us"] == pytest.approx(0.05)
    assert out["body_us"] == pytest.approx(100 * len(M.PLAN_PHASES) / 2e3)
    assert out["start_to_first_claim_us"] == pytest.approx(2.0)
    assert M.plan_phases([0] * M.CTRL_WORDS, rows, 2.0) == {}  # not a trace-build launch: nothing stamped
    assert "plan body" in M.trace_markdown({"tasks": 1, "span_us": 1.0, "plan": out})


def test_default_config_takes_the_lean_fences_build():
    for m, experts in ((1, 256), (8, 32), (128, 256), (4096, 32)):
        assert M.default_config(m, experts, 8, 1).lean_fences is True
        assert "_lf" in M.default_config(m, experts, 8, 1).name


def test_default_config_takes_the_token_major_pool_block_from_the_threshold_load():
    """bn64 + token pool + token-major once the expected largest routed expert reaches TOKEN_MAJOR_POOL_MIN_LOAD
    (setting (a), 32 experts: from ~192 tokens; (b) 256 experts: from ~1536; session 14: 4-15 % less time than plain
    bn64 and the wide token-major pool build at (a) 256-4096 and (b) 2048 / 4096, 3-5 % more than bn64 at (b) 1024);
    plain blocks below it; the shared expert's load does not count."""
    for m, experts, tm in ((128, 32, False), (256, 32, True), (512, 32, True), (1024, 32, True), (4096, 32, True),
                           (1024, 256, False), (2048, 256, True), (4096, 256, True)):
        c = M.default_config(m, experts, 8, 1)
        assert (M.expected_max_load(m, experts, 8) >= M.TOKEN_MAJOR_POOL_MIN_LOAD) == tm
        if tm:
            assert (c.block_n, c.pool, c.split_waves, c.lean_fences, c.token_major, c.end_combine) == (
                64, True, 0, True, True, True)
            assert c.name == f"bn64_s{M.max_stages(64)}_g{M.MAX_EXPERTS}_w0_lf_p_t_e"
        else:
            assert c.block_n <= 64 and not c.pool and not c.token_major and not c.end_combine
        assert M.default_config(m, experts, 8, 0) == c  # the same block with or without the shared expert


def test_pair_config_name_spec_grid_and_validation():
    c = M.MegaMoEConfig(8, M.max_stages(8, True), M.MAX_EXPERTS, 4, lean_fences=True, pair=True).validate()
    assert c.name == "bn8_s6_g512_w4_lf_c" and M.MegaMoEConfig.from_name(c.name) == c
    assert M.MegaMoEConfig.from_name("bn16_c").stages == M.max_stages(16, True)
    assert ("GLM5_MEGAMOE_PAIR", "1") in c.spec(6144, 2048).defines
    assert all(k != "GLM5_MEGAMOE_PAIR" for k, _ in M.MegaMoEConfig(8, 6).spec(6144, 2048).defines)
    assert c.smem == M.smem_bytes(8, c.stages, True) > M.smem_bytes(8, c.stages)
    assert (c.grid(132), c.grid(133), M.MegaMoEConfig(8, 6).grid(133)) == (132, 132, 133)  # whole clusters of two
    for bad, match in [(dict(block_n=32, stages=4), "block_n <= 16"), (dict(pool=True), "pool"),
                       (dict(block_n=16, stages=8), "shared memory")]:
        with pytest.raises(M.MegaMoEInputError, match=match):
            dataclasses.replace(c, **bad).validate()
    from glm5_fastpath.moe import overlap
    from glm5_fastpath.ops.moe_router import RouterConfig
    rc = RouterConfig(hidden=6144, experts=256, topk=8)
    assert overlap.supported(1, rc, dataclasses.replace(c, pair=False), 1)
    assert not overlap.supported(1, rc, c, 1)  # the overlap's launches are not clusters


@pytest.mark.parametrize("m, e, shared, bn, group", [(1, 32, 1, 8, 512), (1, 256, 1, 8, 512), (3, 32, 1, 8, 4),
                                                     (5, 256, 1, 16, 8), (2, 7, 0, 8, 2)])
def test_plan_lists_split_halves_at_even_positions(m, e, shared, bn, group):
    """The CTA-pair build's premise (megamoe.cuh kPair): a split-K FC1 tile's halves sit at (even, odd) positions of the
    task list, so a cluster's claim (two entries from an even index) holds both."""
    ids, _ = routing(m, e, min(8, e), seed=m + e)
    for H, I in [(6144, 2048), (512, 128)]:
        p = M.plan_reference(ids, e, shared, bn, group, H, I, split_max_tiles=10_000)
        halves = [(pos, d) for pos, d in enumerate(p.tasks) if M.task_split_half(d) == (1, 0)]
        assert halves
        for pos, d in halves:
            assert pos % 2 == 0 and p.tasks[pos + 1] == d | (1 << 14), (H, pos)


def test_lean_fences_config_name_and_spec():
    c = M.MegaMoEConfig(8, M.max_stages(8), M.MAX_EXPERTS, 4, lean_fences=True)
    assert c.name.endswith("_lf") and M.MegaMoEConfig.from_name(c.name) == c
    assert M.MegaMoEConfig.from_name("bn8").lean_fences is False
    assert ("GLM5_MEGAMOE_LEAN_FENCES", "1") in c.spec(6144, 2048).defines
    base = M.MegaMoEConfig(8, M.max_stages(8)).spec(6144, 2048)
    assert all(k != "GLM5_MEGAMOE_LEAN_FENCES" for k, _ in base.defines)  # the default build's key is unchanged


@pytest.mark.gpu
@pytest.mark.parametrize("m, experts, kind", [(1, 256, "uniform"), (3, 32, "uniform"), (8, 256, "uniform"),
                                              (16, 32, "skewed"), (33, 32, "uniform")])
def test_gpu_lean_fences_equal_the_default_build_bitwise_over_many_launches(m, experts, kind):
    """The lean-fences build (no per-thread fence.gpu on the split-K / fc1_done / combine hand-offs) gives the
    default build's output bit for bit, launch after launch (a missing ordering would show as a differing launch:
    a stale partial, FC2 input or slot value), at sizes with split-K FC1 tiles and with several token blocks.
    Passing is evidence, not proof: ordering bugs are rarely observable; the argument is megamoe.cuh's memory-model
    note."""
    _, wt = _weights(experts)
    x8, xs, ids, wts = _inputs(m, experts, 8, kind, 11 + m)
    cfg = dataclasses.replace(M.default_config(m, experts, 8, 1), lean_fences=False)  # the fenced build
    lean = dataclasses.replace(cfg, lean_fences=True)
    want = M.mega_moe(x8, xs, ids, wts, wt, config=cfg)
    torch.cuda.synchronize()
    for i in range(40):
        got = M.mega_moe(x8, xs, ids, wts, wt, config=lean)
        torch.cuda.synchronize()
        assert_equal(OP + f" lean fences launch {i}", got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m, experts, kind, bn", [(1, 256, "uniform", 8), (2, 256, "uniform", 8), (3, 32, "uniform", 8),
                                                  (5, 256, "skewed", 8), (8, 256, "uniform", 8), (16, 32, "skewed", 16),
                                                  (16, 256, "uniform", 16), (33, 32, "uniform", 16)])
def test_gpu_pair_equals_the_unpaired_build_bitwise_over_many_launches(m, experts, kind, bn):
    """The CTA-pair build (clusters of two claiming two entries; split-K halves handed over through DSMEM) gives the
    unpaired build's output bit for bit, launch after launch, with split-K FC1 tiles (split_waves 4) and without
    (33 tokens: more tiles than 4 waves), and returns every counter to rest."""
    _, wt = _weights(experts)
    x8, xs, ids, wts = _inputs(m, experts, 8, kind, 31 + m)
    cfg = M.MegaMoEConfig(bn, M.max_stages(bn, True), M.MAX_EXPERTS, 4, lean_fences=True)
    paired = dataclasses.replace(cfg, pair=True)
    want = M.mega_moe(x8, xs, ids, wts, wt, config=cfg)
    torch.cuda.synchronize()
    for i in range(25):
        got = M.mega_moe(x8, xs, ids, wts, wt, config=paired)
        torch.cuda.synchronize()
        assert_equal(OP + f" pair launch {i}", got, want)
    d = M.debug_run(x8, xs, ids, wts, wt, config=paired)
    assert_equal(OP + " pair debug_run", d["out"], want)
    assert d["ctrl"]["tasks_done"] == d["ctrl"]["num_tasks"] and d["combine_ctr_sum"] == 0, d["ctrl"]
    # each cluster claims two entries at a time and stops after its claim that reaches the end (c + 2 >= num_tasks):
    # the claims below num_tasks - 2, then one final claim per cluster
    n = d["ctrl"]["num_tasks"]
    assert d["grid"] % 2 == 0 and d["ctrl"]["claims"] == 2 * (-(-max(n - 2, 0) // 2) + d["grid"] // 2), d["ctrl"]


@pytest.mark.gpu
def test_gpu_pair_cuda_graph_replay():
    """The pair build under graph replay (its cluster launch captured), fresh routing each replay."""
    _, wt = _weights(256)
    cfg = M.MegaMoEConfig(8, M.max_stages(8, True), M.MAX_EXPERTS, 4, lean_fences=True, pair=True)
    x8, xs, ids, wts = _inputs(1, 256, 8, "uniform", seed=41)
    sx8, sxs, sids, swts = x8.clone(), xs.clone(), ids.clone(), wts.clone()
    M.mega_moe(sx8, sxs, sids, swts, wt, config=cfg)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = M.mega_moe(sx8, sxs, sids, swts, wt, config=cfg)
    for seed in (42, 43, 44):
        nx8, nxs, nids, nwts = _inputs(1, 256, 8, "uniform", seed=seed)
        sx8.copy_(nx8), sxs.copy_(nxs), sids.copy_(nids), swts.copy_(nwts)
        g.replay()
        torch.cuda.synchronize()
        want = M.mega_moe(nx8, nxs, nids, nwts, wt, config=dataclasses.replace(cfg, pair=False))
        assert_equal(OP + " pair graph replay", out, want, context=f"{seed=}")


# ---- the wide mode (block_n 128: 128-row tiles, two-pass FC1 tasks) ------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("e_local", [32, 256])
@pytest.mark.parametrize("kind", ["uniform", "skewed"])
@pytest.mark.parametrize("m", [1, 3, 33, 128, 256, 1024, 4096])
def test_gpu_wide_mode_equals_bn64_bitwise(m, kind, e_local):
    """bn128 (128-row wgmma tiles, FC1 as two 128-row passes with the first pass's SwiGLU output stashed in shared
    memory, 128-row FC2 tiles and combine counters) computes every column exactly as bn64 does (same per-column K
    sums, same SwiGLU / quant / combine order), so the outputs, the FC1 activations and the slot values must be
    identical bit for bit; the workspace is poisoned first, the counters must end at zero, the diagnostics counters
    must show every planned task finished and M * H / 128 output tiles combined, and the output must match the
    float64 reference within FP8 noise."""
    raw, wt = _weights(e_local)
    k, rsf = 8, 2.5
    x8, xs, ids, wts = _inputs(m, e_local, k, kind, seed=3000 + m)
    narrow = M.MegaMoEConfig(64, M.max_stages(64), split_waves=0, lean_fences=True)
    wide = M.MegaMoEConfig(128, M.max_stages(128), split_waves=0, lean_fences=True)
    want = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=narrow)
    per_narrow = M.debug_run(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=narrow)
    ws = M.get_workspace(x8.device, wt.hidden, wt.inter, wt.num_total, k + 1, m)
    poison_(ws.act), poison_(ws.act_scale), poison_(ws.slots)
    got = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=wide)
    ctrl = ws.ctrl.cpu().tolist()
    tiles = m * M.fc2_tiles(wt.hidden, 128)
    assert tiles == m * wt.hidden // 128
    assert ctrl[M.CTRL_TASKS_DONE] == ctrl[M.CTRL_NUM_TASKS] and ctrl[M.CTRL_TILES_COMBINED] == tiles, (m, kind, ctrl)
    assert int(ws.combine_ctr.abs().sum()) == 0, "combine counters must return to zero"
    assert_equal(OP + " wide vs bn64", got, want, context=f"{m=} {kind=} {e_local=}")
    per_wide = M.debug_run(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=wide)
    for key in ("a8", "a_scale", "slots"):
        assert_equal(OP + f" wide vs bn64 {key}", per_wide[key], per_narrow[key], context=f"{m=} {kind=}")
    if m <= 1024:
        ref = ref_f64(x8, xs, ids, wts, raw, e_local, 1, rsf)
        assert_close(OP, got.float(), ref.float(), kind="fp8_same_quant", context=f"{m=} {kind=} {e_local=} bn128")
    for i in range(5):  # repeat: races would show as differing launches
        again = M.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=rsf, config=wide)
        assert_equal(OP + f" wide repeat {i}", again, got, context=f"{m=} {kind=}")


# ---- the token pool (pool): dispatch copy + one TMA box of activations per stage -----------------------------

def test_pool_config_name_and_spec():
    c = M.MegaMoEConfig(64, M.max_stages(64), M.MAX_EXPERTS, 0, lean_fences=True, pool=True)
    assert c.name == "bn64_s5_g512_w0_lf_p" and M.MegaMoEConfig.from_name(c.name) == c
    assert ("GLM5_MEGAMOE_POOL", "1") in c.spec(6144, 2048).defines
    assert all(k != "GLM5_MEGAMOE_POOL" for k, _ in M.MegaMoEConfig(64, 5).spec(6144, 2048).defines)
    assert M.MegaMoEConfig.from_name("bn64").pool is False
    assert any(("GLM5_MEGAMOE_POOL", "1") in s.defines for s in M.compile_check_specs())


@pytest.mark.gpu
@pytest.mark.parametrize("bn, split", [(16, 4), (64, 0), (128, 0)])
@pytest.mark.parametrize("m, e_local, kind", [(1, 32, "uniform"), (3, 256, "uniform"), (40, 32, "skewed"),
                                              (256, 32, "uniform"), (1024, 32, "skewed"), (1024, 256, "uniform")])
def test_gpu_pool_equals_cp_async_bitwise(m, e_local, kind, bn, split):
    """The pool build (every pair's token row copied into an expert-grouped pool, then one TMA box per stage for FC1
    and FC2 activations) lands the same bytes in the same swizzled places as the cp.async gathers, so the outputs and
    every intermediate (FC1 activations and scales, slot values) are identical bit for bit; launched several times (a
    missing fence on the pool or FC1 -> FC2 hand-offs would show as stale inputs in some launch)."""
    _, wt = _weights(e_local)
    x8, xs, ids, wts = _inputs(m, e_local, 8, kind, seed=5000 + m + bn)
    base = M.MegaMoEConfig(bn, M.max_stages(bn), split_waves=split, lean_fences=True)
    tma = dataclasses.replace(base, pool=True)
    want = M.debug_run(x8, xs, ids, wts, wt, config=base)
    got = M.debug_run(x8, xs, ids, wts, wt, config=tma)
    for key in ("a8", "a_scale", "slots", "out"):
        assert_equal(OP + f" pool {key}", got[key], want[key], context=f"{m=} {e_local=} {kind=} {bn=}")
    assert got["combine_ctr_sum"] == 0 and got["ctrl"]["tasks_done"] == got["ctrl"]["num_tasks"]
    # every copy warp of the grid (loaders and math warps) copied its share, over exactly the plan's (8-aligned) pair rows
    plan = M.plan_reference(ids, e_local, 1, bn, base.group_size, 6144, 2048)
    assert got["ctrl"]["pool_done"] == got["grid"] * M.POOL_COPY_WARPS and got["ctrl"]["pool_rows"] == plan.total_rows, got["ctrl"]
    for i in range(10):
        again = M.mega_moe(x8, xs, ids, wts, wt, config=tma)
        assert_equal(OP + f" pool launch {i}", again, want["out"], context=f"{m=} {bn=}")


def test_pool_is_allocated_only_for_pool_configs():
    """The token pool (pairs_cap x H bytes) is not part of the workspace until a pool config needs it."""
    dev = torch.device("meta")
    ws = M._alloc_workspace(M.WorkspaceShape(512, 128, 9, 4, 64), dev)
    assert ws.pool.shape[0] == 0 and ws.pool_scale.shape[1] == 0
    M._ensure_pool(ws)
    assert tuple(ws.pool.shape) == (ws.shape.pairs_cap, 512) and tuple(ws.pool_scale.shape) == (4, ws.shape.pairs_cap)


# ---- the token-major wide build (tokens on the wgmma's M side) ------------------------------------------------

def test_token_major_config_name_spec_and_validation():
    c = M.MegaMoEConfig(128, M.max_stages(128), M.MAX_EXPERTS, 0, lean_fences=True, pool=True, token_major=True)
    assert c.name == "bn128_s6_g512_w0_lf_p_t" and M.MegaMoEConfig.from_name(c.name) == c
    assert M.MegaMoEConfig.from_name("bn128_s6_g512_w0_lf_t_d4") == dataclasses.replace(c, pool=False, diag=4)
    assert ("GLM5_MEGAMOE_TOKEN_MAJOR", "1") in c.spec(6144, 2048).defines
    assert all(k != "GLM5_MEGAMOE_TOKEN_MAJOR" for k, _ in dataclasses.replace(c, token_major=False).spec(6144, 2048).defines)
    assert M.MegaMoEConfig.from_name("bn128").token_major is False
    with pytest.raises(M.MegaMoEInputError, match="token_major"):
        M.MegaMoEConfig(32, M.max_stages(32), token_major=True).validate()
    with pytest.raises(M.MegaMoEInputError, match="token_major"):
        M.MegaMoEConfig.from_name("bn16_t")
    assert M.MegaMoEConfig.from_name("bn64_s5_g512_w0_lf_t").token_major  # the narrow token-major build
    assert any(("GLM5_MEGAMOE_TOKEN_MAJOR", "1") in s.defines for s in M.compile_check_specs())
    # its own trace build too
    assert ("GLM5_MEGAMOE_TOKEN_MAJOR", "1") in M.trace_spec(6144, 2048, 128, 6, True, True, 0, True).defines


@pytest.mark.gpu
@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("m, e_local, kind", [(1, 32, "uniform"), (3, 256, "uniform"), (33, 32, "skewed"),
                                              (128, 256, "skewed"), (256, 32, "uniform"), (1024, 32, "skewed"),
                                              (1024, 256, "uniform"), (4096, 32, "uniform")])
def test_gpu_token_major_equals_the_wide_build_bitwise(m, e_local, kind, pool, bn):
    """The token-major wide build computes the same per-(token, channel) K sums with the same products of scales
    (x_scale * w_scale), the same SwiGLU, amax (a max), quant and combine order as the swapAB wide build, so every
    intermediate (FC1 activations and scales, slot values) and the output must be identical bit for bit; the
    workspace is poisoned first (debug_run), every task must finish, the counters end at zero, the output matches the
    float64 reference within FP8 noise, and repeated launches agree."""
    raw, wt = _weights(e_local)
    x8, xs, ids, wts = _inputs(m, e_local, 8, kind, seed=8000 + m)
    base = M.MegaMoEConfig(bn, M.max_stages(bn), split_waves=0, lean_fences=True, pool=pool)
    tm = dataclasses.replace(base, token_major=True)
    got = M.debug_run(x8, xs, ids, wts, wt, config=tm)
    assert got["combine_ctr_sum"] == 0 and got["ctrl"]["tasks_done"] == got["ctrl"]["num_tasks"], got["ctrl"]
    # every (token, FC2 row tile) combined exactly once: 128-row tiles in the wide block, 256-row tiles in the narrow one
    fc2_rows = 128 if bn == M.WIDE_BN else 256
    assert got["ctrl"]["tiles_combined"] == m * wt.hidden // fc2_rows, got["ctrl"]
    if m <= 1024:
        ref = ref_f64(x8, xs, ids, wts, raw, e_local, 1, 2.5)
        assert_close(OP, got["out"].float(), ref.float(), kind="fp8_same_quant", context=f"{m=} {kind=} {e_local=} tm")
    want = M.debug_run(x8, xs, ids, wts, wt, config=base)
    for key in ("a8", "a_scale", "slots", "out"):
        assert_equal(OP + f" token-major {key}", got[key], want[key], context=f"{m=} {e_local=} {kind=} {pool=} {bn=}")
    for i in range(5):  # repeat: races would show as differing launches
        again = M.mega_moe(x8, xs, ids, wts, wt, config=tm)
        assert_equal(OP + f" token-major launch {i}", again, want["out"], context=f"{m=} {pool=}")


# ---- the end combine (one grid-wide combine pass after the last task; pool builds) ------------------------------

def test_end_combine_config_name_and_validation():
    c = M.MegaMoEConfig(64, M.max_stages(64), M.MAX_EXPERTS, 0, lean_fences=True, pool=True, token_major=True,
                        end_combine=True)
    assert c.name == "bn64_s5_g512_w0_lf_p_t_e" and M.MegaMoEConfig.from_name(c.name) == c
    assert M.MegaMoEConfig.from_name("bn16_s6_g512_w4_lf_p_e_d3") == M.MegaMoEConfig(16, 6, M.MAX_EXPERTS, 4, True, True,
                                                                                      3, False, True)
    # a runtime flag: the same cubin as without it
    assert c.spec(6144, 2048) == dataclasses.replace(c, end_combine=False).spec(6144, 2048)
    with pytest.raises(M.MegaMoEInputError, match="end_combine needs the token pool"):
        M.MegaMoEConfig(64, 5, end_combine=True).validate()
    with pytest.raises(M.MegaMoEInputError, match="end_combine needs the token pool"):
        M.MegaMoEConfig.from_name("bn64_s5_g512_w0_lf_e")
    # default_config: with the token-major pool block only (from TOKEN_MAJOR_POOL_MIN_LOAD)
    assert [M.default_config(m, 32, 8, 1).end_combine for m in (1, 64, 128, 256, 4096)] == [False] * 3 + [True] * 2


def test_op_refuses_end_combine_without_the_pool():
    """The custom op validates end_combine like the other config fields, before anything compiles (the fake too)."""
    d = _meta_inputs()
    with pytest.raises(M.MegaMoEInputError, match="end_combine"):
        torch.ops.glm5_fastpath.mega_moe(d["x"], d["x_scale"], d["topk_ids"], d["topk_weights"], d["w13"],
                                         d["w13_scale"], d["w2"], d["w2_scale"], 1, 2.5, 64, 5, M.MAX_EXPERTS, 0, True,
                                         True, False, 0, False, True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bn64_s5_g512_w0_lf_p_t", "bn64_s5_g512_w0_lf_p", "bn128_s6_g512_w0_lf_p_t",
                                  "bn16_s6_g512_w4_lf_p"])
@pytest.mark.parametrize("m, e_local, kind", [(1, 32, "uniform"), (3, 256, "uniform"), (33, 32, "skewed"),
                                              (256, 32, "uniform"), (1024, 256, "skewed"), (4096, 32, "uniform")])
def test_gpu_end_combine_equals_the_per_task_combine_bitwise(m, e_local, kind, name):
    """The end combine sums the same bf16 slot values in the same slot order with the same fp32 arithmetic as the
    per-task last-contributor combine, so the outputs must be identical bit for bit; the output is poisoned first
    (debug_run), every (token, row tile) is combined exactly once, every CTA counted itself done, the per-task
    combine counters stay at zero, and repeated launches agree (a missing release / acquire around the grid-wide
    count would show as stale slot values in some launch)."""
    _, wt = _weights(e_local)
    x8, xs, ids, wts = _inputs(m, e_local, 8, kind, seed=9100 + m)
    base = M.MegaMoEConfig.from_name(name)
    end = dataclasses.replace(base, end_combine=True)
    want = M.debug_run(x8, xs, ids, wts, wt, config=base)
    got = M.debug_run(x8, xs, ids, wts, wt, config=end)
    c = got["ctrl"]
    assert c["tasks_done"] == c["num_tasks"] and c["end_done"] == got["grid"] and got["combine_ctr_sum"] == 0, c
    assert c["tiles_combined"] == m * wt.hidden // M.stage_rows(base.block_n), c
    for key in ("slots", "out"):
        assert_equal(OP + f" end combine {key}", got[key], want[key], context=f"{m=} {e_local=} {kind=} {name}")
    for i in range(5):
        again = M.mega_moe(x8, xs, ids, wts, wt, config=end)
        assert_equal(OP + f" end combine launch {i}", again, want["out"], context=f"{m=} {name}")


@pytest.mark.gpu
def test_gpu_end_combine_cuda_graph_replay():
    """The grid-wide done count (ctrl[6]) is zeroed by the plan kernel of every launch: graph replays with changing
    inputs keep matching eager launches (a count left over from the previous replay would let the combine start
    before the slot values are there)."""
    _, wt = _weights(32)
    m = 200
    cfg = M.MegaMoEConfig.from_name("bn64_s5_g512_w0_lf_p_t_e")
    M.precompile(wt, topk=8, max_tokens=256, configs=[cfg])
    x8, xs, ids, wts = _inputs(m, 32, 8, "uniform", seed=31)
    sx8, sxs, sids, swts = x8.clone(), xs.clone(), ids.clone(), wts.clone()
    M.mega_moe(sx8, sxs, sids, swts, wt, config=cfg)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = M.mega_moe(sx8, sxs, sids, swts, wt, config=cfg)
    for seed in range(32, 38):
        nx8, nxs, nids, nwts = _inputs(m, 32, 8, "skewed" if seed % 2 else "uniform", seed=seed)
        sx8.copy_(nx8), sxs.copy_(nxs), sids.copy_(nids), swts.copy_(nwts)
        g.replay()
        torch.cuda.synchronize()
        eager = M.mega_moe(nx8, nxs, nids, nwts, wt, config=dataclasses.replace(cfg, end_combine=False))
        assert_equal(OP + " end combine graph replay", out, eager, context=f"{seed=}")


# ---- diagnostic builds (diag: parts of the kernel removed, for timing only) -----------------------------------

def test_diag_config_name_spec_and_validation():
    c = M.MegaMoEConfig(64, M.max_stages(64), M.MAX_EXPERTS, 0, lean_fences=True, diag=3)
    assert c.name == "bn64_s5_g512_w0_lf_d3" and M.MegaMoEConfig.from_name(c.name) == c
    assert ("GLM5_MEGAMOE_DIAG", "3") in c.spec(6144, 2048).defines
    assert all(k != "GLM5_MEGAMOE_DIAG" for k, _ in M.MegaMoEConfig(64, 5).spec(6144, 2048).defines)
    assert M.MegaMoEConfig.from_name("bn128_s6_g512_w0_lf_p_d7").diag == 7
    with pytest.raises(M.MegaMoEInputError, match="diag"):
        M.MegaMoEConfig(64, 5, diag=8).validate()
    assert all(M.default_config(m, 32, 8, 1).diag == 0 for m in (1, 64, 4096))


@pytest.mark.gpu
@pytest.mark.parametrize("bn, split", [(16, 4), (64, 0), (128, 0)])
@pytest.mark.parametrize("diag", [1, 3, 7])
@pytest.mark.parametrize("m", [3, 1024])
def test_gpu_diag_builds_run_every_task(m, diag, bn, split):
    """A diagnostic build computes nothing meaningful, but it must run the whole schedule: every planned task
    finishes (no lost fc1_done release, no stage barrier left waiting), launch after launch."""
    _, wt = _weights(32)
    x8, xs, ids, wts = _inputs(m, 32, 8, "uniform", seed=7000 + m)
    cfg = M.MegaMoEConfig(bn, M.max_stages(bn), split_waves=split, lean_fences=True, diag=diag)
    for _ in range(3):
        got = M.debug_run(x8, xs, ids, wts, wt, config=cfg)
        c = got["ctrl"]
        assert c["tasks_done"] == c["num_tasks"] > 0 and c["claims"] == c["num_tasks"] + got["grid"], (m, diag, bn, c)


def test_wide_mode_hidden_size_limit_is_checked_on_the_host():
    """The wide build's FC2 row tiles are 128 rows: H / 128 must fit the descriptor's 6-bit field (H <= 8064)."""
    w13, s13, w2, s2 = make_experts(3, 8192, 128, 0)
    x8, xs = quant_act_per_token(torch.randn(2, 8192).to(BF16))
    ids = torch.zeros(2, 1, dtype=torch.int32)
    wts = torch.ones(2, 1)
    with pytest.raises(M.MegaMoEInputError, match="row tiles"):
        M._check_inputs(x8, xs, ids, wts, w13, s13, w2, s2, 1, 2.5, 128, M.max_stages(128), 8)
    M._check_inputs(x8, xs, ids, wts, w13, s13, w2, s2, 1, 2.5, 64, M.max_stages(64), 8)  # 256-row tiles: 32 fit


# ---- the plan's task phase over a compact active-expert list (GLM5_FASTPATH_MOE_PLAN_ACTIVE) --------------------

def test_plan_active_spec_define(monkeypatch):
    """The opt-in build carries GLM5_MEGAMOE_PLAN_ACTIVE; without it (and for EP builds) the key is unchanged."""
    monkeypatch.delenv("GLM5_FASTPATH_MOE_PLAN_ACTIVE", raising=False)
    cfg = M.MegaMoEConfig(8, M.max_stages(8))
    base = cfg.spec(6144, 2048)
    assert all(k != "GLM5_MEGAMOE_PLAN_ACTIVE" for k, _ in base.defines)
    assert ("GLM5_MEGAMOE_PLAN_ACTIVE", "1") in M.kernel_spec(6144, 2048, 8, M.max_stages(8), plan_active=True).defines
    monkeypatch.setenv("GLM5_FASTPATH_MOE_PLAN_ACTIVE", "1")
    on = cfg.spec(6144, 2048)
    assert ("GLM5_MEGAMOE_PLAN_ACTIVE", "1") in on.defines and on != base
    pool = M.MegaMoEConfig(64, M.max_stages(64), pool=True)
    assert all(k != "GLM5_MEGAMOE_PLAN_ACTIVE" for k, _ in pool.spec(6144, 2048, ep=True).defines)
    assert M.kernel_spec(6144, 2048, 8, M.max_stages(8), plan_active=False) == base


@pytest.mark.gpu
@pytest.mark.parametrize("m, experts, kind", [(1, 256, "uniform"), (3, 32, "uniform"), (8, 256, "uniform"),
                                              (16, 256, "skewed"), (33, 32, "uniform"), (64, 256, "uniform"),
                                              (128, 256, "uniform")])
def test_gpu_plan_active_equals_the_default_build(m, experts, kind, monkeypatch):
    """The active-list task phase writes the default build's task list entry for entry, and the outputs are bitwise
    the same, launch after launch (default_config per size: split-K FC1 tiles at small sizes, several groups and
    token blocks at larger ones)."""
    _, wt = _weights(experts)
    x8, xs, ids, wts = _inputs(m, experts, 8, kind, 71 + m)
    cfg = M.default_config(m, experts, 8, 1)
    monkeypatch.delenv("GLM5_FASTPATH_MOE_PLAN_ACTIVE", raising=False)
    want = M.debug_run(x8, xs, ids, wts, wt, config=cfg)
    monkeypatch.setenv("GLM5_FASTPATH_MOE_PLAN_ACTIVE", "1")
    assert ("GLM5_MEGAMOE_PLAN_ACTIVE", "1") in cfg.spec(wt.hidden, wt.inter).defines
    got = M.debug_run(x8, xs, ids, wts, wt, config=cfg)
    assert got["tasks"].tolist() == want["tasks"].tolist()
    assert_equal(OP + " plan-active out", got["out"], want["out"])
    assert_equal(OP + " plan-active fc1_done", got["fc1_done"], want["fc1_done"])
    assert got["ctrl"]["tasks_done"] == got["ctrl"]["num_tasks"] and got["combine_ctr_sum"] == 0, got["ctrl"]
    for i in range(10):
        again = M.mega_moe(x8, xs, ids, wts, wt, config=cfg)
        torch.cuda.synchronize()
        assert_equal(OP + f" plan-active launch {i}", again, want["out"])
