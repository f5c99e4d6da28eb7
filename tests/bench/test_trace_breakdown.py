"""trace_breakdown on synthetic Chrome traces shaped like SGLang's torch-profiler export (CPU, no torch)."""
import gzip
import json
import sys

import pytest

from glm5_fastpath.bench import trace_breakdown as tb

P = 3000.0  # step period (us)
T0 = 1_000_000.0
HOST, DEV = {"pid": 4242, "tid": 4243}, {"pid": 0, "tid": 7}
# graph kernels of one step: (name, dur); back to back with 10 us gaps, starting 200 us after the host step start
GRAPH = [("glm5_a0_add_rmsnorm_quant", 100.0),
         ("void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<KernelTraits>(Params)", 200.0),
         ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<128u, 64u>(float*, int*, unsigned int)", 300.0),
         ("fused_moe_kernel", 400.0),
         ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x64x64", 100.0)]
ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int>>"


def _x(name, cat, ts, dur, where, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args}


def sglang_like(steps=4, *, host=True, annotations=True, gpu_annotations=False, pre_kernel=True, mode="DECODE"):
    """`steps` decode steps of P us: per step a host loop iteration (scheduler.run_batch > step[DECODE bs=1]),
    a memcpy + a cudaGraphLaunch inside the step range, the argmax launched after it (outside the range),
    process_batch_result / recv_requests after; GPU: memcpy 5 us, 5 graph kernels, argmax 50 us."""
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    corr = 100
    if pre_kernel:  # tail of a step launched before the profiler started: no launch call recorded
        ev.append(_x("glm5_megamoe", "kernel", T0 - 500, 80, DEV, stream=7, correlation=7))
    for k in range(steps):
        t = T0 + k * P
        if annotations:
            ev.append(_x("scheduler.run_batch", "user_annotation", t, 260, HOST))
            ev.append(_x(f"step[{mode} bs=1]", "user_annotation", t + 10, 240, HOST))
            ev.append(_x("scheduler.process_batch_result", "user_annotation", t + 280, 200, HOST))
            ev.append(_x("scheduler.recv_requests", "user_annotation", t + 2900, 50, HOST))
        if gpu_annotations:
            ev.append(_x(f"step[{mode} bs=1]", "gpu_user_annotation", t + 150, 1200, DEV))
        c_copy, c_graph, c_arg = corr, corr + 1, corr + 2
        corr += 3
        if host:
            ev.append(_x("cudaMemcpyAsync", "cuda_runtime", t + 20, 8, HOST, correlation=c_copy))
            ev.append(_x("cudaGraphLaunch", "cuda_runtime", t + 100, 30, HOST, correlation=c_graph))
            ev.append(_x("cudaLaunchKernel", "cuda_runtime", t + 270, 5, HOST, correlation=c_arg))
            ev.append({"ph": "s", "id": c_graph, "cat": "ac2g", "name": "ac2g", "ts": t + 100, **HOST})
        ev.append(_x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", t + 150, 5, DEV, stream=7, correlation=c_copy))
        g = t + 200
        for name, d in GRAPH:
            ev.append(_x(name, "kernel", g, d, DEV, stream=7, correlation=c_graph))
            g += d + 10
        ev.append(_x(ARGMAX, "kernel", g, 50, DEV, stream=7, correlation=c_arg))
    return {"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]}


# per complete step: busy 5 + 1100 + 50; inside gaps 45 (copy -> graph) + 4 * 10 + 10 (-> argmax); last end t+1400
BUSY, INSIDE, LAST_END = 1155.0, 95.0, 1400.0


def test_host_step_split_busy_idle_categories():
    r = tb.analyze(sglang_like(4))
    assert r["split"] == "host-step" and len(r["steps"]) == 4
    assert [s["complete"] for s in r["steps"]] == [True, True, True, False]
    s0 = r["steps"][0]
    assert s0["mode"] == "DECODE" and s0["bs"] == 1 and s0["kernels"] == 6 and s0["activities"] == 7
    assert s0["window_us"] == pytest.approx(P) and s0["busy_us"] == pytest.approx(BUSY)
    assert s0["idle_us"] == pytest.approx(P - BUSY)
    assert s0["idle_inside_step_us"] == pytest.approx(INSIDE)
    assert s0["idle_between_steps_us"] == pytest.approx(P + 150 - LAST_END)
    assert s0["idle_inside_step_us"] + s0["idle_between_steps_us"] == pytest.approx(s0["idle_us"])
    assert s0["graph_launches"] == 1
    c = s0["category_us"]
    assert c == {"ours": 100.0, "flashmla": 200.0, "deepgemm": 300.0, "triton": 400.0, "nccl": 0.0, "cublas": 100.0,
                 "sampling": 50.0, "aten": 0.0, "memcpy": 5.0, "other": 0.0}
    # the pre-profile kernel (before the first step's GPU start) is dropped
    assert all("megamoe" not in k["name"] for k in r["top_kernels"])
    sm = r["summary"]
    assert sm["steps"] == 3 and sm["steps_total"] == 4 and sm["bs"] == [1]
    assert sm["window_us"]["p50"] == pytest.approx(P) and sm["busy_fraction"] == pytest.approx(BUSY / P)
    assert sm["category_us"]["triton"]["p50"] == pytest.approx(400.0)
    assert sm["idle_between_steps_us"]["mean"] == pytest.approx(P + 150 - LAST_END)
    assert r["warnings"] == []


def test_host_side_intervals_and_annotations():
    r = tb.analyze(sglang_like(4))
    h = r["steps"][0]["host"]
    assert h["launch_interval_us"] == pytest.approx(P)
    assert h["launch_to_gpu_start_us"] == pytest.approx(130.0)  # memcpy launched at +20, ran at +150
    assert h["gpu_drained_before_next_launch_us"] == pytest.approx(P + 20 - LAST_END)
    assert h["host_step_us"] == pytest.approx(240.0)
    assert h["graph_launch_call_us"] == pytest.approx(30.0)  # the cudaGraphLaunch call inside the step range
    # one host loop iteration, anchored at the enclosing scheduler.run_batch: each stage once
    assert h["annotated_us"] == {"scheduler.run_batch": 260.0, "step[...]": 240.0,
                                 "scheduler.process_batch_result": 200.0, "scheduler.recv_requests": 50.0}
    hs = r["summary"]["host"]
    assert hs["launch_interval_us"]["p50"] == pytest.approx(P)
    assert hs["annotated_us"]["scheduler.process_batch_result"]["mean"] == pytest.approx(200.0)
    assert hs["graph_launch_call_us"]["p50"] == pytest.approx(30.0)
    assert "in graph-launch calls 0.030 ms" in "\n".join(tb.summary_lines(r))
    assert "host" not in r["steps"][-1] or "launch_interval_us" not in r["steps"][-1]["host"]


def test_top_kernels_sorted_and_per_step():
    r = tb.analyze(sglang_like(5), top_k=3)
    top = r["top_kernels"]
    assert [t["name"] for t in top] == ["fused_moe_kernel", GRAPH[2][0], GRAPH[1][0]]
    assert top[0]["category"] == "triton" and top[0]["calls_per_step"] == 1.0
    assert top[0]["us_per_step"] == pytest.approx(400.0) and top[0]["mean_us"] == pytest.approx(400.0)
    assert top[0]["pct_of_busy"] == pytest.approx(100 * 400 / BUSY)
    assert len(tb.analyze(sglang_like(5))["top_kernels"]) == 7  # every distinct name when fewer than 25
    gaps = r["largest_gaps"]
    assert gaps[0]["where"] == "between steps" and gaps[0]["gap_us"] == pytest.approx(P + 150 - LAST_END)
    assert gaps[0]["after"] == ARGMAX and gaps[0]["before"].startswith("Memcpy HtoD")
    inside = [g for g in gaps if g["where"] == "inside"]
    assert inside[0]["gap_us"] == pytest.approx(45.0) and inside[0]["before"] == GRAPH[0][0]


def test_fallback_splits_graph_gpu_step_gap():
    # no host annotations: the graph launches delimit the steps (first kernel of each replay)
    r = tb.analyze(sglang_like(4, annotations=False))
    assert r["split"] == "graph" and r["summary"]["steps"] == 3
    assert r["steps"][0]["window_us"] == pytest.approx(P)
    # the memcpy before the next replay lands in the previous window; totals stay the same
    assert r["steps"][1]["busy_us"] == pytest.approx(BUSY)
    assert r["steps"][0]["host"]["launch_interval_us"] == pytest.approx(P)
    # GPU-only trace with the GPU-side mirror of the step ranges
    r = tb.analyze(sglang_like(4, host=False, annotations=False, gpu_annotations=True))
    assert r["split"] == "gpu-step" and r["summary"]["steps"] == 3 and "host" not in r["steps"][0]
    assert r["steps"][0]["mode"] == "DECODE" and r["steps"][0]["busy_us"] == pytest.approx(BUSY)
    # nothing but kernels: split at the big idle gaps
    r = tb.analyze(sglang_like(4, host=False, annotations=False, pre_kernel=False))
    assert r["split"] == "gap" and r["summary"]["steps"] == 2  # the first busy run may be a partial step
    assert r["steps"][0]["window_us"] == pytest.approx(P) and r["steps"][0]["busy_us"] == pytest.approx(BUSY)
    assert any("gaps" in w for w in r["warnings"])
    r = tb.analyze(sglang_like(4, host=False, annotations=False, pre_kernel=False), method="gap", gap_us=40.0)
    assert r["summary"]["steps"] > 3  # a lower threshold also cuts inside the step
    with pytest.raises(ValueError, match="split"):
        tb.analyze(sglang_like(2), method="nope")


def test_forced_method_and_non_decode_steps():
    r = tb.analyze(sglang_like(4), method="graph")
    assert r["split"] == "graph"
    r = tb.analyze(sglang_like(3, mode="EXTEND"))
    assert r["summary"] is None and any("not DECODE" in w for w in r["warnings"])


def test_json_gz_reading_and_cli(tmp_path, capsys):
    tr = sglang_like(4)
    gz = tmp_path / "prof" / "1700000000.1-TP-0.trace.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(json.dumps(tr).encode()))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(tr["traceEvents"]))  # a bare event list is a valid Chrome trace too
    assert tb.analyze_file(gz)["summary"] == tb.analyze_file(plain)["summary"]
    assert tb.find_traces(gz.parent) == [gz]
    rc = tb.main([str(gz.parent), "--out", str(tmp_path / "o")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "3 complete step(s) of 4 (split: host-step), batch [1]" in out and "| triton |" in out
    j = json.loads((tmp_path / "o" / "breakdown.json").read_text())
    assert j[0]["summary"]["steps"] == 3 and j[0]["source"] == str(gz)
    md = (tmp_path / "o" / "breakdown.md").read_text()
    assert "Top 7 kernels" in md and "`fused_moe_kernel`" in md and "between steps" in md
    assert tb.main([str(tmp_path / "missing")]) == 2


def test_robust_to_missing_fields():
    ev = sglang_like(3)["traceEvents"]
    ev += [
        {"ph": "X", "cat": "kernel", "name": "no_ts", "dur": 3},  # no ts: skipped
        {"ph": "X", "cat": "kernel", "ts": T0 + 1000.5, "args": {}},  # no name, no dur, no stream
        {"ph": "X", "cat": "kernel", "name": "zero", "ts": 0, "dur": 0},  # Kineto's untimed activity
        {"ph": "X", "cat": "kernel", "name": "strts", "ts": str(T0 + 1001.0), "dur": "2", "args": "oops"},
        {"ph": "X", "name": "no_cat", "ts": T0, "dur": 1},
        {"ph": "X", "cat": "user_annotation", "ts": T0, "dur": 1},  # annotation without a name
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": T0 + 5, "dur": 1},  # no correlation
        "not an event", 17, None,
    ]
    r = tb.analyze({"traceEvents": ev})
    assert r["summary"]["steps"] == 2 and r["events_skipped"] == 5
    assert r["steps"][0]["activities"] == 7 + 2  # the unnamed and the string-ts kernels are counted
    assert any(k["name"] == "<unnamed>" for k in r["top_kernels"])
    # degenerate inputs give warnings, not exceptions
    assert tb.analyze({})["warnings"] and tb.analyze([])["summary"] is None
    assert tb.analyze({"traceEvents": "x"})["gpu_activities"] == 0
    one = tb.analyze(sglang_like(1))
    assert one["summary"] is None and any("at least 2" in w for w in one["warnings"])
    no_steps = tb.analyze({"traceEvents": [_x("k", "kernel", 10.0, 5.0, DEV)]})
    assert no_steps["split"] == "none" and no_steps["warnings"]
    assert "no summary" in tb.render_markdown(no_steps)


@pytest.mark.parametrize("name, cat, want", [
    ("glm5_megamoe", "kernel", "ours"),
    ("glm5_fp8_gemm_wgmma", "kernel", "ours"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "nccl"),
    ("void flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512>(Flash_fwd_mla_params)", "kernel", "flashmla"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64u>(unsigned int)", "kernel", "deepgemm"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "kernel", "cublas"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "kernel",
     "cublas"),
    ("triton_poi_fused_add_mul_0", "kernel", "triton"),
    ("_per_token_group_quant_8bit", "kernel", "triton"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>(float*)", "kernel", "sampling"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(int, Fill)", "kernel", "aten"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", "kernel", "other"),
    ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", "memcpy"),
    ("Memset (Device)", "gpu_memset", "memcpy"),
])
def test_categories(name, cat, want):
    assert tb.category(name, cat) == want


def test_no_torch_import():
    assert "torch" not in tb.__dict__
    import subprocess

    code = ("import sys, glm5_fastpath.bench.trace_breakdown as t; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_overlapping_streams_busy_is_the_union():
    tr = sglang_like(3)
    ev = tr["traceEvents"]
    # a side-stream kernel under the flash_mla one of step 0 (overlaps 100 us) and one that starts at the end
    # of step 0's window and runs 100 us into step 1's
    t = T0
    ev.append(_x("glm5_e2_topk", "kernel", t + 320, 100, {"pid": 0, "tid": 9}, stream=9, correlation=101))
    ev.append(_x("glm5_c0_head_gate", "kernel", t + P + 100, 150, {"pid": 0, "tid": 9}, stream=9, correlation=101))
    r = tb.analyze(tr)
    s0, s1 = r["steps"][0], r["steps"][1]
    assert s0["streams"] == 2 and s0["category_us"]["ours"] == pytest.approx(100 + 100 + 150)
    # union: +0 for the overlapped kernel, +50 up to the window end (t+P+150) for the one that runs on
    assert s0["busy_us"] == pytest.approx(BUSY + 50)
    # in step 1's window it covers [start, start + 100): 45 us of the copy -> graph gap become busy
    assert s1["busy_us"] == pytest.approx(BUSY + 45) and s1["category_us"]["ours"] == pytest.approx(100)
    assert s0["idle_us"] + s0["busy_us"] == pytest.approx(P)


def _op(name, ts, dur):
    return tb.GpuOp(name=name, cat="kernel", ts=ts, dur=dur)


def test_exposed_time_charges_the_first_to_end():
    """A PDL consumer resident from its early launch (waiting on its producer) is charged only what it adds
    after the producer ends; a side-stream kernel hidden under a longer one costs nothing; a gap is charged
    to nobody; the charges sum to the busy union, also when clipped to a window."""
    ops = [_op("producer", 0, 10), _op("consumer_pdl", 2, 12),  # waits 2..10, works 10..14
           _op("hidden", 20, 5), _op("long", 18, 20),           # [20, 25) hidden under [18, 38)
           _op("after_gap", 50, 4)]
    got = tb.exposed_time(ops)
    assert got == pytest.approx({"producer": 10, "consumer_pdl": 4, "long": 2 + 13, "hidden": 5,
                                 "after_gap": 4})
    # "hidden" ends first while both run, so it takes [20, 25) and "long" the rest: still the union in total
    assert sum(got.values()) == pytest.approx(sum(b - a for a, b in tb.busy_intervals(ops)))
    clipped = tb.exposed_time(ops, 5, 22)  # both clipped to end at 22: a tie goes to the earlier start
    assert clipped == pytest.approx({"producer": 5, "consumer_pdl": 4, "long": 4})
    assert tb.exposed_time([]) == {} and tb.exposed_time([_op("zero", 3, 0)]) == {}


def test_top_exposed_in_the_report():
    """Serial kernels: exposed = duration; the table is rendered and sums to busy."""
    r = tb.analyze(sglang_like(5))
    ex = {a["name"]: a["exposed_us_per_step"] for a in r["top_exposed"]}
    assert ex["fused_moe_kernel"] == pytest.approx(400.0) and ex[ARGMAX] == pytest.approx(50.0)
    assert sum(ex.values()) == pytest.approx(BUSY)
    assert r["top_exposed"][0]["name"] == "fused_moe_kernel"
    assert "kernels by exposed time" in tb.render_markdown(r)


def test_step_timeline_medians_per_activity():
    """The step timeline: one row per activity of a step in start order, medians over the complete steps with the
    same sequence; start / end from the step's first activity, exposed charges summing to the busy time, the idle
    gap right before each activity."""
    r = tb.analyze(sglang_like(4))
    tl = r["timeline"]
    assert tl["steps_used"] == 3 and tl["steps_given"] == 3 and tl["activities"] == 7 and tl["streams"] == 1
    rows = tl["rows"]
    assert [x["name"] for x in rows] == ["Memcpy HtoD (Pinned -> Device)"] + [n for n, _ in GRAPH] + [ARGMAX]
    assert rows[0]["start_us"] == pytest.approx(0) and rows[0]["idle_us"] == pytest.approx(0)
    assert rows[1]["start_us"] == pytest.approx(50) and rows[1]["idle_us"] == pytest.approx(45)  # copy -> graph
    assert all(x["idle_us"] == pytest.approx(10) for x in rows[2:])
    assert [x["dur_us"] for x in rows[1:6]] == pytest.approx([d for _, d in GRAPH])
    assert rows[-1]["end_us"] == pytest.approx(LAST_END - 150)
    assert sum(x["exposed_us"] for x in rows) == pytest.approx(BUSY)
    assert rows[1]["category"] == "ours" and rows[-1]["category"] == "sampling"
    md = tb.render_timeline(r, title="t")
    assert md.startswith("# t") and md.count("\n| ") == 1 + 7 and f"Sum of exposed: {BUSY:.1f} us" in md


def test_step_timeline_keeps_the_common_sequence_and_overlap(tmp_path):
    """Steps whose activity sequence differs from the most common one are left out; two streams: a hidden
    side-stream kernel is charged its own time, the long one the rest; no timeline without complete steps."""
    a = (0.0, 100.0, [_op("k1", 0, 10), _op("side", 12, 5), _op("long", 11, 30)])
    b = (100.0, 200.0, [_op("k1", 100, 12), _op("side", 114, 5), _op("long", 113, 30)])
    odd = (200.0, 300.0, [_op("k1", 200, 10), _op("other", 215, 5)])
    tl = tb.step_timeline([a, odd, b])
    assert tl["steps_used"] == 2 and tl["steps_given"] == 3
    assert [x["name"] for x in tl["rows"]] == ["k1", "long", "side"]
    k1, long_, side = tl["rows"]
    assert k1["dur_us"] == pytest.approx(11) and long_["idle_us"] == pytest.approx(1)
    assert side["exposed_us"] == pytest.approx(5) and long_["exposed_us"] == pytest.approx(25)
    assert tb.step_timeline([]) is None and tb.render_timeline({"timeline": None}) is None
    # write_outputs adds the timeline file only when a result has one
    got = tb.write_outputs([tb.analyze(sglang_like(3))], tmp_path / "o")
    assert [p.name for p in got] == ["breakdown.json", "breakdown.md", "breakdown_timeline.md"]
    got = tb.write_outputs([{"source": None, "timeline": None, "events_total": 0, "gpu_activities": 0,
                             "launch_calls": 0, "events_skipped": 0}], tmp_path / "p")
    assert [p.name for p in got] == ["breakdown.json", "breakdown.md"]


def _rows(seq):
    """Timeline rows from (name, dur, idle_before) in order, back to back after the idle gaps; exposed = dur."""
    rows, t = [], 0.0
    for k, (name, dur, idle) in enumerate(seq):
        t += idle
        rows.append({"pos": k, "name": name, "category": tb.category(name), "stream": 0, "start_us": t,
                     "end_us": t + dur, "dur_us": dur, "exposed_us": dur, "idle_us": idle})
        t += dur
    return rows


def test_timeline_segments_layers_by_kind():
    """Segments of the same sequence form a kind with per-position medians; the head before the first marker is
    reported apart; the auto marker is the cut with the most rows in one kind, then the fewest kinds; nothing repeating or an
    absent marker -> None."""
    dense = [("norm", 2, 1), ("attn", 10, 1), ("mlp_dense", 30, 2)]
    moe = [("norm", 2, 1), ("attn", 10, 1), ("router", 5, 1), ("megamoe", 50, 3)]
    slow_moe = [("norm", 2, 1), ("attn", 14, 1), ("router", 5, 1), ("megamoe", 50, 5)]
    seq = [("embed", 3, 0)] + dense + moe + slow_moe + moe + [("lm_head", 400, 1), ("argmax", 8, 1)]
    sg = tb.timeline_segments(_rows(seq), marker="norm")
    assert sg["marker"] == "norm" and sg["head_activities"] == 1 and sg["head_exposed_us"] == 3
    kinds = sg["kinds"]
    assert [k["segments"] for k in kinds] == [1, 2, 1] and [k["activities"] for k in kinds] == [3, 4, 6]
    dense_k, moe_k, last_k = kinds
    assert dense_k["span_us"] == pytest.approx(2 + 1 + 10 + 2 + 30 + 1)  # to the next marker's start
    # the two middle MoE layers (the plain and the slow one): medians per position
    assert [r["name"] for r in moe_k["rows"]] == ["norm", "attn", "router", "megamoe"]
    assert moe_k["rows"][1]["dur_us"] == pytest.approx(12) and moe_k["rows"][3]["idle_us"] == pytest.approx(4)
    assert moe_k["exposed_us"] == pytest.approx(2 + 12 + 5 + 50) and moe_k["idle_us"] == pytest.approx(1 + 1 + 1 + 4)
    assert last_k["rows"][-1]["name"] == "argmax" and last_k["span_us"] == pytest.approx(2 + 1 + 10 + 1 + 5 + 3 + 50 + 1
                                                                                         + 400 + 1 + 8)
    auto = tb.timeline_segments(_rows(seq))  # cut at norm: 3 kinds; at router: [router megamoe norm attn] x 2 + the tail
    assert auto["marker"] == "router" and [k["segments"] for k in auto["kinds"]] == [2, 1]
    assert auto["head_activities"] == 6 and auto["kinds"][0]["rows"][0]["name"] == "router"
    assert tb.timeline_segments(_rows(seq), marker="absent") is None
    assert tb.timeline_segments(_rows([("a", 1, 0), ("b", 1, 0)])) is None and tb.timeline_segments([]) is None


def test_timeline_segments_in_the_report():
    """analyze's timeline carries the segments (layer_marker passes through) and render_timeline prints them."""
    r = tb.analyze(sglang_like(4), layer_marker=GRAPH[1][0])
    sg = r["timeline"]["segments"]
    assert sg["marker"] == GRAPH[1][0] and sg["head_activities"] == 2 and sg["kinds"][0]["segments"] == 1
    md = tb.render_timeline(r)
    assert "## Repeating segments" in md and "### Kind 0 (1 segment(s))" in md
    r_auto = tb.analyze(sglang_like(4))
    assert r_auto["timeline"]["segments"] is None  # every activity occurs once per step: nothing repeats
    assert "No repeating segments: no activity occurs twice per step." in tb.render_timeline(r_auto)
    r_bad = tb.analyze(sglang_like(4), layer_marker="not_a_kernel")
    assert "the layer marker `not_a_kernel` is not in the step" in tb.render_timeline(r_bad)


def test_timeline_segments_concurrent_reorder_is_one_kind():
    """Two layers whose side-stream kernels start in another order are one kind; rows follow the median offset."""
    a = [("norm", 2, 0), ("gemm", 10, 0), ("side", 3, 0), ("moe", 20, 1)]
    b = [("norm", 2, 0), ("side", 3, 0), ("gemm", 10, 0), ("moe", 20, 1)]
    sg = tb.timeline_segments(_rows(a + b + a), marker="norm")
    assert [k["segments"] for k in sg["kinds"]] == [3]
    rows = sg["kinds"][0]["rows"]
    assert [r["name"] for r in rows] == ["norm", "gemm", "side", "moe"]  # gemm first in 2 of 3 layers
    assert rows[1]["offset_us"] == pytest.approx(2) and rows[3]["offset_us"] == pytest.approx(2 + 10 + 3 + 1)
