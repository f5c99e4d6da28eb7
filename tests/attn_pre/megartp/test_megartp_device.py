"""MegaRTP megakernel on the GPU (sm_90). Ordered from the most basic to the most complete, so the first
failure says where the problem is:

1. empty plans of NOOPs run, epochs advance, the fixed framework cost is printed (target <= 3 us);
2. NOOP plans whose events chain across queues: 1000 eager steps and CUDA-graph replays, no hang, every
   counter at epochs x threshold; a trace build shows no instruction ready before its producers;
3. failures: a wait nobody satisfies trips the bounded-wait guard (the host gets the record, the CUDA
   context survives and the next plan runs); a malformed instruction is refused on the device;
4. families, each alone (its inputs computed by the reference): D2, B0, B1, D1, E1, A0 against the reference
   (FP8 tolerances; E1's logits fp32) and BITWISE against the standalone kernels with the same split-K /
   the same MMA order; C0 within bf16 rounding of the reference and of the standalone kernel (its fp32 sums
   run in another order); E2 equal to the standalone kernel (its output is a function of the row alone); D0
   bitwise against the standalone kernel with one K split;
5. the whole GLM-5 prefix (A0 + B0 + C0 + B1 + D1 + D0 + D2 + E1 + E2) with cross-SM events, several epochs
   (bitwise stable), the executor (step inputs through the staging buffers), a trace build (Chrome JSON + summary).
The small preset's whole prefix is refused (its 64-wide indexer heads and 96-row q_b heads; checked).

    python -m pytest -q -s tests/attn_pre/megartp/test_megartp_device.py      (-s prints the framework cost)
"""
from types import SimpleNamespace

import pytest
import torch

from glm5_fastpath.attn_pre.megartp import device as D
from glm5_fastpath.attn_pre.megartp import trace as T
from glm5_fastpath.attn_pre.megartp.bench import bind_tensors, reference_env
from glm5_fastpath.attn_pre.megartp.isa import Instruction, Opcode, encode
from glm5_fastpath.attn_pre.megartp.plan import build_plan
from glm5_fastpath.attn_pre.megartp.validator import validate
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import ShapeContext, build_prefix_graph
from glm5_fastpath.graph.prefix_graph import PrefixTiling
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison
from glm5_fastpath.weights import Fp8Linear

pytestmark = pytest.mark.gpu

GLM5 = Glm5Config.preset("glm5")
SMALL = small_config()
DEV = "cuda"


def sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


# ---- 1. empty plans ---------------------------------------------------------------------------------------------

def test_noop_plan_runs_and_epochs_advance():
    r = D.run_plan(D.noop_plan(4, 1), None, 1)
    assert r.epoch == 1 and int(r.state[0]) == 1 and int(r.state[1]) == 4  # last epoch, CTAs exited
    D.run_plan(D.noop_plan(4, 1), None, 1)  # a new plan object: a new runner, epoch 1 again
    r.launch(2)
    r.launch(None)  # device epoch 3
    r.check()
    assert r.epoch == 3 and int(r.state[0]) == 3 and int(r.state[1]) == 12
    with pytest.raises(D.MegaRtpError, match="must be epoch 4"):
        r.launch(7)


def test_framework_cost_of_an_empty_plan():
    from glm5_fastpath.attn_pre.megartp.bench import framework_cost
    res = framework_cost(DEV, (1, 8), launches=50, replays=10)  # CUDA-graph replays of 50 launches
    for length, t in res.items():
        print(f"\nMegaRTP framework cost: empty plan [{sms()}, {length}] = {t['median_us']:.2f} us per launch "
              f"(min {t['min_us']:.2f}; {t['method']}; target <= 3 us)")
        assert t["method"] == "cuda-graph", t
        assert t["median_us"] < 50.0, f"an empty plan takes {t['median_us']:.1f} us per launch"


# ---- 2. events across queues -----------------------------------------------------------------------------------

def test_chain_plan_1000_steps_no_hang():
    plan = D.chain_plan(sms(), 6, seed=1)
    r = D.PlanRunner(plan, None, DEV, wait_budget_ms=2000)
    for e in range(1, 1001):
        r.launch(e)
        if e % 250 == 0:
            r.check()
    assert r.epoch == 1000
    assert bool((r.counters[: plan.num_counters] == 1000).all()), "every event must be at epochs x threshold"


