"""The DSA backend's per-step decode metadata in one kernel (what SGLang's DeepseekSparseAttnBackend prepares before
each decode CUDA-graph replay, sglang 0.5.14 `_apply_cuda_graph_metadata`, decode branch, minus DeepGEMM's schedule).

Why: at batch 1 the engine's decode step is paced by the host (session 35: ITL 2.00-2.22 ms against 1.95 ms of GPU
work), and this part of the step is ~12 small torch ops, each a host dispatch plus a kernel before the graph.

Math, for request b < bs (s_b = seq_lens[b], r_b = req_pool_indices[b]), exactly SGLang's:
    cache_seqlens[b]    = int32(s_b)                                seq_lens.to(torch.int32)
    cu_seqlens_k[1 + b] = cumsum(cache_seqlens)[b]                  torch.cumsum(.., dtype=torch.int32)
    page_table_1[b, :max_len] = req_to_token[r_b, :max_len]         req_to_token[req_pool_indices, :max_len]
    dsa_seqlens[b]      = min(cache_seqlens[b], topk)               compute_dsa_seqlens (clamp)
    dsa_cu[1 + b]       = cumsum(dsa_seqlens)[b]
    real_table[b, j]    = page_table_1[b, j * ps] // ps, j < ceil(max_len / ps)   (_transform_table_1_to_real, ps > 1)
Index 0 of the two cumulative buffers and every column past max_len are left as they are (SGLang does not write them).

Op (namespace glm5_fastpath, with a fake): torch.ops.glm5_fastpath.dsa_decode_metadata(req_to_token,
req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1,
real_table) -> None, writing the given buffers (SGLang's static metadata buffers). Python entry point:
`dsa_decode_metadata(...)` (same arguments, real_table=None when page_size == 1). CPU tensors run the reference
(`reference_into`), which is SGLang's own sequence of torch ops. `FastLauncher` (what the SGLang route calls every step):
the same kernel into one fixed set of buffers, checked and packed once (jit.runtime.Kernel.prepare), so a step costs
one driver launch of host time.

Kernel (csrc/attn_core/dsa_decode_metadata.{cuh,cu}): grid (bs, ceil(max_len / 256)), one thread per copied column;
thread 0 of each row's first CTA writes the row's four scalars (prefix sums by re-adding b + 1 values). No PDL (its
producers are torch copies); deterministic; capture-safe.

Errors: wrong type / dtype / shape / stride / device, bs past the buffers, max_len past a table, page_size < 1 or
topk < 1 -> DsaMetadataInputError (a ValueError) naming the op; a pre-sm_90 GPU -> RuntimeError.
"""
from __future__ import annotations

import ctypes

import torch

from ..jit import KernelSpec, env
from ._device import require_hopper

OP = "glm5_fastpath.dsa_decode_metadata"
SOURCE = "attn_core/dsa_decode_metadata.cu"
FUNCTION = "glm5_dsa_decode_metadata"
SPEC = KernelSpec(FUNCTION, source=SOURCE)
THREADS = 256  # DsaDecodeMetadataTile::kThreads
I32, I64 = torch.int32, torch.int64


class DsaMetadataInputError(ValueError):
    """dsa_decode_metadata got an input or buffer of the wrong type / dtype / shape / stride / device."""


def _fail(msg: str) -> DsaMetadataInputError:
    return DsaMetadataInputError(f"{OP}: {msg}")


