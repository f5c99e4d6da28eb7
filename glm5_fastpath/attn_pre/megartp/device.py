"""MegaRTP device side: the persistent megakernel (csrc/megartp/megakernel.{cuh,cu}) that interprets a
KernelPlan, its launcher, and the executor that plans, binds and runs one step.

    runner = PlanRunner(plan, cfg, "cuda")          # device copies: instructions, counters, operands
    runner.bind(tensors)                            # OperandPtrTable of these buffers (plan.rebind)
    runner.launch(epoch=1); runner.check()          # one step; check() syncs and raises on a device error
    run_plan(plan, tensors, epoch, trace=False, cfg=cfg)   # the same in one call (runner cached per plan)
    MegaRtpExecutor(cfg, weights, "cuda", kv_cache=..., graph=...).run(ctx, hidden=..., ...)

Kernel (version 1; design in csrc/megartp/runtime.cuh): grid = the plan's queues (one resident CTA
per SM; a dynamic-dispatch plan: plan.num_ctas CTAs claiming from its one list), 288 threads = 8
worker warps + 1 controller warp, dynamic shared memory = the largest
family (dynamic_smem_bytes; no page map yet). The controller publishes instruction i+1 into the
second of two shared-memory slots while the workers run instruction i; the workers wait for the
instruction's events (counter >= epoch x threshold, bounded by a clock64 budget), run the family's
tile, fence and signal. Families of v1: SUPPORTED_FAMILIES (+ NOOP); a plan with any other family is
refused on the host with the families named (check_plan_supported).

Epochs: counters are zeroed once per runner and never reset between steps; step e waits for
e x threshold. launch(epoch=e) passes e explicitly (it must be the previous epoch + 1);
launch(epoch=None) lets the kernel take state[0] + 1 from device memory, so one captured launch can
be replayed by a CUDA graph (the host mirror of the epoch advances by one per launch either way).
After a device error the runner zeroes counters / state and restarts at epoch 1.

Failure: a wait past the budget (default 2 s of SM clock), an unsupported opcode or payload writes
an error record (16 int32) and the kernel leaves early (no trap: the CUDA context survives);
check() raises MegaRtpDeviceError (MegaRtpWaitTimeout for a stalled wait) naming the queue, the
instruction, its op and tile, the event, its threshold, target and observed value.
"""
from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ...config import INDEXER_K_NORM_EPS, Glm5Config
from ...graph.op_graph import OpGraph, ShapeContext
from ...jit import KernelSpec
from ...jit import env as jit_env
from ...ops._device import WEIGHTS_HINT_DEFINES
from .families import FINAL_K_SPLIT, SPLIT_K_PAYLOAD
from .isa import (FAMILY_BY_OPCODE, INSTR_WORDS, MAX_WAITS, NOOP, OPCODE, OPERAND_SLOTS, PAYLOAD, REDUCE_TARGET, WAITS,
                  Instruction, Opcode, decode, encode)

SOURCE = "megartp/megakernel.cu"
FUNCTION = "glm5_megartp"
THREADS = 288  # 8 worker warps + the controller warp
WORKER_THREADS = 256
SUPPORTED_FAMILIES = ("A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2")  # csrc/megartp/megakernel.cuh dispatch()
UNSUPPORTED_WHY: dict[str, str] = {}  # op family -> why the megakernel lacks it (every prefix family is in v1)
GEMM_TOKEN_BLOCK = 16  # families.cuh Gemm = GemmCfg<16, 6>
GEMM_STAGES = 6  # families.cuh GLM5_MRTP_GEMM_STAGES default (weight stages in flight per SM)
GEMM_STAGES_RANGE = range(4, 9)  # the override's range: the skinny tile takes 2..8 (cp.async.wait_group immediates)
E1_STAGES = 4     # families.cuh kE1Stages: index-K pages in flight per worker group
E1_MAX_PAGES = 8  # families.cuh kE1MaxPages: live pages per KV window (the graph's e1_kv_split / 64)
E1_PAGE = 64      # tokens per index-K cache page
ERROR_WORDS = 16
TRACE_WORDS = 12
STATE_WORDS = 4
DEFAULT_WAIT_BUDGET_MS = 2000.0
FALLBACK_SM_CLOCK_HZ = 1.98e9  # H200 boost clock, when the driver does not report one


class MegaRtpError(RuntimeError):
    """MegaRTP device side: wrong arguments or state on the host."""


class MegaRtpUnsupported(MegaRtpError, ValueError):
    """The plan uses op families (or tile shapes) the compiled megakernel does not implement."""


class MegaRtpDeviceError(MegaRtpError):
    """The kernel wrote an error record (see `record`) and left early."""

    def __init__(self, msg: str, record: "ErrorRecord"):
        super().__init__(msg)
        self.record = record


class MegaRtpWaitTimeout(MegaRtpDeviceError):
    """A wait exceeded the bounded-wait budget: its event never reached epoch x threshold."""


# ---- error record (runtime.cuh ErrorKind / ErrorField) ------------------------------------------------

ERROR_KINDS = {0: "none", 1: "wait timeout", 2: "unsupported opcode", 3: "bad instruction",
               4: "unsupported tile", 5: "shared memory too small", 6: "slot wait timeout"}
BAD_INSTRUCTION_DETAIL = {1: "wait_count out of range", 2: "signal_count out of range",
                          3: "signal event out of range or increment < 1", 4: "operand_row out of range",
                          5: "the dynamic-dispatch claim counter (event field) is outside the counters"}
UNSUPPORTED_DETAIL = {1: "rows: need 0 <= m0 < m1 <= M", 2: f"m0 not a multiple of the {GEMM_TOKEN_BLOCK}-token block",
                      3: "n range: n0 on a 128-row block, n1 - n0 <= 128, n1 <= N, N even",
                      4: "k range: k0, k1 on 128-column groups inside [0, K]", 5: "k_split outside the group's splits",
                      6: "reduce group region is not what the epilogue covers", 7: "reduce counter / target out of range",
                      8: "D1 needs index_head_dim == 128", 9: "D2 head / latent tile out of range",
                      10: f"E1: rows / KV window (kv0 on a {E1_PAGE}-token page, kv1 <= max_ctx, at most "
                          f"{E1_MAX_PAGES} live pages past kv0, indexer heads / dim of the build)",
                      11: "A0: the launch's hidden size is not the build's (GLM5_MRTP_H)",
                      12: "E2: rows (0 <= m0 < m1 <= M), or no logits row / block table (max_ctx, bt_width)"}
_FIELDS = ("kind", "queue", "pos", "opcode", "event", "threshold", "target", "observed", "epoch", "tile",
           "operand_row", "role", "smid", "detail", "cycles", "claim")


