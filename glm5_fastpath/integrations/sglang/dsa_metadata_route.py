"""The DSA metadata route: the DSA backend's per-step decode metadata in one kernel instead of ~12 torch ops.

Why: before every decode CUDA-graph replay SGLang's DSA backend refreshes its metadata buffers (sequence lengths,
their prefix sums, the token page table, the top-k-clamped lengths and theirs, the real page table) with ~12 small
torch ops, each a host dispatch and a kernel ahead of the graph. At batch 1 the engine's step is paced by the host
(session 35: ITL 2.00-2.22 ms against 1.95 ms of GPU work per step), so host work per step is step time there; at
batch 8 and up the step is GPU-bound and those kernels are GPU time ahead of the graph.

Seam: `DeepseekSparseAttnBackend._apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu,
forward_mode, spec_info, out_cache_loc=None, actual_forward_mode=None)` (sglang.srt.layers.attention.dsa_backend,
0.5.14), wrapped on the CLASS once per process like the sparse-MLA route. For a decode (or idle) replay of a captured
batch size it runs the DSA metadata kernel (bitwise SGLang's values, ops/dsa_metadata.py) through an
ops.dsa_metadata.FastLauncher per batch size (checked and packed once, then one driver launch per step: the op's
dispatcher and the generic launcher's packing would be host time per step again), then SGLang's own code
for the rest of that branch: DeepGEMM's paged-MQA schedule (`_build_paged_mqa_schedule_2d_ctx_lens` +
`deep_gemm.get_paged_mqa_logits_metadata`, copied into the same buffers) and `forward_metadata`. Everything else calls
the original: a batch size not yet captured (SGLang builds its buffers there), target-verify / draft-extend, the
flashmla_kv decode impl (it also needs FlashMLA's metadata), a non-CUDA backend, buffers the op refuses, or a
backend without the attributes this relies on (another SGLang release). Each reason is logged once and counted in
glm5_fastpath_dsa_metadata_total{route="stock", reason}; the routed path logs once per batch size and counts once
per batch size (a per-step counter would itself be host work per step).

ON BY DEFAULT since session 36: in the engine (8-layer GLM-5-shaped model, H200, five engine processes per setting) the
batch-1 decode step went from 2.00-2.45 ms (host-paced, median 2.33) to 1.96-1.97 ms (GPU-paced: the host loop now
waits 0.3-0.6 ms per step for the GPU), 0.04 ms less at batch 8 and 16; the in-engine check found every buffer equal
(benchmarks/results/2026-12-03_h200_session36/). GLM5_FASTPATH_DSA_METADATA=0 keeps SGLang's code.
The default covers the SGLang releases whose decode branch the op reproduces (VERIFIED_SGLANG: 0.5.14); on any other
release the route stays off unless GLM5_FASTPATH_DSA_METADATA=1 asks for it (logged). SGLang 0.5.23 rewrote that
branch (index-K pools, physical page sizes) and already fuses it (`_fused_decode_metadata`), so there is nothing to
take; its backend also lacks `real_page_size`, which the route needs (reason "backend").
GLM5_FASTPATH_DSA_METADATA_CHECK=N (diagnostic) runs SGLang's original after ours for the first N routed calls and
compares every buffer it wrote (then the buffers hold SGLang's values, which equal ours when the check passes); a
mismatch is logged as a warning with the buffer names and turns the route off for the rest of the process.

DeepGEMM's paged-MQA schedule (opt-in skip, GLM5_FASTPATH_DSA_METADATA_SCHEDULE=skip; not yet GPU-run): the routed
refresh still rebuilds the schedule every step (a 2-D context-length tensor, DeepGEMM's metadata kernel, two copies:
host work and kernels ahead of each replay). Its only reader in SGLang 0.5.14 is the indexer's paged top-k
(`Indexer._get_topk_paged`, sglang.srt.layers.attention.dsa.dsa_indexer), which a decode layer on our full / shared
prefix route never calls. With `skip`, install also wraps that method on the class; while it has not run in this
process, the refresh leaves the schedule as it is. The decode graphs are captured (running every layer's Python
forward) before their first replay, so a graph that contains SGLang's indexer (a layer that fell back at capture)
has set the flag before its first replay; from the first call on, every refresh rebuilds the schedule again (logged
once). Without that method (another SGLang release) the schedule is always rebuilt. Default `refresh`.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from .attn_core import BACKEND_CLASS, BACKEND_MODULE  # one definition of where SGLang's DSA backend lives
from .decision import switch_on

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_DSA_METADATA"
ENV_CHECK = "GLM5_FASTPATH_DSA_METADATA_CHECK"
ENV_SCHEDULE = "GLM5_FASTPATH_DSA_METADATA_SCHEDULE"  # refresh (default) | skip (module doc)
INDEXER_MODULE = "sglang.srt.layers.attention.dsa.dsa_indexer"
INDEXER_CLASS = "Indexer"
INDEXER_METHOD = "_get_topk_paged"  # the DeepGEMM schedule's only reader (SGLang 0.5.14)
METHOD = "_apply_cuda_graph_metadata"
ORIGINAL_ATTR = "__glm5_fastpath_original__"
METRIC = "glm5_fastpath_dsa_metadata_total"
# default on since session 36 (engine, five processes per setting: batch-1 ITL p50 1.96 ms against 2.00-2.45 without,
# 0.04 ms less at batch 8 / 16); GLM5_FASTPATH_DSA_METADATA=0 (or off / sglang / stock / false / no) keeps SGLang's code
DEFAULT_ON = True
VERIFIED_SGLANG = ("0.5.14",)  # releases whose _apply_cuda_graph_metadata decode branch ops.dsa_metadata reproduces
# the metadata buffers the op writes: (attribute of SGLang's DSAMetadata, op keyword)
BUFFERS = (("cache_seqlens_int32", "cache_seqlens"), ("cu_seqlens_k", "cu_seqlens_k"),
           ("dsa_cache_seqlens_int32", "dsa_seqlens"), ("dsa_cu_seqlens_k", "dsa_cu"),
           ("page_table_1", "page_table_1"))
BACKEND_ATTRS = ("decode_cuda_graph_metadata", "req_to_token", "dsa_index_topk", "real_page_size",
                 "dsa_decode_impl", "set_dsa_prefill_impl", "_build_paged_mqa_schedule_2d_ctx_lens")
REASONS = {
    "capture": "a batch size without its metadata buffers yet (SGLang builds them)",
    "mode": "not a decode / idle replay (target verify, draft extend)",
    "impl": "the flashmla_kv decode impl (needs FlashMLA's metadata too)",
    "device": "not a CUDA backend",
    "backend": "the DSA backend lacks what this route relies on (another SGLang release)",
    "page_size": "the metadata's page size is not the backend's",
    "buffers": "the op refused SGLang's buffers",
    "error": "our kernel raised",
    "mismatch": "the check found a buffer that differs from SGLang's (route off for this process)",
}


def enabled() -> bool:
    return switch_on(ENV, DEFAULT_ON)


def explicitly_on() -> bool:
    """GLM5_FASTPATH_DSA_METADATA set to something other than an off value (the default is not explicit)."""
    return switch_on(ENV, False)


def sglang_version() -> str | None:
    """The SGLang in use: the imported package's __version__ (the engine has imported it), else its metadata."""
    import sys

    mod = sys.modules.get("sglang")
    v = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(v, str) and v:
        return v
    from ...platform import dist_version

    return dist_version("sglang")


