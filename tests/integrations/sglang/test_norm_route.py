"""The norm route (integrations/sglang/norm_route.py) on CPU: which norms install wraps, what a wrapped norm returns
(SGLang's (x, residual) with residual updated in place, the same math as the reference A0), the FP8 quant handed to
exactly the tensor A0 produced (once, and not after anything wrote into it), the fallbacks (each reason logged once
and counted), and that the prefix's Q0 and the MoE executor take the handed-on quant instead of quantising again. A0
itself is the CPU reference here; on a GPU the route's A0 is compared with SGLang's own fused_add_rmsnorm (marked
gpu, needs sgl_kernel)."""
import logging
import types

import pytest
import torch
from prometheus_client import CollectorRegistry

from glm5_fastpath.integrations.sglang import norm_route as NR
from glm5_fastpath.integrations.sglang.moe_executor import STATE as MOE_STATE, MoEExecutor
from glm5_fastpath.integrations.sglang.prefix_executor import STATE as PREFIX_STATE, PrefixExecutor
from glm5_fastpath.metrics import FastpathMetrics
from glm5_fastpath.ref import fp8 as ref_fp8
from glm5_fastpath.ref import prefix as ref_prefix

BF16 = torch.bfloat16
H = 512


class RMSNorm(torch.nn.Module):
    """SGLang's RMSNorm as far as the seam goes: forward(x, residual=None, post_residual_addition=None), the fused
    add + norm in place (fused_add_rmsnorm's convention), returning (x, residual)."""

    def __init__(self, hidden=H, eps=1e-6, dtype=BF16, **flags):
        super().__init__()
        self.weight = torch.nn.Parameter((1 + 0.1 * torch.randn(hidden)).to(dtype), requires_grad=False)
        self.variance_epsilon = eps
        self.cast_x_before_out_mul = flags.get("cast_x_before_out_mul", False)
        self.fp32_residual = flags.get("fp32_residual", False)
        self.variance_size_override = None
        self.has_weight, self.override_orig_dtype = True, None
        self.calls = 0

    def forward(self, x, residual=None, post_residual_addition=None):
        self.calls += 1
        if residual is None:
            return x * 0 + 1
        if post_residual_addition is not None:
            residual = residual + post_residual_addition
        y, r, _, _ = ref_prefix.a0_add_rmsnorm_quant(x, residual, self.weight, self.variance_epsilon)
        residual.copy_(r)
        x.copy_(y)
        return x, residual


def ref_run(x, residual, weight, eps):
    """What ours_norm does, on CPU: A0's reference, residual in place, x new."""
    y, r, x8, xs = ref_prefix.a0_add_rmsnorm_quant(x, residual, weight, eps)
    residual.copy_(r)
    return y, x8, xs


def inputs(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, H, generator=g).to(BF16), torch.randn(m, H, generator=g).to(BF16))


@pytest.fixture
def route(monkeypatch):
    monkeypatch.delenv(NR.ENV, raising=False)
    reg = CollectorRegistry()
    stash = NR.QuantStash()
    r = NR.NormRoute(FastpathMetrics(registry=reg), devices=("cpu",), run=ref_run, stash=stash)
    return r, reg, stash


def wrapped(route, where="input", **kw):
    norm = RMSNorm(**kw)
    NR.wrap_norm(norm, where, route)
    return norm


