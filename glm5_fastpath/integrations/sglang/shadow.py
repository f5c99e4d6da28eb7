"""Shadow check inside a serving engine: each routed layer runs ours AND SGLang's original on the same inputs,
logs the comparison, and hands SGLang's result on (diagnostics; eager decode only).

Why: the engine's greedy tokens diverge from stock's early with realistic dummy weights
(benchmarks/results/2026-11-30_h200_session6, section 2), and whole-run comparisons cannot tell rounding noise
amplified over 8 layers from a wrong route. Here each checked call compares ours and SGLang's on the same inputs
and hands SGLang's result on, so the prefix / MoE differences do not compound: a route that computes something
else shows at its own layer. (The sparse-MLA route still returns ours, and the budgets run out at different steps,
so the run's tokens are a hybrid: compare the check lines, not the tokens.)

GLM5_FASTPATH_SHADOW_CHECK=N (install_model reads it): the first N routed prefix calls and the first N routed MoE
calls that are not being captured into a CUDA graph go through
- prefix_check.PrefixCheck: q_pe, k_pe, q_nope_out, k_nope (relative error), the top-k (set overlap), the index-K
  entries and the latent-KV bytes, against forward_absorb_prepare's original;
- MoECheck: our MoE output against the MoE layer's original forward (relative error);
each logged as one "glm5_fastpath: shadow check <kind>: {...}" JSON line (warning level: the plugin's handler
shows it even when the offline Engine logs at error). Calls past N, and every call under capture, run our route as usual.
Needs an eager engine (`--engine-arg disable_cuda_graph=true` in bench offline) to see decode steps at all.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_SHADOW_CHECK"
MOE_TOL = 3e-2  # MegaMoE vs SGLang's MoE on the same FP8 weights: accumulation order, bf16 / FP8 rounding points


def env_count(name: str, log: logging.Logger = logger) -> int:
    """A diagnostics budget from the environment: a count >= 0, 0 when unset; anything else logged and 0 (off).
    Shared by this module and the sparse-MLA route's check mode (attn_core.check_count)."""
    v = os.environ.get(name, "").strip()
    if not v:
        return 0
    try:
        return max(0, int(v))
    except ValueError:
        log.warning("glm5_fastpath: %s=%r is not a count; that check is off", name, v)
        return 0


def count(log: logging.Logger = logger) -> int:
    return env_count(ENV, log)


