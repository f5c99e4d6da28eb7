"""MegaMoE for Hopper: GLM-5's whole MoE (routed experts + the fused shared expert) in one persistent
fused FP8 kernel, as the torch.library op `glm5_fastpath::mega_moe`.

Math (glm5_fastpath/ref/moe.py, the same rounding points; spec/glm5_layer.md section 6):

    pair (t, j)  expert e = topk_ids[t, j] (j < k), or the shared expert (j = k) with weight fp32(1/rsf)
    FC1          gu = bf16(block_fp8(x8[t], W13_e))           x8, x_scale: 1x128 FP8 input (A0's output)
    act          a  = bf16(silu(g) * u);  a8, a_scale = 1x128 requant of a (IEEE divides, as the reference)
    FC2          y  = bf16(block_fp8(a8, W2_e) * w)           routing weight on the fp32 accumulator
    combine      out[t] = bf16(rsf * sum_{j=0..S-1} fp32(y[t, j]))   slots summed in order (deterministic)

Kernels (csrc/moe/megamoe.{cuh,cu}; design notes in the .cuh header):
- `glm5_megamoe_plan` (1 CTA x 1024 threads, launched first): histogram of topk_ids per expert, token
  lists per expert (pair rows 8-aligned), the ordered task list (FC1 of expert group g+1 before FC2 of
  group g; `group_size` active experts per group), and the resets of the counters the MoE kernel uses.
  Capture-safe: no host sync anywhere; it waits for its predecessor with griddepcontrol.wait.
- `glm5_megamoe` (one 384-thread CTA per SM, PDL after the plan): weight TMA producer + scheduler warp
  (claims tasks with one global atomic), three activation loader warps (cp.async gathers, rows split over
  them; wait on fc1_done counters for FC2), two math warpgroups (wgmma m64nNk32 e4m3, swapAB; N = the smallest of 8/16/24/32/48/64
  holding the task's live tokens, at most the token block: a 40-token block of a bn64 build runs N = 48;
  H200, session 9, same run as the full-width build: (a) 128 tokens 420.7 -> 371.7 us, (b) 1024 3606.7 ->
  2876.7 us, bitwise the same outputs, benchmarks/results/2026-11-30_h200_session9/c7_5dae537 and
  c8_3702794). FC1 task = 256
  rows of the gate/up weight interleaved by 8 (= 128 channels = one requant group) x one token block;
  FC2 task = 256 output rows x one token block, gated on all I/128 FC1 tiles of that block.
  Two large-M builds (bitwise equal to the default, measured in docs/megamoe_large_m.md): block_n 128, the wide
  mode (128-row wgmma tiles, one m64n128 half per math warpgroup, FC1 tasks as two 128-row passes, 128-row FC2
  tasks); and `pool` (the loader warps first copy every pair's token row into an expert-grouped token pool, then
  each stage's activations are one TMA box). A third, token_major, runs the wide mode with the wgmma operands
  swapped (tokens on M, weight rows on N: per-row scales, one FFMA per element in the fold), in the wide block
  (session 13) and in the narrow one (bn64: both math warpgroups share the 64 token rows, each takes 128 of the 256
  weight rows; session 14). default_config takes bn64 + pool + token_major + end_combine (the combine as one grid-wide
  pass after the last task, below) from an expected largest routed expert of TOKEN_MAJOR_POOL_MIN_LOAD tokens; the
  other combinations are opt-in.

Combine (deterministic): the FC2 epilogue writes bf16 y per (token, slot) into a slot buffer
[max_tokens, S, H]; a per-(token, 256-column tile; wide mode 128) counter tells the last of the S contributors, which
sums the S slots in slot order (fp32), multiplies by rsf and writes the bf16 output. Same slot order and
roundings as the reference's moe_sum_reduce, so repeated runs are bitwise identical. The end combine (end_combine,
pool builds) does the same sums in one grid-wide pass after every CTA's last task instead (no counters).

Weights: the kernel reads the stacked checkpoint layout as it is (SGLang's w13_weight [E_tot, 2I, H]
gate || up, w2_weight [E_tot, H, I], their block scales; routed experts 0..E-1, then the shared expert):
no copy, so the plugin can point it at SGLang's own tensors. Each FC1 stage needs the gate/up rows
interleaved by 8 ([g0..7, u0..7, g8..15, u8..15, ...]) so that each wgmma thread holds matching gate
and up values; one 5-D TMA box over the strided view `w13_map_geometry` gathers them in that order.

Workspace per (device, H, I, E_tot, S), grown (outside CUDA-graph capture) to the largest token count
seen or precompiled: slot buffer max_tokens x S x H bf16 (GLM-5, S = 9: 110.6 KB per token, 453 MB at
4096 tokens), FC1 output (pairs x I e4m3 + scales), token lists, task list, counters. Counters are
zero at rest or reset by the plan kernel: CUDA-graph replays need no memset. Launches sharing a
workspace must not run concurrently on two streams.

Diagnostics: `fc1_only` (plan + FC1 tasks only) and `debug_run` (one eager launch with the FC1 output,
the slot buffer, the counters and `out` exposed, poisoned first; optionally without the combine) localise a
wrong result to FC1 / FC2 / combine / scheduling; tests/moe/test_megamoe.py::test_gpu_diag_* use them.

Errors: wrong dtype / shape / device, token count past MAX_TOKENS, a config that does not fit ->
MegaMoEInputError (a ValueError) naming the op and the values; a pre-Hopper GPU -> RuntimeError;
an out-of-range expert id -> a device-side trap with a printf naming the entry.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..jit import KernelSpec, env
from ..ops._device import device_index as _dev_index, require_aligned, require_hopper

log = logging.getLogger(__name__)

OP = "glm5_fastpath.mega_moe"
SOURCE = "moe/megamoe.cu"
PLAN_FUNCTION = "glm5_megamoe_plan"
FUNCTION = "glm5_megamoe"
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16

# Mirrors of csrc/moe/megamoe.cuh constants.
THREADS = 384
MATH_THREADS = 256  # two math warpgroups (megamoe.cuh kMathThreads)
PLAN_THREADS = 1024
LOADER_WARPS = 3  # activation loader warps (kLoaderWarps, the GLM5_MEGAMOE_LOADER_WARPS default)
POOL_COPY_WARPS = LOADER_WARPS + 8  # warps per CTA that copy the token pool (kPoolCopyWarps: loaders + math warps)
TILE_ROWS = 256   # weight rows of an FC1 task (one 128-channel quant group) and of a narrow FC2 task
BK = 128
WIDE_BN = 128     # the wide token block: 128-row wgmma tiles (megamoe.cuh MegaMoE::kWide)
TASK_SLOTS = 4
MAX_EXPERTS = 512
MAX_SLOTS = 16
PAIR_ALIGN = 8
SMEM_LIMIT = 232448  # 227 KB per block on sm_90
FLAG_FC1_ONLY = 1      # plan FC1 tasks only (diagnostics)
FLAG_NO_COMBINE = 2    # FC2 writes slot values only: no combine counters, `out` untouched (diagnostics)
FLAG_END_COMBINE = 4   # MegaMoEConfig.end_combine: the combine as one grid-wide pass after the last task (pool builds)
FLAG_SHARED_ONLY = 8   # the plan lists the shared expert's pairs only and reads no topk_ids (moe/overlap.py)
FLAG_ROUTED_ONLY = 16  # the plan lists the routed pairs only; the combine still sums all S slots (moe/overlap.py)
TASK_END = -1          # end-of-list sentinel (FC2 descriptors are negative int32: never test the sign)
# ctrl[] entries of the workspace (megamoe.cuh Params::ctrl)
CTRL_NUM_TASKS, CTRL_CLAIMS, CTRL_TASKS_DONE, CTRL_TILES_COMBINED = 0, 1, 2, 3
CTRL_POOL_ROWS, CTRL_POOL_DONE = 4, 5  # pool build: pair rows to copy, copy warps done (POOL_COPY_WARPS per CTA)
CTRL_END_DONE = 6     # pool build with end_combine: CTAs done with their tasks (the end combine waits for all)
CTRL_PLAN_STAMPS = 8  # trace build: the plan's start (global timer) and phase stamps (megamoe.cuh kPlanStampBase)
CTRL_WORDS = 32
MAX_BLOCKS = 1 << 14   # 14-bit token-block field of a task
EP_MAX_RANKS = 8       # megamoe.cuh kMaxRanks (the EP build's peer table)
SPLIT_MAX_BN = 16      # split-K FC1 tiles only for token blocks up to this (scratch: 2 x 256 x BN fp32 per tile)
SPLIT_WAVES = 4        # split-K FC1 tiles when the call has at most this many waves of FC1 tiles (default_config: 1 token)

BLOCK_NS = (8, 16, 32, 64, WIDE_BN)
MAX_TOKENS = 4096
GATE_UP_INTERLEAVE = 8


class MegaMoEInputError(ValueError):
    """mega_moe got an input of the wrong dtype / shape / device / size, or an unusable config."""


def _fail(msg: str) -> MegaMoEInputError:
    return MegaMoEInputError(f"{OP}: {msg}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def stage_rows(block_n: int) -> int:
    """Weight rows per pipeline stage / wgmma tile (megamoe.cuh stage_rows): 128 in the wide mode, else 256. Also
    the rows of an FC2 task, so H / stage_rows FC2 tasks per token block and combine counters per token."""
    return 128 if block_n == WIDE_BN else TILE_ROWS


def fc2_tiles(hidden: int, block_n: int) -> int:
    """FC2 row tiles per token block = output tiles combined per token (ctrl[CTRL_TILES_COMBINED] / M)."""
    return hidden // stage_rows(block_n)


# ---- shared-memory layout (mirror of megamoe.cuh Smem<kBN, kStages>) ---------------------------------

def smem_bytes(block_n: int, stages: int, pair: bool = False) -> int:
    """Dynamic shared memory of the persistent kernel (Smem::kAlloc: layout + 1024 B alignment slack); pair: the
    CTA-pair build's exchange buffer, claim mailbox, pair flags and barriers on top."""
    a_stage = block_n * BK
    off = stages * stage_rows(block_n) * BK  # weights
    off += stages * a_stage                 # activations
    off += stages * block_n * 4             # activation scales
    off += block_n * BK                     # FC1 output staging
    off += 8 * block_n * 4                  # amax exchange
    off += block_n * 4                      # combine flags
    off += 2 * TASK_SLOTS * block_n * 4     # per-slot pair codes + routing weights
    off += TASK_SLOTS * 16 + TASK_SLOTS * 4  # per-slot meta + descriptors
    if pair:
        off = _cdiv(off, 16) * 16
        off += MATH_THREADS * block_n * 4    # rank 1's fp32 split-K partial
        off += 2 * TASK_SLOTS * 4            # claim mailbox + pair flags
    off = _cdiv(off, 8) * 8
    off += (2 * stages + 3 * TASK_SLOTS + (2 + 2 * TASK_SLOTS if pair else 0)) * 8  # mbarriers
    return off + 1024


