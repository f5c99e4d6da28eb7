"""The MoE route (integrations/sglang/moe_executor.py) on CPU, with SGLang-shaped fake layers: per-layer
checks and refusals, what reaches MegaMoE (SGLang's own expert tensors, no copy; the routed top-k columns;
the routed scaling factor), the separate shared expert, fallbacks and their metric. MegaMoE itself is
replaced by a recorder here (it needs an sm_90 GPU; its numerics: tests/moe, and the H200 runs)."""
import logging
import types

import pytest
import torch
from prometheus_client import CollectorRegistry

from glm5_fastpath.integrations.sglang import moe_executor as ME
from glm5_fastpath.metrics import FastpathMetrics
from glm5_fastpath.moe import megamoe as MM
from glm5_fastpath.selection import parse as parse_table

FP8 = torch.float8_e4m3fn
E, H, I, K = 6, 256, 128, 2


class Experts:
    def __init__(self, e_tot=E + 1, h=H, inter=I, dtype=FP8):
        self.w13_weight = torch.zeros(e_tot, 2 * inter, h).to(dtype)
        self.w2_weight = torch.zeros(e_tot, h, inter).to(dtype)
        self.w13_weight_scale_inv = torch.ones(e_tot, 2 * inter // 128, h // 128)
        self.w2_weight_scale_inv = torch.ones(e_tot, h // 128, inter // 128)


class Gate:
    def __init__(self):
        self.calls = []

    def __call__(self, h, alloc=None):
        self.calls.append(alloc)
        return torch.arange(h.shape[0] * E, dtype=torch.float32).view(h.shape[0], E)


class TopK:
    def __init__(self, fused):
        self.topk_config = types.SimpleNamespace(top_k=K + fused, apply_routed_scaling_factor_on_output=False)
        self.fused = fused

    def __call__(self, h, logits):
        m = h.shape[0]
        ids = torch.tensor([[1, 3] + ([E] * self.fused)] * m, dtype=torch.int32)
        w = torch.tensor([[0.75, 0.25] + ([0.4] * self.fused)] * m, dtype=torch.float32)
        return types.SimpleNamespace(topk_ids=ids, topk_weights=w, router_logits=logits)


class MoE:
    def __init__(self, fused=1, layer_id=3, **kw):
        self.experts, self.gate, self.topk = Experts(E + fused, **kw), Gate(), TopK(fused)
        self.num_fused_shared_experts, self.layer_id, self.routed_scaling_factor = fused, layer_id, 2.5
        self.tp_size = 1
        self.shared_experts = None if fused else (lambda h: torch.full((h.shape[0], H), 100.0, dtype=torch.bfloat16))

    def forward(self, hidden_states, forward_batch=None, should_allreduce_fusion=False, use_reduce_scatter=False,
                gemm_output_zero_allocator=None):
        return ("stock", hidden_states.shape[0])


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake(x8, xs, ids, wts, weights, *, routed_scaling_factor, config):
        seen.append(dict(x8=x8, xs=xs, ids=ids, wts=wts, weights=weights, rsf=routed_scaling_factor, config=config))
        return torch.ones(x8.shape[0], weights.hidden, dtype=torch.bfloat16)

    monkeypatch.setattr(MM, "mega_moe", fake)
    return seen


def executor(table=None, registry=None):
    router = types.SimpleNamespace(table=table, metrics=FastpathMetrics(registry) if registry else None,
                                   once=None)
    return ME.MoEExecutor(router=router, quant=lambda x: MM_quant(x))


def MM_quant(x):
    from glm5_fastpath.ref.fp8 import quant_act_per_token

    return quant_act_per_token(x)


def call(ex, mlp, m=3, **kw):
    h = torch.randn(m, H).to(torch.bfloat16)
    return ex(mlp.forward, h, None, **kw), h


def test_fused_shared_expert_route_uses_sglang_tensors_in_place(calls):
    mlp = MoE(fused=1)
    r = ME.layer_route(mlp)
    assert r.refusal is None and (r.topk, r.fused_shared, r.rsf) == (K, 1, 2.5)
    assert r.weights.w13.data_ptr() == mlp.experts.w13_weight.data_ptr()  # no copy of the experts
    assert r.weights.w2.data_ptr() == mlp.experts.w2_weight.data_ptr()
    assert (r.weights.num_experts, r.weights.num_shared) == (E, 1)
    ex = executor(parse_table({"version": 1, "buckets": [{"tokens": 4, "prefix": "stock", "moe": "megamoe:bn8"}]}))
    out, h = call(ex, mlp, gemm_output_zero_allocator="alloc")
    assert out.shape == (3, H) and out.dtype == torch.bfloat16
    c = calls[-1]
    assert c["ids"].tolist() == [[1, 3]] * 3 and c["ids"].is_contiguous()  # the fused shared column is dropped
    assert c["wts"].tolist() == [[0.75, 0.25]] * 3 and c["wts"].dtype == torch.float32
    assert c["rsf"] == 2.5 and c["config"].block_n == 8
    assert c["x8"].dtype == FP8 and tuple(c["xs"].shape) == (3, H // 128)
    assert mlp.gate.calls == ["alloc"]  # SGLang's gate got the allocator, as in forward_normal


def test_unfused_shared_expert_is_added(calls):
    mlp = MoE(fused=0)
    ex = executor()
    out, _ = call(ex, mlp, m=2)
    assert calls[-1]["weights"].num_shared == 0 and calls[-1]["ids"].shape == (2, K)
    assert torch.equal(out, torch.full((2, H), 101.0, dtype=torch.bfloat16))  # MegaMoE (1) + SGLang's shared MLP (100)


def test_default_config_follows_the_bucket(calls):
    ex = executor(parse_table({"version": 1, "buckets": [{"tokens": 64, "prefix": "stock", "moe": "megamoe"}]}))
    call(ex, MoE(), m=5)
    want = MM.default_config(64, E, K, 1, inter=I)
    assert calls[-1]["config"] == want  # the bucket's size (the captured graph's), not the call's 5 tokens


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: setattr(m.experts, "w13_weight", m.experts.w13_weight.to(torch.float16)), "weight_dtype"),
    (lambda m: setattr(m.experts, "w13_weight_scale_inv", torch.ones(7, 3, 2)), "weight_layout"),
    (lambda m: setattr(m.experts, "w2_weight_scale_inv", _ue8m0(m.experts.w2_weight_scale_inv)), "ue8m0_scales"),
    (lambda m: setattr(m, "num_fused_shared_experts", 2), "shared_layout"),
    (lambda m: setattr(m.topk.topk_config, "apply_routed_scaling_factor_on_output", True), "scaled_topk"),
    (lambda m: setattr(m, "tp_size", 8), "expert_parallel"),
    (lambda m: setattr(m, "_enable_a2a_moe", True), "expert_parallel"),
    (lambda m: setattr(m, "experts", object()), "no_experts"),
    (lambda m: setattr(m.experts, "w13_weight", m.experts.w13_weight.transpose(1, 2).contiguous().transpose(1, 2)),
     "weight_layout"),
])
def test_layer_refusals_fall_back_and_count(mutate, reason, calls, caplog):
    mlp = MoE()
    mutate(mlp)
    r = ME.layer_route(mlp)
    assert r.refusal == reason and reason in ME.REFUSALS
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    for _ in range(2):
        out, _ = call(ex, mlp)
        assert out == ("stock", 3)
    assert not calls
    assert caplog.text.count(f"MoE layer 3 -> stock ({ME.REFUSALS[reason]}") == 1
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "stock", "reason": reason}) == 2


