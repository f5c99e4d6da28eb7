"""E1: paged FP8 indexer logits (the DSA indexer's MQA scores), as torch.library custom ops.

Math (the reference is glm5_fastpath.ref.prefix.e1_indexer_logits, same positional signature):

    logits[m, t] = s_k[t] * sum_h head_w[m, h] * max(sum_d q8[m, h, d] * k8[t, d], 0)   t < seq_lens[m]
    logits[m, t] = -inf                                                              t >= seq_lens[m]

where logical token t of row m is row t % 64 of physical page block_table[m, t // 64] of the
index-K cache, a page being [64 x D e4m3][64 x fp32 s_k] (8448 B for D = 128). Products of the
fp8 values are exact; sums are fp32 (tensor-core accumulation over d, then an FMA chain + a fixed
shuffle tree over h), so the result is deterministic and matches the reference to ~1e-7 relative.
ReLU propagates NaN like torch.clamp_min.

Inputs (GLM-5: H = 32 heads, D = 128; the small preset's 4 x 64 works too; any H <= 32 with
D in {64, 128} is supported):
- q_fp8 [M, H, D] float8_e4m3fn, contiguous, 16-byte aligned.
- head_w [M, H] float32, contiguous (the folded head weights of D1).
- index_k_cache [num_pages, 64 * (D + 4)] uint8, contiguous, 16-byte aligned: one 64-token page
  per row (SGLang's index page size must be 64).
- seq_lens [M] int32 contiguous; block_table [M, P] int32 with unit column stride (any row stride).
  Only block-table entries of pages holding live tokens are read; the rest may hold anything.
- Output: [M, max_ctx] float32, contiguous.

Width of the output, and host syncs:
- max_ctx=None (the reference's contract): max_ctx = max(seq_lens), computed on the host, i.e.
  ONE device sync (torch.aminmax(...).tolist()), which also checks 0 <= seq_lens <= 64 * P.
- max_ctx=N (or out= a [M, N] buffer): no sync, CUDA-graph capturable. Columns
  [seq_lens[m], N) are -inf. N must be <= 64 * P. seq_lens cannot be checked without a sync, so
  the kernel clamps each to [0, N]: a row longer than N yields its first N logits.
- A live page whose block-table entry lies outside [0, num_pages) is never dereferenced: its
  tokens' logits are NaN (top-k's reference then raises "NaN at a live position").

Ops (namespace glm5_fastpath; each with a fake implementation for torch.compile / graphs):
- torch.ops.glm5_fastpath.e1_indexer_logits(q_fp8, head_w, index_k_cache, seq_lens, block_table,
  max_ctx, pages_per_split=0, pdl=True, meta_before_wait=True, pdl_wait_at=2) -> float32 [M, max_ctx]
- torch.ops.glm5_fastpath.e1_indexer_logits_out(q_fp8, head_w, index_k_cache, seq_lens, block_table,
  logits, pages_per_split=0, pdl=True, meta_before_wait=True, pdl_wait_at=2) -> None (max_ctx = logits.shape[1])

The Python entry point `e1_indexer_logits(q_fp8, head_w, index_k_cache, seq_lens, block_table, cfg,
*, max_ctx=None, out=None, pages_per_split=None, pdl=True, meta_before_wait=True, pdl_wait=None)` picks one.

Kernel (csrc/attn_pre/e1_indexer_logits.{cuh,cu}): grid (KV splits, M), one CTA of 128 threads
per split of `pages_per_split` pages (chosen by `plan_pages_per_split` so that ~4 CTAs per SM
cover the batch; each SM then has ~16 pages = 135 KB in flight). Thread 0 streams pages
global -> shared with the bulk copy engine, 4 pages ahead; 4 warps compute the 32 heads x 64
tokens of each page with mma.sync m16n8k16 on exactly-converted f16 operands (q stays in
registers), and the CTA writes its columns coalesced, -inf included.
A bulk-copy + wgmma rewrite (commit 9b62ba4) measured slower on the H200 at every M and was not kept.
Nor was an fp8 mma.sync path (commit 877e986: m16n8k32 e4m3 on the raw bytes, no conversion, each 32-product
MMA promoted into fp32; as accurate, 8e-8): on the H200 it took 3.02 / 9.37 / 26.89 / 95.54 us at M = 1 / 16 /
64 / 256 against this kernel's 3.45 / 8.73 / 24.66 / 83.24 in the same run (124 registers against 94;
benchmarks/results/2026-11-30_h200_session9/c2_877e986).

PDL: the kernel is launched with Programmatic Dependent Launch by default (pdl=True). q_fp8 and
head_w (D1) and the cache (B1) are the preceding kernels' outputs: none is read before
griddepcontrol.wait. With meta_before_wait=True (default) it reads seq_lens / block_table and
L2-prefetches its first pages BEFORE the wait (the prefetch returns no data, and L2 is coherent,
so it is safe while B1 still writes). That is valid only when no kernel that may still be running
writes seq_lens / block_table (step metadata written before the step's first kernel, as in
SGLang's graph replay); pass meta_before_wait=False otherwise.
pdl_wait ("entry" | "after_prologue" | "after_prefetch"; None = native) moves the first
griddepcontrol.wait (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a separate cubin) for the CMP
benchmark's PDL decomposition: "entry" waits before anything; "after_prologue" after the
prologue (with meta_before_wait=True: the block-table reads, the mbarrier init and the CTA
barrier) but before the L2 prefetch of the first pages, which then follows the wait;
"after_prefetch" is the native point. With meta_before_wait=False the native wait already comes
before any read, so "after_prologue" and native are the same.
GLM5_FASTPATH_DISABLE_PDL=1 turns the launch attribute off globally.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, replace

import torch

from ..config import INDEX_K_PAGE_TOKENS, Glm5Config
from ._device import PDL_WAIT_NATIVE, check_wait_at, pdl_wait_code, wait_defines
from ._device import device_index as _device_index, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.e1_indexer_logits"
SOURCE = "attn_pre/e1_indexer_logits.cu"
FUNCTION = "glm5_e1_indexer_logits"
FP8 = torch.float8_e4m3fn
PAGE = INDEX_K_PAGE_TOKENS
THREADS = 128  # 4 warps x 16 tokens of each page
STAGES = 4  # pages in flight per CTA
MAX_PAGES_PER_SPLIT = 16  # sizes the kernel's shared logits buffer (4 KB)
CTAS_PER_SM = 4  # planning target; 94 registers and 38 KB smem allow 5 resident CTAs per SM
DIMS = (64, 128)
MAX_HEADS = 32
_MAX_CTX = 1 << 30  # the kernel's token arithmetic is int32
_MAX_GRID_Y = 65535
_FLAG_META_BEFORE_WAIT = 1

if PAGE != 64:
    raise ImportError(f"{OP}: csrc/attn_pre/e1_indexer_logits.cuh hard-codes 64-token pages; "
                      f"glm5_fastpath.config says INDEX_K_PAGE_TOKENS={PAGE}")


def page_bytes(dim: int) -> int:
    """Bytes of one index-K cache page: 64 x dim e4m3 + 64 fp32 scales (8448 for dim=128)."""
    return PAGE * (dim + 4)


def tile_smem_bytes(dim: int, stages: int = STAGES, max_pages: int = MAX_PAGES_PER_SPLIT) -> int:
    """E1IndexerLogitsTile<., dim, stages, max_pages>::kSmemBytes: the page ring, the logits window, the page ids
    and the mbarriers (the MegaRTP megakernel's E1 family uses its own stages / pages)."""
    logits_off = stages * page_bytes(dim)
    ids_off = logits_off + max_pages * PAGE * 4
    bars_off = (ids_off + max_pages * 4 + 7) // 8 * 8
    return bars_off + stages * 8


@dataclass(frozen=True)
class E1Config:
    heads: int
    dim: int
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory; mirrors E1IndexerLogitsTile::kSmemBytes (the kernel traps if it gets less)."""
        return tile_smem_bytes(self.dim)

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE, defines=(
            ("GLM5_E1_HEADS", str(self.heads)), ("GLM5_E1_DIM", str(self.dim)), ("GLM5_E1_STAGES", str(STAGES)),
            ("GLM5_E1_MAX_PAGES", str(MAX_PAGES_PER_SPLIT)), ("GLM5_E1_THREADS", str(THREADS)))
            + wait_defines(self.wait_at))


def config_for(heads: int, dim: int) -> E1Config:
    """The kernel variant for H heads of dim D: H in [1, 32] (q lives in registers as two 16-row
    MMA tiles), D in {64, 128} (4 lanes x 16 B per 64 dims; D = 256 would need 128 registers of q)."""
    if not (1 <= heads <= MAX_HEADS) or dim not in DIMS:
        raise ValueError(f"{OP}: indexer heads x dim = {heads} x {dim} is not supported: needs 1 <= heads <= "
                         f"{MAX_HEADS} and dim in {DIMS} (GLM-5: 32 x 128, small preset: 4 x 64)")
    return E1Config(heads, dim)


def plan_pages_per_split(m: int, max_ctx: int, num_sms: int, pages_per_split: int | None = None) -> int:
    """Pages per CTA: the whole batch's pages (sized by max_ctx) spread over CTAS_PER_SM CTAs per SM,
    at least 1, at most MAX_PAGES_PER_SPLIT (the shared logits buffer) and one row's pages.

    Why: ~4 resident CTAs per SM with 4 pages in flight each keep ~135 KB per SM outstanding
    (Little's law needs ~35 KB at 4.3 TB/s and ~1 us latency), and equal-sized CTAs keep the SMs
    balanced (M=16, L=8192: 4 pages x 512 CTAs, one wave); large batches run 16-page CTAs in
    waves. An explicit pages_per_split is validated and used as given.
    """
    if pages_per_split is not None:
        if isinstance(pages_per_split, bool) or not isinstance(pages_per_split, int) or \
                not 1 <= pages_per_split <= MAX_PAGES_PER_SPLIT:
            raise _fail(f"pages_per_split must be an int in [1, {MAX_PAGES_PER_SPLIT}], got {pages_per_split!r}")
        return pages_per_split
    pages_row = -(-max_ctx // PAGE)
    if m <= 0 or pages_row <= 0:
        return 1
    want = -(-m * pages_row // max(1, num_sms * CTAS_PER_SM))
    return max(1, min(want, MAX_PAGES_PER_SPLIT, pages_row))


def grid_for(m: int, max_ctx: int, pages_per_split: int) -> tuple[int, int, int]:
    return (-(-max_ctx // (pages_per_split * PAGE)), m, 1)


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def _check_tensor(name: str, t: object, dtype: torch.dtype, dim: int, contiguous: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise _fail(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise _fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise _fail(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
    return t


def _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table) -> E1Config:
    _check_tensor("q_fp8", q_fp8, FP8, 3)
    m, h, d = q_fp8.shape
    cfg = config_for(int(h), int(d))
    _check_tensor("head_w", head_w, torch.float32, 2)
    if tuple(head_w.shape) != (m, h):
        raise _fail(f"head_w must have shape {(m, h)} (q_fp8 is {tuple(q_fp8.shape)}), got {tuple(head_w.shape)}")
    _check_tensor("index_k_cache", index_k_cache, torch.uint8, 2)
    if index_k_cache.shape[1] != page_bytes(d):
        raise _fail(f"index_k_cache rows must be one {PAGE}-token page of {PAGE} x ({d} + 4) = {page_bytes(d)} bytes "
                    f"for head dim {d}, got {index_k_cache.shape[1]} (another page size or head dim?)")
    _check_tensor("seq_lens", seq_lens, torch.int32, 1)
    if seq_lens.shape[0] != m:
        raise _fail(f"seq_lens must have shape ({m},), got {tuple(seq_lens.shape)}")
    _check_tensor("block_table", block_table, torch.int32, 2, contiguous=False)
    if block_table.shape[0] != m:
        raise _fail(f"block_table must have {m} rows, got shape {tuple(block_table.shape)}")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise _fail(f"block_table must have unit column stride, got strides {block_table.stride()}")
    devices = {t.device for t in (q_fp8, head_w, index_k_cache, seq_lens, block_table)}
    if len(devices) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if m > _MAX_GRID_Y:
        raise _fail(f"M={m} sequences exceeds the grid limit {_MAX_GRID_Y}")
    return cfg


def _check_max_ctx(max_ctx: object, block_table: torch.Tensor) -> int:
    if isinstance(max_ctx, torch.SymInt):  # symbolic under torch.compile: checked when it runs
        return max_ctx
    if isinstance(max_ctx, bool) or not isinstance(max_ctx, int):
        raise _fail(f"max_ctx must be an int, got {type(max_ctx).__name__}")
    cap = block_table.shape[1] * PAGE
    if not 0 <= max_ctx <= min(cap, _MAX_CTX):
        raise _fail(f"max_ctx={max_ctx} must be in [0, {min(cap, _MAX_CTX)}]: the block table holds "
                    f"{block_table.shape[1]} pages x {PAGE} = {cap} tokens")
    return max_ctx


def _check_out(out: object, m: int, device: torch.device) -> int:
    _check_tensor("out", out, torch.float32, 2)
    if out.shape[0] != m:
        raise _fail(f"out must have {m} rows, got shape {tuple(out.shape)}")
    if out.device != device:
        raise _fail(f"out is on {out.device}, the inputs on {device}")
    return int(out.shape[1])


def _host_max_ctx(seq_lens: torch.Tensor, block_table: torch.Tensor) -> int:
    """max(seq_lens) with ONE device sync; also checks 0 <= seq_lens <= block-table capacity."""
    if seq_lens.device.type == "meta":
        raise _fail("max_ctx=None needs the values of seq_lens (a host sync); pass max_ctx= with meta/fake tensors")
    if seq_lens.numel() == 0:
        return 0
    lo, hi = torch.stack(torch.aminmax(seq_lens)).tolist()
    cap = block_table.shape[1] * PAGE
    if lo < 0:
        raise _fail(f"seq_lens has a negative entry ({lo})")
    if hi > cap:
        raise _fail(f"max(seq_lens)={hi} exceeds the block table capacity {block_table.shape[1]} pages x {PAGE} = {cap} tokens")
    return hi


# ---- device checks and launch ---------------------------------------------------------------------

_num_sms: dict[int, int] = {}




def _check_device(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits) -> int:
    """Real-launch checks: a CUDA sm_90+ device, aligned data. Returns the device's SM count."""
    dev = q_fp8.device
    idx = require_hopper(OP, dev, _fail)
    for name, t, align in (("q_fp8", q_fp8, 16), ("index_k_cache", index_k_cache, 16), ("head_w", head_w, 4),
                           ("seq_lens", seq_lens, 4), ("block_table", block_table, 4), ("logits", logits, 4)):
        if t.numel() and t.data_ptr() % align:
            raise _fail(f"{name} data must be {align}-byte aligned (got address {t.data_ptr():#x}; a sliced view?)")
    sms = _num_sms.get(idx)
    if sms is None:
        sms = _num_sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


def _kernel_args(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split: int,
                 meta_before_wait: bool) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/e1_indexer_logits.cu order (checked at load)."""
    return (q_fp8, head_w, index_k_cache, seq_lens, block_table, logits,
            ctypes.c_int64(index_k_cache.shape[0]), ctypes.c_int64(block_table.stride(0)),
            ctypes.c_int32(block_table.shape[1]), ctypes.c_int32(logits.shape[1]), ctypes.c_int32(pages_per_split),
            ctypes.c_int32(_FLAG_META_BEFORE_WAIT if meta_before_wait else 0))


_kernels: dict[tuple[E1Config, int], object] = {}


def _kernel(cfg: E1Config, device: torch.device):
    idx = _device_index(device)
    k = _kernels.get((cfg, idx))
    if k is None:
        from ..jit.runtime import get_kernel
        k = get_kernel(cfg.spec, device=idx)
        k.set_max_dynamic_smem(cfg.smem_bytes)
        _kernels[(cfg, idx)] = k
    return k


def _launch(cfg: E1Config, q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split: int,
            pdl: bool, meta_before_wait: bool, wait_at: int = PDL_WAIT_NATIVE) -> None:
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    sms = _check_device(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits)
    m, max_ctx = logits.shape
    if m == 0 or max_ctx == 0:
        return
    pps = plan_pages_per_split(m, max_ctx, sms, pages_per_split or None)
    grid = grid_for(m, max_ctx, pps)
    env.print_config("e1_indexer_logits", {"M": m, "max_ctx": max_ctx, "H": cfg.heads, "D": cfg.dim},
                     {"pages_per_split": pps, "grid": grid, "threads": THREADS, "stages": STAGES,
                      "smem": cfg.smem_bytes, "pdl_wait_at": cfg.wait_at})
    _kernel(cfg, q_fp8.device).launch(grid, (THREADS, 1, 1), _kernel_args(
        q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pps, meta_before_wait),
        smem=cfg.smem_bytes, pdl=pdl)


def _check_pps(pages_per_split: int) -> None:
    if pages_per_split != 0:
        plan_pages_per_split(1, 1, 1, pages_per_split)  # validates


# ---- custom ops -----------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::e1_indexer_logits", mutates_args=())
def _e1_indexer_logits(q_fp8: torch.Tensor, head_w: torch.Tensor, index_k_cache: torch.Tensor, seq_lens: torch.Tensor,
                       block_table: torch.Tensor, max_ctx: int, pages_per_split: int = 0, pdl: bool = True,
                       meta_before_wait: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg = _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table)
    _check_max_ctx(max_ctx, block_table)
    _check_pps(pages_per_split)
    check_wait_at(OP, pdl_wait_at)
    logits = torch.empty((q_fp8.shape[0], max_ctx), dtype=torch.float32, device=q_fp8.device)
    _launch(cfg, q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split, pdl, meta_before_wait,
            pdl_wait_at)
    return logits


@_e1_indexer_logits.register_fake
def _e1_indexer_logits_fake(q_fp8, head_w, index_k_cache, seq_lens, block_table, max_ctx, pages_per_split=0,
                            pdl=True, meta_before_wait=True, pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table)
    check_wait_at(OP, pdl_wait_at)
    _check_max_ctx(max_ctx, block_table)
    _check_pps(pages_per_split)
    return q_fp8.new_empty((q_fp8.shape[0], max_ctx), dtype=torch.float32)


@torch.library.custom_op("glm5_fastpath::e1_indexer_logits_out", mutates_args=("logits",))
def _e1_indexer_logits_out(q_fp8: torch.Tensor, head_w: torch.Tensor, index_k_cache: torch.Tensor,
                           seq_lens: torch.Tensor, block_table: torch.Tensor, logits: torch.Tensor,
                           pages_per_split: int = 0, pdl: bool = True, meta_before_wait: bool = True,
                           pdl_wait_at: int = PDL_WAIT_NATIVE) -> None:
    cfg = _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table)
    _check_max_ctx(_check_out(logits, q_fp8.shape[0], q_fp8.device), block_table)
    _check_pps(pages_per_split)
    check_wait_at(OP, pdl_wait_at)
    _launch(cfg, q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split, pdl, meta_before_wait,
            pdl_wait_at)


@_e1_indexer_logits_out.register_fake
def _e1_indexer_logits_out_fake(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split=0,
                                pdl=True, meta_before_wait=True, pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table)
    check_wait_at(OP, pdl_wait_at)
    _check_max_ctx(_check_out(logits, q_fp8.shape[0], q_fp8.device), block_table)
    _check_pps(pages_per_split)


def e1_indexer_logits(q_fp8: torch.Tensor, head_w: torch.Tensor, index_k_cache: torch.Tensor, seq_lens: torch.Tensor,
                      block_table: torch.Tensor, cfg: Glm5Config, *, max_ctx: int | None = None,
                      out: torch.Tensor | None = None, pages_per_split: int | None = None, pdl: bool = True,
                      meta_before_wait: bool = True, pdl_wait: str | None = None) -> torch.Tensor:
    """Paged FP8 indexer logits -> float32 [M, max_ctx]; see the module docstring for the math.

    cfg: the model config; q_fp8 must be [M, cfg.index_n_heads, cfg.index_head_dim].
    max_ctx: output width. None -> max(seq_lens) with one host sync (the reference's contract);
        an int -> no sync (CUDA graphs), columns past each row's seq_len are -inf.
    out: a float32 [M, N] buffer to write (N is the width; max_ctx, if also given, must equal N).
    pages_per_split: 64-token pages per CTA (1..16); None -> plan_pages_per_split.
    pdl / meta_before_wait / pdl_wait: see the module docstring (PDL); pdl_wait None = native.
    Returns the logits (`out` itself when given).
    """
    wait_at = pdl_wait_code(OP, pdl_wait, _fail)
    if not isinstance(cfg, Glm5Config):
        raise _fail(f"cfg must be a Glm5Config, got {type(cfg).__name__}")
    _check_inputs(q_fp8, head_w, index_k_cache, seq_lens, block_table)
    want = (cfg.index_n_heads, cfg.index_head_dim)
    if tuple(q_fp8.shape[1:]) != want:
        raise _fail(f"q_fp8 must be [M, {want[0]}, {want[1]}] for this config (index_n_heads x index_head_dim), "
                    f"got {list(q_fp8.shape)}")
    pps = 0 if pages_per_split is None else plan_pages_per_split(1, 1, 1, pages_per_split)
    if out is not None:
        width = _check_out(out, q_fp8.shape[0], q_fp8.device)
        if max_ctx is not None and (isinstance(max_ctx, bool) or max_ctx != width):
            raise _fail(f"max_ctx={max_ctx} but out has {width} columns")
        torch.ops.glm5_fastpath.e1_indexer_logits_out(q_fp8, head_w, index_k_cache, seq_lens, block_table, out, pps,
                                                      pdl, meta_before_wait, wait_at)
        return out
    if max_ctx is None:
        max_ctx = _host_max_ctx(seq_lens, block_table)
    _check_max_ctx(max_ctx, block_table)
    return torch.ops.glm5_fastpath.e1_indexer_logits(q_fp8, head_w, index_k_cache, seq_lens, block_table, max_ctx, pps,
                                                     pdl, meta_before_wait, wait_at)


def precompile(device: object = None, configs: tuple[tuple[int, int], ...] = ((32, 128),),
               wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,)) -> None:
    """Compile (or fetch from cache) and load the kernels for these (heads, dim) on `device`, for each PDL
    wait point in `wait_ats`."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h, d in configs:
        for w in wait_ats:
            _kernel(replace(config_for(h, d), wait_at=w), dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: GLM-5 (32 x 128) and the small preset (4 x 64)."""
    return [config_for(h, d).spec for h, d in ((32, 128), (4, 64))]


def floor_us(m: int, kv_len: int, cfg: Glm5Config | None = None) -> float:
    """E1's memory floor (glm5_fastpath.cost) for M sequences of kv_len tokens, in microseconds."""
    from .. import cost
    from ..config import Glm5Config as _C
    c = cfg if cfg is not None else _C.preset("glm5")
    rows = cost.prefix_costs(c, m, kv_len)
    return next(r for r in rows if r.name == "E1.logits").t_mem_us()

