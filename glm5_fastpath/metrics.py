"""glm5_fastpath_* Prometheus metrics, created lazily in the SGLang scheduler process.

| metric | type | labels | meaning |
|---|---|---|---|
| glm5_fastpath_decode_step_seconds | histogram | bucket, path | wall time of one decode forward pass (model_runner.forward), per token bucket and path (fast / stock) |
| glm5_fastpath_path_total | counter | path, reason | forward passes by path and reason (fast path vs the reason for SGLang's path) |
| glm5_fastpath_selected_info | gauge (=1) | bucket, prefix, moe | the selection table in force: executor / MoE config per bucket |
| glm5_fastpath_jit_compile_seconds | histogram | kernel | time to compile (or load from the cache) each kernel at install |
| glm5_fastpath_prefix_layer_total | counter | route, reason | attention-prefix seam calls by route (full / partial / shared / stock) and reason |
| glm5_fastpath_moe_layer_total | counter | route, reason | MoE layer calls by route (megamoe / stock) and reason |

Multiprocess mode: SGLang's `--enable-metrics` sets PROMETHEUS_MULTIPROC_DIR before it spawns the
scheduler, so prometheus_client (imported here only when the first metric is created, inside the
scheduler) writes these metrics to that directory and SGLang's `/metrics` endpoint aggregates them
with its own. Nothing here imports prometheus_client at module import time: importing it in the
launcher before SGLang sets the directory would put the launcher's own metrics in single-process mode.
The info gauge uses multiprocess_mode="livemax" (Info/Enum metrics are not supported in that mode).
Without --enable-metrics the metrics still exist in the scheduler's default registry, unexported.
Pass `registry=` for tests (a fresh CollectorRegistry).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

PREFIX = "glm5_fastpath_"
DECODE_STEP = PREFIX + "decode_step_seconds"
PATH_TOTAL = PREFIX + "path_total"
SELECTED_INFO = PREFIX + "selected_info"
JIT_COMPILE = PREFIX + "jit_compile_seconds"
# created by seam_counter from integrations/sglang/{prefix,moe}_executor.layer_counter (per layer seam call, host side)
PREFIX_LAYER_TOTAL = PREFIX + "prefix_layer_total"
MOE_LAYER_TOTAL = PREFIX + "moe_layer_total"
SPARSE_MLA_TOTAL = PREFIX + "sparse_mla_total"
FP8_LINEAR_TOTAL = PREFIX + "fp8_linear_total"  # integrations/sglang/linear_route (o_proj, dense MLP)
NORM_TOTAL = PREFIX + "norm_total"  # integrations/sglang/norm_route (add + RMSNorm in front of the prefix / MoE)
V_UP_TOTAL = PREFIX + "v_up_total"  # integrations/sglang/v_up_route (W_UV bmm after the sparse-MLA core)

# name -> (type, labels): the dashboard test checks panel queries against this table
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    DECODE_STEP: ("histogram", ("bucket", "path")),
    PATH_TOTAL: ("counter", ("path", "reason")),
    SELECTED_INFO: ("gauge", ("bucket", "prefix", "moe")),
    JIT_COMPILE: ("histogram", ("kernel",)),
    PREFIX_LAYER_TOTAL: ("counter", ("route", "reason")),
    MOE_LAYER_TOTAL: ("counter", ("route", "reason")),
    SPARSE_MLA_TOTAL: ("counter", ("route", "reason")),
    FP8_LINEAR_TOTAL: ("counter", ("route", "reason")),
    NORM_TOTAL: ("counter", ("route", "reason")),
    V_UP_TOTAL: ("counter", ("route", "reason")),
}

_seam_counters: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_seam_lock = threading.Lock()


def seam_counter(registry: Any, name: str, doc: str) -> Any:
    """A {route, reason} Counter `name` (ending in _total) on `registry`, created once per registry: the per-layer
    seam counters of integrations/sglang/{prefix,moe}_executor (executors may be replaced; the counter stays)."""
    with _seam_lock:
        per = _seam_counters.setdefault(registry, {})
        c = per.get(name)
        if c is None:
            from prometheus_client import Counter

            c = per[name] = Counter(name[: -len("_total")], doc, ["route", "reason"], registry=registry)
        return c


STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
JIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class FastpathMetrics:
    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.decode_step = Histogram(DECODE_STEP, "Wall time of one decode forward pass by token bucket and path.",
                                     ["bucket", "path"], buckets=STEP_BUCKETS, registry=reg)
        # Counter names are given without _total; prometheus_client appends it.
        self.path = Counter(PATH_TOTAL[: -len("_total")], "Forward passes by path (fast / stock) and reason.",
                            ["path", "reason"], registry=reg)
        self.selected = Gauge(SELECTED_INFO, "Selection table in force: 1 per bucket with its prefix executor and MoE config.",
                              ["bucket", "prefix", "moe"], registry=reg, multiprocess_mode="livemax")
        self.jit = Histogram(JIT_COMPILE, "Kernel compile-or-load time at plugin install.", ["kernel"],
                             buckets=JIT_BUCKETS, registry=reg)

    def observe_step(self, bucket: str, path: str, seconds: float) -> None:
        self.decode_step.labels(bucket=bucket, path=path).observe(seconds)

    def count_path(self, path: str, reason: str, n: int = 1) -> None:
        self.path.labels(path=path, reason=reason).inc(n)

    def set_selected(self, rows: Iterable[tuple[int | str, str, str]]) -> None:
        """rows: (bucket, prefix actually used, moe actually used); replaces the previous table."""
        self.selected.clear()
        for bucket, prefix, moe in rows:
            self.selected.labels(bucket=str(bucket), prefix=prefix, moe=moe).set(1)

    def observe_jit(self, kernel: str, seconds: float) -> None:
        self.jit.labels(kernel=kernel).observe(seconds)


_lock = threading.Lock()
_default: FastpathMetrics | None = None


def get_metrics(registry: Any = None) -> FastpathMetrics:
    """The process-wide metrics on the default registry (created on first call), or fresh ones on `registry`."""
    global _default
    if registry is not None:
        return FastpathMetrics(registry)
    with _lock:
        if _default is None:
            _default = FastpathMetrics()
        return _default