def _ue8m0(t):
    t = t.clone()
    t.format_ue8m0 = True
    return t


def test_small_dims_refused():
    assert ME.layer_route(MoE(h=384)).refusal in ("dims", "weight_layout")


def test_bad_topk_output_and_errors_fall_back(calls, monkeypatch, caplog):
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = MoE()
    mlp.topk = lambda h, logits: types.SimpleNamespace(hidden_states=h)  # e.g. a BYPASSED-format output
    assert call(ex, mlp)[0] == ("stock", 3)
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "stock", "reason": "topk_format"}) == 1

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(MM, "mega_moe", boom)
    mlp2 = MoE()
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert call(ex, mlp2)[0] == ("stock", 3)
    assert "our executor raised RuntimeError: kaput" in caplog.text
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "stock", "reason": "error"}) == 1


def test_routed_calls_are_counted(calls):
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = MoE()
    call(ex, mlp)
    call(ex, mlp, m=1)
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "routed"}) == 2


def test_prepare_model_logs_routes_and_precompiles(monkeypatch, caplog):
    pre = []
    monkeypatch.setattr(MM, "precompile", lambda w, topk, max_tokens, configs: pre.append((topk, max_tokens,
                                                                                              sorted(c.name for c in configs))))
    layers = [types.SimpleNamespace(mlp=types.SimpleNamespace()), types.SimpleNamespace(mlp=MoE(layer_id=1)),
              types.SimpleNamespace(mlp=MoE(layer_id=2, dtype=torch.float16))]
    model = types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))
    caplog.set_level(logging.INFO, "glm5_fastpath")
    ex = executor(parse_table({"version": 1, "buckets": [{"tokens": 1, "prefix": "stock", "moe": "megamoe"},
                                                         {"tokens": 32, "prefix": "stock", "moe": "megamoe"}]}))
    s = ex.prepare_model(model, [1, 32])
    assert s.routed == [1] and s.refused == {"weight_dtype": [2]}
    assert pre == [(K, 32, sorted({MM.default_config(1, E, K, 1, inter=I).name, MM.default_config(32, E, K, 1, inter=I).name}))]
    assert "MoE: layers 1 -> MegaMoE" in caplog.text and "MoE: layers 2 stay on SGLang's path" in caplog.text


