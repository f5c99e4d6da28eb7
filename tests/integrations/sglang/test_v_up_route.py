"""The V-up route (integrations/sglang/v_up_route.py) on CPU: a wrapped forward_absorb_core returns what SGLang's DSA
decode branch returns (attn_mqa called once with the same arguments, y within one bf16 step of SGLang's bf16 bmm,
the same o_proj, the same next_skip_topk tails), o_proj gets y itself and the FP8 quant of exactly that y through
the stash, the FP8-linear route's ours_linear then skips its act quant, every other branch of SGLang's core falls back
(each reason logged once and counted), kernel errors fall back, install / unpatch. The op runs its CPU reference.
Against the real sglang package (0.5.23 installed; 0.5.14 with GLM5_FASTPATH_SGLANG_0514_SRC): the real
forward_absorb_core on a stand-in module against the wrapped one. On a GPU (marked gpu): the route with our kernel
against cuBLAS's bmm."""
import importlib.util
import logging
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from glm5_fastpath.integrations.sglang import linear_route as LR
from glm5_fastpath.integrations.sglang import norm_route as NR
from glm5_fastpath.integrations.sglang import v_up_route as VR
from glm5_fastpath.metrics import FastpathMetrics
from glm5_fastpath.ref import fp8 as ref_fp8

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
L, V = 512, 256  # kv_lora_rank, GLM-5's v_head_dim
HIDDEN = 256
HERE = str(Path(__file__).parent)

# what SGLang's forward_mla module holds and the route reads from the globals of forward_absorb_core's module
# (here: this module, where Attn.forward_absorb_core is defined); the tests flip them with monkeypatch
_SGLANG_EXPERIMENTAL_LORA_OPTI = False
_is_hip = False
_is_musa = False


def is_kv_b_lora_active(attn_module):  # SGLang's, as far as the route reads it
    return getattr(getattr(attn_module, "kv_b_proj", None), "set_lora", False)


class ForwardMode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"

    def is_idle(self):
        return self.name == "IDLE"

    def is_target_verify(self):
        return self.name == "TARGET_VERIFY"

    def is_extend(self):
        return self.name in ("EXTEND", "MIXED", "TARGET_VERIFY")


def fb(mode="DECODE"):
    return types.SimpleNamespace(forward_mode=ForwardMode(mode))


class OProj:
    """A bf16 o_proj: (x @ W^T, None), recording its inputs."""

    def __init__(self, k, g):
        self.weight = (torch.randn(HIDDEN, k, generator=g) * k ** -0.5).to(BF16)
        self.inputs = []

    def __call__(self, x):
        self.inputs.append(x)
        return (x.float() @ self.weight.float().t()).to(BF16), None


class Attn:
    """DeepseekV2AttentionMLA as far as forward_absorb_core goes: SGLang's DSA decode branch (attn_mqa, then the
    bf16 W_UV bmm into a [T, H * V] buffer, o_proj, the next_skip_topk tail); attn_mqa returns a fixed random latent
    output per T and records its arguments."""

    def __init__(self, h=4, seed=0, w_vc=None, v=V):
        g = torch.Generator().manual_seed(seed)
        self.num_local_heads, self.kv_lora_rank, self.v_head_dim = h, L, v
        # SGLang's layout: w_kv_b's V rows per head, [H, V, L] contiguous, transposed to [H, L, V]
        self.w_vc = (torch.randn(h, v, L, generator=g) * L ** -0.5).to(BF16).transpose(1, 2) if w_vc is None else w_vc
        self.w_scale = 1.0
        self.current_attention_backend = "dsa"
        self.use_deep_gemm_bmm = False
        self.next_skip_topk = None
        self.o_proj = OProj(h * v, g)
        self.seed = seed
        self.mqa_calls = []
        self.core_calls = 0
        self.mqa_out = None  # a stand-in output (tests of odd shapes)

    def latent(self, t):
        """attn_mqa's output for t tokens: [t, H * 512] bf16, random, the same for every call."""
        if self.mqa_out is not None:
            return self.mqa_out
        g = torch.Generator().manual_seed(1000 * self.seed + t)
        return torch.randn(t, self.num_local_heads * L, generator=g).to(BF16)

    def attn_mqa(self, q, k, v, forward_batch, q_rope=None, k_rope=None, **kw):
        self.mqa_calls.append(dict(q=q, k=k, v=v, forward_batch=forward_batch, q_rope=q_rope, k_rope=k_rope, **kw))
        return self.latent(int(q.shape[0]))

    def forward_absorb_core(self, q_pe, k_pe, q_nope_out, k_nope, forward_batch, zero_allocator, positions,
                            topk_indices, llama_4_scaling, fusion_plan=None, attention_output_gate=None):
        self.core_calls += 1
        h, v = self.num_local_heads, self.w_vc.shape[2]  # SGLang reads self.v_head_dim (the fallback tests change it)
        attn_output = self.attn_mqa(q_nope_out, k_nope, k_nope, forward_batch, q_rope=q_pe, k_rope=k_pe,
                                    **(dict(topk_indices=topk_indices) if topk_indices is not None else {}))
        attn_output = attn_output.view(-1, h, L)
        if self.w_vc.dtype == FP8:  # SGLang's CPU form of its bmm_fp8 branch
            out = torch.bmm(attn_output.transpose(0, 1), self.w_vc.to(BF16) * self.w_scale)
            out = out.transpose(0, 1).flatten(1, 2)
        else:
            out = torch.empty((attn_output.shape[0], h * v), dtype=BF16, device=attn_output.device)
            torch.bmm(attn_output.transpose(0, 1), self.w_vc, out=out.view(-1, h, v).transpose(0, 1))
        output, _ = self.o_proj(out)
        if self.next_skip_topk is None:
            return output
        if not self.next_skip_topk:
            return output, None
        return output, topk_indices


