"""Split-KV sparse MLA decode (the DSA attention core for small token counts), as a torch.library custom op.

Replaces SGLang's `flash_mla_sparse_fwd(q, kv, indices[:, None, :], sm_scale, d_v)` (one KV head) where FlashMLA's
one-CTA-per-(token, 64 heads) kernel leaves most SMs idle: at 1-16 tokens the 2048 selected slots of a token are
spread over many CTAs and merged by a small combine kernel. The SGLang seam is
glm5_fastpath/integrations/sglang/attn_core.py.

Math (glm5_fastpath.ref.attn_core.sparse_mla_flat, which the CPU path runs):

    o[t, h, :] = sum_j softmax_j(sm_scale * q[t, h, :] . kv[idx[t, j], :]) * kv[idx[t, j], :d_v]

over the valid j (idx[t, j] >= 0); a token without a valid index gives zeros. lse[t, h] = log sum_j exp(sm_scale *
score) (natural log, -inf for an empty row).

Inputs:
- q [T, H, D] bf16, last dim contiguous; H a positive multiple of 16 (GLM-5: 64 at TP1, 32 / 16); T may be 0
  (empty output, nothing launched). On the GPU the token / head strides must be multiples of 8 elements.
- kv [S, 1, D] or [S, D] bf16 (SGLang's MLA key buffer: one row per KV slot, the first d_v columns are also V),
  last dim contiguous, S >= 1; on the GPU the row stride must be a multiple of 8 elements (16-byte rows).
- indices [T, K] int32, last dim contiguous, 1 <= K <= 2048; entries are slot ids in [0, S) or -1, anywhere in
  the row. (Outside the contract: the kernel treats any entry outside [0, S) as unused, for memory safety; the
  CPU reference raises IndexError for an entry >= S.)
- sm_scale: a finite float; d_v: 512, with D = d_v + 64 = 576 (the one build: GLM-5's latent + RoPE dims).
Outputs: o [T, H, d_v] bf16 contiguous; lse [T, H] fp32 (return_lse=True).

Op (namespace glm5_fastpath, with a fake implementation for torch.compile / FakeTensorMode):
- torch.ops.glm5_fastpath.sparse_mla_decode(q, kv, indices, sm_scale, d_v=512, pdl=True, num_splits=None,
  stages=None) -> (o, lse), functional.
Python entry point: `sparse_mla_decode(q, kv, indices, sm_scale, d_v=512, *, pdl=True, num_splits=None,
stages=None, return_lse=False) -> o` (or (o, lse)).
stages: the split kernel's gather ring depth, a separate cubin per value (GLM5_SPARSE_MLA_STAGES): 2 (default,
GPU-tested and measured: 93696 B, 2 CTAs per SM) or 5 (206 KB, 1 CTA per SM, four blocks in flight, for the
latency-bound 1-8 token case; GPU-tested 2026-11-30, bitwise equal to the default build; 12.3 / 14.7 / 20.8 / 31.9
against 11.9 / 17.6 / 21.7 / 29.5 us at T = 1 / 2 / 4 / 8 on an H200, so it stays opt-in). None = DEFAULT_STAGES.

Split tiles (`kernel=`, KERNEL_CHOICES; default "auto"): "mma" = the kernels below (16 heads per CTA); "wgmma" = one
CTA per (token, split) for 64 heads on warpgroup MMAs (SparseMlaSplitWgmmaTile, H % 64 == 0, glm5_sparse_mla_split_wgmma:
grid (T, splits, H / 64), 256 threads, 202 KB, 1 CTA per SM; split_plan with head_block 64, per_sm 1 and
wgmma_min_blocks), the same partials and combine; with 2 splits it merges them in a 2-CTA cluster and writes o / lse
itself (WGMMA_CLUSTER). "auto" = wgmma from WGMMA_AUTO_MIN_TOKENS tokens where H allows it. H200, same run (session 25
c7): mma / wgmma / FlashMLA 13.5 / 13.2 / 56.2 us at T = 1, 28.6 / 22.7 / 59.9 at 8, 47.9 / 28.7 / 60.6 at 16, 87.9 /
43.2 / 62.4 at 32. The combine kernel is COMBINE ("warp": one warp per (token, head, 128 columns), the default since
session 25; "cta": the original below).

Kernels (csrc/attn_core/sparse_mla_decode.{cuh,cu}, design in the header):
- stage 1 glm5_sparse_mla_split, grid (T, num_splits, H / 16), 128 threads, 93696 B dynamic shared memory
  in the default build (2 CTAs per SM; split_smem(stages) in general): one token, 16 heads, one contiguous chunk of the K index columns in blocks of 32 slots; gathers
  the rows with cp.async (invalid rows zero-filled, scores masked to -inf), S = Q K^T and O += P V with mma.sync
  m16n8k16 bf16 (fp32 accumulation, P rounded to bf16), online softmax in exp2; writes O / l (fp32) and the
  split's lse to a workspace.
- stage 2 glm5_sparse_mla_combine, grid (T, H, 2), 256 threads: log-sum-exp weights over the splits, o in bf16
  (zeros where every split was empty).
num_splits is a kernel argument (one cubin for every T / K); None picks split_plan(): enough CTAs to cover the
SMs twice (T * H/16 * splits >= 2 * SMs), each split at least MIN_BLOCKS_PER_SPLIT (4) 32-slot blocks (measured on
the H200), then evened out so no split is empty. An explicit num_splits may be 1..64 (splits past the last block are empty:
they write lse = -inf and are skipped by the combine).
PDL: both kernels let their dependents launch at entry; stage 1 reads q / indices / kv only after
griddepcontrol.wait (the producer may have just written the current token's KV row), stage 2 reads the
workspace only after its own wait. GLM5_FASTPATH_DISABLE_PDL=1 turns the attribute off globally.
Workspace: allocated per call with torch.empty (the caching allocator: no host sync, fine under CUDA-graph
capture, where it comes from the graph's private pool), T * splits * H * (512 + 1) fp32, i.e. ~2 KB per head
of every stage-1 CTA (32 KB per CTA): 2.1 MB at T = 1, H = 64 (16 splits), 10.5 MB at T = 16 (5 splits).
Deterministic: fixed reduction orders everywhere, no atomics; repeated calls give the same bits.
Accuracy: P and V enter the MMA in bf16 (as in FlashMLA), so o differs from the float64 reference by about the
bf16 rounding of P (relative L2 typically ~2e-3; the GPU tests allow 1e-2).

Errors: wrong type / dtype / shape / stride / device, H not a multiple of 16, D != d_v + 64 or d_v != 512,
K outside 1..2048, a bad num_splits / sm_scale / pdl -> SparseMlaInputError (a ValueError) whose message starts
with "glm5_fastpath.sparse_mla_decode: "; a pre-sm_90 GPU -> RuntimeError.
"""
from __future__ import annotations

