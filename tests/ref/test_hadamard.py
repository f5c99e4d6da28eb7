"""The Walsh-Hadamard reference (glm5_fastpath.ref.hadamard) is SGLang 0.5.14's indexer rotation.

SGLang has no pure-torch fallback of `hadamard_transform` on CUDA (sglang.jit_kernel.hadamard runs Tri Dao's
fast-hadamard-transform; CUDA tensors only), so the convention is pinned three ways:
1. the matrix definition: H_1 = [1], H_2n = [[H, H], [H, -H]] (Sylvester), entries (-1)^popcount(i & j), the
   first rows of H_128, scipy's independent construction, and SGLang's own torch construction of a
   Walsh-Hadamard matrix (the NPU DSV4 backend's `_walsh_hadamard_matrix`, executed from the 0.5.14 source when
   GLM5_FASTPATH_SGLANG_0514_SRC points at it);
2. the data flow of SGLang's CUDA kernel for n = 128 (hadamard_jit.cuh: 16 threads x 8 bf16 elements; in-thread
   stages `x[idx] = a + b; x[idx + stride] = a - b` for strides 1, 2, 4; lane stages `x = sign * x + other`
   over lane masks 1, 2, 4, 8; `store_output` multiplies by the fp32 scale), emulated in fp32 here, equals our
   fp32 butterfly `fwht` bit for bit (the source facts it relies on are asserted against the 0.5.14 text when
   available);
3. the algebra the indexer relies on: orthonormal, self-inverse, q.k preserved.
"""
from __future__ import annotations

import ast
import math
import os
from pathlib import Path

import pytest
import torch

from glm5_fastpath.ref.hadamard import fwht, hadamard_128, hadamard_matrix, rotate_bf16, scale_f32

SGL_0514 = os.environ.get("GLM5_FASTPATH_SGLANG_0514_SRC")


def test_sylvester_definition_and_first_rows():
    assert hadamard_matrix(1, normalized=False).tolist() == [[1.0]]
    assert hadamard_matrix(2, normalized=False).tolist() == [[1, 1], [1, -1]]
    assert hadamard_matrix(4, normalized=False).tolist() == [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1],
                                                             [1, -1, -1, 1]]
    for n in (2, 4, 8, 16, 32, 64, 128):
        h, half = hadamard_matrix(n, normalized=False), hadamard_matrix(n // 2, normalized=False)
        assert torch.equal(h, torch.cat([torch.cat([half, half], 1), torch.cat([half, -half], 1)], 0))
    h = hadamard_matrix(128, normalized=False)
    i = torch.arange(128)
    popc = torch.tensor([bin(v).count("1") for v in range(128)])
    assert torch.equal(h, (1 - 2 * (popc[(i[:, None] & i[None, :])] % 2)).double())
    assert (h[0] == 1).all()  # row 0: all +1
    assert h[1, :8].tolist() == [1, -1, 1, -1, 1, -1, 1, -1]  # row 1: alternating
    assert h[2, :8].tolist() == [1, 1, -1, -1, 1, 1, -1, -1]
    assert h[64, :64].eq(1).all() and h[64, 64:].eq(-1).all()  # row 64: the top index bit
    assert torch.equal(h, h.t())
    hn = hadamard_128()
    assert hn.dtype == torch.float64 and torch.allclose(hn @ hn, torch.eye(128, dtype=torch.float64), atol=1e-14)
    assert torch.equal(hn, h * 128 ** -0.5)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(96)


def test_matches_scipy_construction():
    scipy_linalg = pytest.importorskip("scipy.linalg")
    for n in (1, 2, 16, 128):
        assert torch.equal(hadamard_matrix(n, normalized=False), torch.from_numpy(scipy_linalg.hadamard(n)).double())


def test_fwht_is_the_normalised_matrix_product():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 128, generator=g) * torch.rand(7, 3, 1, generator=g) * 40
    y = fwht(x)
    want = x.double() @ hadamard_128()
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert ((y.double() - want).abs() <= 4e-6 * want.abs().amax()).all()
    for n in (16, 32, 64):  # the small preset rotates 64-dim heads
        xs = torch.randn(5, n, generator=g)
        assert torch.allclose(fwht(xs).double(), xs.double() @ hadamard_matrix(n), atol=1e-5)


def test_orthonormal_self_inverse_and_dot_products_preserved():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    assert torch.allclose(fwht(fwht(q)), q, atol=1e-5)
    assert torch.allclose((fwht(q) * fwht(k)).sum(-1), (q * k).sum(-1), rtol=1e-5, atol=1e-4)
    assert torch.allclose(fwht(q).norm(dim=-1), q.norm(dim=-1), rtol=1e-6)


def test_scale_is_fp32_of_the_python_float():
    s = scale_f32(128)
    assert s == float(torch.tensor(128 ** -0.5, dtype=torch.float32))
    # the device constant (csrc/common/hadamard.cuh inv_sqrt_pow2): 2^-3 * fp32(sqrt(1/2)), power-of-two scaling exact
    assert s == float(torch.tensor(0.70710678118654752440, dtype=torch.float32)) / 8
    assert scale_f32(64) == 0.125 and scale_f32(16) == 0.25


