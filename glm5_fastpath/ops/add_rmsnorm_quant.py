"""A0: residual add + RMSNorm + per-token 1x128 FP8 quantization, as torch.library custom ops.

Math (the reference is glm5_fastpath.ref.prefix.a0_add_rmsnorm_quant):

    r            = fp32(hidden) + fp32(residual)
    residual_out = bf16(r)
    x            = bf16(r * rsqrt(mean(r^2) + eps) * fp32(weight))      (from the fp32 r)
    per 128-column group g of the bf16 x:
        x_scale[:, g] = max(amax_g |x|, 1e-10) / 448
        x_fp8[:, g]   = e4m3(x / x_scale[:, g])     round-to-nearest-even, saturating at +-448

Inputs: hidden, residual [M, H] bf16 contiguous (rows 16-byte aligned), weight [H] bf16, eps.
H must be a multiple of 256 (GLM-5: 6144; small preset: 512); M may be 0.
Outputs (A0Result): x [M, H] bf16, residual_out [M, H] bf16, x_fp8 [M, H] float8_e4m3fn,
x_scale [M, H/128] fp32 in one of two layouts:

- scale_layout="row" (default): row-major, strides (H/128, 1).
- scale_layout="col_tma": column-major with the M stride padded to a multiple of 4 floats
  (strides (1, align(M, 4))), the TMA-aligned MN-major layout DeepGEMM's sm90 FP8 GEMM
  (SGLang's `sglang_per_token_group_quant_fp8(..., column_major_scales=True,
  scale_tma_aligned=True)`) consumes, so the GEMM needs no transpose kernel.

Ops (namespace glm5_fastpath; each with a fake implementation for torch.compile / graphs):

- torch.ops.glm5_fastpath.add_rmsnorm_quant(hidden, residual, weight, eps, scale_layout="row",
  pdl=True, pdl_wait_at=2) -> (x, residual_out, x_fp8, x_scale), functional.
- torch.ops.glm5_fastpath.add_rmsnorm_quant_out(hidden, residual, weight, eps, x, residual_out,
  x_fp8, x_scale, pdl=True, pdl_wait_at=2) -> None, writes the four given outputs; residual_out may be residual
  itself (in place, SGLang's fused_add_rmsnorm convention: each element is read, then written,
  by the same thread); x_scale may have either layout.

The Python entry point `add_rmsnorm_quant(hidden, residual, weight, eps, out=None)` picks one:
out=None -> functional; out=residual -> in place; another tensor -> residual_out goes there;
a 4-tuple -> all outputs go there.

Kernel (csrc/attn_pre/a0_add_rmsnorm_quant.{cuh,cu}): one thread-block cluster per row (8 CTAs of
96 threads for H = 6144, config_for), one 16-byte vector per thread; the row's sum of squares is
exchanged between the cluster's CTAs through distributed shared memory (st.async + mbarrier), in a
fixed order, so the kernel is deterministic. No workspace: launches may run concurrently.

The kernel is launched with Programmatic Dependent Launch by default (pdl=True): it loads
`weight` (and arms its cluster barriers) before griddepcontrol.wait and reads hidden/residual only
after it, and lets the next kernel launch early. GLM5_FASTPATH_DISABLE_PDL=1 turns the attribute
off globally. PDL and the cluster launch combine (the programmatic edge is a stream property, the
cluster attribute only shapes the grid): tests/ops/test_add_rmsnorm_quant.py's control checks the
overlap with plain and with cluster-launched (2 and 8 CTAs) consumers through a producer/consumer
handshake. pdl_wait= ("entry" | "after_prologue" | "after_prefetch"; None = native) moves the first
griddepcontrol.wait (GLM5_PDL_WAIT_AT of csrc/common/pdl.cuh; a separate cubin) for the CMP
benchmark's PDL decomposition: "after_prologue" arms the barriers, then waits, then loads `weight`.
(Its first version raced a 50 us spin against the host's launch latency and failed on
the session-2 H200 run for that reason, not because of the cluster launch.)
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ..config import ACT_QUANT_EPS, FP8_BLOCK, FP8_MAX
from ._device import PDL_WAIT_NATIVE, check_wait_at, pdl_wait_code, wait_defines
from ._device import overlaps as _overlaps, require_aligned, require_hopper
from ..jit import KernelSpec, env

OP = "glm5_fastpath.add_rmsnorm_quant"
SOURCE = "attn_pre/a0_add_rmsnorm_quant.cu"
FUNCTION = "glm5_a0_add_rmsnorm_quant"
SCALE_LAYOUTS = ("row", "col_tma")
FP8 = torch.float8_e4m3fn
_VEC = 8  # bf16 per 16-byte vector
_WARP_COLS = 256  # columns one warp covers (one 16-byte vector per lane): two 128-column quant groups
_MAX_CLUSTER = 8  # portable thread-block cluster size
_MAX_THREADS = 1024
_SCALE_TMA_ALIGN = 4  # 16 bytes of fp32
_GRID_X_MAX = 2**31 - 1

# The kernel hard-codes the project's quant constants; fail at import if they ever drift apart.
if (FP8_BLOCK, FP8_MAX, ACT_QUANT_EPS) != (128, 448.0, 1e-10):
    raise ImportError(f"{OP}: csrc/attn_pre/a0_add_rmsnorm_quant.cuh hard-codes group 128, max 448, eps 1e-10; "
                      f"glm5_fastpath.config now says {FP8_BLOCK}, {FP8_MAX}, {ACT_QUANT_EPS}")


class A0Result(NamedTuple):
    x: torch.Tensor
    residual_out: torch.Tensor
    x_fp8: torch.Tensor
    x_scale: torch.Tensor


@dataclass(frozen=True)
class A0Config:
    hidden: int
    cluster: int  # CTAs per row (one thread-block cluster per row)
    wait_at: int = PDL_WAIT_NATIVE  # GLM5_PDL_WAIT_AT (csrc/common/pdl.cuh); native: no define

    @property
    def threads(self) -> int:
        """Threads per CTA: one 16-byte vector of the row each."""
        return self.hidden // self.cluster // _VEC

    @functools.cached_property
    def spec(self) -> KernelSpec:
        return KernelSpec(FUNCTION, source=SOURCE,
                          defines=(("GLM5_A0_HIDDEN", str(self.hidden)), ("GLM5_A0_CLUSTER", str(self.cluster)))
                          + wait_defines(self.wait_at))


_configs: dict[int, A0Config] = {}


def config_for(hidden: int) -> A0Config:
    """Cluster size (CTAs per row) for a row of `hidden` bf16.

    Rules: a warp covers 256 columns (one 16-byte vector per lane), so H % 256 == 0 keeps every
    128-column quant group on one half-warp; each CTA owns whole warps (H / 256 divisible by the
    cluster size); at most 8 CTAs per cluster (the portable limit) and 1024 threads per CTA. Prefer
    the largest cluster: a decode row is latency-bound, so spreading its loads and stores over more
    SMs shortens the chain, and the cross-CTA sum of squares costs one DSMEM push either way.
    GLM-5 (6144): 8 CTAs x 96 threads; small preset (512): 2 x 32; DeepSeek width (7168): 7 x 128.
    """
    cfg = _configs.get(hidden)
    if cfg is not None:
        return cfg
    if hidden <= 0 or hidden % _WARP_COLS:
        raise ValueError(f"{OP}: hidden size H={hidden} is not supported: H must be a positive multiple of 256")
    warps = hidden // _WARP_COLS
    for c in range(_MAX_CLUSTER, 0, -1):
        if warps % c == 0 and warps // c * 32 <= _MAX_THREADS:
            cfg = A0Config(hidden, c)
            break
    else:
        raise ValueError(f"{OP}: hidden size H={hidden} is not supported: needs H/256 = c*w with a cluster of "
                         f"c <= {_MAX_CLUSTER} CTAs of w <= {_MAX_THREADS // 32} warps")
    _configs[hidden] = cfg
    return cfg


# ---- validation (shared by the real and the fake implementation) ---------------------------------

def _fail(msg: str) -> ValueError:
    return ValueError(f"{OP}: {msg}")


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


def _check_eps(eps: object) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise _fail(f"eps must be a finite float >= 0, got {eps!r}")


def _check_inputs(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  scale_layout: str, residual_out: torch.Tensor | None = None) -> A0Config:
    _check_tensor("hidden", hidden, torch.bfloat16, 2)
    _check_tensor("residual", residual, torch.bfloat16, 2)
    _check_tensor("weight", weight, torch.bfloat16, 1)
    m, h = hidden.shape
    if tuple(residual.shape) != (m, h):
        raise _fail(f"residual shape {tuple(residual.shape)} != hidden shape {(m, h)}")
    if weight.shape[0] != h:
        raise _fail(f"weight has {weight.shape[0]} elements, expected H={h}")
    if residual_out is not None:
        _check_tensor("out (residual_out)", residual_out, torch.bfloat16, 2)
        if tuple(residual_out.shape) != (m, h):
            raise _fail(f"out shape {tuple(residual_out.shape)} != hidden shape {(m, h)}")
    devices = {t.device for t in (hidden, residual, weight, residual_out) if t is not None}
    if len(devices) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    _check_eps(eps)
    if scale_layout not in SCALE_LAYOUTS:
        raise _fail(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    cfg = config_for(int(h))
    if isinstance(m, int) and m * cfg.cluster > _GRID_X_MAX:
        raise _fail(f"M={m} rows exceeds the grid limit: M * {cfg.cluster} CTAs per row must be <= 2^31-1")
    return cfg




def _check_device(*ts: torch.Tensor) -> None:
    """Real-launch checks: a CUDA sm_90+ device and 16-byte aligned rows (16-byte loads/stores)."""
    dev = ts[0].device
    require_hopper(OP, dev, _fail)
    require_aligned(_fail, {f"tensor {i}": t for i, t in enumerate(ts)})




# ---- outputs and launch ---------------------------------------------------------------------------

def _new_outputs(hidden: torch.Tensor, scale_layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, h = hidden.shape
    g = h // FP8_BLOCK
    x = torch.empty_like(hidden)
    x8 = torch.empty((m, h), dtype=FP8, device=hidden.device)
    if scale_layout == "row":
        s = torch.empty((m, g), dtype=torch.float32, device=hidden.device)
    else:
        mp = (m + _SCALE_TMA_ALIGN - 1) // _SCALE_TMA_ALIGN * _SCALE_TMA_ALIGN
        s = torch.empty_strided((m, g), (1, mp), dtype=torch.float32, device=hidden.device)
    return x, x8, s


def _kernel_args(hidden, residual, weight, x, residual_out, x8, scale, eps: float) -> tuple:
    """The kernel's parameter list, in csrc/attn_pre/a0_add_rmsnorm_quant.cu order (checked at load)."""
    return (hidden, residual, weight, x, residual_out, x8, scale,
            ctypes.c_int64(scale.stride(0)), ctypes.c_int64(scale.stride(1)),
            ctypes.c_int32(hidden.shape[0]), ctypes.c_float(eps))


