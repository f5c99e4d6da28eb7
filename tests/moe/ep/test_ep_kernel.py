"""The in-kernel EP MegaMoE (glm5_fastpath/moe/ep/kernel.py, megamoe.cuh GLM5_MEGAMOE_EP).

CPU: the symmetric layout, the config choice, the C++ mirror (nvcc), the EP build compiling without spills.
GPU (one H200): N simulated ranks on one GPU, bitwise against the single-GPU kernel on the gathered batch.
GPU (2+ H200s): real ranks through torch symmetric memory (skipped with fewer GPUs).
"""
from __future__ import annotations

import pytest
import torch

from glm5_fastpath.moe import megamoe as M
from glm5_fastpath.moe.ep import kernel as K
from glm5_fastpath.moe.ep import selfcheck as SC


def test_sym_layout_offsets_and_views():
    lay = K.SymLayout(max_tokens=5, hidden=512, topk=8, num_slots=9)
    o = lay.offsets
    names = ["x", "xs", "w", "ids", "sig", "slots"]
    assert [o[n] for n in names] == sorted(o[n] for n in names) and all(o[n] % 256 == 0 for n in names)
    assert o["slots"] + 5 * 9 * 512 * 2 <= lay.nbytes
    v = lay.views(torch.zeros(lay.nbytes, dtype=torch.uint8))
    assert v["x"].shape == (5, 512) and v["x"].dtype == M.FP8
    assert v["xs"].shape == (5, 4) and v["ids"].dtype == torch.int32 and v["sig"].shape == (K.SIG_WORDS,)
    assert v["slots"].shape == (5, 9, 512) and v["slots"].dtype == torch.bfloat16
    with pytest.raises(K.EPKernelError, match="max_tokens"):
        K.SymLayout(0, 512, 8, 9)
    assert v["loc"].numel() == 0 and v["opool"].numel() == 0  # mode A: no pull-combine fields


def test_sym_layout_mode_b():
    lay = K.SymLayout.for_group(16, 512, 128, 8, 1, 2, 32, "B")
    cap = M.WorkspaceShape(512, 128, 17, 9, 32).pairs_cap
    assert lay.pairs_cap == cap and lay.mode == "B"
    v = lay.views(torch.zeros(lay.nbytes, dtype=torch.uint8))
    assert v["slots"].numel() == 0 and v["loc"].shape == (16, 9) and v["opool"].shape == (cap, 512)
    o = lay.offsets
    assert o["opool"] + cap * 512 * 2 <= lay.nbytes and o["loc"] % 256 == 0
    with pytest.raises(K.EPKernelError, match="pairs_cap"):
        K.SymLayout(16, 512, 8, 9, "B", 0)
    with pytest.raises(K.EPKernelError, match="mode"):
        K.SymLayout(16, 512, 8, 9, "C")


def test_default_ep_config_is_a_pool_build_with_the_end_combine():
    for m in (1, 8, 64, 256, 1024, 4096):
        for world in (2, 4, 8):
            c = K.default_ep_config(m, world, 256, 8)
            assert c.pool and c.end_combine and c.lean_fences, (m, world, c.name)
    assert K.default_ep_config(4096, 8, 256, 8).token_major
    assert [K.default_ep_config(m, 2, 256, 8).block_n for m in (1, 64, 128, 512)] == [8, 16, 32, 64]
    assert all(K.default_ep_config(m, 2, 256, 8).split_waves == 0 for m in (1, 8, 64))


def test_ep_spec_needs_the_pool():
    with pytest.raises(M.MegaMoEInputError, match="pool"):
        M.kernel_spec(512, 128, 64, 5, True, False, 0, False, ep=True)
    spec = M.kernel_spec(512, 128, 64, 5, True, True, 0, True, ep=True)
    assert ("GLM5_MEGAMOE_EP", "1") in spec.defines


