"""The FP8-linear route: SGLang's block-FP8 linears outside the prefix (o_proj, the dense layers' MLP) at decode
sizes, computed by our act quant + skinny FP8 GEMM instead of SGLang's `w8a8_block_fp8_linear` (DeepGEMM).

Why: after the prefix, MoE and sparse-MLA routes, o_proj is the largest decode kernel above its floor. On the H200
engine profile (2026-11-29, batch 1) DeepGEMM's o_proj took ~34 us per layer against a 23.6 us bytes floor (100 MB
of FP8 weights, K = 16384, N = 6144). That is 48 tiles of 128 output rows with no K split, so at most 48 of 132 SMs
stream. Our skinny GEMM (glm5_fastpath.ops.fp8_gemm) splits K to fill every SM. At D0's shape it ran at 1.25x its
floor at one token.

**On by default at <= 16 tokens** (wherever the selection table routes a bucket to our kernels, i.e. the measured
H200 table): per kernel our GEMM is faster than DeepGEMM at 1-16 tokens (o_proj 1.23x / 1.05x / 1.08x at 1 / 8 / 16,
dense down 1.24x / 1.03x / 1.05x; `bench fp8-linear`, session 10), slower at 64 and on the dense gate_up. In the engine
(H200, session 29 c6 against c5, same machine, with the norm route) the decode step's ITL p50 was 2.08 / 5.16 / 7.92 ms
at batch 1 / 8 / 16 against 2.13-2.14 / 5.16-5.18 / 7.94-7.96 without it (session 26's higher batch-1 ITL with the
route, 2.29 against 2.16 ms, did not recur). Switches:
- GLM5_FASTPATH_FP8_LINEAR=0 (or sglang / off) keeps SGLang's linears;
- GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS (default 16) is the largest M it takes;
- GLM5_FASTPATH_FP8_LINEAR_LAYERS (default "o_proj,dense_down") picks the layer kinds it takes, from o_proj,
  dense_gate_up, dense_down. The dense gate_up is left out by default: with the tuned configs it measured 0.74-1.01x
  DeepGEMM's time at 1-64 tokens, against 1.03-1.25x faster for o_proj and the dense down at 1-16 (H200, session 10).

Seam: `Fp8LinearMethod.apply(self, layer, x, bias)` (sglang.srt.layers.quantization.fp8, 0.5.14 and 0.5.23). It is
wrapped on the CLASS once per process, but routes only the layers `mark_layers` tagged at install: each decoder
layer's `self_attn.o_proj` and the dense `mlp.gate_up_proj` / `mlp.down_proj`. Every other FP8 linear (the prefix's
own fallbacks, the indexer, prefill through the same modules above the token limit) keeps SGLang's call. SGLang
0.5.23 also has `Fp8LinearMethod.apply_into` (an output-buffer variant some call sites use): not wrapped, so those
calls stay SGLang's, uncounted. One split-K workspace serves every tagged linear of one (N, K): safe while SGLang runs
them on one stream (its alt stream carries only the MoE layers' shared experts, which are not tagged). The wrapper
is host Python (logging, a counter): it is meant for CUDA-graph capture, not for torch.compile'd modules.

A call goes to SGLang's method, counted in glm5_fastpath_fp8_linear_total{route="stock", reason} and logged once
per reason, when:
- the method is not the block-FP8 path (Marlin, MXFP8, scales requantised to UE8M0, block size other than 128x128);
- x is a tuple (a pre-quantised input) or not a 2-D bf16 CUDA tensor;
- a bias is given, or M is above the limit;
- the weight is not [N, K] e4m3 with fp32 scale_inv [ceil(N/128), K/128];
- our kernels raise.

Routed calls count {route="ours", reason="routed"}. The math is the same 1x128 per-token activation quant and
128x128 block-scaled GEMM with fp32 accumulation (ref.prefix.block_fp8_linear), rounded to bf16 once.

The act quant is skipped when o_proj's input is the output of the V-up route's kernel (v_up_route.py): that kernel
already wrote the same 1x128 quant (bitwise act_quant_fp8 of its output) and hands it over through norm_route's
one-entry stash, for that exact tensor only (ours_linear; logged once on the first hit).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from .decision import switch_on

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_FP8_LINEAR"
ENV_MAX_TOKENS = "GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS"
ENV_LAYERS = "GLM5_FASTPATH_FP8_LINEAR_LAYERS"
LAYER_KINDS = ("o_proj", "dense_gate_up", "dense_down")
DEFAULT_LAYERS = ("o_proj", "dense_down")
DEFAULT_MAX_TOKENS = 16  # 64 measured slower than DeepGEMM (bench fp8-linear, session 10)
MAX_TOKENS = 256  # ops.fp8_gemm.MAX_M (not imported: this module loads without the ops)
MODULE = "sglang.srt.layers.quantization.fp8"
CLASS = "Fp8LinearMethod"
METHOD = "apply"
ORIGINAL_ATTR = "__glm5_fastpath_original__"
MARK = "__glm5_fastpath_fp8_linear__"  # set on the linear modules the route may take (value: a short name)

from ...metrics import FP8_LINEAR_TOTAL as METRIC, seam_counter  # noqa: E402  listed in metrics.METRICS

REASONS = {
    "routed": "our 1x128 act quant + skinny FP8 GEMM",
    "unmarked": "a linear the plugin did not tag (not o_proj / the dense MLP)",
    "method": "not SGLang's block-FP8 path (Marlin / MXFP8 / UE8M0 scales / block size other than 128x128)",
    "input": "pre-quantised (tuple) input, or x not a 2-D bf16 CUDA tensor",
    "bias": "a bias is given",
    "tokens": "more tokens than GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS",
    "weight": "weight / scale layout our GEMM does not take",
    "error": "our kernels raised; SGLang's method for this call",
}


def enabled() -> bool:
    return switch_on(ENV, True)


def max_tokens() -> int:
    try:
        return max(0, int(os.environ.get(ENV_MAX_TOKENS, DEFAULT_MAX_TOKENS)))
    except ValueError:
        return DEFAULT_MAX_TOKENS


def ours_linear(x: Any, weight: Any, scale_inv: Any, *, pdl: bool = True,
                on_stash_hit: Callable[[], None] | None = None) -> Any:
    """y [M, N] bf16 = bf16(block-FP8 linear of x [M, K] bf16): our 1x128 per-token act quant, then the skinny
    FP8 GEMM on weight [N, K] e4m3 with scale_inv [ceil(N/128), K/128] fp32. What the route runs for one call
    (also what `bench fp8-linear` times as "ours").

    The act quant goes through norm_route.stashed_quant: when x is the very tensor the V-up route just wrote
    (o_proj's input, v_up_route.py), unmodified since, its kernel's (x8, xs) (bitwise act_quant_fp8(x)) are taken
    and no quant kernel runs; on_stash_hit is then called. Any other x is quantised here."""
    from ...ops.act_quant import act_quant_fp8
    from ...ops.fp8_gemm import fp8_gemm_skinny
    from ...weights import Fp8Linear
    from .norm_route import stashed_quant

    x8, xs = stashed_quant(lambda t: act_quant_fp8(t, pdl=pdl), on_stash_hit)(x)
    return fp8_gemm_skinny(x8, xs, Fp8Linear(weight, scale_inv), pdl=pdl)


def why_not(method: Any, layer: Any, x: Any, bias: Any, limit: int, devices: tuple[str, ...] = ("cuda",)) -> str | None:
    """None when our kernels compute this call exactly as SGLang's block-FP8 path would, else the reason key."""
    import torch

    if getattr(layer, MARK, None) is None:
        return "unmarked"
    if (not getattr(method, "block_quant", False) or getattr(method, "use_marlin", False)
            or getattr(method, "use_mxfp8", False)):
        return "method"
    qc = getattr(method, "quant_config", None)
    if list(getattr(qc, "weight_block_size", None) or []) != [128, 128]:
        return "method"
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16 or x.device.type not in devices:
        return "input"
    if x.shape[0] < 1 or not x.is_contiguous():  # empty (idle) batches; a strided view the act quant does not take
        return "input"
    if bias is not None:
        return "bias"
    if x.shape[0] > min(limit, MAX_TOKENS):
        return "tokens"
    w, s = getattr(layer, "weight", None), getattr(layer, "weight_scale_inv", None)
    if not isinstance(w, torch.Tensor) or not isinstance(s, torch.Tensor):
        return "weight"
    if getattr(s, "format_ue8m0", False):
        return "method"
    if w.dtype != torch.float8_e4m3fn or w.dim() != 2 or s.dtype != torch.float32 or s.dim() != 2:
        return "weight"
    n, k = w.shape
    # N on whole 128-row scale blocks: a merged gate_up whose parts were not 128-aligned would still match the
    # ceil(N / 128) grid with a different row -> block mapping
    if k != x.shape[1] or k % 128 or n % 128 or tuple(s.shape) != (n // 128, k // 128):
        return "weight"
    if not (w.is_contiguous() and s.is_contiguous()) or w.device != x.device or s.device != x.device:
        return "weight"
    return None


class Fp8LinearRoute:
    """The wrapper's state: limit, once-per-reason log, metrics."""

    def __init__(self, metrics: Any = None, log: logging.Logger = logger, limit: int | None = None,
                 devices: tuple[str, ...] = ("cuda",), run: Callable[..., Any] | None = None) -> None:
        # run: (x, weight, scale_inv) -> y; default ours_linear, looked up per call (its act quant taken from the
        # V-up route's kernel when x is that kernel's output: _quant_from_v_up logs the first)
        self.metrics, self.log, self.devices = metrics, log, devices
        self.run = run if run is not None else (lambda x, w, s: ours_linear(x, w, s,
                                                                            on_stash_hit=self._quant_from_v_up))
        self.limit = max_tokens() if limit is None else limit
        self._once: set = set()

    def _quant_from_v_up(self) -> None:
        if "quant_from_v_up" not in self._once:
            self._once.add("quant_from_v_up")
            self.log.info("glm5_fastpath: FP8 linear (o_proj): act quant taken from the V-up kernel (v_up_route): no "
                          "quant kernel; logged once")

    def note(self, route: str, reason: str, layer: Any = None, level: int = logging.INFO) -> None:
        if reason != "unmarked" and (route, reason) not in self._once:  # unmarked: every other FP8 linear, silent
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: FP8 linear%s -> %s (%s)",
                         f" ({getattr(layer, MARK, None)})" if getattr(layer, MARK, None) else "",
                         "ours" if route == "ours" else "SGLang", REASONS.get(reason, reason))
        if self.metrics is not None and reason != "unmarked":
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    def call(self, original: Callable, method: Any, layer: Any, x: Any, bias: Any = None, *args, **kwargs):
        why = "input" if args or kwargs else why_not(method, layer, x, bias, self.limit, self.devices)
        if why is not None:
            self.note("stock", why, layer)
            return original(method, layer, x, bias, *args, **kwargs)
        try:
            out = self.run(x, layer.weight, layer.weight_scale_inv)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's path, loudly, once
            if ("stock", "error") not in self._once:
                self._once.add(("stock", "error"))  # this warning is the one log line of the reason
                self.log.warning("glm5_fastpath: FP8 linear (%s): our kernels raised %s: %s; SGLang's method for "
                                 "this call", getattr(layer, MARK, "?"), type(e).__name__, e)
            self.note("stock", "error", layer, logging.WARNING)
            return original(method, layer, x, bias)
        self.note("ours", "routed", layer)
        return out


def counter(registry: Any) -> Any:
    return seam_counter(registry, METRIC, "Block-FP8 linears outside the prefix (o_proj, dense MLP) by route (ours / "
                        "stock = SGLang's w8a8_block_fp8_linear) and reason; host-side, so under CUDA graphs a call "
                        "is a capture, not a replay.")


def layer_kinds() -> tuple[str, ...]:
    """The layer kinds the route takes (GLM5_FASTPATH_FP8_LINEAR_LAYERS, a comma list of LAYER_KINDS)."""
    raw = os.environ.get(ENV_LAYERS)
    if raw is None or not raw.strip():
        return DEFAULT_LAYERS
    kinds = tuple(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
    bad = [k for k in kinds if k not in LAYER_KINDS]
    if bad:
        raise ValueError(f"{ENV_LAYERS}={raw!r}: unknown layer kind(s) {bad}; choose from {', '.join(LAYER_KINDS)}")
    return kinds


def mark_layers(model: Any, kinds: tuple[str, ...] | None = None) -> list[tuple[str, Any]]:
    """Tag each decoder layer's self_attn.o_proj and a dense layer's mlp.gate_up_proj / mlp.down_proj (a layer
    whose mlp has no experts) with MARK, for the layer kinds in `kinds` (default: layer_kinds()). Returns
    [(name, module)] of what was tagged."""
    kinds = layer_kinds() if kinds is None else kinds
    layers = getattr(getattr(model, "model", model), "layers", None) or []
    tagged: list[tuple[str, Any]] = []
    for i, layer in enumerate(layers):
        cands = [("o_proj", "o_proj", getattr(getattr(layer, "self_attn", None), "o_proj", None))]
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and not hasattr(mlp, "experts"):
            cands += [("dense_gate_up", "dense gate_up", getattr(mlp, "gate_up_proj", None)),
                      ("dense_down", "dense down", getattr(mlp, "down_proj", None))]
        for kind, name, mod in cands:
            if kind in kinds and mod is not None and hasattr(mod, "__dict__"):
                mod.__dict__[MARK] = name
                tagged.append((f"layers.{i}.{name}", mod))
    return tagged


def shapes(tagged: list[tuple[str, Any]]) -> list[tuple[int, int]]:
    """Distinct (N, K) of the tagged modules' FP8 weights (what precompile needs)."""
    import torch

    out: set[tuple[int, int]] = set()
    for _, mod in tagged:
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == torch.float8_e4m3fn:
            out.add((int(w.shape[0]), int(w.shape[1])))
    return sorted(out)


def _method_class() -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(MODULE), CLASS, None)
    except Exception:  # noqa: BLE001 - a release without it: nothing to patch
        return None


def install_fp8_linear(model: Any, metrics: Any = None, log: logging.Logger = logger, device: Any = None,
                       method_cls: Any = None, precompile: bool = True, devices: tuple[str, ...] = ("cuda",)) -> bool:
    """When GLM5_FASTPATH_FP8_LINEAR is on: tag the model's o_proj / dense-MLP linears, compile our kernels for
    their shapes at every M up to the limit (before any graph capture), and wrap Fp8LinearMethod.apply. On any
    failure the method stays SGLang's, with the reason logged. Returns whether the route is installed."""
    if not enabled():
        return False
    cls = method_cls if method_cls is not None else _method_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    if fn is None:
        log.info("glm5_fastpath: FP8 linear: %s.%s not found in this SGLang; SGLang's linears stay", CLASS, METHOD)
        return False
    tagged = mark_layers(model)
    if not tagged:
        log.info("glm5_fastpath: FP8 linear: no o_proj / dense-MLP linears found; SGLang's linears stay")
        return False
    route = Fp8LinearRoute(metrics, log, devices=devices)
    if precompile:
        try:
            from ...ops import act_quant, fp8_gemm

            act_quant.precompile(device)
            fp8_gemm.precompile_plain(shapes(tagged), max_m=route.limit, device=device)
        except Exception as e:  # noqa: BLE001 - no kernels: SGLang's linears, say why
            log.warning("glm5_fastpath: FP8 linear kernels unavailable (%s: %s); SGLang's linears stay",
                        type(e).__name__, e)
            return False
    if getattr(fn, ORIGINAL_ATTR, None) is not None:
        getattr(fn, "__glm5_fastpath_route__").limit = route.limit  # installed already: the new model is tagged
        return True
    original = fn

    def apply(self, layer, x, bias=None, *args, **kwargs):
        return route.call(original, self, layer, x, bias, *args, **kwargs)

    setattr(apply, ORIGINAL_ATTR, original)
    apply.__glm5_fastpath_route__ = route
    setattr(cls, METHOD, apply)
    log.info("glm5_fastpath: FP8 linear: %s.%s -> our act quant + skinny FP8 GEMM for %d tagged linears (%s) at <= "
             "%d tokens", CLASS, METHOD, len(tagged), ", ".join(f"{n}x{k}" for n, k in shapes(tagged)), route.limit)
    return True


def unpatch_fp8_linear(method_cls: Any = None) -> bool:
    cls = method_cls if method_cls is not None else _method_class()
    fn = getattr(cls, METHOD, None) if cls is not None else None
    original = getattr(fn, ORIGINAL_ATTR, None)
    if original is None:
        return False
    setattr(cls, METHOD, original)
    return True
