"""Skinny block-scaled FP8 GEMMs for decode (M <= 256 tokens) with fused epilogues.

Kernels: two mainloops of the same family, one compile-time source each (token block / stages /
epilogue), sharing the split-K finish and every epilogue (SkinnyFinish in fp8_gemm_skinny.cuh):
  impl "mma":   csrc/attn_pre/fp8_gemm_skinny.{cuh,cu}: cp.async ring + mma.sync m16n8k32 e4m3, 256 threads;
  impl "wgmma": csrc/attn_pre/fp8_gemm_wgmma.{cuh,cu}: TMA ring (mbarriers, one producer warp) + wgmma
                m64nNk32 e4m3 from 128B-swizzled smem, 288 threads, token blocks up to 128 (sm_90 only).
Math of every GEMM (spec/glm5_layer.md section 5):

    y[m, n] = sum_g xs[m, g] * S[n // 128, g] * sum_{k in group g} x8[m, k] * W8[n, k]

fp32 accumulation with per-128-K-group promotion; the GEMM output is rounded to bf16 once.

| Python (signature = glm5_fastpath.ref.prefix) | torch.ops.glm5_fastpath | epilogue |
|---|---|---|
| fp8_gemm_skinny(x8, xs, w: Fp8Linear) -> y [M,N] bf16 | fp8_gemm_skinny | bf16(y) |
| b0_qkv_a(x_fp8, x_scale, w, cfg) -> dict | fp8_qkv_a | q_a / kv_a RMSNorm, q_lora 1x128 quant, raw k_pe |
| b0_qkv_a(..., mode="split") | fp8_gemm_skinny + b0_row_norms | plain GEMM, then a row kernel (csrc/attn_pre/b0_row_norms.{cuh,cu}) |
| d0_q_b(q_lora_fp8, q_lora_scale, w, positions, cfg) -> (q_nope, q_pe) | fp8_q_b_rope | RoPE on the trailing rope dims of each head |
| d1_indexer_q(q_lora_fp8, q_lora_scale, w_raw, idx, positions, cfg) -> (q8, s, head_w) | fp8_indexer_q | RoPE leading dims, per-(token, head) quant, head weights |
| b1_indexer_k(x_bf16, x_fp8, x_scale, idx, positions, out_cache_loc, index_k_cache, cfg, gemm="fp8") -> (k8, s) | fp8_indexer_k | LayerNorm, RoPE, quant, index-K cache store (cache mutated) |

D1 / B1 take `rotate=True` (op argument `rotate`): the normalised Walsh-Hadamard rotation of each (token,
head) row after RoPE, before the quant, as SGLang 0.5.14's indexer does (ref.prefix, "Hadamard rotation").
It is a compile-time epilogue option (-DGLM5_SKINNY_ROT=head_dim, part of the JIT cache key; absent when
off, so the unrotated kernels and their cache keys are unchanged): SkinnyConfig.rot, +8448 B of shared
memory (the cross-warp exchange), the ring depth reduced where that no longer fits.

Design (details in the .cuh header): swapAB mma.sync m16n8k32 e4m3 (weight rows on the MMA M side,
tokens on N), 128 weight rows per CTA, a cp.async ring of 16 KB weight stages issued before
griddepcontrol.wait (PDL), split-K with fp32 partials in a workspace and a self-resetting
per-tile arrival counter (the last CTA reduces in split order: deterministic) — no second kernel.
B0's row norms need whole rows: a second per-token-block counter lets the last n tile of a
token block normalise its rows (one warp per token). B0 has a second implementation, mode="split":
the plain GEMM writes bf16 [M, q_lora + kv_lora + rope], then a row kernel (one CTA per token,
launched with PDL, norm weights loaded before griddepcontrol.wait) does the same row epilogue.
mode=None takes GLM5_FASTPATH_B0_MODE when set, else B0_DEFAULT_MODE.

Config (`config_for`): the tuned table (glm5_fastpath/ops/tuned/, measured by benchmarks/fp8_gemm_sweep.py;
each entry names its impl, "mma" when absent) when an entry matches, else a small cost model over
token block and split count with the default impl (wgmma on sm_90, mma elsewhere).
GLM5_FASTPATH_FP8_GEMM_IMPL=mma|wgmma forces the mainloop of every op (table entries of that impl,
else its heuristic); GLM5_FASTPATH_PRINT_CONFIGS prints each choice. The wgmma kernel takes two TMA
tensor maps (glm5_fastpath.jit.tma, cached per pointer and shape) besides the parameter block.

Workspaces: split-K partials and counters live in a per-(device, op, N, K) buffer, zeroed once and
kept zero at rest by the kernel (graph-replay safe). Two launches of the same op with the same
(N, K) must not run concurrently on different streams. RoPE cos/sin come from a per-(device, dim,
theta, max_position_embeddings) fp32 table built with glm5_fastpath.ref.rope.rope_cos_sin (bitwise the
reference's values); positions outside it fall back to the same float64 formula on the device.
Call precompile(cfg=...) before CUDA-graph capture so tables and workspaces exist.

PDL wait point: every entry point takes pdl_wait= ("entry" | "after_prologue" | "after_prefetch";
None = native = after the weight ring fill) and every op pdl_wait_at (GLM5_PDL_WAIT_AT of
csrc/common/pdl.cuh, 2 = native): the kernel's first griddepcontrol.wait moves to its entry or to
after the generic prologue (tile coordinates; wgmma: barrier init + tensor-map prefetch), before any
weight load; a separate cubin, for the CMP benchmark's PDL decomposition. B0 split mode passes it
to both of its kernels.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import FP8_BLOCK, INDEX_K_PAGE_TOKENS, INDEXER_K_NORM_EPS, Glm5Config
from ._device import PDL_WAIT_NATIVE, check_wait_at, pdl_wait_code, wait_defines, weights_hint_defines
from ._device import device_index as _dev_index, require_aligned, require_hopper
from ..jit import KernelSpec, env

SOURCE = "attn_pre/fp8_gemm_skinny.cu"
FUNCTION = "glm5_fp8_gemm_skinny"
WGMMA_SOURCE = "attn_pre/fp8_gemm_wgmma.cu"
WGMMA_FUNCTION = "glm5_fp8_gemm_wgmma"
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
MAX_M = 256
BLOCK_N = 128
THREADS = 256
TOKEN_BLOCKS = (8, 16, 32, 64)
STAGES = {8: 6, 16: 6, 32: 5, 64: 4}  # cp.async ring depth per token block (smem <= ~120 KB)
MAX_SPLITS = 64
WORKSPACE_CAP_BYTES = 32 << 20
SMEM_LIMIT = 227 * 1024  # H100 / H200 max dynamic shared memory per CTA

# The two mainloops of the family (same math, same epilogues, same workspace layout):
#   "mma"    cp.async ring + mma.sync m16n8k32 e4m3 (csrc/attn_pre/fp8_gemm_skinny.cu), 256 threads
#   "wgmma"  TMA ring + wgmma m64nNk32 e4m3 (csrc/attn_pre/fp8_gemm_wgmma.cu), 288 threads: sm_90 only
IMPLS = ("mma", "wgmma")
IMPL_ENV = "GLM5_FASTPATH_FP8_GEMM_IMPL"
PIPE_ENV = "GLM5_FASTPATH_FP8_GEMM_PIPE"
INFLIGHT_ENV = "GLM5_FASTPATH_FP8_GEMM_INFLIGHT"  # env_inflight(): the wgmma ring fill's in-flight cap (experiment)
WGMMA_THREADS = 288
WGMMA_TOKEN_BLOCKS = (8, 16, 32, 64, 128)
WGMMA_IDX_K_TOKEN_BLOCKS = (8, 16, 32, 64)  # B1's LayerNorm epilogue spills at 128 tokens (168-register cap)
WGMMA_STAGES = {8: 10, 16: 10, 32: 8, 64: 6, 128: 5}  # default TMA ring depth (reduced where smem is short)
WGMMA_MAX_STAGES = 16
REDUCES = ("global", "cluster")  # split-K finish; "cluster" = wgmma, 2..MAX_CLUSTER_SPLITS splits
MAX_CLUSTER_SPLITS = 8            # portable cluster size
PIPE_MAX_TM = 64                  # pipe=1 / 2 keep two partials: 3 x tm/2 accumulator registers
PIPES = (0, 1, 2)                 # wgmma consumer: per stage / next stage issued before the promotion / stage pairs

EPI_PLAIN, EPI_QKV_A, EPI_Q_B, EPI_IDX_Q, EPI_IDX_K = 0, 1, 2, 3, 4
ROT_EPIS = (EPI_IDX_Q, EPI_IDX_K)  # epilogues with the Hadamard rotation option
ROT_SIZES = (16, 32, 64, 128)     # rotation length = head dim: whole warps of 16 features, <= one 128-row tile
ROT_SCRATCH_BYTES = 2 * 8 * 66 * 8  # kRotBufBytes of fp8_gemm_skinny.cuh (rotate_rows' double-buffered exchange)
EPI_NAMES = {EPI_PLAIN: "fp8_gemm_skinny", EPI_QKV_A: "b0_qkv_a", EPI_Q_B: "d0_q_b",
             EPI_IDX_Q: "d1_indexer_q", EPI_IDX_K: "b1_indexer_k"}

if FP8_BLOCK != 128 or INDEX_K_PAGE_TOKENS != 64:
    raise ImportError("glm5_fastpath.fp8_gemm: csrc/attn_pre/fp8_gemm_skinny.cuh hard-codes 128-wide FP8 blocks and "
                      f"64-token index-K pages; config says {FP8_BLOCK} / {INDEX_K_PAGE_TOKENS}")


class Fp8GemmInputError(ValueError):
    """An fp8_gemm op got an input of the wrong dtype / shape / device / size."""


def _op_name(epi: int) -> str:
    return f"glm5_fastpath.{EPI_NAMES[epi]}"


def _fail(epi: int, msg: str) -> Fp8GemmInputError:
    return Fp8GemmInputError(f"{_op_name(epi)}: {msg}")


def token_blocks(impl: str, epi: int = EPI_PLAIN) -> tuple[int, ...]:
    """Token blocks (tokens per CTA) the `impl` mainloop supports with epilogue `epi`."""
    if impl == "mma":
        return TOKEN_BLOCKS
    return WGMMA_IDX_K_TOKEN_BLOCKS if epi == EPI_IDX_K else WGMMA_TOKEN_BLOCKS


ROPE_PAIRS_MAX = 32        # kRopePairsMax: rope_dim <= 64 (the epilogues stage (cos, sin) per token and pair)
HEADS_PER_TILE_MAX = 8     # kHeadsPerTileMax: head_dim >= 16


def scratch_bytes(tm: int, epi: int = EPI_PLAIN, rot: int = 0) -> int:
    """finish_scratch_bytes(tm, epi_with_rot(epi, rot)) of csrc/attn_pre/fp8_gemm_skinny.cuh (keep in sync):
    cross-warp reduction buffers + flag, the epilogue inputs staged during the K loop (RoPE (cos, sin),
    positions, B1 slots, D1 w_raw), and the rotation option's exchange buffer."""
    b = 3 * 8 * tm * 4 + 16 + (ROT_SCRATCH_BYTES if rot else 0)
    if epi in (EPI_Q_B, EPI_IDX_Q, EPI_IDX_K):
        b += tm * ROPE_PAIRS_MAX * 8 + tm * 8
    if epi == EPI_IDX_K:
        b += tm * 8
    if epi == EPI_IDX_Q:
        b += tm * HEADS_PER_TILE_MAX * 4
    return b


def wgmma_smem_bytes(tm: int, stages: int, gmax: int, epi: int = EPI_PLAIN, rot: int = 0) -> int:
    """WgmmaSmem<tm, stages, epi_with_rot(epi, rot)>::launch_bytes(gmax) of csrc/attn_pre/fp8_gemm_wgmma.cuh
    (keep in sync)."""
    off_bar = stages * 128 * 128 + stages * tm * 128
    off_ws = off_bar + 16 * stages + scratch_bytes(tm, epi, rot)
    off_xs = off_ws + (gmax * 4 + 15) // 16 * 16
    return off_xs + gmax * tm * 4 + 1024


