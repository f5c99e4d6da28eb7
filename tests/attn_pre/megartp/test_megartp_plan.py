"""Host planner: task and event structure for GLM-5 at M=16 KV=8192 (article section 4), pairing checks,
the validator on hand-broken plans, operand re-binding and the scheduler's estimate."""
from collections import Counter

import pytest
import torch

from glm5_fastpath.attn_pre.megartp.isa import Instruction, decode, encode
from glm5_fastpath.attn_pre.megartp.pairing import PairingError
from glm5_fastpath.attn_pre.megartp.plan import build_plan, counter_blocks
from glm5_fastpath.attn_pre.megartp.taskgraph import PREFIX_POLICIES, build_taskgraph
from glm5_fastpath.attn_pre.megartp.validator import PlanError, dump, validate
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import OpDef, OpGraph, ShapeContext, build_prefix_graph

GLM5 = Glm5Config.preset("glm5")
SMALL = small_config()
SHARED16 = ShapeContext.shared_kv(16, 8192)
ARTICLE_TILES = {"A0": 16, "B0": 84, "C0": 48, "B1": 8, "D1": 128, "D0": 128, "D2": 256, "E1": 64}


def article_graph():
    """The article's 732-task subgraph: the prefix without E2 (logits become the output), with its 8 B1 K splits
    (our default is 4: faster in the megakernel)."""
    from glm5_fastpath.graph.prefix_graph import PrefixTiling
    return build_prefix_graph(GLM5, tiling=PrefixTiling(b1_split_k=8)).without(["E2"], retype={"logits": "output"})


_PLANS = {}


def glm5_plan(scheduler="list"):
    if scheduler not in _PLANS:
        _PLANS[scheduler] = build_plan(article_graph(), SHARED16, GLM5, scheduler=scheduler)
    return _PLANS[scheduler]


def event_structure(tg):
    return Counter((e.producer_op, tuple(sorted({tg.tasks[c].op for c in e.consumers})), e.threshold, e.policy)
                   for e in tg.events)


def test_glm5_m16_tasks_and_events_match_the_article():
    """Article: 732 tasks, 70 events: e0 A0>=16 (B0, B1), e1 A0>=16 (C0), e2 B0>=16 (D0, D1), e3 C0>=48 (D1),
    64 D0 per-head events >= 2 (D2), e68 D1>=32 (E1), e69 B1>=1 (E1).
    Ours: 748 tasks, 72 events. Differences (thresholds count every producer instruction, each increments by 1):
    - +16 B0 row finalisers (the article's B0 finalizer tiles, which its 732 leaves out), each waiting for the M
      block's 84 K-split partials through one intra-op event (B0 -> B0 >= 84); B0 -> D0/D1 then waits 16, as e2;
    - D1 -> E1 waits 128 = 32 heads x 4 K-split partials (the last partial of a head finishes it);
    - B1 -> E1 waits 8 partials (the article's one "cache written" increment by the last partial);
    - +1 event B0 -> D2 (c_kv, k_pe rows for the head-0 KV-store tiles), which the article leaves implicit."""
    p = glm5_plan()
    tg = p.taskgraph
    assert tg.tile_counts() == {**ARTICLE_TILES, "B0": 84 + 16} and len(tg.tasks) == 748 and p.stats["tasks"] == 748
    assert len([t for t in tg.tasks_of("B0") if t.final_of is not None]) == 16
    assert event_structure(tg) == Counter({
        ("A0", ("B0", "B1"), 16, "tile_cover"): 1,
        ("A0", ("C0",), 16, "tile_cover"): 1,
        ("B0", ("B0",), 84, "tile_reduce"): 1,
        ("B0", ("D0", "D1"), 16, "tile_cover"): 1,
        ("C0", ("D1",), 48, "tile_reduce"): 1,
        ("D0", ("D2",), 2, "tile_cover"): 64,
        ("B0", ("D2",), 16, "tile_cover"): 1,
        ("D1", ("E1",), 128, "tile_reduce"): 1,
        ("B1", ("E1",), 8, "whole"): 1,
    })
    assert p.num_events == 72 and len(tg.reduce_groups) == 35  # B0, C0, B1: 1 each; D1: one per head
    # the D0 -> D2 events are per head: D2 tiles of head h wait for exactly head h's two D0 tiles
    for c in tg.tasks_of("D2"):
        d0_ev = [tg.events[e] for e in tg.waits[c.id] if tg.events[e].producer_op == "D0"]
        assert len(d0_ev) == 1 and {tg.tasks[t].tile.coords[1] for t in d0_ev[0].producers} == {c.tile.coords[1]}
    # an E1 instruction: waits D1 and B1, operand row of E1 (the article's row 7: A0..E1 in topo order)
    e1 = next(decode(p.instructions[sm, i]) for sm, q in enumerate(p.queues) for i, t in enumerate(q)
              if tg.tasks[t].op == "E1")
    assert p.ops[e1.operand_row] == "E1" and e1.operand_row == 7 and len(e1.waits) == 2
    assert p.operands.ptrs.shape == (8, 16) and p.operands.ptrs.dtype == torch.uint64


