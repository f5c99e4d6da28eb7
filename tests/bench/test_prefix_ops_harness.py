"""The prefix-ops benchmark harness on CPU (fake / reference ops, eager stock rows), plus a GPU smoke test."""
import json
import os

import pytest
import torch

from glm5_fastpath.bench import prefix_ops as po
from glm5_fastpath.bench.timing import (assert_not_all_zero, measure_copy_bandwidth, plan_rotation, summarize,
                                        time_launches)
from glm5_fastpath.cli import main
from glm5_fastpath.ref import prefix as ref

REF_OPS = {"a0_add_rmsnorm_quant": ref.a0_add_rmsnorm_quant, "b0_qkv_a": ref.b0_qkv_a, "c0_head_gate": ref.c0_head_gate,
           "b1_indexer_k": ref.b1_indexer_k, "d1_indexer_q": ref.d1_indexer_q, "d0_q_b": ref.d0_q_b,
           "d2_absorb_and_kv_store": ref.d2_absorb_and_kv_store, "e1_indexer_logits": ref.e1_indexer_logits,
           "e2_topk": ref.e2_topk}


def _opts(tmp_path, **kw):
    base = dict(ms=(1, 2), kv_len=200, preset="small", device="cpu", out=str(tmp_path / "out"), replays=2,
                min_launches=2, isolate=False, profile=False, budget_s=600)
    base.update(kw)
    return po.Options(**base)


# ---- timing helpers ---------------------------------------------------------------------------------------


def test_plan_rotation_exceeds_twice_l2_and_uses_every_set_equally():
    l2 = 60 * 2**20
    p = plan_rotation(16e6, l2)  # a QKV-A-sized weight set
    assert p.sets == 8 and p.launches == 24 and p.covers_l2 and p.rotated_bytes >= 2 * l2
    p = plan_rotation(50e3, l2, max_sets=512)  # a tiny op: capped, and says so
    assert p.sets == 512 and p.launches == 512 and p.capped_by == "max_sets" and not p.covers_l2
    p = plan_rotation(1.08e6, l2, available_sets=4)  # E1 with only 4 disjoint sequence groups
    assert p.sets == 4 and p.capped_by == "available_sets" and p.launches % 4 == 0 and p.launches >= 20
    p = plan_rotation(300e6, l2)  # bigger than L2 on its own
    assert p.sets == 1 and p.launches == 20 and p.covers_l2
    assert plan_rotation(1e3, 0).sets == 1  # CPU: no L2 to defeat
    with pytest.raises(ValueError):
        plan_rotation(0, l2)


def test_time_launches_cpu_counts_every_launch_and_reports_median():
    calls = []
    t = time_launches(lambda i: calls.append(i) or i, 5, device="cpu", replays=3, warmup=2)
    assert t.method == "cpu-wall" and t.launches == 5 and t.replays == 3
    assert len(calls) == 2 + 5 * 3 and set(calls) == set(range(5))
    assert t.min_us <= t.median_us <= t.p90_us
    s = summarize([3.0, 1.0, 2.0, 10.0], launches=1, method="x")
    assert s.median_us == 2.5 and s.min_us == 1.0 and s.p90_us == 3.0


def test_never_time_on_zeros():
    assert_not_all_zero({"a": torch.ones(3), "b": torch.tensor([0, 1]), "n": None})
    with pytest.raises(ValueError, match="all zeros"):
        assert_not_all_zero({"x8": torch.zeros(4, 4).to(torch.float8_e4m3fn)}, "op")


def test_copy_bandwidth_cpu_has_a_number():
    bw = measure_copy_bandwidth("cpu", nbytes=1 << 20, reps=2)
    assert bw["bytes_per_s"] > 0 and bw["verified"]


# ---- the harness end to end on CPU ---------------------------------------------------------------------------


def test_dry_run_with_reference_as_ours_writes_json_md_and_sums(tmp_path):
    rep = po.run_bench(_opts(tmp_path), registry=REF_OPS)
    files = sorted(os.listdir(tmp_path / "out"))
    assert len(files) <= 4 and {"prefix_ops.json", "prefix_ops.md", "prefix_ops.log"} <= set(files)
    recs = {(r["op"], r["M"]): r for r in rep["records"]}
    assert set(recs) == {(op, m) for op in po.OPS for m in (1, 2)}
    for (op, m), r in recs.items():
        assert r["ours"]["status"] == "ok", (op, m, r["ours"])
        assert r["ours"]["check"]["ok"] and r["ours"]["timing"]["median_us"] > 0
        assert r["bytes"] > 0 and r["floor_us_const_bw"] > 0
        if op == "E1":  # no DeepGEMM on CPU: skipped with the reason, the run goes on
            assert r["stock"]["status"] == "skipped" and "deep_gemm" in r["stock"]["reason"]
        else:
            assert r["stock"]["status"] == "ok", (op, m, r["stock"])
    rows = {(r["op"], r["M"]): r for r in rep["rows"]}
    assert ("C0+B1", 1) in rows and rows[("C0", 1)]["speedup"] is None and rows[("A0", 1)]["speedup"] > 0
    s = rep["sums"]["2"]
    assert s["ours_us"] > s["ours_us_no_e2"] > 0 and s["missing_stock"] == ["E1"] and s["stock_us"] is None
    md = (tmp_path / "out" / "prefix_ops.md").read_text()
    assert "| op | ours us | stock us |" in md and "torch.topk stand-in" in md and "## M = 2" in md
    assert "C0+B1" in md and "sum without E2" in md
    js = json.loads((tmp_path / "out" / "prefix_ops.json").read_text())
    assert js["meta"]["gpu"].startswith("CPU") and js["stock_kernels"]["B0"]["label"]


