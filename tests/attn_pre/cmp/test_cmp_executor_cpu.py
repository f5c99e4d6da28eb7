"""CmpExecutor on CPU (capture=False: the schedule runs eagerly on the static buffers) with the reference
ops: buckets, padding into a reserved page, outputs as row views, rebinding caches / block tables."""
import pytest
import torch

from glm5_fastpath.attn_pre.cmp.executor import CmpError, CmpExecutor
from glm5_fastpath.attn_pre.cmp.staging import StagingError
from glm5_fastpath.config import small_config
from glm5_fastpath.graph import build_prefix_graph, prefix_env, run_eager
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.testing.numerics import assert_close, assert_topk_sets
from glm5_fastpath.weights import random_layer

CFG = small_config()
LENS = [70, 130, 5, 200, 64, 90, 150, 33]
BUCKETS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def layer():
    return random_layer(CFG, 1, seed=3)


def _setup(seed=0):
    s = make_decode_step(CFG, LENS, seed=seed, spare_pages=3)
    used = set(s.block_table[s.block_table >= 0].tolist())
    pad_page = min(set(range(s.index_k_cache.shape[0])) - used)
    return s, pad_page


def _rows(s, idx):
    return {"hidden": s.hidden[idx], "residual": s.residual[idx], "positions": s.positions[idx],
            "out_cache_loc": s.out_cache_loc[idx], "seq_lens": s.seq_lens[idx], "block_table": s.block_table[idx]}


def _reference(layer, s, idx, kv, ik):
    g = build_prefix_graph(CFG)
    r = _rows(s, idx)
    env = prefix_env(g, w=layer.attn, kv_cache=kv, index_k_cache=ik, **r)
    return run_eager(g, env)


def _executor(layer, s, pad_page, **kw):
    return CmpExecutor(CFG, layer, "cpu", buckets=BUCKETS, mode=kw.pop("mode", "multistream"), impl=P,
                       kv_cache=s.kv_cache, index_k_cache=s.index_k_cache, max_pages=s.block_table.shape[1],
                       pad_slot=pad_page * 64, **kw)