def core_args(t=3, h=4, topk=True, seed=1, mode="DECODE", **extra):
    g = torch.Generator().manual_seed(seed)
    a = dict(q_pe=torch.randn(t, h, 64, generator=g).to(BF16), k_pe=torch.randn(t, 1, 64, generator=g).to(BF16),
             q_nope_out=torch.randn(t, h, L, generator=g).to(BF16), k_nope=torch.randn(t, 1, L, generator=g).to(BF16),
             forward_batch=fb(mode), zero_allocator=None, positions=torch.arange(t),
             topk_indices=torch.randint(0, 100, (t, 64), generator=g, dtype=torch.int32) if topk else None,
             llama_4_scaling=None)
    a.update(extra)
    return a


def positional(a):
    """SGLang calls self.forward_absorb_core(*inner_state): the 9 (0.5.14) or 10-11 (0.5.23) values in order."""
    return tuple(a[p] for p in VR.PARAMS if p in a)


@pytest.fixture
def route(monkeypatch):
    monkeypatch.delenv(VR.ENV, raising=False)
    monkeypatch.delenv(VR.ENV_MAX_TOKENS, raising=False)
    reg = pytest.importorskip("prometheus_client").CollectorRegistry()  # (the GPU test runs without it)
    stash = NR.QuantStash()
    r = VR.VUpRoute(FastpathMetrics(registry=reg), limit=VR.MAX_TOKENS, devices=("cpu",), stash=stash)
    return r, reg, stash


def wrapped(route, **kw):
    attn = Attn(**kw)
    VR.wrap_attention(attn, route, 0)
    return attn


def count(reg, route, reason):
    return reg.get_sample_value("glm5_fastpath_v_up_total", {"route": route, "reason": reason})


def within_one_bf16_step(out, ref):
    """|out - ref| <= one bf16 step of ref (8 significant bits), plus fp32 sum-order noise near 0."""
    d = (out.float() - ref.float()).abs()
    tol = ref.float().abs() * 2.0 ** -7 + 1e-6 * float(ref.float().abs().max())
    return bool((d <= tol).all()), float(d.max())


# ---- routed calls ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 5, 64])
@pytest.mark.parametrize("h,v", [(4, 256), (8, 128)])
def test_routed_call_returns_what_sglang_returns(route, t, h, v):
    r, reg, stash = route
    attn, plain = wrapped(r, h=h, v=v), Attn(h=h, v=v)
    a = core_args(t, h)
    out = attn.forward_absorb_core(*positional(a))
    want = plain.forward_absorb_core(*positional(a))
    assert attn.core_calls == 0 and len(attn.mqa_calls) == 1
    got, ref = attn.mqa_calls[0], plain.mqa_calls[0]  # attn_mqa: the same call, the same objects
    assert got.keys() == ref.keys() == {"q", "k", "v", "forward_batch", "q_rope", "k_rope", "topk_indices"}
    assert all(got[k] is ref[k] for k in got)
    y, y_sglang = attn.o_proj.inputs[0], plain.o_proj.inputs[0]
    assert y.shape == y_sglang.shape == (t, h * v) and y.dtype == BF16 and y.is_contiguous()
    ok, dmax = within_one_bf16_step(y, y_sglang)
    assert ok, f"max |y - SGLang's bmm| {dmax} beyond one bf16 step"
    want_y = VR.op_module().reference(attn.latent(t).view(t, h, L), attn.w_vc).y
    assert torch.equal(y, want_y)  # o_proj's input is the op's y itself
    assert out.shape == want.shape == (t, HIDDEN)
    from glm5_fastpath.testing.numerics import rel_err

    assert rel_err(out, want) < 1e-2
    assert count(reg, "ours", "routed") == 1


def test_keyword_call_and_no_topk(route):
    r, _, _ = route
    attn, plain = wrapped(r), Attn()
    a = core_args(2, topk=False, fusion_plan=None, attention_output_gate=None)  # 0.5.23's 11 values, as keywords
    out = attn.forward_absorb_core(**a)
    assert "topk_indices" not in attn.mqa_calls[0]  # SGLang passes topk_indices only when it is given
    assert torch.allclose(out.float(), plain.forward_absorb_core(**a).float(), rtol=2e-2, atol=2e-2)
    assert attn.core_calls == 0