def test_config_names_round_trip():
    for bn in MM.BLOCK_NS:
        c = MM.default_config(bn, 256, 8)
        assert MM.MegaMoEConfig.from_name(c.name) == c
    assert MM.MegaMoEConfig.from_name("bn16").stages == MM.max_stages(16)
    with pytest.raises(MM.MegaMoEInputError, match="bn<N>"):
        MM.MegaMoEConfig.from_name("m8")
    with pytest.raises(MM.MegaMoEInputError, match="block_n=12"):
        MM.MegaMoEConfig.from_name("bn12")


def test_replaced_expert_tensors_are_rebound(calls):
    """Install may run before SGLang's process_weights_after_loading; if that replaces the expert tensors,
    the next call re-binds MegaMoE to the new ones (views, no copy)."""
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = MoE()
    call(ex, mlp)
    first = calls[-1]["weights"].w13.data_ptr()
    mlp.experts.w13_weight = mlp.experts.w13_weight.clone()
    call(ex, mlp)
    assert calls[-1]["weights"].w13.data_ptr() == mlp.experts.w13_weight.data_ptr() != first
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "rebound"}) == 1


def test_scales_requantized_after_install_are_refused(calls):
    """Scales flagged UE8M0 after install (SGLang's DeepGEMM requant) must not reach MegaMoE as fp32 scales."""
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = MoE()
    call(ex, mlp)
    n = len(calls)
    mlp.experts.w13_weight_scale_inv.format_ue8m0 = True
    assert call(ex, mlp)[0] == ("stock", 3) and len(calls) == n
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "stock", "reason": "ue8m0_scales"}) == 1


# ---- our fused router in place of SGLang's gate + top-k ---------------------------------------------------

RE = 8  # routed experts of the router tests (ops.moe_route takes a multiple of 4 up to 32, or of 32)


class NoauxGate(Gate):
    def __init__(self, e=RE, h=H):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = (torch.randn(e, h, generator=g) * 0.05).to(torch.bfloat16)
        self.e_score_correction_bias = torch.randn(e, generator=g) * 0.01


def router_moe(fused=1, e=RE, **cfg):
    """A GLM-5-like layer: noaux_tc top-k (grouped with one group), fp32 bias, bf16 gate."""
    mlp = MoE(fused=fused)
    mlp.experts = Experts(e + fused)
    mlp.gate = NoauxGate(e)
    c = dict(top_k=K + fused, apply_routed_scaling_factor_on_output=False, use_grouped_topk=True,
             num_expert_group=1, topk_group=1, renormalize=True, custom_routing_function=None, scoring_func="softmax")
    c.update(cfg)
    mlp.topk.topk_config = types.SimpleNamespace(**c)
    return mlp


@pytest.fixture
def routes(monkeypatch):
    """ops.moe_route replaced by the CPU reference (same signature); records its calls."""
    from glm5_fastpath.ops import moe_router as R
    from glm5_fastpath.ref import moe as ref_moe

    seen = []

    def fake(h, gate, bias, cfg, *, pdl=True):
        c = types.SimpleNamespace(n_routed_experts=gate.shape[0], hidden_size=cfg.hidden_size,
                                  num_experts_per_tok=cfg.num_experts_per_tok, norm_topk_prob=True,
                                  n_group=1, topk_group=1, routed_scaling_factor=cfg.routed_scaling_factor)
        out = ref_moe.route(h, gate, bias, c)
        seen.append(dict(h=h, gate=gate, bias=bias, cfg=cfg, out=out))
        return out

    monkeypatch.setattr(R, "moe_route", fake)
    monkeypatch.delenv(ME.ROUTER_ENV, raising=False)
    return seen


