"""Execution modes of the CMP executor and where each kernel waits for its producers (PDL).

A mode is three switches, so the benchmark can charge each mechanism separately
(design article section 7, "PDL收益拆解"):

| mode | streams | PDL launch attribute | requested wait point |
|---|---|---|---|
| serial | one | off | - |
| serial_pdl | one | on | after_prefetch |
| multistream | branches | off | - |
| multistream_pdl_entry | branches | on | entry |
| multistream_pdl_prologue | branches | on | after_prologue |
| full | branches | on | after_prefetch |
| full_prio_index | branches | on | after_prefetch, + launch priority for C0, B1, D1, E1, E2 |
| full_prio_b1 | branches | on | after_prefetch, + launch priority for B1, E1, E2 |

Composite modes (`bench prefix --modes`, `tune`'s candidates, selection tables' `cmp_mode`): a named
mode followed by `+` modifiers, e.g. `full+after:D1>D0+cap:D0=64`. They change when and on how many CTAs
kernels run, never what they compute (GPU tests: bitwise equal to serial). On the H200 (2026-11-30,
benchmarks/results/2026-11-30_h200_session16) `full+pin:D1=0` beat every named mode at 1-4 tokens by
2.5-4.8 %; ordering edges, caps and stage caps did not pay at 1-64 tokens (the reasons are there).
- `after:X>Y`: Y also waits for X's completion (an ordering edge that is not a data edge). Why:
  a PDL-launched consumer's CTAs hold their SMs while they wait, so the op launched first owns the
  machine. In one H200 replay at M = 16 (`full`, 2026-11-30 session 9) D0's 128 CTAs (q_b, not on the
  indexer path) were resident from 8 us, and D1 (indexer Q, on the D1 -> E1 -> E2 critical path)
  took 19 us against 8.7 alone; `after:D1>D0` hands the SMs to the critical path first.
- `cap:OP=N`: OP's FP8 GEMM runs as a persistent launch on at most N CTAs
  (ops.fp8_gemm.grid_cap), leaving the other SMs to the concurrent branch.
- `stages:OP=N`: OP's FP8 GEMM uses at most N ring stages (ops.fp8_gemm.stage_cap): less shared
  memory per CTA, so a concurrent branch's CTAs fit beside it. Why: E1 (128 threads, 38 KB) runs
  4 CTAs per SM alone, but only one beside a resident 155 KB D0 CTA (M = 16: 8 stages); in the
  session-16 timelines E1 took 19 us in the graph against 9 alone.
- `prio:A/B`: launch priority for the named ops (as the _prio modes).
- `pin:OP=S`: put OP on stream S (streams.assign_streams' pins). `pin:D1=0` continues the main stream
  after B0 with D1, so D1 is the PDL-launched consumer that prefetches its weights while B0 runs (in
  `full`, D0 is, and D1 waits for B0's completion event), and D0 opens a side stream.
- `l2:OP=F` (F in (0, 1]): before the first launch, prefetch the first F of each of OP's 2-D weights and
  scales (`w.*` inputs; a K-prefix of every row, ops.prefetch.l2_prefetch) into L2 on a side stream of its
  own, joined at the end. Why: the prefix's early GEMMs are latency-bound and leave HBM idle; the prefetch
  pulls later ops' weights (e.g. D0's q_b, D1's wq_b) into L2 during that window. MEASURED NOT TO PAY (H200,
  2026-12-01, benchmarks/results/2026-12-01_h200_session24/ c3): every variant was slower, e.g. at 1 / 16 / 64
  tokens `full` 39.8 / 50.2 / 82.7 us, `full+l2:D0=0.5` 43.6 / 53.5 / 83.5, `full+l2:D0=1` 47.8 / 56.3 / 89.2;
  the same with bulk prefetches. L2-resident data does read faster (a 32 MB sum 0.74x the cold time), but D0's
  GEMM gains only ~1-2 us from it (its fixed cost dominates) while the prefetch competes with B0 for HBM. Kept
  for re-measuring. Line prefetches by default; GLM5_FASTPATH_CMP_L2_BULK=1 (read when an executor is built)
  uses the bulk (TMA) form.

Launch priority (the `_prio` modes; jit.runtime.launch_priority, CU_LAUNCH_ATTRIBUTE_PRIORITY at the context's
greatest priority, kept by torch-captured graphs): the named ops' CTAs take SMs first when kernels of several
branches compete. Why: in one H200 replay at M = 1 (`full`, 2026-11-30 session 7 timeline) B1's 12-CTA GEMM took
27 us against 8.9 us alone, because B0's and the PDL-launched D0 / D1 CTAs held the SMs, and B1 -> E1 -> E2
became the critical path (46 us, the q path ended at 35 us). Which set pays is measured, not assumed.

Wait points (where the consumer kernel executes griddepcontrol.wait), earliest first:
- entry: first instruction; the early launch buys only the scheduling / handoff latency;
- after_prologue: after the generic prologue (barrier init, descriptor / metadata loads);
- after_prefetch: after the prologue AND the weight prefetch (static operands streamed before the wait).

`NATIVE_WAIT_POINTS` records where each of our kernels (glm5_fastpath.ops, csrc/attn_pre) waits
when launched with pdl=True. A mode asking for a LATER point than a kernel's native one gets the
native one (that kernel has nothing more to do before its wait, e.g. E2 has no weights). A mode
asking for an EARLIER point needs a kernel flag that moves the wait: any op whose Python entry
point accepts `pdl_wait=` ("entry" | "after_prologue" | "after_prefetch") has one, and every op of
glm5_fastpath.ops in OP_FUNCTIONS does: it compiles the kernel with GLM5_PDL_WAIT_AT (the
compile-time wait-point switch of csrc/common/pdl.cuh: griddep_wait_at<0>() at kernel entry,
griddep_wait_at<1>() after the generic prologue and before the first weight load; a separate cubin,
the native build unchanged). E1 also has an older flag (meta_before_wait=False moves the metadata
reads and the L2 page prefetch after the wait), used for after_prologue only when pdl_wait is
missing. A namespace without the flag (e.g. glm5_fastpath.ref.prefix) makes the entry / prologue
modes raise NotImplementedError naming the ops that lack it (see `resolve_wait_points`).
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

WAIT_POINTS = ("entry", "after_prologue", "after_prefetch")


@dataclass(frozen=True)
class Mode:
    name: str
    multistream: bool
    pdl: bool
    wait_point: str | None  # requested wait point (None when pdl is off)
    priority_ops: tuple[str, ...] = ()  # ops launched at the highest launch priority (module doc)
    order_edges: tuple[tuple[str, str], ...] = ()  # (X, Y): Y also waits for X's completion (module doc)
    grid_caps: tuple[tuple[str, int], ...] = ()  # (op, N): op's GEMM persistent on <= N CTAs (module doc)
    pins: tuple[tuple[str, int], ...] = ()  # (op, stream): stream assignment overrides (module doc)
    stage_caps: tuple[tuple[str, int], ...] = ()  # (op, N): op's GEMM ring <= N stages (module doc)
    l2_prefetch: tuple[tuple[str, float], ...] = ()  # (op, f): op's weights' first f into L2 up front (module doc)

    def __post_init__(self) -> None:
        if self.pdl != (self.wait_point is not None):
            raise ValueError(f"CMP mode {self.name}: a wait point is given exactly when PDL is on")
        if self.wait_point is not None and self.wait_point not in WAIT_POINTS:
            raise ValueError(f"CMP mode {self.name}: wait point {self.wait_point!r} not in {WAIT_POINTS}")
        for a, b in self.order_edges:
            if a == b:
                raise ValueError(f"CMP mode {self.name}: ordering edge {a}>{b} names one op twice")
        for op, n in self.grid_caps:
            if n < 1:
                raise ValueError(f"CMP mode {self.name}: cap {op}={n} must be at least 1 CTA")
        for op, n in self.stage_caps:
            if n < 2:
                raise ValueError(f"CMP mode {self.name}: stages {op}={n} must be at least 2")
        for op, f in self.l2_prefetch:
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
                raise ValueError(f"CMP mode {self.name}: l2 {op}={f!r} must be a fraction in (0, 1]")
        l2_ops = [op for op, _ in self.l2_prefetch]
        twice = sorted({op for op in l2_ops if l2_ops.count(op) > 1})
        if twice:  # one fraction per op: a second one would only prefetch the same lines again
            raise ValueError(f"CMP mode {self.name}: l2 names {twice} more than once")

    def for_ops(self, ops) -> "Mode":
        """This mode for a graph holding `ops`: a mode is chosen per bucket for every layer kind, so ordering
        edges, pins, GEMM caps and L2 prefetches naming a prefix op the graph lacks (D1 in a GLM-5.2 shared layer)
        do not apply there; a name that is no prefix op at all raises ValueError."""
        ops = set(ops)
        named = ({o for e in self.order_edges for o in e} | {o for o, _ in self.pins}
                 | {o for o, _ in self.grid_caps + self.stage_caps} | {o for o, _ in self.l2_prefetch})
        bad = sorted(named - ops - set(NATIVE_WAIT_POINTS))
        if bad:
            raise ValueError(f"CMP mode {self.name}: {bad} are not prefix ops ({', '.join(NATIVE_WAIT_POINTS)})")
        if named <= ops:
            return self
        keep = lambda pairs: tuple(p for p in pairs if p[0] in ops)  # noqa: E731
        return replace(self, order_edges=tuple(e for e in self.order_edges if set(e) <= ops), pins=keep(self.pins),
                       grid_caps=keep(self.grid_caps), stage_caps=keep(self.stage_caps),
                       l2_prefetch=keep(self.l2_prefetch))


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("serial", False, False, None),
    Mode("serial_pdl", False, True, "after_prefetch"),
    Mode("multistream", True, False, None),
    Mode("multistream_pdl_entry", True, True, "entry"),
    Mode("multistream_pdl_prologue", True, True, "after_prologue"),
    Mode("full", True, True, "after_prefetch"),
    Mode("full_prio_index", True, True, "after_prefetch", ("C0", "B1", "D1", "E1", "E2")),
    Mode("full_prio_b1", True, True, "after_prefetch", ("B1", "E1", "E2")),
)}
# the order the benchmark decomposes the gain in (each step adds one mechanism)
DECOMPOSITION = ("serial", "multistream", "multistream_pdl_entry", "multistream_pdl_prologue", "full")

# where each kernel waits when launched with pdl=True (read from csrc/attn_pre/*.cu); with pdl_wait=
# "entry" it waits first thing, with "after_prologue" where the comment says (GLM5_PDL_WAIT_AT=1)
NATIVE_WAIT_POINTS: dict[str, str] = {
    "A0": "after_prefetch",  # norm weight loaded, then wait (a0_add_rmsnorm_quant.cu); 1: barriers armed, then wait
    "B0": "after_prefetch",  # weight ring filled before the wait (fp8_gemm_skinny / _wgmma, split: + b0_row_norms);
                             # 1: after the tile coordinates (wgmma: + barrier init, tensor-map prefetch)
    "C0": "after_prefetch",  # weights_proj tile loaded before the wait (c0_head_gate.cu); 1: barriers armed, then wait
    "B1": "after_prefetch",  # fp8_gemm_skinny / _wgmma (indexer-K epilogue); 1: as B0
    "D1": "after_prefetch",  # fp8_gemm_skinny / _wgmma (indexer-Q epilogue); 1: as B0
    "D0": "after_prefetch",  # fp8_gemm_skinny / _wgmma (q_b RoPE epilogue); 1: as B0
    "D2": "after_prefetch",  # 48 KB W_UK tile cp.async before the wait (d2_absorb_kv_store.cu); 1: before it
    "E1": "after_prefetch",  # meta_before_wait=True: block table + L2 page prefetch before the wait;
                             # 1: barrier init + block table / plan, wait, then the prefetch
    "E2": "after_prologue",  # zeroes its histograms (+ metadata), then waits; nothing static to prefetch
}
# the entry point each op of the prefix graph calls (graph/prefix_graph.py adapters)
OP_FUNCTIONS: dict[str, str] = {
    "A0": "a0_add_rmsnorm_quant", "B0": "b0_qkv_a", "C0": "c0_head_gate", "B1": "b1_indexer_k",
    "D1": "d1_indexer_q", "D0": "d0_q_b", "D2": "d2_absorb_and_kv_store", "E1": "e1_indexer_logits",
    "E2": "e2_topk",
}


_OP_RE = re.compile(r"^[A-Z][A-Z0-9]*$")
_FRACTION_RE = re.compile(r"^(\d+(\.\d*)?|\.\d+)$")  # a plain decimal; Mode checks it is in (0, 1]


def get_mode(mode: str | Mode) -> Mode:
    """A Mode by name: one of MODES, or a composite `name+modifier+...` (module doc)."""
    if isinstance(mode, Mode):
        return mode
    if not isinstance(mode, str):
        raise ValueError(f"CMP mode must be a name, got {type(mode).__name__}")
    base, *mods = mode.split("+")
    if base not in MODES:
        raise ValueError(f"unknown CMP mode {base!r}; choose one of {list(MODES)} (optionally + after:X>Y, "
                         f"cap:OP=N, stages:OP=N, pin:OP=S, prio:A/B, l2:OP=F)")
    m = MODES[base]
    if not mods:
        return m
    order, caps, prio, pins = list(m.order_edges), list(m.grid_caps), list(m.priority_ops), list(m.pins)
    stages, l2 = list(m.stage_caps), list(m.l2_prefetch)
    for mod in mods:
        kind, _, arg = mod.partition(":")
        ok = False
        if kind == "after":
            a, _, b = arg.partition(">")
            ok = bool(_OP_RE.match(a) and _OP_RE.match(b))
            if ok:
                order.append((a, b))
        elif kind == "cap":
            op, _, n = arg.partition("=")
            ok = bool(_OP_RE.match(op) and n.isdigit())
            if ok:
                caps.append((op, int(n)))
        elif kind == "stages":
            op, _, n = arg.partition("=")
            ok = bool(_OP_RE.match(op) and n.isdigit())
            if ok:
                stages.append((op, int(n)))
        elif kind == "pin":
            op, _, n = arg.partition("=")
            ok = bool(_OP_RE.match(op) and n.isdigit())
            if ok:
                pins.append((op, int(n)))
        elif kind == "l2":
            op, _, f = arg.partition("=")
            ok = bool(_OP_RE.match(op) and _FRACTION_RE.match(f))
            if ok:
                l2.append((op, float(f)))
        elif kind == "prio":
            ops = arg.split("/")  # "/": --modes is a comma list
            ok = all(_OP_RE.match(o) for o in ops)
            if ok:
                prio += [o for o in ops if o not in prio]
        if not ok:
            raise ValueError(f"CMP mode {mode!r}: bad modifier {mod!r} (after:X>Y, cap:OP=N, stages:OP=N, "
                             "pin:OP=S, prio:A/B or l2:OP=F)")
    return replace(m, name=mode, order_edges=tuple(order), grid_caps=tuple(caps), priority_ops=tuple(prio),
                   pins=tuple(pins), stage_caps=tuple(stages), l2_prefetch=tuple(l2))


def _accepts(fn: Any, kw: str) -> bool:
    try:
        return kw in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def wait_support(impl: Any, ops: list[str]) -> dict[str, frozenset[str]]:
    """Per op: the wait points its kernel can be launched with, given the namespace `impl`."""
    out: dict[str, frozenset[str]] = {}
    for op in ops:
        native = NATIVE_WAIT_POINTS[op]
        pts = {native}
        fn = getattr(impl, OP_FUNCTIONS[op], None)
        if fn is not None and _accepts(fn, "pdl_wait"):
            pts |= set(WAIT_POINTS)
        if op == "E1" and fn is not None and _accepts(fn, "meta_before_wait"):
            pts.add("after_prologue")
        out[op] = frozenset(pts)
    return out


@dataclass(frozen=True)
class WaitPlan:
    """The realized wait point of one op and the call arguments that realize it."""

    op: str
    requested: str | None
    realized: str | None
    kwargs: Mapping[str, Any]


def resolve_wait_points(mode: Mode, ops: list[str], support: Mapping[str, frozenset[str]]) -> dict[str, WaitPlan]:
    """-> per op the wait point it will really use and the kwargs for its entry point (besides pdl=).

    Raises NotImplementedError naming every op that cannot wait as early as the mode asks."""
    plans: dict[str, WaitPlan] = {}
    missing: list[str] = []
    for op in ops:
        if not mode.pdl:
            plans[op] = WaitPlan(op, None, None, {})
            continue
        want, native = mode.wait_point, NATIVE_WAIT_POINTS[op]
        rank = WAIT_POINTS.index
        if rank(want) >= rank(native):  # nothing more to do before the wait than the kernel already does
            kw = {"meta_before_wait": True} if op == "E1" else {}
            plans[op] = WaitPlan(op, want, native, kw)
        elif want in support.get(op, frozenset()):
            if op == "E1" and want == "after_prologue" and "entry" not in support[op]:
                kw = {"meta_before_wait": False}  # no pdl_wait: the older flag
            elif op == "E1":
                kw = {"pdl_wait": want, "meta_before_wait": True}  # "after_prologue": metadata before the wait
            else:
                kw = {"pdl_wait": want}
            plans[op] = WaitPlan(op, want, want, kw)
        else:
            missing.append(op)
    if missing:
        raise NotImplementedError(
            f"CMP mode {mode.name!r} needs kernels that wait at {mode.wait_point!r}, but {missing} only wait "
            f"after their weight prefetch: add a wait-point switch to csrc/common/pdl.cuh / each kernel and expose "
            f"it as `pdl_wait=` on " + ", ".join(f"glm5_fastpath.ops.{OP_FUNCTIONS[o]}" for o in missing)
            + " (E1 can already move its metadata reads after the wait: meta_before_wait=False)")
    return plans