def test_chain_plan_cuda_graph_replays():
    plan = D.chain_plan(min(sms(), 64), 5, seed=2)
    r = D.PlanRunner(plan, None, DEV)
    r.launch(1)
    r.check()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(10):
            r.launch(None)  # epoch from device memory: every replay continues the count
    for _ in range(100):
        g.replay()
    r.check()
    assert r.epoch == 1 + 1000 and bool((r.counters[: plan.num_counters] == 1001).all())


def test_chain_plan_trace_is_causal(tmp_path):
    plan = D.chain_plan(min(sms(), 32), 6, seed=3)
    r = D.PlanRunner(plan, None, DEV, trace=True)
    r.launch(1)
    r.check()
    recs = r.trace_records()
    assert len(recs) == plan.instructions.shape[0] * plan.instructions.shape[1]
    ready_of = {e: rec.ready for rec in recs for e in rec.signals}
    late = [(rec.label, e) for rec in recs for e, _ in rec.waits if rec.ready < ready_of[e]]
    assert not late, f"instructions ready before their producers: {late[:5]}"
    T.write_chrome_trace(tmp_path / "chain.json", recs)
    print("\n" + T.format_summary(T.summarize(recs)).splitlines()[0])


# ---- 3. failures --------------------------------------------------------------------------------------------------

def _raw(q: int, length: int, put: dict, counters: int) -> D.RawPlan:
    p = D.noop_plan(q, length)
    for (qi, i), ins in put.items():
        p.instructions[qi, i] = torch.tensor(encode(ins), dtype=torch.int32)
    return D.RawPlan(p.instructions, counters)


def test_bounded_wait_guard_fires_and_the_context_survives():
    # queue 0 waits on event 0 (never signalled); queue 1 waits on event 1 (never signalled either: it
    # leaves through the grid abort); queue 2 signals event 2 and finishes
    plan = _raw(3, 2, {(0, 1): Instruction(int(Opcode.NOOP), waits=((0, 1),)),
                       (1, 0): Instruction(int(Opcode.NOOP), waits=((1, 3),)),
                       (2, 0): Instruction(int(Opcode.NOOP), signals=((2, 1, 0),))}, counters=3)
    r = D.PlanRunner(plan, None, DEV, wait_budget_ms=20)
    r.launch(1)
    with pytest.raises(D.MegaRtpWaitTimeout) as e:
        r.check()
    rec = e.value.record
    assert rec.kind == 1 and rec.epoch == 1 and rec.observed == 0
    assert (rec.queue, rec.pos, rec.event, rec.threshold, rec.target) in ((0, 1, 0, 1, 1), (1, 0, 1, 3, 3))
    assert "wait timed out" in str(e.value) and f"event {rec.event}" in str(e.value)
    assert r.epoch == 0 and int(r.error.abs().sum()) == 0  # reset after the error
    x = torch.arange(10, device=DEV).sum()  # the CUDA context is usable
    assert int(x) == 45
    D.run_plan(D.chain_plan(8, 3), None, 1)  # and so is the megakernel


def test_malformed_instruction_is_refused_on_the_device():
    w = encode(Instruction(int(Opcode.NOOP)))
    w[2] = 7  # wait_count 7 > MAX_WAITS
    p = D.noop_plan(2, 2)
    p.instructions[1, 1] = torch.tensor(w, dtype=torch.int32)
    r = D.PlanRunner(D.RawPlan(p.instructions, 0), None, DEV)
    r.launch(1)
    with pytest.raises(D.MegaRtpDeviceError, match="wait_count out of range") as e:
        r.check()
    assert (e.value.record.queue, e.value.record.pos, e.value.record.kind) == (1, 1, 3)


def test_full_prefix_plan_is_refused_with_the_missing_families():
    plan = build_plan(build_prefix_graph(SMALL), ShapeContext.shared_kv(4, 300), SMALL, num_sms=8)
    with pytest.raises(D.MegaRtpUnsupported, match=r"D0: "):
        D.PlanRunner(plan, SMALL, DEV)


