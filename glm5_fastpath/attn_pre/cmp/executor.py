"""CmpExecutor: the attention prefix as one CUDA graph per token bucket, on the streams of streams.py,
with the PDL mode of modes.py.

    ex = CmpExecutor(cfg, weights, "cuda", mode="full", kv_cache=kv, index_k_cache=ik, max_pages=128)
    out = ex.run(hidden=h, residual=r, positions=p, out_cache_loc=loc, seq_lens=sl, block_table=bt)
    out["q_lat"], out["q_pe"], out["topk_slots"], out["residual_out"]   # views of the first M rows

What is captured, and by what:
- step inputs (hidden, residual, positions, out_cache_loc, seq_lens, block_table; topk_slots on a
  GLM-5.2 shared layer): one static buffer per input, sized for the largest bucket (staging.py);
  bucket b's graph reads the views [:b]. run() copies the step into them (M <= b rows, padding
  rows after, see staging.py) and replays; rebind(block_table=...) copies into that buffer too.
- outputs and intermediates: allocated during capture from the graph's private pool, kept alive with
  the graph; run() returns views of their first M rows, valid until the next run() of that bucket.
- weights, kv_cache, index_k_cache: captured BY ADDRESS. The caches are the KV pools (GBs): they are
  never copied. rebind(kv_cache=..., index_k_cache=...) with the same storage is a no-op; a new
  address marks every captured bucket stale, and each is re-captured (once) on its next run
  (`captures` counts captures). Weights are fixed for the executor's life.
- E1 is launched with max_ctx = max_pages * 64 (the static block table's reach): the captured logits
  width. Pass max_pages = the longest context the executor must serve, in 64-token pages.

Before any capture: glm5_fastpath.ops.precompile(cfg, device) (kernels, split-K / C0 workspaces,
RoPE tables) and one eager warm-up run of the schedule on padding rows only (writes only pad_slot).

`capture=False` (default on a CPU device) runs the same schedule eagerly on the static buffers
instead of replaying a graph, with any implementation namespace (e.g. glm5_fastpath.ref.prefix):
the CPU tests of staging / buckets / rebinding use it.

A mode with `l2:OP=F` modifiers (modes.py) also issues, before the first launch, ops.prefetch.l2_prefetch of
those ops' 2-D weights and scales on a prefetch stream of its own (forked from main, joined back at the end; not
one of the schedule's streams): issue_l2_prefetch / join_l2_prefetch, shared with the SGLang seam. The form is
read from the environment when an executor is built: GLM5_FASTPATH_CMP_L2_BULK=1 -> bulk (TMA) prefetches,
unset / 0 -> line prefetches (jit.env flag syntax). On a CPU device nothing is issued.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ...config import Glm5Config
from ...graph.eager import run_eager
from ...graph.prefix_graph import D2_WEIGHTS, ENV_D2_WEIGHTS, build_prefix_graph, d2_weights_request, weight_tensors
from .modes import OP_FUNCTIONS, Mode, get_mode, resolve_wait_points, wait_support
from .staging import PAGE, StagingError, StaticInputs, pick_bucket
from .streams import MAIN, Schedule, build_schedule, check_exclusive

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEP_INPUTS = ("hidden", "residual", "positions", "out_cache_loc", "seq_lens", "block_table")
ENV_L2_BULK = "GLM5_FASTPATH_CMP_L2_BULK"  # "1": the l2:OP=F modifiers use bulk prefetches (module doc)


class CmpError(ValueError):
    """Wrong executor arguments (caches, weights, devices)."""


def _accepts(fn: Any, kw: str) -> bool:
    try:
        return kw in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class BoundOps:
    """The implementation namespace with per-function keyword arguments bound (pdl=, the wait-point
    switch, E1's max_ctx); keywords a function does not accept are dropped (e.g. the reference has no pdl)."""

    def __init__(self, impl: Any, kwargs: Mapping[str, Mapping[str, Any]]):
        self._impl, self._kwargs = impl, {k: dict(v) for k, v in kwargs.items()}

    def __getattr__(self, name: str):
        fn = getattr(self._impl, name)
        kw = {k: v for k, v in self._kwargs.get(name, {}).items() if _accepts(fn, k)}
        return functools.partial(fn, **kw) if kw else fn


def _stream_ctx(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


@dataclass
class _Bucket:
    size: int
    env: dict[str, torch.Tensor]
    cache_ptrs: tuple[int, ...]
    graph: Any = None  # torch.cuda.CUDAGraph, or None (eager replay)
    keep: list = field(default_factory=list)


class CmpExecutor:
    def __init__(self, cfg: Glm5Config, weights, device, buckets: Sequence[int] = DEFAULT_BUCKETS, mode: str | Mode = "full",
                 *, kv_cache: torch.Tensor | None = None, index_k_cache: torch.Tensor | None = None,
                 max_pages: int | None = None, pad_slot: int = 0, impl: Any = None, capture: bool | None = None,
                 pins: Mapping[str, int] | None = None, precompile: bool = True, d2_weights: str | None = None):
        if not isinstance(cfg, Glm5Config):
            raise CmpError(f"cfg must be a Glm5Config, got {type(cfg).__name__}")
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.w = getattr(weights, "attn", weights)
        self.shared_layer = self.w.indexer is None
        self.mode = get_mode(mode)
        if impl is None:
            from ... import ops as impl  # noqa: PLC0415 (kernels: imported lazily, needs no GPU)
        self.impl = impl
        self.capture_graphs = (self.device.type == "cuda") if capture is None else bool(capture)
        if self.capture_graphs and self.device.type != "cuda":
            raise CmpError("capture=True needs a CUDA device")
        self.max_pages = int(max_pages) if max_pages is not None else -(-cfg.max_position_embeddings // PAGE)
        self.max_ctx = self.max_pages * PAGE

        try:
            self.d2_weights = resolve_d2_weights(self.w, d2_weights)
        except ValueError as e:
            raise CmpError(str(e)) from None
        ref_graph = build_prefix_graph(cfg, full_indexer=not self.shared_layer, d2_weights=self.d2_weights)
        ops = ref_graph.topo_order()
        # raises NotImplementedError for a wait point the kernels cannot realize
        self.wait_plans = resolve_wait_points(self.mode, ops, wait_support(impl, ops))
        kwargs: dict[str, dict[str, Any]] = {}
        for op in ops:
            fn = OP_FUNCTIONS[op]
            kwargs[fn] = {"pdl": self.mode.pdl, **self.wait_plans[op].kwargs}
        kwargs.setdefault(OP_FUNCTIONS["E1"], {})["max_ctx"] = self.max_ctx
        self.bound = BoundOps(impl, kwargs)
        self.graph = build_prefix_graph(cfg, full_indexer=not self.shared_layer, impl=self.bound,
                                        d2_weights=self.d2_weights)
        try:
            self.mode = self.mode.for_ops(ops)  # caps / pins / edges naming an op this graph lacks do not apply
        except ValueError as e:
            raise CmpError(str(e)) from None
        self.schedule: Schedule = build_schedule(self.graph, self.mode, wait_plans=self.wait_plans, pins=pins)
        check_exclusive(self.graph, self.schedule, workspace_groups(self.graph))
        try:
            self.l2_names = l2_prefetch_names(self.mode, self.graph)  # raises for an op without 2-D weights
        except ValueError as e:
            raise CmpError(str(e)) from None
        self.l2_bulk = l2_bulk_from_env()
        self._l2_stream = None  # the prefetch stream (made on first use, like the side streams)

        self._weights = {k: v for k, v in weight_tensors(self.w).items() if k in self.graph.tensors}
        for k, v in self._weights.items():
            if v.device != self.device:
                raise CmpError(f"weight {k} is on {v.device}, the executor on {self.device}")
        self.staging = StaticInputs(cfg, buckets, self.max_pages, pad_slot, self.device, self.shared_layer)
        self.buckets = self.staging.buckets
        self.kv_cache: torch.Tensor | None = None
        self.index_k_cache: torch.Tensor | None = None
        self._buckets: dict[int, _Bucket] = {}
        self.captures = 0
        self._side: list = []
        self._main = None
        self._precompiled = not precompile
        self.rebind(kv_cache=kv_cache, index_k_cache=index_k_cache)

    # ---- binding ---------------------------------------------------------------------------------------

    def _check_cache(self, name: str, t: torch.Tensor, dtype: torch.dtype, width: int) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != 2 or t.shape[1] != width:
            raise CmpError(f"{name} must be a 2-D {dtype} tensor with {width} columns, got "
                           f"{getattr(t, 'dtype', type(t).__name__)} {list(getattr(t, 'shape', []))}")
        if t.device != self.device:
            raise CmpError(f"{name} is on {t.device}, the executor on {self.device}")
        if not t.is_contiguous():
            raise CmpError(f"{name} must be contiguous")

    def rebind(self, *, kv_cache: torch.Tensor | None = None, index_k_cache: torch.Tensor | None = None,
               block_table: torch.Tensor | None = None) -> None:
        """Bind new caches (captured by address: a new address re-captures each bucket on its next run)
        and/or copy a block table into the static buffer (no re-capture). None leaves a binding as is."""
        from ...ref.fp8 import index_k_page_bytes

        if kv_cache is not None:
            self._check_cache("kv_cache", kv_cache, torch.bfloat16, self.cfg.kv_cache_dim)
            if self.staging.pad_slot >= kv_cache.shape[0]:
                raise CmpError(f"pad_slot {self.staging.pad_slot} is outside kv_cache ({kv_cache.shape[0]} slots)")
            self.kv_cache = kv_cache
        if index_k_cache is not None:
            if self.shared_layer:
                raise CmpError("a GLM-5.2 shared layer does not use index_k_cache")
            self._check_cache("index_k_cache", index_k_cache, torch.uint8, index_k_page_bytes(self.cfg.index_head_dim))
            if self.staging.pad_page >= index_k_cache.shape[0]:
                raise CmpError(f"pad page {self.staging.pad_page} is outside index_k_cache ({index_k_cache.shape[0]} pages)")
            self.index_k_cache = index_k_cache
        if block_table is not None:
            self.staging.bind_block_table(block_table)

    def _cache_ptrs(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() if t is not None else 0 for t in (self.kv_cache, self.index_k_cache))

    def stale(self, bucket: int) -> bool:
        b = self._buckets.get(bucket)
        return b is None or b.cache_ptrs != self._cache_ptrs()

    # ---- enqueue / capture ---------------------------------------------------------------------------------

    def _external_env(self, bucket: int) -> dict[str, torch.Tensor]:
        if self.kv_cache is None or (not self.shared_layer and self.index_k_cache is None):
            raise CmpError("bind the caches first: CmpExecutor(..., kv_cache=, index_k_cache=) or rebind(...)")
        env = dict(self._weights)
        env.update(self.staging.views(bucket))
        env["kv_cache"] = self.kv_cache
        if not self.shared_layer:
            env["index_k_cache"] = self.index_k_cache
        return {k: v for k, v in env.items() if k in self.graph.tensors}

    def _streams(self) -> list:
        if self.device.type != "cuda":
            return [None] * self.schedule.num_streams
        main = torch.cuda.current_stream(self.device)
        while len(self._side) < self.schedule.num_streams - 1:
            self._side.append(torch.cuda.Stream(self.device))
        return [main] + self._side[: self.schedule.num_streams - 1]

    def enqueue(self, bucket: int, env: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Issue the schedule once on the CURRENT stream (main) and the side streams, over bucket's static
        inputs (or `env`, the graph's external tensors): eagerly, or into the capture in progress.
        -> every named tensor (inputs, weights, caches, intermediates, outputs)."""
        out = dict(self._external_env(bucket) if env is None else env)
        streams = self._streams()
        cuda = streams[MAIN] is not None
        l2 = None
        if cuda and self.l2_names:
            if self._l2_stream is None:  # kept: the warm-up run makes it, the capture reuses it
                self._l2_stream = torch.cuda.Stream(self.device)
            l2 = issue_l2_prefetch(self.mode, self.graph, out, streams[MAIN], self._l2_stream, bulk=self.l2_bulk)
        events: dict[str, Any] = {}
        for l in self.schedule.launches:
            s = streams[l.stream]
            if cuda:
                for w in l.waits:
                    s.wait_event(events[w])
            op = self.graph.ops[l.op]
            with _stream_ctx(s if cuda and l.stream != MAIN else None), \
                    op_launch_context(self.mode, l.op, cuda, self.device):
                produced = op.ref({t: out[t] for t in op.inputs})
            if set(produced) != set(op.outputs):
                raise CmpError(f"op {l.op} returned {sorted(produced)}, declared {sorted(op.outputs)}")
            out.update(produced)
            if cuda and l.records:
                ev = torch.cuda.Event()
                ev.record(s)
                events[l.op] = ev
        if cuda:
            for j in self.schedule.joins:
                streams[MAIN].wait_event(events[j])
            join_l2_prefetch(streams[MAIN], l2)
        return out

    def _priority(self, op: str, cuda: bool):
        """The launch priority of op's kernels under this schedule's mode (modes.Mode.priority_ops): the context's
        greatest priority for the named ops, the stream's own otherwise."""
        return mode_priority(self.mode, op, cuda, self.device)

    def prepare(self) -> None:
        """Compile / load the kernels and allocate their workspaces and RoPE tables (before any capture)."""
        self._precompile()

    def _precompile(self) -> None:
        if self._precompiled or self.device.type != "cuda":
            return
        pre = getattr(self.impl, "precompile", None)
        if pre is not None:
            pre(self.cfg, self.device)
        if self.l2_names:  # ops.precompile leaves the prefetch kernel out (the engine does not use it)
            from ...ops import prefetch

            prefetch.precompile(self.device)
        self._precompiled = True

    def capture(self, bucket: int | None = None) -> None:
        """(Re-)capture one bucket, or every bucket; pads the static inputs first (the warm-up run then
        writes only pad_slot)."""
        for b in ([bucket] if bucket is not None else self.buckets):
            if b not in self.buckets:
                raise StagingError(f"{b} is not one of the buckets {self.buckets}")
            self._capture(b)

    def _capture(self, b: int) -> None:
        self._precompile()
        st = self.staging
        st.pad(0, st.dirty)
        st.dirty = 0
        self._buckets.pop(b, None)
        ptrs = self._cache_ptrs()
        if not self.capture_graphs:
            env = self.enqueue(b)
            self._buckets[b] = _Bucket(b, env, ptrs)
        else:
            if self._main is None:
                self._main = torch.cuda.Stream(self.device)
            with torch.cuda.device(self.device):
                self._main.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self._main):  # warm-up: JIT loads, workspaces, allocator
                    self.enqueue(b)
                torch.cuda.synchronize(self.device)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=self._main):
                    env = self.enqueue(b)
                torch.cuda.synchronize(self.device)
            self._buckets[b] = _Bucket(b, env, ptrs, g)
        self.captures += 1

    # ---- run -------------------------------------------------------------------------------------------

    def bucket_for(self, m: int) -> int:
        return pick_bucket(m, self.buckets)

    def run(self, *, hidden: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
            out_cache_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor | None = None,
            prev_topk: torch.Tensor | None = None, all_tensors: bool = False) -> dict[str, torch.Tensor]:
        """One decode step of M rows (any M <= the largest bucket) -> the graph's outputs (residual_out,
        q_pe, q_lat, topk_slots; every produced tensor with all_tensors=True) as views of the first M rows.
        block_table=None keeps the bound one (rebind); prev_topk: a shared layer's top-k input."""
        inputs = {"hidden": hidden, "residual": residual, "positions": positions, "out_cache_loc": out_cache_loc,
                  "seq_lens": seq_lens, "block_table": block_table}
        if self.shared_layer:
            if prev_topk is None:
                raise StagingError("a GLM-5.2 shared layer needs prev_topk (the last full layer's top-k slots)")
            inputs["topk_slots"] = prev_topk
        elif prev_topk is not None:
            raise StagingError("prev_topk is only for GLM-5.2 shared layers")
        m = self.staging.check(inputs, need_block_table=block_table is not None)
        b = self.bucket_for(m)
        if self.stale(b):
            self._capture(b)
        self.staging.load(inputs, b)
        bk = self._buckets[b]
        if bk.graph is not None:
            bk.graph.replay()
        else:
            new = self.enqueue(b)
            for k, v in new.items():  # emulate static outputs: copy into the first run's tensors
                old = bk.env[k]
                if old.data_ptr() != v.data_ptr():
                    old.copy_(v)
        names = [t for t in self.graph.produced_tensors() if all_tensors or self.graph.tensors[t].kind == "output"]
        return {t: bk.env[t][:m] for t in names if self.graph.tensors[t].inplace_of is None}

    def run_step(self, step, **kw) -> dict[str, torch.Tensor]:
        """run() on a testing.decode_step.DecodeStep-like object (its caches must be the bound ones)."""
        return self.run(hidden=step.hidden, residual=step.residual, positions=step.positions,
                        out_cache_loc=step.out_cache_loc, seq_lens=step.seq_lens, block_table=step.block_table, **kw)

    def eager(self, *, hidden, residual, positions, out_cache_loc, seq_lens, block_table, kv_cache,
              index_k_cache=None, prev_topk=None) -> dict[str, torch.Tensor]:
        """The same bound kernels run eagerly on one stream over the given (unpadded) tensors: the
        bit-exact comparison point of a replay. The block table is widened to max_pages columns (E1's
        captured width)."""
        bt = block_table
        if bt.shape[1] < self.max_pages:
            bt = torch.cat([bt, bt.new_full((bt.shape[0], self.max_pages - bt.shape[1]), self.staging.pad_page)], 1)
        env = {"hidden": hidden, "residual": residual, "positions": positions, "out_cache_loc": out_cache_loc,
               "seq_lens": seq_lens, "block_table": bt, "kv_cache": kv_cache, **self._weights}
        if index_k_cache is not None:
            env["index_k_cache"] = index_k_cache
        if prev_topk is not None:
            env["topk_slots"] = prev_topk
        return run_eager(self.graph, {k: v for k, v in env.items() if k in self.graph.tensors})


def workspace_groups(graph) -> list[list[str]]:
    """Ops that share a split-K / C0 workspace (same kernel family, same (N, K)). In the GLM-5 prefix
    every op has its own ((epilogue, N, K) differ), so this is empty; kept as a checked invariant."""
    keys: dict[tuple, list[str]] = {}
    fam = {"B0": "qkv_a", "B1": "indexer_k", "D1": "indexer_q", "D0": "q_b", "C0": "c0"}
    for op in graph.ops:
        if op in fam:
            keys.setdefault((fam[op],), []).append(op)
    return [v for v in keys.values() if len(v) > 1]


def gemm_caps(mode: Mode, op: str):
    """The mode's caps for op's GEMM, as one context manager around the op's call: modes.Mode.grid_caps (a
    persistent launch on <= N CTAs) and Mode.stage_caps (<= N ring stages)."""
    caps, stages = dict(mode.grid_caps), dict(mode.stage_caps)
    if op not in caps and op not in stages:
        return contextlib.nullcontext()
    from ...ops.fp8_gemm import grid_cap, stage_cap

    st = contextlib.ExitStack()
    if op in stages:
        st.enter_context(stage_cap(stages[op]))
    if op in caps:
        st.enter_context(grid_cap(caps[op]))
    return st


def mode_priority(mode: Mode, op: str, cuda: bool, device: Any = None):
    """For the mode's priority_ops on CUDA streams: launch at the context's greatest priority (on `device`,
    default the current one); otherwise nothing."""
    if not cuda or op not in mode.priority_ops:
        return contextlib.nullcontext()
    from ...jit.runtime import launch_priority, priority_range

    return launch_priority(priority_range(device)[1])


def op_launch_context(mode: Mode, op: str, cuda: bool, device: Any = None):
    """Everything a mode sets around one op's launch besides streams and waits: its GEMM caps and its launch
    priority (mode_priority). Used by CmpExecutor and the SGLang seam's executor alike."""
    st = contextlib.ExitStack()
    st.enter_context(gemm_caps(mode, op))
    st.enter_context(mode_priority(mode, op, cuda, device))
    return st


# ---- the l2:OP=F modifiers (modes.py) -------------------------------------------------------------------------

def l2_bulk_from_env() -> bool:
    """GLM5_FASTPATH_CMP_L2_BULK=1: bulk (TMA) prefetches for l2:OP=F; else line prefetches (module doc)."""
    from ...jit import env

    return env.flag(ENV_L2_BULK)


def l2_prefetch_names(mode: Mode, graph) -> list[tuple[str, float]]:
    """(tensor name, fraction) the mode's l2:OP=F prefetch: each named op's 2-D `w.*` inputs (GEMM weight and
    scales; 1-D norms / biases are not worth a range), once each. An op the graph lacks is skipped (modes.Mode.for_ops);
    an op of the graph with no such input raises ValueError (the modifier would silently do nothing)."""
    out: dict[str, float] = {}
    for op, f in mode.l2_prefetch:
        if op not in graph.ops:
            continue
        names = [t for t in graph.ops[op].inputs if t.startswith("w.") and len(graph.tensors[t].shape) == 2]
        if not names:
            raise ValueError(f"CMP mode {mode.name}: l2:{op} names an op with no 2-D weights to prefetch")
        for t in names:
            out.setdefault(t, float(f))
    return list(out.items())


def l2_prefetch_tensors(mode: Mode, graph, env: Mapping[str, torch.Tensor]) -> list[tuple[torch.Tensor, float]]:
    """(tensor, fraction) for one l2_prefetch issue: l2_prefetch_names resolved in `env` (names missing there,
    e.g. a weight the seam did not bind, are skipped)."""
    return [(env[t], f) for t, f in l2_prefetch_names(mode, graph) if env.get(t) is not None]


def issue_l2_prefetch(mode: Mode, graph, env: Mapping[str, torch.Tensor], main, side=None, *, bulk: bool = False):
    """The mode's l2:OP=F prefetches on `side` (None: a new stream; pass one made before any capture), forked
    from `main` (before the schedule's first launch, so they overlap its early, latency-bound kernels). -> the
    stream to pass to join_l2_prefetch, or None when nothing was issued (no modifier, main None = no CUDA, no
    tensor). Capture-safe: fork and join are stream waits."""
    pairs = l2_prefetch_tensors(mode, graph, env) if main is not None and mode.l2_prefetch else []
    pairs = [(t, f) for t, f in pairs if t.is_cuda]
    if not pairs:
        return None
    from ...ops.prefetch import MAX_RANGES, l2_prefetch

    if side is None:
        side = torch.cuda.Stream(main.device)
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            for i in range(0, len(pairs), MAX_RANGES):  # the kernel takes MAX_RANGES tensors per launch
                chunk = pairs[i: i + MAX_RANGES]
                l2_prefetch([t for t, _ in chunk], [f for _, f in chunk], pdl=False, bulk=bulk)
    except BaseException:
        main.wait_stream(side)  # a forked stream left unjoined would invalidate a capture in progress
        raise
    return side


def join_l2_prefetch(main, side) -> None:
    """main waits for the prefetch stream (issue_l2_prefetch's result; None: nothing to join). Needed before a
    capture ends; by the end of the prefix the prefetch is long done, so the wait costs nothing."""
    if side is not None:
        main.wait_stream(side)


def resolve_d2_weights(w: Any, requested: str | None = None) -> str:
    """The form of W_UK the prefix graph's D2 reads (graph.prefix_graph D2_WEIGHTS): `requested`, or
    GLM5_FASTPATH_D2_WEIGHTS when None (default "bf16"). "fp8": the checkpoint's FP8 kv_b bytes (AttnWeights.w_kc_fp8 /
    w_kc_scale; half of D2's weight bytes, q_lat bit for bit the same), which the weights must carry; "auto": fp8 when
    they do, else bf16. Raises ValueError for another value or for fp8 without the FP8 form."""
    want = requested if requested is not None else d2_weights_request()
    has_fp8 = getattr(w, "w_kc_fp8", None) is not None and getattr(w, "w_kc_scale", None) is not None
    if want == "auto":
        return "fp8" if has_fp8 else "bf16"
    if want not in D2_WEIGHTS:
        raise ValueError(f"d2_weights / {ENV_D2_WEIGHTS}={want!r}: expected one of {D2_WEIGHTS + ('auto',)}")
    if want == "fp8" and not has_fp8:
        raise ValueError(f"d2_weights='fp8' needs the FP8 form of W_UK (AttnWeights.w_kc_fp8 / w_kc_scale, from an FP8 "
                         f"kv_b_proj: ref.fp8.w_kc_fp8_from_kv_b); these weights have none")
    return want

