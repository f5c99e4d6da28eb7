"""C0: the indexer head gate w_raw = bf16(x . weights_proj^T) as a torch.library custom op.

Math (the reference is glm5_fastpath.ref.prefix.c0_head_gate):

    w_raw[m, h] = bf16_rn( sum_k fp32(x[m, k]) * fp32(weights_proj[h, k]) )      fp32 accumulation

Inputs: x_bf16 [M, H] bf16 contiguous (the normalized layer input, A0's x), weights_proj [heads, H]
bf16 contiguous. H must be a multiple of 256 (GLM-5: 6144; small preset: 512), heads a multiple of 4
and at most 32 (GLM-5: 32; small preset: 4), 0 <= M <= 256. Output: w_raw [M, heads] bf16.

Kernel (csrc/attn_pre/c0_head_gate.{cuh,cu}): one thread-block cluster per tile of 8 tokens (M <= 128)
or 16 tokens (M > 128), of `cluster` CTAs (8 for GLM-5) of 256 threads; CTA r owns K slice r (768
columns for GLM-5: its 48 KB of weights are loaded into registers before griddepcontrol.wait, PDL),
multiplies it by the tile's tokens with bf16 mma.sync, and the K slices are summed inside the cluster
through distributed shared memory (st.async + mbarrier) in a fixed order: bitwise deterministic, no
workspace, no global round trip. So launches may also run concurrently on several streams.

Op: torch.ops.glm5_fastpath.c0_head_gate(x_bf16, weights_proj, pdl=True, pdl_wait_at=2) -> w_raw
(functional; fake implementation registered for torch.compile / meta tensors). Python entry point:
c0_head_gate(x_bf16, weights_proj, *, pdl=True, pdl_wait=None). pdl_wait ("entry" | "after_prologue"
| "after_prefetch"; None = native = after the weight loads) moves the kernel's first
griddepcontrol.wait (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a separate cubin) for the CMP
benchmark's PDL decomposition.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, replace

import torch

from ._device import PDL_WAIT_NATIVE, check_wait_at, pdl_wait_code, wait_defines
from ._device import device_index as _device_index, require_aligned, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.c0_head_gate"
SOURCE = "attn_pre/c0_head_gate.cu"
FUNCTION = "glm5_c0_head_gate"
MAX_TOKENS = 256
K_CHUNK = 256  # columns of one K chunk (C0HeadGateTile::kKChunk); a CTA owns H / 256 / cluster of them
THREADS = 256
MAX_CLUSTER = 8  # portable thread-block cluster size
MAX_SPLITS = 64  # C0HeadGateTile's static_assert (shared with the MoE router)
NT_SMALL_M_MAX = 128  # M <= this: 8-token tiles (nt=1); above: 16-token tiles (nt=2)


@dataclass(frozen=True)
class C0Config:
    hidden: int
    heads: int
    nt: int = 1  # n8 token tiles per cluster: tokens per cluster = 8 * nt
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define

    @property
    def splits(self) -> int:
        """256-column K chunks."""
        return self.hidden // K_CHUNK

    @property
    def cluster(self) -> int:
        """CTAs per cluster = K slices: the largest c <= 8 that divides the chunks evenly."""
        return next(c for c in range(MAX_CLUSTER, 0, -1) if self.splits % c == 0)

    @property
    def tok_tile(self) -> int:
        return 8 * self.nt

    def grid(self, m: int) -> tuple[int, int, int]:
        return (self.cluster, -(-m // self.tok_tile), 1)

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE,
                          defines=(("GLM5_C0_HIDDEN", str(self.hidden)), ("GLM5_C0_HEADS", str(self.heads)),
                                   ("GLM5_C0_NT", str(self.nt)), ("GLM5_C0_CLUSTER", str(self.cluster)))
                          + wait_defines(self.wait_at))


def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


def config_for(hidden: int, heads: int, m: int = 1) -> C0Config:
    """The kernel variant for (H, heads) at M tokens.

    Token tile: 8 tokens per cluster up to M = 128 (at most 16 clusters = 128 CTAs, one per SM, and
    the fewest x bytes per CTA), 16 above (M = 256 stays at 16 clusters, so the next launch's CTAs
    still fit beside this one's and prefetch their weights early).
    """
    if hidden <= 0 or hidden % K_CHUNK or hidden // K_CHUNK > MAX_SPLITS:
        raise _fail(f"hidden size H={hidden} is not supported: H must be a positive multiple of {K_CHUNK} "
                    f"and at most {K_CHUNK * MAX_SPLITS} (GLM-5: 6144, small preset: 512)")
    if heads < 4 or heads > 32 or heads % 4:
        raise _fail(f"{heads} indexer heads are not supported: heads must be a multiple of 4 in [4, 32] "
                    "(GLM-5: 32, small preset: 4)")
    return C0Config(int(hidden), int(heads), 1 if m <= NT_SMALL_M_MAX else 2)


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
    return config_for(int(h), int(heads))  # the token tile is chosen at launch (M may be symbolic here)


def _check_device(*ts: torch.Tensor) -> None:
    dev = ts[0].device
    require_hopper(OP, dev, _fail)
    require_aligned(_fail, {f"tensor {i}": t for i, t in enumerate(ts)})


# ---- kernels (cached per device) ---------------------------------------------------------------------

_kernels: dict[tuple[C0Config, int], object] = {}


def _kernel(cfg: C0Config, device: torch.device):
    idx = _device_index(device)
    k = _kernels.get((cfg, idx))
    if k is None:
        env.print_config("c0_head_gate", {"H": cfg.hidden, "heads": cfg.heads, "nt": cfg.nt},
                         {"threads": THREADS, "cluster": cfg.cluster, "k_per_cta": cfg.hidden // cfg.cluster,
                          "tok_tile": cfg.tok_tile, "grid": f"({cfg.cluster}, ceil(M/{cfg.tok_tile}))"})
        from ..jit.runtime import get_kernel
        k = _kernels[(cfg, idx)] = get_kernel(cfg.spec, device=torch.device("cuda", idx))
    return k


def _kernel_args(x, weights_proj, w_raw) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/c0_head_gate.cu order (checked at load)."""
    return (x, weights_proj, w_raw, ctypes.c_int32(x.shape[0]))


def _launch(cfg: C0Config, x: torch.Tensor, weights_proj: torch.Tensor, w_raw: torch.Tensor, pdl: bool,
            wait_at: int = PDL_WAIT_NATIVE) -> None:
    _check_device(x, weights_proj, w_raw)
    m = x.shape[0]
    if m == 0:
        return
    cfg = config_for(cfg.hidden, cfg.heads, m)
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    kernel = _kernel(cfg, x.device)
    kernel.launch(cfg.grid(m), (THREADS, 1, 1), _kernel_args(x, weights_proj, w_raw), pdl=pdl,
                  cluster=(cfg.cluster, 1, 1))


# ---- custom op --------------------------------------------------------------------------------------

@torch.library.custom_op("glm5_fastpath::c0_head_gate", mutates_args=())
def _c0_head_gate(x_bf16: torch.Tensor, weights_proj: torch.Tensor, pdl: bool = True,
                  pdl_wait_at: int = PDL_WAIT_NATIVE) -> torch.Tensor:
    cfg = _check_inputs(x_bf16, weights_proj)
    check_wait_at(OP, pdl_wait_at)
    w_raw = torch.empty((x_bf16.shape[0], cfg.heads), dtype=torch.bfloat16, device=x_bf16.device)
    _launch(cfg, x_bf16, weights_proj, w_raw, pdl, pdl_wait_at)
    return w_raw


@_c0_head_gate.register_fake
def _c0_head_gate_fake(x_bf16, weights_proj, pdl=True, pdl_wait_at=PDL_WAIT_NATIVE):
    cfg = _check_inputs(x_bf16, weights_proj)
    check_wait_at(OP, pdl_wait_at)
    return x_bf16.new_empty((x_bf16.shape[0], cfg.heads))


def c0_head_gate(x_bf16: torch.Tensor, weights_proj: torch.Tensor, *, pdl: bool = True,
                 pdl_wait: str | None = None) -> torch.Tensor:
    """w_raw [M, heads] bf16 = bf16(x_bf16 . weights_proj^T), fp32 accumulation (ref.prefix.c0_head_gate).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native."""
    wait_at = pdl_wait_code(OP, pdl_wait, _fail)
    _check_inputs(x_bf16, weights_proj)  # before the dispatcher, so errors name this op even for odd inputs
    return torch.ops.glm5_fastpath.c0_head_gate(x_bf16, weights_proj, pdl, wait_at)


def _variants(hidden: int, heads: int) -> list[C0Config]:
    """Every kernel variant the launcher may pick for (H, heads): one per token-tile size."""
    return [config_for(hidden, heads, 1), config_for(hidden, heads, MAX_TOKENS)]


def precompile(device: object = None, shapes: tuple[tuple[int, int], ...] = ((6144, 32),),
               wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,)) -> None:
    """Compile (or fetch from cache) and load the kernels for these (H, heads) on `device`, every
    token-tile variant, for each PDL wait point in `wait_ats` (GLM5_PDL_WAIT_AT codes), ahead of first use
    (and outside any CUDA-graph capture). No workspace is needed."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h, n in shapes:
        for cfg in _variants(h, n):
            for w in wait_ats:
                _kernel(replace(cfg, wait_at=w), dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: GLM-5 (6144, 32 heads) and the small preset (512, 4),
    both token-tile sizes each."""
    return [cfg.spec for h, n in ((6144, 32), (512, 4)) for cfg in _variants(h, n)]