# ---- 4. families --------------------------------------------------------------------------------------------------

def _family_run(cfg, ops, seq_lens, *, num_sms=None, seed=0, epochs=1, ctx=None, tiling=None):
    g = D.keep_only(build_prefix_graph(cfg, **({"tiling": tiling} if tiling else {})), ops)
    ctx = ctx or ShapeContext.independent(seq_lens)
    plan = validate(build_plan(g, ctx, cfg, num_sms=num_sms or sms()))
    env, ref = reference_env(cfg, g, ctx, seed=seed, device=DEV)
    before = {k: env[k].clone() for k in ("kv_cache", "index_k_cache") if k in env}  # caches before the step
    tensors = bind_tensors(plan, env, DEV)
    r = D.PlanRunner(plan, cfg, DEV)
    r.bind(tensors)
    for e in range(1, epochs + 1):
        r.launch(e)
    r.check()
    return SimpleNamespace(g=g, plan=plan, env=env, ref=ref, t=tensors, r=r, before=before)


def _splits(plan, op):
    return plan.workspaces[f"workspace.{op}"][0]


def _deq(q8, s):
    return q8.float() * s.float().unsqueeze(-1)


LENS = {1: [300], 5: [40, 41, 300, 77, 1000], 16: [500 + 3 * i for i in range(16)], 40: [64 + i for i in range(40)]}


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_d2_family(cfg, m):
    from glm5_fastpath.ops import d2_absorb_and_kv_store
    x = _family_run(cfg, ["D2"], LENS[m], num_sms=min(sms(), 24))
    e, t, ref = x.env, x.t, x.ref
    assert_no_poison("megartp D2", t["q_lat"], names=["q_lat"])
    assert_close("megartp D2", t["q_lat"], ref["q_lat"], kind="bf16", context=f"{m=} q_lat vs reference")
    slots = e["out_cache_loc"]
    assert_equal("megartp D2", t["kv_cache"][slots], ref["kv_cache"][slots], context=f"{m=} kv rows vs reference")
    assert_equal("megartp D2", t["kv_cache"], ref["kv_cache"], context=f"{m=} whole kv_cache vs reference")
    kv = x.before["kv_cache"]  # the cache as it was before the megakernel's step
    q_lat = d2_absorb_and_kv_store(e["q_nope"], e["c_kv"], e["k_pe"], SimpleNamespace(w_kc=e["w.w_kc"]),
                                   e["positions"], slots, kv, cfg)
    torch.cuda.synchronize()
    assert_equal("megartp D2", t["q_lat"], q_lat, context=f"{m=} q_lat vs the standalone kernel")
    assert_equal("megartp D2", t["kv_cache"], kv, context=f"{m=} kv_cache vs the standalone kernel")


def _forced(plan, op):
    from glm5_fastpath.ops.fp8_gemm import forced_config
    return forced_config(tm=16, splits=_splits(plan, op), stages=6, impl="mma")


# Split counts other than the graph's default (4): 3 and 6 leave a partial chunk in the tile reducer's split
# loads (families.cuh B0Family::tile_sum loads four splits at a time).
B0_TILINGS = {"k4": None, "k3": PrefixTiling(b0_split_k=3), "k6": PrefixTiling(b0_split_k=6)}


@pytest.mark.parametrize("cfg,m,tiling", [(c, m, "k4") for c in (SMALL, GLM5) for m in (1, 16, 40)]
                         + [(GLM5, 16, "k3"), (GLM5, 5, "k6")],
                         ids=lambda v: v if isinstance(v, (int, str)) else ("glm5" if v is GLM5 else "small"))