def real_cols(max_len: int, page_size: int) -> int:
    """Columns of the real page table the step writes: ceil(max_len / page_size)."""
    return -(-max_len // page_size)


def _check(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k,
           dsa_seqlens, dsa_cu, page_table_1, real_table) -> int:
    """-> bs of valid arguments."""
    def tensor(name, t, dtypes, dim):
        if not isinstance(t, torch.Tensor):
            raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise _fail(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
        if t.dim() != dim:
            raise _fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
        if t.numel() and t.stride(-1) != 1:
            raise _fail(f"{name} must have a contiguous last dim, got strides {t.stride()}")
        return t

    for name, v in (("max_len", max_len), ("topk", topk), ("page_size", page_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail(f"{name} must be an int, got {v!r}")
    if max_len < 0 or topk < 1 or page_size < 1:
        raise _fail(f"need max_len >= 0, topk >= 1, page_size >= 1; got {max_len}, {topk}, {page_size}")
    tensor("req_to_token", req_to_token, (I32,), 2)
    idx = tensor("req_pool_indices", req_pool_indices, (I32, I64), 1)
    lens = tensor("seq_lens", seq_lens, (I32, I64), 1)
    bs = int(idx.shape[0])
    if lens.shape[0] != bs:
        raise _fail(f"seq_lens has {lens.shape[0]} entries, req_pool_indices {bs}")
    for name, t, need in (("cache_seqlens", cache_seqlens, bs), ("dsa_seqlens", dsa_seqlens, bs),
                          ("cu_seqlens_k", cu_seqlens_k, bs + 1), ("dsa_cu", dsa_cu, bs + 1)):
        tensor(name, t, (I32,), 1)
        if t.shape[0] < need:
            raise _fail(f"{name} has {t.shape[0]} entries, the batch needs {need}")
    pt = tensor("page_table_1", page_table_1, (I32,), 2)
    if pt.shape[0] < bs or pt.shape[1] < max_len:
        raise _fail(f"page_table_1 {tuple(pt.shape)} is smaller than the batch [{bs}, {max_len}]")
    if req_to_token.shape[1] < max_len:
        raise _fail(f"req_to_token has {req_to_token.shape[1]} columns, max_len is {max_len}")
    if page_size > 1:
        rt = tensor("real_table", real_table, (I32,), 2)
        if rt.shape[0] < bs or rt.shape[1] < real_cols(max_len, page_size):
            raise _fail(f"real_table {tuple(rt.shape)} is smaller than [{bs}, {real_cols(max_len, page_size)}]")
    elif real_table is not None:
        raise _fail("real_table must be None when page_size == 1 (page_table_1 is the real table)")
    devs = {t.device for t in (req_to_token, idx, lens, cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, pt)
            if isinstance(t, torch.Tensor)}
    if real_table is not None:
        devs.add(real_table.device)
    if len(devs) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(str(d) for d in devs)}")
    return bs


def reference_into(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, *, cache_seqlens,
                   cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1, real_table=None) -> None:
    """SGLang 0.5.14's decode-branch torch ops (dsa_backend._apply_cuda_graph_metadata), writing the same buffers the
    same way: the CPU op runs it, and benchmarks/dsa_metadata_host.py times it as SGLang's side."""
    bs = req_pool_indices.shape[0]
    cache = seq_lens.to(I32)
    cache_seqlens[:bs].copy_(cache)
    cu_seqlens_k[1:bs + 1].copy_(torch.cumsum(cache, dim=0, dtype=I32))
    page_indices = req_to_token[req_pool_indices, :max_len]
    page_table_1[:bs, :max_len].copy_(page_indices)
    dsa = cache.clamp(max=topk)
    dsa_seqlens[:bs].copy_(dsa)
    dsa_cu[1:bs + 1].copy_(torch.cumsum(dsa, dim=0, dtype=I32))
    if page_size > 1:
        cols = torch.arange(0, max_len, page_size, device=req_to_token.device, dtype=I32)
        real = page_indices[:, cols] // page_size
        real_table[:real.shape[0], :real.shape[1]].copy_(real)


_kernels: dict[int, object] = {}


def _kernel(idx: int):
    k = _kernels.get(idx)
    if k is None:
        from ..jit.runtime import get_kernel
        k = _kernels[idx] = get_kernel(SPEC, device=torch.device("cuda", idx))
    return k


def _kernel_args(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k,
                 dsa_seqlens, dsa_cu, page_table_1, real_table) -> tuple:
    """The kernel's parameter list, in csrc/attn_core/dsa_decode_metadata.cu order."""
    bs = int(req_pool_indices.shape[0])
    return (req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1,
            real_table,  # None -> a null pointer (page_size 1)
            ctypes.c_int64(req_to_token.stride(0)), ctypes.c_int64(page_table_1.stride(0)),
            ctypes.c_int64(real_table.stride(0) if real_table is not None else 0),
            ctypes.c_int32(bs), ctypes.c_int32(max_len), ctypes.c_int32(topk), ctypes.c_int32(page_size),
            ctypes.c_int32(int(req_pool_indices.dtype == I64)), ctypes.c_int32(int(seq_lens.dtype == I64)))


@torch.library.custom_op("glm5_fastpath::dsa_decode_metadata",
                         mutates_args=("cache_seqlens", "cu_seqlens_k", "dsa_seqlens", "dsa_cu", "page_table_1",
                                       "real_table"))
def _dsa_decode_metadata(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         max_len: int, topk: int, page_size: int, cache_seqlens: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, dsa_seqlens: torch.Tensor, dsa_cu: torch.Tensor,
                         page_table_1: torch.Tensor, real_table: torch.Tensor | None) -> None:
    bs = _check(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k,
                dsa_seqlens, dsa_cu, page_table_1, real_table)
    if req_to_token.device.type == "cpu":
        reference_into(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size,
                       cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k, dsa_seqlens=dsa_seqlens, dsa_cu=dsa_cu,
                       page_table_1=page_table_1, real_table=real_table)
        return
    idx = require_hopper(OP, req_to_token.device, _fail)
    if bs == 0:
        return
    grid = (bs, max(1, -(-max_len // THREADS)), 1)
    env.print_config("dsa_decode_metadata", {"bs": bs, "max_len": max_len, "page_size": page_size}, {"grid": grid})
    _kernel(idx).launch(grid, (THREADS, 1, 1),
                        _kernel_args(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size,
                                     cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1, real_table))


@_dsa_decode_metadata.register_fake
def _dsa_decode_metadata_fake(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens,
                              cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1, real_table):
    _check(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k,
           dsa_seqlens, dsa_cu, page_table_1, real_table)


def dsa_decode_metadata(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        max_len: int, topk: int, page_size: int, *, cache_seqlens: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, dsa_seqlens: torch.Tensor, dsa_cu: torch.Tensor,
                        page_table_1: torch.Tensor, real_table: torch.Tensor | None = None) -> None:
    """Write one decode step's DSA metadata into the given buffers (module docstring)."""
    _check(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, cache_seqlens, cu_seqlens_k,
           dsa_seqlens, dsa_cu, page_table_1, real_table)
    torch.ops.glm5_fastpath.dsa_decode_metadata(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size,
                                                cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1,
                                                real_table)


MAX_LEN_ARG = 13  # index of max_len in _kernel_args


class FastLauncher:
    """Per-step launches into one fixed set of buffers (SGLang's static metadata buffers of one captured batch size,
    its static input slices): checked and packed once (Kernel.prepare); a call sets max_len and launches. The op's
    checks without its dispatcher and repacking, whose host time is the point of the DSA metadata route. The tensors
    must stay alive and in place (key: their data pointers, which the route compares every step). CPU tensors run the
    op (the reference)."""

    def __init__(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, topk: int,
                 page_size: int, *, cache_seqlens: torch.Tensor, cu_seqlens_k: torch.Tensor, dsa_seqlens: torch.Tensor,
                 dsa_cu: torch.Tensor, page_table_1: torch.Tensor, real_table: torch.Tensor | None = None):
        self.bufs = dict(cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k, dsa_seqlens=dsa_seqlens, dsa_cu=dsa_cu,
                         page_table_1=page_table_1, real_table=real_table)
        self.ins = (req_to_token, req_pool_indices, seq_lens)
        self.topk, self.page_size = topk, page_size
        self.bs = _check(*self.ins, 0, topk, page_size, **self.bufs)
        # the largest max_len the buffers take (what _check would accept), checked per call instead
        self.max_cols = min(page_table_1.shape[1], req_to_token.shape[1],
                            real_table.shape[1] * page_size if real_table is not None else page_table_1.shape[1])
        self.key = key_of(*self.ins, *self.bufs.values())
        self.prepared = None
        if req_to_token.device.type == "cuda":
            idx = require_hopper(OP, req_to_token.device, _fail)
            self.prepared = _kernel(idx).prepare((THREADS, 1, 1), _kernel_args(*self.ins, 0, topk, page_size,
                                                                               **self.bufs))

    def __call__(self, max_len: int) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not 0 <= max_len <= self.max_cols:
            raise _fail(f"max_len {max_len!r} outside 0..{self.max_cols} (the buffers' columns)")
        if self.prepared is None:
            dsa_decode_metadata(*self.ins, max_len, self.topk, self.page_size, **self.bufs)
            return
        if self.bs == 0:
            return
        self.prepared.vals[MAX_LEN_ARG].value = max_len
        self.prepared.launch((self.bs, max(1, -(-max_len // THREADS)), 1))


def key_of(*tensors) -> tuple:
    """Identity of a FastLauncher's tensors: data pointers (and, for the inputs, the dtypes and row counts)."""
    return tuple((t.data_ptr(), t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else None for t in tensors)


def compile_check_specs() -> list[KernelSpec]:
    return [SPEC]