@pytest.mark.slow  # ~8 s: three GLM-5 task graphs, one with 70 independent sequences
def test_full_graph_adds_e2_and_independent_sequences():
    tg = build_taskgraph(build_prefix_graph(GLM5), SHARED16)
    # the article's 732 + 16 B0 finalisers - 4 B1 partials (4 K splits, not 8) + 16 E2 rows; + 4 Q-block events
    assert len(tg.tasks) == 760 and len(tg.events) == 76
    assert {e.threshold for e in tg.events if e.producer_op == "E1"} == {16}
    ind = build_taskgraph(build_prefix_graph(GLM5), ShapeContext.independent([8192] * 16))
    assert ind.tile_counts()["E1"] == 256  # one Q block per token x 16 KV splits
    e1e2 = [e for e in ind.events if e.producer_op == "E1"]
    assert len(e1e2) == 16 and {e.threshold for e in e1e2} == {16}
    big = build_taskgraph(build_prefix_graph(GLM5), ShapeContext.independent([300] * 70))  # two M blocks
    a0b0 = [e for e in big.events if e.producer_op == "A0" and e.tensors == ("x_fp8", "x_scale")]
    assert sorted(e.threshold for e in a0b0) == [6, 64]  # tile_cover per M block


@pytest.mark.parametrize("pair,policy,match", [
    (("A0", "B0"), "tile", "needs exactly one"),
    (("C0", "D1"), "tile_cover", "split-K partials"),
    (("D0", "D2"), "tile_reduce", "write final values"),
    (("E1", "E2"), "bogus", "unknown policy"),
])
def test_pairing_rejects_a_wrong_registered_policy(pair, policy, match):
    with pytest.raises(PairingError, match=match) as e:
        build_taskgraph(build_prefix_graph(SMALL), ShapeContext.shared_kv(4, 300), {**PREFIX_POLICIES, pair: policy})
    assert policy == "bogus" or f"{pair[0]}->{pair[1]}" in str(e.value)


def test_pairing_reports_an_uncovered_region():
    g = build_prefix_graph(GLM5)
    d0 = g.ops["D0"]
    gap = OpDef("D0", d0.inputs, d0.outputs, d0.ref, lambda c: d0.tiles(c)[1:], d0.tile_axes)  # head 0, cols 0:128
    g2 = OpGraph([gap if o.name == "D0" else o for o in g.ops.values()], g.tensors.values()).validate()
    with pytest.raises(PairingError, match=r"D0->D2 \(tile_cover\): D2 tile 0 reads q_nope\[0:4, 0:1, 0:192\]; "
                                           r"region q_nope\[0:4, 0:1, 0:128\] is uncovered"):
        build_taskgraph(g2, ShapeContext.shared_kv(4, 300))


def test_epoch_targets_are_exact():
    """Monotone counters: each event gets exactly `threshold` increments per step, so the step-e target
    epoch x threshold is reached exactly when step e's producers are done."""
    p = glm5_plan()
    incs = Counter()
    for sm in range(p.instructions.shape[0]):
        for i in range(p.instructions.shape[1]):
            for ev, inc, _ in decode(p.instructions[sm, i]).signals:
                incs[ev] += inc
    assert all(incs[e.id] == e.threshold for e in p.taskgraph.events)
    assert p.stats["max_epoch"] >= 2**24


