"""E2: top-k of the indexer logits per row, translated to physical KV slots, as torch.library ops.

The reference is glm5_fastpath.ref.prefix.e2_topk (same signature). For row m with
L = seq_lens[m] live tokens (logical positions t < L) and slot(t) = block_table[m, t // 64] * 64 + t % 64:

- L <= topk: every token is taken: out[m] = [slot(0), ..., slot(L-1), -1, ..., -1].
- L >  topk: out[m] holds the slots of exactly topk positions: the topk largest logits, and on a
  tie at the k-th value the LOWER logical positions win (the reference's rule), so the selected
  SET equals the reference's.

Contract on ORDER (differs from the reference, which sorts by logit): the consumer (sparse MLA)
is order-free, so the kernel does not sort. The output is deterministic (bit for bit across runs,
a function of the row's values only): two runs of ascending logical position, first the positions
whose order key lies above the radix prefix where the search stopped (see the kernel header), then
the taken positions inside that prefix (the k-th value's ties, cut at the lowest positions);
-1 padding last when L <= topk. Compare with the reference as sets
(testing.numerics.assert_topk_sets with min_overlap=1.0: the sets are equal even with ties).

Value order: fp32 order, with -0.0 == +0.0 and NaN below -inf (the reference raises on NaN; the
op cannot look without a device sync). -inf at a live position is an ordinary value.

Inputs (no device sync, so CUDA-graph capturable):
- logits [M, W] float32, unit column stride, any row stride >= W (DeepGEMM's padded logits work
  as a view); W < 2^31. Values at t >= seq_lens[m] are never used (E1 writes -inf there).
- seq_lens [M] int32 or int64, contiguous.
- block_table [M, P] int32 or int64, unit column stride (any row stride). Only entries of live
  pages are read; unused ones may hold anything (e.g. -1).
- topk >= 1 (GLM-5: cfg.index_topk = 2048). Any topk works; M is not limited (one CTA per row;
  M > #SMs runs in waves; decode uses M <= 256), the grid limit 2^31-1 aside.
- Slots are computed in 64 bits and stored as int32: the KV pool must have < 2^31 slots.
Checked on the device instead of raising (a kernel cannot raise): seq_lens[m] is clamped to
[0, min(W, 64 * P)] (the reference raises when it exceeds either).

Ops (namespace glm5_fastpath; each with a fake implementation for torch.compile / graphs):
- torch.ops.glm5_fastpath.e2_topk(logits, seq_lens, block_table, topk, pdl=True) -> int32 [M, topk]
- torch.ops.glm5_fastpath.e2_topk_out(logits, seq_lens, block_table, topk, out, pdl=True) -> None

The Python entry point `e2_topk(logits, seq_lens, block_table, topk, out=None, *, pdl=True)` picks one.

PDL: the kernel zeroes its shared histograms, issues griddepcontrol.launch_dependents, and then
waits (griddepcontrol.wait) before reading ANY global input: logits come from E1, and seq_lens /
block_table may come from a metadata kernel in the same graph. GLM5_FASTPATH_DISABLE_PDL=1
turns the launch attribute off globally.

Kernel (csrc/attn_pre/e2_topk.{cuh,cu}): one CTA of 1024 threads per row, radix select on the
order-preserving fp32 key in up to three rounds (11, 11, 10 bits; stops as soon as the k-th
value's bin is taken whole), then one compaction pass with a block scan; rows of up to 8192 live
tokens are read once into registers, longer rows are re-read from L2 for each round.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from ._device import overlaps as _overlaps, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.e2_topk"
SOURCE = "attn_pre/e2_topk.cu"
FUNCTION = "glm5_e2_topk"
PAGE = 64  # tokens per page of the block table (the kernel's kPage)
_INDEX_DTYPES = (torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class E2Config:
    threads: int = 1024
    items: int = 8  # contiguous positions per thread and chunk

    @property
    def chunk(self) -> int:
        """Rows of up to this many live tokens stay in registers (one read of the row)."""
        return self.threads * self.items

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE,
                          defines=(("GLM5_E2_THREADS", str(self.threads)), ("GLM5_E2_ITEMS", str(self.items))))


# 1024 x 8: the GLM-5 benchmark row (KV 8192) fits the registers in one CTA; 1024 threads keep
# 8 histogram atomics and one 32-byte read per thread. (512 x 16 is the alternative kept compiled.)
DEFAULT_CONFIG = E2Config(1024, 8)
ALT_CONFIGS = (E2Config(512, 16),)


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




def _check_device(*ts: torch.Tensor) -> None:
    """Real-launch checks: a CUDA sm_90+ device."""
    dev = ts[0].device
    require_hopper(OP, dev, _fail)




# ---- launch ---------------------------------------------------------------------------------------

def _kernel_args(logits, seq_lens, block_table, out, topk: int) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/e2_topk.cu order (checked at load)."""
    m, w = logits.shape
    flags = (1 if seq_lens.dtype == torch.int64 else 0) | (2 if block_table.dtype == torch.int64 else 0)
    return (logits, ctypes.c_int64(logits.stride(0)), ctypes.c_int32(w),
            seq_lens, block_table, ctypes.c_int64(block_table.stride(0)), ctypes.c_int32(block_table.shape[1]),
            out, ctypes.c_int32(topk), ctypes.c_int32(m), ctypes.c_int32(flags))