def test_missing_broken_and_wrong_ours_are_recorded_not_fatal(tmp_path):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    def wrong_gate(x, w):  # right shape, wrong values
        return ref.c0_head_gate(x, w) * 3

    reg = {"a0_add_rmsnorm_quant": ref.a0_add_rmsnorm_quant, "b0_qkv_a": boom, "c0_head_gate": wrong_gate}
    rep = po.run_bench(_opts(tmp_path, ops=("A0", "B0", "C0", "E2"), ms=(2,), stock=False), registry=reg)
    st = {r["op"]: r["ours"] for r in rep["records"]}
    assert st["A0"]["status"] == "ok"
    assert st["B0"]["status"] == "error" and "kernel exploded" in st["B0"]["reason"]
    assert st["C0"]["status"] == "check failed" and st["C0"]["timing"]["median_us"] > 0
    assert st["E2"]["status"] == "not built" and "e2_topk" in st["E2"]["reason"]
    assert all(r["stock"]["status"] == "off" for r in rep["records"])
    assert set(rep["sums"]["2"]["missing_ours"]) == {"B0", "E2"}


def test_find_ours_reports_missing_ops():
    fn, why = po.find_ours("D2", module="glm5_fastpath.ref.prefix")
    assert fn is ref.d2_absorb_and_kv_store and why == ""
    fn, why = po.find_ours("A0", module="glm5_fastpath.ref.prefix")  # via the alias
    assert fn is ref.a0_add_rmsnorm_quant
    fn, why = po.find_ours("B0", module="glm5_fastpath_no_such_module")
    assert fn is None and why.startswith("not built")


def test_time_budget_skips_what_is_left(tmp_path):
    rep = po.run_bench(_opts(tmp_path, ops=("A0", "C0"), ms=(1,), budget_s=0.0), registry=REF_OPS)
    assert all(r["ours"]["status"] == "skipped" and "budget" in r["ours"]["reason"] for r in rep["records"])


def test_validate_rejects_unknown_ops_and_orders_them():
    with pytest.raises(ValueError, match="unknown ops"):
        po.validate(po.Options(ops=("A0", "Z9")))
    o = po.validate(po.Options(ops=("E2", "A0"), ms=(16, 1, 16)))
    assert o.ops == ("A0", "E2") and o.ms == (1, 16)


@pytest.mark.slow
def test_worker_crash_is_recorded_and_the_rest_runs_in_a_new_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH_BENCH_CRASH", "A0:2")
    opts = _opts(tmp_path, ops=("A0", "E2"), isolate=True, stock=False, ours_module="glm5_fastpath.ref.prefix")
    rep = po.run_bench(opts)
    recs = {(r["op"], r["M"]): r for r in rep["records"]}
    assert "crashed the worker" in recs[("A0", 2)]["ours"]["reason"]
    for p in (("A0", 1), ("E2", 1), ("E2", 2)):
        assert recs[p]["ours"]["status"] == "ok", recs[p]
    assert any("exited with code 77" in n for n in rep["notes"])


def test_cli_bench_prefix_ops_dry_run(tmp_path, capsys):
    rc = main(["bench", "prefix-ops", "--dry-run", "--device", "cpu", "--m", "1", "--kv-len", "130", "--ops", "a0,e2",
               "--out", str(tmp_path / "o"), "--replays", "2", "--min-launches", "2", "--no-isolate",
               "--ours-module", "glm5_fastpath.ref.prefix"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "M=1:" in out and "A0" in out and (tmp_path / "o" / "prefix_ops.md").exists()


# ---- GPU ------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke_a0_at_m1(tmp_path):
    rep = po.run_bench(po.Options(ms=(1,), ops=("A0",), kv_len=256, out=str(tmp_path / "g"), replays=5,
                                  isolate=False, prewarm_procs=0, budget_s=300))
    r = rep["records"][0]
    for side in ("ours", "stock"):
        assert r[side]["status"] in ("ok", "not built"), r[side]
    assert r["stock"]["status"] == "ok" and r["stock"]["timing"]["method"] == "cuda-graph"
    assert r["stock"]["check"]["ok"], r["stock"]["check"]
    assert rep["meta"]["copy_bandwidth"]["bytes_per_s"] > 1e12
