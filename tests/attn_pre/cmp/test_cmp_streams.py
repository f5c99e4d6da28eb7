"""CMP stream assignment, launch schedule and wait points for the GLM-5 graph and the GLM-5.2 shared layer."""
import pytest

from glm5_fastpath.attn_pre.cmp import MODES, ScheduleError, assign_streams, build_schedule, check_exclusive
from glm5_fastpath.attn_pre.cmp.modes import NATIVE_WAIT_POINTS, resolve_wait_points, wait_support
from glm5_fastpath.attn_pre.cmp.streams import Launch, Schedule, validate_schedule
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import build_prefix_graph

GLM5 = Glm5Config.preset("glm5")
FULL = build_prefix_graph(GLM5)
SHARED = build_prefix_graph(Glm5Config.preset("glm5.2"), full_indexer=False)

# the article's CMP layout (design section 7): main = QKV-A then q_b / W_UK; side 1 = head gate then the
# indexer Q -> logits -> top-k path; side 2 = indexer K (+ index-K cache store)
EXPECTED_STREAMS = {"A0": 0, "B0": 0, "D0": 0, "D2": 0, "C0": 1, "D1": 1, "E1": 1, "E2": 1, "B1": 2}
EXPECTED_CROSS = {("A0", "C0"), ("A0", "B1"), ("B0", "D1"), ("B1", "E1")}
EXPECTED_WAITS = {"A0": (), "B0": (), "C0": ("A0",), "B1": ("A0",), "D1": ("B0",), "D0": (), "D2": (),
                  "E1": ("B1",), "E2": ()}
# same-stream predecessor = the edge the PDL attribute serializes programmatically
EXPECTED_AFTER = {"A0": None, "B0": "A0", "C0": None, "B1": None, "D1": "C0", "D0": "B0", "D2": "D0",
                  "E1": "D1", "E2": "E1"}


def test_glm5_stream_assignment():
    assert assign_streams(FULL) == EXPECTED_STREAMS
    assert FULL.forks() == {"A0": ["B0", "C0", "B1"], "B0": ["D1", "D0"]}


@pytest.mark.parametrize("mode", ["multistream", "full", "multistream_pdl_entry", "multistream_pdl_prologue"])
def test_glm5_multistream_schedule(mode):
    s = build_schedule(FULL, mode)
    assert s.num_streams == 3
    assert s.launches[0].op == "A0" and s.launches[0].stream == 0  # main stream enqueued first
    assert [l.op for l in s.launches] == FULL.topo_order()
    assert {l.op: l.stream for l in s.launches} == EXPECTED_STREAMS
    assert set(s.cross_edges) == EXPECTED_CROSS
    assert {l.op: l.waits for l in s.launches} == EXPECTED_WAITS
    assert {l.op: l.after for l in s.launches} == EXPECTED_AFTER
    assert s.joins == ("E2", "B1")
    assert {l.op for l in s.launches if l.records} == {"A0", "B0", "B1", "E2"}
    assert s.streams() == {0: ["A0", "B0", "D0", "D2"], 1: ["C0", "D1", "E1", "E2"], 2: ["B1"]}
    assert all(l.pdl == MODES[mode].pdl for l in s.launches)
    assert "s1: D1 waits[B0]" in s.render()
    d = s.to_dict()
    assert d["num_streams"] == 3 and d["joins"] == ["E2", "B1"]


@pytest.mark.parametrize("mode", ["serial", "serial_pdl"])
def test_glm5_serial_schedule(mode):
    s = build_schedule(FULL, mode)
    assert s.num_streams == 1 and not s.cross_edges and not s.joins
    assert all(not l.waits and l.stream == 0 for l in s.launches)
    order = FULL.topo_order()
    assert [l.after for l in s.launches] == [None] + order[:-1]
    assert all(l.pdl == (mode == "serial_pdl") for l in s.launches)


@pytest.mark.parametrize("mode", list(MODES))
def test_glm52_shared_layer_is_one_stream(mode):
    assert SHARED.topo_order() == ["A0", "B0", "D0", "D2"]
    s = build_schedule(SHARED, mode)
    assert s.num_streams == 1 and not s.cross_edges and not s.joins
    assert [l.after for l in s.launches] == [None, "A0", "B0", "D0"]


def test_small_config_same_layout():
    assert assign_streams(build_prefix_graph(small_config())) == EXPECTED_STREAMS


def test_pins_override_and_stay_valid():
    s = build_schedule(FULL, "full", pins={"B1": 1})
    assert s.launch("B1").stream == 1 and s.launch("B1").after == "C0"
    assert s.launch("A0").stream == 0  # the schedule validated (build_schedule checks every edge)
    with pytest.raises(ScheduleError):
        assign_streams(FULL, pins={"A0": 1})
    with pytest.raises(ScheduleError):
        assign_streams(FULL, pins={"ZZ": 1})


