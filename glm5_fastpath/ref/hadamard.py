"""Normalised Walsh-Hadamard transform in Sylvester order: the indexer rotation of SGLang 0.5.14.

SGLang 0.5.14's DSA indexer rotates the indexer key and query after RoPE and before the FP8 quant
(`rotate_activation`, srt/layers/attention/dsa/dsa_indexer.py: `hadamard_transform(x, scale=n**-0.5)`
with n = x.size(-1) = 128; kernel jit_kernel/csrc/fast-hadamard-transform/, Tri Dao's
fast-hadamard-transform). The matrix is Sylvester's

    H_1 = [1],   H_2n = [[H_n, H_n], [H_n, -H_n]],   so H_n[i, j] = (-1) ** popcount(i & j),

symmetric, and H_n / sqrt(n) is orthonormal (its own inverse): y = x @ (H_n / sqrt(n)) = H_n x / sqrt(n).
Because the same rotation is applied to q and k, q . k is unchanged (up to the FP8 rounding after it),
which is why the indexer may rotate at all, and why E1 needs no change.

Two formulations:
* `hadamard_matrix(n)` / `hadamard_128()`: the matrix (float64, exact +-1 entries times n**-0.5 rounded
  once), for tests and for anything that wants a matmul;
* `fwht(x)`: the fp32 butterfly the kernels run, bit for bit: stages in index-bit order 0..log2(n)-1, each
  (lo, hi) <- (lo + hi, lo - hi) with fp32 rounding, then ONE fp32 multiply by fp32(n**-0.5). This is the
  operation order of SGLang's kernel (in-thread strides 1, 2, 4, then lane strides 8..64, `store_output`
  scales last) and of ours (csrc/common/hadamard.cuh), so given the same input the fp32 results are
  identical; against the float64 matmul it differs by a few fp32 ulps (summation order).
"""
from __future__ import annotations

import functools

import torch


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"Walsh-Hadamard size must be a positive power of two, got {n!r}")


@functools.lru_cache(maxsize=None)
def _sylvester(n: int) -> torch.Tensor:
    _check_n(n)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_matrix(n: int, normalized: bool = True, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """H_n in Sylvester order (entries +-1), times n**-0.5 when normalized; a fresh tensor."""
    h = _sylvester(n)
    if normalized:
        h = h * n ** -0.5
    return h.to(dtype)


def hadamard_128(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The normalised 128-point Walsh-Hadamard matrix (GLM-5's index head dim), Sylvester order."""
    return hadamard_matrix(128, True, dtype)


def scale_f32(n: int) -> float:
    """fp32(n**-0.5): the scale SGLang passes (a Python float, converted to the kernel's fp32 argument)."""
    _check_n(n)
    return float(torch.tensor(n ** -0.5, dtype=torch.float32))


def fwht(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Walsh-Hadamard transform of the last dim (a power of two) in fp32, in the kernels' operation order
    (module doc); `scale` defaults to n**-0.5 (the normalised transform). Returns fp32."""
    n = x.shape[-1]
    _check_n(n)
    y = x.to(torch.float32).reshape(-1, n)
    rows = y.shape[0]
    h = 1
    while h < n:  # index bit log2(h): pairs (i, i + h) with bit clear / set
        v = y.view(rows, n // (2 * h), 2, h)
        lo, hi = v[:, :, 0, :], v[:, :, 1, :]
        y = torch.stack((lo + hi, lo - hi), dim=2).reshape(rows, n)
        h *= 2
    s = torch.tensor(scale_f32(n) if scale is None else scale, dtype=torch.float32)
    return (y * s).reshape(x.shape)


def rotate_bf16(x: torch.Tensor) -> torch.Tensor:
    """SGLang 0.5.14's rotate_activation on a bf16 tensor: fp32 butterflies, scale, rounded to bf16."""
    return fwht(x).to(torch.bfloat16)


__all__ = ["fwht", "hadamard_128", "hadamard_matrix", "rotate_bf16", "scale_f32"]
