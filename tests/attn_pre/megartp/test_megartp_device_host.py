"""MegaRTP device side, host parts (CPU): kernel build specs and ABI, family-support check, error-record
decoding, hand-built plans, trace decoding / Chrome export / critical path. The C++ constants these
depend on are parsed from csrc/megartp so a drift fails here, not on the GPU."""
import ctypes
import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest
import torch

from glm5_fastpath.attn_pre.megartp import device as D
from glm5_fastpath.attn_pre.megartp import trace as T
from glm5_fastpath.attn_pre.megartp.isa import Instruction, Opcode, decode, encode
from glm5_fastpath.attn_pre.megartp.plan import build_plan
from glm5_fastpath.attn_pre.megartp.validator import validate
from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.graph import ShapeContext, build_prefix_graph

CSRC = Path(__file__).resolve().parents[3] / "csrc" / "megartp"
SMALL = small_config()
GLM5 = Glm5Config.preset("glm5")


def _cpp(name: str) -> str:
    return (CSRC / name).read_text()


# ---- build specs and ABI ----------------------------------------------------------------------------------

def test_kernel_spec_defines_follow_the_config():
    s = dict(D.kernel_spec(GLM5).defines)
    assert s == {"GLM5_MRTP_Q": "2048", "GLM5_MRTP_KV": "512", "GLM5_MRTP_R": "64", "GLM5_MRTP_NOPE": "192",
                 "GLM5_MRTP_IH": "32", "GLM5_MRTP_ID": "128", "GLM5_MRTP_H": "6144", "GLM5_MRTP_TOPK": "2048",
                 "GLM5_MRTP_TRACE": "0", "GLM5_WEIGHTS_EVICT_FIRST": "1"}
    t = dict(D.kernel_spec(SMALL, trace=True).defines)
    assert t["GLM5_MRTP_Q"] == "256" and t["GLM5_MRTP_NOPE"] == "64" and t["GLM5_MRTP_TRACE"] == "1"
    assert (t["GLM5_MRTP_IH"], t["GLM5_MRTP_ID"]) == (str(SMALL.index_n_heads), str(SMALL.index_head_dim))
    assert D.kernel_spec(GLM5).source == D.SOURCE and D.kernel_spec(GLM5).functions == (D.FUNCTION,)
    assert len({s.defines for s in D.compile_check_specs()}) == 4


def test_params_struct_matches_the_cpp_definition():
    src = _cpp("runtime.cuh")
    body = re.search(r"struct MegaParams \{(.*?)\n\};", src, re.S).group(1)
    names = re.findall(r"^\s+[\w:<>\s\*]+?\b(\w+);", body, re.M)
    assert names == [f for f, _ in D._Params._fields_], names
    size = int(re.search(r"sizeof\(MegaParams\) == (\d+)", src).group(1))
    assert size == D.PARAMS_BYTES == ctypes.sizeof(D._Params)


def test_error_kinds_and_details_match_the_cpp_enums():
    rt = _cpp("runtime.cuh")
    body = re.search(r"enum ErrorKind : int32_t \{(.*?)\};", rt, re.S).group(1)
    kinds = {int(v): k for k, v in re.findall(r"kErr(\w+) = (\d+)", body)}
    assert set(kinds) == set(D.ERROR_KINDS), kinds
    fields = re.search(r"enum ErrorField : int \{(.*?)\};", rt, re.S).group(1)
    order = [re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() for n, _ in re.findall(r"kErr(\w+) = (\d+)", fields)]
    assert order == list(D._FIELDS), order
    fam = _cpp("families.cuh")
    checks = {int(v) for v in re.findall(r"kChk\w+ = (\d+),", fam)}
    assert checks == set(D.UNSUPPORTED_DETAIL), checks
    assert int(re.search(r"kErrorWords = (\d+)", rt).group(1)) == D.ERROR_WORDS
    assert int(re.search(r"kTraceWords = (\d+)", rt).group(1)) == D.TRACE_WORDS == T.TRACE_WORDS
    assert int(re.search(r"kStateWords = (\d+)", rt).group(1)) == D.STATE_WORDS