def _capturing() -> bool:
    """Inside a CUDA-graph capture, or SGLang's capture-mode warm-up runs before it (get_is_capture_mode)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return True
    except Exception:  # noqa: BLE001
        return False
    for mod in ("sglang.srt.model_executor.runner_utils.capture_mode",  # 0.5.14
                "sglang.srt.model_executor.cuda_graph_runner"):                # older layouts
        try:
            import importlib

            f = getattr(importlib.import_module(mod), "get_is_capture_mode", None)
            if f is not None and f():
                return True
        except Exception:  # noqa: BLE001 - another release: the stream check above is the guard
            continue
    return False


def _emit(kind: str, rec: dict, log: logging.Logger) -> None:
    log.warning("glm5_fastpath: shadow check %s: %s", kind, json.dumps(rec, default=str, sort_keys=True))


class MoECheck:
    """Our MoE route and the MoE layer's original forward on the same hidden states; returns the original's
    output (the model evolves as stock). `records` gets one dict per call.

    A relative error far above FP8 noise (~0.3) is what ONE different expert among the top 8 gives, so where the
    executor exposes its routing (MoEExecutor.last_routing / run(routing=)) the record also says why:
    - topk_equal: our expert set equals SGLang's for every token;
    - where it does not, rel_err_stock_routing: MegaMoE re-run on SGLang's own ids and weights (kernel error
      alone), and the float64 router's choice (topk_ours_is_fp64 / topk_stock_is_fp64) with the margin between
      the k-th and (k+1)-th biased scores (kth_margin_fp64): SGLang 0.5.14 rounds the router logits to bf16 at
      hidden 6144 (F.linear), ours keeps fp32, so near-ties may fall either way.
    passed = routed and (rel_err <= tol, or the kernels agree on SGLang's routing and our choice is the float64 one).
    """

    def __init__(self, executor: Callable, records: list | None = None, tol: float = MOE_TOL) -> None:
        self.ex, self.records, self.tol = executor, ([] if records is None else records), tol

    def __call__(self, original: Callable, *args, **kwargs):
        from ...testing.numerics import rel_err
        h = args[0] if args else kwargs["hidden_states"]
        h0 = h.clone()
        mlp = original.__self__
        ours = self.ex(original, *args, **kwargs)
        routing = getattr(self.ex, "last_routing", None)
        routing = tuple(t.clone() for t in routing) if routing is not None else None
        # what THIS call did: the executor notes (route, reason) per call; "megamoe" (routed / rebound) = ours ran
        last = getattr(self.ex, "last_call", None)
        routed = last is not None and last[0] == "megamoe"
        rec = {"layer": int(getattr(mlp, "layer_id", -1)), "M": int(h.shape[0]),
               "route": "megamoe" if routed else f"stock: {last[1] if last else 'unknown'}"}
        try:  # the original gets its own copy: it may work in place, and h0 is read again by _explain
            stock = (original(h0.clone(), *args[1:], **kwargs) if args
                     else original(**{**kwargs, "hidden_states": h0.clone()}))
            rec.update(rel_err=rel_err(ours.float(), stock.float()), stock_abs_mean=float(stock.float().abs().mean()))
        except Exception as e:  # noqa: BLE001 - a diagnostic must not take the step down: hand ours on
            rec.update(check_error=f"{type(e).__name__}: {e}", passed=False)
            self.records.append(rec)
            return ours
        ok = rec["rel_err"] <= self.tol
        if routed and routing is not None:
            try:
                ok = self._explain(rec, mlp, h0, routing, stock) or ok
            except Exception as e:  # noqa: BLE001 - the diagnosis is extra: keep the plain comparison
                rec["routing_check_error"] = f"{type(e).__name__}: {e}"
        rec["passed"] = routed and ok
        self.records.append(rec)
        return stock

    def _explain(self, rec: dict, mlp: Any, h0: Any, routing: tuple, stock: Any) -> bool:
        """Fill the routing fields of `rec`; True when a failure is explained as a near-tie expert flip."""
        import torch

        from ...testing.numerics import rel_err
        from .moe_executor import STATE
        ids_o, _ = routing
        k = ids_o.shape[1]
        logits = mlp.gate(h0.clone())
        topk = mlp.topk(h0.clone(), logits)
        ids_s, wts_s = topk.topk_ids[:, :k], topk.topk_weights[:, :k]
        same = lambda a, b: bool(torch.equal(a.sort(dim=1).values, b.sort(dim=1).values))  # noqa: E731
        rec["topk_equal"] = same(ids_o.long(), ids_s.long())
        if rec["topk_equal"]:
            return False
        again = self.ex.run(mlp, mlp.__dict__[STATE], h0.clone(), routing=(ids_s, wts_s))
        rec["rel_err_stock_routing"] = rel_err(again.float(), stock.float())
        w, b = mlp.gate.weight.double(), mlp.gate.e_score_correction_bias.double()
        choice = torch.sigmoid(h0.double() @ w.t()) + b
        top = torch.topk(choice, k + 1, dim=1)
        ids_ref = top.indices[:, :k]
        rec["topk_ours_is_fp64"] = same(ids_o.long(), ids_ref)
        rec["topk_stock_is_fp64"] = same(ids_s.long(), ids_ref)
        differ = (ids_o.long().sort(dim=1).values != ids_s.long().sort(dim=1).values).any(dim=1)
        rec["rows_differing"] = int(differ.sum())
        # the margin of the rows whose choices differ (a near tie there is what a rounding flip needs)
        rec["kth_margin_fp64"] = float((top.values[:, k - 1] - top.values[:, k])[differ].min())
        return rec["rel_err_stock_routing"] <= self.tol and rec["topk_ours_is_fp64"]


class Shadow:
    """Wraps one EXECUTORS entry: the first `left` eager calls go through `check`, the rest to `inner`."""

    def __init__(self, kind: str, inner: Callable, check: Any, left: int, log: logging.Logger = logger) -> None:
        self.kind, self.inner, self.check, self.left, self.log = kind, inner, check, left, log

    def __call__(self, original: Callable, *args, **kwargs):
        if self.left <= 0 or _capturing():
            return self.inner(original, *args, **kwargs)
        self.left -= 1
        n = len(self.check.records)
        out = self.check(original, *args, **kwargs)
        for rec in self.check.records[n:]:
            _emit(self.kind, rec, self.log)
        return out


def install(n: int | None = None, log: logging.Logger = logger) -> dict[str, Shadow]:
    """Wrap patch.EXECUTORS["prefix"]["cmp"] and ["moe"]["megamoe"] when GLM5_FASTPATH_SHADOW_CHECK (or n) > 0;
    idempotent. Returns the wrappers installed (empty when off)."""
    from . import moe_executor as ME
    from . import patch
    from . import prefix_executor as PE
    from .prefix_check import PrefixCheck

    n = count(log) if n is None else n
    if n <= 0:
        return {}
    out: dict[str, Shadow] = {}
    for comp, fam, make in (("prefix", "cmp", lambda: PrefixCheck(PE.default_executor())),
                            ("moe", "megamoe", lambda: MoECheck(ME.default_executor()))):
        cur = patch.EXECUTORS.get(comp, {}).get(fam)
        if cur is None or isinstance(cur, Shadow):
            continue
        out[comp] = patch.EXECUTORS[comp][fam] = Shadow(comp, cur, make(), n, log)
    log.warning("glm5_fastpath: shadow check on (%s=%d): the first %d eager routed calls per seam run ours AND "
                "SGLang's original and hand SGLang's result on (diagnostics: the run's tokens are not ours)", ENV, n, n)
    return out
