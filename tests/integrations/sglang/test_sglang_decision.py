"""Pure routing decisions: every refusal reason of check_model and every fallback reason of route_step."""
import dataclasses

import pytest

from glm5_fastpath.integrations.sglang import decision as d
from glm5_fastpath.selection import parse

GOOD = d.ModelFacts(architecture="GlmMoeDsaForCausalLM", gpu_name="NVIDIA H200", capability=(9, 0),
                    quant_method="fp8", weight_block_size=(128, 128))
TABLE = parse({"version": 1, "buckets": [{"tokens": t, "prefix": "stock", "moe": "stock"} for t in (1, 2, 4, 8, 16)]})


def test_good_model_is_accepted():
    assert d.check_model(GOOD) is None
    assert d.check_model(dataclasses.replace(GOOD, capability=(10, 0))) is None  # >= sm_90


@pytest.mark.parametrize("change,reason", [
    (dict(architecture="DeepseekV3ForCausalLM"), "architecture"),
    (dict(architecture=None), "architecture"),
    (dict(is_draft_worker=True), "draft_worker"),
    (dict(capability=None, gpu_name=None), "gpu_arch"),
    (dict(capability=(8, 0), gpu_name="NVIDIA A100"), "gpu_arch"),
    (dict(quant_method=None, weight_block_size=None), "quantization"),
    (dict(quant_method="fp8", weight_block_size=None), "quantization"),
    (dict(quant_method="awq"), "quantization"),
    (dict(tp_size=8), "parallel_layout"),
    (dict(ep_size=8), "parallel_layout"),
    (dict(dp_size=2), "parallel_layout"),
    (dict(pp_size=2), "parallel_layout"),
    (dict(enable_dp_attention=True), "parallel_layout"),
])
def test_each_refusal_reason(change, reason):
    r = d.check_model(dataclasses.replace(GOOD, **change))
    assert r is not None and r.reason == reason
    assert d.REASONS[reason] in r.message()


@pytest.mark.parametrize("mode,m,reason,bucket", [
    ("DECODE", 1, "table_selects_stock", 1),
    ("DECODE", 3, "table_selects_stock", 4),
    ("DECODE", 16, "table_selects_stock", 16),
    ("DECODE", 17, "above_largest_bucket", None),
    ("DECODE", 0, "empty_batch", None),
    ("EXTEND", 4, "prefill_extend", None),
    ("MIXED", 4, "prefill_extend", None),
    ("SPLIT_PREFILL", 4, "prefill_extend", None),
    ("DRAFT_EXTEND_V2", 4, "prefill_extend", None),
    ("TARGET_VERIFY", 4, "target_verify", None),
    ("IDLE", 0, "idle", None),
    (None, 4, "unknown_mode", None),
    ("SOMETHING_NEW", 4, "unknown_mode", None),
])
def test_route_step_reasons(mode, m, reason, bucket):
    r = d.route_step(mode, m, TABLE)
    assert (r.reason, r.bucket, r.prefix, r.moe, r.path) == (reason, bucket, "stock", "stock", "stock")
    assert r.reason in d.REASONS


def test_unbuilt_executor_falls_back_and_built_one_is_used():
    t = parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "megartp", "moe": "megamoe:m8"}]})
    r = d.route_step("DECODE", 5, t)  # MegaMoE is built (family "megamoe"), MegaRTP is not routed
    assert (r.prefix, r.moe, r.reason, r.path) == ("stock", "megamoe:m8", "executor_not_built", "fast")
    assert (r.wanted_prefix, r.wanted_moe) == ("megartp", "megamoe:m8")
    t = parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "megamoe:m8"}]})
    r = d.route_step("DECODE", 5, t)
    assert (r.prefix, r.moe, r.reason, r.path, r.bucket_label) == ("cmp", "megamoe:m8", "selected", "fast", "8")
    r = d.route_step("DECODE", 5, t, built_prefix=frozenset(), built_moe=frozenset())
    assert (r.prefix, r.moe, r.reason, r.path) == ("stock", "stock", "executor_not_built", "stock")
    r = d.route_step("DECODE", 5, t, built_prefix=frozenset({"cmp"}), built_moe=frozenset())
    assert (r.prefix, r.moe, r.reason, r.path) == ("cmp", "stock", "executor_not_built", "fast")
    t = parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "stock", "moe": "megamoe"}]})
    r = d.route_step("DECODE", 8, t)  # plain "megamoe": MegaMoE's default config for the bucket
    assert (r.prefix, r.moe, r.reason, r.path) == ("stock", "megamoe", "selected", "fast")
    assert d.executor_family("megamoe:bn16_s6_g512_w4") == "megamoe" and d.executor_family("stock") == "stock"