import ctypes
import math
from typing import NamedTuple, Optional

import torch

from ..jit import KernelSpec, env
from ._device import device_index as _device_index, require_aligned, require_hopper

OP = "glm5_fastpath.sparse_mla_decode"
SOURCE = "attn_core/sparse_mla_decode.cu"
FUNCTION_SPLIT = "glm5_sparse_mla_split"
FUNCTION_COMBINE = "glm5_sparse_mla_combine"
FUNCTION_SPLIT_WGMMA = "glm5_sparse_mla_split_wgmma"
FUNCTION_COMBINE_WARP = "glm5_sparse_mla_combine_warp"
FUNCTION_SPLIT_PP = "glm5_sparse_mla_split_pp"
SPEC = KernelSpec("glm5_sparse_mla_decode", source=SOURCE,
                  functions=(FUNCTION_SPLIT, FUNCTION_COMBINE, FUNCTION_SPLIT_WGMMA, FUNCTION_COMBINE_WARP,
                             FUNCTION_SPLIT_PP))


def spec_for(stages: int) -> KernelSpec:
    """The cubin of one ring depth: the default build is SPEC (its cache entry unchanged), others add the define."""
    if stages == 2:
        return SPEC
    return KernelSpec(f"glm5_sparse_mla_decode_s{stages}", source=SOURCE,
                      functions=(FUNCTION_SPLIT, FUNCTION_COMBINE, FUNCTION_COMBINE_WARP),
                      defines={"GLM5_SPARSE_MLA_STAGES": stages})


BF16 = torch.bfloat16

# Compile-time constants of csrc/attn_core/sparse_mla_decode.cuh (SparseMlaSplitTile / SparseMlaCombineTile).
D_V = 512
ROPE_DIM = 64
D_QK = D_V + ROPE_DIM
HEAD_BLOCK = 16          # heads per CTA (HB)
BLOCK = 32               # slots per inner iteration
MAX_TOPK = 2048
MAX_SPLITS = MAX_TOPK // BLOCK  # 64: the combine's shared lse array
MIN_BLOCKS_PER_SPLIT = 4  # split_plan: fewer, longer splits beat 1-block splits at T = 1 (H200, 2026-11-29)
SPLIT_THREADS = 128
STAGE_CHOICES = (2, 5)   # builds of the split kernel's gather ring (GLM5_SPARSE_MLA_STAGES)
DEFAULT_STAGES = 2


def split_smem(stages: int) -> int:
    """SparseMlaSplitTileT<stages>::kSmemBytes: the ring, the Q staging rows, a bias row per stage."""
    return stages * BLOCK * (D_QK * 2 + 16) + HEAD_BLOCK * (D_QK * 2 + 16) + stages * BLOCK * 4


def ctas_per_sm(stages: int) -> int:
    """SparseMlaSplitTileT<stages>::kMinBlocksPerSm: 2 while the CTA fits in 100 KB, else 1."""
    return 2 if split_smem(stages) <= 100 * 1024 else 1


SPLIT_SMEM = split_smem(DEFAULT_STAGES)  # 93696
COMBINE_THREADS = 256
COMBINE_PARTS = 2        # d_v halves per (token, head): gridDim.z
VEC = 8                  # bf16 per 16-byte copy


