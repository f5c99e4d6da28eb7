"""The MoE route: a DeepseekV2MoE layer's decode forward computed by MegaMoE (issue #7, kernel: issue #6).

`MoEExecutor` is what patch.EXECUTORS["moe"]["megamoe"] calls as fn(original, *args, **kwargs) for a decode
step the Router sent to "megamoe[:<config>]". It replaces the routed + shared experts and keeps SGLang's
own router, so expert choice is exactly SGLang's:

    ids, w = ops.moe_route(h, gate.weight, gate.e_score_correction_bias)
                                               our fused router (fp32 logits, sigmoid + bias top-k, renormalised)
                                               when the layer's gate + top-k is GLM-5's noaux_tc form; else
    logits = mlp.gate(h)                       SGLang's MoEGate (bf16 GEMM)
    topk   = mlp.topk(h, logits)               SGLang's TopK (noaux_tc, renormalised; with the shared expert
                                               fused (GLM-5 on one GPU) a 9th column = the shared expert)
    x8, xs = 1x128 FP8 quant of h              ops.act_quant_fp8 (or SGLang's per-token-group quant)
    out    = mega_moe(x8, xs, topk_ids[:, :k], topk_weights[:, :k], w13, w2, ...)
                                               routed experts + the shared expert (expert E, weight 1/rsf),
                                               x routed_scaling_factor in the combine: what SGLang's fused
                                               Triton MoE + moe_sum_reduce compute, to FP8 noise
    (+ SGLang's shared-expert MLP when it is not fused)

    GLM5_FASTPATH_MOE_FUSED_ROUTER=1 (opt-in): moe.routed.routed_mega_moe instead, the router + quant kernel whose
    last CTA plans MegaMoE, then MegaMoE (2 kernels, bitwise the same); measured 1-7 us per layer slower than the
    4 kernels above on the H200 (session 28: the plan in one 256-thread CTA costs more than the PDL-hidden
    kernel boundaries it saves). GLM5_FASTPATH_ROUTER_QUANT=1: the router kernel also writes x8 / xs (3 kernels;
    level with the default).

    GLM5_FASTPATH_MOE_OVERLAP=1 (opt-in): moe.overlap.routed_mega_moe_overlap, the shared expert's MegaMoE launch
    on part of the GPU while the router and the routed pairs' plan run on a side stream, then the routed launch
    (bitwise the one-launch chain with the decode router); for calls of <= 32 tokens with the fused shared expert,
    our router and no padded rows to mask. Counted like the other chains. Measured 6.7 / 18 us per layer SLOWER than
    the default chain at 1 / 8 tokens (H200, session 33: the second persistent launch's ramp and tail cost more than
    the routing it hides); see moe/overlap.py.

MegaMoE reads SGLang's own expert tensors in place (w13_weight [E_tot, 2I, H] e4m3 gate || up,
w2_weight [E_tot, H, I], their fp32 128x128 block scales): no weight copy, and SGLang's path keeps
working for every call we leave to it (prefill, buckets the table maps to stock, refusals).

The router. SGLang's decode router costs ~35 us per layer at one token on an H200 (a cuBLAS split-K
GEMM, three torch top-k kernels, two sorts, compiled elementwise kernels: the 2026-11-29 engine profile), against
~5 us for ops.moe_route, so the route uses ours when the layer's top-k is the noaux_tc form GLM-5 uses
(module TopK, sigmoid scores + fp32 correction bias, no group stage (n_group = 1 or all groups kept),
renormalised, no custom routing function, bf16 gate [E, H]) and M <= 256. It computes the logits in fp32, as
the HF reference does, where SGLang rounds them to bf16 first (F.linear in bf16), so near-tie expert choices can
differ from SGLang's: FP8-noise-level. SGLang's routed-experts capturer (--enable-return-routed-experts) still
receives the ids (with the fused shared column). CUDA-graph padding rows (forward_batch.num_token_non_padded
< M: a batch replayed in a larger captured graph) get id -1 (SGLang's own _mask_topk_ids_padded_region, one
kernel), so MegaMoE gives them no expert work, but only where SGLang keeps that count current on replay
(its enable_num_token_non_padded(): EP / DP-gather / a2a backends). Elsewhere (TP1, the usual case) the graph
runner writes the count once per capture into one shared buffer and never again, so on replay it holds the
last captured size (1): masking by it dropped every row but the first (the 2026-11-29 session-5 engine run,
caught by a decode step faster than its bytes floor). There padding rows keep their experts, as in SGLang. GLM5_FASTPATH_MOE_ROUTER=sglang keeps SGLang's
gate + top-k (exact SGLang expert choice).

A layer is refused at install (stays on SGLang's path, logged once with the reason, counted in
glm5_fastpath_moe_layer_total{route="stock", reason}) when its experts are not plain block-FP8 (e4m3fn,
fp32 [*, N/128, K/128] scales, not UE8M0-requantized), the top-k weights carry the routed scaling factor
(a runner that folds it into top-k), expert-parallel / a2a backends / EPLB remapping are on, or the
dimensions are not MegaMoE's (H % 256, I % 128). A call is refused when its top-k output is not the
standard (ids, weights) form.

Padding rows: SGLang may mask CUDA-graph padding rows' top-k ids with -1; MegaMoE gives such rows a zero
output and no expert work (csrc/moe/megamoe.cuh, token_masked).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("glm5_fastpath")

STATE = "_glm5_fastpath_moe"
from ...metrics import MOE_LAYER_TOTAL as METRIC, seam_counter  # listed in metrics.METRICS
from .decision import mode_kind  # pure Python (no torch / sglang), as is patch
from .patch import _mode_name
FAMILY = "megamoe"

REFUSALS = {
    "no_experts": "the layer has no FusedMoE experts with w13_weight / w2_weight",
    "weight_dtype": "expert weights are not float8_e4m3fn",
    "weight_layout": "expert weights / block scales are not [E, 2I, H] / [E, H, I] with fp32 128x128 scales",
    "ue8m0_scales": "expert scales were requantized to UE8M0 (DeepGEMM layout)",
    "dims": "hidden size or expert intermediate size not supported by MegaMoE (H % 256, I % 128)",
    "shared_layout": "more than one fused shared expert",
    "scaled_topk": "the top-k weights already carry routed_scaling_factor",
    "expert_parallel": "expert parallelism / an a2a backend / EPLB remapping is on",
    "topk_format": "the top-k output is not the standard (ids, weights) form",
    "error": "our executor raised; SGLang's path for this call",
}


@dataclass
class MoELayerRoute:
    layer_id: int
    refusal: str | None = None
    detail: str = ""
    weights: Any = None           # glm5_fastpath.moe.MegaMoEWeights (views of SGLang's tensors)
    topk: int = 8                 # routed top-k (without the fused shared column)
    fused_shared: int = 0         # shared experts fused into the expert tensors (0 or 1)
    rsf: float = 1.0              # routed_scaling_factor
    shared_mlp: Any = None        # SGLang's separate shared-expert module when not fused
    router: Any = None            # RouterCfg when ops.moe_route replaces SGLang's gate + top-k
    router_note: str = ""         # why SGLang's gate + top-k is kept (router None)


ROUTER_ENV = "GLM5_FASTPATH_MOE_ROUTER"  # "sglang": keep SGLang's gate + top-k; default "ours"


@dataclass(frozen=True)
class RouterCfg:
    """The cfg ops.moe_route reads (a Glm5Config subset)."""
    hidden_size: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1


def fused_router(mlp: Any, route: "MoELayerRoute") -> tuple[RouterCfg | None, str]:
    """(RouterCfg, "") when ops.moe_route computes exactly what this layer's gate + top-k compute (module doc),
    else (None, why SGLang's gate + top-k stay)."""
    import torch

    if os.environ.get(ROUTER_ENV, "ours").strip().lower() in ("sglang", "stock", "off", "0"):
        return None, f"{ROUTER_ENV}=sglang"
    gate, topk = getattr(mlp, "gate", None), getattr(mlp, "topk", None)
    cfg = getattr(topk, "topk_config", None)
    w = getattr(gate, "weight", None)
    bias = getattr(gate, "e_score_correction_bias", None)
    if cfg is None or type(topk).__name__ != "TopK":
        return None, f"top-k module {type(topk).__name__} is not SGLang's TopK"
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 2 or not w.is_contiguous():
        return None, "gate weight is not a contiguous bf16 [E, H] tensor"
    if not isinstance(bias, torch.Tensor) or bias.dtype != torch.float32 or tuple(bias.shape) != (w.shape[0],):
        return None, "no fp32 e_score_correction_bias (not noaux_tc)"
    if getattr(cfg, "custom_routing_function", None) is not None:
        return None, "custom routing function"
    if not getattr(cfg, "renormalize", False):
        return None, "top-k weights not renormalised"
    if getattr(cfg, "use_grouped_topk", False):
        groups, keep = getattr(cfg, "num_expert_group", None), getattr(cfg, "topk_group", None)
        if not (groups in (None, 1) or keep == groups):
            return None, f"grouped top-k ({keep} of {groups} groups)"
    elif str(getattr(cfg, "scoring_func", "softmax")) != "sigmoid":
        return None, f"scoring {getattr(cfg, 'scoring_func', None)}"
    e, h = (int(x) for x in w.shape)
    if e != route.weights.num_experts or h != route.weights.hidden:
        return None, f"gate [{e}, {h}] does not match the experts ({route.weights.num_experts}, H {route.weights.hidden})"
    from ...ops import moe_router as R

    try:
        R.config_for(h, e, route.topk)
    except Exception as e:  # noqa: BLE001 - dims the kernel does not take: SGLang's router, say why
        return None, str(e)
    return RouterCfg(h, route.topk, route.rsf), ""


@dataclass
class MoEPrepareSummary:
    routed: list[int] = field(default_factory=list)
    refused: dict[str, list[int]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)


def _server_args() -> Any:
    try:
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    except Exception:  # noqa: BLE001 - outside a server (tests) there are none
        return None


def _check_parallel(mlp: Any) -> str | None:
    if int(getattr(mlp, "ep_size", 1) or 1) > 1 or int(getattr(mlp, "tp_size", 1) or 1) > 1:
        return "expert_parallel"
    if getattr(mlp, "_enable_a2a_moe", False):
        return "expert_parallel"
    sa = _server_args()
    if sa is not None:
        if getattr(sa, "enable_eplb", False) or int(getattr(sa, "ep_num_redundant_experts", 0) or 0) > 0:
            return "expert_parallel"
        if str(getattr(sa, "init_expert_location", "trivial") or "trivial") != "trivial":
            return "expert_parallel"
        a2a = str(getattr(sa, "moe_a2a_backend", "none") or "none")
        if a2a not in ("none", "None"):
            return "expert_parallel"
    return None


def layer_route(mlp: Any) -> MoELayerRoute:
    """Check one DeepseekV2MoE layer and build its MegaMoE weight views (no copies)."""
    import torch

    lid = int(getattr(mlp, "layer_id", -1))
    r = MoELayerRoute(lid)

    def refuse(reason: str, detail: str = "") -> MoELayerRoute:
        r.refusal, r.detail = reason, detail
        return r

    experts = getattr(mlp, "experts", None)
    w13, w2 = getattr(experts, "w13_weight", None), getattr(experts, "w2_weight", None)
    s13 = getattr(experts, "w13_weight_scale_inv", None)
    s2 = getattr(experts, "w2_weight_scale_inv", None)
    if not all(isinstance(t, torch.Tensor) for t in (w13, w2)):
        return refuse("no_experts")
    why = _check_parallel(mlp)
    if why:
        return refuse(why)
    if w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn:
        return refuse("weight_dtype", f"w13 {w13.dtype}, w2 {w2.dtype}")
    if getattr(s13, "format_ue8m0", False) or getattr(s2, "format_ue8m0", False):
        return refuse("ue8m0_scales")
    if not all(isinstance(t, torch.Tensor) for t in (s13, s2)) or w13.dim() != 3 or w2.dim() != 3:
        return refuse("weight_layout", "missing block scales or not 3-D expert stacks")
    e_tot, n13, h = (int(x) for x in w13.shape)
    inter = n13 // 2
    want = {"w2": (e_tot, h, inter), "w13_scale": (e_tot, -(-n13 // 128), -(-h // 128)),
            "w2_scale": (e_tot, -(-h // 128), -(-inter // 128))}
    got = {"w2": tuple(w2.shape), "w13_scale": tuple(s13.shape), "w2_scale": tuple(s2.shape)}
    bad = [f"{k} {list(got[k])} != {list(v)}" for k, v in want.items() if got[k] != v]
    if bad or s13.dtype != torch.float32 or s2.dtype != torch.float32:
        return refuse("weight_layout", "; ".join(bad) or f"scales {s13.dtype}/{s2.dtype}, want float32")
    if h % 256 or inter % 128:
        return refuse("dims", f"H={h}, I={inter}")
    fused = int(getattr(mlp, "num_fused_shared_experts", 0) or 0)
    if fused > 1:
        return refuse("shared_layout", f"{fused} fused shared experts")
    cfg = getattr(getattr(mlp, "topk", None), "topk_config", None)
    if cfg is not None and getattr(cfg, "apply_routed_scaling_factor_on_output", False):
        return refuse("scaled_topk")
    top_k = int(getattr(cfg, "top_k", 0) or getattr(mlp, "top_k", 0) or 0)
    r.topk = (top_k - fused) if top_k else 8
    r.fused_shared = fused
    r.rsf = float(getattr(mlp, "routed_scaling_factor", None) or 1.0)
    if not fused:
        r.shared_mlp = getattr(mlp, "shared_experts", None)
    from ...moe import megamoe as MM

    try:
        r.weights = MM.prepare_weights(w13.data, s13.data, w2.data, s2.data, num_shared=fused)
    except MM.MegaMoEInputError as e:
        return refuse("weight_layout", str(e))
    if r.weights.w13.data_ptr() != w13.data_ptr():  # never hold a second copy of the experts
        return refuse("weight_layout", "expert weights are not contiguous (MegaMoE would need a copy)")
    r.router, r.router_note = fused_router(mlp, r)
    return r


def _quant_fn() -> Callable:
    """1x128 FP8 activation quant: our kernel, else SGLang's per-token-group quant, else the reference."""
    try:
        from ...ops import act_quant

        return lambda x: act_quant.act_quant_fp8(x)
    except Exception:  # noqa: BLE001 - older tree / no kernel: SGLang's, then the reference
        pass
    from .prefix_executor import ref_quant, sglang_quant

    return sglang_quant() or ref_quant


class MoEExecutor:
    """fn(original, *args, **kwargs) for patch.EXECUTORS["moe"]["megamoe"]; see the module doc."""

    def __init__(self, router: Any = None, quant: Callable | None = None, log: logging.Logger = logger) -> None:
        self.router, self.log = router, log
        self._quant = quant
        self._once: set = set()
        self._configs: dict[tuple, Any] = {}  # (table, m, layer dims) -> MegaMoEConfig: host work off the call path
        self.router_failed = ""  # set when our router kernel could not be prepared: SGLang's router everywhere
        self.last_fused = False  # the latest run() took the fused router + plan kernels
        self.fused_failed = ""  # set when the fused router + plan kernels could not be prepared: separate kernels
        self.overlap_failed = ""  # set when the shared-expert overlap could not be prepared (or raised): no overlap
        self.last_overlap = False  # the latest run() took the shared-expert overlap
        self.prefill_chunk = 0  # tokens per MegaMoE launch for prefill passes (set by _precompile; 0: MAX_TOKENS)

    @property
    def quant(self) -> Callable:
        if self._quant is None:
            self._quant = _quant_fn()
        return self._quant

    def config_for(self, m: int, route: MoELayerRoute) -> Any:
        """The table's megamoe:<config> for m's bucket, else MegaMoE's default for the bucket size (memoised)."""
        from ...moe import megamoe as MM

        table = getattr(self.router, "table", None)
        w = route.weights
        key = (id(table), m, w.num_experts, w.num_shared, w.inter, route.topk)
        cfg = self._configs.get(key)
        if cfg is not None:
            return cfg
        look = table.lookup(m) if table is not None else None
        choice = getattr(look, "choice", None)
        name = choice.moe.split(":", 1)[1] if choice is not None and ":" in choice.moe else ""
        if name and name != "default":
            cfg = MM.MegaMoEConfig.from_name(name)
        else:
            tokens = choice.tokens if choice is not None else m
            cfg = MM.default_config(tokens, w.num_experts, route.topk, w.num_shared, inter=w.inter)
        self._configs[key] = cfg
        return cfg

    # -- install ---------------------------------------------------------------------------------------------
    def prepare_model(self, model: Any, buckets: list[int], precompile: bool = True,
                      prefill_max: int = 0) -> MoEPrepareSummary:
        from .patch import decoder_layers
        from .prefix_executor import _ranges

        s = MoEPrepareSummary()
        first: MoELayerRoute | None = None
        for layer in decoder_layers(model):
            mlp = getattr(layer, "mlp", None)
            if mlp is None or not (hasattr(mlp, "experts") and hasattr(mlp, "gate")):
                continue
            r = layer_route(mlp)
            mlp.__dict__[STATE] = r
            if r.refusal is None:
                s.routed.append(r.layer_id)
                first = first or r
            else:
                s.refused.setdefault(r.refusal, []).append(r.layer_id)
                s.details.setdefault(r.refusal, r.detail)
        for reason, ids in s.refused.items():
            self.log.info("glm5_fastpath: MoE: layers %s stay on SGLang's path: %s%s", _ranges(ids), REFUSALS[reason],
                          f" ({s.details[reason]})" if s.details.get(reason) else "")
        if first is not None:
            self.log.info("glm5_fastpath: MoE: layers %s -> MegaMoE (%d routed experts + %d shared, top-%d, in place "
                          "on SGLang's expert tensors: no weight copy)", _ranges(s.routed), first.weights.num_experts,
                          first.weights.num_shared, first.topk)
            self.log.info("glm5_fastpath: MoE: router %s", "ours (ops.moe_route: fp32 logits, sigmoid + bias top-k; "
                          "M <= 256)" if first.router is not None else f"SGLang's gate + top-k ({first.router_note})")
            if precompile and buckets:
                self._precompile(first, buckets, prefill_max)
        return s

    def _precompile(self, route: MoELayerRoute, buckets: list[int], prefill_max: int = 0) -> None:
        """Kernels of every bucket's config and the workspace of the largest bucket, before CUDA-graph capture; with
        the prefill route (prefill_max > 0) also the configs of prefill chunks and a separate workspace of one chunk
        (prefill_chunk(prefill_max) tokens: ~760 MB at 4096; workspace tag PREFILL_WORKSPACE), allocated here so
        SGLang sizes its KV cache after it."""
        from ...moe import megamoe as MM

        configs = {c.name: c for c in (self.config_for(b, route) for b in buckets)}
        MM.precompile(route.weights, topk=route.topk, max_tokens=max(buckets), configs=list(configs.values()))
        chunk = prefill_chunk(prefill_max)
        if chunk:  # prefill launches get their own workspace (PREFILL_WORKSPACE): decode's stays as without the route
            pre: dict[str, Any] = {}
            m = 1
            while m < chunk:  # one config per power of two up to the chunk (default_config changes only at those steps)
                m = min(chunk, 2 * m)
                c = self.config_for(m, route)
                pre.setdefault(c.name, c)
            with MM.workspace_tag(PREFILL_WORKSPACE):
                MM.precompile(route.weights, topk=route.topk, max_tokens=chunk, configs=list(pre.values()))
            configs.update(pre)
            self.prefill_chunk = chunk
            self.log.info("glm5_fastpath: MoE: prefill / extend passes of <= %d tokens -> MegaMoE (in launches of <= %d "
                          "tokens; their own workspace for %d tokens); GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0 keeps SGLang's "
                          "Triton MoE there", prefill_max, chunk, chunk)
        if route.router is not None:  # kernel + workspace now: never inside a CUDA-graph capture
            try:
                from ...ops import moe_router as R

                R.precompile(route.weights.w13.device, ((route.weights.hidden, route.weights.num_experts, route.topk),))
            except Exception as e:  # noqa: BLE001 - keep SGLang's router everywhere, say why
                self.log.info("glm5_fastpath: MoE: our router unavailable (%s); SGLang's gate + top-k are used", e)
                self.router_failed = f"{type(e).__name__}: {e}"
            if not self.router_failed and fused_router_enabled() and _on_gpu(route.weights.w13):
                try:
                    from ...moe import routed
                    from ...ops import moe_router as R

                    rc = R.config_for(route.weights.hidden, route.weights.num_experts, route.topk)
                    fused = [c for b, c in ((b, self.config_for(b, route)) for b in buckets)
                             if routed.supported(b, rc) and not c.diag]
                    routed.precompile(route.weights, rc, list({c.name: c for c in fused}.values()),
                                      route.weights.w13.device)
                except Exception as e:  # noqa: BLE001 - the separate router, act quant and plan kernels; say why
                    self.log.info("glm5_fastpath: MoE: fused router + plan unavailable (%s); separate kernels", e)
                    self.fused_failed = f"{type(e).__name__}: {e}"
        if route.router is not None and not self.router_failed and overlap_enabled() and _on_gpu(route.weights.w13):
            try:
                from ...moe import overlap as OV
                from ...ops import moe_router as R

                rc = R.config_for(route.weights.hidden, route.weights.num_experts, route.topk)
                ov = {c.name: c for b, c in ((b, self.config_for(b, route)) for b in buckets)
                      if OV.supported(b, rc, c, route.weights.num_shared)}
                if ov:
                    OV.precompile(route.weights, route.topk, list(ov.values()),
                                  min(max(buckets), OV.MAX_TOKENS), route.weights.w13.device)
            except Exception as e:  # noqa: BLE001 - the separate kernels; say why
                self.log.info("glm5_fastpath: MoE: shared-expert overlap unavailable (%s); separate kernels", e)
                self.overlap_failed = f"{type(e).__name__}: {e}"
        if self._quant is None:
            try:
                from ...ops import act_quant

                act_quant.precompile(route.weights.w13.device)
            except Exception as e:  # noqa: BLE001 - the first call falls back to SGLang's quant, say why
                self.log.info("glm5_fastpath: MoE: act_quant_fp8 unavailable (%s); SGLang's FP8 quant is used", e)
                from .prefix_executor import ref_quant, sglang_quant

                self._quant = sglang_quant() or ref_quant
        self.log.info("glm5_fastpath: MoE: MegaMoE kernels ready for buckets %s (configs %s)",
                      ",".join(map(str, buckets)), ", ".join(sorted(configs)))

    # -- the call --------------------------------------------------------------------------------------------
    def __call__(self, original: Callable, *args, **kwargs):
        self.last_call = self.last_routing = None
        mlp = getattr(original, "__self__", None)
        route = mlp.__dict__.get(STATE) if mlp is not None else None
        if mlp is not None and (route is None or _stale(route, mlp)):
            # not prepared, or SGLang replaced the expert tensors after install (install may run from
            # post_load_weights, before process_weights_after_loading): views only, no allocation
            if route is not None:
                self._note("megamoe", "rebound", f"glm5_fastpath: MoE layer {route.layer_id}: expert tensors were "
                           "replaced after install; MegaMoE re-bound to the new ones")
            route = layer_route(mlp)
            mlp.__dict__[STATE] = route
        if route is None or route.refusal is not None:
            reason = route.refusal if route is not None else "no_experts"
            return self._fallback(original, args, kwargs, reason, getattr(route, "layer_id", -1))
        hidden = args[0] if args else kwargs.get("hidden_states")
        if hidden is None or hidden.shape[0] == 0:
            return original(*args, **kwargs)
        alloc = kwargs.get("gemm_output_zero_allocator", args[4] if len(args) > 4 else None)
        fb = kwargs.get("forward_batch", args[1] if len(args) > 1 else None)
        prefill = _is_prefill(fb)
        try:
            if prefill:
                out = self._run_prefill(mlp, route, hidden)
            else:
                out = self.run(mlp, route, hidden, alloc, getattr(fb, "num_token_non_padded", None))
        except _CallRefused as e:
            return self._fallback(original, args, kwargs, e.reason, route.layer_id)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's path, loudly, once
            self._note("stock", "error", f"glm5_fastpath: MoE layer {route.layer_id}: our executor raised "
                       f"{type(e).__name__}: {e}; SGLang's path for this call", logging.WARNING)
            self.log.debug("glm5_fastpath: MoE executor traceback", exc_info=True)
            return original(*args, **kwargs)
        if prefill:
            self._note("megamoe", "prefill", f"glm5_fastpath: MoE layer {route.layer_id}: prefill / extend pass "
                       f"(M={int(hidden.shape[0])}) -> MegaMoE; logged once")
        elif self.last_overlap:
            self._note("megamoe", "overlap", f"glm5_fastpath: MoE layer {route.layer_id} (M={int(hidden.shape[0])}) -> "
                       "shared expert during the routing, then the routed MegaMoE launch; logged once")
        elif self.last_fused:  # which kernels ran shows in the metrics (reason) and once in the log (bench offline's paths)
            self._note("megamoe", "fused", f"glm5_fastpath: MoE layer {route.layer_id} (M={int(hidden.shape[0])}) -> "
                       "fused router + plan, then MegaMoE (2 kernels); logged once")
        else:
            self._note("megamoe", "routed")
        return out

    def _run_prefill(self, mlp: Any, route: MoELayerRoute, hidden: Any) -> Any:
        """A prefill / extend pass (eager, never captured): no padding rows; chunks of more than one MegaMoE launch's
        tokens are split into launches of prefill_chunk tokens (each its own router, quant and plan)."""
        import torch

        from ...moe import megamoe as MM

        m = int(hidden.shape[0])
        step = self.prefill_chunk or MM.MAX_TOKENS
        with MM.workspace_tag(PREFILL_WORKSPACE):
            if m <= step:
                return self.run(mlp, route, hidden)
            hidden = hidden.contiguous()
            return torch.cat([self.run(mlp, route, hidden[s:s + step]) for s in range(0, m, step)])

    def run(self, mlp: Any, route: MoELayerRoute, hidden: Any, alloc: Any = None, non_padded: Any = None,
            routing: tuple[Any, Any] | None = None) -> Any:
        """Our MoE for one call. `routing` = (topk_ids [M, k] int32, topk_weights [M, k] fp32) skips the router
        (diagnostics: the shadow check re-runs MegaMoE on SGLang's routing to separate expert-choice flips from
        kernel error). The routing used is kept in `last_routing` (references, no copies)."""
        import torch

        from ...moe import megamoe as MM

        k = route.topk
        self.last_fused = False
        self.last_overlap = False
        if routing is not None:
            ids, wts = routing
            return self._experts(MM, mlp, route, hidden, ids.to(torch.int32).contiguous(), wts.float().contiguous())
        quantized = None
        router_takes = (hidden.dim() == 2 and hidden.shape[0] <= ROUTER_MAX_TOKENS and hidden.dtype == torch.bfloat16
                        and hidden.is_contiguous())
        if route.router is not None and not self.router_failed and router_takes:
            from ...ops import moe_router as R

            m = int(hidden.shape[0])
            masked = non_padded is not None and m > 1 and padding_count_is_live()
            if not masked and not self.overlap_failed and overlap_enabled() and _on_gpu(hidden):
                from ...moe import overlap as OV

                rc = R.config_for(route.weights.hidden, route.weights.num_experts, k)
                cfg = self.config_for(m, route)
                if OV.supported(m, rc, cfg, route.weights.num_shared):
                    from .norm_route import stashed_quant

                    x8, xs = stashed_quant(self.quant, self._x8_from_a0)(hidden)
                    try:
                        out, ids, wts = OV.routed_mega_moe_overlap(hidden, x8, xs, mlp.gate.weight,
                                                                   mlp.gate.e_score_correction_bias, route.router,
                                                                   route.weights, config=cfg)
                    except Exception as e:  # noqa: BLE001 - its input checks (a failed launch leaves CUDA in error anyway)
                        self.overlap_failed = f"{type(e).__name__}: {e}"
                        self.log.warning("glm5_fastpath: MoE: shared-expert overlap raised (%s); separate kernels "
                                         "from now on", e)
                    else:
                        self.last_routing = (ids, wts)
                        self.last_overlap = True
                        _capture_routed(route, ids)
                        return out
            if not masked and not self.fused_failed and fused_router_enabled() and _on_gpu(hidden):
                from ...moe import routed

                rc = R.config_for(route.weights.hidden, route.weights.num_experts, k)
                cfg = self.config_for(m, route)
                if routed.supported(m, rc) and not cfg.diag:
                    # router (+ FP8 quant) whose last CTA plans MegaMoE, then MegaMoE: two kernels (moe/routed.py)
                    out, ids, wts = routed.routed_mega_moe(hidden, mlp.gate.weight, mlp.gate.e_score_correction_bias,
                                                           route.router, route.weights, config=cfg)
                    self.last_routing = (ids, wts)
                    self.last_fused = True
                    _capture_routed(route, ids)
                    if route.shared_mlp is not None:
                        out = out + route.shared_mlp(hidden)
                    return out

            # the gate's tensors are read per call: SGLang updates weights in place, and a capture bakes them
            if router_quant_enabled():  # the router kernel also writes MegaMoE's FP8 input (one kernel less)
                ids, wts, _, x8, xs = R.moe_route_quant(hidden, mlp.gate.weight, mlp.gate.e_score_correction_bias,
                                                        route.router)
                quantized = (x8, xs)
            else:
                ids, wts, _ = R.moe_route(hidden, mlp.gate.weight, mlp.gate.e_score_correction_bias, route.router)
            _capture_routed(route, ids)
            # one row is never padding (bucket 1); the count is only trusted where SGLang refreshes it
            if non_padded is not None and hidden.shape[0] > 1 and padding_count_is_live():
                mask_padded_rows(ids, non_padded)
        else:
            logits = mlp.gate(hidden, alloc) if alloc is not None else mlp.gate(hidden)
            topk = mlp.topk(hidden, logits)
            ids, wts = getattr(topk, "topk_ids", None), getattr(topk, "topk_weights", None)
            if ids is None or wts is None or ids.dim() != 2 or ids.shape[1] != route.topk + route.fused_shared:
                raise _CallRefused("topk_format")
            if route.fused_shared:  # the last column is the fused shared expert: MegaMoE adds it itself
                ids, wts = ids[:, :k], wts[:, :k]
            ids = ids.contiguous()
            wts = wts.float().contiguous()
        return self._experts(MM, mlp, route, hidden, ids, wts, quantized)

    def _experts(self, MM: Any, mlp: Any, route: MoELayerRoute, hidden: Any, ids: Any, wts: Any,
                 quantized: tuple[Any, Any] | None = None) -> Any:
        self.last_routing = (ids, wts)
        if quantized is None:  # the quant the norm route's A0 wrote for this very tensor, else our act quant
            from .norm_route import stashed_quant

            quantized = stashed_quant(self.quant, self._x8_from_a0)(hidden)
        x8, xs = quantized
        out = MM.mega_moe(x8, xs, ids, wts, route.weights, routed_scaling_factor=route.rsf,
                          config=self.config_for(int(hidden.shape[0]), route))
        if route.shared_mlp is not None:  # SGLang's separate shared expert (not fused): added as the stock path does
            out = out + route.shared_mlp(hidden)
        return out

    def _x8_from_a0(self) -> None:
        if "x8_from_a0" not in self._once:
            self._once.add("x8_from_a0")
            self.log.info("glm5_fastpath: MoE: MegaMoE's FP8 input is the quant A0 wrote (norm route): no act quant "
                          "kernel; logged once")

    # -- logging / metrics -----------------------------------------------------------------------------------
    def _fallback(self, original, args, kwargs, reason: str, layer_id: int):
        self._note("stock", reason, f"glm5_fastpath: MoE layer {layer_id} -> stock ({REFUSALS.get(reason, reason)}); "
                   "logged once per reason")
        return original(*args, **kwargs)

    def _note(self, route: str, reason: str, message: str | None = None, level: int = logging.INFO) -> None:
        self.last_call = (route, reason)  # what the latest call did (shadow.MoECheck reads it)
        once = getattr(self.router, "once", None)
        first = once.first("moe-layer", route, reason) if once is not None else (route, reason) not in self._once
        self._once.add((route, reason))
        if first and message:
            self.log.log(level, message)
        metrics = getattr(self.router, "metrics", None)
        if metrics is not None:
            layer_counter(metrics.registry).labels(route=route, reason=reason).inc()


ROUTER_MAX_TOKENS = 256  # ops.moe_router.MAX_TOKENS (not imported here: this module loads without the ops)
MEGAMOE_MAX_TOKENS = 4096  # moe.megamoe.MAX_TOKENS: one launch's tokens (not imported: loads without torch)
PREFILL_WORKSPACE = "prefill"  # moe.megamoe.workspace_tag of prefill launches (decode keeps the untagged one)


def prefill_chunk(prefill_max: int) -> int:
    """Tokens per MegaMoE launch for prefill passes of up to prefill_max tokens (0: the prefill route is off)."""
    return min(max(0, int(prefill_max)), MEGAMOE_MAX_TOKENS)


def _is_prefill(fb: Any) -> bool:
    """Whether this MoE call belongs to a prefill / extend pass (the Router sent it here as "prefill_moe")."""
    return fb is not None and mode_kind(_mode_name(fb)) == "prefill_extend"


ENV_ROUTER_QUANT = "GLM5_FASTPATH_ROUTER_QUANT"


ENV_FUSED_ROUTER = "GLM5_FASTPATH_MOE_FUSED_ROUTER"


def _on_gpu(t: Any) -> bool:
    """The fused router + plan kernels run on CUDA tensors only (CPU stand-ins in tests take the separate path)."""
    return bool(getattr(t, "is_cuda", False))


def fused_router_enabled() -> bool:
    """GLM5_FASTPATH_MOE_FUSED_ROUTER=1 (default off): moe.routed.routed_mega_moe, two kernels per decode MoE layer
    instead of four (module docstring). Off because it measured 1-7 us per layer slower on the H200 (`bench
    moe-layer`, session 28): the plan in the router's last 256-thread CTA takes ~7 us, more than the PDL-hidden
    kernel boundaries it saves (why it takes that long is not yet profiled). Taken, when on, where
    moe.routed.supported says so and no padded rows need masking between router and plan."""
    return os.environ.get(ENV_FUSED_ROUTER, "0").strip().lower() in ("1", "on", "true", "yes")


ENV_OVERLAP = "GLM5_FASTPATH_MOE_OVERLAP"


def overlap_enabled() -> bool:
    """GLM5_FASTPATH_MOE_OVERLAP=1 (default off: measured slower at the op level, moe/overlap.py):
    moe.overlap.routed_mega_moe_overlap,
    the shared expert's MegaMoE launch during the routing (module docstring). Taken, when on, where
    moe.overlap.supported says so and no padded rows need masking between router and plan."""
    return os.environ.get(ENV_OVERLAP, "0").strip().lower() in ("1", "on", "true", "yes")


def router_quant_enabled() -> bool:
    """GLM5_FASTPATH_ROUTER_QUANT=1: the fused router also writes MegaMoE's 1x128 FP8 input (ops.moe_router.
    moe_route_quant), so no separate act-quant kernel runs per MoE layer. Off by default until its GPU test
    (tests/ops/test_moe_router.py, router quant) has passed on an H200."""
    import os

    return os.environ.get(ENV_ROUTER_QUANT, "").strip().lower() in ("1", "on", "true", "yes")
_mask_fn: Any = None
_count_live: bool | None = None


def padding_count_is_live() -> bool:
    """Whether SGLang refreshes forward_batch.num_token_non_padded on every CUDA-graph replay: its own
    enable_num_token_non_padded() (the condition its graph runners use). False when the helper is missing or
    fails: then the count may be a stale capture-time value and must not be used to mask rows. Cached: it
    depends on the parallel layout, fixed once the server runs."""
    global _count_live
    if _count_live is None:
        try:
            from sglang.srt.model_executor.forward_batch_info import enable_num_token_non_padded as f

            _count_live = bool(f())
        except Exception:  # noqa: BLE001 - releases without it, or parallel state not set up (tests)
            return False
    return _count_live


def mask_padded_rows(ids: Any, non_padded: Any) -> None:
    """ids[r, :] = -1 for rows r >= non_padded (a device scalar tensor), in place: SGLang's own
    _mask_topk_ids_padded_region when this release has it (one fused kernel on CUDA), else torch."""
    global _mask_fn
    if _mask_fn is None:
        try:
            from sglang.srt.layers.moe.topk import _mask_topk_ids_padded_region as f
        except Exception:  # noqa: BLE001 - releases without it
            def f(topk_ids, n, fill_value=-1):
                import torch

                rows = torch.arange(topk_ids.shape[0], device=topk_ids.device)
                topk_ids.masked_fill_((rows >= n)[:, None], fill_value)
        _mask_fn = f
    _mask_fn(ids, non_padded)
_NO_CAPTURER = object()
_capturer_getter: Any = None


def _capture_routed(route: MoELayerRoute, ids: Any) -> None:
    """Hand our router's ids to SGLang's routed-experts capturer when one is active (what select_experts does),
    with the fused shared expert's column appended as SGLang's top-k has it."""
    global _capturer_getter
    if _capturer_getter is None:
        try:
            from sglang.srt.state_capturer.routed_experts import get_global_experts_capturer as g
        except Exception:  # noqa: BLE001 - releases without the capturer
            g = _NO_CAPTURER
        _capturer_getter = g
    if _capturer_getter is _NO_CAPTURER:
        return
    cap = _capturer_getter()
    if cap is None:
        return
    if route.fused_shared:
        import torch.nn.functional as F

        # one constant-pad kernel (a new_full + cat was two, per MoE layer and step)
        ids = F.pad(ids, (0, route.fused_shared), value=route.weights.num_experts)
    cap.capture(layer_id=route.layer_id, topk_indices=ids)


def _stale(route: MoELayerRoute, mlp: Any) -> bool:
    if route.weights is None:
        return False
    ex = getattr(mlp, "experts", None)
    w = getattr(ex, "w13_weight", None)
    s = getattr(ex, "w2_weight_scale_inv", None)
    # replaced tensors, or scales requantized in place to UE8M0 after install (then layer_route refuses)
    return (w is not None and w.data_ptr() != route.weights.w13.data_ptr()) or \
        (s is not None and s.data_ptr() != route.weights.w2_scale.data_ptr()) or \
        any(getattr(getattr(ex, n, None), "format_ue8m0", False) for n in ("w13_weight_scale_inv", "w2_weight_scale_inv"))


class _CallRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def layer_counter(registry: Any) -> Any:
    """glm5_fastpath_moe_layer_total on `registry` (metrics.seam_counter)."""
    return seam_counter(registry, METRIC, "MoE layer calls by route (megamoe / stock) and reason; host-side, so "
                        "under CUDA graphs a call is a capture, not a replay.")


_default: MoEExecutor | None = None


def default_executor() -> MoEExecutor:
    global _default
    if _default is None:
        _default = MoEExecutor()
    return _default


def run_megamoe(original: Callable, *args, **kwargs):
    """patch.EXECUTORS["moe"]["megamoe"]."""
    return default_executor()(original, *args, **kwargs)