def test_noaux_layer_uses_our_router(calls, routes):
    mlp = router_moe()
    r = ME.layer_route(mlp)
    assert r.refusal is None and r.router == ME.RouterCfg(H, K, 2.5) and r.router_note == ""
    out, h = call(executor(), mlp, m=5)
    assert out.shape == (5, H)
    assert mlp.gate.calls == []  # SGLang's gate (and top-k) never ran
    rc = routes[-1]
    assert rc["gate"] is mlp.gate.weight and rc["bias"] is mlp.gate.e_score_correction_bias and rc["h"] is h
    ids, w, _ = rc["out"]
    c = calls[-1]
    assert torch.equal(c["ids"], ids) and torch.equal(c["wts"], w) and c["ids"].shape == (5, K)
    assert c["rsf"] == 2.5  # unscaled weights; MegaMoE applies the factor in its combine
    assert torch.allclose(w.sum(1), torch.ones(5))


def test_gate_tensors_are_read_per_call(calls, routes):
    """SGLang updates router weights in place or by re-binding the parameter: each call reads the current one."""
    mlp = router_moe()
    ex = executor()
    call(ex, mlp)
    mlp.gate.weight = mlp.gate.weight.clone()
    call(ex, mlp)
    assert routes[-1]["gate"] is mlp.gate.weight


@pytest.mark.parametrize("mutate, note", [
    (lambda m: setattr(m.topk.topk_config, "num_expert_group", 4) or setattr(m.topk.topk_config, "topk_group", 2),
     "grouped top-k (2 of 4 groups)"),
    (lambda m: setattr(m.topk.topk_config, "renormalize", False), "not renormalised"),
    (lambda m: setattr(m.topk.topk_config, "custom_routing_function", len), "custom routing function"),
    (lambda m: setattr(m.gate, "e_score_correction_bias", None), "no fp32 e_score_correction_bias"),
    (lambda m: setattr(m.gate, "weight", m.gate.weight.float()), "not a contiguous bf16"),
    (lambda m: setattr(m.topk.topk_config, "use_grouped_topk", False), "scoring softmax"),
    (lambda m: setattr(m, "topk", type("HashTopK", (), {"topk_config": m.topk.topk_config})()), "HashTopK"),
])
def test_other_routers_keep_sglangs_gate_and_topk(mutate, note, calls, routes):
    mlp = router_moe()
    mutate(mlp)
    r = ME.layer_route(mlp)
    assert r.refusal is None and r.router is None and note in r.router_note
    if type(mlp.topk).__name__ == "TopK":
        call(executor(), mlp)
        assert not routes and len(mlp.gate.calls) == 1 and calls[-1]["ids"].tolist() == [[1, 3]] * 3


def test_ungrouped_sigmoid_topk_uses_our_router(routes):
    assert ME.layer_route(router_moe(use_grouped_topk=False, scoring_func="sigmoid")).router is not None


def test_router_dims_the_kernel_does_not_take_stay_on_sglang(routes):
    r = ME.layer_route(router_moe(e=6))  # 6 experts: not a multiple of 4
    assert r.router is None and "routed experts are not supported" in r.router_note


def test_router_kill_switch(monkeypatch, routes):
    monkeypatch.setenv(ME.ROUTER_ENV, "sglang")
    r = ME.layer_route(router_moe())
    assert r.router is None and r.router_note == f"{ME.ROUTER_ENV}=sglang"


def test_big_or_odd_calls_use_sglangs_router(calls, routes):
    mlp = router_moe()
    ex = executor()
    call(ex, mlp, m=ME.ROUTER_MAX_TOKENS + 1)
    assert not routes and len(mlp.gate.calls) == 1
    h = torch.randn(4, 2 * H).to(torch.bfloat16)[:, :H]  # not contiguous
    ex(mlp.forward, h, None)
    assert not routes and len(mlp.gate.calls) == 2
    ex.router_failed = "no kernel"
    call(ex, mlp)
    assert not routes and len(mlp.gate.calls) == 3


def test_routed_experts_capturer_gets_ids_with_the_shared_column(calls, routes, monkeypatch):
    got = []
    cap = types.SimpleNamespace(capture=lambda layer_id, topk_indices: got.append((layer_id, topk_indices)))
    monkeypatch.setattr(ME, "_capturer_getter", lambda: cap)
    mlp = router_moe(fused=1)
    call(executor(), mlp, m=2)
    ids = routes[-1]["out"][0]
    (lid, t), = got
    assert lid == 3 and t.shape == (2, K + 1) and torch.equal(t[:, :K], ids) and t[:, K].tolist() == [RE, RE]
    monkeypatch.setattr(ME, "_capturer_getter", lambda: None)  # no capturer active: nothing captured
    call(executor(), mlp, m=2)
    assert len(got) == 1


