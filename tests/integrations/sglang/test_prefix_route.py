"""The prefix route on CPU: the adapter's decisions and views over faithful fakes of SGLang's objects
(prefix_fakes.py, GLM-5 small preset), the executor on the reference namespace against the project's
reference prefix (ref.prefix.attention_prefix), fallbacks, install, and the shadow check."""
import logging
import types

import pytest
import torch
from prometheus_client import CollectorRegistry

import prefix_fakes as F
import prefix_fakes_0514 as F14
from glm5_fastpath.ref import prefix as ref_prefix
from glm5_fastpath.integrations.sglang import decision, install as inst, patch, prefix_adapter as A
from glm5_fastpath.integrations.sglang import prefix_executor as PX
from glm5_fastpath.integrations.sglang.prefix_check import PrefixCheck
from glm5_fastpath.metrics import FastpathMetrics
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.ref.fp8 import index_k_cache_load
from glm5_fastpath.testing.numerics import assert_equal, assert_topk_sets, calc_diff

CFG = F.small_cfg()
SEQ = [5, 70, 130]  # one row shorter than index_topk (64), two longer: a real selection


def executor(mode="serial", **kw):
    return PX.PrefixExecutor(impl=P, mode=mode, cfg=CFG, **kw)


def ref_outputs(attn, step, w, rotate=False):
    """The project's reference prefix (A0 included) on the adapter's weights: the definition of correct."""
    w = types.SimpleNamespace(**{**vars(w), "input_norm": torch.ones(CFG.hidden_size, dtype=torch.bfloat16)})
    kv, ik = step.kv_cache.clone(), step.index_k_cache.clone()
    prev = None if w.indexer is not None else torch.full((step.M, CFG.index_topk), -1, dtype=torch.int32)
    out = P.attention_prefix(step.hidden, step.residual, step.positions, step.out_cache_loc, step.seq_lens,
                             step.block_table, w, CFG, kv, ik, prev_topk=prev, indexer_rotate=rotate)
    return out, kv, ik


# ---- the seam graph and its schedule ----------------------------------------------------------------------

def test_seam_graph_replaces_a0_and_keeps_cmp_layout():
    g = PX.seam_graph(CFG, "full", P, PX.ref_quant)
    assert "A0" not in g.ops and g.topo_order()[0] == "Q0"
    assert set(g.ops) == {"Q0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"}
    assert {"x_in", "kv_slots", "topk_table"} <= set(g.external_tensors())
    assert "hidden" not in g.tensors and "residual_out" not in g.tensors
    plan = executor("full").plan("full")
    assert plan.schedule.streams() == {0: ["Q0", "B0", "D0", "D2"], 1: ["C0", "D1", "E1", "E2"], 2: ["B1"]}
    for kind in ("partial", "shared"):
        g = PX.seam_graph(CFG, kind, P, PX.ref_quant)
        assert list(g.ops) == ["Q0", "B0", "D0", "D2"] and "topk_slots" not in g.tensors
    assert executor("serial").plan("full").schedule is None


# ---- per-layer decisions ----------------------------------------------------------------------------------

def test_layer_kinds():
    assert A.check_layer(F.DeepseekV2AttentionMLA(CFG), CFG) == ("full", None)
    assert A.check_layer(F.DeepseekV2AttentionMLA(CFG, fused_indexer=False), CFG) == ("partial", None)
    assert A.check_layer(F.DeepseekV2AttentionMLA(CFG, shared=True), CFG) == ("shared", None)


def _mutate(**changes):
    """A fake layer with attributes changed; "indexer__k_norm__variance_epsilon" walks sub-objects."""
    a = F.DeepseekV2AttentionMLA(CFG)
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = a
        for p in parents:
            target = getattr(target, p)
        setattr(target, last, value)
    return a


@pytest.mark.parametrize("changes,reason", [
    (dict(num_local_heads=1), "tp_heads"),
    (dict(dcp_size=2), "dcp"),
    (dict(use_deep_gemm_bmm=True), "w_kc_format"),
    (dict(current_attention_backend="fa3"), "attention_backend"),
    (dict(prepare_attention_output_gate=lambda h: None), "output_gate"),
    (dict(qk_nope_head_dim=128), "dims"),
    (dict(rotary_emb__is_neox_style=True), "rope"),
    (dict(indexer__rotary_emb__base=10000.0), "rope"),
    (dict(indexer__num_local_tokens=4), "indexer_format"),
    (dict(indexer__k_norm__variance_epsilon=1e-5), "indexer_format"),
])
def test_layer_refusals(changes, reason):
    kind, r = A.check_layer(_mutate(**changes), CFG)
    assert kind == "" and r.reason == reason and r.message()


