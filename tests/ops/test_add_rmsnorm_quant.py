"""A0 add + RMSNorm + 1x128 FP8 quant: the custom op against exact references.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings; the CPU tests at the top check
argument validation and the fake (meta) implementation.

What is compared, and why each bar is where it is:
- residual_out must equal bf16(fp32(hidden) + fp32(residual)) bit for bit (same two roundings).
- x is checked twice: against a float64 formulation with the project's bf16 threshold, and
  against an fp32 emulation of the kernel's operation order, where it must agree to within one
  bf16 ulp on at most 0.1 % of the elements. Those flips come only from the sum of squares being
  added in another order (a 1-ulp different rstd moves a product across a bf16 rounding boundary,
  probability ~2^-15 per element).
- x_fp8 / x_scale are judged against the reference quantization (glm5_fastpath.ref.fp8) of the
  kernel's OWN bf16 x, so the first check's tolerance does not leak into this one. Both sides
  compute s = max(amax, 1e-10) / 448 and x / s with IEEE fp32 division and round to e4m3 with
  round-to-nearest-even, so they must agree bit for bit: scales exactly (asserted via rel err
  <= 1e-7), fp8 bytes exactly except that up to 1e-5 of the bytes may differ by one e4m3 ulp
  (room for a platform whose fp32 division on the CPU side is not correctly rounded; a kernel
  built with fast-math reciprocal division would flip far more and fail).
"""
from __future__ import annotations

import ctypes

import importlib

import pytest
import torch

from glm5_fastpath.ops import A0Result, add_rmsnorm_quant
from glm5_fastpath.ops.add_rmsnorm_quant import config_for
from glm5_fastpath.ref.fp8 import FP8, dequant_act, quant_act_per_token
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import PRODUCER_CTAS, late_producer, produce

OP = "add_rmsnorm_quant"
EPS = 1e-5
BF16 = torch.bfloat16
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]
H_VALUES = [6144, 512]

try:
    from glm5_fastpath.ref.prefix import a0_add_rmsnorm_quant as ref_prefix_a0  # being written concurrently
except ImportError:
    ref_prefix_a0 = None


# ---- helpers ------------------------------------------------------------------------------------------

def make_inputs(m: int, h: int, seed: int, device: str = "cuda"):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, h, generator=g) * 0.5
    residual = torch.randn(m, h, generator=g) * 2.0
    hidden[:, ::97] *= 16.0  # outlier channels: group amaxes differ a lot across groups
    if m >= 3:
        hidden[1].zero_()  # an all-zero row: rstd = 1/sqrt(eps), amax = 0 -> s = 1e-10/448, q = 0
        residual[1].zero_()
    weight = 1.0 + 0.2 * torch.randn(h, generator=g)
    return [t.to(BF16).to(device) for t in (hidden, residual, weight)]