def test_prepare_model_precompiles_and_logs_the_router(monkeypatch, caplog, routes):
    from glm5_fastpath.ops import moe_router as R

    monkeypatch.setattr(MM, "precompile", lambda *a, **k: None)
    pre = []
    monkeypatch.setattr(R, "precompile", lambda dev, shapes: pre.append(shapes))
    model = types.SimpleNamespace(model=types.SimpleNamespace(layers=[types.SimpleNamespace(mlp=router_moe())]))
    caplog.set_level(logging.INFO, "glm5_fastpath")
    ex = executor()
    ex.prepare_model(model, [1, 8])
    assert pre == [((H, RE, K),)] and "MoE: router ours (ops.moe_route" in caplog.text and not ex.router_failed

    def boom(dev, shapes):
        raise RuntimeError("no nvcc")

    monkeypatch.setattr(R, "precompile", boom)
    ex2 = executor()
    ex2.prepare_model(model, [1])
    assert ex2.router_failed == "RuntimeError: no nvcc" and "our router unavailable" in caplog.text


@pytest.mark.parametrize("sglang_helper", [True, False])
def test_cuda_graph_padding_rows_get_no_experts(calls, routes, monkeypatch, sglang_helper):
    """A batch replayed in a larger captured graph: rows >= forward_batch.num_token_non_padded get id -1 (MegaMoE
    gives them no work), as SGLang's select_experts masks them; with SGLang's helper or the torch fallback."""
    if not sglang_helper:
        monkeypatch.setattr(ME, "_mask_fn", None)
        import builtins

        real_import = builtins.__import__

        def no_topk(name, *a, **k):
            if name == "sglang.srt.layers.moe.topk":
                raise ImportError("no sglang here")
            return real_import(name, *a, **k)

        monkeypatch.setattr(builtins, "__import__", no_topk)
    monkeypatch.setattr(ME, "_count_live", True)  # SGLang refreshes the count on replay (EP / DP gather)
    mlp = router_moe()
    fb = types.SimpleNamespace(num_token_non_padded=torch.tensor(3, dtype=torch.int32))
    h = torch.randn(5, H).to(torch.bfloat16)
    executor()(mlp.forward, h, fb)
    ids = calls[-1]["ids"]
    assert (ids[3:] == -1).all() and (ids[:3] >= 0).all()
    executor()(mlp.forward, h[:1], fb)  # a single row is never padding: no mask
    assert (calls[-1]["ids"] >= 0).all()
    executor()(mlp.forward, h, forward_batch=None)  # no forward batch (eager, tests): nothing masked
    assert (calls[-1]["ids"] >= 0).all()


def test_stale_padding_count_masks_nothing(calls, routes, monkeypatch):
    """TP1 (SGLang's enable_num_token_non_padded() is False): the graph runner never refreshes the count on
    replay, so it holds the last captured size (1). Masking by it kept only row 0's experts (the session-5
    engine run decoded faster than its bytes floor); the route must leave every row's experts alone."""
    monkeypatch.setattr(ME, "_count_live", False)
    mlp = router_moe()
    stale = types.SimpleNamespace(num_token_non_padded=torch.tensor(1, dtype=torch.int32))
    h = torch.randn(8, H).to(torch.bfloat16)
    executor()(mlp.forward, h, stale)
    assert (calls[-1]["ids"] >= 0).all()


def test_padding_count_is_live_follows_sglang(monkeypatch):
    """The switch is SGLang's own condition, cached once known; a helper that raises (no parallel state yet)
    reads as 'not live' and is asked again next time."""
    import sys

    fbi = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    answers = iter([RuntimeError("no parallel state"), True])

    def enable_num_token_non_padded():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    fbi.enable_num_token_non_padded = enable_num_token_non_padded
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.forward_batch_info", fbi)
    monkeypatch.setattr(ME, "_count_live", None)
    assert ME.padding_count_is_live() is False
    assert ME.padding_count_is_live() is True
    assert ME.padding_count_is_live() is True  # cached: the iterator is not asked a third time


def test_router_quant_switch_takes_megamoe_input_from_the_router(calls, routes, monkeypatch):
    """GLM5_FASTPATH_ROUTER_QUANT=1: one router call gives the routing AND MegaMoE's FP8 input; the executor's own
    quant does not run. Off (default): moe_route, then the executor's quant."""
    from glm5_fastpath.ops import moe_router as R
    from glm5_fastpath.ref.fp8 import quant_act_per_token

    got = []

    def fake_quant_route(h, gate, bias, cfg, *, pdl=True):
        ids, w, lo = R.moe_route(h, gate, bias, cfg)  # the routes fixture's reference router
        x8, xs = quant_act_per_token(h)
        got.append((x8, xs))
        return ids, w, lo, x8, xs
    monkeypatch.setattr(R, "moe_route_quant", fake_quant_route)
    quant_calls = []
    ex = ME.MoEExecutor(router=types.SimpleNamespace(table=None, metrics=None, once=None),
                        quant=lambda x: quant_calls.append(x) or quant_act_per_token(x))
    mlp = router_moe()
    monkeypatch.delenv(ME.ENV_ROUTER_QUANT, raising=False)
    call(ex, mlp)
    assert not got and len(quant_calls) == 1
    monkeypatch.setenv(ME.ENV_ROUTER_QUANT, "1")
    call(ex, mlp)
    assert len(got) == 1 and len(quant_calls) == 1  # no second quant
    assert calls[-1]["x8"] is got[0][0] and calls[-1]["xs"] is got[0][1]