def test_supported_families_are_the_dispatched_ones():
    mk = _cpp("megakernel.cuh")
    dispatched = set(re.findall(r"case isa::Opcode::(\w+): return \w+Family", mk))
    assert dispatched == set(D.SUPPORTED_FAMILIES)
    fam = _cpp("families.cuh")
    assert "Gemm = GemmCfg<16, GLM5_MRTP_GEMM_STAGES>" in fam and "#define GLM5_MRTP_GEMM_STAGES 6" in fam
    assert (D.GEMM_TOKEN_BLOCK, D.GEMM_STAGES) == (16, 6)


def test_smem_formulas_match_the_ops():
    from glm5_fastpath.ops.d2_absorb import D2Config
    from glm5_fastpath.ops.fp8_gemm import EPI_IDX_K, EPI_IDX_Q, EPI_PLAIN, SkinnyConfig
    assert (D.EPI_PLAIN, D.EPI_IDX_Q, D.EPI_IDX_K) == (EPI_PLAIN, EPI_IDX_Q, EPI_IDX_K)
    for g in (1, 4, 12, 48):
        for epi in (EPI_PLAIN, EPI_IDX_Q, EPI_IDX_K):
            assert D.skinny_smem_bytes(16, 6, g, epi) == SkinnyConfig(epi, 16, 128, 128 * g, 16, 1, 6).smem_bytes
    for nope, mt in ((192, 1), (192, 2), (64, 2)):
        assert D.d2_smem_bytes(nope, mt) == D2Config(nope, 512, 64, mt).smem_bytes
    # the partials' one carve-up is the one with the largest finish scratch (families.cuh kEpiGemmLayout)
    assert D.skinny_smem_bytes(16, 6, 48, D.EPI_GEMM_LAYOUT) == max(D.skinny_smem_bytes(16, 6, 48, e) for e in (0, 3, 4))
    assert D.dynamic_smem_bytes(GLM5) == D.skinny_smem_bytes(16, 6, 48, D.EPI_GEMM_LAYOUT)
    assert D.a0_smem_bytes(6144) == 24 * 4  # one partial per 256-column chunk
    assert D.dynamic_smem_bytes(GLM5) <= 227 * 1024
    E = importlib.import_module("glm5_fastpath.ops.e1_indexer_logits")  # the package re-exports a function of that name
    fam = _cpp("families.cuh")
    stages = int(re.search(r"kE1Stages = (\d+);", fam).group(1))
    pages = int(re.search(r"kE1MaxPages = (\d+);", fam).group(1))
    assert (stages, pages) == (D.E1_STAGES, D.E1_MAX_PAGES) and D.E1_STAGES == E.STAGES and D.E1_PAGE == E.PAGE
    assert D.E1_MAX_PAGES * D.E1_PAGE == 512  # prefix_graph.TileParams.e1_kv_split
    for dim in (64, 128):  # E1IndexerLogitsTile::kSmemBytes: ring, logits window, page ids, mbarriers
        want = (D.E1_STAGES * E.page_bytes(dim) + D.E1_MAX_PAGES * 64 * 4 + D.E1_MAX_PAGES * 4 + 7) // 8 * 8 + D.E1_STAGES * 8
        assert D.e1_smem_bytes(dim) == want, dim


# ---- family support -----------------------------------------------------------------------------------------

def test_full_prefix_plan_is_refused_naming_the_missing_families():
    plan = build_plan(build_prefix_graph(SMALL), ShapeContext.shared_kv(4, 300), SMALL, num_sms=7)
    with pytest.raises(D.MegaRtpUnsupported) as e:
        D.check_plan_supported(plan, SMALL)
    msg = str(e.value)
    assert "op families not in the megakernel" not in msg  # every prefix family has a device adapter
    assert "index_head_dim == 128" in msg  # the small preset's D1 (64-wide heads)
    assert "D0: " in msg and "q_b heads of a multiple of 128" in msg  # the small preset's 96-row q_b heads
    full = validate(build_plan(build_prefix_graph(GLM5), ShapeContext.shared_kv(16, 8192), GLM5, num_sms=132))
    assert D.family_support_errors(full, GLM5) == []  # GLM-5's whole prefix runs


