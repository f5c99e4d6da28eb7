"""integrations/sglang/shadow.py on CPU: GLM5_FASTPATH_SHADOW_CHECK parsing; the wrapper sends the first N eager
calls through the check (which returns SGLang's result and records the comparison, logged), later calls and calls
under CUDA-graph capture to our route; install wraps both executor families once and restores nothing it should
not; MoECheck compares our MoE output with the original's on the same hidden states."""
from __future__ import annotations

import logging
import types

import pytest
import torch

from glm5_fastpath.integrations.sglang import moe_executor as ME
from glm5_fastpath.integrations.sglang import patch
from glm5_fastpath.integrations.sglang import shadow as SH


def test_count(monkeypatch, caplog):
    monkeypatch.delenv(SH.ENV, raising=False)
    assert SH.count() == 0
    monkeypatch.setenv(SH.ENV, "12")
    assert SH.count() == 12
    monkeypatch.setenv(SH.ENV, "x")
    with caplog.at_level(logging.WARNING, "glm5_fastpath"):
        assert SH.count() == 0
    assert "not a count" in caplog.text


class _Check:
    def __init__(self):
        self.records = []

    def __call__(self, original, *a, **k):
        self.records.append({"layer": 3, "rel_err": 0.01, "passed": True})
        return ("stock", original(*a, **k))


def test_first_n_eager_calls_go_through_the_check(monkeypatch, caplog):
    inner_calls = []

    def inner(original, *a, **k):
        inner_calls.append(a)
        return "ours"
    chk = _Check()
    w = SH.Shadow("moe", inner, chk, 2)
    caplog.set_level(logging.WARNING, "glm5_fastpath")
    assert w(lambda x: x * 2, 5) == ("stock", 10)
    assert w(lambda x: x * 2, 6) == ("stock", 12)
    assert w(lambda x: x * 2, 7) == "ours" and inner_calls == [(7,)]
    assert len(chk.records) == 2 and caplog.text.count("shadow check moe:") == 2
    assert '"passed": true, "rel_err": 0.01' in caplog.text  # one sorted JSON object per record
    w2 = SH.Shadow("prefix", inner, _Check(), 5)
    monkeypatch.setattr(SH, "_capturing", lambda: True)
    assert w2(lambda x: x, 1) == "ours" and w2.left == 5  # under capture: our route, budget kept


def test_install_wraps_both_families_once(monkeypatch):
    saved = {c: dict(v) for c, v in patch.EXECUTORS.items()}
    try:
        assert SH.install(n=0) == {}
        monkeypatch.setattr("glm5_fastpath.integrations.sglang.prefix_check.PrefixCheck",
                            lambda ex: types.SimpleNamespace(records=[], ex=ex))
        ws = SH.install(n=3)
        assert set(ws) == {"prefix", "moe"} and patch.EXECUTORS["prefix"]["cmp"] is ws["prefix"]
        assert ws["moe"].inner is saved["moe"]["megamoe"] and isinstance(ws["moe"].check, SH.MoECheck)
        assert SH.install(n=3) == {}  # already wrapped
    finally:
        for c, v in saved.items():
            patch.EXECUTORS[c].clear()
            patch.EXECUTORS[c].update(v)


