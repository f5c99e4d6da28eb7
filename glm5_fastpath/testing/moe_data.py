"""Expert weights for MoE tests and checks (tests/moe, glm5_fastpath.moe.ep.selfcheck)."""
from __future__ import annotations

import torch

from ..ref.fp8 import FP8, quant_weight_block


def make_experts(n: int, hidden: int, inter: int, seed: int, device="cpu"):
    """n experts as stacked checkpoint-layout tensors (w13 gate||up [n, 2I, H], w2 [n, H, I] + scales),
    generated and block-quantised on `device` (GLM-5 size on a GPU: ~40 ms per expert). A random gain per gate/up row
    gives the FP8 row blocks different scales."""
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.empty(n, 2 * inter, hidden, dtype=FP8, device=device)
    s13 = torch.empty(n, 2 * inter // 128, hidden // 128, dtype=torch.float32, device=device)
    w2 = torch.empty(n, hidden, inter, dtype=FP8, device=device)
    s2 = torch.empty(n, hidden // 128, inter // 128, dtype=torch.float32, device=device)
    for e in range(n):
        row_gain = 1 + torch.rand(2 * inter, 1, generator=g, device=device)
        w13[e], s13[e] = quant_weight_block(torch.randn(2 * inter, hidden, generator=g, device=device) * 0.02 * row_gain)
        w2[e], s2[e] = quant_weight_block(torch.randn(hidden, inter, generator=g, device=device) * 0.02)
    return w13, s13, w2, s2