def _small_plan(num_sms=4, scheduler="list"):
    return build_plan(build_prefix_graph(SMALL), ShapeContext.shared_kv(4, 300), SMALL, num_sms=num_sms,
                      scheduler=scheduler)


def _find(plan, op, pred=lambda ins: True):
    for sm in range(plan.instructions.shape[0]):
        for i in range(plan.instructions.shape[1]):
            ins = decode(plan.instructions[sm, i])
            if ins.family is not None and ins.family.name == op and pred(ins):
                return sm, i, ins
    raise AssertionError(f"no {op} instruction")


def _partial(ins) -> bool:
    return ins.reduce_counter >= 0  # a split-K partial, not one of B0's row finalisers


def _put(plan, sm, i, ins: Instruction):
    plan.instructions[sm, i] = torch.tensor(encode(ins), dtype=torch.int32)


def test_validator_accepts_real_plans():
    validate(glm5_plan())
    validate(glm5_plan("round_robin"))
    validate(_small_plan(num_sms=1))
    text = dump(_small_plan())
    assert "SM 0:" in text and "wait e" in text and "signal e" in text and "NOOP" in text


def test_validator_catches_a_missing_wait():
    p = _small_plan()
    sm, i, ins = _find(p, "D2")
    _put(p, sm, i, Instruction(**{**ins.__dict__, "waits": ins.waits[1:]}))
    with pytest.raises(PlanError, match=r"D2 tile \d+\) reads .* but waits for none of them"):
        validate(p)


def test_validator_catches_a_wait_on_a_later_producer_in_the_same_queue():
    p = _small_plan(num_sms=1)
    q = p.queues[0]
    tg = p.taskgraph
    c = next(i for i, t in enumerate(q) if tg.tasks[t].op == "D2")
    prod = max(i for i, t in enumerate(q) if t in tg.preds(q[c]))
    a, b = p.instructions[0, prod].clone(), p.instructions[0, c].clone()
    p.instructions[0, prod], p.instructions[0, c] = b, a  # the consumer now runs before its producer
    with pytest.raises(PlanError, match="deadlock.*producers later in the same queue"):
        validate(p)


def test_validator_catches_a_threshold_too_high():
    p = _small_plan()
    sm, i, ins = _find(p, "D1")
    ev, thr = ins.waits[0]
    _put(p, sm, i, Instruction(**{**ins.__dict__, "waits": ((ev, thr + 1),) + ins.waits[1:]}))
    with pytest.raises(PlanError, match=rf"waits event {ev} >= {thr + 1} but its producers increment it by {thr}"):
        validate(p)


def test_validator_catches_an_over_synchronised_consumer():
    p = _small_plan()
    tg = p.taskgraph
    sm, i, ins = _find(p, "D2", lambda ins: ins.named_payload()["head"] == 1)
    other = next(e.id for e in tg.events if e.producer_op == "D0" and
                 all(tg.tasks[t].tile.coords[1] == 0 for t in e.producers))
    waits = tuple((other, thr) if tg.events[ev].producer_op == "D0" else (ev, thr) for ev, thr in ins.waits)
    _put(p, sm, i, Instruction(**{**ins.__dict__, "waits": waits + ins.waits[:0]}))
    with pytest.raises(PlanError, match="missing wait|does not read"):
        validate(p)


def test_rebind_changes_pointers_not_instructions():
    from glm5_fastpath.attn_pre.megartp.interpreter import allocate
    from glm5_fastpath.graph import prefix_env
    from glm5_fastpath.testing.decode_step import make_decode_step
    from glm5_fastpath.weights import random_layer
    p = _small_plan()
    w = random_layer(SMALL, SMALL.first_k_dense_replace, seed=0).attn
    g = p.graph

    def env():
        s = make_decode_step(SMALL, [300] * 4, seed=1)
        return allocate(p, prefix_env(g, w=w, hidden=s.hidden, residual=s.residual, positions=s.positions,
                                      out_cache_loc=s.out_cache_loc, seq_lens=s.seq_lens, block_table=s.block_table,
                                      kv_cache=s.kv_cache, index_k_cache=s.index_k_cache))
    before = p.instructions.clone()
    t1 = p.rebind(env()).ptrs.clone()
    e2 = env()
    t2 = p.rebind(e2).ptrs.clone()
    assert torch.equal(p.instructions, before)
    assert not torch.equal(t1, t2)
    row, slot = p.ops.index("D2"), p.operands.slot_names(p.ops.index("D2")).index("kv_cache_written")
    assert int(t2[row, slot]) == e2["kv_cache"].data_ptr()  # in-place cache version = the cache's storage
    assert p.operands.tensor(row, "kv_cache_written") is e2["kv_cache"]