def schedule_mode() -> str:
    """GLM5_FASTPATH_DSA_METADATA_SCHEDULE: "skip" or "refresh" (default; anything else is logged and means refresh)."""
    raw = os.environ.get(ENV_SCHEDULE, "").strip().lower()
    if raw in ("", "refresh"):
        return "refresh"
    if raw == "skip":
        return "skip"
    logger.warning("glm5_fastpath: %s=%r is not refresh / skip; the schedule is refreshed", ENV_SCHEDULE, raw)
    return "refresh"


def check_calls() -> int:
    try:
        return max(0, int(os.environ.get(ENV_CHECK, "0") or 0))
    except ValueError:
        return 0


def counter(registry: Any) -> Any:
    from ...metrics import seam_counter

    return seam_counter(registry, METRIC, "DSA decode metadata refreshes by route (ours / stock) and reason; ours is "
                        "counted once per batch size, stock once per call.")


def why_not(backend: Any, bs: int, seq_lens: Any, forward_mode: Any, module_globals: dict,
            devices: tuple[str, ...] = ("cuda",)) -> str | None:
    if any(not hasattr(backend, a) for a in BACKEND_ATTRS) or "deep_gemm" not in module_globals:
        return "backend"
    if bs not in backend.decode_cuda_graph_metadata:
        return "capture"
    try:
        if not forward_mode.is_decode_or_idle():
            return "mode"
    except AttributeError:
        return "mode"
    if backend.dsa_decode_impl == "flashmla_kv":
        return "impl"
    if getattr(getattr(seq_lens, "device", None), "type", None) not in devices or \
            not module_globals.get("is_cuda", lambda: False)():
        return "device"
    if getattr(backend.decode_cuda_graph_metadata[bs], "page_size", backend.real_page_size) != backend.real_page_size:
        return "page_size"
    return None