_kernels: dict[tuple[A0Config, int | None], object] = {}


def _kernel(cfg: A0Config, device: torch.device):
    k = _kernels.get((cfg, device.index))
    if k is None:
        env.print_config("add_rmsnorm_quant", {"H": cfg.hidden},
                         {"cluster": cfg.cluster, "threads": cfg.threads, "grid": f"M x {cfg.cluster} CTAs"})
        from ..jit.runtime import get_kernel
        k = _kernels[(cfg, device.index)] = get_kernel(cfg.spec, device=device)
    return k


def _launch(cfg: A0Config, hidden, residual, weight, eps, x, residual_out, x8, scale, pdl: bool,
            wait_at: int = PDL_WAIT_NATIVE) -> None:
    _check_device(hidden, residual, weight, x, residual_out, x8)  # x_scale: 4-byte scalar stores only
    m = hidden.shape[0]
    if m == 0:
        return
    if wait_at != PDL_WAIT_NATIVE:
        cfg = replace(cfg, wait_at=wait_at)
    kernel = _kernel(cfg, hidden.device)
    kernel.launch((m * cfg.cluster, 1, 1), (cfg.threads, 1, 1),
                  _kernel_args(hidden, residual, weight, x, residual_out, x8, scale, eps), pdl=pdl,
                  cluster=(cfg.cluster, 1, 1))


