"""CMP modes: validation, and which wait points the kernels can realize (entry / prologue need a flag)."""
import types

import pytest

from glm5_fastpath.attn_pre.cmp import MODES, get_mode
from glm5_fastpath.attn_pre.cmp.modes import OP_FUNCTIONS, Mode, resolve_wait_points, wait_support
from glm5_fastpath.config import small_config
from glm5_fastpath.graph import build_prefix_graph

ORDER = build_prefix_graph(small_config()).topo_order()


def test_mode_table():
    assert set(MODES) == {"serial", "serial_pdl", "multistream", "multistream_pdl_entry",
                          "multistream_pdl_prologue", "full", "full_prio_index", "full_prio_b1"}
    assert MODES["full"] == Mode("full", True, True, "after_prefetch")
    assert MODES["full"].priority_ops == () and MODES["full_prio_b1"].priority_ops == ("B1", "E1", "E2")
    assert {k: v for k, v in vars(MODES["full_prio_index"]).items() if k not in ("name", "priority_ops")} == \
        {k: v for k, v in vars(MODES["full"]).items() if k not in ("name", "priority_ops")}
    assert not MODES["serial"].pdl and not MODES["serial"].multistream
    with pytest.raises(ValueError, match="unknown CMP mode"):
        get_mode("fastest")
    with pytest.raises(ValueError):
        Mode("bad", True, True, None)
    with pytest.raises(ValueError):
        Mode("bad", True, True, "somewhere")


def test_entry_and_prologue_need_a_kernel_flag():
    from glm5_fastpath.ref import prefix as ref_prefix

    sup = wait_support(ref_prefix, ORDER)  # the reference has no pdl_wait= (nor pdl=)
    with pytest.raises(NotImplementedError, match="pdl_wait") as e:
        resolve_wait_points(MODES["multistream_pdl_entry"], ORDER, sup)
    for op in ("A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"):
        assert f"'{op}'" in str(e.value)
    with pytest.raises(NotImplementedError) as e:
        resolve_wait_points(MODES["multistream_pdl_prologue"], ORDER, sup)
    msg = str(e.value)
    assert "'D2'" in msg and "'E1'" in msg and "'E2'" not in msg  # E2: native
    for m in ("serial", "serial_pdl", "multistream", "full"):
        resolve_wait_points(MODES[m], ORDER, sup)


def test_the_kernels_realize_every_mode():
    from glm5_fastpath import ops

    sup = wait_support(ops, ORDER)
    for m in MODES.values():
        plans = resolve_wait_points(m, ORDER, sup)
        if m.wait_point in ("entry", "after_prologue"):
            assert all(p.realized == m.wait_point for p in plans.values())


def test_e1_meta_before_wait_alone_realizes_the_prologue_point():
    def e1(*a, pdl=True, meta_before_wait=True, **k):
        return None
    ns = types.SimpleNamespace(e1_indexer_logits=e1)
    plans = resolve_wait_points(MODES["multistream_pdl_prologue"], ["E1"], wait_support(ns, ["E1"]))
    assert plans["E1"].kwargs == {"meta_before_wait": False}


def _fake_ns_with_flag():
    def fn(*a, pdl=True, pdl_wait="after_prefetch", **k):
        return None
    return types.SimpleNamespace(**{name: fn for name in OP_FUNCTIONS.values()})


def test_flagged_kernels_enable_entry_and_prologue():
    ns = _fake_ns_with_flag()
    for mode, want in (("multistream_pdl_entry", "entry"), ("multistream_pdl_prologue", "after_prologue")):
        plans = resolve_wait_points(MODES[mode], ORDER, wait_support(ns, ORDER))
        assert plans["B0"].kwargs == {"pdl_wait": want} and plans["B0"].realized == want
        # E2 waits after its prologue natively: a prologue request needs no flag
        if want == "after_prologue":
            assert plans["E2"].kwargs == {} and plans["E2"].realized == "after_prologue"


