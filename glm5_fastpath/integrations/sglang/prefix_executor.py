"""The attention-prefix route: `forward_absorb_prepare` computed by our ops (docs/sglang_prefix_contract.md).

`PrefixExecutor` is what patch.EXECUTORS["prefix"]["cmp"] calls as fn(original, *args, **kwargs) for a
decode step the Router sent to "cmp". It returns exactly the tuple SGLang's forward_absorb_core takes:

    (q_pe [M,H,64] roped, k_pe [M,1,64] roped, q_nope_out [M,H,512] (= q_nope . W_UK), k_nope [M,1,512]
     (kv_a-normed latent), forward_batch, zero_allocator, positions, topk_indices [M,2048] int32,
     llama_4_scaling[, fusion_plan=None on SGLang >= 0.5.23])

and the cache writes SGLang's pools expect from the prepare: the index-K entry of every new token in
the layer's DSATokenToKVPool page (full route). The latent KV (k_nope | k_pe) is written by SGLang's
DSA backend inside forward_absorb_core (`save_kv_cache=True` is hard-coded there), from the k_nope /
k_pe we return: D2 stores that row into a per-call [M, 576] scratch (identity slots) whose views we
return, so the pool is written once, by SGLang, in its own layout (bf16 or FP8). With the q_cat route
(qcat_route.py, opt-in GLM5_FASTPATH_QCAT=1, bf16 pools only) D2 also stores the row into the pool itself and writes
q_nope_out / q_pe as the two column views of one [M, H, 576] buffer, which the route hands to the DSA backend's
forward_decode as its q, with no k: SGLang's concat and store kernels do not run.

The prefix is the op graph of graph/prefix_graph.py with its first op A0 (residual add + RMSNorm +
quant: done by SGLang's layer boundary before this seam) replaced by Q0 (1x128 FP8 quant of the
normed hidden state), and run by one of:
- the op graph's eager executor (`run_eager`, mode "serial": one stream, topological order), or
- CMP's launch schedule (attn_pre/cmp/streams.py: branches on their own streams, event joins, PDL on
  every kernel; modes "multistream*" / "full"). Inside SGLang the decode CUDA graph SGLang captures per
  batch size IS the bucket's CUDA graph: our launches are captured into it. CMP's own per-bucket graphs
  (CmpExecutor) cannot be nested: PyTorch allows one capture per process, and a capture cannot replay
  another graph, so the schedule, not the CmpExecutor object, is what runs here.
A mode's `l2:OP=F` modifiers are honoured as CmpExecutor does (cmp/executor.py issue_l2_prefetch /
join_l2_prefetch: a prefetch stream forked before the first launch, joined at the end), in both runners.

Routes per layer (prefix_adapter.check_layer): "full" (our ops for everything: SGLang >= 0.5.23 with the
fused indexer, or SGLang 0.5.14 with B1 / D1 rotating q and k like its indexer, LayerRoute.rotate),
"partial" (SGLang's own indexer for top-k and index-K: an indexer format we do not recognise for sure),
"shared" (GLM-5.2 IndexShare layer: the previous top-k passed on). Anything else, and
any call whose inputs we do not mirror, falls back to SGLang's original method, logged once per reason
and counted in glm5_fastpath_prefix_layer_total{route, reason} (host-side: under CUDA graphs a call is
a capture, replays are counted by glm5_fastpath_path_total per step).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ...config import INDEX_K_PAGE_TOKENS, Glm5Config
from ...graph.eager import run_eager
from ...graph.op_graph import OpDef, OpGraph, TensorDef
from ...graph.prefix_graph import build_prefix_graph, weight_tensors
from ...metrics import PREFIX_LAYER_TOTAL as METRIC, seam_counter  # listed in metrics.METRICS
from ...ref import fp8 as ref_fp8
from . import prefix_adapter as A
from . import qcat_route as QC

logger = logging.getLogger("glm5_fastpath")

STATE = "_glm5_fastpath_prefix"
PAGE = INDEX_K_PAGE_TOKENS
BF16, I32, I64 = torch.bfloat16, torch.int32, torch.int64
DEFAULT_MODE = "full"  # CMP: branches on streams + PDL (on a CPU device every mode runs serially)


def table_pdl_waits(table: Any) -> tuple[str | None, ...]:
    """The PDL wait points our kernels launch with in the table's CMP buckets, None (native) first: a mode that
    waits earlier than a kernel's native point ("entry", "after_prologue") launches a separate cubin, so install
    compiles those too (else they compile inside SGLang's graph capture; seen on the H200, 2026-11-29)."""
    from ...attn_pre.cmp.modes import get_mode

    out: list[str | None] = [None]
    for b in getattr(table, "buckets", ()) or ():
        if getattr(b, "prefix", None) != "cmp":
            continue
        m = get_mode(getattr(b, "cmp_mode", None) or DEFAULT_MODE)
        if m.pdl and m.wait_point in ("entry", "after_prologue") and m.wait_point not in out:
            out.append(m.wait_point)
    return tuple(out)


# ---- Q0: the activation quant the seam needs --------------------------------------------------------------

def ref_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, H] bf16 -> (x_fp8, x_scale [M, H/128] fp32 row-major): the reference (A0's quant half)."""
    return ref_fp8.quant_act_per_token(x)


def sglang_quant() -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """SGLang's per-token-group FP8 quant (the kernel its own QKV-A GEMM input goes through), row-major
    scales; None when it cannot be imported (then the reference runs)."""
    for name in ("sglang.kernels.ops.quantization.fp8_kernel", "sglang.srt.layers.quantization.fp8_kernel"):
        fn = getattr(A.sglang_module(name), "sglang_per_token_group_quant_fp8", None)
        if fn is None:
            continue

        def q(x: torch.Tensor, _fn=fn) -> tuple[torch.Tensor, torch.Tensor]:
            return _fn(x, 128, column_major_scales=False)

        return q
    return None


# ---- the seam graph ----------------------------------------------------------------------------------------

def _remap(ref: Callable, names: Mapping[str, str]) -> Callable:
    """Call `ref` with input `new` presented under the name `old` for every old -> new in `names`."""
    def f(i: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        j = dict(i)
        for old, new in names.items():
            j[old] = j.pop(new)
        return ref(j)
    return f


def _no_tiles(ctx) -> list:
    return []


def _qcat_d2(op: OpDef, impl: Any, cfg: Glm5Config) -> OpDef:
    """D2 in its q_cat form (ops.d2_absorb.d2_absorb_qcat; qcat_route.py): q_lat written as the first kv_lora
    columns of q_cat [M, H, kv_lora + rope], D0's q_pe copied into the rest, and each latent-KV row stored both into
    the scratch (kv_slots) and into SGLang's pool (pool_loc). Same op name and dependencies as D2 (its extra inputs:
    q_pe from D0, which D2 already follows, and pool_loc / kv_pool from the caller), so every CMP mode schedules it
    as D2."""
    kvl = cfg.kv_lora_rank
    w_names = tuple(t for t in op.inputs if t.startswith("w."))

    def ref(i):
        from ...graph.prefix_graph import _weights_view

        q_cat = impl.d2_absorb_qcat(i["q_nope"], i["c_kv"], i["k_pe"], _weights_view(i), i["positions"],
                                    i["kv_slots"], i["kv_cache"], i["q_pe"], i["pool_loc"], i["kv_pool"], cfg)
        return {"q_cat": q_cat, "kv_cache_written": i["kv_cache"], "kv_pool_written": i["kv_pool"]}

    def tiles(ctx):
        out = []
        for t in op.tiles(ctx):
            w, r = dict(t.writes), dict(t.reads)
            rows, head, (n0, n1) = w.pop("q_lat")
            if n1 == kvl:  # the last latent tile of a head also copies that head's q_pe rows (the kernel's rule)
                n1 = kvl + cfg.qk_rope_head_dim
                r["q_pe"] = (rows, head, (0, cfg.qk_rope_head_dim))
            w["q_cat"] = (rows, head, (n0, n1))
            if "kv_cache_written" in w:
                w["kv_pool_written"] = w["kv_cache_written"]
                r["pool_loc"] = (rows,)
            out.append(dataclasses.replace(t, writes=w, reads=r))
        return out

    inputs = ("q_nope", "c_kv", "k_pe", *w_names, "positions", "kv_slots", "kv_cache", "q_pe", "pool_loc", "kv_pool")
    return dataclasses.replace(op, inputs=inputs, outputs=("q_cat", "kv_cache_written", "kv_pool_written"), ref=ref,
                               tiles=tiles, doc=op.doc + "; q_cat form: [q_lat | q_pe] and the pool row")


def seam_graph(cfg: Glm5Config, kind: str, impl: Any, quant: Callable, rotate: bool = False,
               d2_weights: str = "bf16", qcat: bool = False) -> OpGraph:
    """The prefix graph as the forward_absorb_prepare seam sees it (module doc): Q0 instead of A0; D2
    stores into the caller's scratch at `kv_slots`; E1 is as wide as the block table; E2 maps through
    `topk_table` (the page table for physical slots, an identity table for logical positions).
    rotate: B1 / D1 Hadamard-rotate (the index-K format of SGLang 0.5.14's indexer; full route only).
    qcat: D2 in its q_cat form (_qcat_d2): outputs q_cat and the pool rows instead of q_lat."""
    full = kind == "full"
    base = build_prefix_graph(cfg, full_indexer=full, impl=impl, indexer_rotate=bool(rotate and full),
                              d2_weights=d2_weights)

    def ref_q0(i):
        x8, xs = quant(i["x_in"])
        return {"x_bf16": i["x_in"], "x_fp8": x8, "x_scale": xs}

    def ref_e1(i):
        bt = i["block_table"]
        return {"logits": impl.e1_indexer_logits(i["index_q_fp8"], i["head_w"], i["index_k_cache_written"],
                                                 i["seq_lens"], bt, cfg, max_ctx=int(bt.shape[1]) * PAGE)}

    ops = [OpDef("Q0", ("x_in",), ("x_bf16", "x_fp8", "x_scale"), ref_q0, _no_tiles,
                 doc="1x128 FP8 quant of the normed hidden state (A0's residual add + RMSNorm ran in SGLang)")]
    for name, op in base.ops.items():
        if name == "A0":
            continue
        if name == "D2":
            op = dataclasses.replace(op, inputs=tuple("kv_slots" if t == "out_cache_loc" else t for t in op.inputs),
                                     ref=_remap(op.ref, {"out_cache_loc": "kv_slots"}))
            if qcat:
                op = _qcat_d2(op, impl, cfg)
        elif name == "E1":
            op = dataclasses.replace(op, ref=ref_e1)
        elif name == "E2":
            op = dataclasses.replace(op, inputs=("logits", "seq_lens", "topk_table"),
                                     ref=_remap(op.ref, {"block_table": "topk_table"}))
        ops.append(op)
    extra = [TensorDef("x_in", ("M", cfg.hidden_size), BF16, "input", doc="hidden_states of the seam (normed)"),
             TensorDef("kv_slots", ("M",), I64, "input", doc="rows of the KV scratch: 0..M-1")]
    if qcat:
        kvd, nh = cfg.kv_cache_dim, cfg.num_attention_heads
        extra += [TensorDef("q_cat", ("M", nh, kvd), BF16, "output", doc="[q_lat | q_pe]: the sparse MLA's q"),
                  TensorDef("pool_loc", ("M",), I64, "input", doc="SGLang's out_cache_loc (pool rows)"),
                  TensorDef("kv_pool", ("pool_slots", kvd), BF16, "cache", doc="SGLang's latent-KV pool rows"),
                  TensorDef("kv_pool_written", ("pool_slots", kvd), BF16, "cache", inplace_of="kv_pool",
                            region_shape=("M", kvd))]
    if full:
        extra.append(TensorDef("topk_table", ("M", "max_pages"), I32, "input"))
    used = {t for o in ops for t in o.inputs + o.outputs}
    tensors = [t for t in base.tensors.values() if t.name in used] + extra
    return OpGraph(ops, tensors, name=f"glm5_prefix_seam[{kind}{',rotated' if rotate and full else ''}"
                                         f"{',d2fp8' if d2_weights == 'fp8' else ''}{',qcat' if qcat else ''}]"
                   ).validate()


def _record(t: Any, stream: Any) -> None:
    if stream is not None and isinstance(t, torch.Tensor) and t.is_cuda:
        t.record_stream(stream)


def enqueue(graph: OpGraph, schedule: Any, env: Mapping[str, torch.Tensor], streams: list, *, l2_stream: Any = None,
            l2_bulk: bool = False) -> dict[str, torch.Tensor]:
    """Issue `schedule` (cmp/streams.py) on the current stream (main) and `streams[1:]`: eagerly, or into the
    CUDA-graph capture in progress (side streams join it through events recorded on captured streams). If an
    op raises, every side stream used so far is joined back to main first, so SGLang's capture stays valid.
    l2_stream / l2_bulk: the prefetch stream and form of the mode's l2:OP=F modifiers (a new stream when None;
    pass one made before any capture)."""
    from ...attn_pre.cmp.executor import issue_l2_prefetch, join_l2_prefetch, op_launch_context
    from ...attn_pre.cmp.modes import get_mode

    mode = get_mode(schedule.mode)  # its priorities, GEMM caps and L2 prefetches (composite names round-trip)
    out = dict(env)
    cuda = streams[0] is not None
    where: dict[str, int] = {}
    events: dict[str, Any] = {}
    used: set[int] = set()
    l2 = None
    try:
        if cuda and mode.l2_prefetch:
            l2 = issue_l2_prefetch(mode, graph, out, streams[0], l2_stream, bulk=l2_bulk)
        for launch in schedule.launches:
            s = streams[launch.stream]
            if cuda:
                for w in launch.waits:
                    s.wait_event(events[w])
                used.add(launch.stream)
            op = graph.ops[launch.op]
            ins = {t: out[t] for t in op.inputs}
            if cuda:  # tensors made on another stream are used here: keep the allocator from recycling them early
                for t in op.inputs:
                    if where.get(t, 0) != launch.stream:
                        _record(out[t], s)
            with (torch.cuda.stream(s) if cuda and launch.stream != 0 else contextlib.nullcontext()), \
                    op_launch_context(mode, launch.op, cuda):
                produced = op.ref(ins)
            out.update(produced)
            for t in produced:
                where[t] = launch.stream
            if cuda and launch.records:
                ev = torch.cuda.Event()
                ev.record(s)
                events[launch.op] = ev
    except BaseException:
        if cuda:
            for i in sorted(used - {0}):
                streams[0].wait_stream(streams[i])
            join_l2_prefetch(streams[0], l2)
        raise
    if cuda:
        for j in schedule.joins:
            streams[0].wait_event(events[j])
        join_l2_prefetch(streams[0], l2)
        for t, st in where.items():  # consumed by SGLang on main
            if st != 0:
                _record(out[t], streams[0])
    return out


@dataclass
class _Plan:
    graph: OpGraph
    schedule: Any  # cmp.streams.Schedule, None for mode "serial"
    num_streams: int


# ---- per layer --------------------------------------------------------------------------------------------

@dataclass
class LayerRoute:
    layer_id: int
    kind: str  # "full" | "partial" | "shared" | "" (refused)
    refusal: A.Refusal | None = None
    weights: Any = None  # AttnWeights
    weight_env: dict[str, torch.Tensor] = field(default_factory=dict)
    signature: A.SeamSignature | None = None
    report: A.WeightReport | None = None
    rotate: bool = False  # full route: B1 / D1 Hadamard-rotate (SGLang 0.5.14's index-K format)
    d2_weights: str = "bf16"  # the W_UK form D2 reads (GLM5_FASTPATH_D2_WEIGHTS; "fp8" when the layer has it)


@dataclass
class PrepareSummary:
    routes: dict[str, list[int]] = field(default_factory=dict)  # kind or "stock:<reason>" -> layer ids
    added_bytes: int = 0
    relayout_bytes: int = 0
    refusals: dict[str, str] = field(default_factory=dict)  # reason -> first message
    rotated: list[int] = field(default_factory=list)  # full-route layers whose B1 / D1 rotate (SGLang 0.5.14)


def _bind_prepare(args: tuple, kwargs: dict) -> dict[str, Any]:
    names = A.PREPARE_PARAMS
    b = dict(zip(names, args))
    for k, v in kwargs.items():
        b[k] = v
    for k in names[4:]:
        b.setdefault(k, None)
    return b


def _module_flag(attn: Any, name: str) -> bool:
    mod = sys.modules.get(getattr(type(attn).forward_absorb_prepare, "__module__", ""), None)
    return bool(getattr(mod, name, False))


class PrefixExecutor:
    """fn(original, *args, **kwargs) for patch.EXECUTORS["prefix"]; see the module doc.

    impl: op namespace (default glm5_fastpath.ops, the kernels; glm5_fastpath.ref.prefix on CPU).
    mode: a CMP mode name (attn_pre/cmp/modes.py); "serial" runs the graph's eager executor.
    quant: Q0's function (default SGLang's per-token-group quant with the kernels, the reference otherwise).
    w_kc_policy: "relayout" | "copy" (prefix_adapter.build_weights).
    """

    def __init__(self, impl: Any = None, mode: str = DEFAULT_MODE, quant: Callable | None = None,
                 w_kc_policy: str = "relayout", cfg: Glm5Config | None = None, router: Any = None,
                 log: logging.Logger = logger) -> None:
        from ...attn_pre.cmp.executor import l2_bulk_from_env
        from ...graph.prefix_graph import d2_weights_request
        from ...attn_pre.cmp.modes import get_mode

        self._impl = impl
        self.mode = get_mode(mode)
        self._quant = quant
        self._stashed: Callable | None = None  # self._quant behind norm_route.stashed_quant
        self.w_kc_policy = w_kc_policy
        self.cfg = cfg
        self.router = router
        self.log = log
        self._once: set = set()
        self._plans: dict[str, _Plan] = {}
        self._streams: dict[Any, list] = {}
        self._l2_streams: dict[Any, Any] = {}  # per device: the l2:OP=F prefetch stream (cmp/executor.py)
        self.l2_bulk = l2_bulk_from_env()
        self.d2_request = d2_weights_request()
        self._arange: dict[Any, torch.Tensor] = {}
        self._iota: dict[Any, torch.Tensor] = {}

    # -- namespace, plans ----------------------------------------------------------------------------------
    @property
    def impl(self) -> Any:
        if self._impl is None:
            from ... import ops

            self._impl = ops
        return self._impl

    @property
    def quant(self) -> Callable:
        """Q0's function: the FP8 quant A0 already wrote when the norm route ran our A0 on this very tensor
        (norm_route.stashed_quant: no quant kernel), else self._quant."""
        if self._quant is None:
            from ...ref import prefix as ref_prefix

            q = None if self.impl is ref_prefix else sglang_quant()
            self._quant = q or ref_quant
        if getattr(self._stashed, "__wrapped__", None) is not self._quant:
            from .norm_route import stashed_quant

            self._stashed = stashed_quant(self._quant, self._quant_from_a0)
        return self._stashed

    def _quant_from_a0(self) -> None:
        if "q0_from_a0" not in self._once:
            self._once.add("q0_from_a0")
            self.log.info("glm5_fastpath: prefix: Q0 takes the FP8 quant A0 wrote (norm route): no quant kernel; "
                          "logged once")

    def mode_for(self, m: int) -> Any:
        """The CMP mode for a step of m tokens: the selection table's cmp_mode for m's bucket (measured per
        bucket by `glm5-fastpath tune`: PDL does not win everywhere), else this executor's own mode."""
        from ...attn_pre.cmp.modes import get_mode

        table = getattr(self.router, "table", None)
        look = table.lookup(m) if table is not None else None
        choice = getattr(look, "choice", None)
        return get_mode(choice.cmp_mode) if choice is not None and choice.prefix == "cmp" else self.mode

    def plan(self, kind: str, mode: Any = None, rotate: bool = False, d2_weights: str = "bf16",
             qcat: bool = False) -> _Plan:
        mode = self.mode if mode is None else mode
        rotate = bool(rotate and kind == "full")
        key = (kind, mode.name, rotate, d2_weights, bool(qcat))
        p = self._plans.get(key)
        if p is not None:
            return p
        from ...attn_pre.cmp.executor import BoundOps, l2_prefetch_names
        from ...attn_pre.cmp.modes import NATIVE_WAIT_POINTS, OP_FUNCTIONS, WaitPlan, resolve_wait_points, wait_support
        from ...attn_pre.cmp.streams import build_schedule

        probe = seam_graph(self.cfg, kind, self.impl, self.quant, rotate, d2_weights, qcat)  # op names only
        known = [o for o in probe.topo_order() if o in NATIVE_WAIT_POINTS]
        plans = dict(resolve_wait_points(mode, known, wait_support(self.impl, known)))
        plans["Q0"] = WaitPlan("Q0", mode.wait_point, None, {})
        kw = {OP_FUNCTIONS[o]: {"pdl": mode.pdl, **plans[o].kwargs} for o in known}
        if "d2_absorb_and_kv_store" in kw:  # D2's q_cat form launches with D2's PDL arguments
            kw["d2_absorb_qcat"] = kw["d2_absorb_and_kv_store"]
        bound = BoundOps(self.impl, kw)
        graph = seam_graph(self.cfg, kind, bound, self.quant, rotate, d2_weights, qcat)
        sched = build_schedule(graph, mode, wait_plans=plans) if mode.multistream else None
        l2_prefetch_names(mode, graph)  # an l2:OP=F naming an op without 2-D weights raises here, not mid-launch
        p = _Plan(graph, sched, sched.num_streams if sched is not None else 1)
        self._plans[key] = p
        return p

    # -- logging / metrics --------------------------------------------------------------------------------------
    def _note(self, route: str, reason: str, message: str | None = None, level: int = logging.INFO) -> None:
        once = getattr(self.router, "once", None)
        first = once.first("prefix-layer", route, reason) if once is not None else (route, reason) not in self._once
        self._once.add((route, reason))
        if first and message:
            self.log.log(level, message)
        self._count(route, reason)

    def _count(self, route: str, reason: str) -> None:
        metrics = getattr(self.router, "metrics", None)
        if metrics is None:
            return
        layer_counter(metrics.registry).labels(route=route, reason=reason).inc()

    # -- install-time preparation -------------------------------------------------------------------------------
    def layer_route(self, attn: Any) -> LayerRoute:
        r = attn.__dict__.get(STATE)
        if r is None:
            r = self.prepare_layer(attn)
        return r

    def prepare_layer(self, attn: Any) -> LayerRoute:
        if self.cfg is None:
            raise RuntimeError("PrefixExecutor: cfg is not set (prepare_model() or PrefixExecutor(cfg=...))")
        lid = int(getattr(attn, "layer_id", -1))
        kind, refusal = A.check_layer(attn, self.cfg)
        route = LayerRoute(lid, kind, refusal)
        if refusal is None:
            w, rep, refusal = A.build_weights(attn, self.cfg, kind, self.w_kc_policy,
                                              w_kc_fp8=self.d2_request != "bf16")
            route.report = rep
            if refusal is None:
                route.weights = w
                route.rotate = kind == "full" and A.layer_rotate(attn)
                route.signature = A.seam_signature(attn)
                route.weight_env = {k: v for k, v in weight_tensors(w).items() if v is not None}
                route.d2_weights = "fp8" if w.w_kc_fp8 is not None else "bf16"
                if self.d2_request == "fp8" and route.d2_weights != "fp8" and "d2_fp8_missing" not in self._once:
                    self._once.add("d2_fp8_missing")  # logged once: every layer of a checkpoint is alike
                    self.log.warning("GLM5_FASTPATH_D2_WEIGHTS=fp8, but layer %d has no FP8 W_UK (%s): D2 reads the "
                                     "bf16 W_UK there", lid, rep.notes.get("w_kc_fp8", "kv_b_proj is not block-FP8"))
                self._prepare_device(w.q_b.weight.device)
            else:
                route.kind, route.refusal = "", refusal
        attn.__dict__[STATE] = route
        return route

    def _prepare_device(self, dev: torch.device) -> None:
        """Static buffers and side streams, before any CUDA-graph capture."""
        if dev not in self._arange:
            self._arange[dev] = torch.arange(A.MAX_TOKENS, dtype=I64, device=dev)
        if dev.type == "cuda" and dev not in self._streams:
            with torch.cuda.device(dev):
                self._streams[dev] = [torch.cuda.Stream(dev) for _ in range(3)]
                self._l2_streams[dev] = torch.cuda.Stream(dev)
            if self._uses_l2_prefetch():  # ops.precompile leaves this kernel out; never compile inside a capture
                from ...ops import prefetch

                prefetch.precompile(dev)

    def _uses_l2_prefetch(self) -> bool:
        """Whether this executor's mode or a CMP bucket of the router's table has l2:OP=F modifiers."""
        from ...attn_pre.cmp.modes import get_mode

        table = getattr(self.router, "table", None)
        names = [b.cmp_mode or DEFAULT_MODE for b in (getattr(table, "buckets", ()) or ())
                 if getattr(b, "prefix", None) == "cmp"]
        return bool(self.mode.l2_prefetch) or any(get_mode(n).l2_prefetch for n in names)

    def prepare_model(self, model: Any, cfg: Glm5Config | None = None) -> PrepareSummary:
        from .patch import decoder_layers

        if cfg is not None:
            self.cfg = cfg
        if self.cfg is None:
            self.cfg = A.config_from_hf(getattr(model, "config", None))
        s = PrepareSummary()
        for layer in decoder_layers(model):
            attn = getattr(layer, "self_attn", None)
            if attn is None or not callable(getattr(attn, "forward_absorb_prepare", None)):
                continue
            r = self.prepare_layer(attn)
            key = r.kind if r.refusal is None else f"stock:{r.refusal.reason}"
            s.routes.setdefault(key, []).append(r.layer_id)
            if r.refusal is not None:
                s.refusals.setdefault(r.refusal.reason, r.refusal.message())
            if r.report is not None and r.refusal is None:
                s.added_bytes += r.report.added_bytes
                s.relayout_bytes += sum(r.report.relayout.values())
            if r.refusal is None and r.rotate:
                s.rotated.append(r.layer_id)
        for key, ids in s.routes.items():
            if key.startswith("stock:"):
                reason = key.split(":", 1)[1]
                self.log.info("glm5_fastpath: prefix: layers %s stay on SGLang's path: %s", _ranges(ids), s.refusals[reason])
            elif key == "partial":
                self.log.info("glm5_fastpath: prefix: layers %s -> our QKV-A / q_b / W_UK ops, SGLang's indexer "
                              "(an index-K cache format we do not recognise for sure, or a full-route requirement "
                              "missing)", _ranges(ids))
            else:
                self.log.info("glm5_fastpath: prefix: layers %s -> %s route (mode %s)", _ranges(ids), key, self.mode.name)
        if s.rotated:
            self.log.info("glm5_fastpath: prefix: layers %s: B1 / D1 Hadamard-rotate the indexer key / query (the "
                          "index-K format of SGLang 0.5.14's indexer)", _ranges(s.rotated))
            self._precompile_rotated(model)
        if s.added_bytes or s.relayout_bytes:
            self.log.info("glm5_fastpath: prefix weights: %.1f MB added (indexer wk re-quantized to FP8), %.1f MB of "
                          "W_UK relaid out in place (no net memory)", s.added_bytes / 2**20, s.relayout_bytes / 2**20)
        return s

    def _precompile_rotated(self, model: Any) -> None:
        """The rotated D1 / B1 kernel variants (install's ops.precompile compiled the default ones), before SGLang
        captures its decode graphs; nothing for a namespace without `precompile` (the reference) or off CUDA."""
        pre = getattr(self.impl, "precompile", None)
        dev = next((r.weights.q_b.weight.device for r in self._routes(model) if r.weights is not None), None)
        if pre is None or dev is None or dev.type != "cuda":
            return
        try:
            params = inspect.signature(pre).parameters
            if "indexer_rotate" not in params:
                return  # a namespace without the option: first use compiles (SGLang's eager warm-up)
        except (TypeError, ValueError):
            return
        kw = {"pdl_waits": table_pdl_waits(getattr(self.router, "table", None))} if "pdl_waits" in params else {}
        try:
            pre(self.cfg, dev, indexer_rotate=True, **kw)
        except Exception as e:  # noqa: BLE001 - compiled at first use instead (SGLang's eager warm-up), say so
            self.log.warning("glm5_fastpath: prefix: precompiling the rotated indexer kernels failed (%s: %s); they "
                             "compile at first use", type(e).__name__, e)

    @staticmethod
    def _routes(model: Any) -> list[LayerRoute]:
        from .patch import decoder_layers

        out = []
        for layer in decoder_layers(model):
            r = getattr(getattr(layer, "self_attn", None), "__dict__", {}).get(STATE)
            if r is not None:
                out.append(r)
        return out

    # -- the call -----------------------------------------------------------------------------------------------
    def __call__(self, original: Callable, *args, **kwargs):
        attn = getattr(original, "__self__", None)
        if attn is None:
            return original(*args, **kwargs)
        if self.cfg is None and STATE not in attn.__dict__:
            return self._fallback(original, args, kwargs, A.Refusal("config", "the executor was not prepared"),
                                  int(getattr(attn, "layer_id", -1)))
        route = self.layer_route(attn)
        if route.refusal is not None:
            return self._fallback(original, args, kwargs, route.refusal, route.layer_id)
        b = _bind_prepare(args, kwargs)
        r = self.call_refusal(attn, route, b)
        if isinstance(r, A.Refusal):
            return self._fallback(original, args, kwargs, r, route.layer_id)
        try:
            out = self.run(attn, route, r, b)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's path, loudly, once
            self._note("stock", "error", f"glm5_fastpath: prefix layer {route.layer_id}: our executor raised "
                       f"{type(e).__name__}: {e}; SGLang's path for this call", logging.WARNING)
            self.log.debug("glm5_fastpath: prefix executor traceback", exc_info=True)
            return original(*args, **kwargs)
        self._note(route.kind, "routed")
        return out

    def _fallback(self, original, args, kwargs, refusal: A.Refusal, layer_id: int):
        self._note("stock", refusal.reason,
                   f"glm5_fastpath: prefix layer {layer_id} -> stock ({refusal.message()}); logged once per reason")
        return original(*args, **kwargs)

    def call_refusal(self, attn: Any, route: LayerRoute, b: Mapping[str, Any]) -> A.StepViews | A.Refusal:
        fb = b.get("forward_batch")
        mode = getattr(fb, "forward_mode", None)
        if mode is not None and hasattr(mode, "is_decode") and not mode.is_decode():
            return A.Refusal("sglang_option", f"forward mode {getattr(mode, 'name', mode)}")
        backend = getattr(attn, "current_attention_backend", None)  # this forward's, stamped by SGLang's dispatch
        if backend is not None and backend not in A.DSA_BACKENDS:
            return A.Refusal("attention_backend", str(backend))
        if b.get("llama_4_scaling") is not None:
            return A.Refusal("llama4_scaling")
        for flag in ("_ENABLE_DSA_Q8KV8_BORN_FP8_Q", "_SGLANG_EXPERIMENTAL_LORA_OPTI"):
            if _module_flag(attn, flag):
                return A.Refusal("sglang_option", flag.lstrip("_"))
        fuse = getattr(attn, "_fuse_rope_for_trtllm_mla", None)
        if fuse is not None:
            try:
                if fuse(fb):
                    return A.Refusal("rope_fused_in_core")
            except Exception:  # noqa: BLE001 - no server args / backend (tests): it is not fused
                pass
        if route.kind == "shared" and b.get("prev_topk_indices") is None:
            return A.Refusal("no_prev_topk")
        v = A.step_views(attn, self.cfg, route.kind, b.get("positions"), b.get("hidden_states"), fb)
        if isinstance(v, A.Refusal):
            return v
        dev = v.positions.device
        capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if dev not in self._arange:
            if capturing:
                return A.Refusal("static_buffer", "kv_slots")
            self._prepare_device(dev)
        if route.kind == "full" and not v.topk_physical:
            need = int(v.block_table.shape[1])
            t = self._iota.get(dev)
            if t is None or t.numel() < need:
                if capturing:
                    return A.Refusal("static_buffer", f"identity page table of {need} columns")
                self._iota[dev] = torch.arange(max(need, 4096), dtype=I32, device=dev)
        return v

    def streams_for(self, dev: torch.device, n: int) -> list:
        if dev.type != "cuda":
            return [None] * n  # CPU: the schedule's order on one "stream"
        if n <= 1:
            return [torch.cuda.current_stream(dev)]
        side = self._streams.get(dev)
        if side is None or len(side) < n - 1:
            self._prepare_device(dev)
            side = self._streams[dev]
        return [torch.cuda.current_stream(dev)] + side[: n - 1]

    def run(self, attn: Any, route: LayerRoute, v: A.StepViews, b: Mapping[str, Any]) -> tuple:
        """Our prefix for one decode step -> forward_absorb_core's argument tuple (module doc)."""
        cfg, m, dev = self.cfg, v.m, v.positions.device
        kvl = cfg.kv_lora_rank
        hidden = b["hidden_states"]
        scratch = torch.empty(m, cfg.kv_cache_dim, dtype=BF16, device=dev)
        env: dict[str, torch.Tensor] = dict(route.weight_env)
        env.update(x_in=hidden, positions=v.positions, kv_slots=self._arange[dev][:m], kv_cache=scratch)
        if route.kind == "full":
            table = v.block_table if v.topk_physical else self._iota[dev][: v.block_table.shape[1]].expand(m, -1)
            env.update(out_cache_loc=v.out_cache_loc, seq_lens=v.seq_lens, block_table=v.block_table,
                       index_k_cache=v.index_k_cache, topk_table=table)
        # q_cat route (qcat_route.py, opt-in): D2 writes the sparse MLA's q and SGLang's pool row itself
        target = QC.ROUTE.pool_target(route.layer_id, b["forward_batch"], cfg.kv_cache_dim)  # "off" unless enabled
        qcat = not isinstance(target, str)
        if qcat:
            env.update(pool_loc=target[1], kv_pool=target[0])
        elif target != "off":
            QC.ROUTE.note("stock", target)
        mode = self.mode_for(m)
        plan = self.plan(route.kind, mode, route.rotate, route.d2_weights, qcat)
        env = {k: t for k, t in env.items() if k in plan.graph.tensors}
        l2_stream = self._l2_streams.get(dev)
        if plan.schedule is None:
            from ...attn_pre.cmp.executor import issue_l2_prefetch, join_l2_prefetch

            main = self.streams_for(dev, 1)[0]
            l2 = issue_l2_prefetch(mode, plan.graph, env, main, l2_stream, bulk=self.l2_bulk)  # None on CPU
            try:
                out = run_eager(plan.graph, env)
            finally:
                join_l2_prefetch(main, l2)
        else:
            out = enqueue(plan.graph, plan.schedule, env, self.streams_for(dev, plan.num_streams), l2_stream=l2_stream,
                          l2_bulk=self.l2_bulk)
        if qcat:  # the two column views of one [M, H, 576] buffer, handed to the DSA backend's forward_decode
            q_cat = out["q_cat"]
            q_lat, q_pe = q_cat[..., :kvl], q_cat[..., kvl:]
            QC.ROUTE.hand_off(route.layer_id, q_cat, kvl, pool_written=True)
        else:
            q_lat, q_pe = out["q_lat"], out["q_pe"]
        k_nope, k_pe = scratch[:, :kvl].unsqueeze(1), scratch[:, kvl:].unsqueeze(1)
        if route.kind == "full":
            topk = _capture_topk(route.layer_id, out["topk_slots"])
        elif route.kind == "shared":
            topk = _capture_topk(route.layer_id, b["prev_topk_indices"])
        else:  # partial: SGLang's indexer on our q_lora (it captures the top-k itself)
            topk = attn.indexer(x=hidden, q_lora=out["q_lora"], positions=v.positions, forward_batch=b["forward_batch"],
                                layer_id=attn.layer_id)
        return (q_pe, k_pe, q_lat, k_nope, b["forward_batch"], b["zero_allocator"], b["positions"], topk,
                b["llama_4_scaling"], *A.core_extras(route.signature))


def layer_counter(registry: Any) -> Any:
    """glm5_fastpath_prefix_layer_total on `registry` (metrics.seam_counter)."""
    return seam_counter(registry, METRIC, "Attention-prefix seam calls by route (full / partial / shared / stock) and "
                        "reason; host-side, so under CUDA graphs a call is a capture, not a replay.")


def _capture_topk(layer_id: int, topk: torch.Tensor) -> torch.Tensor:
    """SGLang's indexer-top-k state capturer (a pass-through unless one is installed), as the stock prepare calls it."""
    fn = getattr(A.sglang_module("sglang.srt.state_capturer.indexer_topk"), "maybe_capture_indexer_topk", None)
    return topk if fn is None else fn(layer_id, topk)


def _ranges(ids: list[int]) -> str:
    ids = sorted(ids)
    out, start = [], None
    for i, x in enumerate(ids):
        if start is None:
            start = x
        if i + 1 == len(ids) or ids[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out) or "-"


# ---- the process-wide executor patch.EXECUTORS["prefix"]["cmp"] calls --------------------------------------

_default: PrefixExecutor | None = None


def default_executor() -> PrefixExecutor:
    global _default
    if _default is None:
        _default = PrefixExecutor()
    return _default


def run_cmp(original: Callable, *args, **kwargs):
    """patch.EXECUTORS["prefix"]["cmp"]."""
    return default_executor()(original, *args, **kwargs)