def test_b0_family(cfg, m, tiling):
    from glm5_fastpath.ops import b0_qkv_a
    x = _family_run(cfg, ["B0"], LENS[m], num_sms=min(sms(), 40), tiling=B0_TILINGS[tiling])
    t, ref, e = x.t, x.ref, x.env
    names = ["q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe"]
    assert_no_poison("megartp B0", *[t[n] for n in names], names=names)
    for n in ("q_lora", "c_kv", "k_pe"):
        assert_close("megartp B0", t[n], ref[n], kind="bf16", context=f"{m=} {n} vs reference")
    assert_close("megartp B0", _deq(t["q_lora_fp8"].view(m, -1, 128), t["q_lora_scale"]),
                 _deq(ref["q_lora_fp8"].view(m, -1, 128), ref["q_lora_scale"]), kind="fp8_same_quant",
                 context=f"{m=} q_lora fp8 vs reference")
    w = SimpleNamespace(qkv_a=Fp8Linear(e["w.qkv_a.weight"], e["w.qkv_a.scale_inv"]), q_a_norm=e["w.q_a_norm"],
                        kv_a_norm=e["w.kv_a_norm"])
    with _forced(x.plan, "B0"):
        want = b0_qkv_a(e["x_fp8"], e["x_scale"], w, cfg, mode="split")
    torch.cuda.synchronize()
    for n in names:
        assert_equal("megartp B0", t[n], want[n], context=f"{m=} {n} vs the standalone split-mode kernels "
                                                           f"(splits={_splits(x.plan, 'B0')})")


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 16, 40])
def test_b1_family(cfg, m):
    from glm5_fastpath.ops import b1_indexer_k
    from glm5_fastpath.ref.fp8 import index_k_cache_load
    x = _family_run(cfg, ["B1"], LENS[m], num_sms=min(sms(), 16))
    t, ref, e = x.t, x.ref, x.env
    assert_no_poison("megartp B1", t["index_k_fp8"], t["index_k_scale"], names=["k8", "k_scale"])
    assert_close("megartp B1", t["index_k_scale"], ref["index_k_scale"], kind="fp8_same_quant", context=f"{m=} scale")
    assert_close("megartp B1", _deq(t["index_k_fp8"], t["index_k_scale"]), _deq(ref["index_k_fp8"], ref["index_k_scale"]),
                 kind="fp8_same_quant", context=f"{m=} k vs reference")
    ck8, cks = index_k_cache_load(t["index_k_cache"], e["out_cache_loc"], cfg.index_head_dim)
    assert_equal("megartp B1", ck8, t["index_k_fp8"], context=f"{m=} cache k8")
    assert_equal("megartp B1", cks, t["index_k_scale"], context=f"{m=} cache scale")
    cache = x.before["index_k_cache"]
    idx = SimpleNamespace(wk=Fp8Linear(e["w.indexer.wk.weight"], e["w.indexer.wk.scale_inv"]),
                          k_norm_weight=e["w.indexer.k_norm_weight"], k_norm_bias=e["w.indexer.k_norm_bias"])
    with _forced(x.plan, "B1"):
        k8, ks = b1_indexer_k(None, e["x_fp8"], e["x_scale"], idx, e["positions"], e["out_cache_loc"], cache, cfg)
    torch.cuda.synchronize()
    assert_equal("megartp B1", t["index_k_fp8"], k8, context=f"{m=} k8 vs the standalone kernel")
    assert_equal("megartp B1", t["index_k_scale"], ks, context=f"{m=} scale vs the standalone kernel")
    assert_equal("megartp B1", t["index_k_cache"], cache, context=f"{m=} whole index-K cache vs the standalone kernel")


@pytest.mark.parametrize("m,tiling", [(1, None), (16, None), (40, None), (16, 1), (5, 8)],
                         ids=["1", "16", "40", "16-k1", "5-k8"])
