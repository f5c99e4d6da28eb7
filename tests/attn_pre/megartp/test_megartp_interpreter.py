"""The Python interpreter runs the instruction tensor itself and reproduces run_eager.

Equality: every op's math is per-region identical to the reference except the split-K reduction
order (fp32 partials per K split summed in k-split order vs the reference's one sum over K groups),
so outputs are compared bitwise first and, where a split-K rounding flipped, within
THRESHOLDS["fp8_same_quant"] (top-k as sets). The interpreter is deterministic: different random
interleavings give bitwise identical outputs (the reduce order does not depend on arrival order).
"""
import pytest
import torch

from glm5_fastpath.attn_pre.megartp.interpreter import InterpreterDeadlock, Interpreter, allocate, run_plan
from glm5_fastpath.attn_pre.megartp.plan import build_plan
from glm5_fastpath.attn_pre.megartp.validator import validate
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import ShapeContext, build_prefix_graph, prefix_env, run_eager
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_topk_sets
from glm5_fastpath.weights import random_layer

SMALL = small_config()
GLM5 = Glm5Config.preset("glm5")
_W = {}


def weights(cfg):
    if cfg.source not in _W:
        _W[cfg.source] = random_layer(cfg, cfg.first_k_dense_replace, seed=7).attn
    return _W[cfg.source]