class DsaMetadataRoute:
    def __init__(self, module_globals: dict, metrics: Any = None, log: logging.Logger = logger,
                 run: Callable[..., None] | None = None, check: int | None = None,
                 devices: tuple[str, ...] = ("cuda",)) -> None:
        self.g, self.metrics, self.log, self.devices = module_globals, metrics, log, devices
        self.run = run  # None: ops.dsa_metadata.FastLauncher per batch size (packed once); else run(op arguments)
        self._fast: dict = {}
        self.check_left = check_calls() if check is None else check
        self.off = False
        self._once: set = set()
        self.routed_bs: set = set()
        self.checks: list[dict] = []
        # the schedule skip (module doc): on only once watch_indexer wrapped SGLang's paged top-k
        self.skip_schedule = False
        self.paged_indexer_seen = False
        self.schedules_skipped = 0

    def indexer_ran(self) -> None:
        """SGLang's paged indexer ran: the schedule is rebuilt on every refresh from now on."""
        if not self.paged_indexer_seen:
            self.paged_indexer_seen = True
            if self.skip_schedule:
                self.log.info("glm5_fastpath: DSA decode metadata: SGLang's %s.%s ran (a layer not on our prefix "
                              "route); DeepGEMM's paged-MQA schedule is refreshed from now on", INDEXER_CLASS,
                              INDEXER_METHOD)

    def note(self, route: str, reason: str, level: int = logging.INFO) -> None:
        if (route, reason) not in self._once:
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: DSA decode metadata -> %s (%s); logged once",
                         "ours (one kernel)" if route == "ours" else "SGLang", REASONS.get(reason, reason))
        if self.metrics is not None:
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    def call(self, original: Callable, backend: Any, bs: int, req_pool_indices: Any, seq_lens: Any, seq_lens_cpu: Any,
             forward_mode: Any, spec_info: Any, *args, **kwargs):
        why = "mismatch" if self.off else why_not(backend, bs, seq_lens, forward_mode, self.g, self.devices)
        if why is not None:
            self.note("stock", why)
            return original(backend, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                            *args, **kwargs)
        backend.set_dsa_prefill_impl(forward_batch=None)
        md = backend.decode_cuda_graph_metadata[bs]
        seq_lens, seq_lens_cpu, req_pool_indices = seq_lens[:bs], seq_lens_cpu[:bs], req_pool_indices[:bs]
        max_len = int(seq_lens_cpu.max().item())
        ps = int(backend.real_page_size)
        bufs = {kw: getattr(md, attr) for attr, kw in BUFFERS}
        bufs["real_table"] = md.real_page_table if ps > 1 else None
        try:
            if self.run is not None:
                self.run(backend.req_to_token, req_pool_indices, seq_lens, max_len, int(backend.dsa_index_topk), ps,
                         **bufs)
            else:
                self._fast_launch(backend, bs, req_pool_indices, seq_lens, ps, bufs)(max_len)
        except ValueError as e:  # the op's input error: SGLang's buffers are not what it takes
            self.note("stock", "buffers", logging.WARNING)
            self.log.debug("glm5_fastpath: DSA decode metadata: %s", e)
            return original(backend, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                            *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's code, loudly, once
            if ("stock", "error") not in self._once:
                self.log.warning("glm5_fastpath: DSA decode metadata: our kernel raised %s: %s; SGLang's code for "
                                 "this call", type(e).__name__, e)
            self.note("stock", "error", logging.WARNING)
            return original(backend, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                            *args, **kwargs)
        # the rest of SGLang's decode branch, as it is there: DeepGEMM's paged-MQA schedule (read by SGLang's indexer
        # only; left as it is while that indexer has not run, with the opt-in skip: module doc)
        if self.skip_schedule and not self.paged_indexer_seen:
            self.schedules_skipped += 1
            if self.schedules_skipped == 1:
                self.log.info("glm5_fastpath: DSA decode metadata: DeepGEMM's paged-MQA schedule not refreshed (SGLang's "
                              "paged indexer has not run in this process; %s=skip)", ENV_SCHEDULE)
        else:
            self._refresh_schedule(backend, md, forward_mode, bs)
        backend.forward_metadata = md
        if bs not in self.routed_bs:
            self.routed_bs.add(bs)
            self.log.info("glm5_fastpath: DSA decode metadata -> ours (one kernel) at batch size %d; logged once per "
                          "batch size", bs)
            if self.metrics is not None:
                counter(self.metrics.registry).labels(route="ours", reason="routed").inc()
        if self.check_left > 0:
            self.check_left -= 1
            self._check(original, backend, md, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                        args, kwargs)
        return None

    def _refresh_schedule(self, backend: Any, md: Any, forward_mode: Any, bs: int) -> None:
        deep_gemm = self.g["deep_gemm"]
        ctx = backend._build_paged_mqa_schedule_2d_ctx_lens(forward_mode, md.cache_seqlens_int32,
                                                             md.cache_seqlens_int32, bs)
        schedule = deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, deep_gemm.get_num_sms())
        if getattr(md, "paged_mqa_schedule_metadata", None) is None:
            object.__setattr__(md, "paged_mqa_schedule_metadata", schedule)
        else:
            md.paged_mqa_schedule_metadata.copy_(schedule)
        if getattr(md, "paged_mqa_ctx_lens_2d", None) is None:
            object.__setattr__(md, "paged_mqa_ctx_lens_2d", ctx)
        else:
            md.paged_mqa_ctx_lens_2d.copy_(ctx)

    def _fast_launch(self, backend: Any, bs: int, req_pool_indices: Any, seq_lens: Any, ps: int, bufs: dict) -> Any:
        """The batch size's FastLauncher, rebuilt when any of its tensors moved (SGLang re-allocated a buffer). A refusal
        is kept with its key too, so a persistent one costs a comparison per step, not a validation."""
        from ...ops.dsa_metadata import FastLauncher, key_of

        key = key_of(backend.req_to_token, req_pool_indices, seq_lens, *bufs.values())
        got = self._fast.get(bs)
        if got is None or got[0] != key:
            try:
                got = (key, FastLauncher(backend.req_to_token, req_pool_indices, seq_lens,
                                         int(backend.dsa_index_topk), ps, **bufs))
            except ValueError as e:
                got = (key, e)
            self._fast[bs] = got
        if isinstance(got[1], Exception):
            raise got[1]
        return got[1]

    def _check(self, original, backend, md, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
               args, kwargs) -> None:
        names = [a for a, _ in BUFFERS] + (["real_page_table"] if int(backend.real_page_size) > 1 else [])
        ours = {n: getattr(md, n).clone() for n in names}
        original(backend, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info, *args, **kwargs)
        bad = [n for n in names if not bool((getattr(md, n) == ours[n]).all())]
        self.checks.append({"bs": bs, "passed": not bad, "differs": bad})
        if bad:
            self.off = True
            self.log.warning("glm5_fastpath: DSA decode metadata check at batch size %d: %s differ from SGLang's; "
                             "the route is off for this process", bs, ", ".join(bad))
            self.note("stock", "mismatch", logging.WARNING)
        else:
            self.log.info("glm5_fastpath: DSA decode metadata check at batch size %d: every buffer equals SGLang's", bs)