# ---- the fused router + plan (moe/routed.py) ----------------------------------------------------------------

@pytest.fixture
def fused(monkeypatch):
    """The fused op replaced by a recorder (its kernels need an sm_90 GPU: tests/moe/test_routed.py); the CPU
    tensors of these tests count as on the GPU for the executor's choice."""
    from glm5_fastpath.moe import routed

    seen = []

    def fake(h, gate, bias, router_cfg, weights, *, config=None, decode=None, pdl=True):
        m = h.shape[0]
        seen.append(dict(h=h, gate=gate, bias=bias, cfg=router_cfg, weights=weights, config=config))
        ids = torch.tensor([[0, 5]] * m, dtype=torch.int32)
        return torch.full((m, weights.hidden), 2.0, dtype=torch.bfloat16), ids, torch.full((m, K), 0.5)

    monkeypatch.setattr(routed, "routed_mega_moe", fake)
    monkeypatch.setattr(ME, "_on_gpu", lambda t: True)
    monkeypatch.setenv(ME.ENV_FUSED_ROUTER, "1")  # opt-in
    return seen


def test_fused_router_and_plan_replace_the_separate_kernels(calls, routes, fused, monkeypatch):
    got = []
    cap = types.SimpleNamespace(capture=lambda layer_id, topk_indices: got.append(topk_indices))
    monkeypatch.setattr(ME, "_capturer_getter", lambda: cap)
    mlp = router_moe(fused=1)
    ex = executor(parse_table({"version": 1, "buckets": [{"tokens": 4, "prefix": "stock", "moe": "megamoe:bn8"}]}))
    out, h = call(ex, mlp, m=3)
    f, = fused
    assert not routes and not calls  # neither the separate router nor the separate MegaMoE launch ran
    assert f["h"] is h and f["gate"] is mlp.gate.weight and f["bias"] is mlp.gate.e_score_correction_bias
    assert f["cfg"] == ME.RouterCfg(H, K, 2.5) and f["config"].block_n == 8 and f["weights"].num_shared == 1
    assert torch.equal(out, torch.full((3, H), 2.0, dtype=torch.bfloat16))
    assert ex.last_routing[0].tolist() == [[0, 5]] * 3
    assert got[0][:, K].tolist() == [RE] * 3  # the capturer still gets the ids with the shared column


def test_fused_router_falls_back_to_separate_kernels(calls, routes, fused, monkeypatch):
    mlp = router_moe(fused=1)
    monkeypatch.delenv(ME.ENV_FUSED_ROUTER)  # off by default (measured slower than the separate kernels)
    call(executor(), mlp, m=3)
    assert not fused and len(routes) == 1 and len(calls) == 1
    monkeypatch.setenv(ME.ENV_FUSED_ROUTER, "0")  # switched off
    call(executor(), mlp, m=3)
    assert not fused and len(routes) == 2 and len(calls) == 2
    monkeypatch.setenv(ME.ENV_FUSED_ROUTER, "1")
    call(executor(), mlp, m=40)  # the split-K router's last CTA sees one 32-token tile only
    assert not fused and len(routes) == 3
    monkeypatch.setattr(ME, "_count_live", True)  # padded rows must be masked between router and plan
    fb = types.SimpleNamespace(num_token_non_padded=torch.tensor(2, dtype=torch.int32))
    executor()(mlp.forward, torch.randn(3, H).to(torch.bfloat16), fb)
    assert not fused and len(routes) == 4 and (calls[-1]["ids"][2:] == -1).all()
    ex = executor()
    ex.fused_failed = "no kernel"  # precompile failed: separate kernels
    call(ex, mlp, m=3)
    assert not fused and len(routes) == 5
    call(executor(), mlp, m=3)  # and on again
    assert len(fused) == 1


def test_unfused_shared_mlp_is_added_after_the_fused_op(calls, routes, fused):
    mlp = router_moe(fused=0)
    out, _ = call(executor(), mlp, m=2)
    assert torch.equal(out, torch.full((2, H), 102.0, dtype=torch.bfloat16))