def make_env(cfg, graph, ctx, seed):
    s = make_decode_step(cfg, list(ctx.seq_lens), seed=seed)
    if ctx.request_ids is not None and len(ctx.requests()) < ctx.M:  # shared KV: one block table for all rows
        s.block_table[:] = s.block_table[-1]
        s.out_cache_loc = (s.block_table[0, s.positions // 64].long() * 64 + s.positions % 64)
    return lambda: prefix_env(graph, w=weights(cfg), hidden=s.hidden, residual=s.residual, positions=s.positions,
                              out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table,
                              kv_cache=s.kv_cache.clone(), index_k_cache=s.index_k_cache.clone())


def compare(graph, out, ref, context):
    for name in graph.produced_tensors():
        a, b = out[name], ref[name]
        same = torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else torch.equal(a, b)
        if same:
            continue
        if name == "topk_slots":
            assert_topk_sets(f"interpreter vs eager {name} [{context}]", a, b, min_overlap=0.99)
        elif name in ("x_bf16", "residual_out", "x_fp8", "x_scale"):  # A0: per-row identical math
            assert_equal(f"interpreter vs eager {name}", a, b, context=context)
        elif name == "index_k_cache_written":
            pass  # compared through index_k_fp8 / index_k_scale (the bytes it stores)
        else:
            fin = torch.isfinite(b.double()) if b.dtype.is_floating_point else torch.ones_like(b, dtype=torch.bool)
            assert torch.equal(fin, torch.isfinite(a.double()) if a.dtype.is_floating_point else fin), name
            assert_close(f"interpreter vs eager {name}", a.double()[fin], b.double()[fin], kind="fp8_same_quant",
                         context=context)


CASES = {
    "shared4_kv300": ShapeContext.shared_kv(4, 300),
    "shared16_kv1100": ShapeContext.shared_kv(16, 1100),
    "indep3": ShapeContext.independent([5, 70, 700]),
    "indep1": ShapeContext.independent([64]),
    "mixed": ShapeContext((300, 301, 302, 70, 1, 1025), (0, 0, 0, 1, 2, 3)),
    "two_mblocks": ShapeContext.independent([40 + 3 * i for i in range(67)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_interpreter_equals_eager_small(case):
    ctx = CASES[case]
    g = build_prefix_graph(SMALL)
    env = make_env(SMALL, g, ctx, seed=len(case))
    ref = run_eager(g, env())
    plan = validate(build_plan(g, ctx, SMALL, num_sms=7))
    first = None
    for seed in (0, 1, 2):
        out = run_plan(plan, env(), SMALL, seed=seed)
        compare(g, out, ref, f"{case} seed={seed}")
        assert_equal("eager kv_cache", out["kv_cache_written"], ref["kv_cache_written"])
        if first is None:
            first = out
        else:  # deterministic under any interleaving
            for name in g.produced_tensors():
                assert torch.equal(out[name].view(torch.uint8), first[name].view(torch.uint8)), (name, seed)


def test_round_robin_plan_and_bf16_indexer_k_gemm():
    ctx = CASES["indep3"]
    g = build_prefix_graph(SMALL, indexer_k_gemm="bf16")
    env = make_env(SMALL, g, ctx, seed=3)
    out = run_plan(validate(build_plan(g, ctx, SMALL, num_sms=5, scheduler="round_robin")), env(), SMALL, seed=9)
    compare(g, out, run_eager(g, env()), "bf16 wk, round robin")


def test_shared_layer_graph():
    g = build_prefix_graph(SMALL, full_indexer=False)
    ctx = ShapeContext.independent([33, 90])
    prev = torch.randint(0, 100, (2, SMALL.index_topk), dtype=torch.int32)
    s = make_decode_step(SMALL, [33, 90], seed=2)
    env = lambda: prefix_env(g, w=weights(SMALL), hidden=s.hidden, residual=s.residual, positions=s.positions,  # noqa
                             out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table,
                             kv_cache=s.kv_cache.clone(), prev_topk=prev)
    plan = validate(build_plan(g, ctx, SMALL, num_sms=3))
    assert plan.ops == ["A0", "B0", "D0", "D2"]
    compare(g, run_plan(plan, env(), SMALL, seed=4), run_eager(g, env()), "shared layer")


def test_epochs_reuse_counters_without_reset():
    """Step 2 runs on the counters step 1 left (targets 2 x threshold) and gives the same outputs;
    running step 2's waits against epoch 1's targets would pass early, epoch 3 deadlocks at once."""
    ctx = CASES["shared4_kv300"]
    g = build_prefix_graph(SMALL)
    env = make_env(SMALL, g, ctx, seed=5)
    ref = run_eager(g, env())
    plan = build_plan(g, ctx, SMALL, num_sms=4)
    compare(g, run_plan(plan, env(), SMALL, seed=1, epochs=2), ref, "epoch 2")
    interp = Interpreter(plan, SMALL)
    plan.rebind(allocate(plan, env()))
    interp.run(epoch=1)
    with pytest.raises(InterpreterDeadlock, match="epoch 3"):
        interp.run(epoch=3)  # skipping a step: targets of step 3 are never reached by one step of increments


@pytest.mark.slow  # ~9 s on 2 cores
def test_interpreter_equals_eager_glm5_dims():
    ctx = ShapeContext.shared_kv(4, 600)
    g = build_prefix_graph(GLM5)
    env = make_env(GLM5, g, ctx, seed=11)
    ref = run_eager(g, env())
    plan = validate(build_plan(g, ctx, GLM5))
    for seed in (0, 1):
        compare(g, run_plan(plan, env(), GLM5, seed=seed), ref, f"glm5 seed={seed}")


def test_e1_alone_reads_the_callers_index_cache_and_matches_the_reference():
    """keep_only(["E1"]): B1 is dropped, so index_k_cache_written becomes the caller's cache (no longer an
    in-place version); the plan's E1 instructions (per-row Q blocks of shared KV, split windows) reproduce the
    reference logits exactly on the CPU interpreter."""
    from glm5_fastpath.attn_pre.megartp import device as D
    from glm5_fastpath.attn_pre.megartp.bench import reference_env
    cfg = small_config()
    for ctx in (ShapeContext.independent([40, 41, 300, 77, 1000]), ShapeContext.shared_kv(6, 700)):
        g = D.keep_only(build_prefix_graph(cfg), ["E1"])
        assert g.tensors["index_k_cache_written"].is_external
        plan = validate(build_plan(g, ctx, cfg, num_sms=5))
        assert D.family_support_errors(plan, cfg) == []
        env, ref = reference_env(cfg, g, ctx, device="cpu")
        out = run_plan(plan, env, cfg)
        assert torch.equal(out["logits"], ref["logits"]), ctx