def test_supported_subgraph_plans_pass():
    g = D.supported_subgraph(build_prefix_graph(GLM5), GLM5)
    assert list(g.ops) == ["A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"]  # GLM-5: the whole prefix
    assert {"hidden", "residual"} <= set(g.external_tensors())
    assert not {"w_raw", "q_nope"} & set(g.external_tensors())  # C0 / D0 write them
    assert "x_fp8" not in g.external_tensors()
    plan = validate(build_plan(g, ShapeContext.independent([300, 301, 302]), GLM5, num_sms=132))
    assert D.family_support_errors(plan, GLM5) == []
    assert D.dynamic_smem_bytes(GLM5, plan) <= D.dynamic_smem_bytes(GLM5)
    small = D.supported_subgraph(build_prefix_graph(SMALL), SMALL)
    assert list(small.ops) == ["A0", "B0", "C0", "B1", "D2", "E1", "E2"]  # D1: 128-wide indexer heads; D0: 128-row q_b heads
    p = validate(build_plan(small, ShapeContext.independent([33] * 17), SMALL, num_sms=5))
    assert D.family_support_errors(p, SMALL) == []
    assert D.family_support_errors(p, None) == ["cfg (Glm5Config) is required for a plan with op families "
                                                "(dims, eps, RoPE)"]


def test_e1_windows_the_family_cannot_run_are_named():
    g = D.keep_only(build_prefix_graph(GLM5), ["E1"])
    ctx = ShapeContext.independent([40, 1000, 513])
    plan = build_plan(g, ctx, GLM5, num_sms=6)
    assert D.family_support_errors(plan, GLM5) == []
    assert D.dynamic_smem_bytes(GLM5, plan) == D.e1_smem_bytes(128)
    e1_op = int(Opcode.E1)
    found = [(q, i, decode(plan.instructions[q, i])) for q in range(plan.instructions.shape[0])
             for i in range(plan.instructions.shape[1]) if int(plan.instructions[q, i, 0]) == e1_op]
    q, i, ins = next(x for x in found if x[2].named_payload()["kv0"] == 512)  # the 1000-token row's second split
    for field_, value, why in (("kv0", 517, "does not start a 64-token page"), ("kv0", 0, "live KV tokens")):
        pl = dict(ins.named_payload())
        pl[field_] = value
        good = plan.instructions
        plan.instructions = good.clone()
        plan.instructions[q, i] = torch.tensor(encode(dataclasses.replace(ins, payload=tuple(pl.values()))),
                                               dtype=torch.int32)
        try:
            errs = D.family_support_errors(plan, GLM5)
        finally:
            plan.instructions = good
        assert any("E1" in e and why in e for e in errs), (field_, errs)


def test_bf16_indexer_k_graph_is_refused():
    g = D.supported_subgraph(build_prefix_graph(SMALL, indexer_k_gemm="bf16"), SMALL)
    plan = build_plan(g, ShapeContext.independent([40]), SMALL, num_sms=3)
    assert any("bf16" in e for e in D.family_support_errors(plan, SMALL))


def test_runner_refuses_a_cpu_device_and_bad_plans():
    with pytest.raises(D.MegaRtpError, match="CUDA device"):
        D.PlanRunner(D.noop_plan(2, 1), None, "cpu")
    with pytest.raises(D.MegaRtpUnsupported, match="RawPlan has no operand table"):
        words = D.noop_plan(2, 1).instructions.clone()
        words[0, 0] = torch.tensor(encode(Instruction(int(Opcode.D2))), dtype=torch.int32)
        D.PlanRunner(D.RawPlan(words, 0), None, "cpu")
    with pytest.raises(D.MegaRtpError, match="int32"):
        D.RawPlan(torch.zeros(2, 1, 32, dtype=torch.int64), 0)


# ---- hand-built plans ----------------------------------------------------------------------------------------