def test_fused_and_separate_calls_are_counted_apart(calls, routes, fused, monkeypatch, caplog):
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = router_moe(fused=1)
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        call(ex, mlp, m=3)
        call(ex, mlp, m=2)
    monkeypatch.setenv(ME.ENV_FUSED_ROUTER, "0")
    call(ex, mlp, m=3)
    val = lambda reason: reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": reason})
    assert (val("fused"), val("routed")) == (2, 1) and len(fused) == 2 and len(routes) == 1
    lines = [r.getMessage() for r in caplog.records if "fused router + plan, then MegaMoE" in r.getMessage()]
    assert len(lines) == 1 and " -> " in lines[0]  # once; bench offline's paths_from_log keeps ' -> ' lines
    assert not ex.last_fused  # the latest call took the separate kernels


# ---- the prefill route (decision "prefill_moe"): prefill / extend passes on MegaMoE -------------------------

def _fb(mode="EXTEND"):
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(name=mode), num_token_non_padded=None)


def test_prefill_pass_runs_megamoe_counted_as_prefill(calls):
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = MoE()
    h = torch.randn(300, H).to(torch.bfloat16)
    out = ex(mlp.forward, h, _fb("EXTEND"))
    assert out.shape == (300, H) and len(calls) == 1 and calls[-1]["ids"].shape == (300, K)
    # a prefill pass above the largest bucket takes MegaMoE's default config for its own size
    assert calls[-1]["config"] == MM.default_config(300, E, K, 1, inter=I)
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "prefill"}) == 1
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "routed"}) is None
    ex(mlp.forward, torch.randn(2, H).to(torch.bfloat16), _fb("DECODE"))
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "routed"}) == 1


def test_prefill_pass_above_one_launch_is_split_in_order(calls, monkeypatch):
    ex = executor()
    ex.prefill_chunk = 64

    def fake(x8, xs, ids, wts, weights, *, routed_scaling_factor, config):
        calls.append(x8.shape[0])
        return x8.float()[:, :weights.hidden].to(torch.bfloat16)  # row i of the output depends on row i only

    monkeypatch.setattr(MM, "mega_moe", fake)
    tags = []
    monkeypatch.setattr(ME.MoEExecutor, "run", lambda self, *a, _run=ME.MoEExecutor.run, **k: (
        tags.append(MM._ws_tag.get()), _run(self, *a, **k))[1])
    mlp = MoE()
    h = torch.randn(150, H).to(torch.bfloat16)
    out = ex(mlp.forward, h, _fb("EXTEND"))
    assert calls == [64, 64, 22] and out.shape == (150, H)
    assert tags == [ME.PREFILL_WORKSPACE] * 3 and MM._ws_tag.get() == ""  # prefill launches: their own workspace
    whole = MM_quant(h)[0].float().to(torch.bfloat16)  # the per-row quant of the whole pass, row for row
    assert torch.equal(out, whole)


def test_prefill_chunk_and_precompile_cover_the_prefill_sizes(monkeypatch):
    assert ME.prefill_chunk(0) == 0 and ME.prefill_chunk(1000) == 1000 and ME.prefill_chunk(16384) == 4096
    assert ME.MEGAMOE_MAX_TOKENS == MM.MAX_TOKENS
    pre = []
    monkeypatch.setattr(MM, "precompile", lambda w, topk, max_tokens, configs: pre.append((
        MM._ws_tag.get(), max_tokens, {c.name for c in configs})))
    model = types.SimpleNamespace(model=types.SimpleNamespace(layers=[types.SimpleNamespace(mlp=MoE(layer_id=1))]))
    ex = executor()
    ex.prepare_model(model, [1, 64], prefill_max=16384)
    # decode: its buckets in the untagged workspace (as without the route); prefill: its own 4096-token workspace
    (tag0, mx0, names0), (tag1, mx1, names1) = pre
    assert (tag0, mx0, names0) == ("", 64, {MM.default_config(m, E, K, 1, inter=I).name for m in (1, 64)})
    want = {MM.default_config(m, E, K, 1, inter=I).name for m in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)}
    assert (tag1, mx1, names1) == (ME.PREFILL_WORKSPACE, 4096, want) and ex.prefill_chunk == 4096
    pre.clear()
    ex = executor()
    ex.prepare_model(model, [1, 64])  # route off: the decode buckets only
    assert [p[:2] for p in pre] == [("", 64)] and ex.prefill_chunk == 0


# ---- the shared expert during the routing (moe/overlap.py) ---------------------------------------------------

