"""The q_cat route: SGLang's DSA decode without its q concat and latent-KV store kernels (issue #9).

SGLang 0.5.14's `DeepseekSparseAttnBackend.forward_decode`, handed q_nope [T, H, 512] and q_rope [T, H, 64] (what
forward_absorb_core passes), runs two small kernels per layer before the sparse MLA: the latent-KV store
(`set_mla_kv_buffer`, from k_nope / k_pe) and `concat_mla_absorb_q` (q_all = [q_nope | q_rope], [T, H, 576]). In a
batch-1 step each is ~1-2 us plus a launch gap, ~3.7 us per layer (session 37 profile). SGLang's own fused tilelang
path already skips both: it passes one [T, H, 576] q with q_rope=None (forward_decode then views it, no copy) and
no k (no store) after writing the cache itself.

This route does the same for our prefix: with GLM5_FASTPATH_QCAT=1 the prefix executor runs D2 in its q_cat form
(ops.d2_absorb.d2_absorb_qcat: q_lat written straight into the first 512 columns of one [T, H, 576] buffer, q_pe
copied into the last 64, and the latent-KV row stored into SGLang's pool at out_cache_loc besides the per-call
scratch) and returns q_nope_out / q_pe as the two column views of that buffer. It hands the buffer over here (per
layer id); the forward_decode wrapper below, when its q / q_rope are exactly those views, calls SGLang's
forward_decode with q = the buffer, q_rope = None and k = v = None. Every other call is SGLang's own, unchanged.

Why this is safe:
- the pool rows D2 writes are bitwise the rows SGLang's store writes (the store copies the [c_kv | roped k_pe] we
  return, which D2 wrote into the scratch from the same registers), so skipping SGLang's store changes nothing;
- a hand-off is consumed only by the forward_decode of the same layer whose q is the buffer itself (data pointer,
  shape, strides) and whose q_rope is its rope view; the registry holds the buffer, so no other tensor can sit at
  its address while the hand-off is pending. A call that does not match (SGLang's fallback core, a different
  backend implementation) keeps k and q_rope: SGLang stores the same row again (idempotent) and concatenates;
- only where SGLang's decode takes q_all for its kernel (dsa_decode_impl "flashmla_sparse" / "flashmla_kv"), the
  pool is the plain bf16 MLA layout [slots, 1, 576] and no hisparse coordinator swaps pages (pool_target below);
  otherwise the prefix keeps its split outputs (logged once per reason).

Switch: GLM5_FASTPATH_QCAT (default off until an engine A/B says it pays; =1 on). Metrics:
glm5_fastpath_qcat_total{route, reason} (host-side: captures, not replays).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...metrics import seam_counter
from . import decision
from .attn_core import BACKEND_CLASS, BACKEND_MODULE, backend_class
from .prefix_adapter import attn_backend

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_QCAT"
DEFAULT = False
METRIC = "glm5_fastpath_qcat_total"
METHOD = "forward_decode"
ORIGINAL_ATTR = "__glm5_fastpath_original__"
IMPLS = ("flashmla_sparse", "flashmla_kv")  # the decode kernels that take SGLang's q_all

REASONS = {
    "routed": "one [T, H, 576] q from D2, no concat; latent-KV row stored by D2",
    "off": f"{ENV}=0 (default): SGLang's concat and store",
    "not_installed": "the forward_decode wrapper is not installed (another SGLang layout)",
    "impl": "the DSA decode implementation is not flashmla_sparse / flashmla_kv",
    "hisparse": "a hisparse coordinator swaps KV pages",
    "kpool": "an index K-pool tail (dsa_index_kpool > 1) may switch the decode kernel per call",
    "pool": "the latent-KV pool is not SGLang's plain bf16 [slots, 1, 576] MLA layout",
    "loc": "out_cache_loc is not an int64 vector",
    "no_handoff": "forward_decode got q / q_rope that are not a pending q_cat hand-off: SGLang's concat and store",
    "signature": "forward_decode called with positional arguments past save_kv_cache: SGLang's path",
}


def enabled() -> bool:
    return decision.switch_on(ENV, DEFAULT)


@dataclass
class Handoff:
    q_cat: torch.Tensor  # [T, H, kv_lora + rope] bf16, contiguous
    kv_lora: int
    pool_written: bool   # D2 stored this step's latent-KV rows into the pool


def counter(registry: Any) -> Any:
    return seam_counter(registry, METRIC, "DSA decode q / latent-KV hand-offs by route (ours = one q_cat buffer and "
                        "D2's pool store, stock = SGLang's concat + store) and reason; host-side (captures).")


class QcatRoute:
    """Per-process state: the pending hand-offs (layer id -> Handoff), once-per-reason logs, metrics."""

    def __init__(self, metrics: Any = None, log: logging.Logger = logger) -> None:
        self.metrics, self.log = metrics, log
        self.installed = False
        self._pending: dict[int, Handoff] = {}
        self._once: set = set()

    def note(self, route: str, reason: str, level: int = logging.INFO) -> None:
        if (route, reason) not in self._once:
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: DSA decode q / KV store -> %s (%s); logged once",
                         "ours" if route == "ours" else "SGLang", REASONS.get(reason, reason))
        if self.metrics is not None:
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    # ---- prefix side -------------------------------------------------------------------------------------------
    def pool_target(self, layer_id: int, forward_batch: Any, kv_dim: int) -> tuple[torch.Tensor, torch.Tensor] | str:
        """(pool rows [slots, kv_dim] bf16, out_cache_loc int64) where D2 may store this layer's latent KV and the
        wrapper may skip SGLang's store; else the reason (a REASONS key) it may not."""
        if not enabled():
            return "off"
        if not self.installed:
            return "not_installed"
        backend = attn_backend(forward_batch)
        if getattr(backend, "dsa_decode_impl", None) not in IMPLS:
            return "impl"
        if getattr(backend, "hisparse_coordinator", None) is not None:
            return "hisparse"
        if int(getattr(backend, "dsa_index_kpool", 1) or 1) > 1:  # 0.5.23 may pick another kernel per call there
            return "kpool"
        pool = getattr(backend, "token_to_kv_pool", None) or getattr(forward_batch, "token_to_kv_pool", None)
        if pool is None or getattr(pool, "dtype", None) != torch.bfloat16 or \
                getattr(pool, "store_dtype", torch.bfloat16) != torch.bfloat16 or \
                getattr(pool, "dsa_kv_cache_store_fp8", False) or not hasattr(pool, "get_key_buffer"):
            return "pool"
        buf = pool.get_key_buffer(layer_id)
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.bfloat16 or buf.dim() != 3 or buf.shape[1] != 1 \
                or buf.shape[2] != kv_dim or not buf.is_contiguous():
            return "pool"
        loc = getattr(forward_batch, "out_cache_loc", None)
        if not isinstance(loc, torch.Tensor) or loc.dtype != torch.int64 or loc.dim() != 1 or not loc.is_contiguous():
            return "loc"
        return buf.view(buf.shape[0], kv_dim), loc

    def hand_off(self, layer_id: int, q_cat: torch.Tensor, kv_lora: int, pool_written: bool) -> None:
        self._pending[int(layer_id)] = Handoff(q_cat, int(kv_lora), bool(pool_written))

    # ---- backend side ------------------------------------------------------------------------------------------
    def take(self, layer_id: int, q: Any, q_rope: Any) -> Handoff | None:
        """The pending hand-off of `layer_id` if q / q_rope are exactly its two column views (then consumed)."""
        h = self._pending.get(int(layer_id))
        if h is None or not isinstance(q, torch.Tensor) or not isinstance(q_rope, torch.Tensor):
            return None
        qc = h.q_cat
        t, heads, width = qc.shape
        es = qc.element_size()
        if q.data_ptr() != qc.data_ptr() or q_rope.data_ptr() != qc.data_ptr() + h.kv_lora * es:
            return None
        if tuple(q.shape) != (t, heads, h.kv_lora) or tuple(q_rope.shape) != (t, heads, width - h.kv_lora) \
                or q.stride() != qc.stride() or q_rope.stride() != qc.stride():
            return None
        del self._pending[int(layer_id)]
        return h

    def forward_decode(self, original: Callable, backend: Any, q, k, v, layer, forward_batch, save_kv_cache=True,
                       *args, **kwargs):
        if args:
            self.note("stock", "signature")
            return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
        h = self.take(getattr(layer, "layer_id", -1), q, kwargs.get("q_rope"))
        if h is None:
            if self._pending:  # only worth a log line while hand-offs exist (the route is on)
                self.note("stock", "no_handoff")
            return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        if getattr(backend, "dsa_decode_impl", None) not in IMPLS:  # pool_target checked it; a backend swap since
            self.note("stock", "impl")
            return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        kwargs["q_rope"] = None
        if h.pool_written:
            k = v = None  # D2 stored the rows: forward_decode skips its store when k is None
        self.note("ours", "routed")
        return original(backend, h.q_cat, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)