def test_moe_check_compares_on_the_same_hidden_states():
    class MLP:
        layer_id = 4

        def forward(self, hidden_states, forward_batch=None):
            return hidden_states * 2.0
    mlp = MLP()
    mlp.__dict__[ME.STATE] = types.SimpleNamespace(refusal=None)

    class Ours:  # the executor notes what each call did (moe_executor.MoEExecutor.last_call)
        outcome = ("megamoe", "routed")

        def __call__(self, original, h, fb=None):
            self.last_call = None
            h.mul_(0)  # an executor may consume its input in place: the check must keep a copy for the original
            self.last_call = self.outcome
            return torch.full((2, 4), 2.02) if self.outcome[0] == "megamoe" else original(h, fb)
    ours = Ours()
    chk = SH.MoECheck(ours)
    out = chk(mlp.forward, torch.ones(2, 4), None)
    assert torch.equal(out, torch.full((2, 4), 2.0))  # the original's result on the untouched input
    rec = chk.records[0]
    assert rec["layer"] == 4 and rec["M"] == 2 and rec["route"] == "megamoe"
    assert rec["rel_err"] == pytest.approx(0.01, rel=1e-3) and rec["passed"]
    ours.outcome = ("stock", "topk_format")  # this call fell back: it must not count as a passing MegaMoE call
    chk(mlp.forward, torch.ones(2, 4), None)
    assert chk.records[1]["route"] == "stock: topk_format" and not chk.records[1]["passed"]


def test_capture_mode_of_sglang_counts_as_capturing(monkeypatch):
    """SGLang's warm-up runs before a graph capture are not stream-capturing but in its capture mode: skipped too."""
    import sys

    mod = types.ModuleType("sglang.srt.model_executor.runner_utils.capture_mode")
    mod.get_is_capture_mode = lambda: True
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert SH._capturing()
    mod.get_is_capture_mode = lambda: False
    assert not SH._capturing()


class _RoutedMLP:
    """A toy MoE layer: SGLang-like gate (logits rounded to bf16, as F.linear on bf16 in 0.5.14) + sigmoid/bias
    top-k; the 'experts' output sum(weight * (expert id + 1)) per token, so one different expert moves it a lot."""
    layer_id = 2

    def __init__(self, w, bias, k):
        self.k = k
        mlp = self

        class Gate:
            weight, e_score_correction_bias = w, bias

            def __call__(self, h):
                return (h.float() @ w.float().t()).to(torch.bfloat16)
        self.gate = Gate()

        def topk(h, logits):
            choice = torch.sigmoid(logits.float()) + bias
            ids = torch.topk(choice, mlp.k, dim=1).indices
            wts = torch.sigmoid(logits.float()).gather(1, ids)
            return types.SimpleNamespace(topk_ids=ids.int(), topk_weights=wts / wts.sum(1, keepdim=True))
        self.topk = topk

    @staticmethod
    def experts(ids, wts):
        return (wts * (ids.float() + 1)).sum(1, keepdim=True).expand(-1, 4).clone()

    def forward(self, hidden_states, forward_batch=None):
        t = self.topk(hidden_states, self.gate(hidden_states))
        return self.experts(t.topk_ids, t.topk_weights)


class _Fp32Router:
    """Our executor stand-in: the float32 (unrounded) router, exposing last_call / last_routing / run(routing=)."""

    def __init__(self, kernel_err=0.0):
        self.kernel_err = kernel_err

    def __call__(self, original, h, fb=None):
        mlp = original.__self__
        choice = torch.sigmoid(h.double() @ mlp.gate.weight.double().t()) + mlp.gate.e_score_correction_bias
        ids = torch.topk(choice, mlp.k, dim=1).indices
        s = torch.sigmoid(h.double() @ mlp.gate.weight.double().t()).gather(1, ids).float()
        self.last_routing = (ids.int(), s / s.sum(1, keepdim=True))
        self.last_call = ("megamoe", "routed")
        return self.run(mlp, None, h, routing=self.last_routing)

    def run(self, mlp, route, h, routing=None):
        return _RoutedMLP.experts(*routing) * (1 + self.kernel_err)


def _near_tie_case(k=4, E=16, H=64):
    """Hidden states + gate where the k-th and (k+1)-th scores differ by less than the bf16 logit step: the
    bf16-rounded router and the float32 one choose different experts."""
    g = torch.Generator().manual_seed(0)
    for _ in range(2000):
        w = torch.randn(E, H, generator=g).to(torch.bfloat16)
        h = torch.randn(1, H, generator=g).to(torch.bfloat16)
        bias = torch.zeros(E)
        exact = torch.sigmoid(h.double() @ w.double().t())
        rounded = torch.sigmoid((h.float() @ w.float().t()).to(torch.bfloat16).float())
        if not torch.equal(exact.topk(k).indices.sort().values, rounded.topk(k).indices.sort().values):
            return w, bias, h
    pytest.skip("no near tie found")


