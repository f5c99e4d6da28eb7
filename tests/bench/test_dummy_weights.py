"""bench/dummy_weights on CPU: SGLang's dummy FP8 init leaves layers with ~1e-5 gain; realistic_dummy gives them
unit gain and O(1) norms, deterministically, and the model subclass applies it before SGLang's post-load."""
import math
import sys
import types

import pytest
import torch

from glm5_fastpath.bench import dummy_weights as D

FP8 = torch.float8_e4m3fn


def sglang_dummy(shape, seed=1234, low=-1e-3, high=1e-3):
    """SGLang's initialize_dummy_weights for an FP8 tensor: fp16 uniform, then cast (weight_utils.py)."""
    g = torch.Generator().manual_seed(seed)
    return torch.empty(shape, dtype=torch.float16).uniform_(low, high, generator=g).to(FP8)


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((n,), 1e-3))


class Fp8Linear(torch.nn.Module):
    def __init__(self, n, k, seed):
        super().__init__()
        self.weight = torch.nn.Parameter(sglang_dummy((n, k), seed), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(torch.full((-(-n // 128), -(-k // 128)), 7e-4), requires_grad=False)


class Experts(torch.nn.Module):
    def __init__(self, e, n, k):
        super().__init__()
        self.w13_weight = torch.nn.Parameter(sglang_dummy((e, 2 * n, k), 5), requires_grad=False)
        self.w13_weight_scale_inv = torch.nn.Parameter(torch.full((e, 2 * n // 128, k // 128), -3e-4), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(sglang_dummy((e, k, n), 6), requires_grad=False)
        self.w2_weight_scale_inv = torch.nn.Parameter(torch.full((e, k // 128, n // 128), 2e-4), requires_grad=False)


def model():
    m = torch.nn.Module()
    m.input_layernorm = RMSNorm(512)
    m.k_norm = torch.nn.LayerNorm(128)
    torch.nn.init.constant_(m.k_norm.weight, 1e-3)
    torch.nn.init.constant_(m.k_norm.bias, 0.5)
    m.q_a_proj = Fp8Linear(384, 1536, 1)
    m.o_proj = Fp8Linear(256, 4096, 2)
    m.experts = Experts(3, 256, 512)
    m.zero = Fp8Linear(128, 128, 3)
    with torch.no_grad():
        m.zero.weight.zero_()
    m.orphan = torch.nn.Module()
    m.orphan.weight_scale_inv = torch.nn.Parameter(torch.ones(2))  # no FP8 weight beside it
    m.lm_head = torch.nn.Module()
    m.lm_head.weight = torch.nn.Parameter(((torch.rand(1000, 512) * 2 - 1) * 1e-3).to(torch.bfloat16),
                                          requires_grad=False)  # SGLang's dummy init
    return m


def dequant(w8, s):
    """Block-FP8 dequantisation in float64 (128 x 128 blocks; 3-D for experts)."""
    w = w8.double()
    rows, cols = w.shape[-2], w.shape[-1]
    full = s.double().repeat_interleave(128, -2)[..., :rows, :].repeat_interleave(128, -1)[..., :cols]
    return w * full


def gain(w8, s, trials=64):
    x = torch.randn(trials, w8.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return float((x @ dequant(w8, s).transpose(-1, -2)).std())


def test_sglang_dummy_fp8_is_nearly_all_zero_and_tiny():
    """Why the module exists: ~2 % of entries survive the cast (as +-2^-9) and the layer's gain is ~1e-5."""
    m = model()
    nz = float((m.q_a_proj.weight.float() != 0).float().mean())
    assert 0.01 < nz < 0.04
    assert set(m.q_a_proj.weight.float().abs().unique().tolist()) <= {0.0, 2.0 ** -9}
    assert gain(m.q_a_proj.weight, m.q_a_proj.weight_scale_inv) < 1e-4


def test_realistic_dummy_unit_gain_norms_and_skips():
    m = model()
    res = D.realistic_dummy(m)
    assert res["norms"] == 2 and bool((m.input_layernorm.weight == 1).all()) and bool((m.k_norm.weight == 1).all())
    assert bool((m.k_norm.bias == 0).all())
    for lin in (m.q_a_proj, m.o_proj):
        assert gain(lin.weight, lin.weight_scale_inv) == pytest.approx(1.0, rel=0.1)
    for e in range(3):
        assert gain(m.experts.w13_weight[e], m.experts.w13_weight_scale_inv[e]) == pytest.approx(1.0, rel=0.1)
        assert gain(m.experts.w2_weight[e], m.experts.w2_weight_scale_inv[e]) == pytest.approx(1.0, rel=0.1)
    assert set(res["fp8_scales"]) == {"q_a_proj.weight_scale_inv", "o_proj.weight_scale_inv",
                                      "experts.w13_weight_scale_inv", "experts.w2_weight_scale_inv"}
    assert res["skipped"] == {"zero.weight_scale_inv": "all-zero FP8 weight",
                              "orphan.weight_scale_inv": "no FP8 weight next to it"}
    assert bool((m.zero.weight_scale_inv == 7e-4).all()) and bool((m.orphan.weight_scale_inv == 1).all())
    # scale = 1 / sqrt(K E[w^2]) with E[w^2] = frac * 2^-18: larger K, smaller scale
    k = 1536
    frac = float((m.q_a_proj.weight.float() != 0).float().mean())
    assert res["fp8_scales"]["q_a_proj.weight_scale_inv"] == pytest.approx(1 / math.sqrt(k * frac * 2.0 ** -18), rel=1e-3)
    assert "2 norm weights set to 1, 4 FP8 block-scale tensors" in D.summary_line(res)
    # lm_head: logits of std ~LOGIT_STD for unit-variance hidden states (a clear greedy winner per step)
    x = torch.randn(256, 512, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert float((x @ m.lm_head.weight.double().t()).std()) == pytest.approx(D.LOGIT_STD, rel=0.1)
    assert res["lm_head_factor"] > 100 and "lm_head x" in D.summary_line(res)


def test_deterministic_and_idempotent():
    a, b = model(), model()
    ra, rb = D.realistic_dummy(a), D.realistic_dummy(b)
    assert ra["fp8_scales"] == rb["fp8_scales"]  # same dummy weights -> same model (stock and plugin runs)
    again = D.realistic_dummy(a)  # SGLang may call post_load_weights again
    assert again["fp8_scales"] == ra["fp8_scales"] and again["lm_head_factor"] == pytest.approx(1.0, rel=1e-2)


def test_env_switch(monkeypatch):
    monkeypatch.delenv(D.ENV, raising=False)
    assert not D.enabled()
    for v, want in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv(D.ENV, v)
        assert D.enabled() is want


def test_model_subclass_rescales_before_sglang_post_load_and_install(monkeypatch):
    """The SGLANG_EXTERNAL_MODEL_PACKAGE subclass: realistic_dummy first (SGLang derives W_UK / W_UV from
    kv_b_proj in its post_load_weights), then SGLang's post-load, then our install."""
    order = []

    class Stock(torch.nn.Module):
        def post_load_weights(self, *a, **k):
            order.append(("sglang", float(self.q_a_proj.weight_scale_inv[0, 0])))

    stub = types.ModuleType("sglang.srt.models.glm4_moe")
    stub.GlmMoeDsaForCausalLM = Stock
    for name in ("sglang", "sglang.srt", "sglang.srt.models"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.models.glm4_moe", stub)
    monkeypatch.delitem(sys.modules, "glm5_fastpath.integrations.sglang.models.glm5_moe_dsa", raising=False)
    import importlib

    mod = importlib.import_module("glm5_fastpath.integrations.sglang.models.glm5_moe_dsa")
    monkeypatch.setattr(mod, "maybe_install", lambda m: order.append(("install", None)))
    m = mod.GlmMoeDsaForCausalLM()
    m.q_a_proj = Fp8Linear(256, 1024, 1)
    monkeypatch.setenv(D.ENV, "1")
    m.post_load_weights()
    assert [o[0] for o in order] == ["sglang", "install"] and order[0][1] > 1.0  # already rescaled
    order.clear()
    m2 = mod.GlmMoeDsaForCausalLM()
    m2.q_a_proj = Fp8Linear(256, 1024, 1)
    monkeypatch.delenv(D.ENV)
    m2.post_load_weights()
    assert order[0] == ("sglang", pytest.approx(7e-4))  # off: untouched