def test_list_scheduler_beats_round_robin_on_glm5():
    p = glm5_plan()
    est = p.stats["est_makespan_us"]
    assert est["list"] <= est["round_robin"], est
    assert p.stats["critical_path_us"] <= est["list"]
    assert glm5_plan("round_robin").instructions.shape == (132, 6, 32)  # 732 / 132 -> 6 per queue


def test_b0_reduce_group_owns_one_sub_counter_per_weight_tile():
    p = glm5_plan()
    tg = p.taskgraph
    (b0,) = [g for g in tg.reduce_groups if g.op == "B0"]
    start, n = counter_blocks(tg)[b0.id]
    assert n == 1 + 21  # 2624 qkv_a rows in 128-row tiles: the device's tile t counts at rc + 1 + t
    assert p.num_counters == p.num_events + len(tg.reduce_groups) + 21
    rc = p.reduce_counter(b0.id)
    assert rc == p.num_events + start and _find(p, "B0", _partial)[2].reduce_counter == rc
    others = {decode(p.instructions[sm, i]).reduce_counter for sm in range(p.instructions.shape[0])
              for i in range(p.instructions.shape[1])} - {-1, rc}
    assert others and not others & set(range(rc + 1, rc + n))
    assert max(others) < p.num_counters


def test_validator_catches_a_reduce_group_inside_the_b0_block():
    p = _small_plan()
    rc = _find(p, "B0", _partial)[2].reduce_counter
    d1 = _find(p, "D1")[2].reduce_counter
    for sm in range(p.instructions.shape[0]):
        for i in range(p.instructions.shape[1]):
            ins = decode(p.instructions[sm, i])
            if ins.reduce_counter == d1:  # the whole D1 group moved onto B0's first tile sub-counter
                _put(p, sm, i, Instruction(**{**ins.__dict__, "reduce_counter": rc + 1}))
    with pytest.raises(PlanError, match=f"reduce counter {rc}: counter {rc + 1} of its block is also used"):
        validate(p)


def test_cost_model_charges_reduce_group_finishes():
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    p = glm5_plan()
    tg = p.taskgraph
    costs = S.task_costs_us(tg, GLM5, 132)
    finish = S.group_finish_us(tg)
    by_op = {tg.reduce_groups[g].op for g in finish}
    assert by_op == {"B1", "C0", "D1"}  # B0's rows are finished by finaliser tasks, not by a last arriver
    # one 16-token block per group at M = 16; C0's finish is a bf16 round, the others stage, sum and run an epilogue
    assert all(v == S.GROUP_FINISH_US.get(tg.reduce_groups[g].op, S.FINISH_US) for g, v in finish.items())
    assert all(c >= S.DEFAULT_OVERHEAD_US for c in costs)
    cold, setup = S.task_cold_us(tg), S.task_setup_us(tg)
    # Every member of a finishing group holds its queue for the finish (any member may arrive last) ...
    queues = S.list_schedule(tg, costs, 132, finish, cold, setup)
    est = S.estimate_makespan(tg, queues, costs, finish, cold, setup)
    assert est > S.estimate_makespan(tg, queues, costs, None, cold, setup)  # ... the replay charges it once per group
    assert p.stats["est_makespan_us"]["list"] == pytest.approx(est)
    prio = S.critical_path_priority(tg, costs, finish)
    plain = S.critical_path_priority(tg, costs)
    b1 = [t.id for t in tg.tasks if t.op == "B1"]
    assert all(prio[t] >= plain[t] + S.FINISH_US - 1e-9 for t in b1)