def max_stages(block_n: int, pair: bool = False) -> int:
    """Deepest ring (<= 8) that fits the 227 KB budget for this token block."""
    s = 8
    while s > 2 and smem_bytes(block_n, s, pair) > SMEM_LIMIT:
        s -= 1
    return s


# ---- configuration --------------------------------------------------------------------------------

@dataclass(frozen=True)
class MegaMoEConfig:
    """One kernel variant + schedule knobs for a token bucket.

    block_n:    tokens per task = wgmma N (8, 16, 32, 64, 128); an expert with more pairs gets several token
                blocks, each re-reading its weight tiles (from L2 when claimed back to back). 128 is the wide
                mode: 128-row wgmma tiles, FC1 tasks in two 128-row passes, 128-row FC2 tasks (megamoe.cuh).
    stages:     pipeline depth (32 KB weights (wide: 16 KB) + block_n x 128 B activations per stage).
    group_size: active experts per scheduling group (FC1 of group g+1 is listed before FC2 of group g);
                the default (all experts in one group: every FC1 task before every FC2 task) gave the
                shortest tail in the schedule model (tests/moe: test_schedule_simulation).
    split_waves: when a call has at most split_waves x num_SMs FC1 tiles (small batches), each FC1 tile
                is split in two K halves (finer tail; the second finisher adds the first one's fp32
                partial); only for block_n <= 16, 0 disables.
    lean_fences: the cross-CTA hand-offs without the per-thread fence.gpu (megamoe.cuh, kLeanFences; its own
                cubin, name suffix "_lf"). default_config turns it on: bitwise equal to the fenced build (GPU test,
                40 launches at 1-33 tokens) and 0.5-3 % faster (H200, 2026-11-30: 94.1 vs 96.3-96.9 us at 1 token,
                settings a / b). The dataclass default stays False so that names without "_lf" keep meaning the
                fenced build.
    pool:       the token pool (megamoe.cuh kPool; its own cubin, name suffix "_p"): the kernel first copies every pair's
                token row into an expert-grouped pool, then loads each stage's activations as one TMA box instead of
                block_n x 8 16-byte cp.async gathers.
    diag:       a diagnostic build (megamoe.cuh GLM5_MEGAMOE_DIAG, name suffix "_d<mask>"): 1 no loads, 2 no epilogues,
                4 no folds. Its outputs are meaningless: only `bench moe --configs` timing, to see where the time goes.
    token_major: the wide block with tokens on the wgmma's M side (megamoe.cuh GLM5_MEGAMOE_TOKEN_MAJOR; its own cubin,
                name suffix "_t"; block_n 64 or 128): one FFMA per element in the fold instead of a per-column scale.
    end_combine: (pool builds; a runtime flag, the same cubin; name suffix "_e") FC2 tasks only store their slot values;
                after its last task each CTA counts itself done, and once all have, every math warp of the grid combines
                (token, row tile) items: no per-task combine counters, no last-contributor combine on the math warps'
                path. The same sums in the same order (bitwise equal). Needs the pool build's co-resident grid.
    pair:       CTA pairs (megamoe.cuh kPair; its own cubin, name suffix "_c"; block_n <= 16, not pool / token-major):
                the grid runs as clusters of two CTAs that claim the task list two entries at a time, so a split-K FC1
                tile's two K halves run on one cluster and hand the fp32 partial over through distributed shared memory
                instead of global memory (split_exchange). Bitwise equal to the unpaired build; measured no faster at
                1 token and 5-7 % slower where nothing is split (H200, session 33): opt-in, no default takes it.
    """

    block_n: int
    stages: int
    group_size: int = MAX_EXPERTS
    split_waves: int = SPLIT_WAVES
    lean_fences: bool = False
    pool: bool = False
    diag: int = 0
    token_major: bool = False
    end_combine: bool = False
    pair: bool = False

    def validate(self) -> "MegaMoEConfig":
        if self.block_n not in BLOCK_NS:
            raise _fail(f"config block_n={self.block_n} is not supported (one of {BLOCK_NS})")
        if not 2 <= self.stages <= 8:
            raise _fail(f"config stages={self.stages} must be in 2..8")
        if smem_bytes(self.block_n, self.stages, self.pair) > SMEM_LIMIT:
            raise _fail(f"config block_n={self.block_n}, stages={self.stages}{', pair' if self.pair else ''} needs "
                        f"{smem_bytes(self.block_n, self.stages, self.pair)} B of shared memory > {SMEM_LIMIT} (max "
                        f"stages for this block: {max_stages(self.block_n, self.pair)})")
        if self.group_size < 1:
            raise _fail(f"config group_size={self.group_size} must be >= 1")
        if not 0 <= self.split_waves <= 8:
            raise _fail(f"config split_waves={self.split_waves} must be in 0..8")
        if not 0 <= self.diag <= 7:
            raise _fail(f"config diag={self.diag} must be a mask in 0..7 (1 no loads, 2 no epilogues, 4 no folds)")
        if self.token_major and self.block_n not in (64, WIDE_BN):
            raise _fail(f"config token_major needs block_n 64 or {WIDE_BN}, got {self.block_n}")
        if self.end_combine and not self.pool:
            raise _fail("config end_combine needs the token pool build (pool, name suffix _p): its grid-wide wait needs "
                        "every CTA resident, which only the pool build guarantees")
        if self.pair and (self.block_n > SPLIT_MAX_BN or self.pool or self.token_major):
            raise _fail(f"config pair (CTA pairs, _c) needs block_n <= {SPLIT_MAX_BN} without pool / token_major, got "
                        f"block_n={self.block_n}, pool={self.pool}, token_major={self.token_major}")
        return self

    def split_max_tiles(self, num_sms: int) -> int:
        return self.split_waves * num_sms if self.block_n <= SPLIT_MAX_BN else 0

    @property
    def smem(self) -> int:
        return smem_bytes(self.block_n, self.stages, self.pair)

    def grid(self, num_sms: int) -> int:
        """Persistent CTAs: one per SM; the pair build whole clusters of two."""
        return num_sms - num_sms % 2 if self.pair else num_sms

    def spec(self, hidden: int, inter: int, ep: bool = False) -> KernelSpec:
        """ep: the expert-parallel build of this config (moe/ep/kernel.py; pool builds only). GLM5_FASTPATH_MOE_PLAN_ACTIVE
        is read here (each launch looks its kernels up by this spec, so the variable takes effect at the next launch)."""
        return kernel_spec(hidden, inter, self.block_n, self.stages, self.lean_fences, self.pool, self.diag,
                           self.token_major, ep, self.pair, env.flag("GLM5_FASTPATH_MOE_PLAN_ACTIVE"))

    @property
    def name(self) -> str:
        return (f"bn{self.block_n}_s{self.stages}_g{self.group_size}_w{self.split_waves}" + ("_lf" if self.lean_fences else "")
                + ("_p" if self.pool else "") + ("_t" if self.token_major else "") + ("_e" if self.end_combine else "")
                + ("_c" if self.pair else "") + (f"_d{self.diag}" if self.diag else ""))

    @classmethod
    def from_name(cls, name: str) -> "MegaMoEConfig":
        """Inverse of .name ("bn16_s6_g512_w4[_lf][_p][_t][_e][_c][_d<mask>]"; "bn16" alone = deepest stages,
        defaults for the rest)."""
        m = re.fullmatch(r"bn(\d+)(?:_s(\d+))?(?:_g(\d+))?(?:_w(\d+))?(_lf)?(_p)?(_t)?(_e)?(_c)?(?:_d(\d))?", name)
        if m is None:
            raise _fail(f"config name {name!r} is not bn<N>[_s<stages>][_g<group>][_w<split waves>][_lf][_p][_t][_e]"
                        "[_c][_d<mask>]")
        bn = int(m.group(1))
        if bn not in BLOCK_NS:
            raise _fail(f"config {name!r}: block_n={bn} is not supported (one of {BLOCK_NS})")
        st = int(m.group(2)) if m.group(2) else max_stages(bn, bool(m.group(9)))
        g = int(m.group(3)) if m.group(3) else MAX_EXPERTS
        w = int(m.group(4)) if m.group(4) else 4
        return cls(bn, st, g, w, bool(m.group(5)), bool(m.group(6)), int(m.group(10) or 0), bool(m.group(7)),
                   bool(m.group(8)), bool(m.group(9))).validate()


@functools.lru_cache(maxsize=None)
def kernel_spec(hidden: int, inter: int, block_n: int, stages: int, lean_fences: bool = False,
                pool: bool = False, diag: int = 0, token_major: bool = False, ep: bool = False,
                pair: bool = False, plan_active: bool = False) -> KernelSpec:
    """plan_active: the plan's task phase over a compact list of the active experts (megamoe.cuh
    GLM5_MEGAMOE_PLAN_ACTIVE; single-GPU builds only: ignored with ep). MegaMoEConfig.spec passes
    GLM5_FASTPATH_MOE_PLAN_ACTIVE (this function is cached: it must not read the environment itself)."""
    defines = (("GLM5_MEGAMOE_HIDDEN", str(hidden)), ("GLM5_MEGAMOE_INTER", str(inter)),
               ("GLM5_MEGAMOE_BN", str(block_n)), ("GLM5_MEGAMOE_STAGES", str(stages)))
    if lean_fences:  # absent otherwise: the default build's cache key and cubin are unchanged
        defines += (("GLM5_MEGAMOE_LEAN_FENCES", "1"),)
    if pool:
        defines += (("GLM5_MEGAMOE_POOL", "1"),)
    if diag:
        defines += (("GLM5_MEGAMOE_DIAG", str(diag)),)
    if token_major:
        defines += (("GLM5_MEGAMOE_TOKEN_MAJOR", "1"),)
    if ep:  # the expert-parallel build (moe/ep/kernel.py): pool builds only
        if not pool:
            raise _fail("the EP build (megamoe.cuh kEP) needs the token pool build (pool)")
        defines += (("GLM5_MEGAMOE_EP", "1"),)
    if pair:
        defines += (("GLM5_MEGAMOE_PAIR", "1"),)
    if plan_active and not ep:
        defines += (("GLM5_MEGAMOE_PLAN_ACTIVE", "1"),)  # absent otherwise: the default build's key is unchanged
    return KernelSpec(FUNCTION, source=SOURCE, defines=defines, functions=(FUNCTION, PLAN_FUNCTION))


def expected_max_load(num_tokens: int, num_experts: int, topk: int) -> float:
    """Rough largest routed-expert token count under uniform routing (mean + 3 sigma, binomial)."""
    p = topk / num_experts
    mean = num_tokens * p
    return mean + 3.0 * math.sqrt(max(mean * (1 - p), 0.0)) + 1.0


# expected largest routed expert (expected_max_load, tokens) from which default_config takes the token-major build of
# the 64-token block with the token pool (bn64 + pool + token-major) instead of plain bn64
TOKEN_MAJOR_POOL_MIN_LOAD = 64


