"""MoE executors for GLM-5 on Hopper.

| Python | torch.ops | kernel source |
|---|---|---|
| megamoe.mega_moe (MegaMoE: persistent fused FP8 MoE) | glm5_fastpath.mega_moe | csrc/moe/megamoe.{cuh,cu} |
| routed.routed_mega_moe (router + quant + plan in one kernel, then MegaMoE; opt-in, measured slower) | glm5_fastpath.routed_mega_moe | csrc/moe/router_plan.cu |

Importing registers the op and its fake implementation; no GPU or cuda-python is needed until the
first call (which compiles the kernels, or takes them from the JIT cache).
"""
from __future__ import annotations

from .megamoe import (
    MegaMoEConfig,
    MegaMoEInputError,
    MegaMoEWeights,
    default_config,
    mega_moe,
    precompile,
    prepare_weights,
    prepare_weights_from_experts,
)

__all__ = ["MegaMoEConfig", "MegaMoEInputError", "MegaMoEWeights", "default_config", "mega_moe", "precompile",
           "prepare_weights", "prepare_weights_from_experts"]
