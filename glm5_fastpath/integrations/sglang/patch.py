"""The per-layer patching step: instance-level wrappers around SGLang's per-layer seams.

Seams (SGLang 0.5.23, spec/sglang_integration.md section 7; 0.5.14 has the same names):
  prefix  layer.self_attn.forward_absorb_prepare(positions, hidden_states, forward_batch, ...)
  moe     layer.mlp.forward(hidden_states, forward_batch=None, ...)        (DeepseekV2MoE layers only)
  step    model_runner.forward(forward_batch, ...)                          (metrics: path counts, step time)

Each wrapper asks the Router for this call's route (host-side, from the forward mode and the token
count, so a captured decode graph bakes one bucket) and then calls the executor registered for the
route, or SGLang's ORIGINAL bound method. Registered: EXECUTORS["prefix"]["cmp"], the prefix route of
prefix_executor.py (our ops compute forward_absorb_prepare's tuple), and EXECUTORS["moe"]["megamoe"], the
MoE route of moe_executor.py (SGLang's router, MegaMoE for the experts); both fall back to the original
per layer / per call, logged once per reason. The wrappers are set as instance attributes and `unpatch` restores them.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable

from .decision import (OnceLog, StepRoute, component_log_line, executor_family, prefill_moe_max_tokens, route_step,
                       step_log_line)

logger = logging.getLogger("glm5_fastpath")

ORIGINAL_ATTR = "__glm5_fastpath_original__"


def _run_prefix_cmp(original: Callable[..., Any], *args, **kwargs):
    """EXECUTORS["prefix"]["cmp"]: imports the executor (torch, the op graph) on the first routed call only."""
    from .prefix_executor import run_cmp

    return run_cmp(original, *args, **kwargs)


def _run_moe_megamoe(original: Callable[..., Any], *args, **kwargs):
    """EXECUTORS["moe"]["megamoe"]: imports MegaMoE (torch) on the first routed call only."""
    from .moe_executor import run_megamoe

    return run_megamoe(original, *args, **kwargs)


# component -> executor family -> fn(original, *args, **kwargs); decision.BUILT_* lists the same names.
# A MoE table entry "megamoe:<config>" runs family "megamoe" (the executor reads the config from the table).
EXECUTORS: dict[str, dict[str, Callable[..., Any]]] = {"prefix": {"cmp": _run_prefix_cmp},
                                                       "moe": {"megamoe": _run_moe_megamoe}}


class Router:
    """Per-process routing state: the selection table, the once-per-reason log, the metrics (optional)."""

    def __init__(self, table, metrics=None, log: logging.Logger = logger, prefill_moe_max: int | None = None) -> None:
        self.table, self.metrics, self.log, self.once = table, metrics, log, OnceLog()
        # MoE of prefill / extend passes up to this many tokens -> MegaMoE (decision.prefill_moe_max_tokens; opt-in, 0: off).
        # install sets it to 0 when no MoE layer was prepared for MegaMoE.
        self.prefill_moe_max = prefill_moe_max_tokens() if prefill_moe_max is None else prefill_moe_max

    def route(self, component: str, mode_name: str | None, m: int) -> StepRoute:
        # only the MoE seam takes the prefill route: the step metric and the prefix keep the plain decision
        r = route_step(mode_name, m, table=self.table,
                       prefill_moe_max=self.prefill_moe_max if component == "moe" else 0)
        key = r.bucket if r.bucket is not None else r.mode
        if self.once.first(component, key, r.reason):
            self.log.info(step_log_line(r) if component == "step" else component_log_line(component, r))
        return r


def _mode_name(fb: Any) -> str | None:
    mode = getattr(fb, "forward_mode", None)
    return getattr(mode, "name", None) if mode is not None else None


def _num_tokens(h: Any) -> int:
    if isinstance(h, (tuple, list)):  # (fp8, scale[, bf16]) attention input
        h = h[0]
    shape = getattr(h, "shape", None)
    return int(shape[0]) if shape else 0


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def wrap_component(obj: Any, method: str, component: str, router: Router, hidden_index: int, fb_index: int) -> None:
    original = getattr(obj, method)

    def wrapper(*args, **kwargs):
        fb = _arg(args, kwargs, fb_index, "forward_batch")
        r = router.route(component, _mode_name(fb), _num_tokens(_arg(args, kwargs, hidden_index, "hidden_states")))
        impl = r.prefix if component == "prefix" else r.moe
        fn = EXECUTORS[component].get(executor_family(impl))
        if fn is None:
            return original(*args, **kwargs)
        return fn(original, *args, **kwargs)

    setattr(wrapper, ORIGINAL_ATTR, original)
    setattr(obj, method, wrapper)


def decoder_layers(model: Any) -> list:
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []) or [])


def patch_layers(model: Any, router: Router) -> dict[str, int]:
    """Wrap every layer's prefix and MoE seam; returns counts {"prefix": n, "moe": n}."""
    n = {"prefix": 0, "moe": 0}
    for layer in decoder_layers(model):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and callable(getattr(attn, "forward_absorb_prepare", None)):
            wrap_component(attn, "forward_absorb_prepare", "prefix", router, hidden_index=1, fb_index=2)
            n["prefix"] += 1
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts") and hasattr(mlp, "gate"):  # DeepseekV2MoE, not the dense MLP
            wrap_component(mlp, "forward", "moe", router, hidden_index=0, fb_index=1)
            n["moe"] += 1
    return n


