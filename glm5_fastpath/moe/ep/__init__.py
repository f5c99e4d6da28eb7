"""MegaMoE across GPUs (expert parallelism, issue #8): the CPU-testable foundation of the in-kernel EP kernel.

| module | what |
|---|---|
| layout | EP partition, per-rank dispatch plan (deterministic order), counts, combine map, symmetric-buffer layout + GLM-5 sizes |
| reference | the EP computation in PyTorch: dispatch / compute / combine (modes A, B, FP8), N simulated ranks or N gloo processes |
| staged | the staged baseline: all-gather dispatch -> grouped FP8 GEMM per local expert -> reduce-scatter combine |
| launch | run a function on N local processes with a gloo (CPU) or NCCL (GPU) group |
| bench | `glm5-fastpath bench moe --ep N`: staged baseline / DeepGEMM fp8_mega_moe / ours, slowest rank |

Design: docs/megamoe_ep.md. Importing this package needs only torch (no GPU, no torch.distributed init).
"""
from __future__ import annotations

from .layout import (CombineMap, EPBufferLayout, EPLayoutError, EPPartition, RankPlan, buffer_layout, combine_maps,
                     dispatch_plan, glm5_size_table, pair_counts, plan_all, token_counts)

__all__ = ["CombineMap", "EPBufferLayout", "EPLayoutError", "EPPartition", "RankPlan", "buffer_layout", "combine_maps",
           "dispatch_plan", "glm5_size_table", "pair_counts", "plan_all", "token_counts"]