# The combine kernel both split tiles hand their partials to: "warp" = SparseMlaCombineWarpTile (one warp per
# (token, head, 128 columns), grid (T, H / 2)), "cta" = SparseMlaCombineTile (one CTA per (token, head, half),
# grid (T, H, 2)). H200, session 25 c6: the cta combine took 3.4 / 6.6 / 7.4 / 10.2 / 14.9 us at T = 1 / 8 / 16 / 32 /
# 64 (wgmma tile's partials); "warp" is the default since c7 (see benchmarks/results/2026-12-01_h200_session25).
COMBINE_CHOICES = ("warp", "cta")
COMBINE = "warp"
COMBINE_WARP_THREADS = 256
COMBINE_WARP_UNITS_PER_CTA = 8   # warps per CTA, each one (head, 128-column slice); 4 slices per head

# The wgmma tile can merge the splits of a token inside thread-block clusters through distributed shared memory
# (SparseMlaSplitWgmmaTileT::cluster_epilogue) instead of the fp32 partial round trip + combine kernel:
#   "pair" (default): a cluster of 2 only when a token has exactly 2 splits, so the cluster writes o / lse itself and no
#          combine runs (H200 session 25 c8 / c9: T = 64, 2 splits: 65.3-66.5 us against 72.2-73.3);
#   "auto": the largest of 8 / 4 / 2 (<= WGMMA_MAX_CLUSTER) dividing the split count: measured SLOWER (c8: clusters of
#          8 / 4 took 40.1 / 51.3 / 74.9 us at T = 8 / 16 / 32 against 22.6 / 28.6 / 42.8 without; c9: clusters of 2
#          within 1-4 % either way when a combine still follows), kept for measuring;
#   "off": no cluster.
WGMMA_CLUSTER_CHOICES = ("pair", "auto", "off")
WGMMA_CLUSTER = "pair"
WGMMA_MAX_CLUSTER = 8


def wgmma_cluster(num_splits: int, mode: str | None = None) -> int:
    """CTAs per cluster along the splits for the wgmma tile (1 = no cluster merge); mode: WGMMA_CLUSTER_CHOICES."""
    m = WGMMA_CLUSTER if mode is None else mode
    if m == "off":
        return 1
    if m == "pair":
        return 2 if num_splits == 2 else 1
    for c in (8, 4, 2):
        if c <= WGMMA_MAX_CLUSTER and num_splits % c == 0:
            return c
    return 1


# The split tiles (csrc/attn_core/sparse_mla_decode.cuh): "mma" = SparseMlaSplitTileT (16 heads per CTA, mma.sync,
# any H % 16 == 0, the ring builds of STAGE_CHOICES); "wgmma" = SparseMlaSplitWgmmaTile (64 heads per CTA on
# warpgroup MMAs, H % 64 == 0, one build). Both write the same partials for the same split boundaries (32-slot
# blocks), so the combine kernel and the split plan's rule are shared. "auto" = wgmma where H allows it.
# "wgmma_pp" (opt-in) = SparseMlaSplitPingPongTile: the same 64 heads per CTA, each warpgroup owning every other
# block's S and softmax step while both run every block's P V (384 threads: a producer warp gathers through an
# mbarrier ring). Correct, but measured 1.1-1.9x slower than "wgmma" on the H200 (session 26: the softmax chain
# serialises the two warpgroups), so auto never picks it.
KERNEL_CHOICES = ("mma", "wgmma", "auto", "wgmma_pp")
DEFAULT_KERNEL = "auto"
WGMMA_HEAD_BLOCK = 64
WGMMA_THREADS = 256
WGMMA_STAGES = 3          # the default build's ring (GLM5_SPARSE_MLA_WGMMA_STAGES; 4 = exchange in the ring, opt-in)
WGMMA_STAGE_CHOICES = (3, 4)
PP_THREADS = 384
PP_STAGES = 3
PP_SMEM = 64 * 1152 + PP_STAGES * 32 * 1152 + 2 * 4096 + 2 * 4096 + PP_STAGES * 32 * 4 + 2 * PP_STAGES * 8 + 1024  # 202160
# "auto" takes the wgmma tile from this many tokens: on the H200 (benchmarks/results/2026-12-01_h200_session25, c1,
# same run) mma / wgmma / FlashMLA took 11.7 / 13.8 (32 splits) / 56.4 us at T = 1, 17.8 / 15.8 / 57.7 at 2,
# 29.5 / 23.2 / 60.1 at 8, 50.3 / 31.1 / 60.6 at 16, 90.7 / 47.4 / 62.5 at 32, 171.9 / 79.3 / 66.5 at 64.
WGMMA_AUTO_MIN_TOKENS = 2


def wgmma_min_blocks(t: int) -> int:
    """split_plan's block minimum for the wgmma tile (H200, session 25 c1 / c2): 2 at T <= 2 (T = 1: 13.8 us with 32
    splits against 15.7 with 16), 4 from T = 4 (T = 4: 19.4 us with 16 splits against 23.0 with 32)."""
    return 2 if t <= 2 else MIN_BLOCKS_PER_SPLIT


def wgmma_smem(stages: int = WGMMA_STAGES) -> int:
    """SparseMlaSplitWgmmaTileT<stages>::kSmemBytes: Q, the ring, the exchange buffer (3 stages only), bias, slack."""
    return 64 * 1152 + stages * 32 * 1152 + (16384 if stages < 4 else 0) + stages * 32 * 4 + 1024