def wgmma_stages(tm: int, gmax: int, want: int | None = None, epi: int = EPI_PLAIN, rot: int = 0) -> int:
    """The deepest ring <= `want` (default WGMMA_STAGES[tm]) that fits in SMEM_LIMIT for gmax K groups."""
    s = WGMMA_STAGES[tm] if want is None else want
    while s > 2 and wgmma_smem_bytes(tm, s, gmax, epi, rot) > SMEM_LIMIT:
        s -= 1
    return s


# ---- configuration --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SkinnyConfig:
    """One launch: mainloop impl, token block tm, K splits, ring depth; grid = (tiles_n, splits, tiles_m)."""

    epi: int
    m: int
    n: int
    k: int
    tm: int
    splits: int
    stages: int
    minb: int = 1   # __launch_bounds__ min CTAs per SM (tuning knob; 1 = production)
    diag: int = 0   # diagnostic kernel variant (benchmarks only; 0 = the real kernel)
    impl: str = "mma"  # "mma" | "wgmma"
    pipe: int = 0   # wgmma consumer: 0 = wait each stage's wgmmas before promoting; 1 = two partials,
                    # stage s+1's wgmmas issued before stage s is waited for and promoted; 2 = stage pairs in
                    # flight together, one wait per pair (all bitwise the same result)
    reduce: str = "global"  # split-K: "global" (workspace + counter) | "cluster" (wgmma, splits 2..8: DSMEM)
    rot: int = 0    # Walsh-Hadamard rotation option of D1 / B1 (0: none, else the head dim; see `rotated`)
    persist: int = 0  # persistent launch (wgmma, global reduce): this many CTAs take the (n tile, split, token
                      # block) units round-robin through one continuous TMA ring; 0 = one CTA per unit
    phases: int = 0   # diagnostic build recording per-CTA phase times (GLM5_SKINNY_PHASES; phase_build / read_phases)
    wkb: int = 0      # 1: the weight is k-block-major [K / 128, N, 128] (kblock_major; wgmma only, GLM5_SKINNY_WKB)

    @property
    def groups(self) -> int:
        return self.k // 128

    @property
    def gmax(self) -> int:
        return -(-self.groups // self.splits)

    @property
    def tiles_n(self) -> int:
        return -(-self.n // BLOCK_N)

    @property
    def tiles_m(self) -> int:
        return -(-self.m // self.tm)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.persist, 1, 1) if self.persist else (self.tiles_n, self.splits, self.tiles_m)

    @property
    def units(self) -> int:
        """(n tile, K split, token block) work units: one CTA each, or dealt over `persist` CTAs."""
        return self.tiles_n * self.splits * self.tiles_m

    @property
    def ctas(self) -> int:
        return self.persist or self.units

    @property
    def threads(self) -> int:
        return WGMMA_THREADS if self.impl == "wgmma" else THREADS

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of the launch: SkinnySmem<tm, stages>::bytes(gmax) (mma) or
        WgmmaSmem<tm, stages>::launch_bytes(gmax) (wgmma) of the .cuh files (keep in sync)."""
        if self.impl == "wgmma":
            return wgmma_smem_bytes(self.tm, self.stages, self.gmax, self.epi, self.rot)
        off_red = self.stages * 128 * 128 + self.stages * self.tm * 128
        off_ws = off_red + scratch_bytes(self.tm, self.epi, self.rot)
        off_xs = off_ws + (self.gmax * 4 + 15) // 16 * 16
        return off_xs + self.gmax * self.tm * 4

    @property
    def partial_floats(self) -> int:
        if self.splits == 1 or self.reduce == "cluster":
            return 0
        return self.tiles_n * self.tiles_m * self.splits * BLOCK_N * self.tm

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """Cluster dims of the launch: the splits CTAs of one (n tile, token block) in cluster mode."""
        return (1, self.splits, 1) if self.reduce == "cluster" and self.splits > 1 else None

    @property
    def counter_ints(self) -> int:
        return self.tiles_n * self.tiles_m + self.tiles_m

    def spec(self, wait_at: int = PDL_WAIT_NATIVE) -> KernelSpec:
        return kernel_spec(self.tm, self.stages, self.epi, self.minb, self.diag, self.impl, self.pipe,
                           self.reduce if self.splits > 1 else "global", wait_at, self.rot, bool(self.persist),
                           bool(self.phases), bool(self.wkb), weights_hint_defines(self.m))

    def describe(self) -> dict[str, Any]:
        d = {"impl": self.impl, "tm": self.tm, "splits": self.splits, "stages": self.stages, "minb": self.minb,
             "pipe": self.pipe, "reduce": self.reduce,
             "diag": self.diag, "grid": self.grid, "threads": self.threads,
             "ctas": self.ctas, "smem": self.smem_bytes, "k_per_cta": self.k // self.splits,
             "est_us": round(estimate_us(self), 2)}
        if self.rot:
            d["rot"] = self.rot
        if self.persist:
            d["persist"] = self.persist
            d["units"] = self.units
        if self.wkb:
            d["wkb"] = 1
        return d


DIAG_OFF, DIAG_LOADS_ONLY, DIAG_NO_REDUCE, DIAG_NO_LOADS = 0, 1, 2, 3  # kDiag* of the .cuh (benchmarks only)


@functools.lru_cache(maxsize=None)
def kernel_spec(tm: int, stages: int, epi: int, minb: int = 1, diag: int = 0, impl: str = "mma", pipe: int = 0,
                reduce: str = "global", wait_at: int = PDL_WAIT_NATIVE, rot: int = 0, persist: bool = False,
                phases: bool = False, wkb: bool = False, hints: tuple[tuple[str, str], ...] = ()) -> KernelSpec:
    """`hints`: _device.weights_hint_defines(m) (evict-first weights at small M), appended as they are."""
    if impl not in IMPLS:
        raise ValueError(f"glm5_fastpath.fp8_gemm: impl={impl!r}: expected one of {', '.join(IMPLS)}")
    if reduce not in REDUCES or pipe not in PIPES:
        raise ValueError(f"glm5_fastpath.fp8_gemm: {reduce=} (one of {REDUCES}) / {pipe=} (one of {PIPES})")
    if impl != "wgmma" and (pipe or reduce != "global"):
        raise ValueError(f"glm5_fastpath.fp8_gemm: pipe={pipe} / reduce={reduce!r} exist for impl 'wgmma' only")
    if pipe and tm > PIPE_MAX_TM:
        raise ValueError(f"glm5_fastpath.fp8_gemm: pipe={pipe} needs tm <= {PIPE_MAX_TM} (two partials), got {tm}")
    if rot and (epi not in ROT_EPIS or rot not in ROT_SIZES or diag):
        raise ValueError(f"glm5_fastpath.fp8_gemm: rot={rot} exists for the D1 / B1 epilogues only, with a length in "
                         f"{ROT_SIZES} (got epi={epi}, diag={diag})")
    if persist and (impl != "wgmma" or reduce != "global" or diag):
        raise ValueError(f"glm5_fastpath.fp8_gemm: persist exists for impl 'wgmma' with the global split-K reduce and no "
                         f"diagnostic variant (got {impl=}, {reduce=}, {diag=})")
    defines = [("GLM5_SKINNY_TM", str(tm)), ("GLM5_SKINNY_STAGES", str(stages)), ("GLM5_SKINNY_EPI", str(epi))]
    if rot:  # absent when off: the unrotated kernels' cache keys do not change
        defines.append(("GLM5_SKINNY_ROT", str(rot)))
    if minb != 1:  # defaults stay out of the defines: the production cache keys do not change
        defines.append(("GLM5_SKINNY_MINB", str(minb)))
    if diag != 0:
        defines.append(("GLM5_SKINNY_DIAG", str(diag)))
    if pipe:
        defines.append(("GLM5_SKINNY_PIPE", str(pipe)))
    if reduce == "cluster":
        defines.append(("GLM5_SKINNY_REDUCE", "1"))
    if persist:
        defines.append(("GLM5_SKINNY_PERSIST", "1"))
    if phases:
        if impl != "wgmma" or persist:
            raise ValueError("glm5_fastpath.fp8_gemm: phase marks exist for the wgmma mainloop with one CTA per unit")
        defines.append(("GLM5_SKINNY_PHASES", "1"))
    if wkb:
        if impl != "wgmma":
            raise ValueError("glm5_fastpath.fp8_gemm: k-block-major weights (wkb) exist for the wgmma mainloop only")
        defines.append(("GLM5_SKINNY_WKB", "1"))
    defines += wait_defines(check_wait_at("glm5_fastpath.fp8_gemm", wait_at))
    defines += hints
    inflight = env_inflight(stages) if impl == "wgmma" and not persist else 0
    if inflight:  # absent when off: the production cache keys do not change
        defines.append(("GLM5_SKINNY_INFLIGHT", str(inflight)))
    if impl == "wgmma":
        return KernelSpec(WGMMA_FUNCTION, source=WGMMA_SOURCE, defines=tuple(defines))
    return KernelSpec(FUNCTION, source=SOURCE, defines=tuple(defines))


# Cost model constants (H200). Rough on purpose: they only rank candidates.
_HBM_BW = 4.27e12          # B/s, whole chip
_L2_BW = 9.0e12            # B/s, whole chip, re-reads of weights by other token blocks
_LATENCY_S = 0.8e-6        # HBM round trip under load
_SM_L2_BW = 150e9          # B/s one SM reading from L2 (split-K reduction, row epilogue)
_SM_MAX_BW = 45e9          # B/s one SM streaming from HBM at best (its load queue, not the chip, limits it)
_MMA_FLOPS_PER_SM = 7.0e12  # mma.sync e4m3 per SM (about half the wgmma peak)
_FIXED_S = 1.5e-6          # launch, prologue, epilogue latency chain
_SPLIT_FIXED_S = 0.4e-6    # fence + atomic + dependent L2 round trip of a split-K finish
# wgmma mainloop (not yet measured: the sweep's table replaces these guesses where it has entries)
_TMA_LATENCY_S = 1.0e-6    # TMA box round trip under load
_TMA_SM_MAX_BW = 40e9      # B/s one SM streaming TMA boxes (conservative: grids fill the chip)
_WGMMA_FLOPS_PER_SM = 8.0e12  # wgmma e4m3 per SM with the un-overlapped per-stage promotion
_WG_FIXED_S = 1.3e-6


def estimate_us(c: SkinnyConfig, num_sms: int = 132) -> float:
    """Rough time of one launch in microseconds (for ranking configs, not a prediction)."""
    # persistent: every CTA streams ceil(units / persist) units back to back through one ring (one ramp-up);
    # otherwise the units run in waves of one CTA per SM, each new CTA refilling its ring from empty.
    waves = -(-c.units // c.persist) if c.persist else -(-c.ctas // num_sms)
    k_cta = c.k / c.splits
    w_cta = BLOCK_N * k_cta  # from HBM (first token block) or L2
    x_cta = c.tm * k_cta     # activations: always L2 hits, but they occupy the SM's load path too
    wg = c.impl == "wgmma"
    if wg:  # every stage of the TMA ring is in flight; the issuing thread is never the limit
        inflight = c.stages * BLOCK_N * 128
        per_sm_bw = min(inflight / _TMA_LATENCY_S, _TMA_SM_MAX_BW, _HBM_BW / min(c.ctas, num_sms))
    else:
        inflight = (c.stages - 1) * BLOCK_N * 128
        per_sm_bw = min(inflight / _LATENCY_S, _SM_MAX_BW, _HBM_BW / min(c.ctas, num_sms))
    t_stream = max(c.n * c.k / _HBM_BW, waves * (w_cta / per_sm_bw + x_cta / _SM_L2_BW))
    t_l2 = (c.tiles_m - 1) * c.n * c.k / _L2_BW
    t_mma = waves * 2.0 * BLOCK_N * c.tm * k_cta / (_WGMMA_FLOPS_PER_SM if wg else _MMA_FLOPS_PER_SM)
    t = max(t_stream + t_l2, t_mma) + (_WG_FIXED_S if wg else _FIXED_S)
    if c.splits > 1:
        t += _SPLIT_FIXED_S + c.splits * BLOCK_N * c.tm * 4 / _SM_L2_BW
    if c.epi == EPI_QKV_A:  # the last n tile of a token block normalises kTM rows (read + write)
        t += _SPLIT_FIXED_S + min(c.m, c.tm) * c.n * 2 * 2 / (_SM_L2_BW * min(8, max(1, min(c.m, c.tm))) / 2)
    return t * 1e6


_configs: dict[tuple, SkinnyConfig] = {}
_config_lock = threading.Lock()

# Benchmark / tuning hook (never set in production): when not None, every op launched by this
# thread uses this (tm, splits, stages, minb, diag, impl) instead of config_for's choice. Set it
# with `forced_config(...)`; the public op signatures do not change.
_forced = threading.local()


class forced_config:
    """Context manager: ops launched inside use mainloop `impl`, token block tm, `splits` K splits,
    `stages` ring stages, launch-bounds min CTAs/SM `minb` and diagnostic variant `diag` (DIAG_*;
    plain op only). For benchmarks/fp8_gemm_sweep.py. Validated at launch (splits <= K/128, smem
    <= 227 KB, the token block / epilogue combination exists)."""

    def __init__(self, tm: int, splits: int, stages: int, minb: int = 1, diag: int = 0, impl: str = "mma",
                 pipe: int = 0, reduce: str = "global", persist: int = 0):
        max_stages = WGMMA_MAX_STAGES if impl == "wgmma" else 8
        if (impl not in IMPLS or tm not in token_blocks(impl) or not 2 <= stages <= max_stages or splits < 1
                or minb not in (1, 2) or diag not in (0, 1, 2, 3) or pipe not in PIPES or reduce not in REDUCES
                or (impl != "wgmma" and (pipe or reduce != "global")) or (pipe and tm > PIPE_MAX_TM)
                or (reduce == "cluster" and (splits > MAX_CLUSTER_SPLITS or diag))
                or persist < 0 or (persist and (impl != "wgmma" or reduce != "global" or diag))):
            raise ValueError(f"forced_config: bad {impl=} {tm=} {splits=} {stages=} {minb=} {diag=} {pipe=} {reduce=} "
                             f"{persist=}")
        self.knobs = (tm, splits, stages, minb, diag, impl, pipe, reduce, persist)

    def __enter__(self) -> "forced_config":
        self._prev = getattr(_forced, "knobs", None)
        _forced.knobs = self.knobs
        return self

    def __exit__(self, *exc: object) -> None:
        _forced.knobs = self._prev


_cap = threading.local()


class grid_cap:
    """Context manager: GEMM ops launched by this thread inside run as a persistent launch on at most
    `ctas` CTAs when their chosen config has more work units than that (the other SMs stay free for a
    concurrent branch: the CMP executor's `cap:OP=N` modes). Needs the wgmma mainloop with the global
    split-K reduce (or no split); any other config raises, naming the op."""

    def __init__(self, ctas: int):
        if not isinstance(ctas, int) or ctas < 1:
            raise ValueError(f"grid_cap: ctas must be a positive int, got {ctas!r}")
        self.ctas = ctas

    def __enter__(self) -> "grid_cap":
        self._prev = getattr(_cap, "ctas", None)
        _cap.ctas = self.ctas
        return self

    def __exit__(self, *exc: object) -> None:
        _cap.ctas = self._prev


class stage_cap:
    """Context manager: GEMM ops launched by this thread inside use at most `stages` ring stages (>= 2), so
    their CTAs take less shared memory and a concurrent branch's CTAs fit beside them on an SM (the CMP
    executor's `stages:OP=N` modes). The K loop and the result are unchanged (bitwise)."""

    def __init__(self, stages: int):
        if not isinstance(stages, int) or stages < 2:
            raise ValueError(f"stage_cap: stages must be an int >= 2, got {stages!r}")
        self.stages = stages

    def __enter__(self) -> "stage_cap":
        self._prev = getattr(_cap, "stages", None)
        _cap.stages = self.stages
        return self

    def __exit__(self, *exc: object) -> None:
        _cap.stages = self._prev


class phase_build:
    """Context manager (diagnostics): wgmma GEMM ops launched by this thread inside run the GLM5_SKINNY_PHASES
    build, whose thread 0 of every CTA records %globaltimer at the phase marks of fp8_gemm_wgmma.cu; read them
    with read_phases(cfg, device) after the launch. Same results as the normal build."""

    def __enter__(self) -> "phase_build":
        self._prev = getattr(_cap, "phases", None)
        _cap.phases = True
        return self

    def __exit__(self, *exc: object) -> None:
        _cap.phases = self._prev


PHASE_NAMES = ("entry", "past_wait", "first_stage", "k_loop_done", "finish_done", "epilogue_done")
MAX_PHASE_CTAS = 2048  # kMaxPhaseCtas of fp8_gemm_wgmma.cu


def _phase_module(cfg: SkinnyConfig, device, wait_at: int):
    """The loaded module of cfg's phase build on `device` (its skinny_phase_ns array)."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    return _kernel(dataclasses.replace(cfg, phases=1), dev, wait_at).module, dev


def read_phases(cfg: SkinnyConfig, device=None, wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    """[min(ctas, MAX_PHASE_CTAS), 8] int64 of the phase build of `cfg` (its last launch on `device`): columns
    PHASE_NAMES in ns of %globaltimer (0 where a CTA did not reach a mark in that launch, e.g. the epilogue of a
    split that another CTA finished: zero the buffer with reset_phases first), column 7 the SM id."""
    mod, dev = _phase_module(cfg, device, wait_at)
    out = torch.zeros(min(cfg.ctas, MAX_PHASE_CTAS), 8, dtype=torch.int64, device=dev)
    mod.copy_global("skinny_phase_ns", out)
    return out


def reset_phases(cfg: SkinnyConfig, device=None, wait_at: int = PDL_WAIT_NATIVE) -> None:
    """Zero the phase build's buffer (before the launch read_phases will read)."""
    _phase_module(cfg, device, wait_at)[0].copy_global("skinny_phase_ns")


def _apply_launch_overrides(epi: int, c: SkinnyConfig) -> SkinnyConfig:
    """c with this thread's launch overrides: phase_build, stage_cap, grid_cap (in that order)."""
    if getattr(_cap, "phases", None) and c.impl == "wgmma" and not c.persist:
        c = dataclasses.replace(c, phases=1)
    st = getattr(_cap, "stages", None)
    if st is not None and c.stages > st:
        c = dataclasses.replace(c, stages=st)
    cap = getattr(_cap, "ctas", None)
    if cap is None or c.ctas <= cap:
        return c
    if c.impl != "wgmma" or (c.splits > 1 and c.reduce != "global") or c.diag:
        raise _fail(epi, f"grid_cap({cap}): the chosen config ({c.impl}, {c.splits} splits, reduce {c.reduce!r}) has "
                         "no persistent launch (wgmma with the global split-K reduce only)")
    return dataclasses.replace(c, persist=min(cap, c.units))


def _forced_config_for(m: int, n: int, k: int, epi: int) -> SkinnyConfig | None:
    knobs = getattr(_forced, "knobs", None)
    if knobs is None:
        return None
    tm, splits, stages, minb, diag, impl, pipe, reduce, persist = knobs
    if diag and epi != EPI_PLAIN:
        raise _fail(epi, "forced_config: diagnostic variants exist for the plain GEMM only")
    if splits > k // 128:
        raise _fail(epi, f"forced_config: {splits=} > K/128 = {k // 128}")
    if tm not in token_blocks(impl, epi):
        raise _fail(epi, f"forced_config: token block {tm} is not available for impl {impl!r} with this epilogue "
                         f"({token_blocks(impl, epi)})")
    c = SkinnyConfig(epi, m, n, k, tm, splits, stages, minb, diag, impl, pipe, reduce)
    if persist:  # never more CTAs than units
        c = dataclasses.replace(c, persist=min(persist, c.units))
    if c.smem_bytes > SMEM_LIMIT:
        raise _fail(epi, f"forced_config: {c.smem_bytes} B of shared memory > 227 KB")
    return c


# ---- implementation choice ----------------------------------------------------------------------------

def wgmma_supported(cc: tuple[int, int]) -> bool:
    """wgmma / sm_90a features: Hopper (9.0) only (Blackwell has no wgmma)."""
    return tuple(cc) == (9, 0)


def default_impl(cc: tuple[int, int] = (9, 0)) -> str:
    """The mainloop used when neither the tuned table nor GLM5_FASTPATH_FP8_GEMM_IMPL decides."""
    return "wgmma" if wgmma_supported(cc) else "mma"


def env_impl(epi: int = EPI_PLAIN) -> str | None:
    """GLM5_FASTPATH_FP8_GEMM_IMPL (read now): "mma" / "wgmma" forces every FP8 GEMM op's mainloop;
    unset / empty = None (table, then default). Anything else raises Fp8GemmInputError."""
    raw = env.text(IMPL_ENV)
    if raw is None:
        return None
    v = raw.lower()
    if v not in IMPLS:
        raise _fail(epi, f"{IMPL_ENV}={raw!r}: expected one of {', '.join(IMPLS)}")
    return v


# Measured best configs (benchmarks/fp8_gemm_sweep.py), per arch and SM count; the heuristic below
# covers every shape / M the table does not (and other GPUs). Entries: the smallest m_max >= M wins;
# an entry's "impl" is "mma" when absent (tables written before the wgmma mainloop existed).
TUNED_TABLE = Path(__file__).with_name("tuned") / "fp8_gemm_sm90_132sm.json"


@functools.lru_cache(maxsize=None)
def _tuned_entries(num_sms: int) -> dict[tuple[str, int, int], list[dict]]:
    try:
        table = json.loads(TUNED_TABLE.read_text())
    except FileNotFoundError:
        return {}
    if table.get("num_sms") != num_sms:
        return {}
    out: dict[tuple[str, int, int], list[dict]] = {}
    for e in table["entries"]:
        e = dict(e)
        e.setdefault("impl", "mma")
        e.setdefault("minb", 1)
        e.setdefault("pipe", 0)
        e.setdefault("reduce", "global")  # tables written before the cluster reduce existed
        e.setdefault("persist", 0)        # ... and before the persistent launch
        if e["persist"] and (e["impl"] != "wgmma" or e["reduce"] != "global"):
            raise ValueError(f"{TUNED_TABLE}: entry {e} has persist with impl {e['impl']!r} / reduce {e['reduce']!r} "
                             "(persistent launches are wgmma with the global reduce)")
        if e["reduce"] not in REDUCES or (e["reduce"] == "cluster" and (e["impl"] != "wgmma"
                                                                         or e["splits"] > MAX_CLUSTER_SPLITS)):
            raise ValueError(f"{TUNED_TABLE}: entry {e} has an invalid reduce (cluster: wgmma, splits <= 8)")
        if e["impl"] not in IMPLS:
            raise ValueError(f"{TUNED_TABLE}: entry {e} has impl={e['impl']!r}; expected one of {IMPLS}")
        out.setdefault((e["epi"], e["n"], e["k"]), []).append(e)
    for v in out.values():
        v.sort(key=lambda e: e["m_max"])  # stable: within a bucket the file's order decides
    return out


def _tuned_config(m: int, n: int, k: int, epi: int, num_sms: int, impl: str | None = None,
                  cc: tuple[int, int] = (9, 0)) -> SkinnyConfig | None:
    for e in _tuned_entries(num_sms).get((EPI_NAMES[epi], n, k), ()):
        if impl is not None and e["impl"] != impl:
            continue
        if e["impl"] == "wgmma" and not wgmma_supported(cc):
            continue
        if m <= e["m_max"]:
            c = SkinnyConfig(epi, m, n, k, e["tm"], e["splits"], e["stages"], e["minb"], 0, e["impl"], e["pipe"],
                             e["reduce"])
            return dataclasses.replace(c, persist=min(e["persist"], c.units)) if e["persist"] else c
    return None


def config_for(m: int, n: int, k: int, epi: int = EPI_PLAIN, num_sms: int = 132, impl: str | None = None,
               cc: tuple[int, int] = (9, 0)) -> SkinnyConfig:
    """Pick (mainloop, token block, splits, stages) for an [m, k] x [n, k]^T GEMM with epilogue `epi`
    on a GPU of compute capability `cc` with `num_sms` SMs.

    impl None: the tuned table's entry when one matches (any impl), else the heuristic with
    default_impl(cc) (wgmma on sm_90). impl "mma" / "wgmma": that mainloop (table entries of that
    impl, else its heuristic).

    Heuristic candidates: the impl's token blocks (tokens beyond the block use more CTAs: weights
    then come from L2 for the extra token blocks) and K splits 1..min(K/128, 64). Pruned: workspace
    above WORKSPACE_CAP_BYTES; token blocks larger than needed (a block of 64 for 8 tokens only
    wastes MMA and smem). The cost model (estimate_us) ranks the rest; ties go to fewer CTAs.
    """
    key = (m, n, k, epi, num_sms, impl, tuple(cc))
    cfg = _configs.get(key)
    if cfg is not None:
        return cfg
    if m < 1 or m > MAX_M:
        raise _fail(epi, f"M={m} tokens is not supported (1..{MAX_M})")
    if k % 128 or k <= 0:
        raise _fail(epi, f"K={k} must be a positive multiple of 128")
    if n <= 0 or n % 2:
        raise _fail(epi, f"N={n} must be a positive even number")
    if impl is not None and impl not in IMPLS:
        raise _fail(epi, f"impl={impl!r}: expected one of {', '.join(IMPLS)}")
    if impl == "wgmma" and not wgmma_supported(cc):
        raise _fail(epi, f"impl 'wgmma' needs an sm_90 GPU (wgmma), this one is sm_{cc[0]}{cc[1]}; use 'mma'")
    tuned = _tuned_config(m, n, k, epi, num_sms, impl, cc)
    if tuned is not None:
        with _config_lock:
            _configs[key] = tuned
        return tuned
    use = impl or default_impl(cc)
    g = k // 128
    best: tuple[float, int, SkinnyConfig] | None = None
    for tm in token_blocks(use, epi):
        if tm > 8 and tm // 2 >= m:
            continue  # a smaller block holds every token
        for s in range(1, min(g, MAX_SPLITS) + 1):
            if use == "wgmma":
                st = wgmma_stages(tm, -(-g // s), epi=epi)
                c = SkinnyConfig(epi, m, n, k, tm, s, st, impl="wgmma")
            else:
                c = SkinnyConfig(epi, m, n, k, tm, s, STAGES[tm])
            if c.partial_floats * 4 > WORKSPACE_CAP_BYTES or c.smem_bytes > SMEM_LIMIT:
                continue
            # The persistent launch (SkinnyConfig.persist) is not a candidate: on the H200 (2026-11-30) it was 3-14 %
            # slower than the waves at the FP8-linear shapes it was built for at M <= 32 and tied at 64
            # (bench fp8-linear --variants persist times it).
            t = estimate_us(c, num_sms)
            cand = (t, c.ctas, c)
            if best is None or cand[:2] < best[:2]:
                best = cand
    assert best is not None
    cfg = best[2]
    with _config_lock:
        _configs[key] = cfg
    return cfg


_rotated_configs: dict[tuple[SkinnyConfig, int], SkinnyConfig] = {}


def rotated(c: SkinnyConfig, rot: int) -> SkinnyConfig:
    """`c` with the Walsh-Hadamard rotation option `rot` (D1 / B1; 0 = `c` itself): the same tiles, split-K
    and workspace; the ring depth is reduced only when the rotation's exchange buffer no longer fits."""
    if not rot:
        return c
    key = (c, rot)
    out = _rotated_configs.get(key)
    if out is not None:
        return out
    if c.epi not in ROT_EPIS or rot not in ROT_SIZES:
        raise _fail(c.epi, f"the Hadamard rotation ({rot}) exists for the D1 / B1 epilogues with a head dim in {ROT_SIZES}")
    out = dataclasses.replace(c, rot=rot)
    while out.smem_bytes > SMEM_LIMIT and out.stages > 2:
        out = dataclasses.replace(out, stages=out.stages - 1)
    if out.smem_bytes > SMEM_LIMIT:
        raise _fail(c.epi, f"rotation: {out.smem_bytes} B of shared memory > 227 KB even with 2 stages")
    with _config_lock:
        _rotated_configs[key] = out
    return out


def _max_workspace(n: int, k: int, epi: int, num_sms: int, cc: tuple[int, int] = (9, 0)) -> tuple[int, int]:
    """(partial floats, counter ints) enough for every M in 1..MAX_M and either mainloop (so
    switching GLM5_FASTPATH_FP8_GEMM_IMPL never needs a larger workspace under graph capture)."""
    pf, ci = 0, 0
    impls = IMPLS if wgmma_supported(cc) else ("mma",)
    for impl in impls:
        for m in range(1, MAX_M + 1):
            c = config_for(m, n, k, epi, num_sms, impl, cc)
            pf, ci = max(pf, c.partial_floats), max(ci, c.counter_ints)
    return pf, ci


# ---- kernel parameters (ABI of SkinnyParams in fp8_gemm_skinny.cuh) -------------------------------

class _Params(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p), ("w_scale", ctypes.c_void_p), ("x", ctypes.c_void_p), ("x_scale", ctypes.c_void_p),
        ("partials", ctypes.c_void_p), ("counters", ctypes.c_void_p),
        ("out_a", ctypes.c_void_p), ("out_b", ctypes.c_void_p), ("out_c", ctypes.c_void_p),
        ("out_fp8", ctypes.c_void_p), ("out_scale", ctypes.c_void_p), ("out_head_w", ctypes.c_void_p),
        ("cache", ctypes.c_void_p),
        ("norm_a", ctypes.c_void_p), ("norm_b", ctypes.c_void_p), ("ln_w", ctypes.c_void_p), ("ln_b", ctypes.c_void_p),
        ("w_raw", ctypes.c_void_p), ("positions", ctypes.c_void_p), ("slots", ctypes.c_void_p),
        ("rope_table", ctypes.c_void_p),
        ("rope_table_len", ctypes.c_int64), ("rope_theta", ctypes.c_double),
        ("M", ctypes.c_int32), ("N", ctypes.c_int32), ("K", ctypes.c_int32), ("splits", ctypes.c_int32),
        ("tiles_n", ctypes.c_int32), ("tiles_m", ctypes.c_int32),
        ("dim_a", ctypes.c_int32), ("dim_b", ctypes.c_int32), ("rope_dim", ctypes.c_int32), ("flags", ctypes.c_int32),
        ("eps", ctypes.c_float), ("head_w_scale", ctypes.c_float),
    ]


PARAMS_BYTES = ctypes.sizeof(_Params)  # 21*8 + 2*8 + 12*4 = 232


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


# ---- per-device state: kernels, workspaces, rope tables ---------------------------------------------

_state_lock = threading.RLock()
_kernels: dict[tuple, Any] = {}
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_rope_tables: dict[tuple, torch.Tensor] = {}
_num_sms: dict[int, int] = {}
_capability: dict[int, tuple[int, int]] = {}


def _cc(dev: torch.device) -> tuple[int, int]:
    idx = _dev_index(dev)
    cc = _capability.get(idx)
    if cc is None:
        cc = _capability[idx] = tuple(torch.cuda.get_device_capability(idx))
    return cc


def _sms(dev: torch.device) -> int:
    idx = _dev_index(dev)
    n = _num_sms.get(idx)
    if n is None:
        n = _num_sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def _check_capability(epi: int, dev: torch.device) -> None:
    require_hopper(_op_name(epi), dev, lambda msg: _fail(epi, msg))


def _kernel(cfg: SkinnyConfig, dev: torch.device, wait_at: int = PDL_WAIT_NATIVE):
    # keyed by the spec itself, so a new build knob cannot alias another build's kernel (session 17: a hand-made key
    # without the weight layout launched the row-major build with a k-block-major map, and it trapped)
    spec = cfg.spec(wait_at)
    key = (spec, _dev_index(dev))
    k = _kernels.get(key)
    if k is None:
        from ..jit.runtime import get_kernel
        with _state_lock:
            k = _kernels.get(key)
            if k is None:
                k = _kernels[key] = get_kernel(spec, device=dev)
    return k


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - no CUDA
        return False


def _workspace(epi: int, n: int, k: int, dev: torch.device, need: tuple[int, int] = (0, 0)
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """need: (partial floats, counter ints) a forced config needs beyond the heuristic's maximum
    (grows the buffers, outside capture only; never happens without forced_config)."""
    key = (_dev_index(dev), epi, n, k)
    ws = _workspaces.get(key)
    if ws is not None and (ws[0].numel() < need[0] or ws[1].numel() < need[1]):
        with _state_lock:
            if _capturing():
                raise RuntimeError(f"{_op_name(epi)}: forced config needs a larger split-K workspace; launch it once "
                                   "eagerly before CUDA-graph capture")
            pf, ci = max(ws[0].numel(), need[0]), max(ws[1].numel(), need[1])
            torch.cuda.synchronize(dev)
            ws = _workspaces[key] = (torch.empty(pf, dtype=torch.float32, device=dev),
                                     torch.zeros(ci, dtype=torch.int32, device=dev))
    if ws is None:
        with _state_lock:
            ws = _workspaces.get(key)
            if ws is None:
                if _capturing():
                    raise RuntimeError(f"{_op_name(epi)}: no split-K workspace for N={n}, K={k} on {dev} yet; run the op "
                                       "once eagerly or call glm5_fastpath.ops.fp8_gemm.precompile(cfg=...) before CUDA-graph capture")
                pf, ci = _max_workspace(n, k, epi, _sms(dev), _cc(dev))
                pf, ci = max(pf, need[0]), max(ci, need[1])
                partials = torch.empty(max(pf, 4), dtype=torch.float32, device=dev)
                counters = torch.zeros(max(ci, 4), dtype=torch.int32, device=dev)
                ws = _workspaces[key] = (partials, counters)
    return ws


def rope_table(rope_dim: int, theta: float, length: int, device) -> torch.Tensor:
    """[length, rope_dim/2, 2] fp32 (cos, sin) of positions 0..length-1, exactly ref.rope.rope_cos_sin's values."""
    dev = torch.device(device)
    key = (_dev_index(dev) if dev.type == "cuda" else -1, rope_dim, float(theta), int(length))
    t = _rope_tables.get(key)
    if t is None:
        with _state_lock:
            t = _rope_tables.get(key)
            if t is None:
                if _capturing():
                    raise RuntimeError("glm5_fastpath.fp8_gemm: the RoPE table is built outside CUDA-graph capture; run the op "
                                       "once eagerly or call glm5_fastpath.ops.fp8_gemm.precompile(cfg=...) first")
                from ..ref.rope import rope_cos_sin
                cos, sin = rope_cos_sin(torch.arange(length, device=dev), rope_dim, theta)
                t = _rope_tables[key] = torch.stack((cos, sin), dim=-1).contiguous()
    return t


# ---- validation -----------------------------------------------------------------------------------

def _check_tensor(epi: int, name: str, t: object, dtype: torch.dtype | tuple, shape: tuple) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(epi, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dts = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in dts:
        want = " or ".join(str(d).replace("torch.", "") for d in dts)
        raise _fail(epi, f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise _fail(epi, f"{name} must have shape {want}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise _fail(epi, f"{name} must be contiguous, got strides {t.stride()} for shape {list(t.shape)}")
    return t


_INDEX = (torch.int32, torch.int64)


def kblock_major(w: torch.Tensor) -> torch.Tensor:
    """W8 [N, K] (row-major) -> the same weight k-block-major, [K / 128, N, 128] contiguous: the 128-byte
    K slices of every row for one k block lie together, so each 128-row x 128-byte box the wgmma mainloop
    loads is 16 KB of contiguous memory (not 128 rows K bytes apart). The ops take either layout (a 3-D
    weight is k-block-major) and give bitwise the same results."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] % 128:
        raise Fp8GemmInputError(f"kblock_major: expected a [N, K] weight with K a multiple of 128, got "
                                f"{getattr(w, 'shape', type(w).__name__)}")
    n, k = w.shape
    return w.reshape(n, k // 128, 128).transpose(0, 1).contiguous()


def weight_rows(w: torch.Tensor) -> int:
    """N of a row-major [N, K] or k-block-major [K / 128, N, 128] weight."""
    return int(w.shape[1] if w.dim() == 3 else w.shape[0])


def _check_gemm(epi: int, x8, xs, w, ws) -> tuple[int, int, int]:
    _check_tensor(epi, "x_fp8", x8, FP8, (None, None))
    m, k = x8.shape
    if isinstance(w, torch.Tensor) and w.dim() == 3:  # k-block-major (kblock_major)
        _check_tensor(epi, "weight (k-block-major)", w, FP8, (k // 128, None, 128))
    else:
        _check_tensor(epi, "weight", w, FP8, (None, k))
    n = weight_rows(w)
    if k % 128 or k == 0:
        raise _fail(epi, f"K={k} must be a positive multiple of 128 (1x128 activation groups)")
    _check_tensor(epi, "x_scale", xs, torch.float32, (m, k // 128))
    _check_tensor(epi, "weight scale_inv", ws, torch.float32, (-(-n // 128), k // 128))
    if m > MAX_M:
        raise _fail(epi, f"M={m} tokens exceeds the decode limit {MAX_M} of the skinny GEMM")
    if n % 2:
        raise _fail(epi, f"N={n} must be even")
    return m, n, k


def _same_device(epi: int, *ts: torch.Tensor | None) -> torch.device:
    devs = {t.device for t in ts if t is not None}
    if len(devs) != 1:
        raise _fail(epi, f"all tensors must be on one device, got {sorted(map(str, devs))}")
    return next(iter(devs))


def _check_aligned(epi: int, *named: tuple[str, torch.Tensor]) -> None:
    require_aligned(lambda msg: _fail(epi, msg), dict(named))


def _launch(epi: int, cfg: SkinnyConfig, dev: torch.device, p: _Params, pdl: bool, x8: torch.Tensor,
            w: torch.Tensor, wait_at: int = PDL_WAIT_NATIVE) -> None:
    check_wait_at(_op_name(epi), wait_at)
    kernel = _kernel(cfg, dev, wait_at)
    env.print_config(EPI_NAMES[epi], {"M": cfg.m, "N": cfg.n, "K": cfg.k}, cfg.describe())
    args: list[Any] = [p]
    if cfg.impl == "wgmma":  # (SkinnyParams, CUtensorMap w_map, CUtensorMap x_map): fp8_gemm_wgmma.cu
        args += tensor_maps(cfg, x8, w)
    kernel.launch(cfg.grid, (cfg.threads, 1, 1), args, smem=cfg.smem_bytes, pdl=pdl, cluster=cfg.cluster)


def tensor_maps(cfg: SkinnyConfig, x8: torch.Tensor, w: torch.Tensor) -> list[Any]:
    """The wgmma kernel's TMA maps: W8 [N, K] in 128-row x 128-byte boxes and x8 [M, K] in tm-row x
    128-byte boxes, both 128-byte swizzled (cached per pointer and shape by jit.tma)."""
    from ..jit.tma import tensor_map_2d, tensor_map_strided
    if cfg.wkb:  # [K / 128, N, 128]: box (1 k block, 128 rows, 128 bytes), rows past N zero-filled as in 2-D
        kb, n, _ = w.shape
        wm = tensor_map_strided(w, (kb, n, 128), (n * 128, 128, 1), (1, BLOCK_N, 128), 128, name="weight_kblock")
    else:
        wm = tensor_map_2d(w, 128, BLOCK_N, 128, name="weight")
    return [wm, tensor_map_2d(x8, 128, cfg.tm, 128, name="x_fp8")]


def diag_specs() -> list[KernelSpec]:
    """The tuning / diagnostic variants the sweep uses (compile check only; not production)."""
    mma = [kernel_spec(tm, STAGES[tm], EPI_PLAIN, 1, d) for d in (1, 2, 3) for tm in TOKEN_BLOCKS] + \
          [kernel_spec(tm, STAGES[tm], EPI_PLAIN, 2, 0) for tm in TOKEN_BLOCKS]
    wg = [kernel_spec(tm, WGMMA_STAGES[tm], EPI_PLAIN, 1, d, "wgmma") for d in (1, 2, 3) for tm in (8, 128)]
    wg += [kernel_spec(8, WGMMA_STAGES[8], EPI_PLAIN, 1, d, "wgmma", pipe=1) for d in (1, 2, 3)]
    return mma + wg


def _base_params(epi: int, cfg: SkinnyConfig, x8, xs, w, ws, dev) -> _Params:
    p = _Params()
    p.w, p.w_scale, p.x, p.x_scale = _ptr(w), _ptr(ws), _ptr(x8), _ptr(xs)
    if cfg.splits > 1 or epi == EPI_QKV_A:
        partials, counters = _workspace(epi, cfg.n, cfg.k, dev, (cfg.partial_floats, cfg.counter_ints))
        p.partials, p.counters = _ptr(partials), _ptr(counters)
    p.M, p.N, p.K, p.splits = cfg.m, cfg.n, cfg.k, cfg.splits
    p.tiles_n, p.tiles_m = cfg.tiles_n, cfg.tiles_m
    return p


def _prepare(epi: int, x8, xs, w, ws, extra: tuple = (), rot: int = 0) -> tuple[SkinnyConfig | None, torch.device]:
    m, n, k = _check_gemm(epi, x8, xs, w, ws)
    dev = _same_device(epi, x8, xs, w, ws, *extra)
    if m == 0:
        return None, dev
    _check_capability(epi, dev)
    _check_aligned(epi, ("x_fp8", x8), ("weight", w))
    cc = _cc(dev)
    forced = _forced_config_for(m, n, k, epi)
    if forced is not None:
        if forced.impl == "wgmma" and not wgmma_supported(cc):
            raise _fail(epi, f"forced_config: impl 'wgmma' needs an sm_90 GPU, {dev} is sm_{cc[0]}{cc[1]}")
        return _with_layout(epi, rotated(_apply_launch_overrides(epi, forced), rot), w), dev
    return _with_layout(epi, rotated(_apply_launch_overrides(epi, with_env_pipe(
        config_for(m, n, k, epi, _sms(dev), env_impl(epi), cc), epi)), rot), w), dev


def _with_layout(epi: int, cfg: SkinnyConfig, w: torch.Tensor) -> SkinnyConfig:
    """cfg for this weight's layout: a k-block-major (3-D) weight needs the wgmma mainloop (TMA boxes)."""
    if w.dim() != 3:
        return cfg
    if cfg.impl != "wgmma":
        raise _fail(epi, f"a k-block-major weight needs the wgmma mainloop, but M={cfg.m} N={cfg.n} K={cfg.k} runs impl "
                         f"{cfg.impl!r}: pass the row-major [N, K] weight")
    return dataclasses.replace(cfg, wkb=1)


def env_inflight(stages: int) -> int:
    """GLM5_FASTPATH_FP8_GEMM_INFLIGHT (read when a kernel spec is built): n >= 1 caps the wgmma mainloop's ring
    fill at n stages in flight per CTA (csrc/attn_pre/fp8_gemm_wgmma.cuh, kInflight: the first box lands before the
    whole grid's burst has drained); unset / 0 = off. Capped at the config's stages (n >= stages = off). An
    experiment (session 24, issue #3 / #4); bitwise identical results. Set it before precompile()."""
    raw = env.text(INFLIGHT_ENV)
    if raw is None or raw.strip() in ("", "0"):
        return 0
    if not raw.strip().isdigit():
        raise _fail(EPI_PLAIN, f"{INFLIGHT_ENV}={raw!r}: expected a whole number of stages (0 = off)")
    n = int(raw)
    return n if n < stages else 0


def env_pipe(epi: int = EPI_PLAIN) -> int | None:
    """GLM5_FASTPATH_FP8_GEMM_PIPE (read now): 0 / 1 / 2 sets the wgmma consumer mode (SkinnyConfig.pipe) of every
    op's chosen config where it applies (wgmma, tm <= PIPE_MAX_TM); unset = the config's own. For measuring the
    stage-pair consumer (pipe=2) in whole-prefix benchmarks before the tuned table adopts it. Set it before
    precompile(): a value changed afterwards makes the next launch compile its kernel (inside a CUDA-graph
    capture, if one is running)."""
    raw = env.text(PIPE_ENV)
    if raw is None:
        return None
    if raw.strip() not in tuple(map(str, PIPES)):
        raise _fail(epi, f"{PIPE_ENV}={raw!r}: expected one of {', '.join(map(str, PIPES))}")
    return int(raw)


def with_env_pipe(cfg: SkinnyConfig, epi: int = EPI_PLAIN) -> SkinnyConfig:
    pipe = env_pipe(epi)
    if pipe is None or cfg.impl != "wgmma" or cfg.tm > PIPE_MAX_TM or cfg.pipe == pipe:
        return cfg
    return dataclasses.replace(cfg, pipe=pipe)


def _rope_args(epi: int, positions: torch.Tensor, table: torch.Tensor, rope_dim: int, m: int) -> int:
    _check_tensor(epi, "positions", positions, _INDEX, (m,))
    _check_tensor(epi, "rope_table", table, torch.float32, (None, rope_dim // 2, 2))
    return 1 if positions.dtype == torch.int64 else 0


# ---- custom ops ---------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::fp8_gemm_skinny", mutates_args=())
def _fp8_gemm_skinny_op(x8: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                        pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg, dev = _prepare(EPI_PLAIN, x8, xs, w, ws)
    y = torch.empty(x8.shape[0], weight_rows(w), dtype=BF16, device=x8.device)
    if cfg is None:
        return y
    p = _base_params(EPI_PLAIN, cfg, x8, xs, w, ws, dev)
    p.out_a = _ptr(y)
    _launch(EPI_PLAIN, cfg, dev, p, pdl, x8, w, pdl_wait_at)
    return y


@_fp8_gemm_skinny_op.register_fake
def _(x8, xs, w, ws, pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    m, n, _ = _check_gemm(EPI_PLAIN, x8, xs, w, ws)
    return x8.new_empty((m, n), dtype=BF16)


def _check_qkv_a_dims(q: int, kv: int, r: int, n: int) -> None:
    e = EPI_QKV_A
    if q + kv + r != n:
        raise _fail(e, f"weight has N={n} rows but q_lora_rank + kv_lora_rank + rope = {q}+{kv}+{r}")
    if q % 128 or not 0 < q <= 2048:
        raise _fail(e, f"q_lora_rank={q} is not supported: a multiple of 128 up to 2048")
    if kv % 8 or not 0 < kv <= 512:
        raise _fail(e, f"kv_lora_rank={kv} is not supported: a multiple of 8 up to 512")
    if r % 2 or r <= 0:
        raise _fail(e, f"rope dim {r} must be positive and even")


@torch.library.custom_op("glm5_fastpath::fp8_qkv_a", mutates_args=())
def _fp8_qkv_a_op(x8: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, q_norm: torch.Tensor,
                  kv_norm: torch.Tensor, q_lora_rank: int, kv_lora_rank: int, rope_dim: int, eps: float,
                  pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    e = EPI_QKV_A
    outs = _qkv_a_outputs(x8, w, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim)
    cfg, dev = _prepare(e, x8, xs, w, ws, (q_norm, kv_norm))
    if cfg is None:
        return outs
    _check_aligned(e, ("q_norm", q_norm), ("kv_norm", kv_norm))
    q_lora, q8, qs, c_kv, k_pe = outs
    p = _base_params(e, cfg, x8, xs, w, ws, dev)
    p.out_a, p.out_b, p.out_c, p.out_fp8, p.out_scale = _ptr(q_lora), _ptr(c_kv), _ptr(k_pe), _ptr(q8), _ptr(qs)
    p.norm_a, p.norm_b = _ptr(q_norm), _ptr(kv_norm)
    p.dim_a, p.dim_b, p.rope_dim, p.eps = q_lora_rank, kv_lora_rank, rope_dim, eps
    _launch(e, cfg, dev, p, pdl, x8, w, pdl_wait_at)
    return outs


def _qkv_a_outputs(x8, w, q_norm, kv_norm, q, kv, r):
    e = EPI_QKV_A
    _check_qkv_a_dims(q, kv, r, weight_rows(w))
    _check_tensor(e, "q_a_norm", q_norm, BF16, (q,))
    _check_tensor(e, "kv_a_norm", kv_norm, BF16, (kv,))
    m = x8.shape[0]
    kw = dict(device=x8.device)
    return (x8.new_empty((m, q), dtype=BF16), x8.new_empty((m, q), dtype=FP8),
            x8.new_empty((m, q // 128), dtype=torch.float32), x8.new_empty((m, kv), dtype=BF16),
            torch.empty((m, r), dtype=BF16, **kw))


@_fp8_qkv_a_op.register_fake
def _(x8, xs, w, ws, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim, eps, pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    _check_gemm(EPI_QKV_A, x8, xs, w, ws)
    return _qkv_a_outputs(x8, w, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim)


# ---- B0 split mode: plain GEMM + row kernel (csrc/attn_pre/b0_row_norms.{cuh,cu}) -------------------

B0_MODES = ("fused", "split")
B0_DEFAULT_MODE = "split"  # what b0_qkv_a uses when neither `mode` nor GLM5_FASTPATH_B0_MODE says
B0_MODE_ENV = "GLM5_FASTPATH_B0_MODE"
ROW_SOURCE = "attn_pre/b0_row_norms.cu"
ROW_FUNCTION = "glm5_b0_row_norms"


def b0_mode(mode: str | None = None) -> str:
    """The B0 implementation a call uses: `mode` when given, else GLM5_FASTPATH_B0_MODE (read now),
    else B0_DEFAULT_MODE. Anything but "fused" / "split" raises Fp8GemmInputError (a ValueError)."""
    if mode is None:
        raw = env.text(B0_MODE_ENV)
        if raw is not None:
            if raw.lower() not in B0_MODES:
                raise _fail(EPI_QKV_A, f"{B0_MODE_ENV}={raw!r}: expected one of {', '.join(B0_MODES)}")
            return raw.lower()
        mode = B0_DEFAULT_MODE
    if not isinstance(mode, str) or mode not in B0_MODES:
        raise _fail(EPI_QKV_A, f"mode={mode!r}: expected one of {', '.join(B0_MODES)} (or None)")
    return mode


def _row_threads(q: int, kv: int, r: int) -> int:
    """Threads per CTA of the row kernel: one 16-byte vector of the larger part per thread, a
    multiple of 32 in 32..256 (GLM-5: 256; small preset: 32)."""
    vecs = max(q // 8, (kv + r) // 8)
    return min(256, max(32, -(-vecs // 32) * 32))


def _check_row_dims(q: int, kv: int, r: int) -> None:
    _check_qkv_a_dims(q, kv, r, q + kv + r)
    if r % 8:
        raise _fail(EPI_QKV_A, f"mode='split' needs the rope dim to be a multiple of 8 (16-byte rows), got {r}")


@functools.lru_cache(maxsize=None)
def row_norms_spec(q: int, kv: int, r: int, wait_at: int = PDL_WAIT_NATIVE) -> KernelSpec:
    """The row kernel of B0 split mode for q_lora_rank q, kv_lora_rank kv, rope dim r (wait_at: GLM5_PDL_WAIT_AT)."""
    return KernelSpec(ROW_FUNCTION, source=ROW_SOURCE,
                      defines=(("GLM5_B0N_Q", str(q)), ("GLM5_B0N_KV", str(kv)), ("GLM5_B0N_R", str(r)),
                               ("GLM5_B0N_THREADS", str(_row_threads(q, kv, r))))
                      + wait_defines(check_wait_at(_op_name(EPI_QKV_A), wait_at)))


def _row_specs() -> list[KernelSpec]:
    out = []
    for name in ("glm5", "small"):
        c = Glm5Config.preset(name)
        out.append(row_norms_spec(c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim))
    return out


def _row_kernel(q: int, kv: int, r: int, dev: torch.device, wait_at: int = PDL_WAIT_NATIVE):
    key = ("b0_row_norms", q, kv, r, wait_at, _dev_index(dev))
    k = _kernels.get(key)
    if k is None:
        from ..jit.runtime import get_kernel
        with _state_lock:
            k = _kernels.get(key)
            if k is None:
                k = _kernels[key] = get_kernel(row_norms_spec(q, kv, r, wait_at), device=dev)
    return k


def _row_outputs(qkv, q_norm, kv_norm, q: int, kv: int, r: int):
    e = EPI_QKV_A
    _check_row_dims(q, kv, r)
    _check_tensor(e, "qkv", qkv, BF16, (None, q + kv + r))
    _check_tensor(e, "q_a_norm", q_norm, BF16, (q,))
    _check_tensor(e, "kv_a_norm", kv_norm, BF16, (kv,))
    m = qkv.shape[0]
    return (qkv.new_empty((m, q), dtype=BF16), qkv.new_empty((m, q), dtype=FP8),
            qkv.new_empty((m, q // 128), dtype=torch.float32), qkv.new_empty((m, kv), dtype=BF16),
            qkv.new_empty((m, r), dtype=BF16))


@torch.library.custom_op("glm5_fastpath::b0_row_norms", mutates_args=())
def _b0_row_norms_op(qkv: torch.Tensor, q_norm: torch.Tensor, kv_norm: torch.Tensor, q_lora_rank: int,
                     kv_lora_rank: int, rope_dim: int, eps: float, pdl: bool = True,
                     pdl_wait_at: int = PDL_WAIT_NATIVE
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """B0's row epilogue on the plain GEMM's bf16 output qkv [M, q+kv+r] -> (q_lora, q_lora_fp8,
    q_lora_scale [M, q/128] row-major, c_kv, k_pe), the outputs (and layouts) of fp8_qkv_a."""
    e = EPI_QKV_A
    outs = _row_outputs(qkv, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim)
    check_wait_at(_op_name(e), pdl_wait_at)
    dev = _same_device(e, qkv, q_norm, kv_norm)
    m = qkv.shape[0]
    if m == 0:
        return outs
    if m >= 2**31:
        raise _fail(e, f"M={m} rows exceeds the grid limit 2^31-1")
    _check_capability(e, dev)
    _check_aligned(e, ("qkv", qkv), ("q_a_norm", q_norm), ("kv_a_norm", kv_norm))
    q_lora, q8, qs, c_kv, k_pe = outs
    threads = _row_threads(q_lora_rank, kv_lora_rank, rope_dim)
    kernel = _row_kernel(q_lora_rank, kv_lora_rank, rope_dim, dev, pdl_wait_at)
    env.print_config("b0_row_norms", {"M": m, "Q": q_lora_rank, "KV": kv_lora_rank, "R": rope_dim},
                     {"threads": threads, "grid": "M CTAs"})
    kernel.launch((m, 1, 1), (threads, 1, 1),
                  (qkv, q_norm, kv_norm, q_lora, q8, qs, c_kv, k_pe, ctypes.c_int32(m), ctypes.c_float(eps)), pdl=pdl)
    return outs


@_b0_row_norms_op.register_fake
def _(qkv, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim, eps, pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    return _row_outputs(qkv, q_norm, kv_norm, q_lora_rank, kv_lora_rank, rope_dim)


def _check_q_b_dims(n: int, heads: int, nope: int, r: int) -> None:
    e = EPI_Q_B
    if heads * (nope + r) != n:
        raise _fail(e, f"weight has N={n} rows but heads * (nope + rope) = {heads}*({nope}+{r})")
    if nope % 2 or r % 2 or not 0 < r <= 2 * ROPE_PAIRS_MAX:
        raise _fail(e, f"nope dim {nope} and rope dim {r} must be even (0 < rope <= {2 * ROPE_PAIRS_MAX})")


@torch.library.custom_op("glm5_fastpath::fp8_q_b_rope", mutates_args=())
def _fp8_q_b_rope_op(x8: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, positions: torch.Tensor,
                     rope_table: torch.Tensor, heads: int, nope_dim: int, rope_dim: int, rope_theta: float,
                     pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> tuple[torch.Tensor, torch.Tensor]:
    e = EPI_Q_B
    _check_q_b_dims(weight_rows(w), heads, nope_dim, rope_dim)
    m = x8.shape[0]
    q_nope = x8.new_empty((m, heads, nope_dim), dtype=BF16)
    q_pe = x8.new_empty((m, heads, rope_dim), dtype=BF16)
    cfg, dev = _prepare(e, x8, xs, w, ws, (positions, rope_table))
    flags = _rope_args(e, positions, rope_table, rope_dim, m)
    if cfg is None:
        return q_nope, q_pe
    p = _base_params(e, cfg, x8, xs, w, ws, dev)
    p.out_a, p.out_b = _ptr(q_nope), _ptr(q_pe)
    p.positions, p.rope_table, p.rope_table_len, p.rope_theta = _ptr(positions), _ptr(rope_table), rope_table.shape[0], rope_theta
    p.dim_a, p.dim_b, p.rope_dim, p.flags = nope_dim + rope_dim, nope_dim, rope_dim, flags
    _launch(e, cfg, dev, p, pdl, x8, w, pdl_wait_at)
    return q_nope, q_pe


@_fp8_q_b_rope_op.register_fake
def _(x8, xs, w, ws, positions, rope_table, heads, nope_dim, rope_dim, rope_theta, pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    m, n, _ = _check_gemm(EPI_Q_B, x8, xs, w, ws)
    _check_q_b_dims(n, heads, nope_dim, rope_dim)
    return x8.new_empty((m, heads, nope_dim), dtype=BF16), x8.new_empty((m, heads, rope_dim), dtype=BF16)


def _check_head_dims(epi: int, n: int, heads: int, d: int, r: int) -> None:
    if heads * d != n:
        raise _fail(epi, f"weight has N={n} rows but heads * head_dim = {heads}*{d}")
    if d % 16 or 128 % d:
        raise _fail(epi, f"head_dim={d} is not supported: one of 16, 32, 64, 128 (a head must sit in one 128-row tile)")
    if r % 2 or not 0 < r <= min(d, 2 * ROPE_PAIRS_MAX):
        raise _fail(epi, f"rope dim {r} must be even and in (0, min(head_dim={d}, {2 * ROPE_PAIRS_MAX})]")


def _rot_of(epi: int, rotate: object, head_dim: int) -> int:
    """The kernel's rotation option for the op argument `rotate` (the head dim, or 0)."""
    if not isinstance(rotate, bool):
        raise _fail(epi, f"rotate must be a bool, got {type(rotate).__name__}")
    if rotate and head_dim not in ROT_SIZES:
        raise _fail(epi, f"rotate=True needs head_dim in {ROT_SIZES} (a Walsh-Hadamard row of whole warps), got {head_dim}")
    return head_dim if rotate else 0


@torch.library.custom_op("glm5_fastpath::fp8_indexer_q", mutates_args=())
def _fp8_indexer_q_op(x8: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, w_raw: torch.Tensor,
                      positions: torch.Tensor, rope_table: torch.Tensor, heads: int, head_dim: int, rope_dim: int,
                      head_w_scale: float, rope_theta: float, pdl: bool = True,
                      pdl_wait_at: int = PDL_WAIT_NATIVE, rotate: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rotate: the Walsh-Hadamard rotation of each (token, head) q row after RoPE (SGLang 0.5.14's indexer)."""
    e = EPI_IDX_Q
    _check_head_dims(e, weight_rows(w), heads, head_dim, rope_dim)
    rot = _rot_of(e, rotate, head_dim)
    m = x8.shape[0]
    _check_tensor(e, "w_raw", w_raw, BF16, (m, heads))
    q8 = x8.new_empty((m, heads, head_dim), dtype=FP8)
    qs = x8.new_empty((m, heads), dtype=torch.float32)
    hw = x8.new_empty((m, heads), dtype=torch.float32)
    cfg, dev = _prepare(e, x8, xs, w, ws, (w_raw, positions, rope_table), rot)
    flags = _rope_args(e, positions, rope_table, rope_dim, m)
    if cfg is None:
        return q8, qs, hw
    p = _base_params(e, cfg, x8, xs, w, ws, dev)
    p.out_fp8, p.out_scale, p.out_head_w, p.w_raw = _ptr(q8), _ptr(qs), _ptr(hw), _ptr(w_raw)
    p.positions, p.rope_table, p.rope_table_len, p.rope_theta = _ptr(positions), _ptr(rope_table), rope_table.shape[0], rope_theta
    p.dim_a, p.dim_b, p.rope_dim, p.flags, p.head_w_scale = head_dim, heads, rope_dim, flags, head_w_scale
    _launch(e, cfg, dev, p, pdl, x8, w, pdl_wait_at)
    return q8, qs, hw


@_fp8_indexer_q_op.register_fake
def _(x8, xs, w, ws, w_raw, positions, rope_table, heads, head_dim, rope_dim, head_w_scale, rope_theta, pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE, rotate=False):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    m, n, _ = _check_gemm(EPI_IDX_Q, x8, xs, w, ws)
    _check_head_dims(EPI_IDX_Q, n, heads, head_dim, rope_dim)
    _rot_of(EPI_IDX_Q, rotate, head_dim)
    return (x8.new_empty((m, heads, head_dim), dtype=FP8), x8.new_empty((m, heads), dtype=torch.float32),
            x8.new_empty((m, heads), dtype=torch.float32))


@torch.library.custom_op("glm5_fastpath::fp8_indexer_k", mutates_args=("index_k_cache",))
def _fp8_indexer_k_op(x8: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, ln_w: torch.Tensor,
                      ln_b: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                      index_k_cache: torch.Tensor, rope_table: torch.Tensor, rope_dim: int, eps: float,
                      rope_theta: float, pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE,
                      rotate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """rotate: the Walsh-Hadamard rotation of each token's bf16 key after RoPE, rounded to bf16 again, before the
    quant and the cache store (SGLang 0.5.14's index-K cache format)."""
    e = EPI_IDX_K
    d = weight_rows(w)
    _check_head_dims(e, d, 1, d, rope_dim)
    rot = _rot_of(e, rotate, d)
    m = x8.shape[0]
    _check_tensor(e, "k_norm_weight", ln_w, torch.float32, (d,))
    _check_tensor(e, "k_norm_bias", ln_b, torch.float32, (d,))
    _check_tensor(e, "out_cache_loc", out_cache_loc, _INDEX, (m,))
    _check_tensor(e, "index_k_cache", index_k_cache, torch.uint8, (None, INDEX_K_PAGE_TOKENS * (d + 4)))
    k8 = x8.new_empty((m, d), dtype=FP8)
    ks = x8.new_empty((m,), dtype=torch.float32)
    cfg, dev = _prepare(e, x8, xs, w, ws, (ln_w, ln_b, positions, out_cache_loc, index_k_cache, rope_table), rot)
    flags = _rope_args(e, positions, rope_table, rope_dim, m)
    if cfg is None:
        return k8, ks
    if index_k_cache.data_ptr() % 4:
        raise _fail(e, "index_k_cache must be 4-byte aligned (fp32 scales are stored in place)")
    if out_cache_loc.dtype == torch.int64:
        flags |= 2
    p = _base_params(e, cfg, x8, xs, w, ws, dev)
    p.out_fp8, p.out_scale, p.cache, p.ln_w, p.ln_b = _ptr(k8), _ptr(ks), _ptr(index_k_cache), _ptr(ln_w), _ptr(ln_b)
    p.positions, p.slots = _ptr(positions), _ptr(out_cache_loc)
    p.rope_table, p.rope_table_len, p.rope_theta = _ptr(rope_table), rope_table.shape[0], rope_theta
    p.dim_a, p.rope_dim, p.flags, p.eps = d, rope_dim, flags, eps
    _launch(e, cfg, dev, p, pdl, x8, w, pdl_wait_at)
    return k8, ks


@_fp8_indexer_k_op.register_fake
def _(x8, xs, w, ws, ln_w, ln_b, positions, out_cache_loc, index_k_cache, rope_table, rope_dim, eps, rope_theta,
      pdl=True,
      pdl_wait_at=PDL_WAIT_NATIVE, rotate=False):
    check_wait_at("glm5_fastpath.fp8_gemm", pdl_wait_at)
    m, d, _ = _check_gemm(EPI_IDX_K, x8, xs, w, ws)
    _check_head_dims(EPI_IDX_K, d, 1, d, rope_dim)
    _rot_of(EPI_IDX_K, rotate, d)
    return x8.new_empty((m, d), dtype=FP8), x8.new_empty((m,), dtype=torch.float32)


# ---- Python entry points (signatures = glm5_fastpath.ref.prefix) -------------------------------------

def _cfg_check(epi: int, cfg: object) -> Glm5Config:
    if not isinstance(cfg, Glm5Config):
        raise _fail(epi, f"cfg must be a Glm5Config, got {type(cfg).__name__}")
    return cfg


def _table_for(cfg: Glm5Config, device: torch.device) -> torch.Tensor:
    return rope_table(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings, device)


def fp8_gemm_skinny(x8: torch.Tensor, xs: torch.Tensor, w, *, pdl: bool = True,
                    pdl_wait: str | None = None) -> torch.Tensor:
    """y [M, N] bf16 = bf16(block-scaled FP8 GEMM); w is an Fp8Linear (weight [N,K] e4m3, scale_inv fp32).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native."""
    wait_at = _wait_at(EPI_PLAIN, pdl_wait)
    weight, scale = _unpack_linear(EPI_PLAIN, "w", w)
    return torch.ops.glm5_fastpath.fp8_gemm_skinny(x8, xs, weight, scale, pdl, wait_at)


def _wait_at(epi: int, pdl_wait: object) -> int:
    return pdl_wait_code(EPI_NAMES[epi], pdl_wait, lambda msg: _fail(epi, msg))


def _unpack_linear(epi: int, name: str, lin) -> tuple[torch.Tensor, torch.Tensor]:
    if not (hasattr(lin, "weight") and hasattr(lin, "scale_inv")):
        raise _fail(epi, f"{name} must be an Fp8Linear (weight, scale_inv), got {type(lin).__name__}")
    return lin.weight, lin.scale_inv


def b0_qkv_a(x_fp8: torch.Tensor, x_scale: torch.Tensor, w, cfg: Glm5Config, *, pdl: bool = True,
             mode: str | None = None, pdl_wait: str | None = None) -> dict[str, torch.Tensor]:
    """QKV-A GEMM + q_a / kv_a RMSNorm + q_lora 1x128 quant (ref.prefix.b0_qkv_a).

    mode "fused": one kernel (the last n tile of a token block runs the row epilogue); "split": the
    plain GEMM into a bf16 [M, q+kv+rope] buffer, then the row kernel (PDL, same stream). None:
    GLM5_FASTPATH_B0_MODE when set, else B0_DEFAULT_MODE (see b0_mode). pdl_wait: where the kernel(s)
    first wait under PDL (module docstring; split mode: both kernels); None = native."""
    e = EPI_QKV_A
    wait_at = _wait_at(e, pdl_wait)
    c = _cfg_check(e, cfg)
    use = b0_mode(mode)
    weight, scale = _unpack_linear(e, "w.qkv_a", w.qkv_a)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[1] != c.hidden_size:
        raise _fail(e, f"w.qkv_a has K={weight.shape[-1]} but hidden_size is {c.hidden_size}")
    q, kv, r, eps = c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim, float(c.rms_norm_eps)
    if use == "split":
        _check_row_dims(q, kv, r)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            _check_qkv_a_dims(q, kv, r, weight.shape[0])
        qkv = torch.ops.glm5_fastpath.fp8_gemm_skinny(x_fp8, x_scale, weight, scale, pdl, wait_at)
        q_lora, q8, qs, c_kv, k_pe = torch.ops.glm5_fastpath.b0_row_norms(qkv, w.q_a_norm, w.kv_a_norm, q, kv, r,
                                                                          eps, pdl, wait_at)
    else:
        q_lora, q8, qs, c_kv, k_pe = torch.ops.glm5_fastpath.fp8_qkv_a(
            x_fp8, x_scale, weight, scale, w.q_a_norm, w.kv_a_norm, q, kv, r, eps, pdl, wait_at)
    return {"q_lora": q_lora, "q_lora_fp8": q8, "q_lora_scale": qs, "c_kv": c_kv, "k_pe": k_pe}


def d0_q_b(q_lora_fp8: torch.Tensor, q_lora_scale: torch.Tensor, w, positions: torch.Tensor, cfg: Glm5Config,
           *, pdl: bool = True, pdl_wait: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q_b_proj GEMM + interleaved RoPE of the trailing rope dims of each head (ref.prefix.d0_q_b).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native."""
    e = EPI_Q_B
    wait_at = _wait_at(e, pdl_wait)
    c = _cfg_check(e, cfg)
    weight, scale = _unpack_linear(e, "w.q_b", w.q_b)
    table = _table_for(c, positions.device if isinstance(positions, torch.Tensor) else q_lora_fp8.device)
    return torch.ops.glm5_fastpath.fp8_q_b_rope(q_lora_fp8, q_lora_scale, weight, scale, positions, table,
                                               c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                                               float(c.rope_theta), pdl, wait_at)


def d1_indexer_q(q_lora_fp8: torch.Tensor, q_lora_scale: torch.Tensor, w_raw: torch.Tensor, idx,
                 positions: torch.Tensor, cfg: Glm5Config, rotate: bool = False, *, pdl: bool = True,
                 pdl_wait: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """wq_b GEMM + RoPE (leading dims) + [Walsh-Hadamard rotation,] per-(token, head) FP8 quant + head weights
    (ref.prefix.d1_indexer_q). rotate: SGLang 0.5.14's indexer rotation (fp32, before the quant).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native."""
    e = EPI_IDX_Q
    wait_at = _wait_at(e, pdl_wait)
    c = _cfg_check(e, cfg)
    if idx is None:
        raise _fail(e, "idx (IndexerWeights) is None: this layer has no indexer (GLM-5.2 shared layer)")
    weight, scale = _unpack_linear(e, "idx.wq_b", idx.wq_b)
    table = _table_for(c, positions.device if isinstance(positions, torch.Tensor) else q_lora_fp8.device)
    head_w_scale = float(torch.tensor(c.index_weight_scale, dtype=torch.float32))  # torch casts the scalar to fp32
    return torch.ops.glm5_fastpath.fp8_indexer_q(q_lora_fp8, q_lora_scale, weight, scale, w_raw, positions, table,
                                                c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim, head_w_scale,
                                                float(c.rope_theta), pdl, wait_at, rotate)


def b1_indexer_k(x_bf16: torch.Tensor | None, x_fp8: torch.Tensor, x_scale: torch.Tensor, idx,
                 positions: torch.Tensor, out_cache_loc: torch.Tensor, index_k_cache: torch.Tensor,
                 cfg: Glm5Config, gemm: str = "fp8", rotate: bool = False, *, pdl: bool = True,
                 pdl_wait: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """wk GEMM + LayerNorm + RoPE + [Walsh-Hadamard rotation,] per-token quant + paged index-K cache store
    (ref.prefix.b1_indexer_k). rotate: SGLang 0.5.14's index-K format (the bf16 key rotated, bf16 again).

    Only gemm="fp8" (x_fp8 / x_scale read, x_bf16 ignored). out_cache_loc must hold distinct valid
    slots (not checked on the device; the reference checks it with a host sync). pdl_wait: where the
    kernel first waits under PDL (module docstring); None = native."""
    e = EPI_IDX_K
    wait_at = _wait_at(e, pdl_wait)
    c = _cfg_check(e, cfg)
    if gemm != "fp8":
        raise _fail(e, f"only gemm='fp8' is implemented by the kernel, got {gemm!r} (use glm5_fastpath.ref.prefix for 'bf16')")
    if idx is None:
        raise _fail(e, "idx (IndexerWeights) is None: this layer has no indexer (GLM-5.2 shared layer)")
    weight, scale = _unpack_linear(e, "idx.wk", idx.wk)
    if isinstance(weight, torch.Tensor) and weight.shape[0] != c.index_head_dim:
        raise _fail(e, f"idx.wk has {weight.shape[0]} rows but index_head_dim is {c.index_head_dim}")
    table = _table_for(c, positions.device if isinstance(positions, torch.Tensor) else x_fp8.device)
    return torch.ops.glm5_fastpath.fp8_indexer_k(x_fp8, x_scale, weight, scale, idx.k_norm_weight, idx.k_norm_bias,
                                                positions, out_cache_loc, index_k_cache, table, c.qk_rope_head_dim,
                                                float(INDEXER_K_NORM_EPS), float(c.rope_theta), pdl, wait_at, rotate)


# ---- precompile / compile check ------------------------------------------------------------------------

def _glm_shapes(cfg: Glm5Config) -> list[tuple[int, int, int]]:
    """(epi, N, K) of the four fused GEMMs of a config."""
    c = cfg
    return [(EPI_QKV_A, c.qkv_a_out, c.hidden_size),
            (EPI_Q_B, c.num_attention_heads * c.qk_head_dim, c.q_lora_rank),
            (EPI_IDX_Q, c.index_n_heads * c.index_head_dim, c.q_lora_rank),
            (EPI_IDX_K, c.index_head_dim, c.hidden_size)]


def _variants(cfg: Glm5Config, num_sms: int = 132, impl: str | None = None,
              cc: tuple[int, int] = (9, 0)) -> set[tuple[str, int, int, int, int]]:
    """(impl, tm, stages, epi, minb) of every kernel the GLM-5 shapes launch for M in 1..MAX_M when
    the ops resolve their config with `impl` (None: table, then default_impl(cc))."""
    out: set[tuple[str, int, int, int, int]] = set()
    for epi, n, k in _glm_shapes(cfg):
        for m in range(1, MAX_M + 1):
            c = config_for(m, n, k, epi, num_sms, impl, cc)
            out.add((c.impl, c.tm, c.stages, c.epi, c.minb))
            if epi in (EPI_QKV_A, EPI_IDX_K):  # the plain op at the same K-heavy shapes
                c = config_for(m, n, k, EPI_PLAIN, num_sms, impl, cc)
                out.add((c.impl, c.tm, c.stages, c.epi, c.minb))
    return out


def _rotated_variants(cfg: Glm5Config, num_sms: int = 132, impl: str | None = None,
                      cc: tuple[int, int] = (9, 0)) -> set[tuple[str, int, int, int, int, int]]:
    """(impl, tm, stages, epi, minb, rot) of the D1 / B1 kernels with the Hadamard rotation option (rot = the
    index head dim) for M in 1..MAX_M; empty when the head dim cannot be rotated."""
    rot = cfg.index_head_dim
    if rot not in ROT_SIZES:
        return set()
    out: set[tuple[str, int, int, int, int, int]] = set()
    for epi, n, k in _glm_shapes(cfg):
        if epi in ROT_EPIS:
            for m in range(1, MAX_M + 1):
                c = rotated(config_for(m, n, k, epi, num_sms, impl, cc), rot)
                out.add((c.impl, c.tm, c.stages, c.epi, c.minb, c.rot))
    return out


def precompile(device: object = None, cfg: Glm5Config | None = None, rotate: bool = False,
               wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,)) -> None:
    """Compile + load every kernel variant the GLM-5 shapes use for M in 1..256 (with the impl
    GLM5_FASTPATH_FP8_GEMM_IMPL selects now, else the table / default), and allocate the workspaces
    and the RoPE table on `device` (call before CUDA-graph capture). rotate: also the D1 / B1 kernels
    with the Hadamard rotation option (SGLang 0.5.14's indexer format). wait_ats: the PDL wait points
    (GLM5_PDL_WAIT_AT codes) to build each variant for: a CMP mode waiting earlier than the native point
    launches separate cubins."""
    cfg = cfg or Glm5Config.preset("glm5")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    sms, cc = _sms(dev), _cc(dev)
    for w in wait_ats:
        # the exact launch configs _prepare resolves (tuned entry or heuristic, + GLM5_FASTPATH_FP8_GEMM_PIPE), so the
        # wgmma options (pipe, cluster reduce, persistent launch) are loaded too; _kernel dedups equal kernels
        for epi, n, k in _glm_shapes(cfg):
            for e in ((epi, EPI_PLAIN) if epi in (EPI_QKV_A, EPI_IDX_K) else (epi,)):
                for m in range(1, MAX_M + 1):
                    c = with_env_pipe(config_for(m, n, k, e, sms, env_impl(e), cc), e)
                    _kernel(c, dev, w)
                    if rotate and e in ROT_EPIS and cfg.index_head_dim in ROT_SIZES:
                        _kernel(rotated(c, cfg.index_head_dim), dev, w)
    for epi, n, k in _glm_shapes(cfg):
        _workspace(epi, n, k, dev)
        _workspace(EPI_PLAIN, n, k, dev)
    _table_for(cfg, dev)
    if cfg.qk_rope_head_dim % 8 == 0:  # B0 split mode's row kernel (its plain GEMM variants are above)
        for w in wait_ats:
            _row_kernel(cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, dev, w)


def precompile_plain(shapes, max_m: int = 64, device: object = None) -> None:
    """Compile (or fetch) and load the plain-GEMM kernels that fp8_gemm_skinny resolves to for every M in
    1..max_m at each (N, K) of `shapes`, and allocate their split-K workspaces, on `device`: for callers outside
    the prefix (integrations/sglang/linear_route, bench fp8-linear), before any CUDA-graph capture."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    sms, cc, impl = _sms(dev), _cc(dev), env_impl(EPI_PLAIN)
    for n, k in shapes:
        for m in range(1, min(int(max_m), MAX_M) + 1):
            _kernel(with_env_pipe(config_for(m, int(n), int(k), EPI_PLAIN, sms, impl, cc)), dev)
        _workspace(EPI_PLAIN, int(n), int(k), dev)


def compile_check_specs() -> list[KernelSpec]:
    """Every launcher variant: all token blocks x epilogues of both mainloops at their default stage
    counts, every tuned-table entry, and the wgmma variants the GLM-5 shapes pick by heuristic."""
    base = {("mma", tm, STAGES[tm], epi, 1) for epi in EPI_NAMES for tm in TOKEN_BLOCKS}
    base |= {("wgmma", tm, WGMMA_STAGES[tm], epi, 1) for epi in EPI_NAMES for tm in token_blocks("wgmma", epi)}
    tuned = {(e["impl"], e["tm"], e["stages"], epi, e["minb"]) for epi, name in EPI_NAMES.items()
             for (ename, _, _), es in _tuned_entries(132).items() if ename == name for e in es}
    heur = _variants(Glm5Config.preset("glm5"), 132, "wgmma")
    # wgmma options (pipe=1: tm <= PIPE_MAX_TM; cluster split-K) for every epilogue at two token blocks
    opts = [kernel_spec(tm, WGMMA_STAGES[tm], epi, impl="wgmma", pipe=pp, reduce=rd) for epi in EPI_NAMES
            for tm in (16, 64) for pp, rd in ((1, "global"), (0, "cluster"), (1, "cluster"))]
    opts += [kernel_spec(128, WGMMA_STAGES[128], EPI_PLAIN, impl="wgmma", reduce="cluster")]
    # the opt-in launch options: stage pairs (pipe=2) and the persistent launch, one plain variant each
    opts += [kernel_spec(8, WGMMA_STAGES[8], EPI_PLAIN, impl="wgmma", pipe=2),
             kernel_spec(8, WGMMA_STAGES[8], EPI_PLAIN, impl="wgmma", persist=True),
             kernel_spec(16, 6, EPI_PLAIN, impl="wgmma", reduce="cluster", phases=True),  # bench gemm-phases
             kernel_spec(16, 6, EPI_PLAIN, impl="wgmma", reduce="cluster", wkb=True),  # k-block-major weights
             kernel_spec(8, WGMMA_STAGES[8], EPI_PLAIN, 1, DIAG_LOADS_ONLY, "wgmma", wkb=True)]
    return [kernel_spec(tm, st, epi, minb=mb, impl=impl) for impl, tm, st, epi, mb in sorted(base | tuned | heur)] + \
        opts + _row_specs() + rotated_specs()


def rotated_specs() -> list[KernelSpec]:
    """The D1 / B1 kernels with the Hadamard rotation option: every token block of both mainloops at the GLM-5
    index head dim (128, stages as `rotated` fits them), the ones the GLM-5 shapes pick (tuned table / both
    heuristics), and the small preset's 64-point rotation at two token blocks."""
    glm5 = Glm5Config.preset("glm5")
    rot = glm5.index_head_dim
    out: set[tuple[str, int, int, int, int, int]] = set()
    for epi, n, k in _glm_shapes(glm5):
        if epi not in ROT_EPIS:
            continue
        for impl in IMPLS:
            for tm in token_blocks(impl, epi):
                st = STAGES[tm] if impl == "mma" else wgmma_stages(tm, -(-k // 128), epi=epi)
                c = rotated(SkinnyConfig(epi, 1, n, k, tm, 1, st, impl=impl), rot)
                out.add((c.impl, c.tm, c.stages, c.epi, c.minb, c.rot))
    for impl in (None, "mma", "wgmma"):
        out |= _rotated_variants(glm5, 132, impl)
    small = Glm5Config.preset("small")
    for epi in ROT_EPIS:
        for impl, tm in (("mma", 8), ("wgmma", 32)):
            out.add((impl, tm, STAGES[tm] if impl == "mma" else WGMMA_STAGES[tm], epi, 1, small.index_head_dim))
    return [kernel_spec(tm, st, epi, minb=mb, impl=impl, rot=rot) for impl, tm, st, epi, mb, rot in sorted(out)]


__all__ = ["DIAG_LOADS_ONLY", "DIAG_NO_LOADS", "DIAG_NO_REDUCE", "DIAG_OFF", "Fp8GemmInputError", "SkinnyConfig",
           "B0_DEFAULT_MODE", "B0_MODES", "IMPLS", "IMPL_ENV", "PIPES", "PIPE_ENV", "b0_mode", "b0_qkv_a", "b1_indexer_k",
           "compile_check_specs", "config_for", "d0_q_b", "d1_indexer_q", "default_impl", "diag_specs", "env_impl",
           "env_pipe", "estimate_us", "forced_config", "fp8_gemm_skinny", "grid_cap", "stage_cap", "phase_build",
           "read_phases", "reset_phases", "PHASE_NAMES", "precompile", "rope_table", "rotated", "rotated_specs",
           "tensor_maps", "kblock_major", "weight_rows",
           "wgmma_supported", "with_env_pipe"]
