"""E1: paged FP8 indexer logits (the DSA indexer's MQA scores), as torch.library custom ops.

Math (the reference is glm5_fastpath.ref.prefix.e1_indexer_logits, same positional signature):

    logits[m, t] = s_k[t] * sum_h head_w[m, h] * max(sum_d q8[m, h, d] * k8[t, d], 0)   t < seq_lens[m]
    logits[m, t] = -inf                                                              t >= seq_lens[m]

where logical token t of row m is row t % 64 of physical page block_table[m, t // 64] of the
index-K cache, a page being [64 x D e4m3][64 x fp32 s_k] (8448 B for D = 128). Products of the
fp8 values are exact (e4m3 -> f16 is exact); sums are fp32 (f16 wgmma with fp32 accumulation over d,
then an FMA chain + a fixed shuffle tree over h), so the result is deterministic and matches the
reference to ~1e-7 relative.
ReLU propagates NaN like torch.clamp_min.

Inputs (GLM-5: H = 32 heads, D = 128; the small preset's 4 x 64 works too; any H <= 32 with
D in {64, 128} is supported):
- q_fp8 [M, H, D] float8_e4m3fn, contiguous, 16-byte aligned.
- head_w [M, H] float32, contiguous (the folded head weights of D1).
- index_k_cache [num_pages, 64 * (D + 4)] uint8, contiguous, 16-byte aligned: one 64-token page
  per row (SGLang's index page size must be 64).
- seq_lens [M] int32 contiguous; block_table [M, P] int32 with unit column stride (any row stride).
  Only block-table entries of pages holding live tokens are read; the rest may hold anything.
- Output: [M, max_ctx] float32, contiguous. M * ceil(max_ctx / 64) must stay below 2^31.

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

Kernel (csrc/attn_pre/e1_indexer_logits.{cuh,cu}): a 1-D grid of CTAS_PER_SM CTAs per SM (fewer
when the batch has fewer page slots), each a producer warp + a consumer warpgroup (160 threads,
~68 KB of shared memory, <= 136 registers: 3 CTAs fit an SM, so the next kernel's CTAs can start
under PDL while two of ours run). The batch's live pages (sum of ceil(seq_len / 64)) are split into
equal contiguous shares per CTA inside the kernel (two block scans over seq_lens: no host sync, any
mix of lengths keeps every SM equally busy), and so are the -inf page blocks past each row's
length. The producer streams whole pages (8448 B) global -> shared with the bulk copy engine
through a STAGES-page mbarrier ring (~59 KB in flight per CTA, ~118 KB per SM); the consumer loads
each page into registers (e4m3 -> f16, exact), releases the stage at once and runs 8 wgmma
m64n32k16 (64 tokens x 32 heads, fp32 accumulation) against q in shared memory, then the ReLU +
head-weight epilogue in registers. pages_per_split (1..MAX_PAGES_PER_SPLIT, default auto) overrides
the grid: ceil(M * ceil(max_ctx / 64) / pages_per_split) CTAs (more than fit run in waves). The
result does not depend on the grid, bit for bit.

PDL: the kernel is launched with Programmatic Dependent Launch by default (pdl=True). q_fp8 and
head_w (D1) and the cache (B1) are the preceding kernels' outputs: none is read before
griddepcontrol.wait, and no output is written before it. With meta_before_wait=True (default) it
reads seq_lens / block_table (work split, page ids) and L2-prefetches its first pages BEFORE the
wait (the prefetch returns no data, and L2 is coherent, so it is safe while B1 still writes). That
is valid only when no kernel that may still be running writes seq_lens / block_table (step metadata
written before the step's first kernel, as in SGLang's graph replay); pass meta_before_wait=False
otherwise. Each CTA calls griddepcontrol.launch_dependents once its last page is in flight.
pdl_wait ("entry" | "after_prologue" | "after_prefetch"; None = native) moves the first
griddepcontrol.wait (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a separate cubin) for the CMP
benchmark's PDL decomposition: "entry" waits before anything (the barrier init included);
"after_prologue" after the barrier init and, with meta_before_wait=True, the metadata reads, but
before the L2 page prefetch; "after_prefetch" is the native point.
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
THREADS = 160  # a consumer warpgroup (64 tokens x heads per wgmma tile) + a producer warp
STAGES = 7  # pages in flight per CTA (shared-memory ring): 59 KB, 3 CTAs still fit an SM
PREFETCH_PAGES = 8  # pages per CTA L2-prefetched before griddepcontrol.wait (meta_before_wait)
CTAS_PER_SM = 2  # grid target; the third CTA slot of an SM is left to the next kernel under PDL
MAX_PAGES_PER_SPLIT = 1 << 16  # the pages_per_split override's upper bound (no kernel limit)
DIMS = (64, 128)
MAX_HEADS = 32
_MAX_CTX = 1 << 30  # the kernel's token arithmetic is int32
_MAX_PAGE_SLOTS = (1 << 31) - 1  # M * ceil(max_ctx / 64): the kernel's work-split arithmetic is int32
_MAX_GRID = (1 << 31) - 1
_FLAG_META_BEFORE_WAIT = 1
_SCAN_WARPS = THREADS // 32

if PAGE != 64:
    raise ImportError(f"{OP}: csrc/attn_pre/e1_indexer_logits.cuh hard-codes 64-token pages; "
                      f"glm5_fastpath.config says INDEX_K_PAGE_TOKENS={PAGE}")


def page_bytes(dim: int) -> int:
    """Bytes of one index-K cache page: 64 x dim e4m3 + 64 fp32 scales (8448 for dim=128)."""
    return PAGE * (dim + 4)


@dataclass(frozen=True)
class E1Config:
    heads: int
    dim: int
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define

    @property
    def mma_n(self) -> int:
        """wgmma N: the heads padded with zero rows to a multiple of 8."""
        return -(-self.heads // 8) * 8

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory; mirrors E1PagedLogits::kSmemBytes (the .cu static_asserts the two agree)."""
        q = self.mma_n * self.dim * 2  # q as f16, 128B-swizzled k-blocks
        stages = STAGES * page_bytes(self.dim)
        info = STAGES * 16
        bars = 2 * STAGES * 8
        plan = 32
        scan = 2 * _SCAN_WARPS * 2 * 4
        return q + stages + info + bars + plan + scan + 1024  # + alignment slack for the 1024-byte q base

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE, defines=(
            ("GLM5_E1_HEADS", str(self.heads)), ("GLM5_E1_DIM", str(self.dim)), ("GLM5_E1_STAGES", str(STAGES)),
            ("GLM5_E1_PREFETCH", str(PREFETCH_PAGES)), ("GLM5_E1_SMEM_BYTES", str(self.smem_bytes)))
            + wait_defines(self.wait_at))