WGMMA_SMEM = wgmma_smem()  # 202112


def wgmma_spec(stages: int = WGMMA_STAGES) -> KernelSpec:
    """The cubin holding the wgmma tile of `stages` (the default build is SPEC)."""
    if stages == WGMMA_STAGES:
        return SPEC
    return KernelSpec(f"glm5_sparse_mla_decode_w{stages}", source=SOURCE,
                      functions=(FUNCTION_SPLIT_WGMMA, FUNCTION_COMBINE, FUNCTION_COMBINE_WARP),
                      defines={"GLM5_SPARSE_MLA_WGMMA_STAGES": stages})


def wgmma_stages() -> int:
    """GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES (3 / 4; default WGMMA_STAGES): the wgmma tile's ring build."""
    raw = (env.text("GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES") or "").strip()
    if not raw:
        return WGMMA_STAGES
    try:
        v = int(raw)
    except ValueError:
        v = -1
    if v not in WGMMA_STAGE_CHOICES:
        raise _fail(f"GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES={raw!r}: one of {WGMMA_STAGE_CHOICES}")
    return v




class SparseMlaInputError(ValueError):
    """sparse_mla_decode got an input of the wrong type / dtype / shape / stride / device, or a bad argument."""


class SplitPlan(NamedTuple):
    num_splits: int
    blocks_per_split: int  # 32-slot blocks per split (the kernel derives the same from K and num_splits)


def _fail(msg: str) -> SparseMlaInputError:
    return SparseMlaInputError(f"{OP}: {msg}")


# ---- validation (shared by the real and the fake implementations) --------------------------------

def resolve_kernel(kernel: object, h: int, t: int = WGMMA_AUTO_MIN_TOKENS, stages: object = None) -> str:
    """The split tile a call with T tokens and H heads runs: "mma", "wgmma" or "wgmma_pp" (KERNEL_CHOICES; None =
    DEFAULT_KERNEL). "auto": wgmma where H % 64 == 0 and T >= WGMMA_AUTO_MIN_TOKENS, else mma; an explicit
    `stages` (a build of the mma tile) makes "auto" mma."""
    k = DEFAULT_KERNEL if kernel is None else kernel
    if not isinstance(k, str) or k not in KERNEL_CHOICES:
        raise _fail(f"kernel must be None (default {DEFAULT_KERNEL!r}) or one of {KERNEL_CHOICES}, got {kernel!r}")
    if k == "auto" and stages is not None:
        return "mma"
    if k == "auto":
        return "wgmma" if h % WGMMA_HEAD_BLOCK == 0 and t >= WGMMA_AUTO_MIN_TOKENS else "mma"
    if k in ("wgmma", "wgmma_pp") and h % WGMMA_HEAD_BLOCK:
        raise _fail(f"kernel={k!r} needs H to be a multiple of {WGMMA_HEAD_BLOCK} (its head block), got H={h}")
    return k


def _check(q: object, kv: object, indices: object, sm_scale: object, d_v: object,
           num_splits: object, stages: object = None, kernel: object = None) -> tuple[int, int, int, int]:
    """-> (T, H, K, S) of valid inputs."""
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        if not isinstance(t, torch.Tensor):
            raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype != BF16:
        raise _fail(f"q must be torch.bfloat16, got {q.dtype}")
    if kv.dtype != BF16:
        raise _fail(f"kv must be torch.bfloat16, got {kv.dtype}")
    if indices.dtype != torch.int32:
        raise _fail(f"indices must be torch.int32, got {indices.dtype}")
    if q.dim() != 3:
        raise _fail(f"q must be 3-D [T, H, D], got shape {tuple(q.shape)}")
    if not (kv.dim() == 2 or (kv.dim() == 3 and kv.shape[1] == 1)):
        raise _fail(f"kv must be [S, 1, D] or [S, D] (one KV head), got shape {tuple(kv.shape)}")
    if indices.dim() != 2:
        raise _fail(f"indices must be 2-D [T, K], got shape {tuple(indices.shape)}")
    t, h, d = q.shape
    s, k = kv.shape[0], indices.shape[1]
    if isinstance(d_v, bool) or not isinstance(d_v, int):
        raise _fail(f"d_v must be an int, got {d_v!r}")
    if d_v != D_V or d != d_v + ROPE_DIM:
        raise _fail(f"D={d}, d_v={d_v} is not supported: the kernel is built for d_v={D_V} and "
                    f"D = d_v + {ROPE_DIM} = {D_QK} (GLM-5's latent + RoPE dims)")
    if kv.shape[-1] != d:
        raise _fail(f"kv rows have {kv.shape[-1]} columns but q has D={d}")
    if h <= 0 or h % HEAD_BLOCK:
        raise _fail(f"H={h} heads is not supported: H must be a positive multiple of {HEAD_BLOCK} (the kernel's head block)")
    if indices.shape[0] != t:
        raise _fail(f"indices has {indices.shape[0]} rows for T={t} tokens of q")
    if not 1 <= k <= MAX_TOPK:
        raise _fail(f"K={k} index columns is not supported: 1 <= K <= {MAX_TOPK}")
    if s < 1:
        raise _fail("kv must have at least one row (slot)")
    if q.stride(2) != 1:
        raise _fail(f"q must have a contiguous last dim (stride 1), got strides {q.stride()} for shape {tuple(q.shape)}")
    if kv.stride(-1) != 1:
        raise _fail(f"kv must have a contiguous last dim (stride 1), got strides {kv.stride()} for shape {tuple(kv.shape)}")
    if k > 1 and indices.stride(1) != 1:
        raise _fail(f"indices must have a contiguous last dim (stride 1), got strides {indices.stride()}")
    if len({q.device, kv.device, indices.device}) != 1:
        raise _fail(f"q, kv and indices must be on one device, got {q.device}, {kv.device}, {indices.device}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise _fail(f"sm_scale must be a finite float, got {sm_scale!r}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_SPLITS):
        raise _fail(f"num_splits must be None (automatic) or an int in 1..{MAX_SPLITS}, got {num_splits!r}")
    if stages is not None and (isinstance(stages, bool) or not isinstance(stages, int) or stages not in STAGE_CHOICES):
        raise _fail(f"stages must be None (default {DEFAULT_STAGES}) or one of {STAGE_CHOICES}, got {stages!r}")
    if resolve_kernel(kernel, h, t, stages) in ("wgmma", "wgmma_pp") and stages is not None:
        raise _fail(f"stages={stages!r} selects a build of the mma split kernel; the wgmma kernel has one build "
                    "(pass stages=None)")
    return t, h, k, s


