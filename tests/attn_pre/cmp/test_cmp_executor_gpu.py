"""CmpExecutor on the H200: graph replay == eager run of the same kernels (bitwise) and == the reference
graph (FP8 tolerances), every bucket and M below it; the early-wait PDL modes == serial (bitwise); 1000
replays with changing inputs, each one compared with eager; a late producer captured before the prefix under
PDL; cache rebinding."""

import pytest
import torch

from glm5_fastpath.attn_pre.cmp.executor import CmpExecutor
from glm5_fastpath.config import Glm5Config
from glm5_fastpath.graph import build_prefix_graph, prefix_env, run_eager
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_topk_sets
from glm5_fastpath.weights import random_layer

pytestmark = pytest.mark.gpu

CFG = Glm5Config.preset("glm5")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODES = ("serial", "multistream", "serial_pdl", "full", "full+pin:D1=0")
N_SEQ = 256
OUTS = ("residual_out", "q_pe", "q_lat", "topk_slots", "x_fp8", "q_lora", "head_w", "logits")


@pytest.fixture(scope="module")
def layer():
    return random_layer(CFG, 3, seed=11, device="cuda")


@pytest.fixture(scope="module")
def step():
    """N_SEQ sequences of mixed lengths; one spare page is the padding page."""
    lens = [257 + (i * 523) % 3000 for i in range(N_SEQ)]
    s = make_decode_step(CFG, lens, seed=5, device="cuda", spare_pages=2)
    used = set(s.block_table[s.block_table >= 0].tolist())
    s.pad_page = min(set(range(s.index_k_cache.shape[0])) - used)
    return s


def _rows(s, idx):
    return {"hidden": s.hidden[idx], "residual": s.residual[idx], "positions": s.positions[idx],
            "out_cache_loc": s.out_cache_loc[idx], "seq_lens": s.seq_lens[idx], "block_table": s.block_table[idx]}


def _executor(layer, s, mode, buckets=BUCKETS, kv=None, ik=None):
    return CmpExecutor(CFG, layer, "cuda", buckets=buckets, mode=mode, kv_cache=s.kv_cache if kv is None else kv,
                       index_k_cache=s.index_k_cache if ik is None else ik, max_pages=s.block_table.shape[1],
                       pad_slot=s.pad_page * 64)


def _padded(ex, r, bucket):
    """The step padded to the bucket exactly as staging does (for the bit-exact eager comparison)."""
    m = r["hidden"].shape[0]
    st = ex.staging
    out = {}
    for n, t in r.items():
        pad = st.buf[n][m:bucket].clone() if n != "block_table" else torch.full(
            (bucket - m, t.shape[1]), st.pad_page, dtype=t.dtype, device=t.device)
        out[n] = torch.cat([t, pad]) if bucket > m else t
    out["out_cache_loc"][m:] = st.pad_slot + torch.arange(m, bucket, device="cuda") % 64
    return out


