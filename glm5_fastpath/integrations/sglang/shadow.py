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
    output (the model evolves as stock). `records` gets one dict per call."""

    def __init__(self, executor: Callable, records: list | None = None, tol: float = MOE_TOL) -> None:
        self.ex, self.records, self.tol = executor, ([] if records is None else records), tol

    def __call__(self, original: Callable, *args, **kwargs):
        import torch

        from ...testing.numerics import rel_err
        h = args[0] if args else kwargs["hidden_states"]
        h0 = h.clone()
        mlp = original.__self__
        ours = self.ex(original, *args, **kwargs)
        if h.is_cuda:
            torch.cuda.synchronize(h.device)
        stock = (original(h0.clone(), *args[1:], **kwargs) if args
                 else original(**{**kwargs, "hidden_states": h0.clone()}))
        # what THIS call did: the executor notes (route, reason) per call; "megamoe" (routed / rebound) = ours ran
        last = getattr(self.ex, "last_call", None)
        routed = last is not None and last[0] == "megamoe"
        rec = {"layer": int(getattr(mlp, "layer_id", -1)), "M": int(h.shape[0]),
               "route": "megamoe" if routed else f"stock: {last[1] if last else 'unknown'}",
               "rel_err": rel_err(ours.float(), stock.float()), "stock_abs_mean": float(stock.float().abs().mean())}
        rec["passed"] = routed and rec["rel_err"] <= self.tol
        self.records.append(rec)
        return stock


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