def unsupported(q: object, kv: object, indices: object, sm_scale: object, d_v: object = D_V) -> str | None:
    """Why the op would refuse these inputs (its validation message), or None: for a caller that routes such
    calls to another kernel instead of raising (integrations/sglang/attn_core.py). The launch-time checks
    (sm_90, 16-byte alignment of the strides) are not included."""
    try:
        _check(q, kv, indices, sm_scale, d_v, None)
    except SparseMlaInputError as e:
        return str(e)
    return None


def _check_pdl(pdl: object) -> None:
    if not isinstance(pdl, bool):
        raise _fail(f"pdl must be a bool, got {pdl!r}")


# ---- split heuristic ---------------------------------------------------------------------------------

def split_plan(t: int, h: int, k: int, num_sms: int, per_sm: int = 2, head_block: int = HEAD_BLOCK,
               min_blocks: int = MIN_BLOCKS_PER_SPLIT) -> SplitPlan:
    """Splits of the K index columns for T tokens, H heads on `num_sms` SMs: as many splits as fit in one wave
    of resident CTAs (T * H/16 * splits <= per_sm * num_sms; a partial second wave would double the time of
    its CTAs), but each split at least MIN_BLOCKS_PER_SPLIT 32-slot blocks (and at least one split), then
    evened out: blocks_per_split = ceil(blocks / splits), splits = ceil(blocks / blocks_per_split), so no split
    is empty. per_sm: CTAs resident per SM, ctas_per_sm(stages) (2 for the default double buffer, 1 for the
    deep ring). The block minimum is measured: on the H200 (bench sparse-mla --splits, 2026-11-29) T = 1 took
    11.6 us with 16 splits of 4 blocks against 17.6 us with 64 splits of 1 (the combine's partials then
    outweigh the gathered rows; 4 splits: 29 us), while T = 2 / 4 / 8 were within 3 % of this rule's choice.
    On 132 SMs, H = 64, K = 2048, per_sm 2: T = 1 -> 16 splits x 4 blocks, T = 2 -> 16 x 4, T = 8 -> 8 x 8,
    T = 16 -> 4 x 16, T = 64 -> 1 x 64. head_block: heads per CTA; min_blocks: the block minimum (the wgmma tile
    passes WGMMA_HEAD_BLOCK, per_sm 1 and wgmma_min_blocks(t): T = 1 -> 32 x 2, T = 4 -> 16 x 4, T = 8 -> 16 x 4,
    T = 16 -> 8 x 8, T = 64 -> 2 x 32)."""
    blocks = max(1, -(-k // BLOCK))
    ctas_per_split = max(1, t * (h // head_block))
    want = max(1, max(1, per_sm) * max(1, num_sms) // ctas_per_split)  # floor: never a partial second wave
    splits = max(1, min(-(-blocks // max(1, min_blocks)), want, MAX_SPLITS))
    bps = -(-blocks // splits)
    return SplitPlan(-(-blocks // bps), bps)


def plan_for(kern: str, t: int, h: int, k: int, num_sms: int, stages: int = DEFAULT_STAGES) -> SplitPlan:
    """The split plan a resolved tile uses (resolve_kernel): the 64-head tiles one CTA per SM with wgmma_min_blocks,
    the mma tile its ring build's CTAs per SM."""
    if kern in ("wgmma", "wgmma_pp"):
        return split_plan(t, h, k, num_sms, 1, WGMMA_HEAD_BLOCK, wgmma_min_blocks(t))
    return split_plan(t, h, k, num_sms, ctas_per_sm(stages))


def parse_split_table(spec: str) -> dict[int, int]:
    """A tuned num_splits table {T: splits}: inline "1:16,8:16" or the path of a JSON file whose "splits" maps
    T to splits (what `glm5-fastpath bench sparse-mla --write-splits` writes). A call with T tokens uses the
    entry of the largest T' <= T (splits_for); T below every entry keeps split_plan(). Bad entries raise
    SparseMlaInputError naming the entry."""
    import json
    import os

    spec = spec.strip()
    if spec.startswith("{") or os.path.isfile(spec):
        try:
            raw = json.loads(spec if spec.startswith("{") else open(spec).read())
        except (OSError, ValueError) as e:
            raise _fail(f"split table {spec!r}: {type(e).__name__}: {e}") from None
        items = list((raw.get("splits", raw) if isinstance(raw, dict) else {}).items())
        if not items:
            raise _fail(f"split table {spec!r}: no 'splits' entries")
    else:
        items = [tuple(e.split(":", 1)) if ":" in e else (e, "") for e in spec.split(",") if e.strip()]
    out: dict[int, int] = {}
    for t, n in items:
        try:
            ti, ni = int(t), int(n)
        except (TypeError, ValueError):
            raise _fail(f"split table entry {t}:{n} is not T:splits (integers)") from None
        if ti < 1 or not 1 <= ni <= MAX_SPLITS:
            raise _fail(f"split table entry {ti}:{ni}: T must be >= 1 and splits in 1..{MAX_SPLITS}")
        out[ti] = ni
    if not out:
        raise _fail(f"split table {spec!r} is empty")
    return out


def splits_for(table: dict[int, int] | None, t: int) -> Optional[int]:
    """The tuned splits for T tokens: the entry of the largest T' <= T, else None (split_plan decides)."""
    keys = [k for k in (table or {}) if k <= t]
    return table[max(keys)] if keys else None


# ---- launch ------------------------------------------------------------------------------------------

_sms_cache: dict[int, int] = {}
_kernels: dict[tuple[int, str, str], object] = {}


def _num_sms(idx: int) -> int:
    n = _sms_cache.get(idx)
    if n is None:
        n = _sms_cache[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


def _load(idx: int, spec: KernelSpec, function: str, smem: int = 0):
    """`function` of the cubin `spec` on device idx, loaded once; smem > 48 KB: the dynamic shared memory opt-in,
    set here once, outside any graph capture."""
    k = _kernels.get((idx, spec.name, function))
    if k is None:
        from ..jit.runtime import get_kernel
        k = get_kernel(spec, function, device=torch.device("cuda", idx))
        if smem:
            k.set_max_dynamic_smem(smem)
        _kernels[(idx, spec.name, function)] = k
    return k


def _kernel(idx: int, function: str, stages: int = DEFAULT_STAGES):
    """A function of the mma tile's ring build `stages` (its split kernel with the ring's shared memory)."""
    return _load(idx, spec_for(stages), function, split_smem(stages) if function == FUNCTION_SPLIT else 0)


def _wgmma_kernel(idx: int, function: str, stages: int):
    """A function of the cubin that holds the 64-head tiles of ring build `stages` (wgmma_spec)."""
    smem = {FUNCTION_SPLIT_WGMMA: wgmma_smem(stages), FUNCTION_SPLIT_PP: PP_SMEM}.get(function, 0)
    return _load(idx, wgmma_spec(stages), function, smem)


def _split_args(q, kv, indices, o_part, lse_part, num_splits: int, sm_scale: float) -> tuple:
    """Stage 1's parameter list, in csrc/attn_core/sparse_mla_decode.cu order (checked at load)."""
    t, h, _ = q.shape
    return (q, kv, indices, o_part, lse_part, ctypes.c_int64(q.stride(0)), ctypes.c_int64(q.stride(1)),
            ctypes.c_int64(kv.stride(0)), ctypes.c_int64(indices.stride(0)), ctypes.c_int64(kv.shape[0]),
            ctypes.c_int32(indices.shape[1]), ctypes.c_int32(num_splits), ctypes.c_int32(h),
            ctypes.c_float(float(sm_scale) * math.log2(math.e)))


def _split_args_wgmma(q, kv, indices, o_part, lse_part, num_splits: int, sm_scale: float, o, lse, cluster: int) -> tuple:
    """The wgmma split kernel's parameters: stage 1's, then o, lse and the cluster size (sparse_mla_decode.cu)."""
    return _split_args(q, kv, indices, o_part, lse_part, num_splits, sm_scale) + (o, lse, ctypes.c_int32(cluster))


class _PpParams(ctypes.Structure):
    """glm5::attn_core::SparseMlaParams (csrc/attn_core/sparse_mla_decode.cuh), the ping-pong kernel's one parameter."""
    _fields_ = [("q", ctypes.c_void_p), ("kv", ctypes.c_void_p), ("indices", ctypes.c_void_p),
                ("o_part", ctypes.c_void_p), ("lse_part", ctypes.c_void_p), ("q_stride_t", ctypes.c_int64),
                ("q_stride_h", ctypes.c_int64), ("kv_stride", ctypes.c_int64), ("idx_stride", ctypes.c_int64),
                ("num_slots", ctypes.c_int64), ("topk", ctypes.c_int32), ("num_splits", ctypes.c_int32),
                ("num_heads", ctypes.c_int32), ("scale_log2", ctypes.c_float), ("o", ctypes.c_void_p),
                ("lse_out", ctypes.c_void_p), ("cluster", ctypes.c_int32)]


def _pp_args(q, kv, indices, o_part, lse_part, num_splits: int, sm_scale: float) -> tuple:
    t, h, _ = q.shape
    return (_PpParams(q.data_ptr(), kv.data_ptr(), indices.data_ptr(), o_part.data_ptr(), lse_part.data_ptr(),
                      q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), kv.shape[0], indices.shape[1],
                      num_splits, h, float(sm_scale) * math.log2(math.e), None, None, 1),)


def _combine_args(o_part, lse_part, o, lse, num_splits: int, h: int) -> tuple:
    return (o_part, lse_part, o, lse, ctypes.c_int32(num_splits), ctypes.c_int32(h))


def _launch(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, o: torch.Tensor,
            lse: torch.Tensor, pdl: bool, num_splits: Optional[int],
            workspace: Optional[tuple[torch.Tensor, torch.Tensor]] = None, stages: Optional[int] = None,
            kernel: Optional[str] = None, cluster: Optional[str] = None) -> None:
    """Real-launch checks (CUDA sm_90+, alignment), the workspace, then both kernels; T = 0 launches nothing.
    workspace: (o_part [T, splits, H, 512], lse_part [T, splits, H]) fp32 contiguous instead of fresh ones (the
    tests poison it to show the combine reads only what stage 1 wrote)."""
    idx = require_hopper(OP, q.device, _fail)
    require_aligned(_fail, {"q": q, "kv": kv})
    t, h, _ = q.shape
    if h > 1 and q.stride(1) % VEC or t > 1 and q.stride(0) % VEC:
        raise _fail(f"q rows must be 16-byte aligned: strides {q.stride()} must be multiples of {VEC} elements "
                    "for the 16-byte copies")
    if kv.shape[0] > 1 and kv.stride(0) % VEC:
        raise _fail(f"kv rows must be 16-byte aligned: the row stride ({kv.stride(0)} elements) must be a multiple "
                    f"of {VEC} for the 16-byte copies")
    if t == 0:
        return
    k = indices.shape[1]
    kern = resolve_kernel(kernel, h, t, stages)
    st = DEFAULT_STAGES if stages is None else stages
    ns = plan_for(kern, t, h, k, _num_sms(idx), st).num_splits if num_splits is None else num_splits
    hb = WGMMA_HEAD_BLOCK if kern in ("wgmma", "wgmma_pp") else HEAD_BLOCK
    cl = wgmma_cluster(ns, cluster) if kern == "wgmma" else 1
    nparts = ns // cl                    # partials the combine merges
    merged = cl > 1 and nparts == 1      # one cluster holds every split: it writes o / lse, no partials, no combine
    env.print_config("sparse_mla_decode", {"T": t, "H": h, "K": k},
                     {"kernel": kern, "num_splits": ns, "grid": (t, ns, h // hb), "auto": num_splits is None,
                      "stages": st if kern == "mma" else WGMMA_STAGES, "cluster": cl})
    if workspace is None:  # per call from the caching allocator: no host sync, capture-safe (module docstring)
        o_part = lse if merged else torch.empty((t, nparts, h, D_V), dtype=torch.float32, device=q.device)
        lse_part = lse if merged else torch.empty((t, nparts, h), dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = workspace
        if (tuple(o_part.shape), tuple(lse_part.shape)) != ((t, nparts, h, D_V), (t, nparts, h)) or not (
                o_part.is_contiguous() and lse_part.is_contiguous()):
            raise _fail(f"workspace must be contiguous fp32 {(t, nparts, h, D_V)} and {(t, nparts, h)}")
    if kern == "wgmma_pp":  # its cubin is the default wgmma build's
        get = lambda f: _wgmma_kernel(idx, f, WGMMA_STAGES)  # noqa: E731
        get(FUNCTION_SPLIT_PP).launch((t, ns, h // WGMMA_HEAD_BLOCK), (PP_THREADS, 1, 1),
                                      _pp_args(q, kv, indices, o_part, lse_part, ns, sm_scale), smem=PP_SMEM, pdl=pdl)
    elif kern == "wgmma":
        ws_ = wgmma_stages()
        get = lambda f: _wgmma_kernel(idx, f, ws_)  # noqa: E731
        get(FUNCTION_SPLIT_WGMMA).launch(
            (t, ns, h // WGMMA_HEAD_BLOCK), (WGMMA_THREADS, 1, 1),
            _split_args_wgmma(q, kv, indices, o_part, lse_part, ns, sm_scale, o, lse, cl), smem=wgmma_smem(ws_),
            pdl=pdl, cluster=(1, cl, 1) if cl > 1 else None)
    else:
        get = lambda f: _kernel(idx, f, st)  # noqa: E731
        get(FUNCTION_SPLIT).launch((t, ns, h // HEAD_BLOCK), (SPLIT_THREADS, 1, 1),
                                   _split_args(q, kv, indices, o_part, lse_part, ns, sm_scale), smem=split_smem(st), pdl=pdl)
    if not merged:
        _launch_combine(get, o_part, lse_part, o, lse, nparts, t, h, pdl)


def _launch_combine(get, o_part, lse_part, o, lse, ns: int, t: int, h: int, pdl: bool, combine: str | None = None) -> None:
    """The combine kernel of COMBINE (or `combine`) from the cubin `get(function)` returns."""
    which = COMBINE if combine is None else combine
    if which == "warp":
        get(FUNCTION_COMBINE_WARP).launch((t, h * 4 // COMBINE_WARP_UNITS_PER_CTA, 1), (COMBINE_WARP_THREADS, 1, 1),
                                          _combine_args(o_part, lse_part, o, lse, ns, h), pdl=pdl)
    else:
        get(FUNCTION_COMBINE).launch((t, h, COMBINE_PARTS), (COMBINE_THREADS, 1, 1),
                                     _combine_args(o_part, lse_part, o, lse, ns, h), pdl=pdl)


def _reference(q, kv, indices, sm_scale: float, d_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    from ..ref.attn_core import sparse_mla_flat
    o, lse = sparse_mla_flat(q, kv, indices, sm_scale, d_v, return_lse=True)
    return o.contiguous(), lse.contiguous()


# ---- custom op ---------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::sparse_mla_decode", mutates_args=())
def _sparse_mla_decode(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = D_V,
                       pdl: bool = True, num_splits: Optional[int] = None,
                       stages: Optional[int] = None, tile: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, _, _ = _check(q, kv, indices, sm_scale, d_v, num_splits, stages, tile)
    if q.device.type == "cpu":
        return _reference(q, kv, indices, sm_scale, d_v)
    o = torch.empty((t, h, d_v), dtype=BF16, device=q.device)
    lse = torch.empty((t, h), dtype=torch.float32, device=q.device)
    _launch(q, kv, indices, sm_scale, o, lse, pdl, num_splits, stages=stages, kernel=tile)
    return o, lse


@_sparse_mla_decode.register_fake
def _sparse_mla_decode_fake(q, kv, indices, sm_scale, d_v=D_V, pdl=True, num_splits=None, stages=None, tile=None):
    t, h, _, _ = _check(q, kv, indices, sm_scale, d_v, num_splits, stages, tile)
    return q.new_empty((t, h, d_v), dtype=BF16), q.new_empty((t, h), dtype=torch.float32)


def sparse_mla_decode(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = D_V, *,
                      pdl: bool = True, num_splits: Optional[int] = None, stages: Optional[int] = None,
                      kernel: Optional[str] = None, return_lse: bool = False):
    """Sparse MLA decode over flat KV slot ids -> o [T, H, d_v] bf16 (module docstring), or (o, lse [T, H] fp32)
    with return_lse=True. The semantics of flash_mla_sparse_fwd(q, kv, indices[:, None, :], sm_scale, d_v).

    pdl: launch both kernels with Programmatic Dependent Launch (GPU only). num_splits: None = split_plan(),
    else 1..64 splits of the K index columns. stages: None (DEFAULT_STAGES) or one of STAGE_CHOICES, the split
    kernel's build (module docstring). kernel: None (DEFAULT_KERNEL) or one of KERNEL_CHOICES: "mma", "wgmma", "auto"
    (resolve_kernel), "wgmma_pp" (opt-in; slower, see KERNEL_CHOICES)."""
    _check(q, kv, indices, sm_scale, d_v, num_splits, stages, kernel)  # before the dispatcher, so errors name this op
    _check_pdl(pdl)
    if not isinstance(return_lse, bool):
        raise _fail(f"return_lse must be a bool, got {return_lse!r}")
    o, lse = torch.ops.glm5_fastpath.sparse_mla_decode(q, kv, indices, float(sm_scale), d_v, pdl, num_splits, stages,
                                                       kernel)
    return (o, lse) if return_lse else o


def precompile(device: object = None, stages: tuple[int, ...] = (DEFAULT_STAGES,)) -> None:
    """Compile (or fetch from cache) and load both kernels of each build in `stages` on `device` (default:
    current), ahead of first use (and of any CUDA-graph capture)."""
    bad = [st for st in stages if type(st) is not int or st not in STAGE_CHOICES]
    if bad:
        raise _fail(f"precompile: stages must be in {STAGE_CHOICES}, got {bad[0]!r}")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    idx = _device_index(dev)
    for st in stages:
        _kernel(idx, FUNCTION_SPLIT, st)
        _kernel(idx, FUNCTION_COMBINE, st)
        _kernel(idx, FUNCTION_COMBINE_WARP, st)
    _wgmma_kernel(idx, FUNCTION_SPLIT_WGMMA, wgmma_stages())
    _wgmma_kernel(idx, FUNCTION_COMBINE, wgmma_stages())
    _wgmma_kernel(idx, FUNCTION_COMBINE_WARP, wgmma_stages())
    _num_sms(idx)


def compile_check_specs() -> list[KernelSpec]:
    """Every build scripts/compile_check.py checks: one per ring depth (T, H, K, the strides and num_splits are
    kernel arguments)."""
    return [spec_for(st) for st in STAGE_CHOICES] + [wgmma_spec(st) for st in WGMMA_STAGE_CHOICES if st != WGMMA_STAGES]
