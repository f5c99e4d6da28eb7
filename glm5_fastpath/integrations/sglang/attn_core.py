"""The sparse-MLA route: SGLang's DSA attention core for small token counts computed by our split-KV kernel.

Why: on an H200 (SGLang 0.5.14, bf16 KV cache, flashmla_sparse decode backend) FlashMLA's sparse kernel takes
~60 us per layer at every decode batch from 1 to 64 tokens (benchmarks/results/2026-11-29_h200_session4): it
walks a token's 2048 selected KV slots with one CTA per (token, 64 heads), so at 1-16 tokens a few SMs work.
At batch 1 that is 0.48 ms of a 2.63 ms step. glm5_fastpath.ops.sparse_mla spreads the slots over many CTAs
(split-KV + a combine kernel).

Seam: `DeepseekSparseAttnBackend._forward_flashmla_sparse(self, q_all, kv_cache, v_head_dim, page_table_1,
sm_scale, [topk_length, attn_sink])` (sglang.srt.layers.attention.dsa_backend, 0.5.14 and 0.5.23): one call per
layer with q [T, H, 576] bf16, the layer's MLA key buffer, the [T, topk] int32 slot table (-1 = unused); it
returns o [T, H, 512]. The attention backend is built after the model loads (after our install), so the
method is wrapped on the CLASS, once per process; `unpatch_sparse_mla()` restores it.

ON by default since its GPU tests passed on an H200 and the engine run kept the greedy tokens (2026-11-29,
session 5); GLM5_FASTPATH_SPARSE_MLA=sglang keeps FlashMLA everywhere. Two split tiles (ops.sparse_mla):
GLM5_FASTPATH_SPARSE_MLA_TILE=auto (default) runs the 64-head wgmma tile from 2 tokens and the 16-head mma tile at
1 token (H200, 2026-12-01 session 25 c1, same run: mma / wgmma / FlashMLA 11.7 / 13.8 / 56.4 us at T = 1, 29.5 /
23.2 / 60.1 at 8, 50.3 / 31.1 / 60.6 at 16, 90.7 / 47.4 / 62.5 at 32, 171.9 / 79.3 / 66.5 at 64); mma / wgmma pin
one. GLM5_FASTPATH_SPARSE_MLA_MAX_TOKENS (default 32; 16 with TILE=mma) is the largest T it takes. The mma tile's
numbers before the wgmma tile: on the H200, same run (benchmarks/results/2026-11-30_h200_session7/
sparse_mla), ours took 11.8 / 29.5 / 41.6 / 50.2 / 87.8 us at T = 1 / 8 / 12 / 16 / 24 against FlashMLA's
56.6 / 59.9 / 60.5 / 60.5 / 61.6 (its one-CTA-per-token kernel has enough CTAs from ~20 tokens on). GLM5_FASTPATH_SPARSE_MLA_SPLITS (a tuned table: "T:splits,..." or the JSON that `glm5-fastpath
bench sparse-mla --splits ... --write-splits PATH` writes) overrides the op's split heuristic per T; a table
that does not parse is logged and ignored. GLM5_FASTPATH_SPARSE_MLA_STAGES (2 or 5) picks the split kernel's
build (ops.sparse_mla: 5 = the deep gather ring, faster only at 2-4 tokens on an H200; default 2). A call outside what the kernel
takes (another dtype, a sink / topk_length argument (DeepSeek V4), H not a multiple of 16, T above the
limit, K > 2048) goes to FlashMLA, counted in glm5_fastpath_sparse_mla_total{route="stock", reason} and logged
once per reason; routed calls count {route="ours", reason="routed"}. Under CUDA graphs a call is a capture.

Check mode (diagnostics, GLM5_FASTPATH_SPARSE_MLA_CHECK=N): the first N routed calls that are not being
captured into a CUDA graph (an eager engine: `--engine-arg disable_cuda_graph=true`) also run FlashMLA on the same
inputs and log one line each: T, the share of -1 slots in the table, relative L2 and max abs difference of ours
against FlashMLA (the engine's own page tables, -1 padding and KV layout, which the kernel tests do not have),
as one JSON line with "passed" (rel L2 <= CHECK_TOL, both finite). The route still returns ours. `route.checks`
keeps the numbers.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_SPARSE_MLA"
ENV_MAX_TOKENS = "GLM5_FASTPATH_SPARSE_MLA_MAX_TOKENS"
ENV_SPLITS = "GLM5_FASTPATH_SPARSE_MLA_SPLITS"
ENV_STAGES = "GLM5_FASTPATH_SPARSE_MLA_STAGES"
ENV_TILE = "GLM5_FASTPATH_SPARSE_MLA_TILE"
ENV_CHECK = "GLM5_FASTPATH_SPARSE_MLA_CHECK"  # N: compare the first N eager routed calls with FlashMLA (module doc)
CHECK_TOL = 0.02  # rel L2 vs FlashMLA: both are ~0.002 from the float64 reference (bench sparse-mla, H200)
DEFAULT_MAX_TOKENS = 32  # the wgmma tile: 47.4 us at T = 32 against FlashMLA's 62.5, 79.3 against 66.5 at 64 (module doc)
DEFAULT_MAX_TOKENS_MMA = 16  # the mma tile alone: T = 24 took 87.8 us against FlashMLA's 61.6
BACKEND_MODULE = "sglang.srt.layers.attention.dsa_backend"
BACKEND_CLASS = "DeepseekSparseAttnBackend"
METHOD = "_forward_flashmla_sparse"
ORIGINAL_ATTR = "__glm5_fastpath_original__"

from ...metrics import SPARSE_MLA_TOTAL as METRIC, seam_counter  # noqa: E402  listed in metrics.METRICS

REASONS = {
    "routed": "our split-KV sparse MLA kernel",
    "tokens": "more tokens than GLM5_FASTPATH_SPARSE_MLA_MAX_TOKENS (FlashMLA has enough CTAs there)",
    "extra_args": "topk_length / attn_sink given (not GLM-5's DSA)",
    "layout": "inputs the kernel does not take (ops.sparse_mla.unsupported: dtype / shape / H % 16 / K > 2048 / "
              "device)",
    "error": "our kernel raised; FlashMLA for this call",
}


def enabled() -> bool:
    return os.environ.get(ENV, "ours").strip().lower() not in ("sglang", "0", "off", "flashmla", "stock")


def stages(log: logging.Logger = logger) -> int:
    """GLM5_FASTPATH_SPARSE_MLA_STAGES: the split kernel's build (ops.sparse_mla.STAGE_CHOICES; default
    DEFAULT_STAGES, the GPU-tested double buffer). A bad value is logged and the default kept."""
    from ...ops import sparse_mla as SM

    raw = os.environ.get(ENV_STAGES, "").strip()
    if not raw:
        return SM.DEFAULT_STAGES
    try:
        v = int(raw)
        if v in SM.STAGE_CHOICES:
            return v
    except ValueError:
        pass
    log.warning("glm5_fastpath: sparse MLA: %s=%r ignored (one of %s); %d stages", ENV_STAGES, raw,
                SM.STAGE_CHOICES, SM.DEFAULT_STAGES)
    return SM.DEFAULT_STAGES


def split_table(log: logging.Logger = logger) -> dict[int, int] | None:
    """GLM5_FASTPATH_SPARSE_MLA_SPLITS parsed (ops.sparse_mla.parse_split_table), None when unset or bad
    (logged: the op's own split heuristic then decides)."""
    spec = os.environ.get(ENV_SPLITS, "").strip()
    if not spec:
        return None
    from ...ops import sparse_mla as SM

    try:
        return SM.parse_split_table(spec)
    except ValueError as e:
        log.warning("glm5_fastpath: sparse MLA: %s ignored: %s", ENV_SPLITS, e)
        return None


def tile(log: logging.Logger = logger) -> str:
    """GLM5_FASTPATH_SPARSE_MLA_TILE: the split tile (ops.sparse_mla.KERNEL_CHOICES: mma, wgmma, auto, wgmma_pp; default
    auto = wgmma from 2 tokens where H % 64 == 0, mma otherwise; wgmma_pp is opt-in and measured slower). A bad value is
    logged and auto kept."""
    from ...ops import sparse_mla as SM

    raw = os.environ.get(ENV_TILE, "").strip().lower()
    if not raw:
        return "auto"
    if raw in SM.KERNEL_CHOICES:
        return raw
    log.warning("glm5_fastpath: sparse MLA: %s=%r ignored (one of %s); auto", ENV_TILE, raw, SM.KERNEL_CHOICES)
    return "auto"


def max_tokens(tile_name: str = "auto") -> int:
    default = DEFAULT_MAX_TOKENS_MMA if tile_name == "mma" else DEFAULT_MAX_TOKENS
    try:
        return max(0, int(os.environ.get(ENV_MAX_TOKENS, default)))
    except ValueError:
        return default


def why_not(q_all: Any, kv_cache: Any, v_head_dim: Any, page_table_1: Any, sm_scale: Any, extra: bool, limit: int,
            devices: tuple[str, ...] = ("cuda",)) -> str | None:
    """None when our kernel computes this call exactly, else the reason key (REASONS). The input checks are
    the op's own (ops.sparse_mla.unsupported): one definition of what the kernel takes."""
    import torch

    from ...ops import sparse_mla as SM

    if extra:
        return "extra_args"
    if not isinstance(q_all, torch.Tensor) or q_all.dim() != 3:
        return "layout"
    if q_all.shape[0] > limit:
        return "tokens"
    if q_all.device.type not in devices or SM.unsupported(q_all, kv_cache, page_table_1, sm_scale, v_head_dim):
        return "layout"
    return None


class SparseMlaRoute:
    """The wrapper's state: limit, once-per-reason log, metrics."""

    def __init__(self, metrics: Any = None, log: logging.Logger = logger, limit: int | None = None,
                 devices: tuple[str, ...] = ("cuda",), build: int | None = None) -> None:
        from ...ops import sparse_mla as SM

        self.metrics, self.log, self.devices = metrics, log, devices
        self.tile = tile(log)
        self.limit = max_tokens(self.tile) if limit is None else limit
        self.stages = stages(log) if build is None else build
        self.splits = split_table(log)
        if self.splits and self.stages != SM.DEFAULT_STAGES:
            # a tuned table times the default build (bench sparse-mla --write-splits); the deep ring's one CTA
            # per SM wants its own plan, so its heuristic decides
            log.warning("glm5_fastpath: sparse MLA: %s ignored with %s=%d (the table was tuned for the default "
                        "build)", ENV_SPLITS, ENV_STAGES, self.stages)
            self.splits = None
        self._once: set = set()
        self.check_left = check_count(log)
        self.checks: list[dict] = []

    def note(self, route: str, reason: str, level: int = logging.INFO) -> None:
        if (route, reason) not in self._once:
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: sparse MLA -> %s (%s)", "ours" if route == "ours" else "FlashMLA",
                         REASONS.get(reason, reason))
        if self.metrics is not None:
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    def call(self, original: Callable, backend: Any, q_all, kv_cache, v_head_dim, page_table_1, sm_scale,
             *args, **kwargs):
        extra = any(a is not None for a in args) or any(v is not None for v in kwargs.values())
        why = why_not(q_all, kv_cache, v_head_dim, page_table_1, sm_scale, extra, self.limit, self.devices)
        if why is not None:
            self.note("stock", why)
            return original(backend, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *args, **kwargs)
        try:
            from ...ops import sparse_mla as SM

            t = int(q_all.shape[0])
            kern = SM.resolve_kernel(self.tile, int(q_all.shape[1]), t)
            if kern != "mma":  # a 64-head tile (wgmma, or the opt-in wgmma_pp)
                out = SM.sparse_mla_decode(q_all, kv_cache, page_table_1, float(sm_scale), int(v_head_dim),
                                           kernel=kern)
            else:  # the mma tile: its ring build and the tuned split table apply
                out = SM.sparse_mla_decode(q_all, kv_cache, page_table_1, float(sm_scale), int(v_head_dim),
                                           num_splits=SM.splits_for(self.splits, t), stages=self.stages,
                                           kernel="mma")
        except Exception as e:  # noqa: BLE001 - never take the server down: FlashMLA, loudly, once
            if ("stock", "error") not in self._once:
                self.log.warning("glm5_fastpath: sparse MLA kernel raised %s: %s; FlashMLA for this call",
                                 type(e).__name__, e)
            self.note("stock", "error", logging.WARNING)
            return original(backend, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *args, **kwargs)
        self.note("ours", "routed")
        if self.check_left > 0:
            self._check(original, backend, out, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, args, kwargs)
        return out

    def _check(self, original, backend, out, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, args, kwargs):
        """Check mode (module doc): FlashMLA on the same inputs, one logged comparison; never under capture."""
        import torch

        from .shadow import _capturing  # graph capture and SGLang's capture-mode warm-ups

        if q_all.is_cuda and _capturing():
            return
        self.check_left -= 1
        try:
            from ...testing.numerics import rel_err

            ref = original(backend, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *args, **kwargs)
            c = {"T": int(q_all.shape[0]), "invalid_slots": float((page_table_1 < 0).double().mean()),
                 "rel_l2": rel_err(out, ref), "max_abs": float((out.double() - ref.double()).abs().max()),
                 "finite": bool(torch.isfinite(out).all()), "ref_finite": bool(torch.isfinite(ref).all())}
            c["passed"] = c["finite"] and c["ref_finite"] and c["rel_l2"] <= CHECK_TOL
        except Exception as e:  # noqa: BLE001 - a diagnostic: never the step's problem
            c = {"T": int(q_all.shape[0]), "error": f"{type(e).__name__}: {e}", "passed": False}
        self.checks.append(c)
        self.log.warning("glm5_fastpath: sparse MLA check vs FlashMLA: %s", json.dumps(c, sort_keys=True))


