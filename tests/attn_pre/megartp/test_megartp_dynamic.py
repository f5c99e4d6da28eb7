"""MegaRTP dynamic dispatch (scheduler "dynamic"): one topologically ordered list that the kernel's CTAs claim
from at run time instead of per-SM queues placed on the host.

CPU: the plan (one list in priority order, a claim counter after the other counters, the epoch bound of the
claims), the model's assignment, the validator (a list that is not topological deadlocks), the interpreter (virtual
CTAs claiming as the kernel does reproduce the eager reference, deterministically), the trace decoding per SM, and
the ABI / C++ parts the host relies on.
GPU (marked): NOOP chains claimed dynamically (eager steps, CUDA-graph replays, claim counter exact), and the
whole GLM-5 prefix BITWISE equal to the static plan's outputs (every tile's math and every split-K reduce order is
independent of which SM runs it), over epochs and graph replays, with fewer CTAs than SMs, with each claim policy
(the default lead before the estimated end, at input readiness, at the end), and traced.
"""
import re
from pathlib import Path

import pytest
import torch

from glm5_fastpath.attn_pre.megartp import device as D
from glm5_fastpath.attn_pre.megartp import scheduler as S
from glm5_fastpath.attn_pre.megartp import trace as T
from glm5_fastpath.attn_pre.megartp.interpreter import run_plan
from glm5_fastpath.attn_pre.megartp.isa import Opcode, decode
from glm5_fastpath.attn_pre.megartp.plan import SCHEDULERS, build_plan
from glm5_fastpath.attn_pre.megartp.validator import PlanError, dump, validate
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import ShapeContext, build_prefix_graph, run_eager

CSRC = Path(__file__).resolve().parents[3] / "csrc" / "megartp"
SMALL = small_config()
GLM5 = Glm5Config.preset("glm5")


def _task_of(plan, ins):
    """(op, tile) of a decoded instruction (B0's finalisers share the op: their tile index tells them apart)."""
    return plan.ops[ins.operand_row], ins.tile_index


# ---- plan ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 16])
def test_dynamic_plan_is_one_topological_list_with_a_claim_counter(m):
    assert "dynamic" in SCHEDULERS
    ctx = ShapeContext.independent([8192] * m)
    p = validate(build_plan(build_prefix_graph(GLM5), ctx, GLM5, scheduler="dynamic"))
    static = build_plan(build_prefix_graph(GLM5), ctx, GLM5, scheduler="list")
    n = len(p.taskgraph.tasks)
    assert p.dispatch == "dynamic" and static.dispatch == "static"
    assert tuple(p.instructions.shape) == (1, n, 32) and p.queues == [p.queues[0]]
    assert sorted(p.queues[0]) == list(range(n))  # every task once, no NOOP padding
    assert p.grid_ctas == 132 and static.grid_ctas == static.instructions.shape[0] == 132
    # the claim counter is one more counter after the events and reduce counters, referenced by no instruction
    assert p.num_counters == static.num_counters + 1 and p.claim_counter == p.num_counters - 1
    assert static.claim_counter == -1
    used = set()
    for i in range(n):
        ins = decode(p.instructions[0, i])
        used |= {e for e, _ in ins.waits} | {e for e, _, _ in ins.signals} | {ins.reduce_counter}
    assert p.claim_counter not in used
    # topological: every task's producers come earlier in the list
    at = {t: i for i, t in enumerate(p.queues[0])}
    assert all(at[q] < at[t] for t in range(n) for q in p.taskgraph.preds(t))
    # the same instructions as the static plan, only ordered differently
    key = lambda ins: (_task_of(p, ins), ins.waits, ins.signals, ins.payload)  # noqa: E731
    stat = sorted(key(decode(w)) for w in static.instructions.reshape(-1, 32) if decode(w).opcode != Opcode.NOOP)
    dyn = sorted(key(decode(w)) for w in p.instructions.reshape(-1, 32))
    assert stat == dyn
    # each step takes n + grid claims of a uint32 counter
    assert p.stats["max_epoch"] <= (2**32 - 1) // (n + 132) and D.max_epoch(p) <= (2**32 - 1) // (n + 132)
    assert p.stats["dispatch"] == "dynamic" and "dynamic" in p.stats["est_makespan_us"]
    assert p.stats["est_makespan_us"]["dynamic"] >= p.stats["critical_path_us"] - 1e-6
    text = dump(p)
    assert "claimed at run time by 132 CTAs" in text and f"claim counter c{p.claim_counter}" in text