# ---- custom ops -----------------------------------------------------------------------------------

def _check_outputs(hidden: torch.Tensor, x: torch.Tensor, residual_out: torch.Tensor, x_fp8: torch.Tensor,
                   x_scale: torch.Tensor) -> None:
    m, h = hidden.shape
    g = h // FP8_BLOCK
    for name, t, dt in (("x", x, torch.bfloat16), ("residual_out", residual_out, torch.bfloat16), ("x_fp8", x_fp8, FP8)):
        _check_tensor(name, t, dt, 2)
        if tuple(t.shape) != (m, h):
            raise _fail(f"{name} shape {tuple(t.shape)} != hidden shape {(m, h)}")
    if not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (m, g):
        raise _fail(f"x_scale must be a float32 tensor of shape {(m, g)}, got "
                    f"{getattr(x_scale, 'dtype', type(x_scale).__name__)} {tuple(getattr(x_scale, 'shape', ()))}")
    s0, s1 = x_scale.stride()
    if m > 1 and g > 1 and not ((s1 >= 1 and s0 >= g * s1) or (s0 >= 1 and s1 >= m * s0)):
        raise _fail(f"x_scale strides {x_scale.stride()} make elements overlap; use row-major or column-major (1, ld>=M)")
    devices = {t.device for t in (hidden, x, residual_out, x_fp8, x_scale)}
    if len(devices) != 1:
        raise _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _check_no_overlap(hidden, residual, weight, x, residual_out, x_fp8, x_scale) -> None:
    """Outputs must not overlap inputs or each other; residual_out may be residual itself (in place)."""
    same = (residual_out.data_ptr() == residual.data_ptr() and residual_out.stride() == residual.stride())
    outs = {"x": x, "x_fp8": x_fp8, "x_scale": x_scale, "residual_out": residual_out}
    ins = {"hidden": hidden, "weight": weight, "residual": residual}
    for on, o in outs.items():
        for iname, i in ins.items():
            if on == "residual_out" and iname == "residual" and same:
                continue
            if _overlaps(o, i):
                hint = "; pass the residual tensor itself for the in-place form" if on == "residual_out" else ""
                raise _fail(f"output {on} overlaps input {iname} in memory{hint}")
    names = list(outs)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            if _overlaps(outs[names[a]], outs[names[b]]):
                raise _fail(f"outputs {names[a]} and {names[b]} overlap in memory")