def test_d1_family_glm5(m, tiling):
    from glm5_fastpath.ops import d1_indexer_q
    x = _family_run(GLM5, ["D1"], LENS[m], num_sms=min(sms(), 64),
                    tiling=PrefixTiling(d1_split_k=tiling) if tiling else None)
    t, ref, e = x.t, x.ref, x.env
    names = ["index_q_fp8", "index_q_scale", "head_w"]
    assert_no_poison("megartp D1", *[t[n] for n in names], names=names)
    assert_close("megartp D1", t["index_q_scale"], ref["index_q_scale"], kind="fp8_same_quant", context=f"{m=} scale")
    assert_close("megartp D1", t["head_w"], ref["head_w"], kind="fp8_same_quant", context=f"{m=} head_w")
    assert_close("megartp D1", _deq(t["index_q_fp8"], t["index_q_scale"]), _deq(ref["index_q_fp8"], ref["index_q_scale"]),
                 kind="fp8_same_quant", context=f"{m=} q vs reference")
    idx = SimpleNamespace(wq_b=Fp8Linear(e["w.indexer.wq_b.weight"], e["w.indexer.wq_b.scale_inv"]))
    with _forced(x.plan, "D1"):
        q8, s, hw = d1_indexer_q(e["q_lora_fp8"], e["q_lora_scale"], e["w_raw"], idx, e["positions"], GLM5)
    torch.cuda.synchronize()
    for n, want in zip(names, (q8, s, hw)):
        assert_equal("megartp D1", t[n], want, context=f"{m=} {n} vs the standalone kernel")


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_a0_family(cfg, m):
    from glm5_fastpath.ops import add_rmsnorm_quant
    x = _family_run(cfg, ["A0"], LENS[m], num_sms=min(sms(), 24))
    t, ref, e = x.t, x.ref, x.env
    names = ["x_bf16", "residual_out", "x_fp8", "x_scale"]
    assert_no_poison("megartp A0", *[t[n] for n in names], names=names)
    assert_equal("megartp A0", t["residual_out"], ref["residual_out"], context=f"{m=} residual_out vs reference")
    assert_close("megartp A0", t["x_bf16"], ref["x_bf16"], kind="bf16", context=f"{m=} x vs reference")
    assert_close("megartp A0", _deq(t["x_fp8"].view(m, -1, 128), t["x_scale"]),
                 _deq(ref["x_fp8"].view(m, -1, 128), ref["x_scale"]), kind="fp8_same_quant", context=f"{m=} x fp8")
    want = add_rmsnorm_quant(e["hidden"], e["residual"], e["w.input_norm"], cfg.rms_norm_eps)
    torch.cuda.synchronize()
    for n, w in zip(names, want):
        assert_equal("megartp A0", t[n], w, context=f"{m=} {n} vs the standalone cluster kernel (same sum order)")


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_c0_family(cfg, m):
    from glm5_fastpath.ops import c0_head_gate
    x = _family_run(cfg, ["C0"], LENS[m], num_sms=min(sms(), 64), epochs=2)  # two epochs: the reduce counter
    t, ref, e = x.t, x.ref, x.env
    assert_no_poison("megartp C0", t["w_raw"], names=["w_raw"])
    assert_close("megartp C0", t["w_raw"], ref["w_raw"], kind="bf16", context=f"{m=} w_raw vs reference")
    want = c0_head_gate(e["x_bf16"], e["w.indexer.weights_proj"])
    torch.cuda.synchronize()
    assert_close("megartp C0", t["w_raw"], want, kind="bf16",
                 context=f"{m=} w_raw vs the standalone kernel (fp32 sums in another order)")


@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_d0_family_glm5(m):
    from glm5_fastpath.ops import d0_q_b
    from glm5_fastpath.ops.fp8_gemm import forced_config
    x = _family_run(GLM5, ["D0"], LENS[m], num_sms=min(sms(), 64), epochs=2)
    t, ref, e = x.t, x.ref, x.env
    assert_no_poison("megartp D0", t["q_nope"], t["q_pe"], names=["q_nope", "q_pe"])
    for n in ("q_nope", "q_pe"):
        assert_close("megartp D0", t[n], ref[n], kind="bf16", context=f"{m=} {n} vs reference")
    w = SimpleNamespace(q_b=Fp8Linear(e["w.q_b.weight"], e["w.q_b.scale_inv"]))
    with forced_config(tm=16, splits=1, stages=6, impl="mma"):
        q_nope, q_pe = d0_q_b(e["q_lora_fp8"], e["q_lora_scale"], w, e["positions"], GLM5)
    torch.cuda.synchronize()
    assert_equal("megartp D0", t["q_nope"], q_nope, context=f"{m=} q_nope vs the standalone kernel (one K split)")
    assert_equal("megartp D0", t["q_pe"], q_pe, context=f"{m=} q_pe vs the standalone kernel (one K split)")