def test_ep_constants_and_params_mirror_cpp(nvcc_jit):
    from glm5_fastpath.jit import KernelSpec
    lines = ['#include "moe/megamoe.cuh"', "#include <stddef.h>", "namespace mm = glm5::moe::megamoe;",
             f"static_assert(mm::kSigWords == {K.SIG_WORDS}, \"sig\");",
             f"static_assert(mm::kEpTokBits == {K.EP_TOK_BITS}, \"tok bits\");",
             f"static_assert(mm::kMaxRanks == {M.EP_MAX_RANKS}, \"ranks\");",
             f"static_assert(sizeof(mm::Params) == {M.PARAMS_BYTES}, \"Params\");"]
    for name, _ in M._Params._fields_:
        lines.append(f"static_assert(offsetof(mm::Params, {name}) == {getattr(M._Params, name).offset}, \"{name}\");")
    assert nvcc_jit(KernelSpec("megamoe_ep_mirror", code="\n".join(lines) + "\n")).cubin is not None


@pytest.mark.parametrize("name", ["bn64_s5_g512_w0_lf_p_t", "bn16_s6_g512_w4_lf_p", "bn128_s6_g512_w0_lf_p_t"])
def test_ep_build_compiles_without_spills(nvcc_jit, name):
    c = M.MegaMoEConfig.from_name(name)
    res = nvcc_jit(M.kernel_spec(6144, 2048, c.block_n, c.stages, c.lean_fences, c.pool, 0, c.token_major,
                                 ep=True)).resources()
    for fn in (M.FUNCTION, M.PLAN_FUNCTION):
        assert res[fn].spill_store_bytes == 0 and res[fn].spill_load_bytes == 0, (name, fn, res[fn])
    assert res[M.FUNCTION].stack_bytes == 0, res[M.FUNCTION]