def test_moe_check_explains_an_expert_flip_by_the_stock_router_rounding():
    w, bias, h = _near_tie_case()
    mlp = _RoutedMLP(w, bias, 4)
    chk = SH.MoECheck(_Fp32Router(), tol=0.03)
    with ME_STATE(mlp):
        chk(mlp.forward, h, None)
    rec = chk.records[0]
    assert rec["topk_equal"] is False and rec["rows_differing"] == 1
    assert rec["rel_err"] > 0.03  # one different expert: far above the tolerance
    assert rec["rel_err_stock_routing"] == pytest.approx(0.0, abs=1e-6)  # same routing -> same experts' output
    assert rec["topk_ours_is_fp64"] and not rec["topk_stock_is_fp64"]
    assert 0 <= rec["kth_margin_fp64"] < 0.05 and rec["passed"]


def test_moe_check_fails_a_kernel_error_even_when_routing_differs():
    w, bias, h = _near_tie_case()
    mlp = _RoutedMLP(w, bias, 4)
    chk = SH.MoECheck(_Fp32Router(kernel_err=0.1), tol=0.03)
    with ME_STATE(mlp):
        chk(mlp.forward, h, None)
    rec = chk.records[0]
    assert rec["rel_err_stock_routing"] > 0.03 and not rec["passed"]


def test_moe_check_fails_a_flip_where_our_choice_is_not_the_exact_one():
    """An expert set that is neither SGLang's nor the float64 one is a router bug, even when the experts' kernels
    agree on SGLang's routing: the check must fail it."""
    w, bias, h = _near_tie_case()
    mlp = _RoutedMLP(w, bias, 4)

    class WrongRouter(_Fp32Router):
        def __call__(self, original, hh, fb=None):
            out = super().__call__(original, hh, fb)
            ids, wts = self.last_routing
            bad = ids.clone()
            bad[:, -1] = (set(range(16)) - set(ids[0].tolist())).pop()  # a clearly wrong last expert
            self.last_routing = (bad, wts)
            return self.run(mlp, None, hh, routing=self.last_routing)
    chk = SH.MoECheck(WrongRouter(), tol=0.03)
    with ME_STATE(mlp):
        chk(mlp.forward, h, None)
    rec = chk.records[0]
    assert rec["topk_equal"] is False and rec["rel_err_stock_routing"] == pytest.approx(0.0, abs=1e-6)
    assert not rec["topk_ours_is_fp64"] and not rec["passed"]


def test_moe_check_survives_a_failing_stock_rerun():
    """A diagnostic must not take the step down: the stock re-run raising is recorded and ours handed on."""
    class MLP:
        layer_id = 5

        def forward(self, hidden_states, forward_batch=None):
            raise RuntimeError("stock exploded")
    mlp = MLP()

    def ours(original, h, fb=None):
        ours.last_call = ("megamoe", "routed")
        return h * 3
    chk = SH.MoECheck(ours)
    out = chk(mlp.forward, torch.ones(2, 4), None)
    assert torch.equal(out, torch.full((2, 4), 3.0))
    assert chk.records[0]["passed"] is False and "stock exploded" in chk.records[0]["check_error"]


class ME_STATE:
    """mlp.__dict__[moe_executor.STATE] set for the duration (MoECheck reads the layer's route from there)."""

    def __init__(self, mlp):
        self.mlp = mlp

    def __enter__(self):
        self.mlp.__dict__[ME.STATE] = object()

    def __exit__(self, *a):
        self.mlp.__dict__.pop(ME.STATE, None)