@pytest.mark.parametrize("nxt", [None, False, True])
def test_next_skip_topk_tails(route, nxt):
    r, _, _ = route
    attn, plain = wrapped(r), Attn()
    attn.next_skip_topk = plain.next_skip_topk = nxt
    a = core_args(2)
    out, want = attn.forward_absorb_core(*positional(a)), plain.forward_absorb_core(*positional(a))
    assert attn.core_calls == 0
    if nxt is None:
        assert isinstance(out, torch.Tensor) and isinstance(want, torch.Tensor)
    else:
        assert isinstance(out, tuple) and len(out) == len(want) == 2
        assert (out[1] is None) == (want[1] is None) == (not nxt)
        if nxt:
            assert out[1] is a["topk_indices"] and want[1] is a["topk_indices"]
    # no next_skip_topk attribute at all (a model without the index cache): the output alone
    del attn.next_skip_topk
    assert isinstance(attn.forward_absorb_core(*positional(a)), torch.Tensor)


# ---- the hand-off -------------------------------------------------------------------------------------------------

def test_stash_hands_the_quant_of_exactly_that_y(route):
    r, _, stash = route
    attn = wrapped(r)
    attn.forward_absorb_core(*positional(core_args(3)))
    y = attn.o_proj.inputs[-1]
    assert stash.take(y.clone()) is None  # equal values, another tensor
    y8, ys = stash.take(y)
    w8, ws = ref_fp8.quant_act_per_token(y)
    assert y8.dtype == FP8 and ys.shape == (3, attn.num_local_heads * V // 128)
    assert torch.equal(y8.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(ys, ws)
    assert stash.take(y) is None  # once
    attn.forward_absorb_core(*positional(core_args(3, seed=2)))
    y2 = attn.o_proj.inputs[-1]
    y2.add_(0)  # written after our kernel: its version counter moved
    assert stash.take(y2) is None


def test_fp8_linear_route_takes_the_quant_and_skips_its_act_quant(monkeypatch, caplog):
    """o_proj through the FP8-linear route's default run (ours_linear): on y the V-up kernel's (y8, ys) go to the
    GEMM and no act quant runs; any other input is quantised as before. The process-wide STASH, as in the engine."""
    from glm5_fastpath.ops import act_quant as AQ
    from glm5_fastpath.ops import fp8_gemm as FG

    monkeypatch.delenv(VR.ENV, raising=False)
    quants, gemms = [], []
    real_quant = AQ.act_quant_fp8

    def act_quant_fp8(x, pdl=True):
        quants.append(x)
        return real_quant(x, pdl=pdl)

    def fp8_gemm_skinny(x8, xs, w, pdl=True):
        gemms.append((x8, xs))
        xd = (x8.float().view(x8.shape[0], -1, 128) * xs[:, :, None]).view(x8.shape)
        wd = w.weight.float() * w.scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return (xd @ wd.t()).to(BF16)

    monkeypatch.setattr(AQ, "act_quant_fp8", act_quant_fp8)
    monkeypatch.setattr(FG, "fp8_gemm_skinny", fp8_gemm_skinny)
    h = 4
    lin = types.SimpleNamespace(weight=(torch.randn(HIDDEN, h * V) * 0.2).to(FP8),
                                weight_scale_inv=torch.full((HIDDEN // 128, h * V // 128), 0.01))
    lin.__dict__[LR.MARK] = "o_proj"
    method = types.SimpleNamespace(block_quant=True, use_marlin=False, use_mxfp8=False,
                                   quant_config=types.SimpleNamespace(weight_block_size=[128, 128]))
    fp8_route = LR.Fp8LinearRoute(devices=("cpu",), limit=16)

    def sglang_apply(m, layer, x, bias=None):
        raise AssertionError("SGLang's method: the FP8-linear route should have taken o_proj")

    attn = Attn(h=h)
    seen = []
    attn.o_proj = lambda x: (seen.append(x) or fp8_route.call(sglang_apply, method, lin, x), None)
    VR.wrap_attention(attn, VR.VUpRoute(limit=VR.MAX_TOKENS, devices=("cpu",)))  # the process-wide STASH
    caplog.set_level(logging.INFO, "glm5_fastpath")
    out = attn.forward_absorb_core(*positional(core_args(3, h)))
    y = seen[0]
    assert quants == [] and len(gemms) == 1  # the act quant skipped
    w8, ws = ref_fp8.quant_act_per_token(y)
    assert torch.equal(gemms[0][0].view(torch.uint8), w8.view(torch.uint8)) and torch.equal(gemms[0][1], ws)
    ref = fp8_route.call(sglang_apply, method, lin, y)  # y again: the entry was taken, so quantised here
    assert len(quants) == 1 and quants[0] is y and torch.equal(out, ref)
    other = torch.randn(3, h * V).to(BF16)
    fp8_route.call(sglang_apply, method, lin, other)
    assert len(quants) == 2 and quants[1] is other
    assert caplog.text.count("act quant taken from the V-up kernel") == 1


# ---- fallbacks ----------------------------------------------------------------------------------------------------

def _fp8_w_vc(h=4):
    return (torch.randn(h, V, L) * 0.05).to(FP8).transpose(1, 2)  # SGLang's FP8 W_UV (bmm_fp8 branch)


CASES = {
    "backend": (lambda attn, a: setattr(attn, "current_attention_backend", "flashmla"), "backend"),
    "extend": (lambda attn, a: a.update(forward_batch=fb("EXTEND")), "mode"),
    "idle": (lambda attn, a: a.update(forward_batch=fb("IDLE")), "mode"),
    "target_verify": (lambda attn, a: a.update(forward_batch=fb("TARGET_VERIFY")), "mode"),
    "tokens": (lambda attn, a: a.update(core_args(65)), "tokens"),
    "llama4": (lambda attn, a: a.update(llama_4_scaling=torch.ones(3, 1, 1)), "llama4_scaling"),
    "fusion_plan": (lambda attn, a: a.update(fusion_plan=object()), "fusion_plan"),
    "gate": (lambda attn, a: a.update(fusion_plan=None, attention_output_gate=torch.ones(3, 4 * V)),
             "output_gate"),
    "sink": (lambda attn, a: setattr(attn, "learnable_sink_param", torch.zeros(4)), "sink"),
    "trtllm_rope": (lambda attn, a: setattr(attn, "_fuse_rope_for_trtllm_mla", lambda forward_batch: True),
                    "rope_fused"),
    "tilelang_rope": (lambda attn, a: setattr(attn, "_skip_rope_for_dsa_tilelang_fused", lambda: True),
                      "rope_fused"),
    "rope_check_raises": (lambda attn, a: setattr(attn, "_fuse_rope_for_trtllm_mla", lambda forward_batch: 1 / 0),
                          "rope_fused"),
    "dcp_size": (lambda attn, a: setattr(attn, "dcp_size", 2), "dcp"),
    "dcp_phase": (lambda attn, a: setattr(attn, "is_dcp_mla_decode_phase", lambda forward_batch: True), "dcp"),
    "lora": (lambda attn, a: setattr(attn, "kv_b_proj", types.SimpleNamespace(set_lora=True)), "lora"),
    "deep_gemm_bmm": (lambda attn, a: setattr(attn, "use_deep_gemm_bmm", True), "bmm"),
    "gguf": (lambda attn, a: setattr(attn, "_kimi_split_gguf_kv_b", True), "bmm"),
    "fp8_w_vc": (lambda attn, a: setattr(attn, "w_vc", _fp8_w_vc()), "weight"),
    "w_vc_layout": (lambda attn, a: setattr(attn, "w_vc", attn.w_vc.contiguous()), "weight"),  # [H, L, V] row-major
    "v_head_dim": (lambda attn, a: setattr(attn, "v_head_dim", 192), "weight"),  # not a multiple of 128
    "kv_lora_rank": (lambda attn, a: setattr(attn, "kv_lora_rank", 256), "weight"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_calls_outside_the_route_go_to_sglang_once_logged(route, caplog, case):
    r, reg, stash = route
    attn = wrapped(r)
    change, reason = CASES[case]
    a = core_args(3)
    change(attn, a)
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        for _ in range(2):
            attn.forward_absorb_core(*positional(a))
    assert attn.core_calls == 2 and len(attn.mqa_calls) == 2  # SGLang's core, and attn_mqa only from it
    assert stash._entry is None
    assert count(reg, "stock", reason) == 2 and count(reg, "ours", "routed") is None
    assert sum(VR.REASONS[reason] in m for m in caplog.messages) == 1


def test_lora_and_platform_flags_of_sglangs_module(route, monkeypatch):
    """The forward_mla module's flags (read from the globals of the class's forward_absorb_core: here this module)."""
    r, reg, _ = route
    attn = wrapped(r)
    a = core_args(2)
    mod = sys.modules[__name__]
    for name, reason in (("_SGLANG_EXPERIMENTAL_LORA_OPTI", "lora"), ("_is_hip", "bmm"), ("_is_musa", "bmm")):
        monkeypatch.setattr(mod, name, True)
        attn.forward_absorb_core(*positional(a))
        monkeypatch.setattr(mod, name, False)
    assert attn.core_calls == 3 and count(reg, "stock", "lora") == 1 and count(reg, "stock", "bmm") == 2
    monkeypatch.setattr(mod, "kv_b_lora_correction", lambda attn_module: "v2", raising=False)  # 0.5.23's check
    attn.forward_absorb_core(*positional(a))
    assert count(reg, "stock", "lora") == 2
    monkeypatch.setattr(mod, "kv_b_lora_correction", lambda attn_module: None)
    attn.forward_absorb_core(*positional(a))
    assert attn.core_calls == 4 and count(reg, "ours", "routed") == 1


def test_token_limit_from_env_and_its_cap(monkeypatch):
    monkeypatch.delenv(VR.ENV_MAX_TOKENS, raising=False)
    assert VR.max_tokens() == VR.DEFAULT_MAX_TOKENS == 2
    for raw, want in (("4", 4), ("1000", 64), ("-3", 0), ("x", 2)):
        monkeypatch.setenv(VR.ENV_MAX_TOKENS, raw)
        assert VR.max_tokens() == want, raw
    monkeypatch.setenv(VR.ENV_MAX_TOKENS, "4")
    reg = pytest.importorskip("prometheus_client").CollectorRegistry()  # (the GPU test runs without it)
    r = VR.VUpRoute(FastpathMetrics(registry=reg), devices=("cpu",), stash=NR.QuantStash())
    attn = wrapped(r)
    attn.forward_absorb_core(*positional(core_args(5)))
    attn.forward_absorb_core(*positional(core_args(4)))
    assert attn.core_calls == 1 and count(reg, "stock", "tokens") == 1 and count(reg, "ours", "routed") == 1


def test_copied_limit_matches_the_op():
    from glm5_fastpath.ops import mla_v_up

    assert VR.MAX_TOKENS == mla_v_up.MAX_TOKENS and (VR.L_DIM, VR.V_BLOCK) == (mla_v_up.L_DIM, mla_v_up.V_BLOCK)


def test_unknown_call_shapes_go_to_sglang(route):
    r, reg, _ = route
    attn = wrapped(r)
    a = core_args(2)
    with pytest.raises(TypeError):  # SGLang's method refuses a 12th value; the wrapper hands it over untouched
        attn.forward_absorb_core(*positional(a), None, None, "extra")
    with pytest.raises(TypeError):
        attn.forward_absorb_core(*positional(a), bogus=1)
    assert attn.core_calls == 0 and count(reg, "stock", "args") == 2


def test_torch_compile_tracing_and_piecewise_graphs_keep_sglang(route, monkeypatch):
    r, reg, stash = route
    attn = wrapped(r)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    attn.forward_absorb_core(*positional(core_args(2)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(sys.modules[__name__], "is_in_tc_piecewise_cuda_graph", lambda: True, raising=False)
    attn.forward_absorb_core(*positional(core_args(2)))
    assert attn.core_calls == 2 and count(reg, "stock", "compiling") == 2 and stash._entry is None


def test_odd_attention_output_falls_back(route, caplog):
    r, reg, _ = route
    attn, plain = wrapped(r), Attn()
    attn.mqa_out = torch.randn(3, 4 * L + 8).to(BF16)  # not T x H x 512
    plain.mqa_out = torch.randn(3, 4 * L).to(BF16)
    with pytest.raises(RuntimeError):  # SGLang's view refuses it too; the wrapper handed over
        attn.forward_absorb_core(*positional(core_args(3)))
    assert attn.core_calls == 1 and count(reg, "stock", "shape") == 1


def test_kernel_error_falls_back_with_one_warning(route, caplog):
    r, reg, stash = route

    def boom(o, w):
        raise RuntimeError("no kernel")
    r.run = boom
    attn, plain = wrapped(r), Attn()
    a = core_args(3)
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        outs = [attn.forward_absorb_core(*positional(a)) for _ in range(2)]
    want = plain.forward_absorb_core(*positional(a))
    assert all(torch.equal(o, want) for o in outs)  # SGLang's result, bit for bit
    # attn_mqa ran for our attempt and again inside SGLang's core (the same KV into the same slots)
    assert attn.core_calls == 2 and len(attn.mqa_calls) == 4
    assert sum("our kernel raised RuntimeError: no kernel" in m for m in caplog.messages) == 1
    assert sum("V up-projection" in m for m in caplog.messages) == 1  # the warning is the reason's one line
    assert count(reg, "stock", "error") == 2 and stash._entry is None


# ---- install / unpatch ------------------------------------------------------------------------------------------

def model(n=4, bad=None):
    layers = []
    for i in range(n):
        attn = Attn(seed=i)
        if bad is not None and i in bad:
            bad[i](attn)
        layers.append(types.SimpleNamespace(self_attn=attn, mlp=None))
    layers.append(types.SimpleNamespace(self_attn=types.SimpleNamespace(), mlp=None))  # no MLA core: not a target
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))


def wrapped_layers(mdl):
    return [i for i, l in enumerate(mdl.model.layers) if VR.METHOD in vars(l.self_attn)]


def test_install_wraps_the_layers_our_kernel_takes_and_unpatch_restores(monkeypatch, caplog):
    monkeypatch.delenv(VR.ENV, raising=False)
    mdl = model(bad={1: lambda a: setattr(a, "w_vc", _fp8_w_vc()),
                     2: lambda a: setattr(a, "w_vc", a.w_vc.contiguous())})  # row-major [H, L, V]: stride(1) != 1
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        got = VR.install_v_up(mdl, precompile=False, devices=("cpu",))
    assert got == [0, 3] and wrapped_layers(mdl) == [0, 3]
    assert any("layers 1 keep SGLang's W_UV bmm (w_vc is torch.float8_e4m3fn" in m for m in caplog.messages)
    assert any("layers 2 keep SGLang's W_UV bmm (glm5_fastpath.mla_v_up_quant: w_vc must hold" in m
               for m in caplog.messages)
    assert any("forward_absorb_core -> our W_UV + FP8 quant kernel" in m and "layers 0,3 " in m
               for m in caplog.messages)
    attn = mdl.model.layers[3].self_attn
    attn.forward_absorb_core(*positional(core_args(2)))
    assert attn.core_calls == 0
    VR.wrap_attention(attn, VR.VUpRoute(limit=VR.MAX_TOKENS, devices=("cpu",)))  # idempotent: the first wrapper stays
    assert getattr(attn.forward_absorb_core, VR.ORIGINAL_ATTR).__func__ is Attn.forward_absorb_core
    assert VR.unpatch_v_up(mdl) == 2 and wrapped_layers(mdl) == []
    assert attn.forward_absorb_core.__func__ is Attn.forward_absorb_core
    attn.forward_absorb_core(*positional(core_args(2)))
    assert attn.core_calls == 1
    assert VR.unpatch_v_up(mdl) == 0


def test_install_refuses_other_devices_and_dims(monkeypatch):
    monkeypatch.delenv(VR.ENV, raising=False)
    assert VR.module_why_not(Attn(), ("cuda",)) == "w_vc on cpu"
    a = Attn()
    a.kv_lora_rank = 256
    assert "kv_lora_rank / v_head_dim 256 / 256, not 512 / a multiple of 128" in VR.module_why_not(a, ("cpu",))
    a = Attn()
    a.num_local_heads = 8
    assert "not (num_local_heads, kv_lora_rank, v_head_dim) = (8, 512, 256)" in VR.module_why_not(a, ("cpu",))
    for h, v in ((1, 128), (64, 256), (3, 384)):
        assert VR.module_why_not(Attn(h=h, v=v), ("cpu",)) is None, (h, v)
    assert VR.install_v_up(model(), precompile=False) == []  # CPU weights, cuda-only route


@pytest.mark.parametrize("off", ["0", "off", "sglang", "stock", "false", "no", " OFF "])
def test_switch_off_keeps_sglang(monkeypatch, off):
    monkeypatch.setenv(VR.ENV, off)
    mdl = model()
    assert not VR.enabled() and VR.install_v_up(mdl, precompile=False, devices=("cpu",)) == []
    assert wrapped_layers(mdl) == []


def test_default_switch(monkeypatch):
    monkeypatch.delenv(VR.ENV, raising=False)
    assert VR.enabled() is VR.DEFAULT_ON
    monkeypatch.setattr(VR, "DEFAULT_ON", False)
    assert not VR.enabled()
    monkeypatch.setenv(VR.ENV, "1")
    assert VR.enabled()


def test_install_precompiles_the_kernel_and_a_failure_keeps_sglang(monkeypatch, caplog):
    monkeypatch.delenv(VR.ENV, raising=False)
    mod = VR.op_module()
    got = []
    monkeypatch.setattr(mod, "precompile", lambda device=None: got.append(device))
    cuda = torch.device("cuda", 0)
    stand_in = types.SimpleNamespace(w_vc=types.SimpleNamespace(device=cuda), forward_absorb_core=lambda *a: None)
    monkeypatch.setattr(VR, "targets", lambda mdl: [(0, stand_in), (1, stand_in)])
    monkeypatch.setattr(VR, "module_why_not", lambda attn, devices: None)
    assert VR.install_v_up(None) == [0, 1] and got == [cuda]
    VR.unpatch_v_up(None)

    def boom(device=None):
        raise RuntimeError("no nvcc")
    monkeypatch.setattr(mod, "precompile", boom)
    stand_in2 = types.SimpleNamespace(w_vc=types.SimpleNamespace(device=cuda), forward_absorb_core=lambda *a: None)
    monkeypatch.setattr(VR, "targets", lambda mdl: [(0, stand_in2)])
    caplog.set_level(logging.INFO, "glm5_fastpath")
    orig = stand_in2.forward_absorb_core
    assert VR.install_v_up(None) == [] and stand_in2.forward_absorb_core is orig
    assert "V up-projection kernel unavailable (RuntimeError: no nvcc)" in caplog.text


def test_weight_checks_agree_with_the_op():
    """The per-call weight check (cheap attribute reads) accepts what the op's own validation accepts."""
    mv = VR.op_module()
    h = 4
    base = torch.randn(h, V, L).to(BF16)
    layouts = {"sglang": base.transpose(1, 2), "row_major": base.transpose(1, 2).contiguous(),
               "fp8": base.to(FP8).transpose(1, 2), "odd_stride": torch.randn(h, V, L + 4).to(BF16)[:, :, :L]
               .transpose(1, 2), "padded_heads": torch.randn(h, V + 1, L).to(BF16)[:, :V].transpose(1, 2)}
    o = torch.randn(2, h, L).to(BF16)
    for name, w in layouts.items():
        attn = Attn(h=h, w_vc=w)
        try:
            mv._check_inputs(o, w)
            op_ok = True
        except mv.MlaVUpInputError:
            op_ok = False
        assert (VR.weight_why_not(attn, ("cpu",)) is None) == op_ok, name
        assert (VR.module_why_not(attn, ("cpu",)) is None) == op_ok, name


# ---- the real sglang (CPU): its forward_absorb_core against the wrapped one ------------------------------------

_REAL = """
import sys, types, torch
sys.path.insert(0, {here!r})
import test_v_up_route as T
from glm5_fastpath.integrations.sglang import norm_route as NR, v_up_route as VR
from sglang.srt.models.deepseek_common.attention_forward_methods import forward_mla as FM

class Real(FM.DeepseekMLAForwardMixin):
    # the attributes SGLang's forward_absorb_core reads on its DSA decode branch; the methods are the real ones
    # except the two RoPE-fusion checks, which read the global server args (False: bf16 KV, FlashMLA kernels)
    _skip_rope_for_dsa_tilelang_fused = lambda self: False
    _fuse_rope_for_trtllm_mla = lambda self, forward_batch: False

def make(h, nxt):
    a = T.Attn(h=h)
    r = Real.__new__(Real)
    for k in ("num_local_heads", "kv_lora_rank", "v_head_dim", "w_vc", "w_scale", "current_attention_backend",
              "use_deep_gemm_bmm", "o_proj", "mqa_calls"):
        setattr(r, k, getattr(a, k))
    r.attn_mqa = a.attn_mqa  # records into a.mqa_calls (= r.mqa_calls)
    r.next_skip_topk, r.rotary_emb, r.dcp_size, r.use_dsa = nxt, None, 1, True
    r.kv_b_proj = types.SimpleNamespace()
    r.learnable_sink_param = None
    return r

n = 0
for h, t, nxt in ((4, 1, None), (8, 7, True), (4, 64, False)):
    real, ours = make(h, nxt), make(h, nxt)
    route = VR.VUpRoute(limit=VR.MAX_TOKENS, devices=("cpu",), stash=NR.QuantStash())
    VR.wrap_attention(ours, route)
    a = T.core_args(t, h)
    if "fusion_plan" in FM.DeepseekMLAForwardMixin.forward_absorb_core.__code__.co_varnames:
        a["fusion_plan"] = None  # 0.5.23's 10th value
    want = real.forward_absorb_core(*T.positional(a))
    got = ours.forward_absorb_core(*T.positional(a))
    assert route._once == {{("ours", "routed")}}, route._once
    assert len(real.mqa_calls) == len(ours.mqa_calls) == 1
    assert real.mqa_calls[0].keys() == ours.mqa_calls[0].keys(), (real.mqa_calls[0].keys(), ours.mqa_calls[0].keys())
    assert all(real.mqa_calls[0][k] is ours.mqa_calls[0][k] for k in real.mqa_calls[0])
    ok, d = T.within_one_bf16_step(ours.o_proj.inputs[0], real.o_proj.inputs[0])
    assert ok, d
    if nxt is None:
        assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    else:
        assert type(got) is type(want) is tuple and (got[1] is a["topk_indices"]) == (want[1] is a["topk_indices"])
        got, want = got[0], want[0]
    assert (got.float() - want.float()).norm() <= 1e-2 * want.float().norm()
    n += 1
print("OK", n)
"""


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")
def test_real_sglang_core_against_the_route():
    from test_sglang_real import _run

    out = _run(_REAL.format(here=HERE), timeout=400)
    assert "OK 3" in out


SGL_0514 = os.environ.get("GLM5_FASTPATH_SGLANG_0514_SRC")  # an unpacked sglang==0.5.14 wheel (the dir holding sglang/)


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_real_sglang_0514_core_against_the_route():
    from test_prefix_real import _IMPORT_0514, _sglang_0514_path
    from test_sglang_real import _run

    out = _run(_IMPORT_0514 + _REAL.format(here=HERE), {"PYTHONPATH": _sglang_0514_path()}, timeout=400)
    if "IMPORT_FAILED" in out:
        pytest.skip(out.strip())
    assert "OK 3" in out


# ---- GPU: the route with our kernel against cuBLAS ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 33, 64])
def test_gpu_route_matches_cublas_bmm(t):
    """The routed core on an H200 with GLM-5's 64 heads x 256: y within one bf16 step of the float64 bmm and close to
    SGLang's cuBLAS bmm (which may reduce split-K partials in bf16), the handed-on quant bitwise our act quant of y."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    h = 64
    r = VR.VUpRoute(limit=VR.MAX_TOKENS, stash=NR.QuantStash())
    attn, plain = Attn(h=h), Attn(h=h)
    for m in (attn, plain):
        m.w_vc = m.w_vc.cuda()
        m.o_proj.weight = m.o_proj.weight.cuda()
        m.mqa_out = torch.randn(t, h * L, device="cuda").to(BF16)
    plain.w_vc, plain.mqa_out = attn.w_vc, attn.mqa_out
    VR.wrap_attention(attn, r)
    a = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in core_args(t, h).items()}
    attn.forward_absorb_core(*positional(a))
    plain.forward_absorb_core(*positional(a))
    torch.cuda.synchronize()
    assert r._once == {("ours", "routed")}
    y, y_cublas = attn.o_proj.inputs[0], plain.o_proj.inputs[0]
    ref = torch.einsum("thl,hlv->thv", attn.mqa_out.view(t, h, L).double(), attn.w_vc.double()).reshape(t, -1)
    ok, dmax = within_one_bf16_step(y, ref)
    assert ok, f"max |y - float64 bmm| {dmax} beyond one bf16 step"
    from glm5_fastpath.testing.numerics import rel_err

    assert rel_err(y, y_cublas) < 1e-2
    y8, ys = r.stash.take(y)
    a8, as_ = act_quant_fp8(y)
    assert torch.equal(y8.view(torch.uint8), a8.view(torch.uint8)) and torch.equal(ys, as_)


# ---- the W8 form (GLM5_FASTPATH_V_UP_W8=1): W_UV from kv_b_proj's FP8 rows ------------------------------------------

def _with_kv_b(attn, nope=64, seed=0):
    """Give a stand-in layer an FP8 kv_b_proj whose dequantisation (SGLang's) is its w_vc."""
    from glm5_fastpath.ops import mla_v_up as MV

    g = torch.Generator().manual_seed(seed)
    h, v = attn.num_local_heads, attn.w_vc.shape[2]
    rows = h * (nope + v)
    w8 = (torch.randn(rows, L, generator=g) * 3).clamp(-448, 448).to(FP8)
    sc = torch.rand(-(-rows // 128), L // 128, generator=g) * 0.01 + 0.001
    attn.kv_b_proj = types.SimpleNamespace(weight=w8, weight_scale_inv=sc)
    attn.qk_nope_head_dim = nope
    attn.w_vc = MV.dequant_w_vc(w8, sc, h, nope)
    return attn


def test_w8_source_accepts_only_the_exact_source_of_w_vc():
    attn = _with_kv_b(Attn(seed=3))
    src = VR.w8_source(attn)
    assert isinstance(src, tuple) and src[0] is attn.kv_b_proj.weight and src[2] == 64
    other = _with_kv_b(Attn(seed=4), seed=9)
    other.w_vc = other.w_vc.clone().transpose(1, 2).contiguous().transpose(1, 2)
    other.w_vc[0, 0, 0] += 1  # SGLang's w_vc no longer the dequantisation
    assert "not this layer's w_vc" in VR.w8_source(other)
    assert "no kv_b_proj" in VR.w8_source(Attn(seed=5))


def test_w8_install_and_route_give_the_bf16_bits(monkeypatch, caplog):
    monkeypatch.delenv(VR.ENV, raising=False)
    monkeypatch.setenv(VR.ENV_MAX_TOKENS, "64")
    plain = model(n=2)
    w8m = model(n=2)
    for mdl in (plain, w8m):
        for i in (0, 1):
            _with_kv_b(mdl.model.layers[i].self_attn, seed=i)
    w8m.model.layers[1].self_attn.w_vc = plain.model.layers[1].self_attn.w_vc.clone().transpose(1, 2).contiguous()\
        .transpose(1, 2) * 2  # layer 1: kv_b is not its w_vc's source -> bf16 kernel
    monkeypatch.delenv(VR.ENV_W8, raising=False)
    VR.install_v_up(plain, precompile=False, devices=("cpu",))
    monkeypatch.setenv(VR.ENV_W8, "1")
    with caplog.at_level(logging.INFO, logger="glm5_fastpath"):
        VR.install_v_up(w8m, precompile=False, devices=("cpu",))
    assert VR.W8_ATTR in vars(w8m.model.layers[0].self_attn) and VR.W8_ATTR not in vars(w8m.model.layers[1].self_attn)
    assert any("layers 0 read W_UV from kv_b_proj's FP8 rows" in m for m in caplog.messages)
    assert any("layers 1 keep the bf16 w_vc" in m for m in caplog.messages)
    calls = []
    route = vars(w8m.model.layers[0].self_attn)[VR.METHOD].__glm5_fastpath_route__
    orig_w8 = route.run_w8
    route.run_w8 = lambda *a: calls.append(a) or orig_w8(*a)
    a = core_args(5)
    out_w8 = w8m.model.layers[0].self_attn.forward_absorb_core(*positional(a))
    out_bf16 = plain.model.layers[0].self_attn.forward_absorb_core(*positional(a))
    assert len(calls) == 1 and torch.equal(out_w8, out_bf16)
    route.w8_min = 6  # GLM5_FASTPATH_V_UP_W8_MIN_TOKENS=6: 5 tokens take the bf16 kernel, 6 the W8 one
    bf16_calls = []
    orig_run = route.run
    route.run = lambda *a: bf16_calls.append(a) or orig_run(*a)
    assert torch.equal(w8m.model.layers[0].self_attn.forward_absorb_core(*positional(a)), out_bf16)
    assert len(calls) == 1 and len(bf16_calls) == 1
    w8m.model.layers[0].self_attn.forward_absorb_core(*positional(core_args(6)))
    assert len(calls) == 2 and len(bf16_calls) == 1
    assert VR.unpatch_v_up(w8m) == 2 and VR.W8_ATTR not in vars(w8m.model.layers[0].self_attn)


@pytest.mark.parametrize("raw,want", [(None, 1), ("2", 2), ("0", 1), ("999", 65), ("x", 1)])
def test_w8_min_tokens_env(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(VR.ENV_W8_MIN_TOKENS, raising=False)
    else:
        monkeypatch.setenv(VR.ENV_W8_MIN_TOKENS, raw)
    assert VR.w8_min_tokens() == want and VR.VUpRoute().w8_min == want