def test_claim_delays_follow_the_lead():
    ctx = ShapeContext.independent([8192] * 16)
    g = build_prefix_graph(GLM5)
    plans = {lead: build_plan(g, ctx, GLM5, scheduler="dynamic", claim_lead=lead) for lead in ("ready", "done", 1.5, 4)}
    n = plans[1.5].instructions.shape[1]
    for lead, p in plans.items():
        d = p.claim_delay_ns
        assert d.dtype == torch.int32 and tuple(d.shape) == (n,)
        assert torch.equal(p.instructions, plans[1.5].instructions)  # the lead changes only the delays
        assert p.stats["claim_lead_us"] == lead
    assert int(plans["ready"].claim_delay_ns.abs().max()) == 0
    assert bool((plans["done"].claim_delay_ns == S.CLAIM_AT_DONE).all())
    tg = plans[1.5].taskgraph
    costs, cold = S.task_costs_us(tg, GLM5, 132), S.task_cold_us(tg)
    fin = S.group_finish_us(tg)
    finish_of = [fin.get(t.reduce_group, 0.0) for t in tg.tasks]
    order = plans[1.5].queues[0]
    expect = [round(max(0.0, costs[t] - 1.5) * 1e3) for t in order]  # default terms: the run-time cost
    assert plans[1.5].claim_delay_ns.tolist() == expect and min(expect) >= 0
    assert plans[1.5].stats["claim_terms"] == "run"
    assert bool((plans[4].claim_delay_ns <= plans[1.5].claim_delay_ns).all())
    assert build_plan(g, ctx, GLM5).claim_delay_ns is None  # static plans have none
    with_cold = S.claim_delays_ns(order, costs, 1.5, cold=cold, finish_of=finish_of, terms="cold")
    full = S.claim_delays_ns(order, costs, 1.5, cold=cold, finish_of=finish_of, terms="finish")
    assert with_cold == [round(max(0.0, costs[t] + cold[t] - 1.5) * 1e3) for t in order]
    assert all(a <= b <= c for a, b, c in zip(expect, with_cold, full))
    assert with_cold != expect and full != with_cold  # E1 / E2 / D2 cold costs; D1 / B1 group finishes
    with pytest.raises(ValueError, match="terms"):
        S.claim_delays_ns(order, costs, 1.5, terms="all")


def test_claim_terms_come_from_the_environment(monkeypatch):
    from glm5_fastpath.attn_pre.megartp.plan import CLAIM_TERMS_ENV
    from glm5_fastpath.graph.op_graph import GraphError
    ctx = ShapeContext.independent([8192] * 4)
    g = build_prefix_graph(GLM5)
    monkeypatch.setenv(CLAIM_TERMS_ENV, "run")
    run = build_plan(g, ctx, GLM5, scheduler="dynamic", claim_lead=1.5)
    monkeypatch.setenv(CLAIM_TERMS_ENV, "finish")
    full = build_plan(g, ctx, GLM5, scheduler="dynamic", claim_lead=1.5)
    assert run.stats["claim_terms"] == "run" and full.stats["claim_terms"] == "finish"
    assert bool((run.claim_delay_ns <= full.claim_delay_ns).all()) and not torch.equal(run.claim_delay_ns,
                                                                                       full.claim_delay_ns)
    monkeypatch.setenv(CLAIM_TERMS_ENV, "everything")
    with pytest.raises(GraphError, match=CLAIM_TERMS_ENV):
        build_plan(g, ctx, GLM5, scheduler="dynamic")


