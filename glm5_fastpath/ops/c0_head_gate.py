"""C0: the indexer head gate w_raw = bf16(x . weights_proj^T) as a torch.library custom op.

Math (the reference is glm5_fastpath.ref.prefix.c0_head_gate):

    w_raw[m, h] = bf16_rn( sum_k fp32(x[m, k]) * fp32(weights_proj[h, k]) )      fp32 accumulation

Inputs: x_bf16 [M, H] bf16 contiguous (the normalized layer input, A0's x), weights_proj [heads, H]
bf16 contiguous. H must be a multiple of 256 (GLM-5: 6144; small preset: 512), heads a multiple of 4
and at most 32 (GLM-5: 32; small preset: 4), 0 <= M <= 256. Output: w_raw [M, heads] bf16.

Kernel (csrc/attn_pre/c0_head_gate.{cuh,cu}): grid (H/256 K chunks, ceil(M/32) token tiles) of
256-thread CTAs; each warp multiplies 32 columns of the 32 heads by up to 32 tokens with bf16
mma.sync (weights on the MMA M side); the 24 K-chunk partials (fp32) are reduced by the last CTA
to arrive at a self-resetting device counter, in a fixed order (bitwise deterministic). The weights
are loaded before griddepcontrol.wait (PDL), x after it.

Workspace: one per device (fp32 partials [8][H/256][32][heads] + uint32 counters [8], 0.79 MB for
GLM-5), allocated and zeroed once on first use (or by precompile()). Counters return to zero at the
end of every launch, so no per-call memset is needed and CUDA-graph replays may reuse it. Because it
is shared, launches on one device must not run concurrently on two streams (they are ordered on one
stream, or across streams by events, as SGLang's decode graph does); a PDL-overlapped next launch on
the same stream is safe (every workspace access follows griddepcontrol.wait).

Op: torch.ops.glm5_fastpath.c0_head_gate(x_bf16, weights_proj, pdl=True) -> w_raw (functional;
fake implementation registered for torch.compile / meta tensors). Python entry point:
c0_head_gate(x_bf16, weights_proj, *, pdl=True).
"""
from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

import torch

from ._device import device_index as _device_index, require_aligned, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.c0_head_gate"
SOURCE = "attn_pre/c0_head_gate.cu"
FUNCTION = "glm5_c0_head_gate"
MAX_TOKENS = 256
K_CHUNK = 256  # columns per CTA (C0HeadGateTile::kKChunk)
TOK_TILE = 32  # tokens per CTA (C0HeadGateTile::kTokTile)
THREADS = 256
MAX_TILES = -(-MAX_TOKENS // TOK_TILE)
MAX_SPLITS = 64  # the tile's static_assert: the last CTA holds one float4 per split in registers


@dataclass(frozen=True)
class C0Config:
    hidden: int
    heads: int

    @property
    def splits(self) -> int:
        return self.hidden // K_CHUNK

    @property
    def partial_floats(self) -> int:
        return MAX_TILES * self.splits * TOK_TILE * self.heads

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE,
                          defines=(("GLM5_C0_HIDDEN", str(self.hidden)), ("GLM5_C0_HEADS", str(self.heads))))