def test_backend_unknown_at_install_is_checked_per_call():
    """SGLang 0.5.14 stamps current_attention_backend at each forward; at install (post_load_weights) it is None:
    the layer is prepared, and each call is checked against the backend of that forward."""
    a = _mutate(current_attention_backend=None)
    kind, r = A.check_layer(a, CFG)
    assert r is None and kind
    ex = PX.PrefixExecutor(impl=ref_prefix, cfg=CFG)
    route = ex.prepare_layer(a)
    a.current_attention_backend = "fa3"
    got = ex.call_refusal(a, route, {"forward_batch": None, "llama_4_scaling": None})
    assert isinstance(got, A.Refusal) and got.reason == "attention_backend" and "fa3" in got.message()


def test_layer_refusal_weights():
    a = F.DeepseekV2AttentionMLA(CFG)
    a.w_kc = a.w_kc.to(torch.float8_e4m3fn)
    assert A.check_layer(a, CFG)[1].reason == "w_kc_format"
    a = F.DeepseekV2AttentionMLA(CFG)
    a.q_b_proj.weight = a.q_b_proj.weight.float().to(torch.bfloat16)
    w, _, r = A.build_weights(a, CFG, "full")
    assert w is None and r.reason == "weights_format" and "q_b_proj" in r.detail
    a = F.DeepseekV2AttentionMLA(CFG)
    a.fused_qkv_a_proj_with_mqa.weight_scale_inv.format_ue8m0 = True
    assert A.build_weights(a, CFG, "full")[2].reason == "weights_format"


def test_seam_signature_versions():
    s23 = A.seam_signature(F.DeepseekV2AttentionMLA(CFG))
    s14 = A.seam_signature(F.DeepseekV2AttentionMLA0514(CFG))
    assert (s23.arity, s23.has_fusion_plan, A.core_extras(s23)) == (10, True, (None,))
    assert (s14.arity, s14.has_fusion_plan, A.core_extras(s14)) == (9, False, ())

    class Odd(F.DeepseekV2AttentionMLA):
        def forward_absorb_core(self, q, k):
            pass

    assert A.check_layer(Odd(CFG), CFG)[1].reason == "seam_signature"


# ---- weight views and repacks -----------------------------------------------------------------------------

def test_weight_views_share_sglang_storage_and_repacks_are_exact():
    a = F.DeepseekV2AttentionMLA(CFG)
    orig_w_kc = a.w_kc
    w, rep, r = A.build_weights(a, CFG, "full")
    assert r is None
    same = lambda x, y: x.data_ptr() == y.data_ptr()  # noqa: E731
    assert same(w.qkv_a.weight, a.fused_qkv_a_proj_with_mqa.weight) and same(w.q_b.weight, a.q_b_proj.weight)
    assert same(w.indexer.wq_b.weight, a.indexer.wq_b.weight) and same(w.q_a_norm, a.q_a_layernorm.weight)
    kw = a.indexer.wk_weights_proj.weight
    d = CFG.index_head_dim
    assert w.indexer.weights_proj.data_ptr() == kw.data_ptr() + d * CFG.hidden_size * 2
    assert w.indexer.weights_proj.is_contiguous() and same(w.indexer.k_norm_weight, a.indexer.k_norm.weight)
    # wk: re-quantized from SGLang's bf16 rows; the checkpoint's e4m3 values come back exactly
    ck = a.weights.indexer.wk
    assert_equal("wk re-quant", w.indexer.wk.weight, ck.weight)
    assert ((w.indexer.wk.scale_inv / ck.scale_inv - 1).abs() <= 2 ** -8).all()
    assert rep.repacked == {"indexer.wk (fp8 re-quantized from wk_weights_proj)": w.indexer.wk.nbytes}
    # w_kc: relaid out in place (SGLang's attribute now contiguous, same values), no copy kept by us
    assert not orig_w_kc.is_contiguous() and a.w_kc.is_contiguous() and same(w.w_kc, a.w_kc)
    assert torch.equal(a.w_kc, orig_w_kc) and rep.relayout == {"w_kc": orig_w_kc.numel() * 2}
    b = F.DeepseekV2AttentionMLA(CFG)
    w2, rep2, _ = A.build_weights(b, CFG, "partial", w_kc_policy="copy")
    assert not b.w_kc.is_contiguous() and w2.w_kc.is_contiguous() and w2.indexer is None
    assert rep2.repacked == {"w_kc": b.w_kc.numel() * 2} and rep2.relayout == {}