def _module() -> Any:
    import importlib

    try:
        return importlib.import_module(BACKEND_MODULE)
    except Exception:  # noqa: BLE001 - a release without the DSA backend
        return None


def install_dsa_metadata(metrics: Any = None, log: logging.Logger = logger, backend_cls: Any = None,
                         module_globals: dict | None = None, precompile: bool = True,
                         devices: tuple[str, ...] = ("cuda",), indexer_cls: Any = None,
                         version: str | None = None) -> bool:
    """Wrap the DSA backend's metadata refresh unless GLM5_FASTPATH_DSA_METADATA=0; by default only on VERIFIED_SGLANG
    releases (version: the installed SGLang's, looked up when None) (module doc); -> installed."""
    if not enabled():
        return False
    if version is None:
        version = sglang_version()
    if version not in VERIFIED_SGLANG and not explicitly_on():
        log.info("glm5_fastpath: DSA decode metadata: SGLang %s is not a release this route was checked against (%s); "
                 "SGLang's code stays (%s=1 asks for the route anyway, %s=N checks it)", version,
                 ", ".join(VERIFIED_SGLANG), ENV, ENV_CHECK)
        return False
    if backend_cls is None or module_globals is None:
        mod = _module()
        if mod is None:
            log.info("glm5_fastpath: DSA decode metadata: %s not importable; SGLang's code stays", BACKEND_MODULE)
            return False
        backend_cls = backend_cls if backend_cls is not None else getattr(mod, BACKEND_CLASS, None)
        module_globals = module_globals if module_globals is not None else vars(mod)
    fn = getattr(backend_cls, METHOD, None) if backend_cls is not None else None
    if fn is None:
        log.info("glm5_fastpath: DSA decode metadata: %s.%s not found in this SGLang; its code stays", BACKEND_CLASS,
                 METHOD)
        return False
    if getattr(fn, ORIGINAL_ATTR, None) is not None:
        return True
    if precompile:
        try:
            from ...jit.runtime import get_kernel
            from ...ops.dsa_metadata import SPEC
            import torch

            get_kernel(SPEC, device=torch.device("cuda", torch.cuda.current_device()))
        except Exception as e:  # noqa: BLE001 - no kernel: SGLang's code, say why
            log.warning("glm5_fastpath: DSA decode metadata kernel unavailable (%s: %s); SGLang's code stays",
                        type(e).__name__, e)
            return False
    route = DsaMetadataRoute(module_globals, metrics, log, devices=devices)
    original = fn

    def _apply_cuda_graph_metadata(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                                   *args, **kwargs):
        return route.call(original, self, bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode, spec_info,
                          *args, **kwargs)

    setattr(_apply_cuda_graph_metadata, ORIGINAL_ATTR, original)
    _apply_cuda_graph_metadata.__glm5_fastpath_route__ = route
    setattr(backend_cls, METHOD, _apply_cuda_graph_metadata)
    if schedule_mode() == "skip":
        route.skip_schedule = watch_indexer(route, indexer_cls, log)
    log.info("glm5_fastpath: DSA decode metadata: %s.%s -> one kernel for decode replays (%s=0 turns it off; %s=N "
             "checks the first N against SGLang's code)", BACKEND_CLASS, METHOD, ENV, ENV_CHECK)
    return True


