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