E2_LENS = {1: [300], 5: [40, 2047, 2048, 2049, 8000], 16: [1500 + 431 * i for i in range(16)], 40: [64 + 200 * i for i in range(40)]}


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_e2_family(cfg, m):
    from glm5_fastpath.ops import e2_topk
    x = _family_run(cfg, ["E2"], E2_LENS[m], num_sms=min(sms(), 48), epochs=2)
    t, ref, e = x.t, x.ref, x.env
    assert_no_poison("megartp E2", t["topk_slots"], names=["topk_slots"])
    for r, n in enumerate(E2_LENS[m]):  # the selected slots as sets (ties at the k-th value: the same rule)
        got, want = t["topk_slots"][r], ref["topk_slots"][r]
        assert set(got.tolist()) == set(want.tolist()), f"megartp E2 {m=} row {r} (seq_len {n}): slots vs reference"
    want = e2_topk(e["logits"], e["seq_lens"], e["block_table"], cfg.index_topk)
    torch.cuda.synchronize()
    assert_equal("megartp E2", t["topk_slots"], want, context=f"{m=} slots vs the standalone kernel")


def _check_logits(op, out, ref, lens, context):
    """Live columns (< seq_len) close to the reference (fp32: exact products, tensor-core sums), the rest -inf."""
    width = out.shape[1]
    cols = torch.arange(width, device=out.device)
    live = cols.unsqueeze(0) < torch.tensor(lens, device=out.device).unsqueeze(1)
    r = ref[:, :width] if ref.shape[1] >= width else torch.cat(
        [ref, ref.new_full((ref.shape[0], width - ref.shape[1]), float("-inf"))], dim=1)
    assert_close(op, out[live], r[live], kind="fp32", context=f"{context}: live logits vs reference")
    assert bool(torch.isneginf(out[~live]).all()), f"{op} {context}: columns past seq_len must be -inf"


@pytest.mark.parametrize("cfg", [SMALL, GLM5], ids=["small", "glm5"])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_e1_family(cfg, m):
    from glm5_fastpath.ops import e1_indexer_logits
    x = _family_run(cfg, ["E1"], LENS[m], num_sms=min(sms(), 48), epochs=2)
    t, ref, e = x.t, x.ref, x.env
    assert_no_poison("megartp E1", t["logits"], names=["logits"])
    _check_logits("megartp E1", t["logits"], ref["logits"], LENS[m], f"{m=}")
    want = e1_indexer_logits(e["index_q_fp8"], e["head_w"], e["index_k_cache_written"], e["seq_lens"],
                             e["block_table"], cfg, max_ctx=t["logits"].shape[1])
    torch.cuda.synchronize()
    assert_equal("megartp E1", t["logits"], want, context=f"{m=} logits vs the standalone kernel (same MMA order)")


@pytest.mark.parametrize("m", [3, 16])
def test_e1_family_shared_kv_q_blocks(m):
    """One sequence, M causal tokens: Q blocks of 4 rows per instruction (the adapter's row loop)."""
    ctx = ShapeContext.shared_kv(m, 1100)
    x = _family_run(GLM5, ["E1"], list(ctx.seq_lens), num_sms=min(sms(), 20), ctx=ctx)
    assert max(b - a for a, b in ((i.named_payload()["q0"], i.named_payload()["q1"]) for _, _, i in D._decoded(x.plan))) > 1
    assert_no_poison("megartp E1", x.t["logits"], names=["logits"])
    _check_logits("megartp E1", x.t["logits"], x.ref["logits"], list(ctx.seq_lens), f"shared kv {m=}")


# ---- 5. the supported subgraph ---------------------------------------------------------------------------------

SUB_OUTPUTS = ["q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe", "index_k_fp8", "index_k_scale", "index_q_fp8",
               "index_q_scale", "head_w", "q_lat", "logits", "x_bf16", "residual_out", "x_fp8", "x_scale", "w_raw",
               "topk_slots", "q_nope", "q_pe"]


