"""`glm5-fastpath demo`: one GLM-5 decode layer (attention prefix + attention core + MoE) through the best
available path, with per-op time, bytes moved and the H200 bytes floor from the cost model.

Today the best path is the pure-PyTorch reference (on CUDA tensors when a GPU is present); on a
Hopper GPU with the JIT toolchain the A0 kernel replaces the A0 reference op. As the prefix kernels,
the executors and MegaMoE land they take over their ops here.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import cost
from .config import Glm5Config
from .graph.eager import run_eager
from .graph.prefix_graph import build_prefix_graph, op_impls, prefix_env
from .platform import PlatformInfo, detect
from .ref.attn_core import attention_core
from .ref.moe import dense_mlp_forward, moe_forward
from .ref.prefix import a0_add_rmsnorm_quant
from .testing.decode_step import make_decode_step
from .weights import DenseMLPWeights, LayerWeights, random_layer

log = logging.getLogger(__name__)


@dataclass
class DemoResult:
    device: str
    path: dict[str, str]  # op -> which implementation ran
    times_us: dict[str, float]
    costs: list[cost.OpCost]
    distinct_experts: int | None
    output: torch.Tensor


def _timer(device: torch.device, times: dict[str, float], repeat: int) -> Callable:
    def hook(name, run):
        out = run()  # warm (first call may allocate / compile)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeat - 1):
            out = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times[name] = (time.perf_counter() - t0) / max(repeat - 1, 1) * 1e6 if repeat > 1 else float("nan")
        return out
    return hook


def _kernel_impls(info: PlatformInfo, cfg: Glm5Config, say: Callable[[str], None]) -> tuple[dict, set[str]]:
    """Per-op kernels that can run here (replacing the reference in the eager graph). An op whose kernel
    raises falls back to the reference for the rest of the run, and the demo says so."""
    if not all(p.available for p in info.paths if p.name.startswith("JIT kernels")):
        return {}, set()
    try:
        from . import ops
    except Exception as e:  # noqa: BLE001 - the demo falls back to the reference, and says so
        say(f"kernels unavailable ({e}); using the reference")
        return {}, set()
    kernels = op_impls(cfg, ops)
    refs = op_impls(cfg, None)
    failed: set[str] = set()

    def guarded(name):
        def run(ins):
            if name not in failed:
                try:
                    return kernels[name](ins)
                except Exception as e:  # noqa: BLE001
                    failed.add(name)
                    say(f"{name}: kernel failed ({type(e).__name__}: {e}); using the reference")
            return refs[name](ins)
        return run
    return {name: guarded(name) for name in kernels}, failed


def run_demo(cfg: Glm5Config, *, layer: int | None = None, batch: int = 4, kv_len: int = 4096, seed: int = 0,
             device: str = "auto", weights: LayerWeights | None = None, repeat: int = 3,
             say: Callable[[str], None] = print) -> DemoResult:
    info = detect()
    dev = torch.device("cuda" if (device == "auto" and info.cuda_available) else ("cpu" if device == "auto" else device))
    if layer is None:
        layer = cfg.first_k_dense_replace  # the first MoE layer
    if weights is None:
        say(f"generating synthetic weights of layer {layer} (seed {seed}; experts are generated when routed to)...")
        t0 = time.perf_counter()
        weights = random_layer(cfg, layer, seed=seed, device=dev)
        say(f"  attention weights ready in {time.perf_counter() - t0:.1f} s")
    if weights.attn.indexer is None:
        raise ValueError(f"layer {layer} is a GLM-5.2 shared (IndexShare) layer: the demo needs a full-indexer layer; "
                         f"pick one of {cfg.full_indexer_layers[:6]}...")
    seq_lens = [kv_len] * batch
    step = make_decode_step(cfg, seq_lens, seed=seed + 1, device=dev)
    graph = build_prefix_graph(cfg, full_indexer=True)
    env = prefix_env(graph, hidden=step.hidden, residual=step.residual, positions=step.positions,
                     out_cache_loc=step.out_cache_loc, seq_lens=step.seq_lens, block_table=step.block_table,
                     w=weights.attn, kv_cache=step.kv_cache, index_k_cache=step.index_k_cache)
    impls, failed = _kernel_impls(info, cfg, say) if dev.type == "cuda" else ({}, set())
    times: dict[str, float] = {}
    hook = _timer(dev, times, repeat)
    say(f"running the attention prefix (M={batch}, KV={kv_len} per sequence) on {dev.type}...")
    out = run_eager(graph, env, impls=impls, hook=hook)
    path = {op: ("kernel" if op in impls and op not in failed else f"reference ({dev.type})")
            for op in graph.topo_order()}

    say("running the attention core (sparse MLA, W_UV, o_proj) and the post-attention norm...")
    attn_out = hook("attn_core", lambda: attention_core(out["q_lat"], out["q_pe"], out["kv_cache_written"],
                                                        out["topk_slots"], weights.attn, cfg))
    h, resid2, _, _ = hook("M0.norm", lambda: a0_add_rmsnorm_quant(attn_out, out["residual_out"],
                                                                   weights.post_attn_norm, cfg.rms_norm_eps))
    distinct = None
    if isinstance(weights.mlp, DenseMLPWeights):
        say("running the dense MLP...")
        y = hook("mlp", lambda: dense_mlp_forward(h, weights.mlp))
        mlp_costs = cost.dense_mlp_costs(cfg, batch)
    else:
        say("running the MoE (router, routed experts + shared expert, combine)...")
        res = hook("moe", lambda: moe_forward(h, weights.mlp, cfg, return_routing=True))
        y, routing = res
        ids = routing.topk_ids
        distinct = routing.n_distinct
        mlp_costs = cost.moe_costs(cfg, batch, routing=ids.cpu())
    for name in ("attn_core", "M0.norm", "moe" if distinct is not None else "mlp"):
        path[name] = f"reference ({dev.type})"
    costs = (cost.fused_prefix_costs(cfg, batch, seq_lens)
             + [cost.total(cost.attn_core_costs(cfg, batch, seq_lens), "attn_core", "F0 sparse MLA + F1 W_UV + F2 o_proj")]
             + [c for c in mlp_costs if c.name == "M0.norm"]
             + [cost.total([c for c in mlp_costs if c.name != "M0.norm"], "moe" if distinct is not None else "mlp",
                           "router + experts + combine" if distinct is not None else "dense SwiGLU MLP")])
    return DemoResult(device=dev.type, path=path, times_us=times, costs=costs, distinct_experts=distinct, output=y)


def render(res: DemoResult) -> str:
    lines = ["time here = host-timed eager calls (incl. launch and Python overhead); kernel timings come from the benchmarks.",
             "", "| op | path | time here (us) | MB moved | H200 floor (us) @4.27 TB/s |", "|---|---|---:|---:|---:|"]
    tot_t = tot_b = 0.0
    for c in res.costs:
        t = res.times_us.get(c.name, float("nan"))
        tot_t += t
        tot_b += c.bytes
        lines.append(f"| {c.name} | {res.path.get(c.name, '?')} | {t:,.0f} | {c.bytes / 1e6:,.2f} | {c.t_mem_us():,.2f} |")
    lines.append(f"| **layer** | | **{tot_t:,.0f}** | **{tot_b / 1e6:,.1f}** | **{tot_b / cost.H200_COPY_BW * 1e6:,.1f}** |")
    if res.distinct_experts is not None:
        lines.append(f"\ndistinct routed experts touched: {res.distinct_experts} (+1 shared)")
    return "\n".join(lines)