def default_config(num_tokens: int, num_experts: int, topk: int, num_shared: int = 1, num_sms: int = 132,
                   inter: int = 2048) -> MegaMoEConfig:
    """Heuristic per token bucket (no tuned table yet).

    Token block: the smallest of 8/16/32/64 that holds the expected largest expert (the shared
    expert holds every token), so each weight tile is streamed from HBM once per call; capped at 64
    (a 256-row x 128-token tile spills, see the .cuh), and at 32 up to 128 tokens when only the shared expert needs more
    (measured faster, see below). Decode is weight-bandwidth bound, so MMA padding is free there. From an expected
    largest routed expert of TOKEN_MAJOR_POOL_MIN_LOAD tokens (setting (a) from ~192 tokens, (b) from ~1536), bn64's
    token-major build with the token pool and the end combine instead (tokens on the wgmma M side: one FFMA per element
    in the fold; one TMA box of activations per stage; one combine pass at the end): measured faster than plain bn64
    and than the wide block (WIDE_BN) there. The pool build needs every CTA of the persistent grid resident at once (its
    grid-wide copy wait; MegaMoEConfig.pool).
    Stages: the deepest ring that fits. Group size: one group (all FC1 tasks first). Split-K FC1 tiles
    (below 4 waves of FC1 tiles) at 1 token only: from 2 tokens whole-K tiles measured as fast or faster (H200,
    2026-11-30, session 10, routed experts, same run: (a) 2 / 4 / 8 / 16 tokens 141.9 / 200.1 / 253.2 / 280.8 us
    whole-K against 142.8 / 203.6 / 258.0 / 294.3 split; (b) 2 / 4: 150.2 / 253.7 against 152.7 / 257.7; at 1 token
    split stays ahead, 81.1 against 84.1). The lean-fences build (MegaMoEConfig.lean_fences: measured bitwise equal and
    0.5-3 % faster).
    """
    if num_tokens < 1:
        raise _fail(f"num_tokens={num_tokens} must be >= 1")
    routed = expected_max_load(num_tokens, num_experts, topk)
    need = max(routed, num_tokens if num_shared else 0)
    narrow = [b for b in BLOCK_NS if b != WIDE_BN]
    bn = next((b for b in narrow if b >= need), narrow[-1])
    if num_tokens <= 128 and routed <= 32:
        # measured (glm5-fastpath tune, H200, 2026-11-29, GLM-5 dims, 256 experts, random routing): at 64 / 128
        # tokens bn32 beats bn64 by 11 % / 9 % (1969 vs 2220 us, 2289 vs 2529 us): only the shared expert needs
        # the bigger block there, its second pass over its weights comes from L2, and twice the token blocks
        # (plus bn32's sixth stage) fill the SMs better. Not when the ROUTED experts need more than 32 (32 local
        # experts, one EP8 rank's shard, ~47 tokens per expert at 128 tokens): then every routed expert would
        # stream twice, and that setting measured 1.53x its floor with bn32 (H200, 2026-11-30, session 6;
        # bn64 there not yet measured). 256 tokens was not measured: it keeps the block that holds every token.
        bn = min(bn, 32)
    if routed >= TOKEN_MAJOR_POOL_MIN_LOAD:
        # measured (H200, 2026-11-30, session 14, same runs, routed experts, ours alone): the narrow token-major build
        # with the token pool (64 tokens on the wgmma M side, each math warpgroup 128 of the 256-row tile on N) took
        # (a) 425 / 636 / 1050 / 2047 / 3903 us at 256 / 512 / 1024 / 2048 / 4096 tokens (expected largest expert
        # 86 / 158 / 299 / 572 / 1108) against plain bn64's 448-457 / 757-780 / 1384-1395 / 2679-2703 / 5174-5193 and the
        # wide token-major pool build's (session 13's default) 486-489 / 749-762 / 1217-1237 / 2237-2259 / 4270-4281;
        # (b) 3418-3439 at 2048 (89) against bn64's 3726-3754, 5002 at 4096 (162) against the wide build's 5852; but
        # 2689-2731 at (b) 1024 (50) against bn64's 2598-2619 and 336 at (a) 128 (48) against 329-331
        # (benchmarks/results/2026-11-30_h200_session14/). With the end combine (one grid-wide combine pass after the
        # last task, same run, c4): (a) 407 / 596 / 1032 / 1917 / 3766 us at 256-4096 against 418-424 / 609-616 /
        # 1072-1078 / 2006-2008 / 3856-3870 (2.5-4.5 % less), (b) 1024 / 4096 4-5 % / 2-4 % less, (b) 2048 1.5-2.8 % more
        return MegaMoEConfig(64, max_stages(64), split_waves=0, lean_fences=True, pool=True, token_major=True,
                             end_combine=True).validate()
    return MegaMoEConfig(bn, max_stages(bn), split_waves=SPLIT_WAVES if num_tokens == 1 else 0,
                         lean_fences=True).validate()


# ---- weights ------------------------------------------------------------------------------------------