@dataclass(frozen=True)
class ErrorRecord:
    kind: int
    queue: int
    pos: int
    opcode: int
    event: int
    threshold: int
    target: int
    observed: int
    epoch: int
    tile: int
    operand_row: int
    role: int
    smid: int
    detail: int
    cycles: int
    claim: int

    @classmethod
    def from_words(cls, words: Sequence[int]) -> "ErrorRecord":
        w = [int(x) for x in words]
        if len(w) != ERROR_WORDS:
            raise ValueError(f"an error record is {ERROR_WORDS} int32 words, got {len(w)}")
        u32 = lambda v: v & 0xFFFFFFFF  # noqa: E731 (counters and targets are uint32 on the device)
        d = dict(zip(_FIELDS, w))
        d["target"], d["observed"], d["epoch"] = u32(d["target"]), u32(d["observed"]), u32(d["epoch"])
        return cls(**d)

    @property
    def kind_name(self) -> str:
        return ERROR_KINDS.get(self.kind, f"kind {self.kind}")


def _op_label(opcode: int, operand_row: int, ops: Sequence[str]) -> str:
    name = Opcode(opcode).name if opcode in set(int(o) for o in Opcode) else f"opcode {opcode}"
    if 0 <= operand_row < len(ops) and opcode != Opcode.NOOP:
        name += f" (op {ops[operand_row]})"
    return name


def decode_error(words: Sequence[int], ops: Sequence[str] = ()) -> MegaRtpDeviceError | None:
    """The error record (16 int32 words) -> the exception to raise, or None when it is clear."""
    r = ErrorRecord.from_words(words)
    if r.kind == 0:
        return None
    where = (f"queue {r.queue} (SM {r.smid}) instruction {r.pos}: {_op_label(r.opcode, r.operand_row, ops)} "
             f"tile {r.tile}, epoch {r.epoch}")
    if r.kind == 1:
        msg = (f"megakernel wait timed out at {where}: wait {r.detail} on event {r.event} needs counter >= "
               f"{r.target} (= epoch {r.epoch} x threshold {r.threshold}), observed {r.observed} after "
               f"{r.cycles} cycles; its producers never signalled (a missing or failed producer, a skipped "
               f"epoch, or counters not zeroed for a new plan)")
        return MegaRtpWaitTimeout(msg, r)
    if r.kind == 2:
        msg = f"megakernel got an opcode it does not implement at {where} (opcode {r.detail})"
    elif r.kind == 3:
        msg = f"megakernel refused a malformed instruction at {where}: {BAD_INSTRUCTION_DETAIL.get(r.detail, r.detail)}"
    elif r.kind == 4:
        msg = f"megakernel family cannot run this tile at {where}: {UNSUPPORTED_DETAIL.get(r.detail, r.detail)}"
    elif r.kind == 5:
        msg = f"megakernel launched with too little dynamic shared memory at {where}: the family needs {r.detail} B"
    elif r.kind == 6:
        msg = (f"megakernel workers waited {r.cycles} cycles for the controller to publish slot {r.detail} (use "
               f"{r.target}, observed {r.observed}) before queue {r.queue} (SM {r.smid}) instruction {r.pos}, epoch "
               f"{r.epoch}: the controller is stuck (a runtime protocol bug; please report with the plan)")
    else:
        msg = f"megakernel error kind {r.kind} at {where} (detail {r.detail})"
    return MegaRtpDeviceError(msg, r)


# ---- kernel build ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelDims:
    """The compile-time dims of one megakernel build (megakernel.cu GLM5_MRTP_*)."""

    hidden: int
    q_lora: int
    kv_lora: int
    rope: int
    nope: int
    idx_heads: int
    idx_dim: int
    topk: int

    @classmethod
    def of(cls, cfg: Glm5Config) -> "KernelDims":
        return cls(cfg.hidden_size, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim,
                   cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk)


def gemm_stages() -> int:
    """The GEMM families' weight stages: GLM5_FASTPATH_MRTP_GEMM_STAGES when set (checked), else GEMM_STAGES."""
    raw = jit_env.text("GLM5_FASTPATH_MRTP_GEMM_STAGES")
    if raw is None:
        return GEMM_STAGES
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n not in GEMM_STAGES_RANGE:
        raise MegaRtpError(f"GLM5_FASTPATH_MRTP_GEMM_STAGES must be an integer in "
                           f"{GEMM_STAGES_RANGE.start}..{GEMM_STAGES_RANGE.stop - 1}, got {raw!r}")
    return n


def _build_flag(name: str) -> bool:
    """A documented flag variable of the megakernel build; a bad value raises MegaRtpError naming it."""
    try:
        return jit_env.flag(name)
    except ValueError as e:
        raise MegaRtpError(str(e)) from None


def weights_evict_first() -> bool:
    """GLM5_FASTPATH_MRTP_W_EVICT_FIRST: the weight loads carry an L2 evict-first hint (WEIGHTS_HINT_DEFINES)."""
    return _build_flag("GLM5_FASTPATH_MRTP_W_EVICT_FIRST")


def e1_cache_evict_first() -> bool:
    """GLM5_FASTPATH_MRTP_E1_EVICT_FIRST: E1's index-K cache pages load evict-first (-DGLM5_E1_CACHE_EVICT_FIRST)."""
    return _build_flag("GLM5_FASTPATH_MRTP_E1_EVICT_FIRST")


@functools.lru_cache(maxsize=None)
def _spec(dims: KernelDims, trace: bool, stages: int = GEMM_STAGES, evict_first: bool = False,
          e1_evict_first: bool = False) -> KernelSpec:
    return KernelSpec(FUNCTION, source=SOURCE, defines=(
        ("GLM5_MRTP_H", str(dims.hidden)), ("GLM5_MRTP_Q", str(dims.q_lora)), ("GLM5_MRTP_KV", str(dims.kv_lora)),
        ("GLM5_MRTP_R", str(dims.rope)),
        ("GLM5_MRTP_NOPE", str(dims.nope)), ("GLM5_MRTP_IH", str(dims.idx_heads)), ("GLM5_MRTP_ID", str(dims.idx_dim)),
        ("GLM5_MRTP_TOPK", str(dims.topk)),
        ("GLM5_MRTP_TRACE", "1" if trace else "0"))
        + ((("GLM5_MRTP_GEMM_STAGES", str(stages)),) if stages != GEMM_STAGES else ())
        + (WEIGHTS_HINT_DEFINES if evict_first else ())
        + ((("GLM5_E1_CACHE_EVICT_FIRST", "1"),) if e1_evict_first else ()))


def kernel_spec(cfg: Glm5Config, trace: bool = False) -> KernelSpec:
    return _spec(KernelDims.of(cfg), bool(trace), gemm_stages(), weights_evict_first(), e1_cache_evict_first())


def compile_check_specs() -> list[KernelSpec]:
    """GLM-5 and the small preset, trace off and on."""
    return [kernel_spec(Glm5Config.preset(p), t) for p in ("glm5", "small") for t in (False, True)]