def test_estimate_makespan_puts_a_finish_on_the_last_members_queue():
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    tg = glm5_plan().taskgraph
    costs = S.task_costs_us(tg, GLM5, 132)
    (b1,) = [g for g in tg.reduce_groups if g.op == "B1"]
    members = list(b1.tasks)
    order = [t.id for t in tg.tasks]  # everything on one queue, topological: the finish runs once, in series
    one = S.estimate_makespan(tg, [order], costs, {b1.id: 100.0})
    assert one == pytest.approx(sum(costs) + 100.0)
    # Members alone on their own queues, the rest after them on queue 0: the group ends after the slowest member
    # plus the finish, so the consumers on queue 0 cannot start earlier.
    rest = [t for t in order if t not in members]
    split = [rest] + [[m] for m in members]
    with pytest.raises(RuntimeError, match="deadlocks"):
        S.estimate_makespan(tg, [list(reversed(order))], costs)
    est = S.estimate_makespan(tg, split, costs, {b1.id: 100.0})
    assert est >= 100.0 + max(costs[m] for m in members)


def test_cold_cost_charged_once_per_run_of_an_op_on_a_queue():
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    tg = build_taskgraph(build_prefix_graph(GLM5), ShapeContext.independent([8192] * 4))
    costs = S.task_costs_us(tg, GLM5, 132)
    cold = S.task_cold_us(tg)
    e2, d2 = ([t.id for t in tg.tasks if t.op == op] for op in ("E2", "D2"))
    assert e2 and all(cold[t] == S.COLD_US["E2"] for t in e2)
    order = [t.id for t in tg.tasks]  # topological, all on one queue
    first_of_run = [t for i, t in enumerate(order) if i == 0 or S._kind(tg.tasks[order[i - 1]]) != S._kind(tg.tasks[t])]
    assert e2[0] in first_of_run and d2[0] in first_of_run and d2[1] not in first_of_run
    one = S.estimate_makespan(tg, [order], costs, None, cold)
    assert one == pytest.approx(sum(costs) + sum(cold[t] for t in first_of_run))


@pytest.mark.parametrize("m", [1, 16, 64])
def test_list_scheduler_with_cold_costs_is_no_worse_than_without(m):
    """Same-op queue reuse (skipping the cold cost) must not lengthen the estimated step."""
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    tg = build_taskgraph(build_prefix_graph(GLM5), ShapeContext.independent([8192] * m))
    costs, cold, finish = S.task_costs_us(tg, GLM5, 132), S.task_cold_us(tg), S.group_finish_us(tg)
    aware = S.estimate_makespan(tg, S.list_schedule(tg, costs, 132, finish, cold), costs, finish, cold)
    blind = S.estimate_makespan(tg, S.list_schedule(tg, costs, 132, finish), costs, finish, cold)
    assert aware <= blind + 1e-6, (aware, blind)


def test_setup_overlaps_the_wait_for_producers():
    """A task's prologue (SETUP_US) runs from when its queue is free: hidden behind a wait, paid when inputs are
    ready first."""
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    tg = build_taskgraph(build_prefix_graph(GLM5), ShapeContext.independent([8192]))
    costs = S.task_costs_us(tg, GLM5, 132)
    setup = [0.0] * len(tg.tasks)
    a0 = next(t.id for t in tg.tasks if t.op == "A0")
    b0 = next(t.id for t in tg.tasks if t.op == "B0")
    rest = [t.id for t in tg.tasks if t.id not in (a0, b0)]
    queues = [[a0], [b0]] + [[t] for t in rest]  # one task per queue: B0 waits for A0 on another queue
    plain = S.estimate_makespan(tg, queues, costs)
    setup[b0] = costs[a0] - 0.5  # ends before A0 does: hidden
    assert S.estimate_makespan(tg, queues, costs, setup=setup) == pytest.approx(plain)
    setup[a0] = 2.0  # A0 has no producer: its prologue delays everything after it
    assert S.estimate_makespan(tg, queues, costs, setup=setup) == pytest.approx(plain + 2.0)


@pytest.mark.parametrize("m", [1, 16, 64])
def test_insertion_scheduler_plans_validate_and_place_every_task_once(m):
    ctx = ShapeContext.independent([8192] * m)
    for cfg in (GLM5, small_config()):
        p = validate(build_plan(build_prefix_graph(cfg), ctx, cfg, scheduler="insertion"))
        placed = sorted(t for q in p.queues for t in q)
        assert placed == list(range(len(p.taskgraph.tasks)))
        assert p.stats["est_makespan_us"]["insertion"] >= p.stats["critical_path_us"] - 1e-6