def test_built_executors_match_the_registered_ones():
    from glm5_fastpath.integrations.sglang import patch

    assert d.BUILT_PREFIX == frozenset({"cmp"}) and d.BUILT_MOE == frozenset({"megamoe"})
    assert set(patch.EXECUTORS["prefix"]) == d.BUILT_PREFIX and set(patch.EXECUTORS["moe"]) == d.BUILT_MOE


def test_log_lines():
    r = d.route_step("DECODE", 16, TABLE)
    assert d.component_log_line("prefix", r) == "glm5_fastpath: bucket 16 -> stock (prefix: selection table picks stock)"
    assert d.component_log_line("moe", r) == "glm5_fastpath: bucket 16 -> stock (MoE: selection table picks stock)"
    t = parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "stock"}]})
    assert d.component_log_line("prefix", d.route_step("DECODE", 2, t)) == "glm5_fastpath: bucket 8 -> cmp (prefix)"
    t = parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "megartp", "moe": "stock"}]})
    assert d.component_log_line("prefix", d.route_step("DECODE", 2, t)) == \
        "glm5_fastpath: bucket 8 -> stock (prefix executor megartp not built yet)"
    line = d.component_log_line("prefix", d.route_step("EXTEND", 300, TABLE))
    assert line.startswith("glm5_fastpath: prefill_extend M=300 -> stock (prefix: prefill")
    assert "above the largest bucket" in d.component_log_line("moe", d.route_step("DECODE", 99, TABLE))
    assert d.step_log_line(d.route_step("TARGET_VERIFY", 4, TABLE)).startswith("glm5_fastpath: target_verify M=4 step -> stock")


def test_once_log():
    o = d.OnceLog()
    assert o.first("prefix", 16, "x") and not o.first("prefix", 16, "x") and o.first("moe", 16, "x")


def test_prefill_moe_route(monkeypatch):
    r = d.route_step("EXTEND", 300, TABLE, prefill_moe_max=4096)
    assert (r.prefix, r.moe, r.reason, r.path, r.bucket) == ("stock", "megamoe", "prefill_moe", "fast", None)
    assert "MoE on MegaMoE" in d.component_log_line("moe", r)
    assert d.route_step("MIXED", 4096, TABLE, prefill_moe_max=4096).moe == "megamoe"
    for mode, m, cap in (("EXTEND", 4097, 4096), ("EXTEND", 300, 0), ("TARGET_VERIFY", 4, 4096), ("IDLE", 0, 4096),
                         ("EXTEND", 0, 4096)):
        assert d.route_step(mode, m, TABLE, prefill_moe_max=cap).moe == "stock"
    assert d.route_step("EXTEND", 300, TABLE, built_moe=frozenset(), prefill_moe_max=4096).moe == "stock"
    monkeypatch.delenv(d.ENV_PREFILL_MOE, raising=False)
    assert d.prefill_moe_max_tokens() == d.DEFAULT_PREFILL_MOE_MAX == 0  # opt-in (decision.py: why)
    for raw, want in (("0", 0), ("2048", 2048), ("-5", 0), ("lots", 0)):
        monkeypatch.setenv(d.ENV_PREFILL_MOE, raw)
        assert d.prefill_moe_max_tokens() == want


def test_router_gives_the_prefill_route_to_the_moe_seam_only():
    from glm5_fastpath.integrations.sglang import patch

    router = patch.Router(TABLE, prefill_moe_max=8192)
    assert router.route("moe", "EXTEND", 1000).reason == "prefill_moe"
    assert router.route("prefix", "EXTEND", 1000).reason == "prefill_extend"
    assert router.route("step", "EXTEND", 1000).reason == "prefill_extend"
    assert patch.Router(TABLE, prefill_moe_max=0).route("moe", "EXTEND", 1000).reason == "prefill_extend"


def test_route_switch(monkeypatch):
    """A route's env switch: unset / empty -> the default; an off value (any case, padded) -> off; else on."""
    from glm5_fastpath.integrations.sglang.decision import SWITCH_OFF, switch_on

    name = "GLM5_FASTPATH_TEST_SWITCH"
    monkeypatch.delenv(name, raising=False)
    assert switch_on(name, True) is True and switch_on(name, False) is False
    monkeypatch.setenv(name, "  ")
    assert switch_on(name, True) is True and switch_on(name, False) is False
    for off in SWITCH_OFF + (" Stock ", "OFF"):
        monkeypatch.setenv(name, off)
        assert switch_on(name, True) is False
    for on in ("1", "ours", "yes", "force"):
        monkeypatch.setenv(name, on)
        assert switch_on(name, False) is True