def test_local_weight_stack_takes_the_rank_block_and_the_shared_expert():
    n, h, i = 9, 256, 128  # 8 routed + 1 shared
    w13 = torch.arange(n, dtype=torch.float32).view(n, 1, 1).expand(n, 2 * i, h).to(M.FP8)
    s13 = torch.ones(n, 2 * i // 128, h // 128)
    w2 = torch.arange(n, dtype=torch.float32).view(n, 1, 1).expand(n, h, i).to(M.FP8)
    s2 = torch.ones(n, h // 128, i // 128)
    wt = K.local_weight_stack(w13, s13, w2, s2, rank=1, world=4)
    assert wt.num_experts == 2 and wt.num_shared == 1
    assert wt.w13[:, 0, 0].float().tolist() == [2.0, 3.0, 8.0] and wt.w2[:, 0, 0].float().tolist() == [2.0, 3.0, 8.0]
    with pytest.raises(K.EPKernelError):
        K.local_weight_stack(w13, s13, w2, s2, rank=0, world=3)


def test_ep_op_is_registered_with_a_fake_implementation():
    """torch.ops.glm5_fastpath.ep_mega_moe takes an EPMegaMoE handle; under fake tensors it gives [M, H] bf16 without a
    GPU; an unknown handle is a clear error."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode
    h = K._register(SimpleNamespace(weights=SimpleNamespace(hidden=512)))
    try:
        with FakeTensorMode():
            x = torch.empty(5, 512, dtype=M.FP8)
            out = torch.ops.glm5_fastpath.ep_mega_moe(x, torch.empty(5, 4), torch.empty(5, 8, dtype=torch.int32),
                                                      torch.empty(5, 8), h)
        assert tuple(out.shape) == (5, 512) and out.dtype == torch.bfloat16
    finally:
        K._INSTANCES.pop(h, None)
    with pytest.raises(K.EPKernelError, match="no EPMegaMoE with handle"):
        torch.ops.glm5_fastpath.ep_mega_moe(torch.empty(1, 512, dtype=M.FP8), torch.empty(1, 4),
                                            torch.zeros(1, 8, dtype=torch.int32), torch.empty(1, 8), 10 ** 9)


def test_rank_routing_kinds():
    ids, w = SC.rank_routing(12, 32, 8, 4, "rank0", seed=3)
    assert int(ids.max()) < 8 and torch.allclose(w.sum(-1), torch.ones(12))
    ids, _ = SC.rank_routing(12, 32, 8, 4, "padding", seed=3)
    assert (ids[::3] == -1).all() and (ids[1::3] >= 0).all()
    ids, _ = SC.rank_routing(5, 32, 8, 4, "uniform", seed=3)
    assert all(len(set(r.tolist())) == 8 for r in ids)


# ---- GPU: simulated ranks on one GPU ----------------------------------------------------------------------------

def _assert_report(rep):
    assert rep["ok"], {k: rep[k] for k in ("case", "calls", "ctrl", "epoch") if k in rep} | {"graph": rep.get("graph")}


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["bn64_s5_g512_w0_lf_p_t", "bn64_s5_g512_w0_lf_p", "bn16_s6_g512_w0_lf_p",
                                    "bn128_s6_g512_w0_lf_p_t"])
@pytest.mark.parametrize("tokens, kind", [((1, 1), "uniform"), ((3, 0), "uniform"), ((0, 5), "rank0"),
                                          ((33, 64), "hot"), ((200, 17), "uniform"), ((40, 41), "padding"),
                                          ((5, 9, 0, 13), "uniform"), ((64, 64, 64, 64), "rank0")])
def test_gpu_sim_ranks_equal_single_gpu_bitwise(tokens, kind, config):
    """Every rank's output equals the single-GPU kernel's rows of that rank on the gathered batch, bit for bit, over
    repeated calls (the epoch advances, counters return to rest): ranks with no tokens, ranks that receive no routed
    pair (rank0 routing), one hot expert, padding rows, EP2 and EP4."""
    rep = SC.check_simulated(SC.Case(tokens=tokens, kind=kind, config=config, repeats=3))
    _assert_report(rep)
    world = len(tokens)
    assert rep["epoch"] == [3] * world
    for c in rep["ctrl"]:
        assert c["tasks_done"] == c["num_tasks"] and c["pool_done"] > 0, rep["ctrl"]


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["bn64_s5_g512_w0_lf_p_t", "bn16_s6_g512_w0_lf_p", "bn128_s6_g512_w0_lf_p_t"])
@pytest.mark.parametrize("tokens, kind", [((1, 1), "uniform"), ((0, 5), "rank0"), ((33, 64), "hot"),
                                          ((40, 41), "padding"), ((5, 9, 0, 13), "uniform"), ((200, 17), "uniform")])
def test_gpu_sim_mode_b_equals_single_gpu_bitwise(tokens, kind, config):
    """Combine mode B (owners keep their outputs in a local pool, sources read them back through pair_loc): the same
    values summed in the same slot order, so the same bits as the single-GPU kernel."""
    rep = SC.check_simulated(SC.Case(tokens=tokens, kind=kind, config=config, repeats=3, mode="B"))
    _assert_report(rep)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["A", "B"])
@pytest.mark.parametrize("tokens, kind, experts, hidden, inter", [
    ((3, 0, 5, 1, 7, 2, 0, 4), "uniform", 64, 512, 128), ((9, 9, 9, 9, 9, 9, 9, 9), "rank0", 64, 512, 128),
    ((16, 1, 0, 8, 33, 2, 5, 12), "uniform", 256, 6144, 2048)])
def test_gpu_sim_ep8(tokens, kind, experts, hidden, inter, mode):
    """EP8 as 8 simulated ranks on one GPU (15 CTAs each): ranks without tokens, every rank's tokens routed to rank 0's
    experts only (seven ranks receive no routed pair), GLM-5 shapes; bitwise against the single-GPU kernel."""
    rep = SC.check_simulated(SC.Case(tokens=tokens, kind=kind, num_experts=experts, hidden=hidden, inter=inter,
                                     repeats=2, mode=mode))
    _assert_report(rep)


@pytest.mark.gpu
def test_gpu_sim_split_k_config_within_fp8_noise():
    """bn16 with split-K FC1 tiles: whether a tile splits depends on the rank's tile count, so EP vs single GPU is
    compared within FP8 noise (the two K halves are summed in another order)."""
    _assert_report(SC.check_simulated(SC.Case(tokens=(2, 3), config="bn16_s6_g512_w4_lf_p")))


@pytest.mark.gpu
def test_gpu_sim_glm5_dims():
    """GLM-5 shapes (H 6144, I 2048, 256 experts, top-8) at EP2, default build."""
    _assert_report(SC.check_simulated(SC.Case(tokens=(16, 7), num_experts=256, hidden=6144, inter=2048, repeats=2)))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["A", "B"])
def test_gpu_sim_cuda_graph_replay(mode):
    """One captured call per rank, replayed concurrently with new inputs: the epoch and the barriers live in device
    memory, so replays need no host work."""
    _assert_report(SC.check_simulated(SC.Case(tokens=(24, 10), repeats=1, graph_replays=6, mode=mode)))


# ---- GPU: real ranks (2+ GPUs) -----------------------------------------------------------------------------------

def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs (nvidia-h200-x2)")
@pytest.mark.parametrize("case", [
    SC.Case(tokens=(1, 1)), SC.Case(tokens=(0, 9), kind="rank0"), SC.Case(tokens=(64, 33), kind="hot"),
    SC.Case(tokens=(300, 100), kind="padding", config="bn128_s6_g512_w0_lf_p_t"),
    SC.Case(tokens=(8, 8), num_experts=256, hidden=6144, inter=2048),
    SC.Case(tokens=(256, 200), num_experts=256, hidden=6144, inter=2048),
    SC.Case(tokens=(0, 9), kind="rank0", mode="B"), SC.Case(tokens=(64, 33), kind="hot", mode="B"),
    SC.Case(tokens=(256, 200), num_experts=256, hidden=6144, inter=2048, mode="B"),
], ids=lambda c: f"{c.tokens}-{c.kind}-{c.hidden}-{c.config}-{c.mode}")
def test_gpu_two_ranks_equal_single_gpu_bitwise(case):
    from glm5_fastpath.moe.ep.launch import run_ranks
    res = run_ranks(SC.check_rank, 2, (case,), backend="nccl", timeout_s=300)
    assert all(r["ok"] for r in res), res
    assert [r["epoch"] for r in res] == [case.repeats] * 2


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 4, reason="needs 4 or 8 GPUs (nvidia-h200-x4 / -x8)")
@pytest.mark.parametrize("mode", ["A", "B"])
@pytest.mark.parametrize("kind, dims", [("uniform", "small"), ("rank0", "small"), ("padding", "small"),
                                        ("uniform", "glm5")])
def test_gpu_all_ranks_equal_single_gpu_bitwise(kind, dims, mode):
    """EP4 / EP8 on real GPUs (every GPU of the machine, at most 8): ranks with no tokens, ranks that receive no routed
    pair (rank0), padding rows, GLM-5 shapes; bitwise against the single-GPU kernel, both combine modes."""
    from glm5_fastpath.moe.ep.launch import run_ranks
    world = min(8, _gpus()) if _gpus() >= 8 else 4
    tokens = tuple([5, 0, 17, 1, 64, 3, 9, 30][:world])
    shape = dict(num_experts=256, hidden=6144, inter=2048) if dims == "glm5" else dict(num_experts=64)
    case = SC.Case(tokens=tokens, kind=kind, mode=mode, **shape)
    res = run_ranks(SC.check_rank, world, (case,), backend="nccl", timeout_s=300)
    assert all(r["ok"] for r in res), res
    assert [r["epoch"] for r in res] == [case.repeats] * world


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs (nvidia-h200-x2)")
@pytest.mark.parametrize("mode", ["A", "B"])
def test_gpu_two_ranks_stress_and_graph_replay(mode):
    """200 back-to-back calls on two real GPUs, every one bitwise equal to the single-GPU kernel (a missing release /
    acquire across NVLink would show as stale slots or pool rows in some call), then one captured call per rank replayed
    with new inputs (uniform and hot routing alternately): the epoch advances in device memory, no host work."""
    from glm5_fastpath.moe.ep.launch import run_ranks
    case = SC.Case(tokens=(48, 20), kind="hot", repeats=200, graph_replays=8, mode=mode)
    res = run_ranks(SC.check_rank, 2, (case,), backend="nccl", timeout_s=300)
    assert all(r["ok"] for r in res), [{k: r[k] for k in ("rank", "bad_calls", "calls", "graph")} for r in res]
    assert [r["epoch"] for r in res] == [200 + 8] * 2

