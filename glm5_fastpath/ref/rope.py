"""Rotary position embedding as GLM-5 uses it: GPT-J interleaved pairs (2i, 2i+1), default (no YaRN)."""
from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, dim/2] fp32 for integer positions [T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim))
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, ..., dim] (fp32 math), cos/sin [T, dim/2]: out[2i] = x[2i]c - x[2i+1]s, out[2i+1] = x[2i+1]c + x[2i]s."""
    xf = x.float()
    shape = xf.shape
    xp = xf.reshape(*shape[:-1], shape[-1] // 2, 2)
    extra = xp.dim() - 3  # broadcast cos/sin over middle dims (heads)
    c = cos.reshape(cos.shape[0], *([1] * extra), cos.shape[1])
    s = sin.reshape(sin.shape[0], *([1] * extra), sin.shape[1])
    x0, x1 = xp[..., 0], xp[..., 1]
    return torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).reshape(shape)