def test_validation_catches_a_missing_wait():
    s = build_schedule(FULL, "multistream")
    broken = [l if l.op != "E1" else Launch("E1", l.stream, (), l.after, l.pdl, l.wait_point, l.records)
              for l in s.launches]
    with pytest.raises(ScheduleError, match="B1->E1"):
        validate_schedule(FULL, Schedule(s.graph, s.mode, tuple(broken), s.cross_edges, s.joins))
    side_first = (s.launches[2],) + tuple(l for l in s.launches if l is not s.launches[2])
    with pytest.raises(ScheduleError, match="main stream"):
        validate_schedule(FULL, Schedule(s.graph, s.mode, side_first, s.cross_edges, s.joins))


def test_workspace_exclusivity():
    with pytest.raises(ScheduleError, match="share a workspace"):
        check_exclusive(FULL, build_schedule(FULL, "multistream"), [["C0", "B1"]])
    check_exclusive(FULL, build_schedule(FULL, "serial"), [["C0", "B1"]])
    check_exclusive(FULL, build_schedule(FULL, "multistream"), [["B0", "D0"]])  # ordered by a path


def test_wait_points_are_explicit_data():
    from glm5_fastpath import ops

    order = FULL.topo_order()
    plans = resolve_wait_points(MODES["full"], order, wait_support(ops, order))
    s = build_schedule(FULL, "full", wait_plans=plans)
    assert s.wait_points() == NATIVE_WAIT_POINTS
    assert s.wait_points()["E2"] == "after_prologue" and s.wait_points()["B0"] == "after_prefetch"
    assert plans["E1"].kwargs == {"meta_before_wait": True}
    assert all(v is None for v in build_schedule(FULL, "multistream").wait_points().values())


def test_ordering_edge_becomes_a_cross_stream_wait():
    """after:D1>D0 (modes.py): D0 (main stream) also waits for D1's completion event; the data edges stay."""
    s = build_schedule(FULL, "full+after:D1>D0")
    assert s.launch("D0").waits == ("D1",) and s.launch("D1").records
    assert {l.op: l.stream for l in s.launches} == EXPECTED_STREAMS
    assert set(s.cross_edges) == EXPECTED_CROSS  # data edges only
    assert {l.op: l.waits for l in s.launches if l.op != "D0"} == {k: v for k, v in EXPECTED_WAITS.items() if k != "D0"}
    assert "s0: D0 waits[D1]" in s.render()
    # same stream: the enqueue order already holds it (no event)
    s2 = build_schedule(FULL, "full+after:B0>D0")
    assert s2.launch("D0").waits == ()
    # one stream: nothing to add
    assert all(not l.waits for l in build_schedule(FULL, "serial+after:D1>D0").launches)


def test_ordering_edges_are_checked():
    with pytest.raises(ScheduleError, match="against the enqueue order"):
        build_schedule(FULL, "full+after:D0>D1")
    with pytest.raises(ScheduleError, match="not prefix ops"):
        build_schedule(FULL, "full+after:X9>D0")
    with pytest.raises(ScheduleError, match="not prefix ops"):
        build_schedule(FULL, "full+pin:Q7=1")
    # a GLM-5.2 shared layer has no D1: the bucket's modifiers naming it do not apply there
    sh = build_schedule(SHARED, "full+pin:D1=0+after:D1>D0")
    assert sh.num_streams == 1 and sh.launch("D0").waits == ()
    s = build_schedule(FULL, "full+after:D1>D0")
    bad = Schedule(s.graph, s.mode, tuple(Launch(l.op, l.stream, () if l.op == "D0" else l.waits, l.after, l.pdl,
                                                 l.wait_point, l.records) for l in s.launches),
                   s.cross_edges, s.joins)
    validate_schedule(FULL, bad)  # the data edges alone are fine ...
    with pytest.raises(ScheduleError, match="ordering edge D1>D0"):
        validate_schedule(FULL, bad, [("D1", "D0")])  # ... the ordering edge is not


def test_pin_modifier_moves_d1_onto_the_main_stream():
    """pin:D1=0 (modes.py): D1 is B0's same-stream (PDL) consumer; D0 / D2 open a side stream waiting on B0."""
    s = build_schedule(FULL, "full+pin:D1=0")
    assert s.streams() == {0: ["A0", "B0", "D1", "E1", "E2"], 1: ["C0"], 2: ["B1"], 3: ["D0", "D2"]}
    assert s.launch("D1").after == "B0" and s.launch("D1").waits == ("C0",)
    assert s.launch("D0").waits == ("B0",) and s.launch("D0").after is None
    assert set(s.joins) == {"C0", "B1", "D2"}
    # an explicit pins= argument wins over the mode's
    assert build_schedule(FULL, "full+pin:D1=0", pins={"D1": 1}).launch("D1").stream == 1
    with pytest.raises(ScheduleError, match="first op"):
        build_schedule(FULL, "full+pin:A0=2")