@pytest.mark.parametrize("num_sms", [None, 8], ids=["all-sms", "8-queues"])
def test_subgraph_b0_b1_d1_d2_epochs(num_sms):
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    assert list(g.ops) == ["A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"]
    m = 16
    x = _family_run(GLM5, list(g.ops), LENS[m], num_sms=num_sms, seed=5)
    t, ref = x.t, x.ref
    assert_no_poison("megartp subgraph", *[t[n] for n in SUB_OUTPUTS], names=SUB_OUTPUTS)
    assert_close("megartp subgraph", t["q_lat"], ref["q_lat"], kind="bf16", context="q_lat")
    assert_close("megartp subgraph", t["head_w"], ref["head_w"], kind="fp8_same_quant", context="head_w")
    assert_close("megartp subgraph", t["c_kv"], ref["c_kv"], kind="bf16", context="c_kv")
    first = {n: t[n].clone() for n in SUB_OUTPUTS}
    for e in range(2, 6):  # the same step again: counters not reset, outputs bitwise identical
        x.r.launch(e)
        x.r.check()
        for n in SUB_OUTPUTS:
            assert_equal("megartp subgraph", t[n], first[n], context=f"epoch {e} {n}")


def test_subgraph_graph_replays_and_trace(tmp_path):
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    ctx = ShapeContext.independent(LENS[16])
    plan = validate(build_plan(g, ctx, GLM5, num_sms=sms()))
    env, ref = reference_env(GLM5, g, ctx, seed=6, device=DEV)
    tensors = bind_tensors(plan, env, DEV)
    r = D.run_plan(plan, tensors, 1, trace=True, cfg=GLM5)
    recs = r.trace_records()
    assert {rec.op for rec in recs} - {"NOOP"} == {"A0", "B0", "B0.final", "C0", "B1", "D1", "D0", "D2", "E1", "E2"}  # NoOps pad
    s = T.summarize(recs)
    T.write_chrome_trace(tmp_path / "subgraph.json", recs)
    print("\n" + T.format_summary(s))
    assert s["critical_path"] and s["makespan_us"] > 0
    ready_of = {e: rec.ready for rec in recs for e in rec.signals}
    assert all(rec.ready >= ready_of[e] for rec in recs for e, _ in rec.waits)
    first = tensors["q_lat"].clone()
    gr = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(gr, stream=st):
        for _ in range(5):
            r.launch(None)
    for _ in range(20):
        gr.replay()
    r.check()
    assert r.epoch == 101
    assert_equal("megartp subgraph", tensors["q_lat"], first, context="after 100 graph-replayed steps")


def test_executor_runs_the_whole_prefix():
    from glm5_fastpath.weights import random_layer
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    ctx = ShapeContext.independent(LENS[5])
    env, ref = reference_env(GLM5, g, ctx, seed=7, device=DEV)
    w = random_layer(GLM5, GLM5.first_k_dense_replace, seed=7, device=DEV).attn
    ex = D.MegaRtpExecutor(GLM5, w, DEV, kv_cache=env["kv_cache"], index_k_cache=env["index_k_cache"], graph=g,
                           max_m=16, max_pages=32)
    inputs = {k: env[k] for k in ("hidden", "residual", "positions", "out_cache_loc", "seq_lens", "block_table")}
    out = ex.run(ctx, **inputs)
    assert_close("megartp executor", out["q_lat"], ref["q_lat"], kind="bf16", context="q_lat")
    _check_logits("megartp executor", out["logits"], ref["logits"], LENS[5], "logits (E1 after B1 / D1 in the plan)")
    first = {k: v.clone() for k, v in out.items()}
    out["q_lat"].fill_(float("nan"))
    out2 = ex.run(ctx, **inputs)  # second step: epoch 2 on the same plan and buffers
    assert ex.runner(ctx).epoch == 2
    for k in first:
        assert_equal("megartp executor", out2[k], first[k], context=f"step 2 {k}")
    full = D.MegaRtpExecutor(GLM5, w, DEV, kv_cache=env["kv_cache"], index_k_cache=env["index_k_cache"], max_m=16,
                             max_pages=32)
    assert list(full.plan_for(ctx).graph.ops) == list(g.ops)  # GLM-5's whole prefix is the supported subgraph