# ---- the executor against the reference prefix ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["serial", "full", "full+pin:D1=0", "full_prio_index"])
@pytest.mark.parametrize("fused_topk", [True, False])
def test_full_route_reproduces_reference_prefix(mode, fused_topk):
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ, fused_topk=fused_topk)
    ex = executor(mode)
    za = object()
    out = ex(a.forward_absorb_prepare, step.positions, x, fb, za)
    ref, kv, ik = ref_outputs(a, step, ex.layer_route(a).weights)
    q_pe, k_pe, q_lat, k_nope, fb_, za_, pos_, topk, l4, fusion_plan = out
    assert (fb_, za_, pos_, l4, fusion_plan) == (fb, za, step.positions, None, None)
    assert_equal("q_lat", q_lat, ref.q_lat)
    assert_equal("q_pe", q_pe, ref.q_pe)
    loc = step.out_cache_loc
    assert_equal("k_nope", k_nope[:, 0], kv[loc, :CFG.kv_lora_rank])
    assert_equal("k_pe", k_pe[:, 0], kv[loc, CFG.kv_lora_rank:])
    assert (k_nope.shape, k_pe.shape) == ((3, 1, CFG.kv_lora_rank), (3, 1, CFG.qk_rope_head_dim))
    assert_equal("index-K cache", fb.token_to_kv_pool.get_index_k_with_scale_buffer(1), ik)
    if fused_topk:  # physical slots, as the DSA backend's fused top-k gives them
        want = ref.topk_slots
    else:  # logical positions: map the reference's physical slots back through the block table
        bt = step.block_table.long()
        phys = ref.topk_slots.long()
        want = torch.full_like(ref.topk_slots, -1)
        for m in range(3):
            for j, s in enumerate(phys[m].tolist()):
                if s >= 0:
                    page = (bt[m] == s // 64).nonzero()[0, 0].item()
                    want[m, j] = page * 64 + s % 64
    assert topk.dtype == torch.int32 and topk.shape == (3, CFG.index_topk)
    assert_topk_sets("topk", topk, want, min_overlap=1.0)
    assert (topk[0, :5] >= 0).all() and (topk[0, 5:] == -1).all()  # L <= topk: every token, -1 padded


def test_executor_output_equals_sglang_stand_in():
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    recs = []
    stock = PrefixCheck(executor("full"), recs)(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert len(stock) == 10 and recs[0]["passed"], recs
    r = recs[0]
    assert r["route"] == "full" and r["index_k_other_bytes_untouched"] and r["topk_overlap"] == 1.0
    assert max(r[f"{n}_rel_err"] for n in ("q_pe", "k_pe", "q_nope_out", "k_nope")) == 0.0
    assert 0 < r["index_k_rel_err"] < 0.08  # our indexer key is an FP8 GEMM, SGLang's a bf16 one


def test_check_records_our_exception_and_returns_sglang_tuple(monkeypatch):
    """PrefixCheck (also the in-engine shadow check): ours raising is a recorded failure, not a crashed step; the
    index-K pages it may have touched are restored and SGLang's tuple is returned."""
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    ex = executor("full")
    recs = []
    good = PrefixCheck(ex, recs)(a.forward_absorb_prepare, step.positions, x, fb, None)

    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(ex, "run", boom)
    a2 = F.DeepseekV2AttentionMLA(CFG)
    step2, x2, fb2 = F.make_batch(CFG, SEQ)
    out = PrefixCheck(ex, recs)(a2.forward_absorb_prepare, step2.positions, x2, fb2, None)
    assert len(out) == len(good) and recs[-1]["passed"] is False
    assert "kernel exploded" in recs[-1]["failures"][0]


def test_0514_tuple_has_nine_elements():
    a = F.DeepseekV2AttentionMLA0514(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    out = executor()(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert len(out) == 9 and out[8] is None


def test_partial_route_runs_sglang_indexer_on_our_q_lora():
    a = F.DeepseekV2AttentionMLA(CFG, fused_indexer=False)
    step, x, fb = F.make_batch(CFG, SEQ)
    ex = executor()
    out = ex(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert ex.layer_route(a).kind == "partial" and len(a.indexer.calls) == 1
    ref, _, _ = ref_outputs(a, step, ex.layer_route(a).weights)
    assert_equal("q_lora", a.indexer.calls[0], ref.tensors["q_lora"])
    assert_equal("q_lat", out[2], ref.q_lat)
    assert out[7].shape == (3, CFG.index_topk)
    assert ex.layer_route(a).weights.indexer is None  # no indexer weights built, nothing re-quantized
    assert ex.layer_route(a).report.repacked == {}


def test_shared_route_passes_previous_topk_on(caplog):
    a = F.DeepseekV2AttentionMLA(CFG, shared=True)
    step, x, fb = F.make_batch(CFG, SEQ)
    before = fb.token_to_kv_pool.get_index_k_with_scale_buffer(1).clone()
    prev = torch.arange(3 * CFG.index_topk, dtype=torch.int32).view(3, -1)
    ex = executor()
    out = ex(a.forward_absorb_prepare, step.positions, x, fb, None, None, prev)
    assert out[7] is prev and torch.equal(fb.token_to_kv_pool.get_index_k_with_scale_buffer(1), before)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    calls = []
    assert ex(_bound(a, calls), step.positions, x, fb, None) == "stock" and calls == [1]
    assert "IndexShare layer without the previous layer's top-k" in caplog.text


def _bound(attn, calls):
    class B:
        __self__ = attn

        def __call__(self, *a, **k):
            calls.append(1)
            return "stock"

    return B()


# ---- SGLang 0.5.14: the full route with the Hadamard rotation ------------------------------------------------

def test_0514_rotated_indexer_kill_switch(monkeypatch):
    """GLM5_FASTPATH_ROTATED_INDEXER=0 keeps 0.5.14 layers on the partial route (SGLang's indexer)."""
    a = F14.attn_0514(CFG)
    assert A.check_layer(a, CFG) == ("full", None)
    monkeypatch.setenv("GLM5_FASTPATH_ROTATED_INDEXER", "0")
    assert A.check_layer(a, CFG) == ("partial", None)


def test_0514_rotating_indexer_takes_the_full_route():
    a = F14.attn_0514(CFG)
    assert A.indexer_rotates(a.indexer) and A.layer_rotate(a)
    assert A.check_layer(a, CFG) == ("full", None)
    fused = F.DeepseekV2AttentionMLA(CFG)
    assert not A.indexer_rotates(fused.indexer) and not A.layer_rotate(fused)  # 0.5.23's fused indexer: no rotation
    plain = F.DeepseekV2AttentionMLA(CFG, fused_indexer=False)  # non-fused, source not 0.5.14's: unsure
    assert not A.indexer_rotates(plain.indexer) and A.check_layer(plain, CFG) == ("partial", None)
    ex = executor()
    route = ex.prepare_layer(a)
    assert (route.kind, route.rotate, route.refusal) == ("full", True, None)
    assert ex.prepare_layer(F.DeepseekV2AttentionMLA(CFG)).rotate is False
    g = PX.seam_graph(CFG, "full", P, PX.ref_quant, rotate=True)
    assert g.name == "glm5_prefix_seam[full,rotated]" and "Hadamard" in g.ops["B1"].doc
    assert PX.seam_graph(CFG, "partial", P, PX.ref_quant, rotate=True).name == "glm5_prefix_seam[partial]"
    assert executor("full").plan("full", rotate=True) is not executor("full").plan("full")


class _Unsure(F14.Indexer):
    """0.5.14's layout, but the rotation is conditional (0.5.23's `_maybe_rotate` switch): not recognised."""

    def _get_q_k_bf16(self, q_lora, x, positions, enable_dual_stream, forward_batch):
        query, key = F14.Indexer._get_q_k_bf16(self, q_lora, x, positions, enable_dual_stream, forward_batch)
        return self._maybe_rotate(query), self._maybe_rotate(key)


class _NoRotation(F14.Indexer):
    def _get_k_bf16(self, x, positions, enable_dual_stream):
        return x  # a prefill path that writes unrotated keys: the cache would mix formats


_Unsure.__name__ = _NoRotation.__name__ = "Indexer"


@pytest.mark.parametrize("cls", [_Unsure, _NoRotation])
def test_0514_detection_falls_back_to_partial_when_unsure(cls):
    a = F14.attn_0514(CFG)
    a.indexer = cls(CFG, a.indexer._iw)
    assert not A.indexer_rotates(a.indexer)
    assert A.check_layer(a, CFG) == ("partial", None)


@pytest.mark.parametrize("change", ["k_norm_eps", "wk_format", "weights_proj", "rope"])
def test_0514_full_requirement_missing_keeps_partial(change):
    a = F14.attn_0514(CFG)
    if change == "k_norm_eps":
        a.indexer.k_norm.variance_epsilon = 1e-5
    elif change == "wk_format":
        a.indexer.wk.weight = a.indexer.wk.weight.float()
    elif change == "weights_proj":
        a.indexer.weights_proj.weight = a.indexer.weights_proj.weight.float()
    else:
        a.indexer.rotary_emb.is_neox_style = True
    assert A.indexer_rotates(a.indexer)
    assert A.check_layer(a, CFG) == ("partial", None)  # SGLang's own indexer, as before the rotation option


def test_0514_weights_are_views_and_bf16_wk_is_requantized():
    a = F14.attn_0514(CFG)
    w, rep, r = A.build_weights(a, CFG, "full")
    assert r is None and rep.repacked == {}
    same = lambda x, y: x.data_ptr() == y.data_ptr()  # noqa: E731
    assert same(w.indexer.wk.weight, a.indexer.wk.weight) and same(w.indexer.wk.scale_inv, a.indexer.wk.weight_scale_inv)
    assert same(w.indexer.weights_proj, a.indexer.weights_proj.weight) and same(w.indexer.wq_b.weight, a.indexer.wq_b.weight)
    assert {"indexer.wk", "indexer.weights_proj", "indexer.wq_b", "indexer.k_norm"} <= set(rep.views)
    b = F14.attn_0514(CFG)
    ck = b.indexer.wk
    b.indexer.wk = F.ReplicatedLinear(b.weights.indexer.wk.dequant().to(torch.bfloat16).contiguous())
    assert A.check_layer(b, CFG) == ("full", None)
    w2, rep2, r2 = A.build_weights(b, CFG, "full")
    assert r2 is None and list(rep2.repacked) == ["indexer.wk (fp8 re-quantized from bf16)"]
    assert_equal("0.5.14 bf16 wk re-quant", w2.indexer.wk.weight, ck.weight)


@pytest.mark.parametrize("mode", ["serial", "full"])
@pytest.mark.parametrize("fused_topk", [True, False])
def test_0514_full_route_reproduces_rotated_reference_prefix(mode, fused_topk):
    a = F14.attn_0514(CFG)
    step, x, fb = F.make_batch(CFG, SEQ, fused_topk=fused_topk)
    ex = executor(mode)
    out = ex(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert len(out) == 9 and out[8] is None and a.indexer.calls == []  # SGLang's indexer never ran
    route = ex.layer_route(a)
    assert route.kind == "full" and route.rotate
    ref, kv, ik = ref_outputs(a, step, route.weights, rotate=True)
    assert_equal("q_lat", out[2], ref.q_lat)
    assert_equal("q_pe", out[0], ref.q_pe)
    assert_equal("index-K cache (rotated)", fb.token_to_kv_pool.get_index_k_with_scale_buffer(1), ik)
    unrot, _, ik_u = ref_outputs(a, step, route.weights)
    assert not torch.equal(ik, ik_u)  # the rotation changed the stored keys
    topk = out[7]
    if fused_topk:
        assert_topk_sets("topk", topk, ref.topk_slots, min_overlap=1.0)
    assert topk.dtype == torch.int32 and topk.shape == (3, CFG.index_topk)
    assert (topk[0, :5] >= 0).all() and (topk[0, 5:] == -1).all()


def test_0514_full_route_matches_sglang_0514_indexer():
    """Shadow check against the 0.5.14 stand-in (rotated bf16 q / k, UE8M0 q scales, fp32 head gate): the same
    rotated cache format (index-K entries within FP8 noise), the same top-k."""
    a = F14.attn_0514(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    recs = []
    stock = PrefixCheck(executor("full"), recs)(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert len(stock) == 9 and len(a.indexer.calls) == 1 and recs[0]["passed"], recs
    r = recs[0]
    assert r["route"] == "full" and r["index_k_other_bytes_untouched"] and r["topk_valid_counts_equal"]
    # the selection boundary moves a little: 0.5.14 quantises q with UE8M0 scales and keeps the head gate fp32
    assert r["topk_overlap"] > 0.98 and r["topk_min_row_overlap"] > 0.95, r
    assert max(r[f"{n}_rel_err"] for n in ("q_pe", "k_pe", "q_nope_out", "k_nope")) == 0.0
    # same FP8 GEMM for the key as 0.5.14; what differs is SGLang's extra bf16 roundings (LayerNorm out, RoPE out)
    assert r["index_k_rel_err"] < 0.02, r["index_k_rel_err"]


def test_0514_unrotated_keys_would_not_match():
    """Why the rotation is needed: our unrotated B1 against 0.5.14's rotated cache entries fails the check."""
    a = F14.attn_0514(CFG)
    ex = executor("full")
    ex.prepare_layer(a)
    ex.layer_route(a).rotate = False  # force the 0.5.23 format on a 0.5.14 layer
    step, x, fb = F.make_batch(CFG, SEQ)
    recs = []
    PrefixCheck(ex, recs)(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert recs[0]["index_k_rel_err"] > 0.5 and not recs[0]["passed"]


def test_0514_install_logs_rotation_and_precompiles_rotated_kernels(caplog):
    caplog.set_level(logging.INFO, "glm5_fastpath")
    seen = []

    class Impl:  # the ops namespace as far as prepare_model uses it (CPU: never runs a kernel here)
        @staticmethod
        def precompile(cfg, device, indexer_rotate=False):
            seen.append((cfg, device.type, indexer_rotate))

    ex = PX.PrefixExecutor(impl=Impl(), mode="full", cfg=CFG)
    attns = [F14.attn_0514(CFG, layer_id=i) for i in range(2)] + [F.DeepseekV2AttentionMLA(CFG, layer_id=2)]
    s = ex.prepare_model(F.fake_model(attns))
    assert s.routes == {"full": [0, 1, 2]} and s.rotated == [0, 1]
    assert "layers 0-1: B1 / D1 Hadamard-rotate" in caplog.text
    assert seen == []  # CPU weights: nothing to compile
    ex2 = PX.PrefixExecutor(impl=Impl(), mode="full", cfg=CFG)
    ex2._precompile_rotated = lambda model: seen.append("called")
    ex2.prepare_model(F.fake_model([F14.attn_0514(CFG, layer_id=0)]))
    ex2.prepare_model(F.fake_model([F.DeepseekV2AttentionMLA(CFG, layer_id=0)]))
    assert seen == ["called"]
    # on a CUDA model: the rotated D1 / B1 variants are compiled before SGLang captures its decode graphs
    seen.clear()
    cuda_route = types.SimpleNamespace(weights=types.SimpleNamespace(
        q_b=types.SimpleNamespace(weight=types.SimpleNamespace(device=torch.device("cuda", 0)))))
    ex._routes = lambda model: [cuda_route]
    ex._precompile_rotated(None)
    assert seen == [(CFG, "cuda", True)]
    ex3 = PX.PrefixExecutor(impl=types.SimpleNamespace(precompile=lambda cfg, device: seen.append("old")), cfg=CFG)
    ex3._routes = ex._routes
    ex3._precompile_rotated(None)  # a precompile without the option is not called (first use compiles)
    assert seen == [(CFG, "cuda", True)]


# ---- fallbacks: logged once, counted ----------------------------------------------------------------------

def test_fallbacks_are_logged_once_and_counted(caplog):
    caplog.set_level(logging.INFO, "glm5_fastpath")
    metrics = FastpathMetrics(CollectorRegistry())
    router = patch.Router(decision_table(), metrics)
    ex = executor(router=router)
    a = F.DeepseekV2AttentionMLA(CFG)
    a.num_local_heads = 1
    step, x, fb = F.make_batch(CFG, SEQ)
    calls = []
    for _ in range(2):
        assert ex(_bound(a, calls), step.positions, x, fb, None) == "stock"
    assert calls == [1, 1] and caplog.text.count("-> stock (attention heads are split") == 1
    val = lambda route, reason: metrics.registry.get_sample_value(  # noqa: E731
        "glm5_fastpath_prefix_layer_total", {"route": route, "reason": reason}) or 0
    assert val("stock", "tp_heads") == 2
    b = F.DeepseekV2AttentionMLA(CFG)
    # per-call refusals
    cases = [((step.positions, x, fb, None, torch.ones(1)), "llama4_scaling"),
             ((step.positions, (x, x), fb, None), "hidden_tuple"),
             ((step.positions[:2], x, fb, None), "shapes"),
             ((torch.zeros(257, dtype=torch.long), torch.zeros(257, CFG.hidden_size, dtype=torch.bfloat16), fb, None),
              "too_many_tokens")]
    for args, reason in cases:
        assert ex(_bound(b, calls), *args) == "stock"
        assert val("stock", reason) == 1, reason
    fb.attn_backend.hisparse_coordinator = object()
    assert ex(_bound(b, calls), step.positions, x, fb, None) == "stock" and val("stock", "kv_pool") == 1
    fb.attn_backend.hisparse_coordinator = None
    fb.attn_backend.token_to_kv_pool = types.SimpleNamespace()  # not a DSATokenToKVPool
    assert ex(_bound(b, calls), step.positions, x, fb, None) == "stock" and val("stock", "kv_pool") == 2
    step2, x2, fb2 = F.make_batch(CFG, SEQ)
    out = ex(b.forward_absorb_prepare, step2.positions, x2, fb2, None)
    assert len(out) == 10 and val("full", "routed") == 1


def test_executor_error_falls_back(caplog, monkeypatch):
    caplog.set_level(logging.INFO, "glm5_fastpath")
    ex = executor()
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    monkeypatch.setattr(ex, "run", lambda *a_: (_ for _ in ()).throw(RuntimeError("boom")))
    calls = []
    assert ex(_bound(a, calls), step.positions, x, fb, None) == "stock" and calls == [1]
    assert "our executor raised RuntimeError: boom" in caplog.text


def decision_table():
    from glm5_fastpath.selection import parse

    return parse({"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "stock"}]})


# ---- install: table selects cmp -> layers prepared, calls routed through the wrapper ----------------------

def test_install_routes_decode_through_the_prefix_executor(monkeypatch, tmp_path, caplog):
    p = tmp_path / "sel.json"
    p.write_text('{"version": 1, "buckets": [{"tokens": 8, "prefix": "cmp", "moe": "stock"}]}')
    monkeypatch.setenv("GLM5_FASTPATH_CONFIG", str(p))
    monkeypatch.setattr(inst, "_precompile", lambda cfg, m, log, table=None: None)
    monkeypatch.setattr(PX, "_default", PX.PrefixExecutor(impl=P, mode="full"))
    caplog.set_level(logging.INFO, "glm5_fastpath")
    attns = [F.DeepseekV2AttentionMLA(CFG, layer_id=i) for i in range(3)]
    attns[2].num_local_heads = 2
    model = F.fake_model(attns)
    model.config = types.SimpleNamespace(to_dict=CFG.to_hf_dict)
    facts = decision.ModelFacts("GlmMoeDsaForCausalLM", gpu_name="H200", capability=(9, 0), quant_method="fp8",
                                weight_block_size=(128, 128))
    rep = inst.install_model(model, facts, metrics=None)
    assert rep.installed and rep.patched["prefix"] == 3
    assert "prefix: layers 0-1 -> full route (mode full)" in caplog.text
    assert "prefix: layers 2 stay on SGLang's path: attention heads are split" in caplog.text
    assert "W_UK relaid out in place" in caplog.text
    step, x, fb = F.make_batch(CFG, SEQ, layer_id=1)
    out = attns[1].forward_absorb_prepare(step.positions, x, fb, None)  # the patch wrapper -> Router -> cmp
    stock = F.stock_prepare(attns[1], step.positions, x, fb, None)
    assert "glm5_fastpath: bucket 8 -> cmp (prefix)" in caplog.text
    assert calc_diff(out[2], stock[2]) < 1e-6 and calc_diff(out[0], stock[0]) < 1e-6
    fb.forward_mode = F.ForwardMode("EXTEND")
    calls = []
    monkeypatch.setattr(patch, "EXECUTORS", {"prefix": {"cmp": lambda *a_, **k: calls.append(1)}, "moe": {}})
    attns[1].forward_absorb_prepare(step.positions, x, fb, None)  # prefill: the original method, not the executor
    assert calls == []


# ---- the shadow check reports failures --------------------------------------------------------------------

def test_prefix_check_flags_a_wrong_output(monkeypatch):
    ex = executor()
    real_run = ex.run

    def bad_run(*args):
        out = list(real_run(*args))
        out[0] = out[0] * 2  # q_pe off
        return tuple(out)

    monkeypatch.setattr(ex, "run", bad_run)
    a = F.DeepseekV2AttentionMLA(CFG)
    step, x, fb = F.make_batch(CFG, SEQ)
    recs = []
    PrefixCheck(ex, recs)(a.forward_absorb_prepare, step.positions, x, fb, None)
    assert recs[0]["passed"] is False and any("q_pe" in f for f in recs[0]["failures"])


def test_index_k_layout_matches_reference_store():
    """The pool view is SGLang's page layout: our store at a slot reads back through the reference loader."""
    pool = F.DSATokenToKVPool(CFG, 4)
    buf = pool.get_index_k_with_scale_buffer(0)
    assert A.check_pool(pool, CFG) is None
    slots = torch.tensor([3, 64 + 7, 191])
    k8 = (torch.randn(3, CFG.index_head_dim) * 20).to(torch.float8_e4m3fn)
    s = torch.rand(3)
    from glm5_fastpath.ref.fp8 import index_k_cache_store

    index_k_cache_store(buf, slots, k8, s)
    # SGLang's layout: page = slot // 64; [64 x D e4m3][64 x fp32], token row = slot % 64
    d = CFG.index_head_dim
    assert torch.equal(buf[1, 7 * d:8 * d], k8[1].view(torch.uint8))
    assert torch.equal(buf[2, 64 * d + 63 * 4: 64 * d + 64 * 4].view(torch.float32), s[2:3])
    k, sc = index_k_cache_load(buf, slots, d)
    assert torch.equal(k.view(torch.uint8), k8.view(torch.uint8)) and torch.equal(sc, s)


def test_mode_per_bucket_from_the_selection_table():
    from types import SimpleNamespace

    from glm5_fastpath import selection
    from glm5_fastpath.integrations.sglang.prefix_executor import PrefixExecutor

    table = selection.parse({"version": 1, "buckets": [
        {"tokens": 16, "prefix": "cmp", "moe": "stock"},
        {"tokens": 64, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream"},
        {"tokens": 256, "prefix": "stock", "moe": "stock"}]})
    ex = PrefixExecutor(router=SimpleNamespace(table=table))
    assert ex.mode_for(8).name == "full" and ex.mode_for(40).name == "multistream"
    assert ex.mode_for(100).name == ex.mode.name  # a stock bucket never reaches the executor: its own mode
    assert PrefixExecutor(mode="serial").mode_for(8).name == "serial"  # no router / table


def test_table_pdl_waits_are_the_early_wait_cubins_the_cmp_buckets_launch():
    from glm5_fastpath.selection import parse

    t = parse({"version": 1, "buckets": [
        {"tokens": 1, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream_pdl_entry"},
        {"tokens": 8, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream_pdl_prologue"},
        {"tokens": 16, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream_pdl_prologue"},
        {"tokens": 32, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream"},
        {"tokens": 64, "prefix": "cmp", "moe": "stock"},  # default mode "full": waits after the prefetch (native)
        {"tokens": 128, "prefix": "stock", "moe": "stock", "cmp_mode": "multistream_pdl_entry"}]})  # not CMP
    assert PX.table_pdl_waits(t) == (None, "entry", "after_prologue")
    assert PX.table_pdl_waits(parse({"version": 1, "buckets": [{"tokens": 1, "prefix": "cmp", "moe": "stock",
                                                                 "cmp_mode": "full"}]})) == (None,)
    assert PX.table_pdl_waits(None) == (None,)


def test_precompile_rotated_builds_the_tables_wait_points(caplog):
    from glm5_fastpath.selection import parse

    seen = []

    class Impl:
        @staticmethod
        def precompile(cfg, device, indexer_rotate=False, pdl_waits=(None,)):
            seen.append((indexer_rotate, pdl_waits))

    router = types.SimpleNamespace(table=parse({"version": 1, "buckets": [
        {"tokens": 1, "prefix": "cmp", "moe": "stock", "cmp_mode": "multistream_pdl_entry"}]}))
    ex = PX.PrefixExecutor(impl=Impl(), mode="full", cfg=CFG, router=router)
    ex._routes = lambda model: [types.SimpleNamespace(weights=types.SimpleNamespace(
        q_b=types.SimpleNamespace(weight=types.SimpleNamespace(device=torch.device("cuda", 0)))))]
    ex._precompile_rotated(None)
    assert seen == [(True, (None, "entry"))]


def test_seam_enqueue_applies_the_modes_launch_context(monkeypatch):
    """The seam's enqueue wraps every op's call in the mode's launch context (priorities, GEMM caps), the mode
    read back from the schedule's name (composite names round-trip through get_mode)."""
    from glm5_fastpath.attn_pre.cmp import executor as cmp_executor

    seen = []

    class _Ctx:
        def __init__(self, mode, op, cuda):
            seen.append((mode.name, mode.grid_caps, op, cuda))

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(cmp_executor, "op_launch_context", _Ctx)
    ops = {"X": types.SimpleNamespace(inputs=("a",), ref=lambda e: {"b": e["a"] + 1}),
           "D0": types.SimpleNamespace(inputs=("b",), ref=lambda e: {"c": e["b"] * 2})}
    launches = tuple(types.SimpleNamespace(op=o, stream=0, waits=(), records=False) for o in ("X", "D0"))
    sched = types.SimpleNamespace(mode="full+pin:D1=0+cap:D0=64", launches=launches, joins=())
    out = PX.enqueue(types.SimpleNamespace(ops=ops), sched, {"a": torch.tensor(1.0)}, [None])
    assert out["c"].item() == 4.0
    assert seen == [("full+pin:D1=0+cap:D0=64", (("D0", 64),), "X", False),
                    ("full+pin:D1=0+cap:D0=64", (("D0", 64),), "D0", False)]


def test_composite_cmp_mode_from_the_selection_table():
    from types import SimpleNamespace

    from glm5_fastpath import selection
    from glm5_fastpath.integrations.sglang.prefix_executor import PrefixExecutor

    table = selection.parse({"version": 1, "buckets": [
        {"tokens": 4, "prefix": "cmp", "moe": "stock", "cmp_mode": "full+pin:D1=0"}]})
    m = PrefixExecutor(router=SimpleNamespace(table=table)).mode_for(3)
    assert m.name == "full+pin:D1=0" and m.pins == (("D1", 0),) and m.wait_point == "after_prefetch"


def test_d2_fp8_weights_route_is_bitwise_the_bf16_one(monkeypatch, caplog):
    """GLM5_FASTPATH_D2_WEIGHTS=fp8 (session 24): W_UK's rows copied from SGLang's block-FP8 kv_b_proj, D2 on them;
    same outputs bit for bit as the bf16 route; a layer without an FP8 kv_b_proj keeps bf16 and says so once."""
    outs = {}
    for form in ("bf16", "fp8"):
        monkeypatch.setenv("GLM5_FASTPATH_D2_WEIGHTS", form)
        a = F.DeepseekV2AttentionMLA(CFG)
        step, x, fb = F.make_batch(CFG, SEQ)
        ex = executor("full")
        outs[form] = ex(a.forward_absorb_prepare, step.positions, x, fb, object())
        route = ex.layer_route(a)
        assert route.d2_weights == form and (route.weights.w_kc_fp8 is not None) == (form == "fp8")
        if form == "fp8":
            assert any("w_kc_fp8" in k for k in route.report.repacked)
            assert ex.plan(route.kind, ex.mode, route.rotate, "fp8").graph.name.endswith(",d2fp8]")
    for i, (o8, o16) in enumerate(zip(outs["fp8"], outs["bf16"])):
        if isinstance(o16, torch.Tensor):
            assert torch.equal(o8, o16), f"output {i}"
    monkeypatch.setenv("GLM5_FASTPATH_D2_WEIGHTS", "fp8")
    a = F.DeepseekV2AttentionMLA(CFG)
    del a.kv_b_proj
    step, x, fb = F.make_batch(CFG, SEQ)
    ex = executor("full")
    with caplog.at_level("WARNING"):
        ex(a.forward_absorb_prepare, step.positions, x, fb, object())
    assert ex.layer_route(a).d2_weights == "bf16"
    assert sum("no FP8 W_UK" in r.getMessage() for r in caplog.records) == 1
