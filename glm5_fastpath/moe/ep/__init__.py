"""MegaMoE across GPUs (expert parallelism, issue #8): the CPU-testable foundation of the in-kernel EP kernel.

| module | what |
|---|---|
| layout | EP partition, per-rank dispatch plan (deterministic order), counts, combine map, symmetric-buffer layout + GLM-5 sizes |
| reference | the EP computation in PyTorch: dispatch / compute / combine (modes A, B, FP8), N simulated ranks or N gloo processes |
| staged | the staged baseline: all-gather dispatch -> grouped FP8 GEMM per local expert -> reduce-scatter combine |
| launch | run a function on N local processes with a gloo (CPU) or NCCL (GPU) group |
| bench | `glm5-fastpath bench moe --ep N`: staged baseline / DeepGEMM fp8_mega_moe / ours, slowest rank |
| kernel | the in-kernel EP MegaMoE: SymLayout, EPBuffers (torch symmetric memory or simulated ranks), EPMegaMoE, the op |
| selfcheck | EP kernel vs the single-GPU kernel on the gathered batch (simulated ranks or one rank of a group) |

Design: docs/megamoe_ep.md. Importing this package needs only torch (no GPU, no torch.distributed init).
"""
from __future__ import annotations

from .kernel import EPBuffers, EPKernelError, EPMegaMoE, SymLayout, default_ep_config
from .layout import (CombineMap, EPBufferLayout, EPLayoutError, EPPartition, RankPlan, buffer_layout, combine_maps,
                     dispatch_plan, glm5_size_table, pair_counts, plan_all, token_counts)

__all__ = ["CombineMap", "EPBufferLayout", "EPBuffers", "EPKernelError", "EPLayoutError", "EPMegaMoE", "EPPartition",
           "RankPlan", "SymLayout", "buffer_layout", "combine_maps", "default_ep_config", "dispatch_plan",
           "glm5_size_table", "pair_counts", "plan_all", "token_counts"]
