"""The FP8-linear route (integrations/sglang/linear_route.py) on CPU: on by default (GLM5_FASTPATH_FP8_LINEAR=0 turns
it off); install tags only o_proj and
the dense MLP's linears and wraps Fp8LinearMethod.apply on the class; which calls reach our kernels and which stay
on SGLang's method (each reason logged once and counted, untagged linears silent); kernel errors and precompile
failures fall back; unpatch restores. Our kernels are a recorder here; on a GPU, ours_linear is compared with the
float64 reference of the same quantised math (marked gpu)."""
import logging
import types

import pytest
import torch
from prometheus_client import CollectorRegistry

from glm5_fastpath.integrations.sglang import linear_route as LR
from glm5_fastpath.metrics import FastpathMetrics

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


class Method:  # the shape of sglang's Fp8LinearMethod as far as the seam goes
    def __init__(self, block=(128, 128), block_quant=True, marlin=False):
        self.block_quant, self.use_marlin, self.use_mxfp8 = block_quant, marlin, False
        self.quant_config = types.SimpleNamespace(weight_block_size=list(block) if block else None)

    def apply(self, layer, x, bias=None):
        return ("sglang", tuple(x.shape) if isinstance(x, torch.Tensor) else "tuple")


class Linear(torch.nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n, k).to(FP8), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(torch.ones(-(-n // 128), k // 128), requires_grad=False)


def model(dense_layers=1, moe_layers=2, hidden=256, heads_v=512, inter=384):
    layers = []
    for i in range(dense_layers + moe_layers):
        attn = types.SimpleNamespace(o_proj=Linear(hidden, heads_v))
        if i < dense_layers:
            mlp = types.SimpleNamespace(gate_up_proj=Linear(2 * inter, hidden), down_proj=Linear(hidden, inter))
        else:
            mlp = types.SimpleNamespace(experts=object(), gate_up_proj=Linear(2 * inter, hidden))
        layers.append(types.SimpleNamespace(self_attn=attn, mlp=mlp))
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv(LR.ENV, "1")
    monkeypatch.delenv(LR.ENV_MAX_TOKENS, raising=False)
    calls = []

    def run(x, w, s):
        calls.append((x, w, s))
        return torch.full((x.shape[0], w.shape[0]), 7.0, dtype=BF16)
    cls = type("Method", (Method,), {})  # a fresh class per test: the wrap is class-level
    return calls, run, cls


def install(cls, mdl, run, reg=None):
    ok = LR.install_fp8_linear(mdl, FastpathMetrics(reg) if reg is not None else None, method_cls=cls,
                               precompile=False, devices=("cpu",))
    if ok:
        cls.apply.__glm5_fastpath_route__.run = run
    return ok


def test_on_by_default_and_the_switch_off(monkeypatch):
    monkeypatch.delenv(LR.ENV, raising=False)
    monkeypatch.delenv(LR.ENV_MAX_TOKENS, raising=False)
    assert LR.enabled() and LR.max_tokens() == 16
    for off in ("0", "off", "sglang"):
        monkeypatch.setenv(LR.ENV, off)
        cls = type("Method", (Method,), {})
        assert not LR.enabled() and not LR.install_fp8_linear(model(), method_cls=cls, precompile=False)
        assert cls.apply is Method.apply
    monkeypatch.setenv(LR.ENV, "on")
    assert LR.enabled()


def test_install_tags_o_proj_and_the_dense_mlp_only(env):
    calls, run, cls = env
    mdl = model()
    tagged = LR.mark_layers(mdl, LR.LAYER_KINDS)
    names = [n for n, _ in tagged]
    assert names == ["layers.0.o_proj", "layers.0.dense gate_up", "layers.0.dense down", "layers.1.o_proj",
                     "layers.2.o_proj"]  # the MoE layers' MLPs are not tagged
    assert getattr(mdl.model.layers[1].mlp.gate_up_proj, LR.MARK, None) is None
    assert LR.shapes(tagged) == [(256, 384), (256, 512), (768, 256)]


def test_layer_kinds_default_and_env(monkeypatch):
    """By default the dense gate_up stays SGLang's (measured slower on our GEMM); the env picks the kinds."""
    monkeypatch.delenv(LR.ENV_LAYERS, raising=False)
    assert LR.layer_kinds() == ("o_proj", "dense_down")
    names = [n for n, _ in LR.mark_layers(model())]
    assert names == ["layers.0.o_proj", "layers.0.dense down", "layers.1.o_proj", "layers.2.o_proj"]
    monkeypatch.setenv(LR.ENV_LAYERS, "dense_gate_up, o_proj")
    assert LR.layer_kinds() == ("dense_gate_up", "o_proj")
    assert [n for n, _ in LR.mark_layers(model())] == ["layers.0.o_proj", "layers.0.dense gate_up", "layers.1.o_proj",
                                                        "layers.2.o_proj"]
    monkeypatch.setenv(LR.ENV_LAYERS, "o_proj,qkv")
    with pytest.raises(ValueError, match="unknown layer kind"):
        LR.layer_kinds()


def test_tagged_small_calls_reach_our_kernels_and_are_counted(env, caplog):
    calls, run, cls = env
    mdl, reg = model(), CollectorRegistry()
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert install(cls, mdl, run, reg)
    o_proj = mdl.model.layers[1].self_attn.o_proj
    x = torch.randn(3, 512).to(BF16)
    y = cls().apply(o_proj, x)
    assert y.shape == (3, 256) and bool((y == 7).all())
    assert calls[-1][0] is x and calls[-1][1] is o_proj.weight and calls[-1][2] is o_proj.weight_scale_inv
    cls().apply(o_proj, x, None)
    assert reg.get_sample_value("glm5_fastpath_fp8_linear_total", {"route": "ours", "reason": "routed"}) == 2
    assert caplog.text.count("FP8 linear (o_proj) -> ours") == 1
    # an untagged FP8 linear (the MoE layer's): SGLang's method, silently and uncounted
    assert cls().apply(mdl.model.layers[1].mlp.gate_up_proj, torch.randn(3, 256).to(BF16)) == ("sglang", (3, 256))
    assert reg.get_sample_value("glm5_fastpath_fp8_linear_total", {"route": "stock", "reason": "unmarked"}) is None


@pytest.mark.parametrize("case,reason", [
    (lambda m, lin, x: (Method(block=(64, 64)), lin, x, None), "method"),
    (lambda m, lin, x: (Method(block_quant=False), lin, x, None), "method"),
    (lambda m, lin, x: (Method(marlin=True), lin, x, None), "method"),
    (lambda m, lin, x: (m, lin, (x, torch.ones(3, 4)), None), "input"),
    (lambda m, lin, x: (m, lin, x.float(), None), "input"),
    (lambda m, lin, x: (m, lin, x[None], None), "input"),
    (lambda m, lin, x: (m, lin, x, torch.zeros(256)), "bias"),
    (lambda m, lin, x: (m, lin, torch.randn(65, 512).to(BF16), None), "tokens"),
    (lambda m, lin, x: (m, lin, x[:, :384].contiguous(), None), "weight"),
    (lambda m, lin, x: (m, lin, torch.randn(512, 3).to(BF16).t(), None), "input"),  # strided view
    (lambda m, lin, x: (m, lin, x[:0], None), "input"),  # an idle (empty) batch
])
def test_calls_our_kernels_do_not_take_stay_on_sglang(env, case, reason):
    calls, run, cls = env
    mdl, reg = model(), CollectorRegistry()
    install(cls, mdl, run, reg)
    lin = mdl.model.layers[0].self_attn.o_proj
    meth, lin, x, bias = case(cls(), lin, torch.randn(3, 512).to(BF16))
    # a Method that is not the wrapped class: route the call through the wrapper by hand (same code path)
    out = cls.apply(meth, lin, x, bias)
    assert out[0] == "sglang" and not calls
    assert reg.get_sample_value("glm5_fastpath_fp8_linear_total", {"route": "stock", "reason": reason}) == 1


def test_ue8m0_scales_and_odd_layouts_are_refused():
    lin = Linear(256, 512)
    x = torch.randn(2, 512).to(BF16)
    lin.__dict__[LR.MARK] = "o_proj"
    m = Method()
    assert LR.why_not(m, lin, x, None, 64, ("cpu",)) is None
    lin.weight_scale_inv.format_ue8m0 = True
    assert LR.why_not(m, lin, x, None, 64, ("cpu",)) == "method"
    lin2 = Linear(256, 512)
    lin2.__dict__[LR.MARK] = "o_proj"
    lin2.weight_scale_inv = torch.nn.Parameter(torch.ones(2, 3), requires_grad=False)  # wrong scale grid
    assert LR.why_not(m, lin2, x, None, 64, ("cpu",)) == "weight"
    assert LR.why_not(m, lin, x, None, 64, ("cuda",)) in ("input", "method")  # a CPU tensor, cuda-only route


def test_token_limit_from_env(env, monkeypatch):
    calls, run, cls = env
    monkeypatch.setenv(LR.ENV_MAX_TOKENS, "4")
    mdl = model()
    install(cls, mdl, run)
    lin = mdl.model.layers[0].self_attn.o_proj
    assert cls().apply(lin, torch.randn(5, 512).to(BF16)) == ("sglang", (5, 512))
    assert cls().apply(lin, torch.randn(4, 512).to(BF16)).shape == (4, 256)


def test_limit_never_exceeds_the_gemm_maximum_and_bias_keyword(env, monkeypatch):
    """A limit above the GEMM's 256 tokens is capped; RowParallelLinear passes bias= as a keyword (0.5.14)."""
    calls, run, cls = env
    monkeypatch.setenv(LR.ENV_MAX_TOKENS, "1000")
    mdl = model()
    install(cls, mdl, run)
    lin = mdl.model.layers[0].self_attn.o_proj
    assert cls().apply(lin, torch.randn(257, 512).to(BF16), bias=None) == ("sglang", (257, 512))
    assert cls().apply(lin, torch.randn(256, 512).to(BF16), bias=None).shape == (256, 256)
    assert cls().apply(lin, torch.randn(2, 512).to(BF16), bias=torch.zeros(256)) == ("sglang", (2, 512))


def test_an_unaligned_n_is_refused():
    lin = Linear(200, 512)  # 2 scale rows by ceil, but not whole 128-row blocks
    lin.__dict__[LR.MARK] = "dense gate_up"
    assert LR.why_not(Method(), lin, torch.randn(2, 512).to(BF16), None, 64, ("cpu",)) == "weight"


def test_kernel_error_falls_back_once_loudly(env, caplog):
    calls, run, cls = env

    def boom(x, w, s):
        raise RuntimeError("kaput")
    mdl, reg = model(), CollectorRegistry()
    install(cls, mdl, boom, reg)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    lin = mdl.model.layers[0].mlp.down_proj
    for _ in range(2):
        assert cls().apply(lin, torch.randn(2, 384).to(BF16)) == ("sglang", (2, 384))
    assert caplog.text.count("our kernels raised RuntimeError: kaput") == 1
    assert caplog.text.count("FP8 linear") == 1  # the warning is the reason's only line
    assert reg.get_sample_value("glm5_fastpath_fp8_linear_total", {"route": "stock", "reason": "error"}) == 2


def test_precompile_failure_leaves_sglang(env, monkeypatch, caplog):
    calls, run, cls = env
    from glm5_fastpath.ops import act_quant, fp8_gemm

    monkeypatch.setattr(act_quant, "precompile", lambda device=None: None)

    def boom(shapes, max_m=64, device=None):
        raise RuntimeError("no nvcc")
    monkeypatch.setattr(fp8_gemm, "precompile_plain", boom)
    caplog.set_level(logging.INFO, "glm5_fastpath")
    assert not LR.install_fp8_linear(model(), method_cls=cls, precompile=True)
    assert cls.apply is Method.apply and "FP8 linear kernels unavailable (RuntimeError: no nvcc)" in caplog.text


def test_precompile_gets_every_tagged_shape_up_to_the_limit(env, monkeypatch):
    calls, run, cls = env
    from glm5_fastpath.ops import act_quant, fp8_gemm

    got = []
    monkeypatch.setattr(act_quant, "precompile", lambda device=None: got.append("act"))
    monkeypatch.setattr(fp8_gemm, "precompile_plain", lambda shapes, max_m=64, device=None: got.append((shapes, max_m)))
    monkeypatch.setenv(LR.ENV_MAX_TOKENS, "32")
    monkeypatch.setenv(LR.ENV_LAYERS, "o_proj,dense_gate_up,dense_down")
    assert LR.install_fp8_linear(model(), method_cls=cls, precompile=True)
    assert got == ["act", ([(256, 384), (256, 512), (768, 256)], 32)]


def test_unpatch_restores(env):
    calls, run, cls = env
    install(cls, model(), run)
    assert cls.apply is not Method.apply
    assert LR.unpatch_fp8_linear(cls) and cls.apply is Method.apply
    assert not LR.unpatch_fp8_linear(cls)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 64])
@pytest.mark.parametrize("n,k", [(6144, 16384), (24576, 6144), (6144, 12288), (768, 512)])
def test_gpu_ours_linear_matches_the_float64_reference(m, n, k):
    """What the route runs (act quant + skinny GEMM) against the float64 math of the same 1x128 / 128x128
    quantisation; o_proj's and the dense MLP's GLM-5 shapes (their tuned configs) and a small odd-M case."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from glm5_fastpath.ref.fp8 import quant_act_per_token
    from glm5_fastpath.testing.numerics import rel_err

    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda", generator=g).to(BF16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.5).to(FP8)
    s = torch.rand(-(-n // 128), k // 128, device="cuda", generator=g) * 1e-2 + 1e-3
    y = LR.ours_linear(x, w, s)
    torch.cuda.synchronize()
    x8, xs = quant_act_per_token(x)  # the same 1x128 quantisation, then everything dequantised in float64
    xd = (x8.double().view(m, k // 128, 128) * xs.double()[:, :, None]).view(m, k)
    wd = w.double() * s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    ref = xd @ wd.t()
    assert y.shape == (m, n) and y.dtype == BF16 and bool(torch.isfinite(y).all())
    assert rel_err(y, ref) < 1e-2


def test_copied_limits_match_the_gemm():
    """linear_route (import-light) and bench fp8-linear keep copies of the skinny GEMM's largest M."""
    from glm5_fastpath.bench import fp8_linear
    from glm5_fastpath.ops import fp8_gemm

    assert LR.MAX_TOKENS == fp8_gemm.MAX_M == fp8_linear.MAX_M