EPI_PLAIN, EPI_IDX_Q, EPI_IDX_K = 0, 3, 4  # attn_pre::skinny::kEpi* of the families' epilogues
GEMM_FAMILIES = ("B0", "B1", "D1")
# families.cuh kEpiGemmLayout: every partial's mainloop runs on the carve-up of the epilogue with the largest
# finish scratch (D1's), where B1 / D1 partials stage their finish inputs before the K loop
EPI_GEMM_LAYOUT = EPI_IDX_Q


def precompile(specs: Sequence[KernelSpec] | None = None, arch: str = "sm_90a", jobs: int = 4) -> list[str]:
    """Compile megakernel variants into the JIT cache in parallel (nvcc runs outside the GIL; no GPU needed):
    each build takes ~30-40 s of ptxas. Default: compile_check_specs(). -> the cache entries' descriptions."""
    from concurrent.futures import ThreadPoolExecutor

    from ...jit import compile_kernel
    todo = list(specs) if specs is not None else compile_check_specs()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        done = list(ex.map(lambda s: compile_kernel(s, arch), todo))
    return [f"{c.spec.describe()}: {'cached' if c.cache_hit else 'compiled'}" for c in done]


def skinny_smem_bytes(tm: int, stages: int, gmax: int, epi: int = EPI_PLAIN) -> int:
    """SkinnySmem<tm, stages, epi>::bytes(gmax) of csrc/attn_pre/fp8_gemm_skinny.cuh, its finish scratch
    (finish_scratch_bytes) included (a CPU test keeps this equal to ops.fp8_gemm.SkinnyConfig.smem_bytes)."""
    scratch = 3 * 8 * tm * 4 + 16
    if epi in (2, EPI_IDX_Q, EPI_IDX_K):  # RoPE (cos, sin) per (token, pair <= 32) + positions
        scratch += tm * 32 * 8 + tm * 8
    if epi == EPI_IDX_K:  # cache slots
        scratch += tm * 8
    if epi == EPI_IDX_Q:  # w_raw of <= 8 heads per tile
        scratch += tm * 8 * 4
    off_ws = stages * 128 * 128 + stages * tm * 128 + scratch
    off_xs = off_ws + (gmax * 4 + 15) // 16 * 16
    return off_xs + gmax * tm * 4


def d2_smem_bytes(nope: int, mt: int, nt: int = 4) -> int:
    """D2AbsorbTile<nope, kv_lora, mt, nt>::kSmemBytes (weight tile + 8 per-warp staging tiles)."""
    return nope * 128 * 2 + 8 * (nt * 8) * (mt * 32 + 16)


C0_TOKENS, C0_PITCH = 32, 36  # families.cuh C0Family: tokens per pass, floats per token row of a warp partial


def c0_smem_bytes() -> int:
    """C0Family::kSmemBytes: the 8 warps' [token][head] partials of one 32-token pass."""
    return 8 * C0_TOKENS * C0_PITCH * 4


E2_SMEM_BYTES = 19248  # families.cuh E2Family::kChunkOff: sizeof(E2TopkTile<256, kItems>::Smem), 16-byte aligned


def e2_smem_bytes() -> int:
    """E2Family's shared memory: the tile's Smem. Rows longer than one 2048-position chunk keep further chunks in
    whatever dynamic shared memory the launch has beyond it, and re-read the rest from global memory."""
    return E2_SMEM_BYTES


def a0_smem_bytes(hidden: int) -> int:
    """A0AddRmsNormQuantRowTile<hidden, 256>::kSmemBytes: one fp32 partial per 256-column chunk."""
    return hidden // 256 * 4


def e1_smem_bytes(idx_dim: int) -> int:
    """The E1 family's tile (E1_STAGES pages in flight, E1_MAX_PAGES per window): the op's formula."""
    from ...ops.e1_indexer_logits import tile_smem_bytes
    return tile_smem_bytes(idx_dim, E1_STAGES, E1_MAX_PAGES)


