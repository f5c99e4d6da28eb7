"""The whole decode MoE layer from the post-attention hidden state: router + MegaMoE in two kernels.

    routed_mega_moe(h, gate, bias, router_cfg, weights) -> (out [M, H] bf16, topk_ids [M, k] int32,
                                                              topk_weights [M, k] fp32)

Kernels (csrc/moe/router_plan.cu, then csrc/moe/megamoe.cu's persistent kernel with PDL):

1. `glm5_moe_router_plan` / `glm5_moe_router_decode_plan`: the router of ops.moe_router (same tile code, so the
   same ids, weights and logits bit for bit), writing MegaMoE's 1x128 FP8 input as it goes (the router-quant
   option, bit for bit ops.act_quant), whose last CTA then runs MegaMoE's plan (token lists per expert, task list,
   counter resets) over the ids it has just written;
2. `glm5_megamoe`, the persistent kernel, unchanged.

The unfused sequence is four kernels: router -> act quant -> plan (1 CTA) -> MegaMoE. In the engine profile of
2026-12-01 (H200, batch 1 / 8) the plan kernel alone held the MoE back 5.5 / 8 us per layer: its own launch and wait
behind the router, then cold code for a few hundred pairs. Here it runs in the router's last CTA, which already
holds the routing.

Where it applies (`supported`): the single-GPU build (the EP plan gathers across ranks), M >= 1, and one token tile of
the split-K router (M <= 32) unless the decode router takes the call (ops.moe_router.use_decode). Elsewhere the
caller keeps the separate kernels; the SGLang MoE executor does so, and also when SGLang's padded rows must be
masked between the router and the plan (expert parallelism), which this op does not do.

Outputs equal `mega_moe(act_quant(h), moe_route(h, ...))` bit for bit (tests/moe/test_routed.py, GPU).
"""
from __future__ import annotations

import ctypes
import functools
import threading

import torch

from ..config import ACT_QUANT_EPS
from ..jit import KernelSpec
from ..ops import moe_router as R
from . import megamoe as MM

OP = "glm5_fastpath.routed_mega_moe"
SOURCE = "moe/router_plan.cu"
FUNCTION = "glm5_moe_router_plan"
FUNCTION_DECODE = "glm5_moe_router_decode_plan"
MAX_SPLITK_TOKENS = R.TOK_TILE  # the split-K router's last CTA sees every token only with one token tile


class RoutedMoEInputError(ValueError):
    pass


def _fail(msg: str) -> RoutedMoEInputError:
    return RoutedMoEInputError(f"{OP}: {msg}")


@functools.lru_cache(maxsize=None)
def kernel_spec(router: R.RouterConfig, moe_spec: KernelSpec) -> KernelSpec:
    """The fused build: the router's defines plus the MegaMoE build's (the plan depends on its token block, pool
    and H / I)."""
    if any(k == "GLM5_MEGAMOE_EP" for k, _ in moe_spec.defines):
        raise _fail("the expert-parallel MegaMoE build plans across ranks; it has no fused router")
    defines = tuple(moe_spec.defines) + (("GLM5_ROUTER_HIDDEN", str(router.hidden)),
                                         ("GLM5_ROUTER_EXPERTS", str(router.experts)),
                                         ("GLM5_ROUTER_TOPK", str(router.topk)))
    return KernelSpec(FUNCTION, source=SOURCE, defines=defines, functions=(FUNCTION, FUNCTION_DECODE))


def supported(m: int, router: R.RouterConfig, decode: bool | None = None) -> bool:
    """Whether routed_mega_moe takes M tokens with this router config (the rule in the module doc)."""
    return 1 <= m <= R.MAX_TOKENS and (R.use_decode(m, decode, router) or m <= MAX_SPLITK_TOKENS)


_lock = threading.Lock()
_kernels: dict[tuple[KernelSpec, int, str], object] = {}


def _kernel(spec: KernelSpec, dev: torch.device, function: str):
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    key = (spec, idx, function)
    k = _kernels.get(key)
    if k is None:
        from ..jit.runtime import get_kernel
        with _lock:
            k = _kernels.get(key)
            if k is None:
                k = _kernels[key] = get_kernel(spec, function, device=torch.device("cuda", idx))
    return k


def _check(h, gate, bias, topk: int, weights: "MM.MegaMoEWeights") -> R.RouterConfig:
    rc = R._check_inputs(h, gate, bias, topk)
    if not isinstance(weights, MM.MegaMoEWeights):
        raise _fail(f"weights must be a MegaMoEWeights (moe.prepare_weights), got {type(weights).__name__}")
    if weights.hidden != rc.hidden:
        raise _fail(f"h has H={rc.hidden} but the experts take H={weights.hidden}")
    if weights.num_experts != rc.experts:
        raise _fail(f"the gate scores {rc.experts} experts but the expert weights hold {weights.num_experts} routed ones")
    return rc