def _check_vs_eager(ex, out, r, s, ctx):
    m = r["hidden"].shape[0]
    b = ex.bucket_for(m)
    kv, ik = s.kv_cache.clone(), s.index_k_cache.clone()
    kv[r["out_cache_loc"]] = float("nan")  # the eager run must write these rows itself
    e = ex.eager(**_padded(ex, r, b), kv_cache=kv, index_k_cache=ik)
    for n in OUTS:
        assert_equal(f"cmp {n}", out[n], e[n][:m], context=ctx)
    loc = r["out_cache_loc"]
    assert_equal("cmp kv rows", s.kv_cache[loc], kv[loc], context=ctx)
    assert_equal("cmp index-k pages", s.index_k_cache[loc // 64], ik[loc // 64], context=ctx)


def _check_vs_reference(out, r, s, layer, ctx):
    g = build_prefix_graph(CFG)
    kv, ik = s.kv_cache.clone(), s.index_k_cache.clone()
    ref = run_eager(g, prefix_env(g, w=layer.attn, kv_cache=kv, index_k_cache=ik, **r))
    assert_close("cmp q_lat", out["q_lat"], ref["q_lat"], kind="fp8_same_quant", context=ctx)
    assert_close("cmp q_pe", out["q_pe"], ref["q_pe"], kind="fp8_same_quant", context=ctx)
    assert_close("cmp residual_out", out["residual_out"], ref["residual_out"], kind="fp32", context=ctx)
    assert_close("cmp head_w", out["head_w"], ref["head_w"], kind="fp8_same_quant", context=ctx)
    loc = r["out_cache_loc"]
    assert_close("cmp kv rows", s.kv_cache[loc], kv[loc], kind="fp8_same_quant", context=ctx)
    assert_topk_sets("cmp topk_slots", out["topk_slots"], ref["topk_slots"], min_overlap=0.98)


@pytest.mark.parametrize("mode", MODES)
def test_every_bucket_and_m_below(layer, step, mode):
    ex = _executor(layer, step, mode)
    for b in BUCKETS:
        for m in sorted({b, max(1, b - 1), max(1, b // 2 + 1)}):
            if m > b or (m < b and ex.bucket_for(m) != b):
                continue
            idx = torch.randperm(N_SEQ, device="cuda")[:m]
            r = _rows(step, idx)
            out = ex.run(**r, all_tensors=True)
            torch.cuda.synchronize()
            ctx = f"mode={mode} bucket={b} M={m}"
            _check_vs_eager(ex, out, r, step, ctx)
            if mode == "full":
                _check_vs_reference(out, r, step, layer, ctx)
    assert ex.captures == len(BUCKETS)


def test_modes_agree_bitwise(layer, step):
    r = _rows(step, torch.arange(16, device="cuda"))
    outs = {}
    for mode in MODES:
        outs[mode] = {k: v.clone() for k, v in _executor(layer, step, mode, buckets=(16,)).run(**r, all_tensors=True).items()}
    for mode in MODES[1:]:
        for n in OUTS:
            assert_equal(f"{mode} vs serial {n}", outs[mode][n], outs["serial"][n])


@pytest.mark.parametrize("mode", ["multistream_pdl_entry", "multistream_pdl_prologue", "full_prio_index",
                                  "full_prio_b1"])
def test_early_wait_modes_equal_serial_bitwise(layer, step, mode):
    """The decomposition modes (every kernel compiled with pdl_wait= entry / after_prologue, GLM5_PDL_WAIT_AT)
    replay the same bits as serial, and as an eager run of their own kernels."""
    r = _rows(step, torch.arange(16, device="cuda"))
    serial = {k: v.clone() for k, v in _executor(layer, step, "serial", buckets=(16,)).run(**r, all_tensors=True).items()}
    ex = _executor(layer, step, mode, buckets=(16,))  # (the _prio modes: launch priorities on top of full)
    assert all(p.realized == ex.mode.wait_point or (ex.mode.priority_ops and p.realized == modes_native(p.op))
               for p in ex.wait_plans.values())
    out = ex.run(**r, all_tensors=True)
    torch.cuda.synchronize()
    for n in OUTS:
        assert_equal(f"{mode} vs serial {n}", out[n], serial[n])
    _check_vs_eager(ex, out, r, step, mode)


@pytest.mark.parametrize("mode", ["full+after:D1>D0", "full+cap:D0=64", "multistream_pdl_prologue+after:D1>D0+cap:D0=48",
                                  "full+pin:D1=0+cap:D0=96", "full+pin:D1=0+stages:D0=3"])
@pytest.mark.parametrize("bucket", [1, 16, 64])
def test_composite_modes_equal_serial_bitwise(layer, step, mode, bucket):
    """Ordering edges and grid caps (modes.py composites) change when and on how many CTAs kernels run, never
    the bits: the capped D0 runs the persistent launch of the same tile code."""
    r = _rows(step, torch.arange(bucket, device="cuda"))
    serial = {k: v.clone() for k, v in _executor(layer, step, "serial", buckets=(bucket,)).run(**r, all_tensors=True).items()}
    ex = _executor(layer, step, mode, buckets=(bucket,))
    for _ in range(3):
        out = ex.run(**r, all_tensors=True)
        torch.cuda.synchronize()
        for n in OUTS:
            assert_equal(f"{mode} vs serial {n}", out[n], serial[n], context=f"bucket={bucket}")
    _check_vs_eager(ex, out, r, step, f"{mode} bucket={bucket}")


def modes_native(op):
    from glm5_fastpath.attn_pre.cmp.modes import NATIVE_WAIT_POINTS

    return NATIVE_WAIT_POINTS[op]


def _bits(t):
    return t.contiguous().view(torch.uint8)


def test_1000_replays_with_changing_inputs(layer, step):
    """Every one of the 1000 replays is compared bitwise with an eager run of the same kernels on the same inputs
    (mismatching bytes counted on the device, one sync at the end); every 100th replay also checks the cache
    rows it wrote, and every 250th is checked against the reference graph."""
    ex = _executor(layer, step, "full", buckets=(8, 16, 64))
    g = torch.Generator(device="cuda").manual_seed(0)
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    deltas = []  # (replay, M, mismatching bytes on the device): read once, after the loop
    for i in range(1000):
        m = (1, 5, 16, 37, 64)[i % 5]
        idx = torch.randperm(N_SEQ, device="cuda", generator=g)[:m]
        r = _rows(step, idx)
        r["hidden"] = r["hidden"] * (1 + 0.01 * (i % 7))  # new values every step
        out = ex.run(**r, all_tensors=True)
        if i % 100 == 0 or i == 999:
            torch.cuda.synchronize()
            _check_vs_eager(ex, out, r, step, f"replay {i} M={m}")
            if i % 250 == 0:
                _check_vs_reference(out, r, step, layer, f"replay {i} M={m}")
            continue
        # the eager run sees the caches the replay just wrote (it rewrites the same rows with the same values)
        e = ex.eager(**_padded(ex, r, ex.bucket_for(m)), kv_cache=step.kv_cache.clone(),
                     index_k_cache=step.index_k_cache.clone())
        before = bad.clone()
        for n in OUTS:
            bad += (_bits(out[n]) != _bits(e[n][:m])).sum()
        deltas.append((i, m, bad - before))
    torch.cuda.synchronize()
    where = [(i, m, int(d)) for i, m, d in deltas if int(d)][:5]
    assert int(bad) == 0, f"{int(bad)} mismatching bytes over the replays (first: {where})"
    assert ex.captures == 3


def test_late_producer_inside_the_graph(layer, step):
    """A producer that lets dependents launch, spins 50 us, then writes A0's input is captured right before
    the prefix (A0 launched with PDL behind it): the prefix must see the produced hidden state."""
    from glm5_fastpath.testing.pdl import late_producer, produce

    prod = late_producer()
    ex = _executor(layer, step, "full", buckets=(16,))
    r = _rows(step, torch.arange(16, device="cuda"))
    ex.run(**r)  # capture the bucket once (the warm-up happens there)
    src = r["hidden"].clone()
    static_hidden = ex.staging.buf["hidden"][:16]
    ex.staging.load({**r, "hidden": torch.full_like(src, 7.0)}, 16)  # poison what A0 would read too early
    ex.staging.buf["hidden"][:16].fill_(7.0)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        produce(prod, src, static_hidden)  # static_hidden <- src after ~50 us, dependents launched at once
        env = ex.enqueue(16)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        produce(prod, src, static_hidden)  # static_hidden <- src after ~50 us, dependents launched at once
        env = ex.enqueue(16)
    for _ in range(3):
        static_hidden.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        out = {n: env[n][:16] for n in OUTS}
        _check_vs_eager(ex, out, r, step, "late producer")


def test_rebinding_caches(layer, step):
    ex = _executor(layer, step, "full", buckets=(4,), kv=step.kv_cache.clone(), ik=step.index_k_cache.clone())
    r = _rows(step, torch.arange(3, device="cuda"))
    ex.run(**r)
    assert ex.captures == 1
    kv2, ik2 = step.kv_cache.clone(), step.index_k_cache.clone()
    old_kv = ex.kv_cache
    before = old_kv.clone()
    ex.rebind(kv_cache=kv2, index_k_cache=ik2)
    r2 = _rows(step, torch.arange(3, 6, device="cuda"))
    out = ex.run(**r2, all_tensors=True)
    torch.cuda.synchronize()
    assert ex.captures == 2
    assert torch.equal(old_kv, before)  # the old pool is untouched
    s2 = type("S", (), {})()
    s2.kv_cache, s2.index_k_cache = kv2, ik2
    _check_vs_eager(ex, out, r2, s2, "after rebind")
    bt = r2.pop("block_table")
    ex.rebind(block_table=bt)
    out2 = ex.run(**r2, all_tensors=True)
    torch.cuda.synchronize()
    assert ex.captures == 2
    r2["block_table"] = bt
    _check_vs_eager(ex, out2, r2, s2, "bound block table")


def test_prio_mode_launches_the_named_ops_at_high_priority(layer, step):
    """Under full_prio_b1 the kernels of B1 / E1 / E2 are issued inside launch_priority(greatest) and the others
    outside it (the op's ref runs the launches; jit.runtime turns the context into the launch attribute, checked
    by tests/jit/test_compiler.py with a fake driver)."""
    import dataclasses

    from glm5_fastpath.jit import runtime

    ex = _executor(layer, step, "full_prio_b1", buckets=(16,))
    seen = {}
    for name, op in list(ex.graph.ops.items()):
        def rec(env, _ref=op.ref, _name=name):
            seen[_name] = runtime.current_launch_priority()
            return _ref(env)
        ex.graph.ops[name] = dataclasses.replace(op, ref=rec)
    ex.enqueue(16)
    torch.cuda.synchronize()
    high = runtime.priority_range()[1]
    assert {o: p for o, p in seen.items() if p is not None} == {o: high for o in ("B1", "E1", "E2")}
    assert seen["B0"] is None and seen["D0"] is None and len(seen) == len(ex.graph.ops)