def _simulate(plan: D.RawPlan) -> dict[int, int]:
    """Fixed point of 'run any queue head whose waits hold' (the validator's deadlock argument)."""
    q_n, l_n, _ = plan.instructions.shape
    progs = [[decode(plan.instructions[q, i]) for i in range(l_n)] for q in range(q_n)]
    ctr: dict[int, int] = {}
    pos = [0] * q_n
    moved = True
    while moved:
        moved = False
        for q in range(q_n):
            while pos[q] < l_n and all(ctr.get(e, 0) >= t for e, t in progs[q][pos[q]].waits):
                for e, inc, _ in progs[q][pos[q]].signals:
                    ctr[e] = ctr.get(e, 0) + inc
                pos[q] += 1
                moved = True
    assert pos == [l_n] * q_n, f"deadlock at {pos}"
    return ctr


def test_chain_plan_is_deadlock_free_and_epoch_exact():
    p = D.chain_plan(16, 6, seed=3)
    assert p.instructions.shape == (16, 6, 32) and p.num_counters == 96
    ctr = _simulate(p)
    assert ctr == {e: 1 for e in range(96)}  # every event signalled exactly its threshold (1) per step
    waits = [w for q in range(16) for i in range(6) for w in decode(p.instructions[q, i]).waits]
    assert len(waits) > 100 and all(t == 1 for _, t in waits)
    cross = {(q, w[0] % 16) for q in range(16) for i in range(6) for w in decode(p.instructions[q, i]).waits}
    assert any(a != b for a, b in cross)  # waits do cross queues
    assert D.max_epoch(p) == (2**32 - 1) // 16
    n = D.noop_plan(132, 3)
    assert n.instructions.shape == (132, 3, 32) and n.num_counters == 0
    assert all(decode(n.instructions[q, i]) == decode(encode(Instruction(int(Opcode.NOOP))))
               for q in (0, 131) for i in range(3))


# ---- error records -------------------------------------------------------------------------------------------

def _record(**kw) -> list[int]:
    r = dict.fromkeys(D._FIELDS, 0)
    r.update(kw)
    return [r[f] for f in D._FIELDS]


def test_clear_record_decodes_to_none():
    assert D.decode_error([0] * 16) is None


def test_wait_timeout_record_names_everything():
    ops = ["B0", "B1", "D1", "D2"]
    w = _record(kind=1, queue=7, pos=3, opcode=int(Opcode.D2), event=12, threshold=84, target=168, observed=83,
                epoch=2, tile=17, operand_row=3, smid=40, detail=1, cycles=123456, claim=1)
    e = D.decode_error(w, ops)
    assert isinstance(e, D.MegaRtpWaitTimeout) and isinstance(e, D.MegaRtpDeviceError)
    msg = str(e)
    for part in ("queue 7", "SM 40", "instruction 3", "D2 (op D2)", "tile 17", "event 12", ">= 168",
                 "epoch 2 x threshold 84", "observed 83", "123456 cycles"):
        assert part in msg, (part, msg)
    assert e.record.event == 12 and e.record.observed == 83


def test_other_records_and_uint32_fields():
    e = D.decode_error(_record(kind=4, queue=1, opcode=int(Opcode.B0), operand_row=0, detail=2), ["B0"])
    assert type(e) is D.MegaRtpDeviceError and "16-token block" in str(e) and "B0 (op B0)" in str(e)
    assert "opcode 77" in str(D.decode_error(_record(kind=2, opcode=77, detail=77)))
    assert "operand_row out of range" in str(D.decode_error(_record(kind=3, detail=4)))
    assert "needs 120000 B" in str(D.decode_error(_record(kind=5, detail=120000)))
    slot = str(D.decode_error(_record(kind=6, queue=3, pos=7, detail=1, target=4, observed=3, cycles=999)))
    assert "publish slot 1 (use 4, observed 3)" in slot and "instruction 7" in slot and "controller is stuck" in slot
    r = D.ErrorRecord.from_words(_record(kind=1, target=-2, observed=-1, epoch=-1))  # int32 words of uint32 values
    assert (r.target, r.observed, r.epoch) == (2**32 - 2, 2**32 - 1, 2**32 - 1)
    with pytest.raises(ValueError):
        D.ErrorRecord.from_words([0] * 15)


# ---- trace ------------------------------------------------------------------------------------------------------