ROUTE = QcatRoute()


SIGNATURE = ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache")


def signature_ok(fn: Any) -> bool:
    """forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache, ..., q_rope=, k_rope=, ...): the layout
    SGLang 0.5.14 and 0.5.23 have (the wrapper passes q / k / v positionally and q_rope by keyword)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return tuple(params[:len(SIGNATURE)]) == SIGNATURE and "q_rope" in params


def install_qcat(metrics: Any = None, log: logging.Logger = logger, backend_cls: Any = None,
                 route: QcatRoute | None = None) -> bool:
    """Wrap the DSA backend's forward_decode when GLM5_FASTPATH_QCAT is on. Returns whether it is installed."""
    route = ROUTE if route is None else route
    if not enabled():
        log.info("glm5_fastpath: DSA decode q / KV store: SGLang's concat + store (%s=1 hands it one q_cat buffer "
                 "from D2, which stores the latent KV)", ENV)
        return False
    cls = backend_cls if backend_cls is not None else backend_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    if fn is None:
        log.info("glm5_fastpath: DSA decode q / KV store: %s.%s not found in this SGLang; SGLang's concat + store "
                 "stay", BACKEND_CLASS, METHOD)
        return False
    if getattr(fn, ORIGINAL_ATTR, None) is not None:
        route.installed = True
        return True
    if not signature_ok(fn):
        log.info("glm5_fastpath: DSA decode q / KV store: %s.%s has another signature in this SGLang; SGLang's "
                 "concat + store stay", BACKEND_CLASS, METHOD)
        return False
    original = fn
    route.metrics = metrics if metrics is not None else route.metrics
    route.log = log

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
        return route.forward_decode(original, self, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)

    setattr(forward_decode, ORIGINAL_ATTR, original)
    forward_decode.__glm5_fastpath_route__ = route
    setattr(cls, METHOD, forward_decode)
    route.installed = True
    log.info("glm5_fastpath: DSA decode q / KV store: %s.%s takes D2's q_cat buffer (no concat) and D2's latent-KV "
             "store (no set_mla_kv_buffer) on our prefix's decode layers (%s=0 turns it off)", BACKEND_CLASS, METHOD,
             ENV)
    return True


def unpatch_qcat(backend_cls: Any = None, route: QcatRoute | None = None) -> bool:
    route = ROUTE if route is None else route
    cls = backend_cls if backend_cls is not None else backend_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    route.installed = False
    route._pending.clear()
    if original is None:
        return False
    setattr(cls, METHOD, original)
    return True