def test_claim_lead_comes_from_the_argument_or_the_environment(monkeypatch):
    from glm5_fastpath.attn_pre.megartp.plan import CLAIM_LEAD_ENV, claim_lead_us
    from glm5_fastpath.graph.op_graph import GraphError
    monkeypatch.delenv(CLAIM_LEAD_ENV, raising=False)
    assert claim_lead_us() == S.CLAIM_LEAD_US
    assert claim_lead_us("done") is None and claim_lead_us("ready") == float("inf") and claim_lead_us(2) == 2.0
    monkeypatch.setenv(CLAIM_LEAD_ENV, "done")
    assert claim_lead_us() is None and claim_lead_us(3) == 3.0
    monkeypatch.setenv(CLAIM_LEAD_ENV, "soon")
    with pytest.raises(GraphError, match="microseconds, 'ready' or 'done'"):
        claim_lead_us()


def test_bench_claim_lead_is_checked_before_any_gpu_work(capsys, monkeypatch):
    from glm5_fastpath.attn_pre.megartp.bench import main
    from glm5_fastpath.attn_pre.megartp.plan import CLAIM_LEAD_ENV
    monkeypatch.delenv(CLAIM_LEAD_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["--scheduler", "dynamic", "--claim-lead", "soon"])
    assert e.value.code == 2 and "claim lead must be microseconds, 'ready' or 'done'" in capsys.readouterr().err


def test_priority_order_is_the_list_schedulers_pop_order():
    tg = build_plan(build_prefix_graph(SMALL), ShapeContext.independent([300, 70]), SMALL, num_sms=5).taskgraph
    costs = S.task_costs_us(tg, SMALL, 5)
    order = S.priority_order(tg, costs)
    prio = S.critical_path_priority(tg, costs)
    assert sorted(order) == list(range(len(tg.tasks)))
    placed = set()
    for t in order:  # ready (producers placed) and, among the ready ones, no lower priority than any other
        assert set(tg.preds(t)) <= placed
        ready = [u for u in range(len(tg.tasks)) if u not in placed and set(tg.preds(u)) <= placed]
        assert prio[t] >= max(prio[u] for u in ready) - 1e-9
        placed.add(t)


def test_dynamic_assignment_models_claims_at_input_readiness():
    tg = build_plan(build_prefix_graph(GLM5), ShapeContext.independent([8192] * 4), GLM5).taskgraph
    costs, cold, setup = S.task_costs_us(tg, GLM5, 132), S.task_cold_us(tg), S.task_setup_us(tg)
    finish = S.group_finish_us(tg)
    order = S.priority_order(tg, costs, finish, cold)
    queues, makespan = S.dynamic_assignment(tg, order, costs, 132, finish, cold, setup)  # no delays: at readiness
    assert sorted(t for q in queues for t in q) == list(range(len(tg.tasks)))
    rank = {t: i for i, t in enumerate(order)}
    assert all([rank[t] for t in q] == sorted(rank[t] for t in q) for q in queues)  # claims in list order
    assert makespan >= S.critical_path_priority(tg, costs, finish)[order[0]] - max(cold) - 1e-6
    # one CTA runs the list in order: the sum of the work (setups overlap nothing: a CTA claims only once its
    # current task has its inputs, so with one CTA every setup follows the previous task)
    one, span1 = S.dynamic_assignment(tg, order, costs, 1, finish, cold, setup)
    assert one == [order] and span1 >= sum(costs) - 1e-6
    assert makespan < span1
    # claiming at the end instead of at input readiness: never sooner than the lead-less claim
    for lead in (1.5, None):
        delays = S.claim_delays_ns(order, costs, lead)
        q2, span2 = S.dynamic_assignment(tg, order, costs, 132, finish, cold, setup, delays)
        assert sorted(t for q in q2 for t in q) == list(range(len(tg.tasks)))
        assert span2 >= S.critical_path_priority(tg, costs, finish)[order[0]] - max(cold) - 1e-6