def config_for(heads: int, dim: int) -> E1Config:
    """The kernel variant for H heads of dim D: H in [1, 32] (wgmma N <= 32), D in {64, 128}
    (4 threads x D/4 bytes per token row; D = 256 would need twice the A registers)."""
    if not (1 <= heads <= MAX_HEADS) or dim not in DIMS:
        raise ValueError(f"{OP}: indexer heads x dim = {heads} x {dim} is not supported: needs 1 <= heads <= "
                         f"{MAX_HEADS} and dim in {DIMS} (GLM-5: 32 x 128, small preset: 4 x 64)")
    return E1Config(heads, dim)


def _check_pages_per_split(pages_per_split: object) -> int:
    if isinstance(pages_per_split, bool) or not isinstance(pages_per_split, int) or \
            not 1 <= pages_per_split <= MAX_PAGES_PER_SPLIT:
        raise _fail(f"pages_per_split must be an int in [1, {MAX_PAGES_PER_SPLIT}], got {pages_per_split!r}")
    return pages_per_split


def plan_ctas(m: int, max_ctx: int, num_sms: int, pages_per_split: int | None = None) -> int:
    """CTAs of the launch: CTAS_PER_SM per SM, but never more than the batch's page slots
    M * ceil(max_ctx / 64) (a CTA per live page at most, e.g. 128 for M=1 x 8192); at least 1.

    Why: the kernel splits the live pages (from seq_lens, on the device) evenly over whatever grid
    it gets, so one resident wave of equal CTAs keeps every SM streaming; two per SM give ~118 KB in
    flight per SM (Little's law needs ~40-60 KB at ~32 GB/s per SM and 1.5-2 us loaded latency)
    and two consumer warpgroups to hide each other's latencies, while the third slot lets the next
    kernel start under PDL. pages_per_split (validated) overrides: ceil(slots / pages_per_split) CTAs.
    """
    slots = m * -(-max_ctx // PAGE)
    if pages_per_split is not None:
        pps = _check_pages_per_split(pages_per_split)
        return max(1, min(-(-slots // pps), _MAX_GRID))
    if m <= 0 or slots <= 0:
        return 1
    return max(1, min(CTAS_PER_SM * max(1, num_sms), slots))


def grid_for(ctas: int) -> tuple[int, int, int]:
    return (ctas, 1, 1)


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
    _check_slots(block_table.shape[0], max_ctx)
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


def _kernel_args(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, meta_before_wait: bool) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/e1_indexer_logits.cu order (checked at load)."""
    return (q_fp8, head_w, index_k_cache, seq_lens, block_table, logits,
            ctypes.c_int64(index_k_cache.shape[0]), ctypes.c_int64(block_table.stride(0)),
            ctypes.c_int32(q_fp8.shape[0]), ctypes.c_int32(block_table.shape[1]), ctypes.c_int32(logits.shape[1]),
            ctypes.c_int32(_FLAG_META_BEFORE_WAIT if meta_before_wait else 0))


_kernels: dict[tuple[E1Config, int], object] = {}


def _kernel(cfg: E1Config, device: torch.device):
    idx = _device_index(device)
    k = _kernels.get((cfg, idx))
    if k is None:
        from ..jit.runtime import get_kernel
        k = get_kernel(cfg.spec, device=idx)
        k.set_max_dynamic_smem(cfg.smem_bytes)
        _prefer_max_smem_carveout(k)
        _kernels[(cfg, idx)] = k
    return k


def _prefer_max_smem_carveout(k) -> None:
    """Ask for the largest shared-memory carveout: 3 CTAs of ~68 KB per SM need ~206 KB, and a
    smaller carveout would silently cut the PDL overlap with the next kernel (a hint to the driver)."""
    from ..jit import runtime as rt
    d = rt.driver()
    try:
        attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        with rt._InContext(k.module.device):
            rt.check(d.cuFuncSetAttribute(k.func, attr, 100), f"cuFuncSetAttribute({k.name}, smem carveout=100)")
    except (AttributeError, rt.CudaDriverError):  # a performance hint only: never fail the op over it
        pass


def _launch(cfg: E1Config, q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, pages_per_split: int,
            pdl: bool, meta_before_wait: bool, wait_at: int = PDL_WAIT_NATIVE) -> None:
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    sms = _check_device(q_fp8, head_w, index_k_cache, seq_lens, block_table, logits)
    m, max_ctx = logits.shape
    if m == 0 or max_ctx == 0:
        return
    ctas = plan_ctas(m, max_ctx, sms, pages_per_split or None)
    grid = grid_for(ctas)
    env.print_config("e1_indexer_logits", {"M": m, "max_ctx": max_ctx, "H": cfg.heads, "D": cfg.dim},
                     {"ctas": ctas, "grid": grid, "threads": THREADS, "stages": STAGES,
                      "prefetch_pages": PREFETCH_PAGES, "smem": cfg.smem_bytes})
    _kernel(cfg, q_fp8.device).launch(grid, (THREADS, 1, 1), _kernel_args(
        q_fp8, head_w, index_k_cache, seq_lens, block_table, logits, meta_before_wait),
        smem=cfg.smem_bytes, pdl=pdl)


def _check_pps(pages_per_split: int) -> None:
    if pages_per_split != 0:
        _check_pages_per_split(pages_per_split)


def _check_slots(m: object, max_ctx: object) -> None:
    if isinstance(m, int) and isinstance(max_ctx, int) and m * -(-max_ctx // PAGE) >= _MAX_PAGE_SLOTS:
        raise _fail(f"M={m} x ceil(max_ctx={max_ctx} / {PAGE}) page slots exceed {_MAX_PAGE_SLOTS} "
                    f"(the kernel's work split is int32)")


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
    pages_per_split: grid override, ceil(M * ceil(max_ctx / 64) / pages_per_split) CTAs
        (1..MAX_PAGES_PER_SPLIT); None -> plan_ctas (CTAS_PER_SM per SM). The result does not depend on it.
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
    pps = 0 if pages_per_split is None else _check_pages_per_split(pages_per_split)
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


def precompile(device: object = None, configs: tuple[tuple[int, int], ...] = ((32, 128),)) -> None:
    """Compile (or fetch from cache) and load the kernels for these (heads, dim) on `device`."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h, d in configs:
        _kernel(config_for(h, d), dev)


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