_kernels: dict[tuple[E2Config, int | None], object] = {}


def _kernel(cfg: E2Config, device: torch.device):
    k = _kernels.get((cfg, device.index))
    if k is None:
        env.print_config("e2_topk", {}, {"threads": cfg.threads, "items": cfg.items,
                                         "register_rows_up_to": cfg.chunk, "grid": "M CTAs"})
        from ..jit.runtime import get_kernel
        k = _kernels[(cfg, device.index)] = get_kernel(cfg.spec, device=device)
    return k


def _launch(logits, seq_lens, block_table, topk: int, out, pdl: bool, cfg: E2Config | None = None) -> None:
    _check_device(logits, seq_lens, block_table, out)
    m = logits.shape[0]
    if m == 0:
        return
    cfg = cfg or DEFAULT_CONFIG
    kernel = _kernel(cfg, logits.device)
    kernel.launch((m, 1, 1), (cfg.threads, 1, 1), _kernel_args(logits, seq_lens, block_table, out, topk), pdl=pdl)


# ---- custom ops -----------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::e2_topk", mutates_args=())
def _e2_topk(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
             pdl: bool = True) -> torch.Tensor:
    _check_inputs(logits, seq_lens, block_table, topk)
    out = torch.empty((logits.shape[0], topk), dtype=torch.int32, device=logits.device)
    _launch(logits, seq_lens, block_table, topk, out, pdl)
    return out


@_e2_topk.register_fake
def _e2_topk_fake(logits, seq_lens, block_table, topk, pdl=True):
    _check_inputs(logits, seq_lens, block_table, topk)
    return torch.empty((logits.shape[0], topk), dtype=torch.int32, device=logits.device)


@torch.library.custom_op("glm5_fastpath::e2_topk_out", mutates_args=("out",))
def _e2_topk_out(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
                 out: torch.Tensor, pdl: bool = True) -> None:
    _check_inputs(logits, seq_lens, block_table, topk)
    _check_out(logits, topk, out)
    for name, t in (("logits", logits), ("seq_lens", seq_lens), ("block_table", block_table)):
        if _overlaps(out, t):
            raise _fail(f"out overlaps input {name} in memory")
    _launch(logits, seq_lens, block_table, topk, out, pdl)


@_e2_topk_out.register_fake
def _e2_topk_out_fake(logits, seq_lens, block_table, topk, out, pdl=True):
    _check_inputs(logits, seq_lens, block_table, topk)
    _check_out(logits, topk, out)


def e2_topk(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int,
            out: torch.Tensor | None = None, *, pdl: bool = True) -> torch.Tensor:
    """-> int32 [M, topk] physical KV slots of each row's top-k logits, -1 padded (see the module docstring).

    out: None allocates; an int32 [M, topk] contiguous tensor (e.g. a CUDA-graph static buffer) is
    written and returned.
    """
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise _fail(f"topk must be an int in [1, 2^31-1], got {topk!r}")  # before the schema coerces it
    if out is None:
        return torch.ops.glm5_fastpath.e2_topk(logits, seq_lens, block_table, topk, pdl)
    torch.ops.glm5_fastpath.e2_topk_out(logits, seq_lens, block_table, topk, out, pdl)
    return out


def precompile(device: object = None) -> None:
    """Compile (or fetch from cache) and load the kernel on `device` (default: current), ahead of first use."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    _kernel(DEFAULT_CONFIG, dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: the default 1024x8 and the alternative 512x16."""
    return [DEFAULT_CONFIG.spec] + [c.spec for c in ALT_CONFIGS]