@pytest.mark.parametrize("m", [1, 3, 16, 256])
def test_wrapped_norm_returns_what_sglang_returns_and_stashes_the_quant(route, m):
    r, reg, stash = route
    norm = wrapped(r)
    plain = RMSNorm()
    plain.weight.copy_(norm.weight)
    x, res = inputs(m, m)
    x0, res0 = x.clone(), res.clone()
    y, res_out = norm(x, res)
    want_x, want_res = plain(x0.clone(), res0.clone())
    assert res_out is res  # in place, as fused_add_rmsnorm
    assert torch.equal(res_out, want_res) and torch.equal(y, want_x)
    assert torch.equal(x, x0)  # A0 does not write over its input; the new x is returned
    assert norm.calls == 0
    x8, xs = stash.take(y)
    w8, ws = ref_fp8.quant_act_per_token(y)
    assert torch.equal(x8.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(xs, ws)
    assert reg.get_sample_value("glm5_fastpath_norm_total", {"route": "ours", "reason": "routed"}) == 1


def test_stash_is_for_that_tensor_once_and_unmodified(route):
    r, _, stash = route
    norm = wrapped(r)
    y, _ = norm(*inputs(4))
    assert stash.take(y.clone()) is None  # equal values, another tensor
    assert stash.take(y) is not None and stash.take(y) is None  # once
    y2, _ = norm(*inputs(4, 1))
    y2.add_(0)  # a write after A0: its version counter moved
    assert stash.take(y2) is None
    y3, _ = norm(*inputs(4, 2))
    norm(*inputs(4, 3))  # the next norm replaces the entry
    assert stash.take(y3) is None


@pytest.mark.parametrize("case,reason", [
    ("no_residual", "no_residual"), ("post_add", "post_add"), ("fp16", "input"), ("strided", "input"),
    ("shape", "input"), ("big", "tokens"), ("empty", "tokens"),
])
def test_calls_outside_the_route_go_to_sglang_once_logged(route, caplog, case, reason):
    r, reg, stash = route
    norm = wrapped(r)
    x, res = inputs(300 if case == "big" else 4)
    post = None
    if case == "no_residual":
        res = None
    elif case == "post_add":
        post = torch.zeros_like(res)
    elif case == "fp16":
        x = x.half()
    elif case == "strided":
        x = torch.randn(H, 4).to(BF16).t()
    elif case == "shape":
        res = res[:2]
    elif case == "empty":
        x, res = x[:0], res[:0]
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        for _ in range(2):
            try:
                norm(x, res, post)
            except ValueError:
                pass  # the stand-in (the reference) refuses fp16 / mismatched shapes; the route already handed over
    assert norm.calls == 2
    assert stash.take(x) is None
    assert reg.get_sample_value("glm5_fastpath_norm_total", {"route": "stock", "reason": reason}) == 2
    assert sum(NR.REASONS[reason] in m for m in caplog.messages) == 1


def test_torch_compile_tracing_keeps_sglang_norm(route, monkeypatch):
    r, reg, stash = route
    norm = wrapped(r)
    y, _ = norm(*inputs(2))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert stash.take(y) is None  # no hand-off inside a trace
    norm(*inputs(2))
    assert norm.calls == 1
    assert reg.get_sample_value("glm5_fastpath_norm_total", {"route": "stock", "reason": "compiling"}) == 1


def test_kernel_error_falls_back_to_sglang_with_one_warning(route, caplog):
    r, reg, _ = route

    def boom(*a):
        raise RuntimeError("no kernel")
    r.run = boom
    norm = wrapped(r, "post_attention")
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        for _ in range(2):
            y, res = norm(*inputs(2))
    assert norm.calls == 2
    assert sum("our kernel raised" in m for m in caplog.messages) == 1
    assert reg.get_sample_value("glm5_fastpath_norm_total", {"route": "stock", "reason": "error"}) == 2


def model(refuse_prefix=(), refuse_moe=(), bad_norm=()):
    layers = []
    for i in range(4):
        attn, mlp = types.SimpleNamespace(), types.SimpleNamespace()
        attn.__dict__[PREFIX_STATE] = types.SimpleNamespace(refusal="x" if i in refuse_prefix else None)
        if i > 0:  # layer 0 dense: no MoE state
            mlp.__dict__[MOE_STATE] = types.SimpleNamespace(refusal="x" if i in refuse_moe else None)
        inorm = RMSNorm(dtype=torch.float32) if i in bad_norm else RMSNorm()
        layers.append(types.SimpleNamespace(self_attn=attn, mlp=mlp, input_layernorm=inorm,
                                            post_attention_layernorm=RMSNorm(cast_x_before_out_mul=i in bad_norm)))
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))


def wrapped_names(mdl):
    return [(i, n) for i, l in enumerate(mdl.model.layers) for n in ("input_layernorm", "post_attention_layernorm")
            if "forward" in getattr(l, n).__dict__]


def test_install_wraps_the_norms_a_route_consumes(monkeypatch, caplog):
    monkeypatch.delenv(NR.ENV, raising=False)
    mdl = model(refuse_prefix=(2,), refuse_moe=(3,), bad_norm=(1,))
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        r = NR.install_norms(mdl, precompile=False)
    assert r is not None
    # input norms: prefix routed and plain RMSNorm (layer 1's is fp32: refused, layer 2's prefix refused);
    # post-attention norms: MoE routed (not the dense layer 0, not layer 3) and plain (layer 1 casts first)
    assert wrapped_names(mdl) == [(0, "input_layernorm"), (2, "post_attention_layernorm"), (3, "input_layernorm")]
    assert any("weight is not a bf16" in m for m in caplog.messages)
    assert any("cast_x_before_out_mul" in m for m in caplog.messages)
    assert NR.unpatch_norms(mdl) == 3 and wrapped_names(mdl) == []