def poisoned_outputs(m: int, h: int, device: str = "cuda", scale_layout: str = "row") -> A0Result:
    x = poison_(torch.empty(m, h, dtype=BF16, device=device))
    r = poison_(torch.empty(m, h, dtype=BF16, device=device))
    q = poison_(torch.empty(m, h, dtype=FP8, device=device))
    if scale_layout == "row":
        s = poison_(torch.empty(m, h // 128, dtype=torch.float32, device=device))
    else:
        mp = (m + 3) // 4 * 4
        s = poison_(torch.empty(h // 128, max(mp, 1), dtype=torch.float32, device=device)).t()[:m]
    return A0Result(x, r, q, s)


def _ordered_bf16(t: torch.Tensor) -> torch.Tensor:
    b = t.detach().cpu().contiguous().view(torch.int16).to(torch.int32)
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def _ordered_e4m3(t: torch.Tensor) -> torch.Tensor:
    b = t.detach().cpu().contiguous().view(torch.uint8).to(torch.int32)
    mag = b & 0x7F
    return torch.where(b >= 0x80, -mag, mag)


def check_outputs(hidden, residual_in, weight, eps, res: A0Result, ctx: str) -> None:
    """All four outputs of one call against the references (residual_in: residual before the call)."""
    m, h = hidden.shape
    assert_no_poison(OP, res.x, res.residual_out, res.x_fp8, res.x_scale,
                     names=["x", "residual_out", "x_fp8", "x_scale"])
    hc, rc, wc = hidden.cpu(), residual_in.cpu(), weight.cpu()

    # residual_out: exactly bf16 of the fp32 sum
    r32 = hc.float() + rc.float()
    assert_equal(OP, res.residual_out, r32.to(BF16), context=ctx + " residual_out")

    # x vs float64, with the project's bf16 bar
    r64 = hc.double() + rc.double()
    x64 = r64 * torch.rsqrt((r64 * r64).mean(-1, keepdim=True) + eps) * wc.double()
    assert_close(OP, res.x, x64, kind="bf16", context=ctx + " x vs float64")
    # x vs the fp32 emulation of the kernel's order: <= 1 ulp, on a tiny fraction
    rstd32 = 1.0 / torch.sqrt((r32 * r32).sum(-1, keepdim=True) / h + eps)
    x32 = ((r32 * rstd32) * wc.float()).to(BF16)
    ulps = (_ordered_bf16(res.x) - _ordered_bf16(x32)).abs()
    flips = int((ulps > 0).sum())
    assert int(ulps.max()) <= 1 and flips <= max(1, int(1e-3 * ulps.numel())), (
        f"{OP} [{ctx}]: x differs from the fp32 emulation by up to {int(ulps.max())} ulp in {flips} of {ulps.numel()}")

    # fp8 + scales vs the reference quantization of the kernel's own bf16 x
    q_ref, s_ref = quant_act_per_token(res.x.cpu())
    assert_close(OP, res.x_scale.cpu(), s_ref, tol=1e-7, context=ctx + " x_scale")
    d = (_ordered_e4m3(res.x_fp8) - _ordered_e4m3(q_ref)).abs()
    nbad = int((d > 0).sum())
    assert int(d.max()) <= 1 and nbad <= int(1e-5 * d.numel()), (
        f"{OP} [{ctx}]: x_fp8 differs from quant_act_per_token(x) in {nbad} of {d.numel()} bytes (max {int(d.max())} ulp)")
    # and the whole path stays close to the exact math
    assert_close(OP, dequant_act(res.x_fp8.cpu(), res.x_scale.cpu()), x64, kind="fp8_vs_exact",
                 context=ctx + " dequant vs float64")

    if ref_prefix_a0 is not None:  # the project's reference, once it lands
        rx, rres, rq, rs = ref_prefix_a0(hc, rc, wc, eps)
        assert_equal(OP, res.residual_out, rres.cpu(), context=ctx + " vs ref.prefix residual_out")
        assert_close(OP, res.x, rx.cpu(), kind="bf16", context=ctx + " vs ref.prefix x")
        assert_close(OP, dequant_act(res.x_fp8.cpu(), res.x_scale.cpu()),
                     dequant_act(rq.cpu(), rs.cpu()), kind="fp8_same_quant", context=ctx + " vs ref.prefix fp8")


# ---- CPU: validation and fake implementation ---------------------------------------------------------

def _cpu_inputs(m=4, h=512):
    return (torch.zeros(m, h, dtype=BF16), torch.zeros(m, h, dtype=BF16), torch.ones(h, dtype=BF16))


@pytest.mark.parametrize("mutate, match", [
    (lambda h, r, w: (h.float(), r, w), "hidden must be torch.bfloat16"),
    (lambda h, r, w: (h, r[:, :256].contiguous(), w), "residual shape"),
    (lambda h, r, w: (h, r, w[:256]), "weight has 256 elements"),
    (lambda h, r, w: (h[None], r, w), "hidden must be 2-D"),
    (lambda h, r, w: (torch.zeros(512, 4, dtype=BF16).t(), r, w), "hidden must be contiguous"),
    (lambda h, r, w: (h[:, :384].contiguous(), r[:, :384].contiguous(), w[:384].contiguous()), "multiple of 256"),
    (lambda h, r, w: (h, r, w), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(mutate, match):
    h, r, w = mutate(*_cpu_inputs())
    with pytest.raises(ValueError, match=match) as ei:
        add_rmsnorm_quant(h, r, w, EPS)
    assert "glm5_fastpath.add_rmsnorm_quant" in str(ei.value)


@pytest.mark.parametrize("eps", [-1.0, float("nan"), "1e-5", True])
def test_bad_eps(eps):
    h, r, w = _cpu_inputs()
    with pytest.raises(ValueError, match="eps"):
        add_rmsnorm_quant(h, r, w, eps)


def test_bad_scale_layout_and_out():
    h, r, w = _cpu_inputs()
    with pytest.raises(ValueError, match="scale_layout"):
        add_rmsnorm_quant(h, r, w, EPS, scale_layout="col")
    with pytest.raises(ValueError, match="out must be"):
        add_rmsnorm_quant(h, r, w, EPS, out=(h, r))


def test_config_choice():
    assert (config_for(6144).cluster, config_for(6144).threads) == (8, 96)  # GLM-5: 8 CTAs x 3 warps per row
    assert (config_for(512).cluster, config_for(512).threads) == (2, 32)
    assert (config_for(7168).cluster, config_for(7168).threads) == (7, 128)  # DeepSeek width: 28 warps = 7 x 4
    assert (config_for(256).cluster, config_for(256).threads) == (1, 32)
    assert (config_for(65536).cluster, config_for(65536).threads) == (8, 1024)
    for bad in (0, 128, 500, 2 * 65536 + 256):
        with pytest.raises(ValueError, match="not supported"):
            config_for(bad)
    spec = config_for(6144).spec
    assert dict(spec.defines) == {"GLM5_A0_HIDDEN": "6144", "GLM5_A0_CLUSTER": "8"}


@pytest.mark.parametrize("h", [6144, 512, 7168, 256])
def test_cluster_partition_covers_the_row(h):
    """Mirror of A0AddRmsNormQuantClusterTile::run's indexing: CTA `rank`, thread `tid` owns the 8 columns
    at rank * H/cluster + 8 * tid. Every column once; every 128-column quant group on one aligned
    half-warp of one CTA (so the group amax is a 16-lane shuffle and lane 0 of the half writes the scale)."""
    cfg = config_for(h)
    cta_cols = h // cfg.cluster
    seen = torch.zeros(h, dtype=torch.int32)
    group_owner: dict[int, set] = {}
    for rank in range(cfg.cluster):
        for tid in range(cfg.threads):
            col = rank * cta_cols + 8 * tid
            seen[col:col + 8] += 1
            group_owner.setdefault(col // 128, set()).add((rank, tid // 16))
    assert bool((seen == 1).all())
    assert len(group_owner) == h // 128 and all(len(v) == 1 for v in group_owner.values())
    assert cfg.cluster <= 8 and cfg.threads % 32 == 0 and cfg.threads <= 1024


def test_grid_limit_counts_the_cluster():
    h = torch.empty(2**31 // 8 + 1, 6144, dtype=BF16, device="meta")
    with pytest.raises(ValueError, match="grid limit"):
        torch.ops.glm5_fastpath.add_rmsnorm_quant(h, h, torch.empty(6144, dtype=BF16, device="meta"), EPS, "row", True)


@pytest.mark.parametrize("layout, stride", [("row", (48, 1)), ("col_tma", (1, 8))])
def test_fake_shapes_and_scale_layouts(layout, stride):
    h = torch.empty(5, 6144, dtype=BF16, device="meta")
    w = torch.empty(6144, dtype=BF16, device="meta")
    x, ro, q, s = torch.ops.glm5_fastpath.add_rmsnorm_quant(h, torch.empty_like(h), w, EPS, layout, True)
    assert (x.shape, x.dtype, ro.shape, ro.dtype, q.dtype) == (h.shape, BF16, h.shape, BF16, FP8)
    assert tuple(s.shape) == (5, 48) and s.stride() == stride and s.dtype == torch.float32


def test_fake_under_torch_compile_meta():
    def f(h, r, w):
        o = add_rmsnorm_quant(h, r, w, EPS, out=r)
        return o.x, o.x_fp8, o.x_scale
    h = torch.empty(3, 512, dtype=BF16, device="meta")
    outs = torch.compile(f, backend="aot_eager", fullgraph=True)(h, torch.empty_like(h),
                                                                 torch.empty(512, dtype=BF16, device="meta"))
    assert [tuple(o.shape) for o in outs] == [(3, 512), (3, 512), (3, 4)]


# ---- GPU -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_into_poisoned_outputs(m, h, seed, no_pdl_override):
    hidden, residual, weight = make_inputs(m, h, seed + 7 * m + h)
    out = poisoned_outputs(m, h)
    res = add_rmsnorm_quant(hidden, residual, weight, EPS, out=out)
    torch.cuda.synchronize()
    assert res.x is out.x and res.x_scale is out.x_scale
    check_outputs(hidden, residual, weight, EPS, res, f"{m=} {h=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("h", [7168, 256])
@pytest.mark.parametrize("m", [1, 7, 33])
def test_other_cluster_shapes(m, h, seed, no_pdl_override):
    """A cluster of 7 CTAs x 4 warps (H = 7168) and a cluster of one CTA (H = 256) run the same tile."""
    hidden, residual, weight = make_inputs(m, h, seed + 3 * m + h)
    out = poisoned_outputs(m, h)
    add_rmsnorm_quant(hidden, residual, weight, EPS, out=out)
    torch.cuda.synchronize()
    check_outputs(hidden, residual, weight, EPS, out, f"{m=} {h=} cluster={config_for(h).cluster}")


@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
@pytest.mark.parametrize("m", [1, 31, 256, 4096])
def test_functional_op_and_pdl_off(m, h, seed):
    hidden, residual, weight = make_inputs(m, h, seed + m)
    res = add_rmsnorm_quant(hidden, residual, weight, EPS)
    res_nopdl = add_rmsnorm_quant(hidden, residual, weight, EPS, pdl=False)
    torch.cuda.synchronize()
    check_outputs(hidden, residual, weight, EPS, res, f"{m=} {h=} {seed=}")
    for a, b, n in zip(res, res_nopdl, A0Result._fields):
        assert_equal(OP, a, b, context=f"pdl on vs off: {n}")  # deterministic kernel


@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
@pytest.mark.parametrize("m", [1, 3, 64])
def test_in_place_residual(m, h, seed):
    hidden, residual, weight = make_inputs(m, h, seed + 11 * m)
    residual_before = residual.clone()
    res = add_rmsnorm_quant(hidden, residual, weight, EPS, out=residual)
    torch.cuda.synchronize()
    assert res.residual_out is residual
    check_outputs(hidden, residual_before, weight, EPS, res, f"in place {m=} {h=}")
    # and through the all-outputs form with residual_out = residual
    residual2 = residual_before.clone()
    out = poisoned_outputs(m, h)
    out = A0Result(out.x, residual2, out.x_fp8, out.x_scale)
    add_rmsnorm_quant(hidden, residual2, weight, EPS, out=out)
    torch.cuda.synchronize()
    check_outputs(hidden, residual_before, weight, EPS, out, f"in place via out tuple {m=} {h=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 64])
def test_column_major_tma_scales_match_row_major(m, seed):
    hidden, residual, weight = make_inputs(m, 6144, seed)
    row = add_rmsnorm_quant(hidden, residual, weight, EPS)
    col = add_rmsnorm_quant(hidden, residual, weight, EPS, scale_layout="col_tma")
    poisoned = poisoned_outputs(m, 6144, scale_layout="col_tma")
    add_rmsnorm_quant(hidden, residual, weight, EPS, out=poisoned)
    torch.cuda.synchronize()
    mp = (m + 3) // 4 * 4
    assert col.x_scale.stride() == (1, mp) and poisoned.x_scale.stride() == (1, mp)
    for other in (col, poisoned):
        assert_equal(OP, other.x_scale.contiguous(), row.x_scale, context=f"col_tma scales {m=}")
        assert_equal(OP, other.x_fp8, row.x_fp8, context=f"col_tma fp8 {m=}")


@pytest.mark.gpu
def test_empty_batch():
    hidden, residual, weight = make_inputs(0, 512, 0)
    res = add_rmsnorm_quant(hidden, residual, weight, EPS)
    assert [tuple(t.shape) for t in res] == [(0, 512), (0, 512), (0, 512), (0, 4)]


@pytest.mark.gpu
def test_gpu_error_cases(monkeypatch):
    hidden, residual, weight = make_inputs(4, 512, 0)
    buf = torch.empty(4 * 512 + 1, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        add_rmsnorm_quant(buf[1:].view(4, 512), residual, weight, EPS)
    with pytest.raises(ValueError, match="one device"):
        add_rmsnorm_quant(hidden, residual, weight.cpu(), EPS)
    with pytest.raises(ValueError, match="overlaps input hidden"):
        add_rmsnorm_quant(hidden, residual, weight, EPS, out=hidden)
    # residual_out sharing memory with residual, shifted by one row: a partial overlap
    base = torch.empty(5 * 512, dtype=BF16, device="cuda")
    res_a, res_b = base[: 4 * 512].view(4, 512), base[512:].view(4, 512)
    res_a.copy_(residual)
    with pytest.raises(ValueError, match="overlaps input residual"):
        add_rmsnorm_quant(hidden, res_a, weight, EPS, out=res_b)
    out = poisoned_outputs(4, 512)
    with pytest.raises(ValueError, match="x_scale must be a float32"):
        add_rmsnorm_quant(hidden, residual, weight, EPS, out=(out.x, out.residual_out, out.x_fp8, out.x_scale[:, :2]))
    with pytest.raises(ValueError, match="outputs x and residual_out overlap"):
        add_rmsnorm_quant(hidden, residual, weight, EPS, out=(out.x, out.x, out.x_fp8, out.x_scale))
    # a pre-Hopper GPU is refused before any compile or launch
    monkeypatch.setattr(importlib.import_module("glm5_fastpath.ops._device"), "_capability_ok", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(RuntimeError, match="Hopper"):
        add_rmsnorm_quant(hidden, residual, weight, EPS)


# ---- PDL ------------------------------------------------------------------------------------------------

# The PDL control pair (the late producer itself is glm5_fastpath.testing.pdl's).
PDL_TEST_KERNELS = r"""
#include "common/pdl.cuh"
// Control producer: lets its dependents launch at once, then waits (bounded by timeout_ns) until
// `expect` consumer CTAs have checked in, and only then copies src -> dst. With PDL the consumer runs
// during that wait; without overlap the wait times out and the consumer starts after the copy.
extern "C" __global__ void pdl_test_wait_checkins_then_copy(const uint4* src, uint4* dst, long long n_vec,
                                                            unsigned int* checkins, unsigned int expect,
                                                            unsigned long long timeout_ns) {
    glm5::ptx::griddep_launch_dependents();
    if (threadIdx.x == 0) {
        const uint64_t t0 = glm5::ptx::globaltimer_ns();
        while (atomicAdd(checkins, 0u) < expect && glm5::ptx::globaltimer_ns() - t0 < timeout_ns) {
        }
    }
    __syncthreads();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
// Control consumer: copies src -> dst. do_wait: checks in, then griddepcontrol.wait, then copies.
// Otherwise copies first and checks in after the whole CTA's copy (so the producer's copy comes
// strictly after every read of this consumer when the two overlap).
extern "C" __global__ void pdl_test_copy(const uint4* src, uint4* dst, long long n_vec, int do_wait,
                                         unsigned int* checkins) {
    if (do_wait) {
        if (threadIdx.x == 0) atomicAdd(checkins, 1u);
        glm5::ptx::griddep_wait();
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
    if (!do_wait) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(checkins, 1u);
        }
    }
}
"""


def _pdl_spec():
    from glm5_fastpath.jit import KernelSpec
    return KernelSpec("pdl_test_kernels", code=PDL_TEST_KERNELS,
                      functions=("pdl_test_wait_checkins_then_copy", "pdl_test_copy"))


def _pdl_kernels():
    from glm5_fastpath.jit import get_kernel
    return late_producer(), get_kernel(_pdl_spec(), "pdl_test_copy")


CONTROL_TIMEOUT_NS = 20_000_000  # 20 ms: only reached when the consumer did NOT overlap (or waits)


@pytest.mark.gpu
@pytest.mark.parametrize("consumer_cluster", [None, 2, 8])
def test_pdl_control_shows_the_attribute_takes_effect(consumer_cluster, no_pdl_override):
    """A consumer WITHOUT griddepcontrol.wait, launched with PDL, reads stale data: the launch attribute
    really lets it start under the running producer (else the A0 PDL test proves nothing); the same
    consumer WITH the wait reads the new data. Also with the consumer launched as clusters (A0's launch
    shape): PDL overlap does not depend on the cluster attribute.

    A handshake, not a race against the host: the producer copies only after every consumer CTA has
    checked in (or after a 20 ms timeout). The first version spun a fixed 50 us and relied on the host
    submitting the consumer within that time; on the session-2 H200 run it did not (first launches of
    the process, Python launch overhead), the consumer ran after the producer's copy and the control
    failed although nothing was wrong with PDL."""
    from glm5_fastpath.jit import get_kernel
    producer = get_kernel(_pdl_spec(), "pdl_test_wait_checkins_then_copy")
    copy = get_kernel(_pdl_spec(), "pdl_test_copy")
    src = torch.randn(64, 6144, device="cuda").to(BF16)
    n_vec = src.numel() * 2 // 16
    ctas = 64
    checkins = torch.zeros(1, dtype=torch.int32, device="cuda")
    cluster = None if consumer_cluster is None else (consumer_cluster, 1, 1)

    def run(do_wait: int, dst: torch.Tensor, seen: torch.Tensor) -> None:
        producer.launch((PRODUCER_CTAS, 1, 1), (256, 1, 1),
                        [src, dst, ctypes.c_int64(n_vec), checkins, ctypes.c_uint32(ctas),
                         ctypes.c_uint64(CONTROL_TIMEOUT_NS)], pdl=False)
        copy.launch((ctas, 1, 1), (256, 1, 1), [dst, seen, ctypes.c_int64(n_vec), ctypes.c_int32(do_wait), checkins],
                    pdl=True, cluster=cluster)

    # warm-up: both kernels loaded and launched once outside the checked sequence
    checkins.zero_()
    run(1, torch.empty_like(src), torch.empty_like(src))
    torch.cuda.synchronize()
    for do_wait, expect_fresh in ((0, False), (1, True)):
        dst = torch.full_like(src, 7.0)
        seen = torch.zeros_like(src)
        checkins.zero_()
        torch.cuda.synchronize()
        run(do_wait, dst, seen)
        torch.cuda.synchronize()
        fresh = torch.equal(seen, src)
        stale = int((seen == 7.0).sum())
        if expect_fresh:
            assert fresh, f"with griddepcontrol.wait the consumer still saw {stale} stale elements ({cluster=})"
        else:
            assert stale == seen.numel(), (f"PDL overlap not observed ({cluster=}): the consumer saw "
                                           f"{seen.numel() - stale} fresh elements, so it ran after the producer's copy")


@pytest.mark.gpu
@pytest.mark.parametrize("m, h", [(1, 6144), (16, 6144), (64, 6144), (256, 6144), (31, 512)])
def test_a0_waits_for_the_previous_kernel_under_pdl(m, h, seed, no_pdl_override):
    producer, _ = _pdl_kernels()
    hidden_true, residual, weight = make_inputs(m, h, seed)
    hidden = torch.full_like(hidden_true, 7.0)  # stale until the producer overwrites it
    add_rmsnorm_quant(hidden, residual, weight, EPS)  # compile + load outside the timed sequence
    for _ in range(3):
        hidden.fill_(7.0)
        out = poisoned_outputs(m, h)
        torch.cuda.synchronize()
        produce(producer, hidden_true, hidden)
        add_rmsnorm_quant(hidden, residual, weight, EPS, out=out, pdl=True)
        torch.cuda.synchronize()
        check_outputs(hidden_true, residual, weight, EPS, out, f"PDL after producer {m=} {h=}")


# ---- CUDA graphs / torch.compile ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m, h", [(16, 6144), (3, 512)])
def test_cuda_graph_capture_and_replay(m, h, seed, no_pdl_override):
    producer, _ = _pdl_kernels()
    hidden_src, residual, weight = make_inputs(m, h, seed)
    static_hidden = torch.empty_like(hidden_src)
    static_residual = residual.clone()
    out = poisoned_outputs(m, h)
    # warm up (compile/load) outside capture
    add_rmsnorm_quant(hidden_src, residual, weight, EPS, out=poisoned_outputs(m, h))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, hidden_src, static_hidden)           # producer -> A0 with a PDL edge
        add_rmsnorm_quant(static_hidden, static_residual, weight, EPS, out=out, pdl=True)
        func = add_rmsnorm_quant(static_hidden, static_residual, weight, EPS)  # graph-pool outputs
    for step in range(3):
        new_hidden, new_residual, _ = make_inputs(m, h, seed + 100 + step)
        hidden_src.copy_(new_hidden)
        static_residual.copy_(new_residual)
        for t in out:
            poison_(t)
        static_hidden.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        check_outputs(new_hidden, new_residual, weight, EPS, out, f"graph replay {step} {m=} {h=}")
        check_outputs(new_hidden, new_residual, weight, EPS, A0Result(*func), f"graph replay functional {step}")


@pytest.mark.gpu
def test_torch_compile_fullgraph(seed):
    m, h = 8, 6144
    hidden, residual, weight = make_inputs(m, h, seed)

    def layer(hd, res, w):
        o = add_rmsnorm_quant(hd, res, w, EPS, out=res)  # in place, as a model layer would
        return o.x.float() * 2.0, o.x_fp8, o.x_scale  # elementwise: exact in both modes

    res_eager = residual.clone()
    want = layer(hidden, res_eager, weight)
    res_comp = residual.clone()
    got = torch.compile(layer, fullgraph=True)(hidden, res_comp, weight)
    torch.cuda.synchronize()
    assert_equal(OP, res_comp, res_eager, context="torch.compile in-place residual")
    assert_equal(OP, got[1], want[1], context="torch.compile fp8")
    assert_equal(OP, got[2], want[2], context="torch.compile scales")
    assert_equal(OP, got[0], want[0], context="torch.compile x")


@pytest.mark.gpu
def test_opcheck_schema_and_fake(seed):
    hidden, residual, weight = make_inputs(4, 512, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.add_rmsnorm_quant.default,
                          (hidden, residual, weight, EPS, "row", True), test_utils=("test_schema", "test_faketensor"))
    z = lambda *shape, dt=BF16: torch.zeros(*shape, dtype=dt, device="cuda")  # noqa: E731
    out = (z(4, 512), z(4, 512), z(4, 512, dt=torch.uint8).view(FP8), z(4, 4, dt=torch.float32))
    # torch's schema checker compares mutated tensors arithmetically, which CUDA fp8 does not support,
    # so the out variant's schema is checked directly: exactly the four outputs are marked as written.
    torch.library.opcheck(torch.ops.glm5_fastpath.add_rmsnorm_quant_out.default,
                          (hidden, residual, weight, EPS, *out, True), test_utils=("test_faketensor",))
    schema = torch.ops.glm5_fastpath.add_rmsnorm_quant_out.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["x", "residual_out", "x_fp8", "x_scale"], written


@pytest.mark.gpu
@pytest.mark.parametrize("h", H_VALUES)
def test_kernel_resources_report(h):
    """The loaded cubin has no local memory (spills) and the param layout check is active."""
    from glm5_fastpath.jit import get_kernel
    cfg = config_for(h)
    k = get_kernel(cfg.spec)
    assert k.local_bytes == 0, k
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4), k.param_sizes
    assert 0 < k.num_regs <= 64 and k.max_threads >= cfg.threads, k
