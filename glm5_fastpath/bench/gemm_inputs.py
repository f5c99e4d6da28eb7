"""Random inputs and byte counts of one block-FP8 skinny GEMM, shared by the GEMM diagnostics (bench gemm-phases,
gemm-layout, gemm-chain) and their tests: one definition of what those benches feed the kernel and of the bytes
their floors count."""
from __future__ import annotations

from typing import Any


def random_fp8_linear(n: int, k: int, g: Any, device: Any) -> Any:
    """Fp8Linear: e4m3 weight [N, K] (N(0, 0.05) before the cast: no saturation) + scale_inv in [0.5, 1.5)."""
    import torch

    from ..weights import Fp8Linear
    return Fp8Linear((torch.randn(n, k, device=device, generator=g) * 0.05).to(torch.float8_e4m3fn),
                     torch.rand(-(-n // 128), k // 128, device=device, generator=g) + 0.5)


def random_fp8_act(m: int, k: int, g: Any, device: Any) -> tuple[Any, Any]:
    """(x8 [M, K] e4m3, xs [M, K / 128] fp32 in [0.5, 1.5)): never zeros, so a skipped stage shows."""
    import torch
    return (torch.randn(m, k, device=device, generator=g).to(torch.float8_e4m3fn),
            torch.rand(m, k // 128, device=device, generator=g) + 0.5)


def fp8_gemm_bytes(m: int, n: int, k: int) -> int:
    """Bytes one launch must move: weights + their scales, activations + their scales, the bf16 output."""
    return n * k + 4 * (-(-n // 128)) * (k // 128) + m * k + 4 * m * (k // 128) + 2 * m * n


def flush_l2(device: Any) -> None:
    """Write 256 MB (> 2x the H200's 60 MB L2) so the next launch reads its inputs from DRAM."""
    import torch
    torch.empty(256 << 20, dtype=torch.uint8, device=device).fill_(1)