def test_validator_rejects_a_dynamic_list_that_is_not_topological():
    p = build_plan(build_prefix_graph(SMALL), ShapeContext.shared_kv(4, 300), SMALL, num_sms=4, scheduler="dynamic")
    validate(p)
    w = p.instructions[0]
    first_consumer = next(i for i in range(w.shape[0]) if decode(w[i]).waits)
    moved = torch.cat([w[first_consumer:first_consumer + 1], w[:first_consumer], w[first_consumer + 1:]])
    p.instructions[0] = moved  # a consumer claimed before its producers: every CTA could block on it
    with pytest.raises(PlanError, match="deadlock"):
        validate(p)


# ---- interpreter ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx", [ShapeContext.shared_kv(4, 300), ShapeContext.independent([5, 70, 700]),
                                 ShapeContext((300, 301, 302, 70, 1, 1025), (0, 0, 0, 1, 2, 3))],
                         ids=["shared4", "indep3", "mixed"])
def test_interpreter_runs_a_dynamic_plan_like_the_static_one(ctx):
    from test_megartp_interpreter import compare, make_env  # noqa: E402 (the interpreter tests' helpers)
    g = build_prefix_graph(SMALL)
    env = make_env(SMALL, g, ctx, seed=11)
    ref = run_eager(g, env())
    static = run_plan(validate(build_plan(g, ctx, SMALL, num_sms=7)), env(), SMALL, seed=0)
    plan = validate(build_plan(g, ctx, SMALL, num_sms=7, scheduler="dynamic"))
    for seed in (0, 1, 2):
        out = run_plan(plan, env(), SMALL, seed=seed, epochs=2)
        compare(g, out, ref, f"dynamic seed={seed}")
        for name in g.produced_tensors():  # which virtual CTA ran a tile changes nothing
            assert torch.equal(out[name].view(torch.uint8), static[name].view(torch.uint8)), (name, seed)


# ---- host side of the kernel: ABI, raw plans, trace ------------------------------------------------------------------

def test_claim_counter_is_in_the_params_and_the_controller_claims_modulo_the_step():
    assert [f for f, _ in D._Params._fields_][-2:] == ["claim_counter", "reserved"]
    src = (CSRC / "megakernel.cuh").read_text()
    # every step takes max_queue_len + gridDim.x claims: the host's max_epoch bound relies on this period
    assert re.search(r"v % \(static_cast<uint32_t>\(p\.max_queue_len\) \+ gridDim\.x\)", src)
    assert "run_dynamic" in src and "step_dynamic" in src


def test_raw_dynamic_plans_are_checked():
    chain = D.chain_plan(6, 4, seed=2)
    dyn = D.as_dynamic(chain, 3)
    assert tuple(dyn.instructions.shape) == (1, 24, 32) and dyn.num_counters == 25 and dyn.claim_counter == 24
    assert dyn.grid_ctas == 3 and chain.grid_ctas == 6 and chain.claim_counter == -1
    for j in range(24):  # position-major: (i, q) = divmod(j, 6)
        i, q = divmod(j, 6)
        assert torch.equal(dyn.instructions[0, j], chain.instructions[q, i])
    assert D.max_epoch(dyn) == (2**32 - 1) // (24 + 3)
    with pytest.raises(D.MegaRtpError, match="one list"):
        D.RawPlan(chain.instructions, chain.num_counters, dispatch="dynamic", num_ctas=4)
    with pytest.raises(D.MegaRtpError, match="dispatch must be"):
        D.RawPlan(chain.instructions, chain.num_counters, dispatch="greedy")