def _fake_trace(plan: D.RawPlan, run_ns: int = 100) -> torch.Tensor:
    """What the kernel would record: each instruction ready when its queue predecessor and every producer
    of its waits are done, done run_ns later; fetched = its predecessor's ready (prefetch)."""
    q_n, l_n, _ = plan.instructions.shape
    progs = [[decode(plan.instructions[q, i]) for i in range(l_n)] for q in range(q_n)]
    done_of_event: dict[int, int] = {}
    raw = torch.zeros(q_n, l_n, T.TRACE_WORDS, dtype=torch.int64)
    pos, free, prev_ready = [0] * q_n, [1000] * q_n, [1000] * q_n
    left = q_n * l_n
    while left:
        for q in range(q_n):
            i = pos[q]
            if i == l_n or any(e not in done_of_event for e, _ in progs[q][i].waits):
                continue
            ready = max([free[q]] + [done_of_event[e] for e, _ in progs[q][i].waits]) + 10
            done = ready + run_ns + 7 * q
            row = [prev_ready[q], ready, done, (q + 100) << 32 | 1] + [0] * T.TRACE_MARKS
            if progs[q][i].reduce_counter >= 0:  # split-K: the partial's mark; every 2nd one plays the last arriver
                row[4] = ready + 20
                if i % 2 == 0:
                    row[5:12] = [ready + 30, ready + 45, ready + 50, ready + 55, ready + 60, ready + 64, ready + 70]
            raw[q, i] = torch.tensor(row)
            for e, _, _ in progs[q][i].signals:
                done_of_event[e] = done
            free[q], prev_ready[q], pos[q] = done, ready, i + 1
            left -= 1
    return raw