class StepTimer:
    """Times decode forward passes without a host sync: CUDA events are queued and read once complete.

    `event_factory()` returns an object with record() / query() / elapsed_time(other) in ms
    (torch.cuda.Event(enable_timing=True)); None = host wall clock (CPU tests, non-CUDA devices).
    """

    MAX_PENDING = 256

    def __init__(self, metrics, event_factory: Callable[[], Any] | None = None) -> None:
        self.metrics, self.event_factory = metrics, event_factory
        self.pending: collections.deque = collections.deque()

    def start(self):
        if self.event_factory is None:
            return time.perf_counter()
        ev = self.event_factory()
        ev.record()
        return ev

    def stop(self, token, bucket: str, path: str) -> None:
        if self.event_factory is None:
            self.metrics.observe_step(bucket, path, time.perf_counter() - token)
            return
        end = self.event_factory()
        end.record()
        if len(self.pending) >= self.MAX_PENDING:
            self.pending.popleft()
        self.pending.append((token, end, bucket, path))

    def drain(self) -> None:
        while self.pending and self.pending[0][1].query():
            s, e, bucket, path = self.pending.popleft()
            self.metrics.observe_step(bucket, path, s.elapsed_time(e) / 1e3)


def patch_step(model_runner: Any, router: Router, timer: StepTimer | None) -> None:
    """Wrap model_runner.forward: count every pass by path/reason, time decode passes."""
    original = model_runner.forward

    def forward(forward_batch, *args, **kwargs):
        r = router.route("step", _mode_name(forward_batch), int(getattr(forward_batch, "batch_size", 0) or 0))
        if router.metrics is not None:
            router.metrics.count_path(r.path, r.reason)
        if timer is None or r.mode != "decode":
            return original(forward_batch, *args, **kwargs)
        timer.drain()
        tok = timer.start()
        out = original(forward_batch, *args, **kwargs)
        timer.stop(tok, r.bucket_label, r.path)
        return out

    setattr(forward, ORIGINAL_ATTR, original)
    model_runner.forward = forward


def unpatch(obj: Any, method: str) -> bool:
    fn = obj.__dict__.get(method) if hasattr(obj, "__dict__") else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    if original is None:
        return False
    delattr(obj, method)  # the instance attribute goes; the class method shows through again
    return True