def interleave_gate_up(w: torch.Tensor, gran: int = GATE_UP_INTERLEAVE) -> torch.Tensor:
    """[..., 2I, K] gate||up -> rows [g0..g7, u0..u7, g8..g15, u8..u15, ...] (a new contiguous tensor)."""
    *lead, n, k = w.shape
    if n % (2 * gran):
        raise _fail(f"gate||up has {n} rows; need a multiple of {2 * gran}")
    half = n // 2
    gate = w[..., :half, :].reshape(*lead, half // gran, gran, k)
    up = w[..., half:, :].reshape(*lead, half // gran, gran, k)
    return torch.stack([gate, up], dim=-3).reshape(*lead, n, k).contiguous()


def deinterleave_gate_up(w: torch.Tensor, gran: int = GATE_UP_INTERLEAVE) -> torch.Tensor:
    """Inverse of interleave_gate_up."""
    *lead, n, k = w.shape
    pairs = w.reshape(*lead, n // (2 * gran), 2, gran, k)
    return torch.cat([pairs[..., 0, :, :].reshape(*lead, n // 2, k), pairs[..., 1, :, :].reshape(*lead, n // 2, k)],
                     dim=-2).contiguous()


@dataclass
class MegaMoEWeights:
    """Stacked, prepared expert weights: routed experts 0..E-1, then the shared expert (index E).

    w13:       [E_tot, 2I, H] e4m3, gate rows then up rows (checkpoint / SGLang layout)
    w13_scale: [E_tot, 2I/128, H/128] fp32, natural (gate blocks then up blocks) order
    w2:        [E_tot, H, I] e4m3
    w2_scale:  [E_tot, H/128, I/128] fp32
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    num_experts: int  # routed experts E (local experts of this rank)
    num_shared: int   # 0 or 1

    @property
    def num_total(self) -> int:
        return self.num_experts + self.num_shared

    @property
    def hidden(self) -> int:
        return int(self.w13.shape[2])

    @property
    def inter(self) -> int:
        return int(self.w2.shape[2])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w13, self.w13_scale, self.w2, self.w2_scale))


def prepare_weights(w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                    num_shared: int = 1) -> MegaMoEWeights:
    """From stacked checkpoint-layout tensors (SGLang's w13_weight / w2_weight and their scale_inv):
    w13 [E_tot, 2I, H] e4m3 (gate||up), w13_scale [E_tot, 2I/128, H/128] fp32, w2 [E_tot, H, I] e4m3,
    w2_scale [E_tot, H/128, I/128] fp32; the last num_shared experts are shared. No copy when the
    tensors are contiguous (SGLang's are): the kernel reads them in place."""
    op = "prepare_weights"
    for name, t, dt, dim in (("w13", w13, FP8, 3), ("w13_scale", w13_scale, torch.float32, 3),
                             ("w2", w2, FP8, 3), ("w2_scale", w2_scale, torch.float32, 3)):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or t.dim() != dim:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise _fail(f"{op}: {name} must be a {dim}-D {dt} tensor, got {got}")
    E_tot, n13, H = w13.shape
    I = n13 // 2
    if n13 % 256 or H % 256:
        raise _fail(f"{op}: w13 [E, 2I, H] = {list(w13.shape)}: need I % 128 == 0 and H % 256 == 0")
    if tuple(w2.shape) != (E_tot, H, I):
        raise _fail(f"{op}: w2 must be [E, H, I] = {[E_tot, H, I]}, got {list(w2.shape)}")
    if tuple(w13_scale.shape) != (E_tot, n13 // 128, H // 128):
        raise _fail(f"{op}: w13_scale must be {[E_tot, n13 // 128, H // 128]}, got {list(w13_scale.shape)}")
    if tuple(w2_scale.shape) != (E_tot, H // 128, I // 128):
        raise _fail(f"{op}: w2_scale must be {[E_tot, H // 128, I // 128]}, got {list(w2_scale.shape)}")
    if num_shared not in (0, 1) or E_tot - num_shared < 1:
        raise _fail(f"{op}: num_shared={num_shared} must be 0 or 1 with at least one routed expert (E_tot={E_tot})")
    if E_tot > MAX_EXPERTS:
        raise _fail(f"{op}: {E_tot} experts > {MAX_EXPERTS} (9-bit expert field of a task)")
    return MegaMoEWeights(w13.contiguous(), w13_scale.contiguous(), w2.contiguous(), w2_scale.contiguous(),
                          E_tot - num_shared, num_shared)


def w13_map_geometry(num_total: int, inter: int, hidden: int,
                     rows: int = TILE_ROWS) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(sizes, element strides, box) of the strided view of w13 [E_tot, 2I, H] that FC1's TMA loads:
    dims (expert, group of 8 channels, gate|up, channel in group, K). Its box (1, rows / 16, 2, 8, BK) is one
    FC1 stage: rows / 16 groups x (8 gate rows, 8 up rows) x BK columns, in the interleaved order, read straight
    from the gate || up layout: rows = 256 is tile rt (addressed at (k, 0, 0, 16 rt, e), innermost first); rows =
    128 (stage_rows of the wide mode) is pass q of it (at (k, 0, 0, 16 rt + 8 q, e)). Equals interleave_gate_up:
    tests/moe/test_megamoe.py."""
    g = GATE_UP_INTERLEAVE
    sizes = (num_total, inter // g, 2, g, hidden)
    strides = (2 * inter * hidden, g * hidden, inter * hidden, hidden, 1)
    box = (1, rows // (2 * g), 2, g, BK)
    return sizes, strides, box


def _w13_map(w13: torch.Tensor, rows: int = TILE_ROWS):
    from ..jit.tma import tensor_map_strided
    e_tot, n13, h = w13.shape
    sizes, strides, box = w13_map_geometry(int(e_tot), int(n13) // 2, int(h), rows)
    return tensor_map_strided(w13, sizes, strides, box, 128, name="w13")


def _w2_map(w2: torch.Tensor, rows: int = TILE_ROWS):
    from ..jit.tma import tensor_map_2d
    e_tot, h, i = w2.shape
    return tensor_map_2d(w2.view(e_tot * h, i), BK, rows, 128, name="w2")


def _rows_map(t: torch.Tensor, block_n: int, name: str):
    """Activation map of an e4m3 [pair rows, K] tensor (the token pool or the FC1 output): box {BK, block_n} with the
    128B swizzle, so a load at (k, p0) lands a token block's K slice in the layout the wgmma descriptors read."""
    from ..jit.tma import tensor_map_2d
    return tensor_map_2d(t, BK, block_n, 128, name=name)


def prepare_weights_from_experts(experts: Sequence[tuple[Any, Any]], num_shared: int = 1,
                                 device: Any = None) -> MegaMoEWeights:
    """From per-expert (w13: Fp8Linear gate||up [2I, H], w2: Fp8Linear [H, I]) pairs (an ExpertStore or a
    list; routed first, shared last), stacked on `device`."""
    w13 = torch.stack([a.weight.to(device) for a, _ in experts])
    s13 = torch.stack([a.scale_inv.float().to(device) for a, _ in experts])
    w2 = torch.stack([b.weight.to(device) for _, b in experts])
    s2 = torch.stack([b.scale_inv.float().to(device) for _, b in experts])
    return prepare_weights(w13, s13, w2, s2, num_shared)


# ---- workspace ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkspaceShape:
    hidden: int
    inter: int
    num_total: int  # E_tot
    num_slots: int  # S = k + n_shared
    max_tokens: int
    num_sms: int = 132

    @property
    def pairs_cap(self) -> int:
        return _cdiv(self.max_tokens * self.num_slots + PAIR_ALIGN * self.num_total, 8) * 8

    @property
    def blocks_cap(self) -> int:  # the smallest token block (8) gives the most blocks
        return _cdiv(self.max_tokens * self.num_slots, BLOCK_NS[0]) + self.num_total

    @property
    def tasks_cap(self) -> int:  # split FC1 tiles count twice; the wide mode's FC2 tiles are 128 rows
        return self.blocks_cap * (2 * 2 * self.inter // TILE_ROWS + self.hidden // stage_rows(WIDE_BN))

    @property
    def combine_ctrs(self) -> int:  # per token, one per 128 channels (the wide mode's FC2 tiles; narrow ones use half)
        return self.max_tokens * (self.hidden // stage_rows(WIDE_BN))

    @property
    def split_tiles_cap(self) -> int:
        return 8 * self.num_sms  # split_waves <= 8

    @property
    def split_partial_floats(self) -> int:
        return self.split_tiles_cap * 2 * 256 * SPLIT_MAX_BN

    @property
    def nbytes(self) -> int:
        return (self.pairs_cap * self.inter + self.inter // 128 * self.pairs_cap * 4
                + self.max_tokens * self.num_slots * self.hidden * 2 + self.combine_ctrs * 4
                + 4 * (3 * MAX_EXPERTS + self.pairs_cap + self.tasks_cap + 8 + self.blocks_cap)
                + 4 * (self.split_tiles_cap + self.split_partial_floats))  # + the pool build's pool (_ensure_pool)


@dataclass
class Workspace:
    shape: WorkspaceShape
    expert_cnt: torch.Tensor
    expert_off: torch.Tensor
    blk_base: torch.Tensor
    pair_list: torch.Tensor
    tasks: torch.Tensor
    ctrl: torch.Tensor
    fc1_done: torch.Tensor
    combine_ctr: torch.Tensor
    split_ctr: torch.Tensor
    split_partial: torch.Tensor
    act: torch.Tensor
    act_scale: torch.Tensor
    slots: torch.Tensor
    pool: torch.Tensor        # [pairs_cap, H] e4m3, the pool build's token pool (empty until a pool config runs)
    pool_scale: torch.Tensor  # [H/128, pairs_cap] fp32 (idem)


def _alloc_workspace(shape: WorkspaceShape, dev: torch.device) -> Workspace:
    i32 = dict(dtype=torch.int32, device=dev)
    return Workspace(
        shape,
        torch.zeros(MAX_EXPERTS, **i32), torch.zeros(MAX_EXPERTS, **i32), torch.zeros(MAX_EXPERTS, **i32),
        torch.zeros(shape.pairs_cap, **i32), torch.zeros(shape.tasks_cap, **i32), torch.zeros(CTRL_WORDS, **i32),
        torch.zeros(shape.blocks_cap, **i32),
        torch.zeros(shape.combine_ctrs, **i32),                              # zero at rest (self-resetting)
        torch.zeros(shape.split_tiles_cap, **i32),                           # zero at rest (self-resetting)
        torch.empty(shape.split_partial_floats, dtype=torch.float32, device=dev),
        # zeroed once: a pool build's TMA boxes read act rows past a block's live tokens, which must hold valid FP8
        # values (NaN bytes there would only send the epilogues' division fast-path tests to the slow path)
        torch.zeros(shape.pairs_cap, shape.inter, dtype=FP8, device=dev),
        torch.empty(shape.inter // 128, shape.pairs_cap, dtype=torch.float32, device=dev),
        torch.empty(shape.max_tokens, shape.num_slots, shape.hidden, dtype=BF16, device=dev),
        torch.empty(0, shape.hidden, dtype=FP8, device=dev), torch.empty(shape.hidden // 128, 0, dtype=torch.float32, device=dev))


def _ensure_pool(ws: Workspace) -> None:
    """Allocate the token pool of a pool-build launch (pairs_cap x H bytes: ~230 MB at 4096 tokens and 9 slots), once
    per workspace, outside CUDA-graph capture."""
    cap = ws.shape.pairs_cap
    if ws.pool.shape[0] >= cap:
        return
    if _capturing():
        raise RuntimeError(f"{OP}: the token pool of a pool config is not allocated; call glm5_fastpath.moe.precompile("
                           "weights, configs=[...]) (or run the config once eagerly) before CUDA-graph capture")
    with _lock:
        if ws.pool.shape[0] < cap:
            dev = ws.act.device
            ws.pool_scale = torch.zeros(ws.shape.hidden // 128, cap, dtype=torch.float32, device=dev)
            ws.pool = torch.zeros(cap, ws.shape.hidden, dtype=FP8, device=dev)  # (act: why zeroed)


_lock = threading.RLock()
_workspaces: dict[tuple, Workspace] = {}
_kernels: dict[tuple, Any] = {}
_num_sms: dict[int, int] = {}


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - no CUDA
        return False


def _round_tokens(m: int) -> int:
    return min(MAX_TOKENS, max(64, 1 << (max(m, 1) - 1).bit_length()))


_ws_tag: contextvars.ContextVar[str] = contextvars.ContextVar("glm5_megamoe_workspace_tag", default="")


@contextlib.contextmanager
def workspace_tag(tag: str):
    """Launches (and precompile) inside use the workspace of this tag: their own buffers, sized by their own calls.
    The SGLang MoE route runs prefill passes under "prefill", so their 4096-token workspace stays apart from the one
    the decode CUDA graphs captured (sized by the largest decode bucket)."""
    tok = _ws_tag.set(str(tag))
    try:
        yield
    finally:
        _ws_tag.reset(tok)


def current_workspace_tag() -> str:
    """The workspace_tag launches use now ("" outside any)."""
    return _ws_tag.get()


def get_workspace(dev: torch.device, hidden: int, inter: int, num_total: int, num_slots: int,
                  num_tokens: int) -> Workspace:
    """The workspace for these dims on `dev` (and the current workspace_tag), holding at least num_tokens tokens
    (grown outside capture)."""
    key = (_dev_index(dev), hidden, inter, num_total, num_slots, _ws_tag.get())
    ws = _workspaces.get(key)
    if ws is not None and ws.shape.max_tokens >= num_tokens:
        return ws
    with _lock:
        ws = _workspaces.get(key)
        if ws is not None and ws.shape.max_tokens >= num_tokens:
            return ws
        if _capturing():
            have = 0 if ws is None else ws.shape.max_tokens
            raise RuntimeError(f"{OP}: the workspace holds {have} tokens but this call has {num_tokens}; call "
                               f"glm5_fastpath.moe.precompile(weights, max_tokens=...) (or run once eagerly) "
                               "before CUDA-graph capture")
        if ws is not None:
            torch.cuda.synchronize(dev)  # the old buffers may still be in use by queued launches
        shape = WorkspaceShape(hidden, inter, num_total, num_slots, _round_tokens(num_tokens), _sms(dev))
        ws = _workspaces[key] = _alloc_workspace(shape, torch.device("cuda", _dev_index(dev)))
    return ws


def _sms(dev: torch.device) -> int:
    idx = _dev_index(dev)
    n = _num_sms.get(idx)
    if n is None:
        n = _num_sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def _kernels_for(cfg: MegaMoEConfig, hidden: int, inter: int, dev: torch.device) -> tuple[Any, Any]:
    idx = _dev_index(dev)
    spec = cfg.spec(hidden, inter)  # every build field of the config, so the key cannot miss one
    key = (spec, idx)
    k = _kernels.get(key)
    if k is None:
        from ..jit.runtime import get_kernel
        with _lock:
            k = _kernels.get(key)
            if k is None:
                d = torch.device("cuda", idx)
                k = _kernels[key] = (get_kernel(spec, PLAN_FUNCTION, d), get_kernel(spec, FUNCTION, d))
    return k


# ---- kernel parameters (ABI of megamoe.cuh Params) -------------------------------------------------

class _Params(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("x_scale", ctypes.c_void_p), ("topk_ids", ctypes.c_void_p), ("topk_w", ctypes.c_void_p),
        ("w13_scale", ctypes.c_void_p), ("w2_scale", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("expert_cnt", ctypes.c_void_p), ("expert_off", ctypes.c_void_p), ("blk_base", ctypes.c_void_p),
        ("pair_list", ctypes.c_void_p), ("tasks", ctypes.c_void_p), ("ctrl", ctypes.c_void_p),
        ("fc1_done", ctypes.c_void_p), ("combine_ctr", ctypes.c_void_p), ("split_ctr", ctypes.c_void_p),
        ("split_partial", ctypes.c_void_p), ("act", ctypes.c_void_p),
        ("act_scale", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("pool", ctypes.c_void_p), ("pool_scale", ctypes.c_void_p),
        ("num_tokens", ctypes.c_int32), ("topk", ctypes.c_int32), ("num_slots", ctypes.c_int32),
        ("e_local", ctypes.c_int32), ("n_shared", ctypes.c_int32), ("ids_int64", ctypes.c_int32),
        ("group_size", ctypes.c_int32), ("pairs_cap", ctypes.c_int32), ("tasks_cap", ctypes.c_int32),
        ("blocks_cap", ctypes.c_int32), ("split_max_tiles", ctypes.c_int32), ("flags", ctypes.c_int32),
        ("shared_weight", ctypes.c_float), ("routed_scaling", ctypes.c_float),
        # expert parallelism (the EP build, moe/ep/kernel.py; zero for the single-GPU op)
        ("peer", ctypes.c_uint64 * EP_MAX_RANKS),
        ("sym_x", ctypes.c_int64), ("sym_xs", ctypes.c_int64), ("sym_w", ctypes.c_int64), ("sym_ids", ctypes.c_int64),
        ("sym_sig", ctypes.c_int64), ("sym_slots", ctypes.c_int64), ("sym_loc", ctypes.c_int64), ("sym_opool", ctypes.c_int64),
        ("g_ids", ctypes.c_void_p), ("g_w", ctypes.c_void_p), ("pair_weight", ctypes.c_void_p),
        ("rank", ctypes.c_int32), ("world", ctypes.c_int32), ("ep_max_tokens", ctypes.c_int32), ("ep_mode", ctypes.c_int32),
    ]


# 22 pointers + 12 ints + 2 floats = 232, + the EP block: 8 peers + 8 offsets + 3 pointers + 4 ints = 168
PARAMS_BYTES = ctypes.sizeof(_Params)
assert PARAMS_BYTES == 400, PARAMS_BYTES


def _params(x, xs, ids, wts, wt: "_WeightViews", out, ws: Workspace, num_shared: int, rsf: float, group_size: int,
            split_max_tiles: int, flags: int, slots_ws: Workspace | None = None) -> _Params:
    """slots_ws: the workspace whose slot values and combine counters this launch uses (default ws; moe/overlap.py's
    shared-expert launch passes the routed launch's, so one combine sums both)."""
    m, k = ids.shape
    s = ws.shape
    sw = ws if slots_ws is None else slots_ws
    if sw.shape.max_tokens < s.max_tokens or sw.shape.num_slots != s.num_slots or sw.shape.hidden != s.hidden:
        raise _fail("slots_ws must hold the slots of every token of this launch's workspace")
    return _Params(
        x.data_ptr(), xs.data_ptr(), ids.data_ptr(), wts.data_ptr(), wt.w13_scale.data_ptr(), wt.w2_scale.data_ptr(),
        out.data_ptr() if out is not None else None,
        ws.expert_cnt.data_ptr(), ws.expert_off.data_ptr(), ws.blk_base.data_ptr(), ws.pair_list.data_ptr(),
        ws.tasks.data_ptr(), ws.ctrl.data_ptr(), ws.fc1_done.data_ptr(), sw.combine_ctr.data_ptr(),
        ws.split_ctr.data_ptr(), ws.split_partial.data_ptr(), ws.act.data_ptr(), ws.act_scale.data_ptr(), sw.slots.data_ptr(),
        ws.pool.data_ptr(), ws.pool_scale.data_ptr(),
        m, k, k + num_shared, wt.num_total - num_shared, num_shared, int(ids.dtype == torch.int64), group_size,
        s.pairs_cap, s.tasks_cap, min(s.blocks_cap, MAX_BLOCKS), min(split_max_tiles, s.split_tiles_cap), flags,
        1.0 / rsf, float(rsf))  # c_float rounds 1/rsf to fp32 (RNE), as the reference's torch.full(..., 1/rsf)


# ---- validation (real and fake implementation) ---------------------------------------------------------

@dataclass(frozen=True)
class _WeightViews:
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    hidden: int
    inter: int
    num_total: int


def _check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise _fail(f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != dim:
        raise _fail(f"{name} must be {dim}-D, got shape {list(t.shape)}")
    if not t.is_contiguous():
        raise _fail(f"{name} must be contiguous, got strides {t.stride()} for shape {list(t.shape)}")
    return t


def _check_inputs(x, xs, ids, wts, w13, s13, w2, s2, num_shared: int, rsf: float, block_n: int, stages: int,
                  group_size: int, split_waves: int = 0) -> _WeightViews:
    _check_tensor("x (FP8 activations)", x, (FP8,), 2)
    _check_tensor("x_scale", xs, (torch.float32,), 2)
    _check_tensor("topk_ids", ids, (torch.int32, torch.int64), 2)
    _check_tensor("topk_weights", wts, (torch.float32,), 2)
    _check_tensor("w13 (gate||up)", w13, (FP8,), 3)
    _check_tensor("w13_scale", s13, (torch.float32,), 3)
    _check_tensor("w2", w2, (FP8,), 3)
    _check_tensor("w2_scale", s2, (torch.float32,), 3)
    m, h = x.shape
    inter = int(w2.shape[2])
    if h % 256 or h // 256 > 63:
        raise _fail(f"hidden size H={h} must be a multiple of 256 and at most 16128")
    if inter % 128 or inter // 128 > 63 or inter == 0:
        raise _fail(f"intermediate size I={inter} (w2 columns) must be a positive multiple of 128, at most 8064")
    if w13.shape[2] != h or w13.shape[1] != 2 * inter:
        raise _fail(f"w13 must be [E_tot, 2I, H] = [E_tot, {2 * inter}, {h}], got {list(w13.shape)}")
    e_tot = int(w13.shape[0])
    if tuple(w2.shape) != (e_tot, h, inter):
        raise _fail(f"w2 must be [E_tot, H, I] = {[e_tot, h, inter]}, got {list(w2.shape)}")
    if tuple(s13.shape) != (e_tot, 2 * inter // 128, h // 128):
        raise _fail(f"w13_scale must be {[e_tot, 2 * inter // 128, h // 128]}, got {list(s13.shape)}")
    if tuple(s2.shape) != (e_tot, h // 128, inter // 128):
        raise _fail(f"w2_scale must be {[e_tot, h // 128, inter // 128]}, got {list(s2.shape)}")
    if num_shared not in (0, 1) or e_tot - num_shared < 1:
        raise _fail(f"num_shared={num_shared} must be 0 or 1 with at least one routed expert ({e_tot} experts in w13)")
    if e_tot > MAX_EXPERTS:
        raise _fail(f"{e_tot} experts > {MAX_EXPERTS}")
    if tuple(xs.shape) != (m, h // 128):
        raise _fail(f"x_scale must be [M, H/128] = {[m, h // 128]}, got {list(xs.shape)}")
    if ids.shape[0] != m or tuple(wts.shape) != tuple(ids.shape):
        raise _fail(f"topk_ids {list(ids.shape)} and topk_weights {list(wts.shape)} must both be [M={m}, k]")
    k = int(ids.shape[1])
    if k < 1 or k + num_shared > MAX_SLOTS or k > e_tot - num_shared:
        raise _fail(f"top-k={k} must be in 1..min({MAX_SLOTS - num_shared}, routed experts={e_tot - num_shared})")
    if m > MAX_TOKENS:
        raise _fail(f"M={m} tokens exceeds the supported maximum of {MAX_TOKENS}")
    if not (rsf > 0 and math.isfinite(rsf)):
        raise _fail(f"routed_scaling_factor={rsf} must be a positive finite number")
    MegaMoEConfig(block_n, stages, group_size, split_waves).validate()
    if h // stage_rows(block_n) > 63:
        raise _fail(f"hidden size H={h} with block_n={block_n}: at most 63 row tiles of {stage_rows(block_n)} (H <= "
                    f"{63 * stage_rows(block_n)})")
    devs = {t.device for t in (x, xs, ids, wts, w13, s13, w2, s2)}
    if len(devs) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    return _WeightViews(w13, s13, w2, s2, h, inter, e_tot)


# ---- launch ---------------------------------------------------------------------------------------------

_pair_grids: dict[tuple[int, int], int] = {}


def _grid(cfg: MegaMoEConfig, main_k, dev: torch.device) -> int:
    """Persistent CTAs of this launch: one per SM; the pair build as many whole clusters of two as fit at once (a GPC
    with an odd SM count leaves one SM out: a cluster past that would only start once another one exits)."""
    if not cfg.pair:
        return _sms(dev)
    key = (id(main_k), cfg.smem)
    n = _pair_grids.get(key)
    if n is None:
        fit = main_k.max_active_clusters((THREADS, 1, 1), (2, 1, 1), smem=cfg.smem)
        if fit < 1:
            raise _fail(f"config {cfg.name}: no cluster of two CTAs with {cfg.smem} B of shared memory each fits on this "
                        "GPU; use the unpaired build (pair=False)")
        n = _pair_grids[key] = min(cfg.grid(_sms(dev)), 2 * fit)
        if n < cfg.grid(_sms(dev)):
            log.info("megamoe %s: %d clusters of 2 fit at once: grid %d CTAs of %d SMs", cfg.name, fit, n, _sms(dev))
    return n


def _launch(x, xs, ids, wts, wv: _WeightViews, out, num_shared: int, rsf: float, cfg: MegaMoEConfig, flags: int,
            pdl: bool, trace: tuple[torch.Tensor, int] | None = None,
            plan_launch: Callable[[ctypes.Structure], None] | None = None) -> Workspace:
    """Plan + persistent kernel. trace=(rows [CTAs, cap, TRACE_COLS] int64, cap): the trace build instead
    (trace_run). plan_launch: launches whatever plans this call instead of the plan kernel, given the kernel
    Params (moe/routed.py: the router whose last CTA plans); the persistent kernel follows it with PDL."""
    dev = x.device
    require_hopper(OP, dev, _fail)
    require_aligned(_fail, {"x": x, "x_scale": xs, "topk_ids": ids, "topk_weights": wts, "w13": wv.w13,
                            "w13_scale": wv.w13_scale, "w2": wv.w2, "w2_scale": wv.w2_scale})
    m, k = ids.shape
    ws = get_workspace(dev, wv.hidden, wv.inter, wv.num_total, k + num_shared, m)
    if cfg.pool:
        _ensure_pool(ws)
    if trace is None:
        plan_k, main_k = _kernels_for(cfg, wv.hidden, wv.inter, dev)
        extra: list = []
    else:
        from ..jit.runtime import get_kernel
        spec = trace_spec(wv.hidden, wv.inter, cfg.block_n, cfg.stages, cfg.lean_fences, cfg.pool, cfg.diag,
                          cfg.token_major, cfg.pair)
        plan_k, main_k = get_kernel(spec, PLAN_FUNCTION, dev), get_kernel(spec, TRACE_FUNCTION, dev)
        extra = [trace[0], ctypes.c_int32(trace[1])]
    grid = _grid(cfg, main_k, dev)
    env.print_config("mega_moe", {"M": m, "H": wv.hidden, "I": wv.inter, "experts": wv.num_total, "topk": k,
                                  "shared": num_shared},
                     {"config": cfg.name, "smem": cfg.smem, "grid": grid, "threads": THREADS})
    rows = stage_rows(cfg.block_n)
    tm13, tm2 = _w13_map(wv.w13, rows), _w2_map(wv.w2, rows)
    # the activation maps are read by the pool build only; the other builds get the w2 map as a stand-in
    tmpool, tmact = ((_rows_map(ws.pool, cfg.block_n, "pool"), _rows_map(ws.act, cfg.block_n, "act")) if cfg.pool
                     else (tm2, tm2))
    if cfg.end_combine and not flags & (FLAG_FC1_ONLY | FLAG_NO_COMBINE):
        flags |= FLAG_END_COMBINE
    p = _params(x, xs, ids, wts, wv, out, ws, num_shared, rsf, cfg.group_size, cfg.split_max_tiles(_sms(dev)), flags)
    if plan_launch is None:
        plan_k.launch((1, 1, 1), (PLAN_THREADS, 1, 1), [p], pdl=pdl)
    else:
        plan_launch(p)
    main_k.launch((grid, 1, 1), (THREADS, 1, 1), [tm13, tm2, tmpool, tmact, p, *extra],
                  smem=cfg.smem, pdl=True, cluster=(2, 1, 1) if cfg.pair else None)
    return ws


@torch.library.custom_op("glm5_fastpath::mega_moe", mutates_args=())
def _mega_moe(x: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, num_shared: int,
              routed_scaling_factor: float, block_n: int, stages: int, group_size: int, split_waves: int,
              pdl: bool = True, lean_fences: bool = False, pool: bool = False, diag: int = 0,
              token_major: bool = False, end_combine: bool = False, pair: bool = False) -> torch.Tensor:
    # the whole config first: a build the kernel does not support (e.g. token_major on a narrow block) must be a clear
    # error here, not an nvcc static_assert
    cfg = MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), bool(pool), int(diag),
                        bool(token_major), bool(end_combine), bool(pair)).validate()
    wv = _check_inputs(x, x_scale, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, num_shared,
                       routed_scaling_factor, block_n, stages, group_size, split_waves)
    m = x.shape[0]
    out = torch.empty((m, wv.hidden), dtype=BF16, device=x.device)
    if m == 0:
        return out
    _launch(x, x_scale, topk_ids, topk_weights, wv, out, num_shared, routed_scaling_factor, cfg, 0, pdl)
    return out


@_mega_moe.register_fake
def _mega_moe_fake(x, x_scale, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, num_shared, routed_scaling_factor,
                   block_n, stages, group_size, split_waves, pdl=True, lean_fences=False, pool=False, diag=0,
                   token_major=False, end_combine=False, pair=False):
    MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), bool(pool), int(diag),
                  bool(token_major), bool(end_combine), bool(pair)).validate()
    wv = _check_inputs(x, x_scale, topk_ids, topk_weights, w13, w13_scale, w2, w2_scale, num_shared,
                       routed_scaling_factor, block_n, stages, group_size, split_waves)
    return x.new_empty((x.shape[0], wv.hidden), dtype=BF16)


def mega_moe(x_fp8: torch.Tensor, x_scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
             weights: MegaMoEWeights, *, routed_scaling_factor: float = 2.5, config: MegaMoEConfig | None = None,
             pdl: bool = True) -> torch.Tensor:
    """The MoE block on 1x128-quantised tokens: x_fp8 [M, H] e4m3 + x_scale [M, H/128] fp32, routed
    topk_ids [M, k] (int32/int64, ids in [0, E)) and topk_weights [M, k] fp32 (normalised, without
    routed_scaling_factor) -> out [M, H] bf16 = ref.moe.moe_forward's output for the same routing."""
    if not isinstance(weights, MegaMoEWeights):
        raise _fail(f"weights must be a MegaMoEWeights (see prepare_weights), got {type(weights).__name__}")
    if config is None:
        m = int(x_fp8.shape[0]) if isinstance(x_fp8, torch.Tensor) and x_fp8.dim() == 2 else 1
        k = int(topk_ids.shape[1]) if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2 else 1
        config = default_config(max(m, 1), weights.num_experts, max(1, min(k, weights.num_experts)), weights.num_shared,
                                _sms(x_fp8.device) if isinstance(x_fp8, torch.Tensor) and x_fp8.is_cuda else 132,
                                weights.inter)
    return torch.ops.glm5_fastpath.mega_moe(x_fp8, x_scale, topk_ids, topk_weights, weights.w13, weights.w13_scale,
                                            weights.w2, weights.w2_scale, weights.num_shared,
                                            float(routed_scaling_factor), config.block_n, config.stages,
                                            config.group_size, config.split_waves, pdl, config.lean_fences,
                                            config.pool, config.diag, config.token_major, config.end_combine,
                                            config.pair)


# ---- diagnostics ----------------------------------------------------------------------------------------

def _per_pair(ws: Workspace, m: int, S: int, wv: "_WeightViews", device) -> dict[str, torch.Tensor]:
    """The FC1 output rows of the workspace rearranged per pair: a8 [M, S, I], a_scale [M, S, I/128]
    (slot S-1 = the shared expert when there is one), using the kernel's own token lists (pair codes)."""
    cnt = ws.expert_cnt[:wv.num_total].cpu()
    off = ws.expert_off[:wv.num_total].cpu()
    a8 = torch.empty(m, S, wv.inter, dtype=FP8, device=device)
    a_scale = torch.empty(m, S, wv.inter // 128, dtype=torch.float32, device=device)
    a8.view(torch.uint8).fill_(0xFF)  # NaN where no pair lands (a kernel list that misses a pair shows)
    a_scale.fill_(float("nan"))
    for e in range(wv.num_total):
        c, o = int(cnt[e]), int(off[e])
        if c == 0:
            continue
        codes = ws.pair_list[o:o + c].long()
        t, j = codes >> 4, codes & 15
        a8[t, j] = ws.act[o:o + c]
        a_scale[t, j] = ws.act_scale[:, o:o + c].t()
    return {"a8": a8, "a_scale": a_scale, "counts": cnt, "offsets": off}


def fc1_only(x_fp8, x_scale, topk_ids, topk_weights, weights: MegaMoEWeights, *, config: MegaMoEConfig | None = None,
             routed_scaling_factor: float = 2.5) -> dict[str, torch.Tensor]:
    """Run only the plan + FC1 tasks (diagnostics, eager) and return the FC1 output per pair:
    {"a8": [M, S, I] e4m3, "a_scale": [M, S, I/128] fp32, "counts": [E_tot] int32} with slot S-1 the
    shared expert. Pair rows come from the kernel's own token lists (pair codes)."""
    m, k = topk_ids.shape
    cfg = (config or default_config(m, weights.num_experts, k, weights.num_shared)).validate()
    wv = _check_inputs(x_fp8, x_scale, topk_ids, topk_weights, weights.w13, weights.w13_scale, weights.w2,
                       weights.w2_scale, weights.num_shared, routed_scaling_factor, cfg.block_n, cfg.stages,
                       cfg.group_size, cfg.split_waves)
    ws = _launch(x_fp8, x_scale, topk_ids, topk_weights, wv, None, weights.num_shared, routed_scaling_factor, cfg,
                 FLAG_FC1_ONLY, False)
    torch.cuda.synchronize(x_fp8.device)
    got = _per_pair(ws, m, k + weights.num_shared, wv, x_fp8.device)
    return {"a8": got["a8"], "a_scale": got["a_scale"], "counts": got["counts"]}


def debug_run(x_fp8, x_scale, topk_ids, topk_weights, weights: MegaMoEWeights, *,
              config: MegaMoEConfig | None = None, routed_scaling_factor: float = 2.5,
              combine: bool = True) -> dict[str, Any]:
    """One eager launch (plan + persistent kernel) with every intermediate exposed (diagnostics).

    The FC1 output, its scales, the slot buffer and `out` are poisoned (NaN) first, so anything the
    kernel did not write shows as NaN. combine=False sets FLAG_NO_COMBINE: FC2 writes its slot values
    and nothing else (no combine counters, `out` stays NaN). Returns
      out [M, H] bf16, slots [M, S, H] bf16 (routing-weighted FC2 outputs, slot S-1 = shared expert),
      a8 [M, S, I] e4m3 + a_scale [M, S, I/128] fp32 (FC1 output per pair), counts / offsets [E_tot],
      fc1_done [blocks] (each must be I/128), tasks [num_tasks] (the plan's task descriptors, in list order),
      ctrl {num_tasks, claims (the claim counter's final value: one per CTA
      claim, two per cluster claim in the pair build), tasks_done, tiles_combined},
      combine_ctr_sum (must be 0 at rest), grid (CTAs) and the config name.
    """
    from ..testing.numerics import poison_
    m, k = topk_ids.shape
    cfg = (config or default_config(m, weights.num_experts, k, weights.num_shared)).validate()
    wv = _check_inputs(x_fp8, x_scale, topk_ids, topk_weights, weights.w13, weights.w13_scale, weights.w2,
                       weights.w2_scale, weights.num_shared, routed_scaling_factor, cfg.block_n, cfg.stages,
                       cfg.group_size, cfg.split_waves)
    dev = x_fp8.device
    S = k + weights.num_shared
    ws = get_workspace(dev, wv.hidden, wv.inter, wv.num_total, S, m)
    poison_(ws.act), poison_(ws.act_scale), poison_(ws.slots)
    out = poison_(torch.empty((m, wv.hidden), dtype=BF16, device=dev))
    _launch(x_fp8, x_scale, topk_ids, topk_weights, wv, out, weights.num_shared, routed_scaling_factor, cfg,
            0 if combine else FLAG_NO_COMBINE, False)
    torch.cuda.synchronize(dev)
    got = _per_pair(ws, m, S, wv, dev)
    ctrl = [int(v) for v in ws.ctrl.cpu()]
    blocks = sum(_cdiv(int(c), cfg.block_n) for c in got["counts"])
    got.update(out=out, slots=ws.slots[:m].clone(), fc1_done=ws.fc1_done[:blocks].cpu().clone(),
               tasks=ws.tasks[:ctrl[CTRL_NUM_TASKS]].cpu().clone(),
               ctrl={"num_tasks": ctrl[CTRL_NUM_TASKS], "claims": ctrl[CTRL_CLAIMS],
                     "tasks_done": ctrl[CTRL_TASKS_DONE], "tiles_combined": ctrl[CTRL_TILES_COMBINED],
                     "pool_rows": ctrl[CTRL_POOL_ROWS], "pool_done": ctrl[CTRL_POOL_DONE],
                     "end_done": ctrl[CTRL_END_DONE]},
               combine_ctr_sum=int(ws.combine_ctr.abs().sum()),
               grid=_grid(cfg, _kernels_for(cfg, wv.hidden, wv.inter, dev)[1], dev), config=cfg.name)
    return got


# ---- trace build (diagnostics: where the persistent kernel's time goes) ------------------------------------

TRACE_FUNCTION = "glm5_megamoe_trace"
TRACE_COLS = 18  # megamoe.cuh kTraceCols
TRACE_COLUMNS = ("claim_ns", "spin_start_clk", "spin_end_clk", "math_start_clk", "first_stage_clk", "mma_done_clk",
                 "epi_done_clk", "desc", "math_start_ns", "epi_done_ns", "math_stage_wait_clk", "producer_empty_wait_clk",
                 "loader_empty_wait_clk", "epi_amax_or_slots_clk", "epi_quant_or_counters_clk", "fc1_epi_stored_clk",
                 "math_mma_wait_clk", "math_fold_clk")
# (columns 13 / 14: FC1 tasks SwiGLU + amax / quant, FC2 tasks slot stores / combine counters; megamoe.cuh)
DEFAULT_SM_GHZ = 1.98  # H200 boost clock; used only when the trace has no timed task to calibrate against


def trace_spec(hidden: int, inter: int, block_n: int, stages: int, lean_fences: bool = False,
               pool: bool = False, diag: int = 0, token_major: bool = False, pair: bool = False) -> KernelSpec:
    """The trace build: the same kernel with GLM5_MEGAMOE_TRACE=1 (its own cubin) plus glm5_megamoe_trace; the plan's
    active-list task phase under GLM5_FASTPATH_MOE_PLAN_ACTIVE=1 (its stamps then time that build)."""
    base = kernel_spec(hidden, inter, block_n, stages, lean_fences, pool, diag, token_major, pair=pair,
                       plan_active=env.flag("GLM5_FASTPATH_MOE_PLAN_ACTIVE"))
    return KernelSpec(TRACE_FUNCTION, source=SOURCE, defines=tuple(base.defines) + (("GLM5_MEGAMOE_TRACE", "1"),),
                      functions=(TRACE_FUNCTION, PLAN_FUNCTION))


def trace_run(x_fp8, x_scale, topk_ids, topk_weights, weights: MegaMoEWeights, *,
              config: MegaMoEConfig | None = None, routed_scaling_factor: float = 2.5, cap: int = 512
              ) -> dict[str, Any]:
    """One eager launch of the trace build (plan + persistent kernel stamping every claimed task: megamoe.cuh
    TraceBuf) -> {"rows": int64 [CTAs, cap, TRACE_COLS] (TRACE_COLUMNS; 0 = not written),
    "out": [M, H] bf16, "config": name, "summary": summarize_trace(rows)}. Timing in it includes the stamps'
    stores (one per event per CTA): use it for where the time goes, not for how much."""
    m, k = topk_ids.shape
    cfg = (config or default_config(m, weights.num_experts, k, weights.num_shared)).validate()
    wv = _check_inputs(x_fp8, x_scale, topk_ids, topk_weights, weights.w13, weights.w13_scale, weights.w2,
                       weights.w2_scale, weights.num_shared, routed_scaling_factor, cfg.block_n, cfg.stages,
                       cfg.group_size, cfg.split_waves)
    dev = x_fp8.device
    if m == 0:
        return {"rows": torch.zeros((0, cap, TRACE_COLS), dtype=torch.int64), "config": cfg.name,
                "out": torch.empty((0, wv.hidden), dtype=BF16, device=dev), "summary": {"tasks": 0}}
    out = torch.empty((m, wv.hidden), dtype=BF16, device=dev)
    rows = torch.zeros((_sms(dev), cap, TRACE_COLS), dtype=torch.int64, device=dev)
    ws = _launch(x_fp8, x_scale, topk_ids, topk_weights, wv, out, weights.num_shared, routed_scaling_factor, cfg, 0,
                 False, trace=(rows, cap))
    torch.cuda.synchronize(dev)
    r = rows.cpu()
    summary = summarize_trace(r)
    summary["plan"] = plan_phases([int(v) for v in ws.ctrl.cpu()], r, summary.get("sm_ghz", DEFAULT_SM_GHZ))
    return {"rows": r, "out": out, "config": cfg.name, "summary": summary}


# the plan kernel's phases in the trace build (megamoe.cuh plan_body's plan_stamp calls, in order)
PLAN_PHASES = ("zero", "count", "padding", "scan", "group_bases", "segments", "pair_list", "tasks", "stores")


def plan_phases(ctrl: list[int], rows: torch.Tensor, ghz: float) -> dict[str, Any]:
    """The plan kernel's time by phase (us, thread 0's clock64 after each phase's barrier) and its start against the
    persistent kernel's first task claim (global timer, low 32 bits), from a trace-build launch's ctrl words."""
    stamps = ctrl[CTRL_PLAN_STAMPS:CTRL_PLAN_STAMPS + 1 + len(PLAN_PHASES)]
    if len(stamps) < 1 + len(PLAN_PHASES) or stamps[-1] <= 0:
        return {}
    to_us = 1.0 / (ghz * 1e3)
    out: dict[str, Any] = {}
    prev = 0
    for name, c in zip(PLAN_PHASES, stamps[1:]):
        out[f"{name}_us"] = (c - prev) * to_us
        prev = c
    out["body_us"] = prev * to_us
    claims = rows[..., 0][rows[..., 0] > 0]
    if claims.numel():
        first = int(claims.min()) & 0xFFFFFFFF
        out["start_to_first_claim_us"] = ((first - (stamps[0] & 0xFFFFFFFF)) & 0xFFFFFFFF) / 1e3
    return out


@dataclass(frozen=True)
class TraceFrame:
    """Trace rows decoded once (summarize_trace, bench/trace_rows.py): r int64 [CTAs, cap, TRACE_COLS]; done =
    finished task rows; fc2 = the descriptor's FC2 bit; ghz = the SM clock the rows calibrate (cycles / global ns
    over the finished tasks); gap_ns = the math's idle time since the CTA's previous task ended (rows are in claim
    order per CTA; 0 for a CTA's first task)."""

    r: torch.Tensor
    done: torch.Tensor
    fc2: torch.Tensor
    ghz: float
    gap_ns: torch.Tensor

    @property
    def us_per_cycle(self) -> float:
        return 1.0 / (self.ghz * 1e3)


def trace_frame(rows: torch.Tensor) -> TraceFrame:
    r = rows.to(torch.int64)
    done = (r[..., 3] > 0) & (r[..., 6] > 0) & (r[..., 8] > 0) & (r[..., 9] > 0)
    cyc = float((r[..., 6] - r[..., 3])[done].sum())
    ns = float((r[..., 9] - r[..., 8])[done].sum())
    ghz = cyc / ns if ns > 0 and cyc > 0 else DEFAULT_SM_GHZ
    fc2 = ((r[..., 7] >> 31) & 1).bool()  # bit 31 of the descriptor (megamoe.cuh encode_task; sign-extended)
    prev_end = torch.zeros_like(r[..., 9])
    prev_end[:, 1:] = r[:, :-1, 9]
    gaps = torch.where(done & (prev_end > 0), (r[..., 8] - prev_end).clamp_min(0), torch.zeros_like(prev_end))
    return TraceFrame(r, done, fc2, ghz, gaps)


def summarize_trace(rows: torch.Tensor) -> dict[str, Any]:
    """Where the persistent kernel's time went, from trace rows [CTAs, cap, TRACE_COLS] (TRACE_COLUMNS; a task
    row counts when its math start and epilogue end are both written).

    Durations inside a task come from the SM's clock64 (cycles), converted to us with the SM clock the trace
    itself gives (sum of the tasks' cycles / sum of their %globaltimer ns, which averages out the global timer's
    coarse ticks). Per FC1 / FC2 task kind, summed over tasks (us): wait = math start -> first stage landed
    (weights + activations of the first K block), mma = first stage -> last fold, epi = last fold -> epilogue
    done; spin = the loader's fc1_done wait (FC2 only). From the global timer: the kernel span (first claim ->
    last epilogue end), the math warpgroups' busy share of CTAs x span, the tail (last CTA end - median CTA end)."""
    f = trace_frame(rows)
    r, done, fc2, ghz, gaps, to_us = f.r, f.done, f.fc2, f.ghz, f.gap_ns, f.us_per_cycle
    if not bool(done.any()):
        return {"tasks": 0}
    t0 = int(r[..., 0][r[..., 0] > 0].min())
    t1 = int(r[..., 9][done].max())
    span_us = (t1 - t0) / 1e3
    out: dict[str, Any] = {"tasks": int(done.sum()), "ctas": int(r.shape[0]), "span_us": span_us, "sm_ghz": ghz}
    for name, sel in (("fc1", done & ~fc2), ("fc2", done & fc2)):
        d: dict[str, Any] = {"tasks": int(sel.sum())}
        if d["tasks"]:
            first = sel & (r[..., 4] > 0)
            d["wait_us"] = float((r[..., 4] - r[..., 3])[first].sum()) * to_us
            d["mma_us"] = float((r[..., 5] - r[..., 4])[first & (r[..., 5] > 0)].sum()) * to_us
            # inside the MMA loop: the math waiting for stages 1.. (loads behind), and the two loaders waiting for
            # free stages (math behind)
            d["mma_stage_wait_us"] = float(r[..., 10][first & (r[..., 5] > 0)].sum()) * to_us
            if r.shape[-1] > 17:  # the K loop's wgmma waits and fold issue (math thread 0's warpgroup)
                d["mma_wgmma_wait_us"] = float(r[..., 16][first & (r[..., 5] > 0)].sum()) * to_us
                d["mma_fold_us"] = float(r[..., 17][first & (r[..., 5] > 0)].sum()) * to_us
            d["producer_wait_us"] = float(r[..., 11][sel].sum()) * to_us
            d["loader_wait_us"] = float(r[..., 12][sel].sum()) * to_us
            d["epi_us"] = float((r[..., 6] - r[..., 5])[sel & (r[..., 5] > 0)].sum()) * to_us
            if name == "fc1" and r.shape[-1] > 15:  # the FC1 epilogue's phases (tasks that ran it: column 15 set)
                ph = sel & (r[..., 5] > 0) & (r[..., 13] > 0) & (r[..., 14] > 0) & (r[..., 15] > 0)
                d["epi_phase_tasks"] = int(ph.sum())
                d["epi_amax_us"] = float((r[..., 13] - r[..., 5])[ph].sum()) * to_us  # incl. a split-K exchange
                d["epi_quant_us"] = float((r[..., 14] - r[..., 13])[ph].sum()) * to_us
                d["epi_store_us"] = float((r[..., 15] - r[..., 14])[ph].sum()) * to_us
                d["epi_release_us"] = float((r[..., 6] - r[..., 15])[ph].sum()) * to_us
            if name == "fc2" and r.shape[-1] > 14:  # the FC2 epilogue's phases (combining launches: column 14 set)
                ph = sel & (r[..., 5] > 0) & (r[..., 13] > 0) & (r[..., 14] > 0)
                d["epi_phase_tasks"] = int(ph.sum())
                d["epi_slots_us"] = float((r[..., 13] - r[..., 5])[ph].sum()) * to_us
                d["epi_counters_us"] = float((r[..., 14] - r[..., 13])[ph].sum()) * to_us
                d["epi_combine_us"] = float((r[..., 6] - r[..., 14])[ph].sum()) * to_us
            spun = sel & (r[..., 1] > 0) & (r[..., 2] > 0)
            d["spin_us"] = float((r[..., 2] - r[..., 1])[spun].sum()) * to_us
            d["spun_tasks"] = int(spun.sum())
            # global ns: how long each task sat claimed before the math took it (about 0 = the math waited for the
            # scheduler's claim), and the math's idle time since the CTA's previous task ended
            d["claim_lead_us"] = float((r[..., 8] - r[..., 0])[sel].sum()) / 1e3
            d["gap_us"] = float(gaps[sel].sum()) / 1e3
        out[name] = d
    busy = float((r[..., 9] - r[..., 8])[done].sum()) / 1e3
    out["math_busy_share"] = busy / (span_us * r.shape[0]) if span_us > 0 else None
    ends = torch.where(done, r[..., 9], torch.zeros_like(r[..., 9])).max(dim=1).values
    ends = ends[ends > 0].double()
    out["tail_us"] = float(ends.max() - ends.median()) / 1e3 if ends.numel() else None
    return out


def trace_markdown(summary: dict[str, Any]) -> str:
    """One line per task kind: tasks, and wait / mma / epilogue / spin as shares of that kind's math time."""
    if not summary.get("tasks"):
        return "no traced tasks"
    parts = [f"span {summary['span_us']:.1f} us, math busy {100 * (summary.get('math_busy_share') or 0):.0f} % of "
             f"CTAs x span, tail {summary.get('tail_us') or 0:.1f} us"]
    for k in ("fc1", "fc2"):
        d = summary.get(k) or {}
        if d.get("tasks"):
            tot = (d["wait_us"] + d["mma_us"] + d["epi_us"]) or float("inf")  # all-zero: 0 % shares, no ZeroDivision
            parts.append(f"{k.upper()} {d['tasks']} tasks: first-stage wait {100 * d['wait_us'] / tot:.0f} %, "
                         f"MMA {100 * d['mma_us'] / tot:.0f} %, epilogue {100 * d['epi_us'] / tot:.0f} %"
                         + (f" (of which waiting for stages {100 * d['mma_stage_wait_us'] / tot:.0f} %; free-stage waits: "
                            f"weight producer {d['producer_wait_us']:.1f} us, activation loader {d['loader_wait_us']:.1f} us)"
                            if "mma_stage_wait_us" in d else "")
                         + (f", K loop: wgmma waits {100 * d['mma_wgmma_wait_us'] / tot:.0f} %, fold issue "
                            f"{100 * d['mma_fold_us'] / tot:.0f} %" if "mma_fold_us" in d else "")
                         + (f", fc1_done spin {d['spin_us']:.1f} us over {d['spun_tasks']} tasks" if k == "fc2" else "")
                         + (f", epilogue per task: SwiGLU + amax {d['epi_amax_us'] / d['epi_phase_tasks']:.2f} us, quant "
                            f"{d['epi_quant_us'] / d['epi_phase_tasks']:.2f}, a8 stores {d['epi_store_us'] / d['epi_phase_tasks']:.2f}, "
                            f"release {d['epi_release_us'] / d['epi_phase_tasks']:.2f}" if d.get("epi_phase_tasks") and k == "fc1" else "")
                         + (f", epilogue per task: slot stores {d['epi_slots_us'] / d['epi_phase_tasks']:.2f} us, combine "
                            f"counters {d['epi_counters_us'] / d['epi_phase_tasks']:.2f}, combine "
                            f"{d['epi_combine_us'] / d['epi_phase_tasks']:.2f}" if d.get("epi_phase_tasks") and k == "fc2" else "")
                         + (f", math idle between tasks {d['gap_us']:.1f} us, claimed {d['claim_lead_us'] / d['tasks']:.1f} us "
                            "ahead of the math on average" if "gap_us" in d else ""))
    plan = summary.get("plan") or {}
    if plan.get("body_us") is not None:
        parts.append(f"plan body {plan['body_us']:.2f} us ("
                     + ", ".join(f"{n} {plan[n + '_us']:.2f}" for n in PLAN_PHASES if n + "_us" in plan) + ")"
                     + (f", plan start -> first claim {plan['start_to_first_claim_us']:.2f} us"
                        if "start_to_first_claim_us" in plan else ""))
    return "; ".join(parts)


def workspace_for(device: Any, weights: MegaMoEWeights, topk: int) -> Workspace | None:
    """The live workspace of these weights' dims on `device` under the current workspace_tag (tests: counters must be
    zero at rest)."""
    key = (_dev_index(torch.device(device)), weights.hidden, weights.inter, weights.num_total, topk + weights.num_shared,
           _ws_tag.get())
    return _workspaces.get(key)


def precompile(weights: MegaMoEWeights, topk: int = 8, max_tokens: int = 256, device: Any = None,
               configs: Sequence[MegaMoEConfig] | None = None) -> None:
    """Compile/load the kernels of every default config up to max_tokens (or `configs`), allocate the
    workspace for max_tokens tokens and build the weight tensor maps: call before CUDA-graph capture."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if max_tokens > MAX_TOKENS:
        raise _fail(f"max_tokens={max_tokens} exceeds {MAX_TOKENS}")
    if configs is None:
        seen: dict[str, MegaMoEConfig] = {}
        m = 1
        while True:
            c = default_config(m, weights.num_experts, topk, weights.num_shared, _sms(dev), weights.inter)
            seen[c.name] = c
            if m >= max_tokens:
                break
            m = min(max_tokens, m * 2)
        configs = list(seen.values())
    for c in configs:
        _kernels_for(c.validate(), weights.hidden, weights.inter, dev)
    ws = get_workspace(dev, weights.hidden, weights.inter, weights.num_total, topk + weights.num_shared, max_tokens)
    if any(c.pool for c in configs):
        _ensure_pool(ws)
    for rows in sorted({stage_rows(c.block_n) for c in configs}):
        _w13_map(weights.w13, rows)
        _w2_map(weights.w2, rows)


def compile_check_specs() -> list[KernelSpec]:
    """Variants for scripts/compile_check.py: GLM-5 dims with every token block (deepest ring), both fence builds
    (default_config takes the lean one), the small preset (H 512, I 128), three pool builds, three token-major builds
    (bn64 with and without the pool, bn128 with it), three diagnostic builds (all parts off), one trace build and the
    expert-parallel builds (moe/ep/kernel.py: swapAB bn8 and token-major bn64 pool builds)."""
    specs = [kernel_spec(6144, 2048, bn, max_stages(bn), lean_fences=lf) for lf in (True, False) for bn in BLOCK_NS]
    specs += [kernel_spec(512, 128, 16, max_stages(16), lean_fences=lf) for lf in (True, False)]
    specs += [kernel_spec(6144, 2048, bn, max_stages(bn), lean_fences=True, pool=True) for bn in (16, 64, WIDE_BN)]
    specs += [kernel_spec(6144, 2048, bn, max_stages(bn), lean_fences=True, pool=True, token_major=True)
              for bn in (64, WIDE_BN)]
    specs.append(kernel_spec(6144, 2048, 64, max_stages(64), lean_fences=True, token_major=True))
    specs += [kernel_spec(6144, 2048, bn, max_stages(bn), lean_fences=True, diag=7) for bn in (16, 64, WIDE_BN)]
    specs.append(trace_spec(6144, 2048, 64, max_stages(64)))  # the trace build compiles too
    specs += [kernel_spec(6144, 2048, bn, max_stages(bn, True), lean_fences=True, pair=True) for bn in (8, 16)]
    specs.append(kernel_spec(512, 128, 16, max_stages(16, True), lean_fences=True, pair=True))
    # the opt-in active-list plan (GLM5_FASTPATH_MOE_PLAN_ACTIVE), at the decode buckets' token block
    specs.append(kernel_spec(6144, 2048, 8, max_stages(8), lean_fences=True, plan_active=True))
    specs += [kernel_spec(6144, 2048, bn, max_stages(bn), lean_fences=True, pool=True, token_major=tm, ep=True)
              for bn, tm in ((8, False), (64, True))]
    return specs


# ---- CPU mirror of the plan kernel (tests, schedule analysis) -------------------------------------------

@dataclass
class Plan:
    counts: list[int]        # pairs per expert (E_tot)
    offsets: list[int]       # first pair row per expert (8-aligned)
    blk_base: list[int]      # first token-block index per expert
    pairs: dict[int, list[int]]  # expert -> pair codes (t << 4 | j) in token order (the kernel's order may differ)
    tasks: list[int]         # descriptors in claim order
    total_rows: int
    total_blocks: int


def encode_task(fc2: int, e: int, rt: int, b: int, split: int = 0, half: int = 0) -> int:
    v = (fc2 << 31) | (e << 22) | (rt << 16) | (split << 15) | (half << 14) | b
    return v - (1 << 32) if v >= 1 << 31 else v  # as the kernel's int32


def decode_task(d: int) -> tuple[int, int, int, int]:
    """(fc2, expert, row tile, token block); task_split_half gives the split-K fields."""
    u = d & 0xFFFFFFFF
    return u >> 31, (u >> 22) & 511, (u >> 16) & 63, u & 0x3FFF


def task_split_half(d: int) -> tuple[int, int]:
    u = d & 0xFFFFFFFF
    return (u >> 15) & 1, (u >> 14) & 1


def plan_reference(topk_ids: torch.Tensor, num_experts: int, num_shared: int, block_n: int, group_size: int,
                   hidden: int, inter: int, fc1_only: bool = False, split_max_tiles: int = 0) -> Plan:
    """What glm5_megamoe_plan computes, in Python (same rules, pairs listed in token order)."""
    ids = topk_ids.cpu().long()
    m, k = ids.shape
    E = num_experts + num_shared
    pairs: dict[int, list[int]] = {e: [] for e in range(E)}
    for t in range(m):
        if int(ids[t, 0]) < 0:  # padding token (SGLang masks CUDA-graph padding rows with -1): no pairs
            continue
        for j in range(k + num_shared):
            e = int(ids[t, j]) if j < k else num_experts
            if not 0 <= e < num_experts and j < k:
                raise _fail(f"topk_ids[{t}][{j}] = {e} outside [0, {num_experts})")
            pairs[e].append((t << 4) | j)
    order = ([num_experts] if num_shared else []) + list(range(num_experts))
    counts = [len(pairs[e]) for e in range(E)]
    offsets, bb, nblk = [0] * E, [0] * E, [0] * E
    row = blk = 0
    active: list[int] = []
    for e in order:
        c = counts[e]
        offsets[e], bb[e], nblk[e] = row, blk, _cdiv(c, block_n)
        row += _cdiv(c, PAIR_ALIGN) * PAIR_ALIGN
        blk += nblk[e]
        if c:
            active.append(e)
    t1, t2 = 2 * inter // TILE_ROWS, fc2_tiles(hidden, block_n)
    groups = [active[i:i + group_size] for i in range(0, len(active), group_size)]
    split = 2 if blk * t1 <= split_max_tiles else 1

    def f1(g: list[int]) -> list[int]:
        return [encode_task(0, e, (i // split) // nblk[e], (i // split) % nblk[e], split - 1, i % split)
                for e in g for i in range(nblk[e] * t1 * split)]

    def f2(g: list[int]) -> list[int]:
        return [] if fc1_only else [encode_task(1, e, i // nblk[e], i % nblk[e]) for e in g for i in range(nblk[e] * t2)]

    tasks: list[int] = []
    for gi, g in enumerate(groups):
        tasks += f1(g)
        if gi >= 1:
            tasks += f2(groups[gi - 1])
    if groups:
        tasks += f2(groups[-1])
    return Plan(counts, offsets, bb, pairs, tasks, row, blk)