def _indexer_cls() -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(INDEXER_MODULE), INDEXER_CLASS, None)
    except Exception:  # noqa: BLE001 - a release without it: no skip
        return None


def watch_indexer(route: DsaMetadataRoute, indexer_cls: Any = None, log: logging.Logger = logger) -> bool:
    """Wrap SGLang's Indexer._get_topk_paged on the class so its first call tells `route` (indexer_ran); -> whether
    the schedule may be skipped (False, logged, when the method is not there: another SGLang release)."""
    cls = indexer_cls if indexer_cls is not None else _indexer_cls()
    fn = getattr(cls, INDEXER_METHOD, None) if cls is not None else None
    if fn is None:
        log.info("glm5_fastpath: DSA decode metadata: %s.%s.%s not found; DeepGEMM's paged-MQA schedule is refreshed "
                 "every step", INDEXER_MODULE, INDEXER_CLASS, INDEXER_METHOD)
        return False
    original = getattr(fn, ORIGINAL_ATTR, None) or fn
    routes = getattr(fn, "__glm5_fastpath_routes__", None)
    if routes is None:
        routes = []

        def _get_topk_paged(self, *args, **kwargs):
            for r in routes:
                r.indexer_ran()
            return original(self, *args, **kwargs)

        setattr(_get_topk_paged, ORIGINAL_ATTR, original)
        _get_topk_paged.__glm5_fastpath_routes__ = routes
        setattr(cls, INDEXER_METHOD, _get_topk_paged)
    routes.append(route)
    return True


def unwatch_indexer(indexer_cls: Any = None) -> bool:
    cls = indexer_cls if indexer_cls is not None else _indexer_cls()
    fn = getattr(cls, INDEXER_METHOD, None) if cls is not None else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    if original is None:
        return False
    setattr(cls, INDEXER_METHOD, original)
    return True


def unpatch_dsa_metadata(backend_cls: Any = None, indexer_cls: Any = None) -> bool:
    """Restore the backend's method (and the indexer's, when the schedule skip wrapped it); -> whether it was wrapped."""
    unwatch_indexer(indexer_cls)
    if backend_cls is None:
        mod = _module()
        backend_cls = getattr(mod, BACKEND_CLASS, None) if mod is not None else None
    fn = getattr(backend_cls, METHOD, None) if backend_cls is not None else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    if original is None:
        return False
    setattr(backend_cls, METHOD, original)
    return True