@pytest.mark.parametrize("m", [1, 3, 4, 7, 8])
def test_run_matches_reference_and_pads_into_the_reserved_page(layer, m):
    s, pad_page = _setup()
    kv0, ik0 = s.kv_cache.clone(), s.index_k_cache.clone()
    ex = _executor(layer, s, pad_page)
    idx = torch.arange(m)
    out = ex.run(**_rows(s, idx), all_tensors=True)
    assert ex.bucket_for(m) == next(b for b in BUCKETS if b >= m)
    kv_ref, ik_ref = kv0.clone(), ik0.clone()
    ref = _reference(layer, s, idx, kv_ref, ik_ref)
    for name in ("residual_out", "q_pe", "q_lat", "head_w"):
        assert out[name].shape[0] == m
        assert_close(f"cmp {name}", out[name], ref[name], kind="bf16", context=f"M={m}")
    assert_topk_sets("cmp topk", out["topk_slots"], ref["topk_slots"], min_overlap=0.98)
    # caches: the real rows' slots equal the reference's; padding wrote only inside the reserved page
    loc = s.out_cache_loc[idx]
    assert_close("kv rows", s.kv_cache[loc], kv_ref[loc], kind="bf16")
    changed = (s.kv_cache != kv0).any(1).nonzero().flatten().tolist()
    allowed = set(loc.tolist()) | set(range(pad_page * 64, pad_page * 64 + 64))
    assert set(changed) <= allowed
    pages_changed = (s.index_k_cache != ik0).any(1).nonzero().flatten().tolist()
    assert set(pages_changed) <= set((loc // 64).tolist()) | {pad_page}


def test_outputs_are_static_views_and_buckets_capture_once(layer):
    s, pad_page = _setup()
    ex = _executor(layer, s, pad_page)
    a = ex.run(**_rows(s, torch.arange(3)))
    ptr = a["q_lat"].data_ptr()
    b = ex.run(**_rows(s, torch.arange(3, 7)))
    assert b["q_lat"].data_ptr() == ptr and b["q_lat"].shape[0] == 4  # same bucket (4), same storage
    assert ex.captures == 1
    ex.run(**_rows(s, torch.arange(8)))
    assert ex.captures == 2


def test_rebind_caches_recaptures_and_block_table_copies(layer):
    s, pad_page = _setup()
    ex = _executor(layer, s, pad_page)
    idx = torch.arange(2)
    ex.run(**_rows(s, idx))
    assert ex.captures == 1
    ex.rebind(kv_cache=s.kv_cache, index_k_cache=s.index_k_cache)  # same storage: nothing to do
    ex.run(**_rows(s, idx))
    assert ex.captures == 1
    kv2, ik2 = s.kv_cache.clone(), s.index_k_cache.clone()
    kv_old = s.kv_cache.clone()
    ex.rebind(kv_cache=kv2, index_k_cache=ik2)
    assert ex.stale(2)
    r = _rows(s, torch.arange(2, 4))
    out = ex.run(**r)
    assert ex.captures == 2
    loc = r["out_cache_loc"]
    assert torch.equal(s.kv_cache, kv_old)  # the old cache is no longer written
    assert not torch.equal(kv2[loc], kv_old[loc])  # the new one is
    # block table: bind once, then steps without one use it
    bt = r.pop("block_table")
    ex.rebind(block_table=bt)
    out2 = ex.run(**r, block_table=None)
    assert torch.equal(out2["topk_slots"], out["topk_slots"])


def test_errors(layer):
    s, pad_page = _setup()
    ex = _executor(layer, s, pad_page)
    big = make_decode_step(CFG, [10] * 9, seed=1)
    with pytest.raises(StagingError, match="exceeds the largest bucket 8"):
        ex.run(**_rows(big, torch.arange(9)))
    r = _rows(s, torch.arange(2))
    with pytest.raises(StagingError, match="int64"):
        ex.run(**{**r, "positions": r["positions"].int()})
    with pytest.raises(StagingError, match="prev_topk"):
        ex.run(**r, prev_topk=torch.zeros(2, CFG.index_topk, dtype=torch.int32))
    with pytest.raises(CmpError, match="kv_cache must be"):
        ex.rebind(kv_cache=s.kv_cache.float())
    with pytest.raises(CmpError, match="pad_slot"):
        ex.rebind(kv_cache=s.kv_cache[:64 * pad_page])
    ex2 = CmpExecutor(CFG, layer, "cpu", buckets=BUCKETS, mode="serial", impl=P, max_pages=4, pad_slot=0)
    with pytest.raises(CmpError, match="bind the caches"):
        ex2.run(**r)


def test_shared_layer_runs_with_prev_topk():
    cfg = small_config(index_topk_freq=2)
    layer = next(l for l in range(1, cfg.num_hidden_layers) if not cfg.is_full_indexer_layer(l))
    w = random_layer(cfg, layer, seed=0)
    s = make_decode_step(cfg, [40, 90, 7], seed=0, spare_pages=2)
    used = set(s.block_table[s.block_table >= 0].tolist())
    pad_page = min(set(range(s.index_k_cache.shape[0])) - used)
    ex = CmpExecutor(cfg, w, "cpu", buckets=(4,), mode="full", impl=P, kv_cache=s.kv_cache,
                     max_pages=s.block_table.shape[1], pad_slot=pad_page * 64)
    assert ex.schedule.num_streams == 1
    # a bucket's composite mode names D1, which a shared layer lacks: it does not apply there (no error) ...
    ex2 = CmpExecutor(cfg, w, "cpu", buckets=(4,), mode="full+pin:D1=0+after:D1>D0+cap:D1=64", impl=P,
                      kv_cache=s.kv_cache, max_pages=s.block_table.shape[1], pad_slot=pad_page * 64)
    assert ex2.schedule.num_streams == 1
    # ... but a name that is no prefix op is a mistake
    with pytest.raises(CmpError, match="not prefix ops"):
        CmpExecutor(cfg, w, "cpu", buckets=(4,), mode="full+cap:Q9=64", impl=P, kv_cache=s.kv_cache,
                    max_pages=s.block_table.shape[1], pad_slot=pad_page * 64)
    prev = torch.randint(0, 100, (3, cfg.index_topk), dtype=torch.int32)
    out = ex.run(**_rows(s, torch.arange(3)), prev_topk=prev)
    assert torch.equal(out["topk_slots"], prev) if "topk_slots" in out else True
    assert out["q_lat"].shape == (3, cfg.num_attention_heads, cfg.kv_lora_rank)
    with pytest.raises(StagingError, match="needs prev_topk"):
        ex.run(**_rows(s, torch.arange(3)))


def test_priority_modes_raise_only_the_named_ops_launch_priority(layer, monkeypatch):
    """full_prio_*: the named ops' kernels launch at the context's greatest priority (jit.runtime.launch_priority),
    every other op at the stream's; on CPU (no kernels) nothing changes and the results equal the reference."""
    from glm5_fastpath.jit import runtime

    monkeypatch.setattr(runtime, "priority_range", lambda device=None: (0, -5))
    s, pad = _setup(seed=4)
    ex = _executor(layer, s, pad, mode="full_prio_b1")
    for op, want in (("B1", -5), ("E2", -5), ("D0", None), ("B0", None)):
        with ex._priority(op, True):
            assert runtime.current_launch_priority() == want, op
    with ex._priority("B1", False):  # no CUDA streams: nothing to prioritise
        assert runtime.current_launch_priority() is None
    assert runtime.current_launch_priority() is None
    idx = torch.tensor([0, 2, 5])
    got = ex.run(**_rows(s, idx))
    ref = _reference(layer, s, idx, s.kv_cache.clone(), s.index_k_cache.clone())
    assert_close("cmp prio q_pe", got["q_pe"], ref["q_pe"], kind="bf16")


def test_op_launch_context_sets_the_modes_caps_and_priorities(monkeypatch):
    """op_launch_context (CmpExecutor and the SGLang seam): GEMM caps of the named op, the greatest launch priority
    for priority_ops on CUDA; nothing for other ops, and everything restored afterwards."""
    from glm5_fastpath.attn_pre.cmp.executor import op_launch_context
    from glm5_fastpath.attn_pre.cmp.modes import get_mode
    from glm5_fastpath.jit import runtime
    from glm5_fastpath.ops import fp8_gemm

    monkeypatch.setattr(runtime, "priority_range", lambda device=None: (0, -5))
    m = get_mode("full+cap:D0=64+stages:D0=4+prio:E1")
    with op_launch_context(m, "D0", True):
        assert (fp8_gemm._cap.ctas, fp8_gemm._cap.stages) == (64, 4)
        assert runtime.current_launch_priority() is None
    with op_launch_context(m, "E1", True):
        assert runtime.current_launch_priority() == -5
        assert getattr(fp8_gemm._cap, "ctas", None) is None
    with op_launch_context(m, "E1", False):  # no CUDA streams: no priority
        assert runtime.current_launch_priority() is None
    assert getattr(fp8_gemm._cap, "ctas", None) is None and getattr(fp8_gemm._cap, "stages", None) is None


def test_d2_fp8_weights_give_the_same_outputs_and_resolve_from_env(layer, monkeypatch):
    """d2_weights="fp8" (W_UK as the checkpoint's FP8 bytes, session 24): same q_lat and caches as bf16, bit for bit;
    GLM5_FASTPATH_D2_WEIGHTS picks the form when the argument is None; fp8 without the FP8 form is a CmpError."""
    from glm5_fastpath.attn_pre.cmp.executor import ENV_D2_WEIGHTS, resolve_d2_weights

    outs = {}
    for form in ("bf16", "fp8"):
        s, pad_page = _setup(seed=5)
        ex = _executor(layer, s, pad_page, d2_weights=form)
        assert ex.d2_weights == form and ("w.w_kc_fp8" in ex.graph.tensors) == (form == "fp8")
        outs[form] = (ex.run(**_rows(s, torch.arange(5)), all_tensors=True), s.kv_cache)
    for name in ("q_lat", "q_pe", "topk_slots", "residual_out"):
        assert torch.equal(outs["fp8"][0][name], outs["bf16"][0][name]), name
    assert torch.equal(outs["fp8"][1], outs["bf16"][1])

    monkeypatch.setenv(ENV_D2_WEIGHTS, "auto")
    assert resolve_d2_weights(layer.attn) == "fp8"
    no_fp8 = type(layer.attn)(**{**layer.attn.__dict__, "w_kc_fp8": None, "w_kc_scale": None})
    assert resolve_d2_weights(no_fp8) == "bf16"
    monkeypatch.setenv(ENV_D2_WEIGHTS, "fp8")
    with pytest.raises(ValueError, match="FP8 form"):
        resolve_d2_weights(no_fp8)
    monkeypatch.setenv(ENV_D2_WEIGHTS, "int8")
    with pytest.raises(ValueError, match="expected one of"):
        resolve_d2_weights(layer.attn)
    s, pad_page = _setup()
    with pytest.raises(CmpError, match="FP8 form"):
        CmpExecutor(CFG, no_fp8, "cpu", buckets=BUCKETS, impl=P, kv_cache=s.kv_cache, index_k_cache=s.index_k_cache,
                    max_pages=s.block_table.shape[1], pad_slot=pad_page * 64, d2_weights="fp8")