def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def config_for(hidden: int, heads: int) -> C0Config:
    if hidden <= 0 or hidden % K_CHUNK or hidden // K_CHUNK > MAX_SPLITS:
        raise _fail(f"hidden size H={hidden} is not supported: H must be a positive multiple of {K_CHUNK} "
                    f"and at most {K_CHUNK * MAX_SPLITS} (GLM-5: 6144, small preset: 512)")
    if heads < 4 or heads > 32 or heads % 4:
        raise _fail(f"{heads} indexer heads are not supported: heads must be a multiple of 4 in [4, 32] "
                    "(GLM-5: 32, small preset: 4)")
    return C0Config(int(hidden), int(heads))


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _check_tensor(name: str, t: object, dtype: torch.dtype, dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise _fail(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise _fail(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise _fail(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")
    return t


def _check_inputs(x: torch.Tensor, weights_proj: torch.Tensor) -> C0Config:
    _check_tensor("x_bf16", x, torch.bfloat16, 2)
    _check_tensor("weights_proj", weights_proj, torch.bfloat16, 2)
    m, h = x.shape
    heads, hw = weights_proj.shape
    if hw != h:
        raise _fail(f"weights_proj has {hw} columns but x_bf16 has H={h} (weights_proj must be [heads, H])")
    if m > MAX_TOKENS:
        raise _fail(f"M={m} tokens exceeds the supported maximum of {MAX_TOKENS} (decode batch)")
    if x.device != weights_proj.device:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, {x.device, weights_proj.device}))}")
    return config_for(int(h), int(heads))




def _check_device(*ts: torch.Tensor) -> None:
    dev = ts[0].device
    require_hopper(OP, dev, _fail)
    require_aligned(_fail, {f"tensor {i}": t for i, t in enumerate(ts)})


# ---- workspace and kernels (cached per device) ----------------------------------------------------

@dataclass
class _Workspace:
    partials: torch.Tensor  # fp32 [MAX_TILES * splits * 32 * heads]
    counters: torch.Tensor  # int32 (uint32 in the kernel) [MAX_TILES], zero between launches


_lock = threading.Lock()
_workspaces: dict[tuple[int, int, int], _Workspace] = {}
_kernels: dict[tuple[C0Config, int], object] = {}




def _workspace(cfg: C0Config, device: torch.device) -> _Workspace:
    idx = _device_index(device)
    key = (idx, cfg.hidden, cfg.heads)
    ws = _workspaces.get(key)
    if ws is None:
        with _lock:
            ws = _workspaces.get(key)
            if ws is None:
                dev = torch.device("cuda", idx)
                ws = _Workspace(torch.empty(cfg.partial_floats, dtype=torch.float32, device=dev),
                                torch.zeros(MAX_TILES, dtype=torch.int32, device=dev))
                _workspaces[key] = ws
    return ws


def _kernel(cfg: C0Config, device: torch.device):
    idx = _device_index(device)
    k = _kernels.get((cfg, idx))
    if k is None:
        env.print_config("c0_head_gate", {"H": cfg.hidden, "heads": cfg.heads},
                         {"threads": THREADS, "k_chunk": K_CHUNK, "splits": cfg.splits, "tok_tile": TOK_TILE,
                          "grid": f"({cfg.splits}, ceil(M/{TOK_TILE}))"})
        from ..jit.runtime import get_kernel
        k = _kernels[(cfg, idx)] = get_kernel(cfg.spec, device=torch.device("cuda", idx))
    return k


def _kernel_args(x, weights_proj, w_raw, ws: _Workspace) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/c0_head_gate.cu order (checked at load)."""
    return (x, weights_proj, w_raw, ws.partials, ws.counters, ctypes.c_int32(x.shape[0]))


def _launch(cfg: C0Config, x: torch.Tensor, weights_proj: torch.Tensor, w_raw: torch.Tensor, pdl: bool) -> None:
    _check_device(x, weights_proj, w_raw)
    m = x.shape[0]
    if m == 0:
        return
    kernel = _kernel(cfg, x.device)
    ws = _workspace(cfg, x.device)
    kernel.launch((cfg.splits, -(-m // TOK_TILE), 1), (THREADS, 1, 1), _kernel_args(x, weights_proj, w_raw, ws), pdl=pdl)


# ---- custom op --------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::c0_head_gate", mutates_args=())
def _c0_head_gate(x_bf16: torch.Tensor, weights_proj: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    cfg = _check_inputs(x_bf16, weights_proj)
    w_raw = torch.empty((x_bf16.shape[0], cfg.heads), dtype=torch.bfloat16, device=x_bf16.device)
    _launch(cfg, x_bf16, weights_proj, w_raw, pdl)
    return w_raw


@_c0_head_gate.register_fake
def _c0_head_gate_fake(x_bf16, weights_proj, pdl=True):
    cfg = _check_inputs(x_bf16, weights_proj)
    return x_bf16.new_empty((x_bf16.shape[0], cfg.heads))


def c0_head_gate(x_bf16: torch.Tensor, weights_proj: torch.Tensor, *, pdl: bool = True) -> torch.Tensor:
    """w_raw [M, heads] bf16 = bf16(x_bf16 . weights_proj^T), fp32 accumulation (ref.prefix.c0_head_gate)."""
    _check_inputs(x_bf16, weights_proj)  # before the dispatcher, so errors name this op even for odd inputs
    return torch.ops.glm5_fastpath.c0_head_gate(x_bf16, weights_proj, pdl)


def precompile(device: object = None, shapes: tuple[tuple[int, int], ...] = ((6144, 32),)) -> None:
    """Compile (or fetch from cache) and load the kernel for these (H, heads) on `device`, and allocate
    its workspace, ahead of first use (and outside any CUDA-graph capture)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h, n in shapes:
        cfg = config_for(h, n)
        _kernel(cfg, dev)
        _workspace(cfg, dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: GLM-5 (6144, 32 heads) and the small preset (512, 4)."""
    return [config_for(6144, 32).spec, config_for(512, 4).spec]
