"""glm5_fastpath_* metrics: names, types, labels; lazy prometheus_client import; multiprocess mode."""
import os
import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest

from glm5_fastpath import metrics as gm


def test_names_types_labels():
    reg = CollectorRegistry()
    m = gm.FastpathMetrics(reg)
    m.observe_step("16", "stock", 0.004)
    m.count_path("stock", "prefill_extend")
    m.set_selected([(1, "stock", "stock"), (16, "cmp", "megamoe:m16")])
    m.observe_jit("attn_prefix_ops", 12.0)
    from glm5_fastpath.integrations.sglang.prefix_executor import layer_counter

    layer_counter(reg).labels(route="full", reason="ok").inc()  # the prefix seam's own counter
    from glm5_fastpath.integrations.sglang.moe_executor import layer_counter as moe_layer_counter

    moe_layer_counter(reg).labels(route="megamoe", reason="routed").inc()  # the MoE seam's own counter
    from glm5_fastpath.integrations.sglang.attn_core import counter as sparse_mla_counter

    sparse_mla_counter(reg).labels(route="ours", reason="routed").inc()  # the sparse-MLA seam's counter
    from glm5_fastpath.integrations.sglang.linear_route import counter as fp8_linear_counter

    fp8_linear_counter(reg).labels(route="ours", reason="routed").inc()  # the FP8-linear seam's counter
    from glm5_fastpath.integrations.sglang.norm_route import counter as norm_counter

    norm_counter(reg).labels(route="ours", reason="routed").inc()  # the norm seam's counter
    from glm5_fastpath.integrations.sglang.v_up_route import counter as v_up_counter

    v_up_counter(reg).labels(route="ours", reason="routed").inc()  # the V-up seam's counter
    fams = {f.name: f for f in reg.collect()}
    # prometheus_client strips _total from counter family names
    assert fams["glm5_fastpath_decode_step_seconds"].type == "histogram"
    assert fams["glm5_fastpath_path"].type == "counter"
    assert fams["glm5_fastpath_selected_info"].type == "gauge"
    assert fams["glm5_fastpath_jit_compile_seconds"].type == "histogram"
    for name, (typ, labels) in gm.METRICS.items():
        assert name.startswith("glm5_fastpath_")
        fam = fams[name[: -len("_total")] if typ == "counter" else name]
        got = {k for s in fam.samples for k in s.labels if k != "le"}
        assert got == set(labels), name
    assert reg.get_sample_value("glm5_fastpath_path_total", {"path": "stock", "reason": "prefill_extend"}) == 1
    assert reg.get_sample_value("glm5_fastpath_selected_info", {"bucket": "16", "prefix": "cmp", "moe": "megamoe:m16"}) == 1
    m.set_selected([(1, "stock", "stock")])  # replaces, does not accumulate
    assert reg.get_sample_value("glm5_fastpath_selected_info", {"bucket": "16", "prefix": "cmp", "moe": "megamoe:m16"}) is None
    text = generate_latest(reg).decode()
    assert 'glm5_fastpath_decode_step_seconds_bucket{bucket="16",le="0.005",path="stock"} 1.0' in text


def test_lazy_import_and_multiprocess_mode(tmp_path):
    """Importing glm5_fastpath.metrics does not import prometheus_client; with PROMETHEUS_MULTIPROC_DIR set
    (as SGLang's --enable-metrics does) the default-registry metrics reach the multiprocess collector."""
    code = """
import sys
import glm5_fastpath.metrics as gm
assert "prometheus_client" not in sys.modules
m = gm.get_metrics()
assert gm.get_metrics() is m
m.observe_step("8", "stock", 0.003); m.count_path("stock", "idle"); m.set_selected([(8, "stock", "stock")])
m.observe_jit("k", 1.0)
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
reg = CollectorRegistry(); multiprocess.MultiProcessCollector(reg)
print(generate_latest(reg).decode())
"""
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()), "no multiprocess files written"
    out = r.stdout
    assert 'glm5_fastpath_decode_step_seconds_count{bucket="8",path="stock"} 1.0' in out
    assert 'glm5_fastpath_path_total{path="stock",reason="idle"} 1.0' in out
    assert 'glm5_fastpath_selected_info{bucket="8",moe="stock",prefix="stock"} 1.0' in out
    assert 'glm5_fastpath_jit_compile_seconds_count{kernel="k"} 1.0' in out