def test_trace_of_a_dynamic_plan_is_decoded_per_sm():
    p = build_plan(build_prefix_graph(SMALL), ShapeContext.independent([300, 70]), SMALL, num_sms=3,
                   scheduler="dynamic")
    n = p.instructions.shape[1]
    raw = torch.zeros(1, n, T.TRACE_WORDS, dtype=torch.int64)
    clock = {7: 1000, 9: 1000, 11: 1000}
    for i in range(n):  # list order, round-robin over three SMs, each 100 ns
        sm = (7, 9, 11)[i % 3]
        f = clock[sm]
        raw[0, i, :4] = torch.tensor([f, f + 10, f + 100, sm << 32 | 1])
        clock[sm] = f + 100
    recs = T.decode_trace(p, raw)
    assert len(recs) == n and {r.queue for r in recs} == {7, 9, 11}
    assert all(r.smid == r.queue for r in recs)
    for sm in (7, 9, 11):
        mine = [r for r in recs if r.queue == sm]
        assert [r.pos for r in mine] == sorted(r.pos for r in mine)
        assert all(a.done <= b.start for a, b in zip(mine, mine[1:]))
    assert T.summarize(recs)["instructions"] == n


# ---- GPU -------------------------------------------------------------------------------------------------------------

def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.gpu
def test_gpu_dynamic_noop_chain_steps_and_graph_replays():
    q = _sms()
    plan = D.as_dynamic(D.chain_plan(q, 6, seed=4), q)
    n = plan.instructions.shape[1]
    r = D.PlanRunner(plan, None, "cuda")
    for e in range(1, 301):
        r.launch(e)
    r.check()
    events = plan.num_counters - 1
    assert bool((r.counters[:events] == 300).all()), "every event at epochs x threshold"
    assert int(r.counters[plan.claim_counter]) == 300 * (n + q), "each step takes every instruction + one stop per CTA"
    assert int(r.state[1]) == 300 * q
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(10):
            r.launch(None)
    for _ in range(20):
        g.replay()
    r.check()
    assert r.epoch == 500 and bool((r.counters[:events] == 500).all())
    assert int(r.counters[plan.claim_counter]) == 500 * (n + q)


@pytest.mark.gpu
def test_gpu_dynamic_noop_chain_with_few_ctas_and_trace():
    plan = D.as_dynamic(D.chain_plan(32, 6, seed=5), 4)  # 192 instructions over 4 CTAs
    r = D.PlanRunner(plan, None, "cuda", trace=True)
    r.launch(1)
    r.check()
    recs = r.trace_records()
    assert len(recs) == 192 and len({rec.smid for rec in recs}) <= 4
    ready_of = {e: rec.ready for rec in recs for e in rec.signals}
    assert all(rec.ready >= ready_of[e] for rec in recs for e, _ in rec.waits), "ready before a producer"


def _prefix(m: int, scheduler: str, num_sms: int | None = None, seed: int = 3, claim_lead=None):
    from glm5_fastpath.attn_pre.megartp.bench import bind_tensors, reference_env
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    ctx = ShapeContext.independent([500 + 37 * i for i in range(m)])
    plan = validate(build_plan(g, ctx, GLM5, num_sms=num_sms or _sms(), scheduler=scheduler, claim_lead=claim_lead))
    env, ref = reference_env(GLM5, g, ctx, seed=seed, device="cuda")
    tensors = bind_tensors(plan, env, "cuda")
    return g, plan, tensors, ref


OUTPUTS = ["q_lora_fp8", "q_lora_scale", "c_kv", "k_pe", "index_k_fp8", "index_k_scale", "index_q_fp8",
           "index_q_scale", "head_w", "q_lat", "logits", "x_bf16", "residual_out", "x_fp8", "x_scale", "topk_slots",
           "q_nope", "q_pe", "w_raw", "q_lora", "kv_cache", "index_k_cache"]  # the caches: updated in place
POISONED = ["c_kv", "k_pe", "index_k_scale", "index_q_scale", "head_w", "q_lat", "logits", "x_bf16", "residual_out",
            "x_scale", "topk_slots", "q_nope", "q_pe"]  # not the caches (E1 / the next step read their old rows)


@pytest.mark.gpu
@pytest.mark.parametrize("m,num_sms,lead", [(1, None, None), (16, None, None), (40, None, None), (16, 8, None),
                                            (16, None, "ready"), (16, None, "done")],
                         ids=["m1", "m16", "m40", "m16-8ctas", "m16-claim-at-ready", "m16-claim-at-done"])