@pytest.fixture
def overlapped(monkeypatch):
    """The overlap op replaced by a recorder (its kernels need an sm_90 GPU: tests/moe/test_overlap.py)."""
    from glm5_fastpath.moe import overlap as OV

    seen = []

    def fake(h, x8, xs, gate, bias, router_cfg, weights, *, config=None, shared_grid=None):
        m = h.shape[0]
        seen.append(dict(h=h, x8=x8, xs=xs, gate=gate, bias=bias, cfg=router_cfg, weights=weights, config=config))
        return (torch.full((m, weights.hidden), 3.0, dtype=torch.bfloat16), torch.tensor([[1, 6]] * m, dtype=torch.int32),
                torch.full((m, K), 0.5))

    monkeypatch.setattr(OV, "routed_mega_moe_overlap", fake)
    monkeypatch.setattr(ME, "_on_gpu", lambda t: True)
    monkeypatch.setenv(ME.ENV_OVERLAP, "1")  # opt-in
    return seen


def test_overlap_replaces_the_separate_kernels(calls, routes, overlapped, monkeypatch):
    got = []
    cap = types.SimpleNamespace(capture=lambda layer_id, topk_indices: got.append(topk_indices))
    monkeypatch.setattr(ME, "_capturer_getter", lambda: cap)
    reg = CollectorRegistry()
    ex = executor(registry=reg)
    mlp = router_moe(fused=1, e=32)
    out, h = call(ex, mlp, m=3)
    o, = overlapped
    assert not routes and not calls  # neither the separate router nor the one-launch MegaMoE ran
    assert o["h"] is h and o["gate"] is mlp.gate.weight and o["bias"] is mlp.gate.e_score_correction_bias
    assert o["x8"].shape == (3, H) and o["xs"].shape == (3, H // 128)  # the quant is taken before the launch
    assert o["cfg"] == ME.RouterCfg(H, K, 2.5) and o["weights"].num_shared == 1
    assert torch.equal(out, torch.full((3, H), 3.0, dtype=torch.bfloat16)) and ex.last_overlap
    assert ex.last_routing[0].tolist() == [[1, 6]] * 3
    assert got[0][:, K].tolist() == [32] * 3  # the capturer gets the ids with the shared column
    assert reg.get_sample_value("glm5_fastpath_moe_layer_total", {"route": "megamoe", "reason": "overlap"}) == 1


def test_overlap_is_opt_in_and_falls_back(calls, routes, overlapped, monkeypatch):
    mlp = router_moe(fused=1, e=32)
    monkeypatch.delenv(ME.ENV_OVERLAP)  # off by default
    call(executor(), mlp, m=3)
    assert not overlapped and len(routes) == 1 and len(calls) == 1
    monkeypatch.setenv(ME.ENV_OVERLAP, "1")
    call(executor(), mlp, m=40)  # above the one-row decode router
    assert not overlapped and len(routes) == 2
    call(executor(), router_moe(fused=0, e=32), m=3)  # no fused shared expert: nothing to overlap
    assert not overlapped and len(routes) == 3
    monkeypatch.setattr(ME, "_count_live", True)  # padded rows must be masked between router and plan
    fb = types.SimpleNamespace(num_token_non_padded=torch.tensor(2, dtype=torch.int32))
    executor()(mlp.forward, torch.randn(3, H).to(torch.bfloat16), fb)
    assert not overlapped and len(routes) == 4
    monkeypatch.setattr(ME, "_count_live", False)
    ex = executor()
    ex.overlap_failed = "no kernel"  # precompile failed: separate kernels
    call(ex, mlp, m=3)
    assert not overlapped and len(routes) == 5
    call(executor(), mlp, m=3)
    assert len(overlapped) == 1


def test_overlap_that_raises_switches_to_the_separate_kernels(calls, routes, monkeypatch, caplog):
    from glm5_fastpath.moe import overlap as OV

    def boom(*a, **k):
        raise OV.OverlapInputError("glm5_fastpath.routed_mega_moe_overlap: shared_grid=999 must be in [1, 132]")

    monkeypatch.setattr(OV, "routed_mega_moe_overlap", boom)
    monkeypatch.setattr(ME, "_on_gpu", lambda t: True)
    monkeypatch.setenv(ME.ENV_OVERLAP, "1")
    ex = executor()
    mlp = router_moe(fused=1, e=32)
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        out, _ = call(ex, mlp, m=3)
    assert out.shape == (3, H) and len(routes) == 1 and len(calls) == 1 and "shared_grid=999" in ex.overlap_failed
    assert any("shared-expert overlap raised" in r.getMessage() for r in caplog.records)
    call(ex, mlp, m=3)  # stays off
    assert len(routes) == 2