@torch.library.custom_op("glm5_fastpath::routed_mega_moe", mutates_args=())
def _routed_mega_moe(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, topk: int, w13: torch.Tensor,
                     w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, num_shared: int,
                     routed_scaling_factor: float, block_n: int, stages: int, group_size: int, split_waves: int,
                     lean_fences: bool = False, pool: bool = False, token_major: bool = False, end_combine: bool = False,
                     decode: bool | None = None, pdl: bool = True, pair: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = MM.MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), bool(pool), 0,
                           bool(token_major), bool(end_combine), bool(pair)).validate()
    rc = R._check_inputs(h, gate, bias, topk)
    m, hid = h.shape
    dev = h.device
    rsf = float(routed_scaling_factor)
    ids = torch.empty((m, topk), dtype=torch.int32, device=dev)
    wts = torch.empty((m, topk), dtype=torch.float32, device=dev)
    if m == 0:
        return torch.empty((0, hid), dtype=torch.bfloat16, device=dev), ids, wts
    if not supported(m, rc, decode):
        raise _fail(f"M={m} tokens: the split-K router plans only one token tile (M <= {MAX_SPLITK_TOKENS}) and the "
                    "decode router is not chosen for this M; run ops.moe_router + moe.mega_moe")
    logits = torch.empty((m, rc.experts), dtype=torch.float32, device=dev)
    x8, xs = R._quant_outputs(h)
    wv = MM._check_inputs(x8, xs, ids, wts, w13, w13_scale, w2, w2_scale, num_shared, rsf, block_n, stages,
                          group_size, split_waves)
    R._check_device(h, gate, bias, logits, ids, wts, x8, xs)
    out = torch.empty((m, wv.hidden), dtype=torch.bfloat16, device=dev)
    rws = R._workspace(rc, dev)
    spec = kernel_spec(rc, cfg.spec(wv.hidden, wv.inter))

    def plan_launch(p: ctypes.Structure) -> None:
        if R.use_decode(m, decode, rc):
            tpc = R.decode_tokens_per_cta(m)
            args = R._kernel_args(h, gate, bias, logits, ids, wts, None, rws, rsf, x8, xs, tpc)
            _kernel(spec, dev, FUNCTION_DECODE).launch((rc.decode_ctas, -(-m // tpc), 1), (R.THREADS, 1, 1),
                                                       [*args, p], pdl=pdl)
        else:
            args = R._kernel_args(h, gate, bias, logits, ids, wts, None, rws, rsf, x8, xs)
            _kernel(spec, dev, FUNCTION).launch((rc.splits, rc.groups, 1), (R.THREADS, 1, 1), [*args, p], pdl=pdl)

    MM._launch(x8, xs, ids, wts, wv, out, num_shared, rsf, cfg, 0, pdl, plan_launch=plan_launch)
    return out, ids, wts


@_routed_mega_moe.register_fake
def _routed_mega_moe_fake(h, gate, bias, topk, w13, w13_scale, w2, w2_scale, num_shared, routed_scaling_factor,
                          block_n, stages, group_size, split_waves, lean_fences=False, pool=False, token_major=False,
                          end_combine=False, decode=None, pdl=True, pair=False):
    MM.MegaMoEConfig(block_n, stages, group_size, split_waves, bool(lean_fences), bool(pool), 0, bool(token_major),
                     bool(end_combine), bool(pair)).validate()
    R._check_inputs(h, gate, bias, topk)
    m, hid = h.shape
    return (h.new_empty((m, hid), dtype=torch.bfloat16), h.new_empty((m, topk), dtype=torch.int32),
            h.new_empty((m, topk), dtype=torch.float32))


def routed_mega_moe(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, router_cfg, weights: "MM.MegaMoEWeights",
                    *, config: "MM.MegaMoEConfig | None" = None, decode: bool | None = None, pdl: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MoE block of one layer from its input h [M, H] bf16: (out [M, H] bf16, topk_ids [M, k] int32,
    topk_weights [M, k] fp32 without the routed scaling factor). router_cfg: the model config the router takes
    (num_experts_per_tok, routed_scaling_factor, norm_topk_prob, ...; ops.moe_router.moe_route's cfg). config: the
    MegaMoE build (default: moe.default_config for M). decode: the router kernel choice (ops.moe_router.use_decode).
    Raises for an M the fused kernels do not take (`supported`)."""
    k = R._check_cfg(h, router_cfg)
    _check(h, gate, bias, k, weights)
    if decode is not None and not isinstance(decode, bool):
        raise _fail(f"decode must be None or a bool, got {decode!r}")
    if config is None:
        config = MM.default_config(max(int(h.shape[0]), 1), weights.num_experts, k, weights.num_shared,
                                   MM._sms(h.device) if h.is_cuda else 132, weights.inter)
    if config.diag:
        raise _fail(f"config {config.name}: diagnostic builds are not run through the fused router")
    return torch.ops.glm5_fastpath.routed_mega_moe(
        h, gate, bias, k, weights.w13, weights.w13_scale, weights.w2, weights.w2_scale, weights.num_shared,
        float(router_cfg.routed_scaling_factor), config.block_n, config.stages, config.group_size, config.split_waves,
        config.lean_fences, config.pool, config.token_major, config.end_combine, decode, pdl, config.pair)


def precompile(weights: "MM.MegaMoEWeights", router: R.RouterConfig, configs, device=None) -> None:
    """Compile (or fetch) and load the fused kernels for these MegaMoE configs, outside any CUDA-graph capture."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    for cfg in configs:
        spec = kernel_spec(router, cfg.spec(weights.hidden, weights.inter))
        for fn in (FUNCTION, FUNCTION_DECODE):
            _kernel(spec, dev, fn)
    R._workspace(router, dev)


def compile_check_specs() -> list[KernelSpec]:
    """The fused builds CI compile-checks: GLM-5's router with the MegaMoE builds default_config picks at decode."""
    rc = R.config_for(6144, 256, 8)
    names = sorted({MM.default_config(m, 256, 8).name for m in (1, 8, 16, 32)})
    return [kernel_spec(rc, MM.MegaMoEConfig.from_name(n).spec(6144, 2048)) for n in names]