def dynamic_smem_bytes(cfg: Glm5Config, plan: Any = None) -> int:
    """Dynamic shared memory of a launch: the largest family the plan uses (every family when plan is None).
    v1 gives each instruction all of it (no page map)."""
    fams = _families(plan) if plan is not None else set(SUPPORTED_FAMILIES)
    need = 0
    if "D2" in fams:
        need = max(need, d2_smem_bytes(cfg.qk_nope_head_dim, 2))
    if "E1" in fams:
        need = max(need, e1_smem_bytes(cfg.index_head_dim))
    if "A0" in fams:
        need = max(need, a0_smem_bytes(cfg.hidden_size))
    if "C0" in fams:
        need = max(need, c0_smem_bytes())
    if "E2" in fams:
        need = max(need, e2_smem_bytes())
    gmax = max(_max_k_groups(plan) if plan is not None else cfg.hidden_size // 128, 1)
    if "D0" in fams:  # all of K (q_lora_rank) in one instruction
        gmax = max(gmax, cfg.q_lora_rank // 128)
    if fams & (set(GEMM_FAMILIES) | {"D0"}):
        need = max(need, skinny_smem_bytes(GEMM_TOKEN_BLOCK, gemm_stages(), gmax, EPI_GEMM_LAYOUT))
    return need


# ---- plans the kernel takes ------------------------------------------------------------------------------

@dataclass
class RawPlan:
    """A hand-built instruction tensor (tests, framework cost): [num_queues, max_queue_len, 32] int32, no
    operand table (only NOOP instructions make sense), `num_counters` event counters."""

    instructions: torch.Tensor
    num_counters: int
    ops: list[str] = field(default_factory=list)
    dispatch: str = "static"  # "dynamic": instructions is [1, n, 32], claimed by num_ctas CTAs; the last counter claims
    num_ctas: int = 0
    claim_delay_ns: torch.Tensor | None = None  # dynamic: per entry (None: claim once the current one has its inputs)

    def __post_init__(self) -> None:
        t = self.instructions
        if t.dtype != torch.int32 or t.dim() != 3 or t.shape[2] != INSTR_WORDS or t.shape[1] < 1:
            raise MegaRtpError(f"RawPlan: instructions must be int32 [queues, length >= 1, {INSTR_WORDS}], "
                               f"got {t.dtype} {list(t.shape)}")
        if self.num_counters < 0:
            raise MegaRtpError(f"RawPlan: num_counters must be >= 0, got {self.num_counters}")
        if self.dispatch not in ("static", "dynamic"):
            raise MegaRtpError(f"RawPlan: dispatch must be 'static' or 'dynamic', got {self.dispatch!r}")
        if self.dispatch == "dynamic" and (t.shape[0] != 1 or self.num_ctas < 1 or self.num_counters < 1):
            raise MegaRtpError("RawPlan: a dynamic plan is one list [1, n, 32] with num_ctas >= 1 and its claim "
                               f"counter last (num_counters >= 1); got {list(t.shape)}, num_ctas {self.num_ctas}, "
                               f"num_counters {self.num_counters}")

    @property
    def num_tokens(self) -> int:
        return 0

    @property
    def grid_ctas(self) -> int:
        return self.num_ctas or int(self.instructions.shape[0])

    @property
    def claim_counter(self) -> int:
        return self.num_counters - 1 if self.dispatch == "dynamic" else -1


def noop_plan(num_queues: int, length: int = 1) -> RawPlan:
    """Every queue `length` NOOPs without waits or signals: the fixed framework cost."""
    words = torch.tensor(encode(NOOP), dtype=torch.int32).repeat(num_queues, length, 1)
    return RawPlan(words, 0)


def chain_plan(num_queues: int, length: int, *, seed: int = 0) -> RawPlan:
    """NOOPs whose events chain across queues: instruction (q, i) waits for (q-1, i) and (q+1, i-1) (event per
    instruction, threshold 1) and signals its own; a random extra fan-in per instruction. Deadlock-free:
    every wait targets an instruction earlier in a global order (i, then q)."""
    g = torch.Generator().manual_seed(seed)
    ev = lambda q, i: i * num_queues + q  # noqa: E731
    words = torch.zeros(num_queues, length, INSTR_WORDS, dtype=torch.int32)
    for q in range(num_queues):
        for i in range(length):
            waits = []
            if q > 0:
                waits.append((ev(q - 1, i), 1))
            if i > 0 and q + 1 < num_queues:
                waits.append((ev(q + 1, i - 1), 1))
            if i > 0:
                r = int(torch.randint(0, num_queues, (1,), generator=g))
                if (ev(r, i - 1), 1) not in waits:
                    waits.append((ev(r, i - 1), 1))
            ins = Instruction(int(Opcode.NOOP), waits=tuple(waits[:MAX_WAITS]), signals=((ev(q, i), 1, 0),))
            words[q, i] = torch.tensor(encode(ins), dtype=torch.int32)
    return RawPlan(words, num_queues * length)


def as_dynamic(plan: RawPlan, num_ctas: int) -> RawPlan:
    """The same instructions as one list for dynamic dispatch, position-major ((0, q) for every q, then (1, q), ...),
    plus a claim counter. Topological for noop_plan / chain_plan, whose instruction (q, i) waits only for
    instructions (q', i) with q' < q or (q', i - 1)."""
    q, n, _ = plan.instructions.shape
    order = plan.instructions.transpose(0, 1).reshape(1, q * n, INSTR_WORDS).contiguous()
    return RawPlan(order, plan.num_counters + 1, list(plan.ops), "dynamic", int(num_ctas))


def _is_kernel_plan(plan: Any) -> bool:
    return hasattr(plan, "taskgraph") and hasattr(plan, "operands")


def _decoded(plan: Any) -> list[tuple[int, int, Instruction]]:
    t = plan.instructions
    out = []
    for q in range(t.shape[0]):
        for i in range(t.shape[1]):
            ins = decode(t[q, i])
            if ins.opcode != Opcode.NOOP or ins.waits or ins.signals:
                out.append((q, i, ins))
    return out


def _families(plan: Any) -> set[str]:
    ops = set(int(x) for x in torch.unique(plan.instructions[:, :, 0]).tolist())
    return {FAMILY_BY_OPCODE[o].name for o in ops if o in FAMILY_BY_OPCODE}


def _max_k_groups(plan: Any) -> int:
    """Most 128-wide K groups of one split-K instruction (read from the words: no decode, so a malformed
    instruction reaches the device check)."""
    w = plan.instructions.reshape(-1, INSTR_WORDS).to(torch.int64)
    split_k = [op for op, f in FAMILY_BY_OPCODE.items() if f.split_k]
    sel = torch.isin(w[:, OPCODE], torch.tensor(split_k, dtype=torch.int64))
    if not bool(sel.any()):
        return 0
    k0 = PAYLOAD + SPLIT_K_PAYLOAD.index("k0")
    return int(((w[sel, k0 + 1] - w[sel, k0]) // 128).max())


def family_support_errors(plan: Any, cfg: Glm5Config | None) -> list[str]:
    """Why the compiled megakernel cannot run `plan` (empty: it can). Families first, then per-tile shapes."""
    errs: list[str] = []
    fams = _families(plan)
    missing = sorted(fams - set(SUPPORTED_FAMILIES))
    if missing:
        counts = {f: 0 for f in missing}
        for _, _, ins in _decoded(plan):
            f = ins.family
            if f is not None and f.name in counts:
                counts[f.name] += 1
        errs.append("op families not in the megakernel: " + "; ".join(
            f"{f} ({counts[f]} tiles): {UNSUPPORTED_WHY.get(f, 'no adapter in csrc/megartp/families.cuh')}"
            for f in missing))
    if not _is_kernel_plan(plan):
        if fams:
            errs.append(f"a RawPlan has no operand table: families {sorted(fams)} need a KernelPlan")
        return errs
    if cfg is None:
        if fams:
            errs.append("cfg (Glm5Config) is required for a plan with op families (dims, eps, RoPE)")
        return errs
    g = plan.graph
    if "D1" in fams and cfg.index_head_dim != 128:
        errs.append(f"D1: the megakernel's per-head epilogue needs index_head_dim == 128 (one head = one 128-row "
                    f"tile), the config has {cfg.index_head_dim}")
    if "B1" in fams and "x_fp8" not in g.ops["B1"].inputs:
        errs.append("B1: only the fp8 indexer-K GEMM (x_fp8 / x_scale) is implemented, the graph uses the bf16 one")
    if "D2" in fams and (cfg.qk_nope_head_dim % 32 or cfg.qk_nope_head_dim > 256 or cfg.kv_lora_rank % 128
                         or cfg.qk_rope_head_dim % 2 or cfg.qk_rope_head_dim > 64):
        errs.append(f"D2: dims nope={cfg.qk_nope_head_dim}, kv_lora={cfg.kv_lora_rank}, rope={cfg.qk_rope_head_dim} "
                    "outside the D2 tile's limits (nope % 32, <= 256; kv_lora % 128; rope even <= 64)")
    if "C0" in fams and (cfg.index_n_heads % 4 or not 4 <= cfg.index_n_heads <= 32):
        errs.append(f"C0: {cfg.index_n_heads} indexer heads; the family needs a multiple of 4, at most 32")
    if "A0" in fams and cfg.hidden_size % 256:
        errs.append(f"A0: hidden_size {cfg.hidden_size} is not a multiple of 256 (the row tile's 256-column chunks)")
    if "E1" in fams and (cfg.index_n_heads > 32 or cfg.index_head_dim % 64):
        errs.append(f"E1: {cfg.index_n_heads} indexer heads x {cfg.index_head_dim} dims outside the tile's limits "
                    "(<= 32 heads in registers, head dim a multiple of 64)")
    for name in ("positions", "out_cache_loc"):
        if name in g.tensors and g.tensors[name].dtype != torch.int64:
            errs.append(f"{name} must be int64 (the families read 8-byte indices), the graph says {g.tensors[name].dtype}")
    bad: dict[str, list[str]] = {}
    for q, i, ins in _decoded(plan):
        f = ins.family
        if f is None or f.name not in SUPPORTED_FAMILIES:
            continue
        p = ins.named_payload()
        why = None
        if f.split_k and p["k_split"] == FINAL_K_SPLIT:  # a row finaliser (B0)
            if not (f.finalizer and p["m1"] == p["m0"] + 1 and (p["g0"], p["g1"]) == (0, cfg.qkv_a_out)):
                why = f"finaliser of rows [{p['m0']},{p['m1']}) x [{p['g0']},{p['g1']}) is not one whole row"
        elif f.split_k:
            if p["m0"] % GEMM_TOKEN_BLOCK:
                why = f"m0={p['m0']} not a multiple of {GEMM_TOKEN_BLOCK}"
            elif p["n0"] % 128 or not 0 < p["n1"] - p["n0"] <= 128:
                why = f"weight rows [{p['n0']},{p['n1']}) do not start a 128-row block or leave it"
            elif p["k0"] % 128 or p["k1"] % 128:
                why = f"K range [{p['k0']},{p['k1']}) not on 128-column groups"
            elif f.name == "B0" and (p["g0"], p["g1"]) != (0, cfg.qkv_a_out):
                why = f"B0 group [{p['g0']},{p['g1']}) is not whole rows"
            elif f.name == "D1" and (p["g0"], p["g1"]) != (p["n0"], p["n1"]):
                why = f"D1 group [{p['g0']},{p['g1']}) is not the tile's head"
            elif f.name == "C0" and p["k1"] - p["k0"] not in (128, 256):
                why = f"K chunk [{p['k0']},{p['k1']}) is not 128 or 256 columns (the fragment layout's warps)"
        elif f.name == "D0" and (p["m0"] % GEMM_TOKEN_BLOCK or p["n0"] % 128 or not 0 < p["n1"] - p["n0"] <= 128):
            why = (f"rows [{p['m0']},{p['m1']}) x weight rows [{p['n0']},{p['n1']}): m0 not on a {GEMM_TOKEN_BLOCK}-token "
                   "block, or the weight rows do not start a 128-row block or leave it (q_b heads of a multiple of 128)")
        elif f.name == "D2" and (p["n0"] % 128 or p["n1"] - p["n0"] != 128):
            why = f"latent columns [{p['n0']},{p['n1']}) are not one 128-column tile"
        elif f.name == "E1":
            why = _e1_tile_problem(p, plan.taskgraph.ctx)
        if why is not None:
            bad.setdefault(f.name, []).append(f"queue {q} slot {i} tile {ins.tile_index}: {why}")
    for name, lines in bad.items():
        errs.append(f"{name}: {len(lines)} tiles the family cannot run, e.g. " + "; ".join(lines[:3]))
    return errs


def _e1_tile_problem(p: Mapping[str, int], ctx: ShapeContext) -> str | None:
    """Why the E1 family cannot run this payload (the device checks the same with the bound seq_lens)."""
    kv0, kv1 = p["kv0"], p["kv1"]
    if kv0 % E1_PAGE or kv1 <= kv0:
        return f"KV window [{kv0},{kv1}) does not start a {E1_PAGE}-token page"
    lens = ctx.seq_lens[p["q0"]:p["q1"]]
    live = max([min(int(n), kv1) - kv0 for n in lens] + [0])
    if live > E1_MAX_PAGES * E1_PAGE:
        return f"{live} live KV tokens past {kv0}: the family reads at most {E1_MAX_PAGES} pages per window"
    return None


def check_plan_supported(plan: Any, cfg: Glm5Config | None) -> None:
    errs = family_support_errors(plan, cfg)
    if errs:
        raise MegaRtpUnsupported("MegaRTP megakernel v1 cannot run this plan:\n  " + "\n  ".join(errs))


# ---- launch parameters (ABI of MegaParams in csrc/megartp/runtime.cuh) ----------------------------------

class _Params(ctypes.Structure):
    _fields_ = [
        ("instructions", ctypes.c_void_p), ("counters", ctypes.c_void_p), ("operands", ctypes.c_void_p),
        ("error", ctypes.c_void_p), ("trace", ctypes.c_void_p), ("state", ctypes.c_void_p),
        ("rope_inv_freq", ctypes.c_void_p), ("rope_table", ctypes.c_void_p), ("claim_delay_ns", ctypes.c_void_p),
        ("rope_table_len", ctypes.c_int64), ("kv_num_slots", ctypes.c_int64), ("wait_budget_cycles", ctypes.c_int64),
        ("rope_theta", ctypes.c_double),
        ("epoch", ctypes.c_uint32), ("num_queues", ctypes.c_int32), ("max_queue_len", ctypes.c_int32),
        ("num_ops", ctypes.c_int32), ("num_counters", ctypes.c_int32), ("num_tokens", ctypes.c_int32),
        ("hidden", ctypes.c_int32), ("num_heads", ctypes.c_int32), ("idx_heads", ctypes.c_int32),
        ("idx_dim", ctypes.c_int32), ("rms_eps", ctypes.c_float), ("k_norm_eps", ctypes.c_float),
        ("head_w_scale", ctypes.c_float), ("max_ctx", ctypes.c_int32), ("idx_cache_pages", ctypes.c_int64),
        ("bt_width", ctypes.c_int32), ("q_lora", ctypes.c_int32),
        ("claim_counter", ctypes.c_int32), ("reserved", ctypes.c_int32),
    ]


PARAMS_BYTES = 184  # static_assert(sizeof(MegaParams) == 184) in runtime.cuh
assert ctypes.sizeof(_Params) == PARAMS_BYTES, ctypes.sizeof(_Params)


def _fp32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _sm_clock_hz(index: int) -> float:
    try:
        from ...jit.runtime import check, driver
        d = driver()
        dev = check(d.cuDeviceGet(index), "cuDeviceGet")
        khz = check(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev),
                    "cuDeviceGetAttribute(CLOCK_RATE)")
        return float(khz) * 1e3 if khz else FALLBACK_SM_CLOCK_HZ
    except Exception:  # noqa: BLE001 - the budget is a bound, an estimate is enough
        return FALLBACK_SM_CLOCK_HZ


def max_epoch(plan: Any) -> int:
    """The last epoch whose targets (epoch x threshold, epoch x reduce target) and exit count (epoch x queues,
    state[1]) fit uint32. Read from the words (every wait slot, used or not: only the maximum matters)."""
    w = plan.instructions.reshape(-1, INSTR_WORDS).to(torch.int64)
    cols = [WAITS + 2 * i + 1 for i in range(MAX_WAITS)] + [REDUCE_TARGET]
    grid = int(plan.grid_ctas)
    biggest = max(int(w[:, cols].max()) if w.numel() else 1, 1, grid)
    if plan.dispatch == "dynamic":  # claims per step: every instruction + one stop per CTA
        biggest = max(biggest, int(plan.instructions.shape[1]) + grid)
    return (2**32 - 1) // biggest


class PlanRunner:
    """Device state of one plan on one device: the instruction tensor, counters (zeroed once), the operand
    table, error record, epoch state and (trace builds) the trace buffer; launches the megakernel."""

    def __init__(self, plan: Any, cfg: Glm5Config | None = None, device: Any = None, *, trace: bool = False,
                 wait_budget_ms: float = DEFAULT_WAIT_BUDGET_MS):
        check_plan_supported(plan, cfg)
        dev = torch.device(device if device is not None else "cuda")
        if dev.type != "cuda":
            raise MegaRtpError(f"the megakernel runs on a CUDA device, got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        from ...ops._device import require_hopper
        require_hopper("glm5_fastpath.megartp", dev, MegaRtpError)
        self.plan, self.device, self.trace_enabled = plan, dev, bool(trace)
        self.cfg = cfg if cfg is not None else Glm5Config.preset("glm5")
        q, l, _ = plan.instructions.shape
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.dynamic = plan.dispatch == "dynamic"
        self.grid = int(plan.grid_ctas)
        if self.grid > sms:
            what = f"{self.grid} CTAs (dynamic dispatch)" if self.dynamic else f"{q} queues"
            raise MegaRtpError(f"the plan has {what} but {dev} has {sms} SMs: every CTA must be resident "
                               f"(re-plan with num_sms <= {sms})")
        self.claim_counter = int(plan.claim_counter)  # -1 for static queues
        delays = plan.claim_delay_ns if self.dynamic else None
        if delays is not None and tuple(delays.shape) != (int(l),):
            raise MegaRtpError(f"claim_delay_ns has shape {list(delays.shape)}, the plan's list needs [{int(l)}]")
        self.claim_delays = delays.to(dev, torch.int32).contiguous() if delays is not None else None
        self.num_queues, self.max_queue_len = int(q), int(l)
        self.ops = list(getattr(plan, "ops", []))
        self.kernel_plan = _is_kernel_plan(plan)
        self.instructions = plan.instructions.to(dev, torch.int32).contiguous()
        self.counters = torch.zeros(max(int(plan.num_counters), 1), dtype=torch.int32, device=dev)
        self.error = torch.zeros(ERROR_WORDS, dtype=torch.int32, device=dev)
        self.state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=dev)
        self.operand_ptrs = torch.zeros(max(len(self.ops), 1), OPERAND_SLOTS, dtype=torch.int64, device=dev)
        self.trace_buf = (torch.zeros(q, l, TRACE_WORDS, dtype=torch.int64, device=dev) if trace else None)
        self.smem = dynamic_smem_bytes(self.cfg, plan)
        self.max_epoch = max_epoch(plan)
        self.epoch = 0  # last launched epoch (host mirror of state[0] once the launch completed)
        self.budget_cycles = int(wait_budget_ms * 1e-3 * _sm_clock_hz(dev.index))
        self.bound: dict[str, torch.Tensor] = {}
        self._kv_slots = 0
        self._e1_dims = (0, 0, 0)  # (max_ctx, block-table width, index-K cache pages) of the bound operands
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None
        self._kernel = None

    # -- binding --------------------------------------------------------------------------------------------

    def bind(self, tensors: Mapping[str, torch.Tensor]) -> "PlanRunner":
        """OperandPtrTable of `tensors` (graph names + workspace.<op>; see interpreter.allocate), checked for
        device, dtype, contiguity and size, copied to the device table (instructions unchanged)."""
        if not self.kernel_plan:
            return self
        table = bind_operands(self.plan, tensors, self.device)
        self.operand_ptrs.copy_(table.ptrs.view(torch.int64).to(self.device))
        self.bound = dict(tensors)
        kv = tensors.get("kv_cache")
        self._kv_slots = int(kv.shape[0]) if isinstance(kv, torch.Tensor) else 0
        lg, bt = tensors.get("logits"), tensors.get("block_table")
        ik = tensors.get("index_k_cache", tensors.get("index_k_cache_written"))
        self._e1_dims = tuple(int(t.shape[i]) if isinstance(t, torch.Tensor) and t.dim() == 2 else 0
                              for t, i in ((lg, 1), (bt, 1), (ik, 0)))
        return self

    def _rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tables is None:
            from ...ops.d2_absorb import inv_freq_table
            from ...ops.fp8_gemm import rope_table
            c = self.cfg
            self._tables = (inv_freq_table(c.qk_rope_head_dim, float(c.rope_theta)).to(self.device),
                            rope_table(c.qk_rope_head_dim, float(c.rope_theta), c.max_position_embeddings, self.device))
        return self._tables

    def _params(self, epoch: int) -> _Params:
        c, p = self.cfg, _Params()
        p.instructions, p.counters = self.instructions.data_ptr(), self.counters.data_ptr()
        p.operands, p.error, p.state = self.operand_ptrs.data_ptr(), self.error.data_ptr(), self.state.data_ptr()
        p.trace = self.trace_buf.data_ptr() if self.trace_buf is not None else None
        if self.kernel_plan:
            inv, table = self._rope_tables()
            p.rope_inv_freq, p.rope_table, p.rope_table_len = inv.data_ptr(), table.data_ptr(), table.shape[0]
        p.kv_num_slots, p.wait_budget_cycles, p.rope_theta = self._kv_slots, self.budget_cycles, float(c.rope_theta)
        p.epoch, p.num_queues, p.max_queue_len = epoch, self.num_queues, self.max_queue_len
        p.num_ops, p.num_counters = len(self.ops), int(self.plan.num_counters)
        p.num_tokens = self.plan.taskgraph.ctx.M if self.kernel_plan else 0
        p.hidden, p.num_heads, p.q_lora = c.hidden_size, c.num_attention_heads, c.q_lora_rank
        p.idx_heads, p.idx_dim = c.index_n_heads, c.index_head_dim
        p.rms_eps, p.k_norm_eps = _fp32(c.rms_norm_eps), _fp32(INDEXER_K_NORM_EPS)
        p.head_w_scale = _fp32(c.index_weight_scale)
        p.max_ctx, p.bt_width, p.idx_cache_pages = self._e1_dims
        p.claim_counter, p.reserved = self.claim_counter, 0
        p.claim_delay_ns = self.claim_delays.data_ptr() if self.claim_delays is not None else None
        return p

    def kernel(self):
        if self._kernel is None:
            from ...jit.runtime import get_kernel
            self._kernel = get_kernel(kernel_spec(self.cfg, self.trace_enabled), device=self.device)
        return self._kernel

    # -- running --------------------------------------------------------------------------------------------

    def launch(self, epoch: int | None = None, stream: Any = None) -> int:
        """Enqueue one step. epoch=None: the kernel uses state[0] + 1 (graph-replay safe); an int must be the
        previous epoch + 1. -> the epoch this launch runs."""
        if self.kernel_plan and not self.bound:
            raise MegaRtpError("bind(tensors) before launch: the operand table is empty")
        nxt = self.epoch + 1
        if epoch is not None and int(epoch) != nxt:
            raise MegaRtpError(f"epoch {epoch}: counters hold epoch {self.epoch}, the next step must be epoch {nxt} "
                               "(a skipped epoch deadlocks, a repeated one passes its waits early); reset() restarts at 1")
        if nxt > self.max_epoch:
            raise MegaRtpError(f"epoch {nxt} exceeds {self.max_epoch} (uint32 targets); reset() zeroes the counters")
        if self.trace_buf is not None:
            self.trace_buf.zero_()
        self.kernel().launch((self.grid, 1, 1), (THREADS, 1, 1), [self._params(0 if epoch is None else nxt)],
                             smem=self.smem, stream=stream)
        self.epoch = nxt
        return nxt

    def error_record(self) -> ErrorRecord:
        return ErrorRecord.from_words(self.error.cpu().tolist())

    def check(self) -> None:
        """Synchronise the device; raise the kernel's error (after resetting the runner) if it wrote one, else
        re-read the epoch the counters hold (CUDA-graph replays advance it without the host)."""
        torch.cuda.synchronize(self.device)
        exc = decode_error(self.error.cpu().tolist(), self.ops)
        if exc is not None:
            self.reset()
            raise exc
        self.epoch = int(self.state[0].item()) & 0xFFFFFFFF

    def reset(self) -> None:
        """Zero counters, error record and epoch state: the next launch is epoch 1."""
        self.counters.zero_()
        self.error.zero_()
        self.state.zero_()
        self.epoch = 0

    def trace_raw(self) -> torch.Tensor:
        if self.trace_buf is None:
            raise MegaRtpError("this runner was built with trace=False")
        return self.trace_buf.cpu()

    def trace_records(self):
        from .trace import decode_trace
        return decode_trace(self.plan, self.trace_raw())


def bind_operands(plan: Any, tensors: Mapping[str, torch.Tensor], device: Any):
    """plan.rebind(tensors), then every bound operand checked (device, alignment, contiguity, dtype, the dims
    the plan fixes) -> the OperandTable (its ptrs: what the kernel reads)."""
    g: OpGraph = plan.graph
    dims = plan.taskgraph.ctx.dims()
    table = plan.rebind(tensors)
    for row, op in enumerate(plan.ops):
        for slot, name in enumerate(table.slot_names(row)):
            if int(table.ptrs[row, slot]) != 0:
                _check_operand(op, name, table.tensor(row, name), g, dims, plan.workspaces, torch.device(device))
    return table


def _check_operand(op: str, name: str, t: torch.Tensor, g: OpGraph, dims: Mapping[str, int],
                   workspaces: Mapping[str, tuple[int, ...]], device: torch.device) -> None:
    """Device, alignment, contiguity, dtype and the dims the plan fixes (symbols it does not know, such as a
    cache's slot count or the block table's width, are free)."""
    where = f"operand {op}.{name}"
    if t.device != device:
        raise MegaRtpError(f"{where} is on {t.device}, the runner on {device}")
    if not t.is_contiguous():
        raise MegaRtpError(f"{where} must be contiguous (strides {t.stride()} for shape {list(t.shape)})")
    if t.numel() and t.data_ptr() % 16:
        raise MegaRtpError(f"{where} must be 16-byte aligned (address {t.data_ptr():#x}; a sliced view?)")
    if name == "workspace":
        dtype, want = torch.float32, list(workspaces[f"workspace.{op}"])
    else:
        td = g.tensors[name]
        if td.inplace_of is not None:
            td = g.tensors[td.inplace_of]
        dtype = td.dtype
        want = [d if isinstance(d, int) else dims.get(d) for d in td.shape]
    if t.dtype != dtype:
        raise MegaRtpError(f"{where} must be {dtype}, got {t.dtype}")
    if t.dim() != len(want) or any(w is not None and w != s for w, s in zip(want, t.shape)):
        shown = ["*" if w is None else w for w in want]
        raise MegaRtpError(f"{where} must have shape {shown}, got {list(t.shape)}")


# ---- one call ---------------------------------------------------------------------------------------------

_runners: dict[tuple, PlanRunner] = {}
_runners_lock = threading.Lock()


def _runner_for(plan: Any, cfg: Glm5Config | None, device: Any, trace: bool, wait_budget_ms: float) -> PlanRunner:
    dev = torch.device(device if device is not None else "cuda")
    key = (id(plan), str(dev), bool(trace))
    with _runners_lock:
        r = _runners.get(key)
        if r is None or r.plan is not plan:
            r = _runners[key] = PlanRunner(plan, cfg, dev, trace=trace, wait_budget_ms=wait_budget_ms)
            weakref.finalize(plan, _runners.pop, key, None)
    return r


def run_plan(plan: Any, operands: Mapping[str, torch.Tensor] | None, epoch: int | None, trace: bool = False, *,
             cfg: Glm5Config | None = None, device: Any = None, check: bool = True,
             wait_budget_ms: float = DEFAULT_WAIT_BUDGET_MS) -> PlanRunner:
    """Run step `epoch` of `plan` on the device with `operands` bound (the runner and its counters are kept
    per (plan, device, trace) across calls, so epochs 1, 2, ... follow each other). check=True synchronises
    and raises the kernel's error. -> the runner (trace_records(), error_record(), reset())."""
    r = _runner_for(plan, cfg, device, trace, wait_budget_ms)
    if cfg is not None and cfg is not r.cfg and KernelDims.of(cfg) != KernelDims.of(r.cfg):
        raise MegaRtpError("run_plan: cfg differs from the one this plan's runner was built with")
    if operands is not None:
        r.bind(operands)
    r.launch(epoch)
    if check:
        r.check()
    return r


# ---- executor ---------------------------------------------------------------------------------------------

def keep_only(graph: OpGraph, ops: Sequence[str], name: str | None = None) -> OpGraph:
    """`graph` with only `ops`; outputs of the dropped ops that the kept ones read become caller inputs."""
    keep = [o for o in graph.ops if o in set(ops)]
    unknown = sorted(set(ops) - set(graph.ops))
    if unknown or not keep:
        raise MegaRtpError(f"keep_only({graph.name}): ops {unknown or list(ops)} are not in the graph ({list(graph.ops)})")
    drop = [o for o in graph.ops if o not in keep]
    read = lambda t: any(t in graph.ops[k].inputs for k in keep)  # noqa: E731
    retype = {t: "input" for o in drop for t in graph.ops[o].outputs if graph.tensors[t].inplace_of is None and read(t)}
    # an in-place cache version whose writer is dropped (index_k_cache_written for E1 without B1): the caller's cache
    retype.update({t: "cache" for o in drop for t in graph.ops[o].outputs
                   if graph.tensors[t].inplace_of is not None and read(t)})
    return graph.without(drop, retype=retype, name=name or f"{graph.name}[{'+'.join(keep)}]").validate()


def supported_subgraph(graph: OpGraph, cfg: Glm5Config | None = None, name: str | None = None) -> OpGraph:
    """`graph` without the ops the megakernel lacks (for `cfg`'s dims when given: D1 needs index_head_dim
    128, D0 q_b heads of a multiple of 128 rows); the dropped ops' outputs the rest reads become caller inputs."""
    keep = [o for o in graph.ops if o in SUPPORTED_FAMILIES
            and not (o == "D1" and cfg is not None and cfg.index_head_dim != 128)
            and not (o == "D0" and cfg is not None and (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) % 128)]
    if not keep:
        raise MegaRtpUnsupported(f"no op of {graph.name} has a megakernel family ({SUPPORTED_FAMILIES})")
    return keep_only(graph, keep, name or f"{graph.name}[megartp v1: {'+'.join(keep)}]")


@dataclass
class _PlanState:
    plan: Any
    runner: PlanRunner
    tensors: dict[str, torch.Tensor]


class MegaRtpExecutor:
    """The prefix (or a subgraph of it) as one megakernel launch per step.

        ex = MegaRtpExecutor(cfg, weights, "cuda", kv_cache=kv, index_k_cache=ik, graph=g)
        out = ex.run(ShapeContext.shared_kv(16, 8192), hidden=h, residual=r, positions=p, out_cache_loc=loc,
                     seq_lens=sl, block_table=bt)

    Per step shape (ShapeContext: M and the KV lengths), a KernelPlan is built, validated and checked against
    the kernel's families once, with its own intermediates / outputs / split-K workspaces (static: the same
    addresses every step, so a launch can be captured). Operands come from the buffers CMP uses: the weights
    (graph.prefix_graph.weight_tensors), the caches by address (rebind() to change them), and the step inputs
    in a cmp.staging.StaticInputs buffer (rows [:M] bound). Graph inputs that are neither (a subgraph's
    inputs, e.g. x_fp8 when A0 is not in the graph) are passed to run() by name and bound by address.
    """

    def __init__(self, cfg: Glm5Config, weights: Any, device: Any, *, kv_cache: torch.Tensor,
                 index_k_cache: torch.Tensor | None = None, graph: OpGraph | None = None, max_m: int = 256,
                 max_pages: int | None = None, pad_slot: int = 0, num_sms: int | None = None, scheduler: str = "list",
                 trace: bool = False, wait_budget_ms: float = DEFAULT_WAIT_BUDGET_MS):
        from ...graph.prefix_graph import build_prefix_graph, weight_tensors
        from ..cmp.staging import PAGE, StaticInputs
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        w = getattr(weights, "attn", weights)
        self.graph = graph if graph is not None else build_prefix_graph(cfg, full_indexer=w.indexer is not None)
        self.weights = {k: v for k, v in weight_tensors(w).items() if k in self.graph.tensors}
        self.num_sms = num_sms or torch.cuda.get_device_properties(self.device).multi_processor_count
        self.scheduler, self.trace, self.wait_budget_ms = scheduler, trace, wait_budget_ms
        self.max_pages = int(max_pages) if max_pages is not None else -(-cfg.max_position_embeddings // PAGE)
        self.staging = StaticInputs(cfg, (int(max_m),), self.max_pages, pad_slot, self.device)
        self.kv_cache, self.index_k_cache = kv_cache, index_k_cache
        self._plans: dict[ShapeContext, _PlanState] = {}

    def rebind(self, *, kv_cache: torch.Tensor | None = None, index_k_cache: torch.Tensor | None = None) -> None:
        """New caches (bound by address): every run() re-binds the operand table, the plans are kept."""
        if kv_cache is not None:
            self.kv_cache = kv_cache
        if index_k_cache is not None:
            self.index_k_cache = index_k_cache

    def plan_for(self, ctx: ShapeContext):
        """The validated KernelPlan of this step shape (built once; raises MegaRtpUnsupported naming the
        families the kernel lacks)."""
        st = self._plans.get(ctx)
        if st is None:
            from .plan import build_plan
            from .validator import validate
            plan = validate(build_plan(self.graph, ctx, self.cfg, num_sms=self.num_sms, scheduler=self.scheduler))
            check_plan_supported(plan, self.cfg)
            runner = PlanRunner(plan, self.cfg, self.device, trace=self.trace, wait_budget_ms=self.wait_budget_ms)
            st = self._plans[ctx] = _PlanState(plan, runner, self._allocate(plan))
        return st.plan

    def _allocate(self, plan) -> dict[str, torch.Tensor]:
        g, dims = plan.graph, plan.taskgraph.ctx.dims()
        out: dict[str, torch.Tensor] = {}
        for name in g.produced_tensors():
            td = g.tensors[name]
            if td.inplace_of is None:
                out[name] = torch.empty(td.resolve(dims), dtype=td.dtype, device=self.device)
        out.update(plan.alloc_workspaces(self.device))
        return out

    def run(self, ctx: ShapeContext, *, check: bool = True, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of shape `ctx` (M = ctx.M rows in every step input). When the graph reads `hidden` (the
        full prefix, as CMP) the step inputs go through the static staging buffers (all of hidden, residual,
        positions, out_cache_loc, seq_lens, block_table); otherwise every graph input is bound by address
        (keep the same tensors alive across steps to capture a launch). -> every produced tensor of the graph
        (the plan's static buffers)."""
        self.plan_for(ctx)
        st = self._plans[ctx]
        g, m = st.plan.graph, ctx.M
        env = dict(self.weights)
        if "hidden" in g.tensors:
            step = {k: inputs.pop(k) for k in list(inputs) if k in self.staging.specs}
            self.staging.load(step, m)
            env.update({k: v for k, v in self.staging.views(m).items() if k in g.tensors})
        env["kv_cache"] = self.kv_cache
        if self.index_k_cache is not None:
            env["index_k_cache"] = self.index_k_cache
        env.update(inputs)
        missing = [t for t in g.external_tensors() if t not in env]
        if missing:
            raise MegaRtpError(f"MegaRtpExecutor.run: the graph needs inputs {missing} (pass them by name)")
        env.update(st.tensors)
        st.runner.bind({k: v for k, v in env.items() if k in g.tensors or k.startswith("workspace.")})
        st.runner.launch(st.runner.epoch + 1)
        if check:
            st.runner.check()
        return {t: st.tensors[t] for t in g.produced_tensors() if t in st.tensors}

    def runner(self, ctx: ShapeContext) -> PlanRunner:
        self.plan_for(ctx)
        return self._plans[ctx].runner


__all__ = ["ErrorRecord", "KernelDims", "MegaRtpDeviceError", "MegaRtpError", "MegaRtpExecutor", "MegaRtpUnsupported",
           "MegaRtpWaitTimeout", "PlanRunner", "RawPlan", "SUPPORTED_FAMILIES", "chain_plan", "check_plan_supported",
           "bind_operands", "compile_check_specs", "decode_error", "dynamic_smem_bytes", "family_support_errors", "keep_only",
           "kernel_spec",
           "noop_plan", "precompile", "run_plan", "supported_subgraph"]