def _sglang_kernel_emulation(x: torch.Tensor, scale: float) -> torch.Tensor:
    """SGLang's fast_hadamard_transform_kernel for n = 128 in fp32, lane by lane: kNThreads = 16, kNElts = 8
    (bf16), kNChunks = 1; thread t loads elements 8t .. 8t+7; hadamard_mult_thread<3, 1> then
    hadamard_mult_warp<4, 0, 1, 8>; store_output multiplies by scale."""
    rows = x.float().reshape(-1, 16, 8).clone()  # [row, lane, element]
    f32 = torch.float32
    for i in range(3):  # in-thread stages, strides 1, 2, 4
        stride = 1 << i
        for j in range(4):
            lo = j & (stride - 1)
            idx = (j - lo) * 2 + lo
            a, b = rows[:, :, idx].clone(), rows[:, :, idx + stride].clone()
            rows[:, :, idx], rows[:, :, idx + stride] = a + b, a - b
    lane = torch.arange(16)
    for step in range(4):  # lane stages, masks 1, 2, 4, 8: x = sign * x + other
        mask = 1 << step
        sign = torch.where((lane & mask) != 0, -1.0, 1.0).to(f32)[None, :, None]
        other = rows[:, lane ^ mask, :]
        rows = sign * rows + other
    return (rows * torch.tensor(scale, dtype=f32)).reshape(x.shape)


def test_fwht_equals_sglang_kernel_dataflow_bitwise():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(257, 128, generator=g) * 10).to(torch.bfloat16)  # SGLang rotates bf16 tensors
    ours = fwht(x)
    theirs = _sglang_kernel_emulation(x, 128 ** -0.5)
    assert torch.equal(ours, theirs)
    assert torch.equal(rotate_bf16(x), theirs.to(torch.bfloat16))  # the kernel's bf16 output
    # zeros / signed zeros / ties behave the same
    z = torch.zeros(2, 128, dtype=torch.bfloat16)
    z[1, 5] = -0.0
    assert torch.equal(fwht(z), _sglang_kernel_emulation(z, 128 ** -0.5))


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_sglang_0514_hadamard_source_facts():
    """The facts the emulation above and the adapter's detection rely on, in the 0.5.14 source text."""
    root = Path(SGL_0514) / "sglang"
    idx = (root / "srt/layers/attention/dsa/dsa_indexer.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(idx)) if isinstance(n, ast.FunctionDef) and n.name == "rotate_activation")
    src = "".join(ast.get_source_segment(idx, fn).split())
    assert "hidden_size=x.size(-1)" in src and "hadamard_transform(x,scale=hidden_size**-0.5)" in src
    assert "fromsglang.jit_kernel.hadamardimporthadamard_transform" in src
    py = (root / "jit_kernel/hadamard.py").read_text()
    assert 'cuda_wrappers=[\n            ("hadamard_transform", f"HadamardKernel<{args}>::run")' in py
    assert "_hadamard_transform_impl(x, scale, 8, module.hadamard_transform)" in py  # n=128: no padding
    cu = (root / "jit_kernel/csrc/fast-hadamard-transform/hadamard_jit.cuh").read_text()
    assert "} else if (params.log_N == 7) {\n    fast_hadamard_transform_launch<16, 7, input_t>(params, device);" in cu
    assert "static constexpr int kNElts = kNBytes == 4 ? 4 : 8;" in cu  # bf16: 8 elements per thread
    assert ("hadamard_mult_thread<kLogNElts, kNChunks>(x_vals);\n"
            "  hadamard_mult_warp<kLogWarpSize, 0, kNChunks, kNElts>(x_vals);") in cu
    assert "store_output<kNChunks, kNElts, input_t>(out, x_vals, params.dim, params.scale);" in cu
    common = (root / "jit_kernel/csrc/fast-hadamard-transform/fast_hadamard_transform_common.h").read_text()
    assert "x[c][idx] = a + b;\n        x[c][idx + stride] = a - b;" in common
    assert "const float sign = (lane_id & lane_mask) ? -1.f : 1.f;" in common
    assert "x[c][i] = sign * x[c][i] + x_val_other;" in common
    assert "out_vals_store[c][i] = out_vals[c][i] * scale;" in common
    assert "x_vals_load[c]" in common and "reinterpret_cast<const vec_t*>(x)[c * blockDim.x + threadIdx.x]" in common


@pytest.mark.skipif(not SGL_0514, reason="set GLM5_FASTPATH_SGLANG_0514_SRC to an unpacked sglang 0.5.14 wheel")
def test_sglang_0514_torch_walsh_hadamard_matrix():
    """SGLang's own pure-torch Walsh-Hadamard construction (0.5.14, NPU DSV4 backend), executed from its source:
    the same Sylvester matrix (it builds it in bf16, so entries are bf16(+-128**-0.5))."""
    path = Path(SGL_0514) / "sglang/srt/hardware_backend/npu/attention/ascend_dsv4_backend.py"
    text = path.read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "_walsh_hadamard_matrix")
    ns: dict = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), str(path), "exec"), ns)
    ns["_walsh_hadamard_matrix"]._cache = {}
    theirs = ns["_walsh_hadamard_matrix"](128, torch.float32, "cpu")
    ours = hadamard_128()
    assert theirs.shape == (128, 128)
    assert torch.equal(theirs.sign(), ours.sign())
    assert torch.allclose(theirs.double(), ours, rtol=2 ** -7)