def test_trace_decode_export_and_critical_path(tmp_path):
    plan = D.chain_plan(4, 3, seed=1)
    recs = T.decode_trace(plan, _fake_trace(plan))
    assert len(recs) == 12 and {r.queue for r in recs} == {0, 1, 2, 3}
    assert min(r.fetched for r in recs) == 0.0 and all(r.start <= r.ready <= r.done for r in recs)
    assert recs[0].smid == 100 and recs[0].op == "NOOP"
    # causality: every instruction became ready after the producers of its waits were done
    done = {e: r.done for r in recs for e in r.signals}
    assert all(r.ready >= done[e] for r in recs for e, _ in r.waits)
    ct = T.chrome_trace(recs)
    json.dumps(ct)
    names = [e for e in ct["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in names if e["name"].startswith("NOOP@")]) == 12
    assert {e["args"]["name"] for e in ct["traceEvents"] if e.get("name") == "thread_name"} == \
        {f"queue {q} (SM {q + 100})" for q in range(4)}
    path = T.write_chrome_trace(tmp_path / "t.json", recs)
    assert json.loads(path.read_text())["traceEvents"]
    chain = T.critical_path(recs)
    last = max(recs, key=lambda r: r.done)
    assert (chain[-1]["queue"], chain[-1]["pos"]) == (last.queue, last.pos)
    assert chain[0]["released_by"] == "kernel start"
    for a, b in zip(chain, chain[1:]):  # each step was released by the one before it
        assert a["done"] <= b["ready"]
        assert b["released_by"] == "queue order" or b["released_by"].startswith("event e")
    s = T.summarize(recs)
    assert s["instructions"] == 12 and s["ops"]["NOOP"]["count"] == 12
    assert s["makespan_us"] == pytest.approx((last.done - 0.0) / 1e3, abs=1e-3)
    text = T.format_summary(s)
    assert "critical path" in text and "NOOP" in text


def test_trace_of_a_kernel_plan_names_ops_and_hidden_ops():
    g = D.supported_subgraph(build_prefix_graph(SMALL), SMALL)
    plan = validate(build_plan(g, ShapeContext.independent([40, 41]), SMALL, num_sms=4))
    recs = T.decode_trace(plan, _fake_trace(plan))
    ops = {r.op for r in recs}
    assert {"A0", "B0", "B1", "D2", "E1"} <= ops
    s = T.summarize(recs)
    assert set(s["critical_path_ops"]) | set(s["hidden_ops"]) >= {"A0", "B0", "B1", "D2", "E1"}
    assert s["critical_path_ops"][0] == "A0"  # a chain starts at the source op
    with pytest.raises(ValueError, match="trace buffer has shape"):
        T.decode_trace(plan, torch.zeros(1, 1, 4, dtype=torch.int64))
    assert T.decode_trace(plan, torch.zeros(*plan.instructions.shape[:2], T.TRACE_WORDS, dtype=torch.int64)) == []


def test_trace_phase_marks_of_split_k_families():
    g = D.supported_subgraph(build_prefix_graph(SMALL), SMALL)
    plan = validate(build_plan(g, ShapeContext.independent([40, 41]), SMALL, num_sms=4))
    recs = T.decode_trace(plan, _fake_trace(plan))
    b0 = [r for r in recs if r.op == "B0"]
    assert b0 and all(r.marks[0] == r.ready + 20 for r in b0)
    last = [r for r in b0 if r.marks[3] is not None]
    assert last and [n for n, _, _ in T.phase_spans(last[0])] == list(T.B0_PHASES)
    assert [b - a for _, a, b in T.phase_spans(last[0])] == [20, 10]
    assert {r.op for r in recs} >= {"B0", "B0.final"}  # the row finalisers: their own record name, no marks
    assert all(r.marks == (None,) * T.TRACE_MARKS for r in recs if r.op in ("A0", "E1", "D2", "NOOP", "B0.final"))
    b1 = [r for r in recs if r.op == "B1" and r.marks[7] is not None]  # a B1 last arriver: every split-K phase
    assert b1 and [n for n, _, _ in T.phase_spans(b1[0])] == list(T.SPLIT_K_PHASES)
    assert [b - a for _, a, b in T.phase_spans(b1[0])] == [20, 10, 15, 5, 5, 5, 4, 6]
    s = T.summarize(recs)
    assert s["phases"]["B0"]["partial"]["count"] == len(b0)
    assert s["phases"]["B0"]["tile_sum"]["count"] == len(last)
    assert s["phases"]["B0"]["tile_sum"]["median_us"] == pytest.approx(0.010)
    assert "phases (median / max us" in T.format_summary(s)
    ev = T.chrome_trace(recs)["traceEvents"]
    assert any(e.get("cat") == "phase" and e["name"] == "B0 tile_sum" for e in ev)


# ---- operand binding (what PlanRunner.bind checks) and the GPU tests' data helpers --------------------------

def test_reference_env_and_operand_binding_on_cpu():
    from glm5_fastpath.attn_pre.megartp.bench import bind_tensors, reference_env
    g = D.keep_only(build_prefix_graph(SMALL), ["B0", "D2"])
    assert set(g.external_tensors()) >= {"x_fp8", "x_scale", "q_nope", "positions", "kv_cache", "w.w_kc"}
    ctx = ShapeContext.independent([40, 41, 300])
    plan = validate(build_plan(g, ctx, SMALL, num_sms=4))
    env, ref = reference_env(SMALL, g, ctx, seed=1, device="cpu")
    assert set(env) == set(g.external_tensors())
    assert torch.equal(env["q_nope"], ref["q_nope"]) and not torch.equal(env["kv_cache"], ref["kv_cache"])
    tensors = bind_tensors(plan, env, "cpu")
    assert torch.isnan(tensors["q_lat"].float()).all()  # poisoned until written
    table = D.bind_operands(plan, tensors, "cpu")
    row = plan.ops.index("D2")
    assert int(table.ptrs[row, table.slot_names(row).index("kv_cache_written")]) == env["kv_cache"].data_ptr()
    bad = dict(tensors, q_nope=tensors["q_nope"].float())
    with pytest.raises(D.MegaRtpError, match="operand D2.q_nope must be torch.bfloat16"):
        D.bind_operands(plan, bad, "cpu")
    bad = dict(tensors, x_scale=tensors["x_scale"][:, :2].contiguous())
    with pytest.raises(D.MegaRtpError, match=r"operand B0.x_scale must have shape \[3, 4\]"):
        D.bind_operands(plan, bad, "cpu")
    bad = dict(tensors, q_lat=tensors["q_lat"].transpose(0, 1))
    with pytest.raises(D.MegaRtpError, match="contiguous"):
        D.bind_operands(plan, bad, "cpu")
    ws = dict(tensors)
    ws["workspace.B0"] = torch.empty(1, 3, SMALL.qkv_a_out)
    with pytest.raises(D.MegaRtpError, match="workspace must have shape"):
        D.bind_operands(plan, ws, "cpu")
    with pytest.raises(D.MegaRtpError, match="is on cpu"):
        D.bind_operands(plan, tensors, "meta")


# ---- tripwire: the controller joins exactly the tile functions' CTA-wide barriers -----------------------------

def _code_lines(path: Path) -> list[str]:
    return [ln.split("//")[0] for ln in path.read_text().splitlines()]


def test_the_controllers_barrier_joins_match_the_tile_code():
    """The controller warp executes bar.sync 0 exactly gemm_joins() times per GEMM instruction: once per K group
    and 16-token block, because SkinnyGemmTile::mainloop calls __syncthreads() once per K-loop iteration and no
    other tile function the megakernel runs calls it. If this fails, the tile code changed: update
    csrc/megartp/families.cuh gemm_joins() (e.g. to 0 once the mainloop uses consumer_sync()), or the
    megakernel deadlocks in bar.sync."""
    attn = CSRC.parent / "attn_pre"
    for name in ("d2_absorb_kv_store.cuh", "b0_row_norms.cuh"):
        assert not any("__syncthreads" in ln for ln in _code_lines(attn / name)), name
    lines = _code_lines(attn / "fp8_gemm_skinny.cuh")
    hits = [i for i, ln in enumerate(lines) if "__syncthreads" in ln]
    assert len(hits) == 1, f"fp8_gemm_skinny.cuh calls __syncthreads() at lines {[h + 1 for h in hits]}"
    loop = max(i for i in range(hits[0]) if re.search(r"\bfor \(", lines[i]))
    assert re.search(r"for \(int it = 0; it < c\.nk; \+\+it\)", lines[loop]), lines[loop]
    assert "return (rows + tm - 1) / tm * nk;" in _cpp("families.cuh")


def test_bench_tiling_option_changes_only_the_named_splits():
    from glm5_fastpath.attn_pre.megartp.bench import parse_tiling
    from glm5_fastpath.graph.prefix_graph import PrefixTiling
    t = parse_tiling("b0_split_k=6,d1_split_k=2")
    assert (t.b0_split_k, t.d1_split_k) == (6, 2)
    assert t.b1_split_k == PrefixTiling().b1_split_k
    assert parse_tiling("") == PrefixTiling()
    with pytest.raises(ValueError, match="unknown PrefixTiling fields"):
        parse_tiling("b0_splits=6")
    with pytest.raises(ValueError, match="expected FIELD=INT"):
        parse_tiling("b0_split_k")
    with pytest.raises(ValueError, match="positive int"):
        parse_tiling("b0_split_k=0")


def test_bench_scheduler_option_is_checked_before_any_gpu_work(capsys):
    from glm5_fastpath.attn_pre.megartp.bench import main
    with pytest.raises(SystemExit) as e:
        main(["--scheduler", "greedy"])
    assert e.value.code == 2 and "invalid choice: 'greedy'" in capsys.readouterr().err


def test_gemm_stages_override_changes_the_build_and_its_shared_memory(monkeypatch):
    base = D.kernel_spec(GLM5)
    assert "GLM5_MRTP_GEMM_STAGES" not in dict(base.defines)  # the default build keeps its cache key
    smem6 = D.dynamic_smem_bytes(GLM5)
    monkeypatch.setenv("GLM5_FASTPATH_MRTP_GEMM_STAGES", "8")
    assert D.gemm_stages() == 8
    assert dict(D.kernel_spec(GLM5).defines)["GLM5_MRTP_GEMM_STAGES"] == "8"
    assert D.dynamic_smem_bytes(GLM5) == smem6 + 2 * (128 * 128 + 16 * 128)  # two more weight + x stages
    for bad in ("3", "9", "six"):
        monkeypatch.setenv("GLM5_FASTPATH_MRTP_GEMM_STAGES", bad)
        with pytest.raises(D.MegaRtpError, match="GLM5_FASTPATH_MRTP_GEMM_STAGES must be an integer in 4..8"):
            D.gemm_stages()


def test_weights_evict_first_is_the_default_and_the_switch_changes_only_its_define(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_MRTP_W_EVICT_FIRST", raising=False)
    on = dict(D.kernel_spec(GLM5).defines)
    assert on.pop("GLM5_WEIGHTS_EVICT_FIRST") == "1"
    monkeypatch.setenv("GLM5_FASTPATH_MRTP_W_EVICT_FIRST", "0")
    assert dict(D.kernel_spec(GLM5).defines) == on
    monkeypatch.setenv("GLM5_FASTPATH_MRTP_W_EVICT_FIRST", "maybe")
    with pytest.raises(D.MegaRtpError, match="GLM5_FASTPATH_MRTP_W_EVICT_FIRST"):
        D.kernel_spec(GLM5)


def test_weight_loads_route_through_the_evict_first_switch():
    """The weight loaders (skinny GEMM tile, wgmma tile, D2's W_UK) go through the GLM5_WEIGHTS_EVICT_FIRST switch,
    which is the plain copy unless the build defines it (the standalone kernels' default SASS stays the same)."""
    root = Path(D.__file__).resolve().parents[3] / "csrc"
    skinny = (root / "attn_pre" / "fp8_gemm_skinny.cuh").read_text()
    wgmma = (root / "attn_pre" / "fp8_gemm_wgmma.cuh").read_text()
    d2 = (root / "attn_pre" / "d2_absorb_kv_store.cuh").read_text()
    assert "cp_async_16_weights(base + swz_w(r, cc), src, ok ? 16u : 0u)" in skinny
    assert "cp_async_16_weights(base + row * kRowBytes" in d2
    assert "tma_load_2d_hint(w_map, dst, bar, g * kBlockK, n0, ptx::l2_policy_evict_first())" in wgmma
    for text in ((root / "common" / "ptx_cp_async.cuh").read_text(), wgmma):
        assert "#if defined(GLM5_WEIGHTS_EVICT_FIRST) && GLM5_WEIGHTS_EVICT_FIRST" in text


def test_bench_cost_overrides_change_the_scheduler_tables(monkeypatch):
    from glm5_fastpath.attn_pre.megartp import scheduler as S
    from glm5_fastpath.attn_pre.megartp.bench import apply_cost_overrides
    for name in ("FIXED_US", "COLD_US", "SETUP_US"):
        monkeypatch.setattr(S, name, dict(getattr(S, name)))  # restored after the test
    assert apply_cost_overrides("E2.fixed=9.5,E2.cold=1,E1.setup=0") == {"E2.fixed": 9.5, "E2.cold": 1.0,
                                                                          "E1.setup": 0.0}
    assert (S.FIXED_US["E2"], S.COLD_US["E2"], S.SETUP_US["E1"]) == (9.5, 1.0, 0.0)
    assert apply_cost_overrides("") == {} and apply_cost_overrides(None) == {}
    for bad in ("E2.fixed", "E2=3", "E2.warm=1", "E2.fixed=-1", "E2.fixed=x"):
        with pytest.raises(ValueError, match="--cost"):
            apply_cost_overrides(bad)


def test_e1_cache_evict_first_is_opt_in_and_changes_only_its_define(monkeypatch):
    monkeypatch.delenv("GLM5_FASTPATH_MRTP_E1_EVICT_FIRST", raising=False)
    base = dict(D.kernel_spec(GLM5).defines)
    assert "GLM5_E1_CACHE_EVICT_FIRST" not in base
    monkeypatch.setenv("GLM5_FASTPATH_MRTP_E1_EVICT_FIRST", "1")
    on = dict(D.kernel_spec(GLM5).defines)
    assert on.pop("GLM5_E1_CACHE_EVICT_FIRST") == "1" and on == base
    e1 = (Path(D.__file__).resolve().parents[3] / "csrc" / "attn_pre" / "e1_indexer_logits.cuh").read_text()
    assert "#if defined(GLM5_E1_CACHE_EVICT_FIRST) && GLM5_E1_CACHE_EVICT_FIRST" in e1
    assert "bulk_copy_g2s_hint(" in e1