def check_count(log: logging.Logger = logger) -> int:
    """GLM5_FASTPATH_SPARSE_MLA_CHECK: how many eager routed calls to compare with FlashMLA (0 = off)."""
    from .shadow import env_count

    return env_count(ENV_CHECK, log)


def counter(registry: Any) -> Any:
    return seam_counter(registry, METRIC, "DSA sparse-MLA attention-core calls by route (ours / stock = FlashMLA) "
                        "and reason; host-side, so under CUDA graphs a call is a capture, not a replay.")


def backend_class() -> Any:
    """SGLang's DeepseekSparseAttnBackend class, or None in a release without it (shared by the q_cat route)."""
    import importlib

    try:
        return getattr(importlib.import_module(BACKEND_MODULE), BACKEND_CLASS, None)
    except Exception:  # noqa: BLE001 - a release without the DSA backend: nothing to patch
        return None


def install_sparse_mla(metrics: Any = None, log: logging.Logger = logger, device: Any = None,
                       backend_cls: Any = None, precompile: bool = True,
                       devices: tuple[str, ...] = ("cuda",)) -> bool:
    """Wrap the DSA backend's sparse-MLA call unless GLM5_FASTPATH_SPARSE_MLA=sglang (module doc). Compiles the
    kernel first (never inside the first request); on failure the method stays SGLang's. Returns whether the
    route is installed."""
    if not enabled():
        return False
    cls = backend_cls if backend_cls is not None else backend_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    if fn is None:
        log.info("glm5_fastpath: sparse MLA: %s.%s not found in this SGLang; FlashMLA stays", BACKEND_CLASS, METHOD)
        return False
    if getattr(fn, ORIGINAL_ATTR, None) is not None:
        return True  # installed already (one class, one process)
    if precompile:
        try:
            from ...ops import sparse_mla as SM

            build = stages(log)
            SM.precompile(device, stages=(build,))
        except Exception as e:  # noqa: BLE001 - no kernel: FlashMLA everywhere, say why
            log.warning("glm5_fastpath: sparse MLA kernel unavailable (%s: %s); FlashMLA stays", type(e).__name__, e)
            return False
    route = SparseMlaRoute(metrics, log, devices=devices, build=build if precompile else None)
    original = fn

    def _forward_flashmla_sparse(self, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *args, **kwargs):
        return route.call(original, self, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, *args, **kwargs)

    setattr(_forward_flashmla_sparse, ORIGINAL_ATTR, original)
    _forward_flashmla_sparse.__glm5_fastpath_route__ = route
    setattr(cls, METHOD, _forward_flashmla_sparse)
    log.info("glm5_fastpath: sparse MLA: %s.%s -> our split-KV kernel for <= %d tokens, FlashMLA above (%s=sglang "
             "turns it off); split tile %s (%s); mma tile: splits %s, %d-stage gather ring", BACKEND_CLASS, METHOD,
             route.limit, ENV, route.tile, ENV_TILE, route.splits if route.splits else "by the op's heuristic",
             route.stages)
    return True


def unpatch_sparse_mla(backend_cls: Any = None) -> bool:
    cls = backend_cls if backend_cls is not None else backend_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    if original is None:
        return False
    setattr(cls, METHOD, original)
    return True
