"""E2: top-k of the indexer logits per row, translated to physical KV slots, as torch.library ops.

The reference is glm5_fastpath.ref.prefix.e2_topk (same signature). For row m with
L = seq_lens[m] live tokens (logical positions t < L) and slot(t) = block_table[m, t // 64] * 64 + t % 64:

- L <= topk: every token is taken: out[m] = [slot(0), ..., slot(L-1), -1, ..., -1].
- L >  topk: out[m] holds the slots of exactly topk positions: the topk largest logits, and on a
  tie at the k-th value the LOWER logical positions win (the reference's rule), so the selected
  SET equals the reference's.

Contract on ORDER (differs from the reference, which sorts by logit): the consumer (sparse MLA)
is order-free, so the kernel does not sort by logit. It writes the selected slots in ASCENDING
LOGICAL POSITION, so the output is a function of the selected set alone: deterministic, and equal
bit for bit to "the reference's set, sorted by position" (-1 padding last when L <= topk).
Compare with the reference as sets (testing.numerics.assert_topk_sets with min_overlap=1.0: the
sets are equal even with ties).

Value order: fp32 order, with -0.0 == +0.0 and NaN below -inf (the reference raises on NaN; the
op cannot look without a device sync). -inf at a live position is an ordinary value.

Inputs (no device sync, so CUDA-graph capturable):
- logits [M, W] float32, unit column stride, any row stride >= W (DeepGEMM's padded logits work
  as a view); W < 2^31. Values at t >= seq_lens[m] are never used (E1 writes -inf there).
- seq_lens [M] int32 or int64, contiguous.
- block_table [M, P] int32 or int64, unit column stride (any row stride). Only entries of live
  pages are used; unused ones may hold anything (e.g. -1). (Each thread's first page entry is
  read whenever it lies inside the row of the table, so that its load does not wait for seq_lens.)
- topk >= 1 (GLM-5: cfg.index_topk = 2048). Any topk works; M is not limited (one CTA, or one
  cluster of CTAs, per row; M > #SMs runs in waves; decode uses M <= 256), the grid limit aside.
- Slots are computed in 64 bits and stored as int32: the KV pool must have < 2^31 slots.
Checked on the device instead of raising (a kernel cannot raise): seq_lens[m] is clamped to
[0, min(W, 64 * P)] (the reference raises when it exceeds either).

Ops (namespace glm5_fastpath; each with a fake implementation for torch.compile / graphs):
- torch.ops.glm5_fastpath.e2_topk(logits, seq_lens, block_table, topk, pdl=True, meta_before_wait=True,
  pdl_wait_at=2) -> int32 [M, topk]
- torch.ops.glm5_fastpath.e2_topk_out(logits, seq_lens, block_table, topk, out, pdl=True,
  meta_before_wait=True, pdl_wait_at=2) -> None

The Python entry point `e2_topk(logits, seq_lens, block_table, topk, out=None, *, pdl=True,
meta_before_wait=True, pdl_wait=None)` picks one. pdl_wait="entry" moves the first
griddepcontrol.wait to the kernel's first instruction (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a
separate cubin) for the CMP benchmark's PDL decomposition; "after_prologue" (a separate cubin too) and
"after_prefetch" wait at the native point: the histogram zeroing and the metadata reads are the whole
prologue, and there are no weights.

PDL: the kernel zeroes its shared histograms, issues griddepcontrol.launch_dependents, reads
seq_lens and the block-table entries it needs first (meta_before_wait=True, the default), and then
waits (griddepcontrol.wait) before reading the logits (E1's output) or writing anything. seq_lens /
block_table are graph inputs of the prefix (step metadata written before the step's first kernel,
as in SGLang's graph replay), so reading them before the wait is safe there; pass
meta_before_wait=False when a kernel that may still be running writes them (E1 has the same
switch). GLM5_FASTPATH_DISABLE_PDL=1 turns the launch attribute off globally.

Kernel (csrc/attn_pre/e2_topk.{cuh,cu}, see its header): one CTA per row holds 8192 positions in
registers (config_for: 256 threads x 32 when every row fits, else 512 x 16); a longer row is split
over a thread-block cluster of up to 8 CTAs (distributed shared memory for the cross-CTA steps),
each CTA holding up to 1 + 5 chunks of 8192 positions on chip (registers + dynamic shared memory;
beyond that a chunk is re-read from L2 per pass). Selection: a linear-value histogram over the
row's [min, max] (monotone in fp32 order, spreads typical logits so that the bin of the k-th value
holds a few keys), then either the whole bin is taken, or its <= 64 keys are ranked by one warp, or
exact 11-bit radix passes split it; one block-scan compaction writes the slots in position order
(rows of one chunk: staged in shared memory, stored coalesced).

Launch checks: every function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is raised once, at
load, to the most any plan requests (max_dynamic_smem: its default is 48 KB minus the ~20 KB of
static shared memory, which refused plans with one 32 KB chunk in shared memory), and check_launch
raises a RuntimeError naming the op and the limit (threads, shared memory per block, cluster size,
cluster co-scheduling via cuOccupancyMaxActiveClusters) before a plan that cannot launch reaches
the driver.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, replace

import torch

from ._device import PDL_WAIT_NATIVE, check_wait_at, pdl_wait_code, wait_defines
from ._device import overlaps as _overlaps, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.e2_topk"
SOURCE = "attn_pre/e2_topk.cu"
FUNCTION = "glm5_e2_topk"
FUNCTION_CLUSTER = "glm5_e2_topk_cluster"
PAGE = 64  # tokens per page of the block table (the kernel's kPage)
_INDEX_DTYPES = (torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1
_FLAG_SEQ64, _FLAG_BT64, _FLAG_META_BEFORE_WAIT = 1, 2, 4  # csrc/attn_pre/e2_topk.cu

MAX_CLUSTER = 8        # portable cluster size limit
MAX_SMEM_CHUNKS = 5    # chunks kept in dynamic shared memory per CTA (5 x 32 KB at 1024 x 8)
_SMS_FALLBACK = 132
_SMEM_OPTIN_FALLBACK = 227 * 1024  # Hopper's opt-in shared memory per block


@dataclass(frozen=True)
class E2Config:
    threads: int = 1024
    items: int = 8  # contiguous positions per thread and chunk
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define

    @property
    def chunk(self) -> int:
        """Positions per chunk: a CTA keeps its first chunk in registers (8192 at 1024 x 8)."""
        return self.threads * self.items

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE, functions=(FUNCTION, FUNCTION_CLUSTER),
                          defines=(("GLM5_E2_THREADS", str(self.threads)), ("GLM5_E2_ITEMS", str(self.items)))
                          + wait_defines(self.wait_at))


# Every config holds a chunk of 8192 positions (the GLM-5 benchmark row) in registers. Which one is
# fastest was MEASURED on the H200 (benchmarks/results/2026-11-29_h200_session2/run4_ef41994/e2speed.log,
# 20 launches per CUDA graph, PDL on, L = 8192): 1024 x 8 wins up to M = 64 (5.1-5.6 us vs 5.8-6.8 for
# 512 x 16 and 7.7-9.0 for 256 x 32; more threads shorten the per-row issue chain when rows < SMs), and
# 512 x 16 wins at M = 256 (8.5 us vs 10.9 / 10.4: two CTAs per SM, one wave). Long rows (clusters,
# shared-memory chunks) use DEFAULT_CONFIG. tests/ops/test_e2_topk.py::test_speed_in_cuda_graph prints
# every config, so re-measure there before changing these.
DEFAULT_CONFIG = E2Config(512, 16)
ALT_CONFIGS = (E2Config(1024, 8), E2Config(256, 32))
SINGLE_CHUNK_CONFIG = ALT_CONFIGS[0]          # rows that fit one chunk, up to SINGLE_CHUNK_MAX_ROWS rows
SINGLE_CHUNK_MAX_ROWS = 128                   # above: DEFAULT_CONFIG (measured faster at M = 256)


def config_for(width: int, rows: int = 1) -> E2Config:
    """The config a launch uses: SINGLE_CHUNK_CONFIG when every row fits one chunk (GLM-5 decode:
    L <= 8192) and there are at most SINGLE_CHUNK_MAX_ROWS rows, else DEFAULT_CONFIG."""
    if width <= SINGLE_CHUNK_CONFIG.chunk and rows <= SINGLE_CHUNK_MAX_ROWS:
        return SINGLE_CHUNK_CONFIG
    return DEFAULT_CONFIG


@dataclass(frozen=True)
class E2Plan:
    """How one launch covers the rows: `cluster` CTAs per row (1: the plain kernel), each CTA owning
    `chunks` consecutive chunks of cfg.chunk positions, of which chunks 1..smem_chunks sit in
    dynamic shared memory (the rest, if any, are re-read from L2 per pass)."""

    cluster: int
    chunks: int
    smem_chunks: int
    smem_bytes: int

    @property
    def function(self) -> str:
        return FUNCTION if self.cluster == 1 else FUNCTION_CLUSTER


def plan_launch(m: int, width: int, sms: int, cfg: E2Config = DEFAULT_CONFIG, cluster: int | None = None) -> E2Plan:
    """The launch shape for M rows of `width` logits on a GPU with `sms` SMs (host-only, testable).

    Rows of up to cfg.chunk positions: one CTA per row, registers only. Longer rows: enough CTAs
    per row (a cluster, power of two <= 8) that each CTA's segment fits on chip (1 + MAX_SMEM_CHUNKS
    chunks), then more CTAs while the batch leaves SMs idle (M * cluster <= 3/4 of the SMs: a
    cluster's CTAs must be co-resident in one GPC). `cluster` forces the cluster size (tests).
    """
    if m < 1 or width < 0 or sms < 1:
        raise ValueError(f"{OP}: plan_launch needs m >= 1, width >= 0, sms >= 1, got {m=}, {width=}, {sms=}")
    n = max(1, -(-width // cfg.chunk))  # chunks per row
    if cluster is None:
        c = 1
        while c < MAX_CLUSTER and -(-n // c) > 1 + MAX_SMEM_CHUNKS:
            c *= 2
        while c < MAX_CLUSTER and c < n and 4 * m * (2 * c) <= 3 * sms:
            c *= 2
    else:
        if cluster not in (1, 2, 4, 8):
            raise ValueError(f"{OP}: cluster must be 1, 2, 4 or 8, got {cluster}")
        c = cluster
    chunks = -(-n // c)
    smem_chunks = min(chunks - 1, MAX_SMEM_CHUNKS)
    return E2Plan(c, chunks, smem_chunks, smem_chunks * cfg.chunk * 4)


def max_dynamic_smem(cfg: E2Config) -> int:
    """The most dynamic shared memory any plan of this config requests (MAX_SMEM_CHUNKS chunks). The
    launcher raises each function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to this once, at
    load: the attribute's default is 48 KB MINUS the function's static shared memory (~20 KB here), so
    a plan with one 32 KB chunk in shared memory (52 KB in all) was refused with
    CUDA_ERROR_INVALID_VALUE when no earlier launch of the function had raised it."""
    return MAX_SMEM_CHUNKS * cfg.chunk * 4


@dataclass(frozen=True)
class LaunchLimits:
    """What one loaded function on one device allows (Kernel attributes + device properties)."""

    max_threads: int      # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK (the __launch_bounds__)
    static_smem: int      # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    max_dynamic_smem: int  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as configured
    smem_optin: int       # the device's shared memory per block with opt-in
    max_active_clusters: int | None = None  # cuOccupancyMaxActiveClusters for the plan (None: not queried)


def check_launch(m: int, cfg: E2Config, plan: E2Plan, limits: LaunchLimits) -> None:
    """Raise a RuntimeError naming the op and the violated limit if this plan cannot launch (host-only,
    testable): the driver would answer CUDA_ERROR_INVALID_VALUE (or never co-schedule a cluster)."""
    why = []
    if m < 1:
        why.append(f"an empty grid (M={m})")
    if cfg.threads > limits.max_threads:
        why.append(f"{cfg.threads} threads per CTA > the function's limit {limits.max_threads}")
    if plan.cluster not in (1, 2, 4, 8) or plan.cluster > MAX_CLUSTER:
        why.append(f"cluster {plan.cluster} is not a portable cluster size (1, 2, 4 or 8)")
    if m * plan.cluster > 2**31 - 1:
        why.append(f"grid {m} x {plan.cluster} CTAs exceeds 2^31-1")
    if plan.smem_bytes > limits.max_dynamic_smem:
        why.append(f"{plan.smem_bytes} B of dynamic shared memory > the function's configured maximum "
                   f"{limits.max_dynamic_smem} B")
    if limits.static_smem + plan.smem_bytes > limits.smem_optin:
        why.append(f"{limits.static_smem} B static + {plan.smem_bytes} B dynamic shared memory > the device's "
                   f"{limits.smem_optin} B per block")
    if plan.cluster > 1 and limits.max_active_clusters is not None and limits.max_active_clusters < 1:
        why.append(f"a cluster of {plan.cluster} CTAs x ({cfg.threads} threads, {limits.static_smem + plan.smem_bytes} B "
                   "shared memory) cannot be co-scheduled on one GPC")
    if why:
        raise RuntimeError(f"{OP}: cannot launch {plan} with {cfg} for M={m}: " + "; ".join(why))


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def _check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise _fail(f"{name} must be {want}, got {t.dtype}")
    if t.dim() != dim:
        raise _fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    return t


def _check_inputs(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: object) -> None:
    _check_tensor("logits", logits, (torch.float32,), 2)
    m, w = logits.shape
    if w > 1 and logits.stride(1) != 1:
        raise _fail(f"logits must have unit column stride (rows contiguous), got strides {logits.stride()}")
    if m > 1 and logits.stride(0) < w:
        raise _fail(f"logits row stride {logits.stride(0)} < width {w} (rows overlap)")
    if w > _INT32_MAX:
        raise _fail(f"logits width {w} exceeds 2^31-1")
    _check_tensor("seq_lens", seq_lens, _INDEX_DTYPES, 1)
    if seq_lens.shape[0] != m:
        raise _fail(f"seq_lens has {seq_lens.shape[0]} entries but logits has M={m} rows")
    if m > 1 and seq_lens.stride(0) != 1:
        raise _fail(f"seq_lens must be contiguous, got stride {seq_lens.stride()}")
    _check_tensor("block_table", block_table, _INDEX_DTYPES, 2)
    if block_table.shape[0] != m:
        raise _fail(f"block_table has {block_table.shape[0]} rows but logits has M={m} rows")
    p = block_table.shape[1]
    if p > 1 and block_table.stride(1) != 1:
        raise _fail(f"block_table must have unit column stride, got strides {block_table.stride()}")
    if p > _INT32_MAX:
        raise _fail(f"block_table has {p} columns, more than 2^31-1")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= _INT32_MAX:
        raise _fail(f"topk must be an int in [1, 2^31-1], got {topk!r}")
    if m > _INT32_MAX:
        raise _fail(f"M={m} rows exceeds the grid limit 2^31-1")
    devices = {t.device for t in (logits, seq_lens, block_table)}
    if len(devices) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _check_out(logits: torch.Tensor, topk: int, out: object) -> None:
    m = logits.shape[0]
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.int32 or tuple(out.shape) != (m, topk)
            or not out.is_contiguous()):
        raise _fail(f"out must be a contiguous int32 tensor of shape {(m, topk)}, got "
                    f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
                    f"{'' if not isinstance(out, torch.Tensor) or out.is_contiguous() else ' (not contiguous)'}")
    if out.device != logits.device:
        raise _fail(f"out is on {out.device} but logits is on {logits.device}")




def _check_device(*ts: torch.Tensor) -> int:
    """Real-launch checks: a CUDA sm_90+ device. Returns the device index."""
    return require_hopper(OP, ts[0].device, _fail)




# ---- launch ---------------------------------------------------------------------------------------

def _kernel_args(logits, seq_lens, block_table, out, topk: int, plan: E2Plan, meta_before_wait: bool) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/e2_topk.cu order (checked at load)."""
    m, w = logits.shape
    flags = ((_FLAG_SEQ64 if seq_lens.dtype == torch.int64 else 0) | (_FLAG_BT64 if block_table.dtype == torch.int64 else 0)
             | (_FLAG_META_BEFORE_WAIT if meta_before_wait else 0))
    return (logits, ctypes.c_int64(logits.stride(0)), ctypes.c_int32(w),
            seq_lens, block_table, ctypes.c_int64(block_table.stride(0)), ctypes.c_int32(block_table.shape[1]),
            out, ctypes.c_int32(topk), ctypes.c_int32(m), ctypes.c_int32(flags),
            ctypes.c_int32(plan.chunks), ctypes.c_int32(plan.smem_chunks))


_kernels: dict[tuple[E2Config, int, str], object] = {}
_num_sms: dict[int, int] = {}
_smem_optin: dict[int, int] = {}
_checked: dict[tuple, LaunchLimits] = {}
_dyn_limit: dict[tuple[E2Config, int, str], int] = {}


def _optin(idx: int) -> int:
    n = _smem_optin.get(idx)
    if n is None:
        try:
            n = int(getattr(torch.cuda.get_device_properties(idx), "shared_memory_per_block_optin", 0)) or _SMEM_OPTIN_FALLBACK
        except Exception:  # noqa: BLE001
            n = _SMEM_OPTIN_FALLBACK
        n = _smem_optin[idx] = n
    return n


def _kernel(cfg: E2Config, idx: int, function: str = FUNCTION):
    """The loaded function, with its dynamic shared memory limit raised once to what any plan needs."""
    k = _kernels.get((cfg, idx, function))
    if k is None:
        from ..jit.runtime import get_kernel
        k = get_kernel(cfg.spec, function, device=idx)
        want = max(0, min(max_dynamic_smem(cfg), _optin(idx) - k.static_smem))
        k.set_max_dynamic_smem(want)  # the runtime records it and never re-sets it for smaller launches
        _dyn_limit[(cfg, idx, function)] = want
        _kernels[(cfg, idx, function)] = k
    return k


def _max_active_clusters(kernel, cfg: E2Config, plan: E2Plan) -> int | None:
    """cuOccupancyMaxActiveClusters for the plan's cluster shape (None when the query is unavailable)."""
    try:
        from ..jit.runtime import _InContext, check, driver
        d = driver()
        lc = d.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = plan.cluster, 1, 1
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = cfg.threads, 1, 1
        lc.sharedMemBytes = plan.smem_bytes
        a = d.CUlaunchAttribute()
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = plan.cluster, 1, 1
        lc.attrs = [a]
        lc.numAttrs = 1
        with _InContext(kernel.module.device):
            return int(check(d.cuOccupancyMaxActiveClusters(kernel.func, lc), "cuOccupancyMaxActiveClusters"))
    except Exception:  # noqa: BLE001 - an old driver / binding: the static checks still apply
        return None


def _launch_limits(kernel, cfg: E2Config, plan: E2Plan, idx: int) -> LaunchLimits:
    key = (cfg, idx, plan)
    lim = _checked.get(key)
    if lim is None:
        lim = _checked[key] = LaunchLimits(
            max_threads=kernel.max_threads, static_smem=kernel.static_smem,
            max_dynamic_smem=_dyn_limit.get((cfg, idx, plan.function), 0),
            smem_optin=_optin(idx),
            max_active_clusters=_max_active_clusters(kernel, cfg, plan) if plan.cluster > 1 else None)
    return lim


def _sms(idx: int) -> int:
    n = _num_sms.get(idx)
    if n is None:
        try:
            n = int(torch.cuda.get_device_properties(idx).multi_processor_count)
        except Exception:  # noqa: BLE001 - a count is only a tuning input
            n = _SMS_FALLBACK
        n = _num_sms[idx] = n
    return n


def _launch(logits, seq_lens, block_table, topk: int, out, pdl: bool, cfg: E2Config | None = None, *,
            meta_before_wait: bool = True, cluster: int | None = None, wait_at: int = PDL_WAIT_NATIVE) -> E2Plan | None:
    idx = _check_device(logits, seq_lens, block_table, out)
    m, w = logits.shape
    if m == 0:
        return None
    cfg = cfg or config_for(w, m)
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    plan = plan_launch(m, w, _sms(idx), cfg, cluster)
    env.print_config("e2_topk", {"M": m, "width": w, "topk": topk},
                     {"threads": cfg.threads, "items": cfg.items, "cluster": plan.cluster, "chunks": plan.chunks,
                      "smem_chunks": plan.smem_chunks, "smem": plan.smem_bytes})
    kernel = _kernel(cfg, idx, plan.function)
    check_launch(m, cfg, plan, _launch_limits(kernel, cfg, plan, idx))
    args = _kernel_args(logits, seq_lens, block_table, out, topk, plan, meta_before_wait)
    kernel.launch((m * plan.cluster, 1, 1), (cfg.threads, 1, 1), args, smem=plan.smem_bytes, pdl=pdl,
                  cluster=(plan.cluster, 1, 1) if plan.cluster > 1 else None)
    return plan


# ---- custom ops -----------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::e2_topk", mutates_args=())
def _e2_topk(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
             pdl: bool = True, meta_before_wait: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    _check_inputs(logits, seq_lens, block_table, topk)
    check_wait_at(OP, pdl_wait_at)
    out = torch.empty((logits.shape[0], topk), dtype=torch.int32, device=logits.device)
    _launch(logits, seq_lens, block_table, topk, out, pdl, meta_before_wait=meta_before_wait, wait_at=pdl_wait_at)
    return out


@_e2_topk.register_fake
def _e2_topk_fake(logits, seq_lens, block_table, topk, pdl=True, meta_before_wait=True, pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(logits, seq_lens, block_table, topk)
    check_wait_at(OP, pdl_wait_at)
    return torch.empty((logits.shape[0], topk), dtype=torch.int32, device=logits.device)


@torch.library.custom_op("glm5_fastpath::e2_topk_out", mutates_args=("out",))
def _e2_topk_out(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
                 out: torch.Tensor, pdl: bool = True, meta_before_wait: bool = True,
                 pdl_wait_at: int = PDL_WAIT_NATIVE) -> None:
    _check_inputs(logits, seq_lens, block_table, topk)
    _check_out(logits, topk, out)
    check_wait_at(OP, pdl_wait_at)
    for name, t in (("logits", logits), ("seq_lens", seq_lens), ("block_table", block_table)):
        if _overlaps(out, t):
            raise _fail(f"out overlaps input {name} in memory")
    _launch(logits, seq_lens, block_table, topk, out, pdl, meta_before_wait=meta_before_wait, wait_at=pdl_wait_at)


@_e2_topk_out.register_fake
def _e2_topk_out_fake(logits, seq_lens, block_table, topk, out, pdl=True, meta_before_wait=True,
                      pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(logits, seq_lens, block_table, topk)
    _check_out(logits, topk, out)
    check_wait_at(OP, pdl_wait_at)


def e2_topk(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
            out: torch.Tensor | None = None, *, pdl: bool = True, meta_before_wait: bool = True,
            pdl_wait: str | None = None) -> torch.Tensor:
    """-> int32 [M, topk] physical KV slots of each row's top-k logits in ascending position, -1 padded
    (see the module docstring).

    out: None allocates; an int32 [M, topk] contiguous tensor (e.g. a CUDA-graph static buffer) is
    written and returned. meta_before_wait: read seq_lens / block_table before griddepcontrol.wait
    (False when a kernel that may still be running writes them). pdl_wait: where the kernel first
    waits under PDL (module docstring); None = native.
    """
    wait_at = pdl_wait_code(OP, pdl_wait, _fail)
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise _fail(f"topk must be an int in [1, 2^31-1], got {topk!r}")  # before the schema coerces it
    if out is None:
        return torch.ops.glm5_fastpath.e2_topk(logits, seq_lens, block_table, topk, pdl, meta_before_wait, wait_at)
    torch.ops.glm5_fastpath.e2_topk_out(logits, seq_lens, block_table, topk, out, pdl, meta_before_wait, wait_at)
    return out


def precompile(device: object = None, wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,)) -> None:
    """Compile (or fetch from cache) and load the kernel on `device` (default: current), for each PDL wait point
    in `wait_ats`, ahead of first use."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for w in wait_ats:
        for fn in (FUNCTION, FUNCTION_CLUSTER):
            _kernel(replace(DEFAULT_CONFIG, wait_at=w), dev.index, fn)
        _kernel(replace(SINGLE_CHUNK_CONFIG, wait_at=w), dev.index, FUNCTION)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: the default and the alternative configs."""
    return [DEFAULT_CONFIG.spec] + [c.spec for c in ALT_CONFIGS]