def test_install_precompiles_a0_through_its_module(monkeypatch):
    """install_norms reaches A0's module (the package attribute `ops.add_rmsnorm_quant` is the function: session 29's
    first engine run lost the route to that); a precompile failure keeps SGLang's norms, logged."""
    mod = NR.a0_module()
    assert callable(mod.precompile) and callable(mod.add_rmsnorm_quant)
    got = []
    monkeypatch.setattr(mod, "precompile", lambda hs, dev: got.append((hs, dev)))
    cuda = torch.device("cuda", 0)

    def norms():  # stand-ins whose weight says "cuda" without a GPU
        return [(1, "input", types.SimpleNamespace(weight=types.SimpleNamespace(device=cuda, shape=(H,)),
                                                    forward=lambda *a: None))]
    monkeypatch.setattr(NR, "targets", lambda mdl: norms())
    monkeypatch.setattr(NR, "module_why_not", lambda norm: None)
    assert NR.install_norms(None) is not None and got == [((H,), cuda)]

    def boom(hs, dev):
        raise RuntimeError("no nvcc")
    monkeypatch.setattr(mod, "precompile", boom)
    assert NR.install_norms(None) is None


def test_switch_off_keeps_sglang_norms(monkeypatch):
    monkeypatch.setenv(NR.ENV, "sglang")
    mdl = model()
    assert NR.install_norms(mdl, precompile=False) is None and wrapped_names(mdl) == []


def test_module_checks():
    assert NR.module_why_not(RMSNorm()) is None
    assert "not SGLang's RMSNorm" in NR.module_why_not(torch.nn.LayerNorm(H))
    assert "multiple of 256" in NR.module_why_not(RMSNorm(hidden=384))
    assert NR.module_why_not(RMSNorm(fp32_residual=True)) == "fp32_residual"


def test_prefix_q0_takes_the_stashed_quant(monkeypatch):
    seen = []
    ex = PrefixExecutor(impl=ref_prefix, quant=lambda x: seen.append(x) or ("q", x))
    r = NR.NormRoute(devices=("cpu",), run=ref_run)  # the process-wide STASH, which Q0 reads
    norm = RMSNorm()
    NR.wrap_norm(norm, "input", r)
    y, _ = norm(*inputs(3))
    x8, xs = ex.quant(y)
    assert x8.dtype == torch.float8_e4m3fn and xs.shape == (3, H // 128) and seen == []
    other = torch.zeros(3, H, dtype=BF16)
    assert ex.quant(other) == ("q", other) and len(seen) == 1
    assert ex.quant(y) == ("q", y)  # taken once


def test_moe_executor_takes_the_stashed_quant():
    seen = []
    ex = MoEExecutor(quant=lambda x: seen.append(x) or (None, None))
    ex.config_for = lambda m, route: "cfg"
    got = {}
    mm = types.SimpleNamespace(mega_moe=lambda x8, xs, ids, wts, weights, routed_scaling_factor, config:
                               got.update(x8=x8, xs=xs) or "out")
    route = types.SimpleNamespace(weights=None, rsf=2.5, shared_mlp=None)
    norm = RMSNorm()
    NR.wrap_norm(norm, "post_attention", NR.NormRoute(devices=("cpu",), run=ref_run))
    y, _ = norm(*inputs(2))
    assert ex._experts(mm, None, route, y, None, None) == "out"
    assert seen == [] and got["x8"].dtype == torch.float8_e4m3fn
    assert ex._experts(mm, None, route, y, None, None) == "out" and seen == [y]  # once; then its own quant


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 8, 31, 64, 256])
def test_gpu_route_matches_sglang_fused_add_rmsnorm(m):
    """The route's A0 against the kernel SGLang runs (sgl_kernel / FlashInfer fused_add_rmsnorm) on the same inputs:
    residual bitwise, x within one bf16 rounding step (the sum of squares is reduced in another order), and the
    handed-on quant bitwise our act quant of the returned x."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    sgl = pytest.importorskip("sgl_kernel")
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    g = torch.Generator(device="cuda").manual_seed(m)
    h = 6144
    x = (torch.randn(m, h, device="cuda", generator=g) * 2).to(BF16)
    res = torch.randn(m, h, device="cuda", generator=g).to(BF16)
    w = (1 + 0.1 * torch.randn(h, device="cuda", generator=g)).to(BF16)
    sx, sres = x.clone(), res.clone()
    sgl.fused_add_rmsnorm(sx, sres, w, 1e-5)
    ours_res = res.clone()
    y, x8, xs = NR.ours_norm(x, ours_res, w, 1e-5)
    torch.cuda.synchronize()
    assert torch.equal(ours_res, sres)
    d = (y.float() - sx.float()).abs()
    ulp = sx.float().abs().clamp_min(1e-30) * 2.0 ** -7  # one bf16 step (8 significant bits)
    assert bool((d <= ulp).all()), f"max |diff| {d.max().item()} beyond one bf16 step"
    a8, as_ = act_quant_fp8(y)
    assert torch.equal(x8.view(torch.uint8), a8.view(torch.uint8)) and torch.equal(xs, as_)