@torch.library.custom_op("glm5_fastpath::add_rmsnorm_quant", mutates_args=())
def _add_rmsnorm_quant(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       scale_layout: str = "row", pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _check_inputs(hidden, residual, weight, eps, scale_layout)
    check_wait_at(OP, pdl_wait_at)
    x, x8, s = _new_outputs(hidden, scale_layout)
    residual_out = torch.empty_like(residual)
    _launch(cfg, hidden, residual, weight, eps, x, residual_out, x8, s, pdl, pdl_wait_at)
    return x, residual_out, x8, s


@_add_rmsnorm_quant.register_fake
def _add_rmsnorm_quant_fake(hidden, residual, weight, eps, scale_layout="row", pdl=True, pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(hidden, residual, weight, eps, scale_layout)
    check_wait_at(OP, pdl_wait_at)
    x, x8, s = _new_outputs(hidden, scale_layout)
    return x, torch.empty_like(residual), x8, s


@torch.library.custom_op("glm5_fastpath::add_rmsnorm_quant_out",
                         mutates_args=("x", "residual_out", "x_fp8", "x_scale"))
def _add_rmsnorm_quant_out(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           x: torch.Tensor, residual_out: torch.Tensor, x_fp8: torch.Tensor, x_scale: torch.Tensor,
                           pdl: bool = True, pdl_wait_at: int = PDL_WAIT_NATIVE) -> None:
    cfg = _check_inputs(hidden, residual, weight, eps, "row")
    _check_outputs(hidden, x, residual_out, x_fp8, x_scale)
    _check_no_overlap(hidden, residual, weight, x, residual_out, x_fp8, x_scale)
    check_wait_at(OP, pdl_wait_at)
    _launch(cfg, hidden, residual, weight, eps, x, residual_out, x_fp8, x_scale, pdl, pdl_wait_at)


@_add_rmsnorm_quant_out.register_fake
def _add_rmsnorm_quant_out_fake(hidden, residual, weight, eps, x, residual_out, x_fp8, x_scale, pdl=True,
                                pdl_wait_at=PDL_WAIT_NATIVE):
    _check_inputs(hidden, residual, weight, eps, "row")
    _check_outputs(hidden, x, residual_out, x_fp8, x_scale)
    check_wait_at(OP, pdl_wait_at)


def add_rmsnorm_quant(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      out: torch.Tensor | tuple | None = None, *, scale_layout: str = "row",
                      pdl: bool = True, pdl_wait: str | None = None) -> A0Result:
    """Fused residual add + RMSNorm + 1x128 FP8 quant; see the module docstring for the math.

    out:
      None                  allocate every output;
      a tensor              receives residual_out; `out=residual` updates residual in place;
      (x, residual_out, x_fp8, x_scale)
                            write all four (e.g. CUDA-graph static buffers); residual_out may be
                            residual; x_scale may be row-major or column-major (its strides are
                            used as given, scale_layout is then ignored).
    pdl_wait: where the kernel first waits under PDL (module docstring); None = native.
    Returns A0Result(x, residual_out, x_fp8, x_scale).
    """
    wait_at = pdl_wait_code(OP, pdl_wait, _fail)
    _check_eps(eps)  # before the op schema silently turns a bool into a float
    eps = float(eps)
    if out is None:
        return A0Result(*torch.ops.glm5_fastpath.add_rmsnorm_quant(hidden, residual, weight, eps, scale_layout, pdl,
                                                                        wait_at))
    if isinstance(out, torch.Tensor):
        _check_inputs(hidden, residual, weight, eps, scale_layout)
        x, x8, s = _new_outputs(hidden, scale_layout)
        outs = A0Result(x, out, x8, s)
    elif isinstance(out, (tuple, list)) and len(out) == 4:
        outs = A0Result(*out)
    else:
        raise _fail(f"out must be None, a residual_out tensor or a 4-tuple (x, residual_out, x_fp8, x_scale); "
                    f"got {type(out).__name__}")
    torch.ops.glm5_fastpath.add_rmsnorm_quant_out(hidden, residual, weight, eps, *outs, pdl, wait_at)
    return outs


def precompile(hidden_sizes: tuple[int, ...] = (6144,), device: object = None, wait_ats: tuple[int, ...] = (PDL_WAIT_NATIVE,)) -> None:
    """Compile (or fetch from cache) and load the kernels for these H on `device`, for each PDL wait point in
    `wait_ats`, ahead of first use."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for h in hidden_sizes:
        for w in wait_ats:
            _kernel(replace(config_for(h), wait_at=w), dev)


def compile_check_specs() -> list[KernelSpec]:
    """The variants scripts/compile_check.py builds: GLM-5 (H=6144) and the small preset (H=512)."""
    return [config_for(h).spec for h in (6144, 512)]