def test_gpu_dynamic_whole_prefix_is_bitwise_the_static_plan(m, num_sms, lead):
    from glm5_fastpath.testing.numerics import assert_close, assert_equal
    _, sp, st, ref = _prefix(m, "list", num_sms)
    rs = D.PlanRunner(sp, GLM5, "cuda").bind(st)
    rs.launch(1)
    rs.check()
    _, dp, dt, _ = _prefix(m, "dynamic", num_sms, claim_lead=lead)
    rd = D.PlanRunner(dp, GLM5, "cuda").bind(dt)
    assert rd.grid == (num_sms or _sms())
    for e in range(1, 4):
        for name in POISONED:  # before every step: an element the dynamic step leaves unwritten fails
            dt[name].fill_(float("nan") if dt[name].dtype in (torch.float32, torch.bfloat16) else -7)
        rd.launch(e)
        rd.check()
        for name in OUTPUTS:
            assert_equal("megartp dynamic vs static", dt[name], st[name], context=f"M={m} epoch {e} {name}")
    assert_close("megartp dynamic", dt["q_lat"], ref["q_lat"], kind="bf16", context="q_lat vs reference")
    n = dp.instructions.shape[1]
    assert int(rd.counters[dp.claim_counter]) == 3 * (n + rd.grid)


@pytest.mark.gpu
def test_gpu_dynamic_whole_prefix_graph_replays_and_trace(tmp_path):
    from glm5_fastpath.testing.numerics import assert_equal
    _, plan, t, _ = _prefix(16, "dynamic", seed=8)
    r = D.run_plan(plan, t, 1, trace=True, cfg=GLM5)
    first = {k: t[k].clone() for k in ("q_lat", "logits", "topk_slots")}
    recs = r.trace_records()
    assert len(recs) == plan.instructions.shape[1]
    assert {rec.op for rec in recs} == {"A0", "B0", "B0.final", "C0", "B1", "D1", "D0", "D2", "E1", "E2"}
    ready_of: dict[int, float] = {}
    for rec in recs:
        for e in rec.signals:
            ready_of[e] = max(ready_of.get(e, 0.0), rec.done)
    assert all(rec.ready >= ready_of[e] - 1e3 for rec in recs for e, _ in rec.waits)  # 1 us: globaltimer granularity
    T.write_chrome_trace(tmp_path / "dynamic.json", recs)
    s = T.summarize(recs)
    print("\n" + T.format_summary(s).splitlines()[0])
    assert s["critical_path"] and s["makespan_us"] > 0
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=st):
        for _ in range(5):
            r.launch(None)
    for _ in range(20):
        g.replay()
    r.check()
    assert r.epoch == 101
    for k, v in first.items():
        assert_equal("megartp dynamic", t[k], v, context=f"after 100 graph-replayed steps: {k}")


# ---- the compute-sanitizer driver (scripts/megartp_sanitize.py): its plans, checked on CPU ----------------------------

def _sanitize_module():
    import importlib.util
    path = Path(__file__).resolve().parents[3] / "scripts" / "megartp_sanitize.py"
    spec = importlib.util.spec_from_file_location("megartp_sanitize", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sanitize_driver_cases_parse_and_their_plans_validate():
    mod = _sanitize_module()
    assert mod.parse_cases("noop1, prefix5_dynamic") == ["noop1", "prefix5_dynamic"]
    with pytest.raises(ValueError, match="choose from"):
        mod.parse_cases("noop1,everything")
    with pytest.raises(ValueError, match="choose from"):
        mod.parse_cases(" , ")
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    for name, (lens, sms, sched) in mod.PREFIX_CASES.items():
        p = validate(build_plan(g, ShapeContext.independent(lens), GLM5, num_sms=sms, scheduler=sched))
        assert p.grid_ctas == sms and p.dispatch == ("dynamic" if sched == "dynamic" else "static"), name
    one = build_plan(g, ShapeContext.independent(mod.PREFIX_CASES["prefix1"][0]), GLM5, num_sms=1)
    assert one.instructions.shape[0] == 1  # one queue: no cross-CTA wait, safe if a tool serialises CTAs