def test_executor_rejects_unrealizable_mode_at_construction():
    from glm5_fastpath.attn_pre.cmp.executor import CmpExecutor
    from glm5_fastpath.weights import random_layer

    cfg = small_config()
    w = random_layer(cfg, 1, seed=0)
    from glm5_fastpath.ref import prefix as ref_prefix

    with pytest.raises(NotImplementedError, match="pdl_wait"):
        CmpExecutor(cfg, w, "cpu", mode="multistream_pdl_entry", impl=ref_prefix)
    ex = CmpExecutor(cfg, w, "cpu", mode="multistream_pdl_entry")  # the kernels have pdl_wait=
    assert ex.bound._kwargs["d2_absorb_and_kv_store"] == {"pdl": True, "pdl_wait": "entry"}
    with pytest.raises(ValueError, match="unknown CMP mode"):
        CmpExecutor(cfg, w, "cpu", mode="nope")
    with pytest.raises(ValueError, match="CUDA"):
        CmpExecutor(cfg, w, "cpu", mode="serial", capture=True)


def test_selection_knows_exactly_the_cmp_modes():
    """selection.py spells the mode names out (it must stay import-light for the plugin's register())."""
    from glm5_fastpath.attn_pre.cmp.modes import MODES
    from glm5_fastpath.selection import CMP_MODES

    assert tuple(MODES) == CMP_MODES


@pytest.mark.parametrize("mode", ["full+pin:D1=0", "multistream+after:D1>D0+cap:D0=96", "full_prio_b1+prio:D1/B1",
                                  "full+pin:D1=0+pin:D0=3", "full+pin:D1=0+stages:D0=4", "serial"])
def test_selection_accepts_what_get_mode_parses(mode):
    from glm5_fastpath.selection import valid_cmp_mode

    assert valid_cmp_mode(mode)
    assert get_mode(mode).name == mode


@pytest.mark.parametrize("bad", ["full+after:D1", "full+cap:D0=x", "full+pin:D1", "full+prio:", "full+", "fast",
                                 "full+sideways:D0", "full+prio:B1,E1", "full+prio:B1//E1", None])
def test_selection_rejects_what_get_mode_rejects(bad):
    from glm5_fastpath.selection import valid_cmp_mode

    assert not valid_cmp_mode(bad)
    with pytest.raises(ValueError):
        get_mode(bad)


def test_composite_modes_parse_onto_a_named_mode():
    m = get_mode("full+after:D1>D0+cap:D0=64+prio:B1/E1")
    base = MODES["full"]
    assert (m.multistream, m.pdl, m.wait_point) == (base.multistream, base.pdl, base.wait_point)
    assert m.name == "full+after:D1>D0+cap:D0=64+prio:B1/E1"
    assert m.order_edges == (("D1", "D0"),) and m.grid_caps == (("D0", 64),) and m.priority_ops == ("B1", "E1")
    p = get_mode("full_prio_b1+prio:D1/B1")  # priorities add to the named mode's, once each
    assert p.priority_ops == ("B1", "E1", "E2", "D1")
    assert get_mode("multistream_pdl_prologue+after:D1>D0").wait_point == "after_prologue"
    assert get_mode(m) is m and get_mode("full") is MODES["full"]
    assert get_mode("full+pin:D1=0+pin:D0=3").pins == (("D1", 0), ("D0", 3))
    assert get_mode("full+stages:D0=4").stage_caps == (("D0", 4),)


@pytest.mark.parametrize("bad", ["full+after:D1", "full+after:D1>", "full+cap:D0", "full+cap:D0=x", "full+cap:D0=-1",
                                 "full+prio:", "full+pin:D1", "full+pin:D1=a", "full+stages:D0=1", "full+sideways:D0", "full+", "fast+after:D1>D0", "full+after:d1>D0"])
def test_composite_modes_reject_bad_modifiers(bad):
    with pytest.raises(ValueError, match="CMP mode"):
        get_mode(bad)


def test_composite_mode_field_checks():
    with pytest.raises(ValueError, match="twice"):
        Mode("x", True, True, "after_prefetch", order_edges=(("D0", "D0"),))
    with pytest.raises(ValueError, match="at least 1"):
        Mode("x", True, True, "after_prefetch", grid_caps=(("D0", 0),))
    with pytest.raises(ValueError, match="at least 2"):
        Mode("x", True, True, "after_prefetch", stage_caps=(("D0", 1),))
