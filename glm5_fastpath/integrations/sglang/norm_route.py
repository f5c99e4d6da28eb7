"""The norm route: the fused residual add + RMSNorm in front of the attention prefix and in front of the MoE, at
decode sizes, computed by our A0 kernel (glm5_fastpath.ops.add_rmsnorm_quant), which also writes the 1x128 FP8
quant of its output. The consumers of that quant take it instead of launching a quant kernel of their own:

    input_layernorm(h, residual)          -> A0: x, residual (in place), x8, xs  ->  the prefix's Q0 takes (x8, xs)
    post_attention_layernorm(h, residual) -> A0: x, residual (in place), x8, xs  ->  the MoE executor takes (x8, xs)

Why: at batch 1 on the H200 (SGLang 0.5.14 engine profile, session 28) the 16 FlashInfer add + RMSNorm kernels of a
step were ~43 us exposed, the prefix's Q0 quant and the MoE's act quant another ~17 us, and none of them is launched
with Programmatic Dependent Launch, so the kernel after each norm (B0 / C0 / B1 of the prefix, the MoE router) could
not prefetch its weights while the norm ran. A0 replaces each norm + quant pair by one PDL kernel (the next kernel's
griddepcontrol.wait orders the reads: A0's outputs are read only after it). Measured in the engine (H200, session 29
c5, same machine): the decode step's ITL p50 was level with SGLang's norms (within 0.5 % at batch 1-64, inside the
run-to-run spread), so the route is on for the kernels it removes and the PDL chain it opens, not for a measured gain.

Math: A0's (ops/add_rmsnorm_quant.py): r = fp32(h) + fp32(residual), residual = bf16(r), x = bf16(r * rsqrt(mean(r^2)
+ eps) * weight) from the fp32 r (FlashInfer's fused_add_rmsnorm, which SGLang runs, also normalises the fp32 sum;
the sum of squares is reduced in another order, so x can differ from SGLang's in the last bf16 bit), and the quant is
act_quant_fp8's (bitwise ref.fp8.quant_act_per_token of x). residual is updated in place, as SGLang's kernel does;
x is a new tensor (A0 does not write over its input). The prefix's Q0 otherwise runs SGLang's per-token-group quant:
the same 1x128 scheme (scale = max(amax, eps) / 448), which may round an element's division differently, so with the
route Q0's FP8 input can differ from before in the last FP8 rounding (the MoE's act quant is ours either way).

Seam: each routed layer's `input_layernorm` / `post_attention_layernorm` module (SGLang's RMSNorm) gets an instance
`forward` (nn.Module calls it; `unpatch_norms` removes it). Wrapped at install, only where a consumer exists: the
input norm of layers whose prefix route is prepared, the post-attention norm of layers whose MoE goes to MegaMoE;
and only norms in SGLang's plain form (bf16 weight [H], H % 256 == 0, no cast-before-weight, no fp32 residual, no
variance override). The hand-off (`QuantStash`) is keyed by the output tensor object and its version counter: a
consumer gets (x8, xs) only for that exact tensor, unmodified since A0 wrote it; anything else quantises as before.

A call goes to SGLang's norm (counted in glm5_fastpath_norm_total{route="stock", reason}, logged once per reason)
when: there is no residual (the first layer's input norm), a post_residual_addition is given, x / residual are not
2-D contiguous bf16 CUDA tensors of one shape, M is 0 or above MAX_TOKENS, or our kernel raises. Routed calls count
{route="ours", reason="routed"} (host side: under CUDA graphs a call is a capture, not a replay). Inside a torch.compile
trace the wrapper and the hand-off step aside (reason "compiling"): they are meant for CUDA-graph capture.

GLM5_FASTPATH_NORM=sglang keeps SGLang's norms everywhere (the previous behaviour).
"""
from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Callable

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_NORM"
MAX_TOKENS = 256  # the decode buckets; A0 takes any M, but prefill keeps SGLang's norm
ORIGINAL_ATTR = "__glm5_fastpath_original__"
MARK = "__glm5_fastpath_norm__"  # on a wrapped norm module: "input" | "post_attention"

from ...metrics import NORM_TOTAL as METRIC, seam_counter  # noqa: E402  listed in metrics.METRICS

REASONS = {
    "routed": "our A0: add + RMSNorm + 1x128 FP8 quant in one PDL kernel",
    "no_residual": "no residual (the first layer's input norm is a plain RMSNorm)",
    "post_add": "a post_residual_addition is given",
    "input": "x / residual not 2-D contiguous bf16 CUDA tensors of one shape",
    "tokens": "M is 0 or more than 256 tokens (prefill keeps SGLang's norm)",
    "compiling": "inside a torch.compile trace (the hand-off is host Python; SGLang's norm there)",
    "error": "our kernel raised; SGLang's norm for this call",
}


def enabled() -> bool:
    return os.environ.get(ENV, "ours").strip().lower() not in ("sglang", "stock", "0", "off", "false", "no")


class QuantStash:
    """The latest A0 output's FP8 quant, for the consumer of that exact tensor.

    put(x, x8, xs) after A0; take(x) returns (x8, xs) once when `x` is the same tensor object A0 returned and its
    version counter has not moved (nothing wrote into it since), else None. One entry: a norm's consumer runs before
    the next norm."""

    def __init__(self) -> None:
        self._entry: tuple | None = None

    def put(self, x: Any, x8: Any, xs: Any) -> None:
        self._entry = (weakref.ref(x), x._version, x8, xs)

    def take(self, x: Any) -> tuple[Any, Any] | None:
        e = self._entry
        if e is None or _compiling():
            return None
        ref, version, x8, xs = e
        if ref() is not x or getattr(x, "_version", None) != version:
            return None
        self._entry = None
        return x8, xs


STASH = QuantStash()


def stashed_quant(quant: Callable[[Any], Any], on_hit: Callable[[], None] | None = None) -> Callable[[Any], Any]:
    """quant wrapped so that a tensor A0 just produced is not quantised again: STASH's (x8, xs) for it, else
    quant(x). on_hit: called on every hit (the consumers log the first)."""
    def q(x: Any) -> Any:
        got = STASH.take(x)
        if got is not None:
            if on_hit is not None:
                on_hit()
            return got
        return quant(x)

    q.__wrapped__ = quant  # type: ignore[attr-defined]
    return q


def a0_module() -> Any:
    """glm5_fastpath.ops.add_rmsnorm_quant, the module (the package attribute of that name is the function)."""
    import importlib

    return importlib.import_module("glm5_fastpath.ops.add_rmsnorm_quant")


def ours_norm(x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any, Any]:
    """A0 on SGLang's tensors: (x_normed [M, H] bf16 (new), x8 [M, H] e4m3, xs [M, H/128] fp32 row-major); residual
    is updated in place to bf16(x + residual)."""
    r = a0_module().add_rmsnorm_quant(x, residual, weight, eps, out=residual)
    return r.x, r.x_fp8, r.x_scale


def module_why_not(norm: Any) -> str | None:
    """None when `norm` is SGLang's RMSNorm in the plain form A0 computes, else a short reason."""
    import torch

    if type(norm).__name__ != "RMSNorm":
        return f"{type(norm).__name__} is not SGLang's RMSNorm"
    w = getattr(norm, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 1:
        return "weight is not a bf16 [H] tensor"
    if int(w.shape[0]) % 256:
        return f"H = {int(w.shape[0])} is not a multiple of 256"
    if not getattr(norm, "has_weight", True):
        return "no weight"
    for flag in ("cast_x_before_out_mul", "fp32_residual"):
        if getattr(norm, flag, False):
            return flag
    if getattr(norm, "variance_size_override", None) is not None or getattr(norm, "override_orig_dtype", None):
        return "variance size / dtype override"
    eps = getattr(norm, "variance_epsilon", None)
    if not isinstance(eps, float) or not eps > 0:
        return "no positive float variance_epsilon"
    return None


def _compiling() -> bool:
    import torch

    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(f()) if f is not None else False


def call_why_not(x: Any, residual: Any, post_add: Any, hidden: int, devices: tuple[str, ...]) -> str | None:
    import torch

    if _compiling():
        return "compiling"
    if residual is None:
        return "no_residual"
    if post_add is not None:
        return "post_add"
    for t in (x, residual):
        if (not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.bfloat16 or not t.is_contiguous()
                or t.device.type not in devices):
            return "input"
    if tuple(x.shape) != tuple(residual.shape) or int(x.shape[1]) != hidden or x.device != residual.device:
        return "input"
    if not 1 <= int(x.shape[0]) <= MAX_TOKENS:
        return "tokens"
    return None


class NormRoute:
    """The wrappers' shared state: once-per-reason log, metrics, the kernel call (injectable for CPU tests)."""

    def __init__(self, metrics: Any = None, log: logging.Logger = logger, devices: tuple[str, ...] = ("cuda",),
                 run: Callable[..., Any] | None = None, stash: QuantStash = STASH) -> None:
        self.metrics, self.log, self.devices, self.stash = metrics, log, devices, stash
        self.run = run if run is not None else ours_norm
        self._once: set = set()

    def note(self, route: str, reason: str, where: str, level: int = logging.INFO) -> None:
        if (route, reason) not in self._once:
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: add + RMSNorm (%s) -> %s (%s); logged once", where,
                         "ours" if route == "ours" else "SGLang", REASONS.get(reason, reason))
        if self.metrics is not None:
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    def call(self, original: Callable, norm: Any, x: Any, residual: Any = None, post_residual_addition: Any = None,
             *args, **kwargs):
        where = getattr(norm, MARK, "?")
        why = "input" if args or kwargs else call_why_not(x, residual, post_residual_addition,
                                                          int(norm.weight.shape[0]), self.devices)
        if why is not None:
            self.note("stock", why, where)
            return original(x, residual, post_residual_addition, *args, **kwargs)
        try:
            y, x8, xs = self.run(x, residual, norm.weight, norm.variance_epsilon)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's norm, loudly, once
            if ("stock", "error") not in self._once:
                self._once.add(("stock", "error"))  # this warning is the one log line of the reason
                self.log.warning("glm5_fastpath: add + RMSNorm (%s): our kernel raised %s: %s; SGLang's norm for this "
                                 "call", where, type(e).__name__, e)
            self.note("stock", "error", where, logging.WARNING)
            return original(x, residual, post_residual_addition)
        self.stash.put(y, x8, xs)
        self.note("ours", "routed", where)
        return y, residual


def counter(registry: Any) -> Any:
    return seam_counter(registry, METRIC, "Fused add + RMSNorm calls in front of the prefix / MoE by route (ours = "
                        "A0 with its FP8 quant handed on; stock = SGLang's norm) and reason; host-side, so under CUDA "
                        "graphs a call is a capture, not a replay.")


def wrap_norm(norm: Any, where: str, route: NormRoute) -> None:
    """Give `norm` an instance forward that calls route.call(original, ...); idempotent."""
    if ORIGINAL_ATTR in getattr(norm.forward, "__dict__", {}):
        return
    original = norm.forward

    def forward(x, residual=None, post_residual_addition=None, *args, **kwargs):
        return route.call(original, norm, x, residual, post_residual_addition, *args, **kwargs)

    setattr(forward, ORIGINAL_ATTR, original)
    setattr(norm, MARK, where)
    norm.forward = forward


def unpatch_norms(model: Any) -> int:
    """Remove every wrapper install_norms added; returns how many."""
    n = 0
    for layer in getattr(getattr(model, "model", model), "layers", None) or []:
        for name in ("input_layernorm", "post_attention_layernorm"):
            norm = getattr(layer, name, None)
            fn = getattr(norm, "__dict__", {}).get("forward")
            if fn is not None and getattr(fn, ORIGINAL_ATTR, None) is not None:
                del norm.__dict__["forward"]
                norm.__dict__.pop(MARK, None)
                n += 1
    return n


def targets(model: Any) -> list[tuple[int, str, Any]]:
    """[(layer index, "input" | "post_attention", norm module)]: the input norm of layers whose prefix route is
    prepared (prefix_executor.STATE without a refusal), the post-attention norm of layers whose MoE is routed
    (moe_executor.STATE without a refusal)."""
    from .moe_executor import STATE as MOE_STATE
    from .prefix_executor import STATE as PREFIX_STATE

    out: list[tuple[int, str, Any]] = []
    for i, layer in enumerate(getattr(getattr(model, "model", model), "layers", None) or []):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        p = getattr(attn, "__dict__", {}).get(PREFIX_STATE)
        if p is not None and getattr(p, "refusal", None) is None and getattr(layer, "input_layernorm", None) is not None:
            out.append((i, "input", layer.input_layernorm))
        m = getattr(mlp, "__dict__", {}).get(MOE_STATE)
        if (m is not None and getattr(m, "refusal", None) is None
                and getattr(layer, "post_attention_layernorm", None) is not None):
            out.append((i, "post_attention", layer.post_attention_layernorm))
    return out


def install_norms(model: Any, metrics: Any = None, log: logging.Logger = logger, precompile: bool = True,
                  route: NormRoute | None = None) -> NormRoute | None:
    """Wrap the norms of `targets(model)` (module doc); None when the route is off, nothing qualifies, or A0 cannot
    be prepared (then every norm stays SGLang's, logged)."""
    from .prefix_executor import _ranges

    if not enabled():
        log.info("glm5_fastpath: add + RMSNorm: %s=sglang, SGLang's norms everywhere", ENV)
        return None
    picked: dict[str, list[int]] = {"input": [], "post_attention": []}
    refused: dict[str, list[int]] = {}
    mods = []
    for i, where, norm in targets(model):
        why = module_why_not(norm)
        if why is None:
            picked[where].append(i)
            mods.append((where, norm))
        else:
            refused.setdefault(why, []).append(i)
    for why, ids in refused.items():
        log.info("glm5_fastpath: add + RMSNorm: layers %s keep SGLang's norm (%s)", _ranges(ids), why)
    if not mods:
        return None
    if precompile:
        try:
            w = mods[0][1].weight
            if w.device.type == "cuda":
                a0_module().precompile((int(w.shape[0]),), w.device)
        except Exception as e:  # noqa: BLE001 - no GPU toolchain: SGLang's norms, say why
            log.info("glm5_fastpath: add + RMSNorm: A0 unavailable (%s: %s); SGLang's norms everywhere",
                     type(e).__name__, e)
            return None
    route = route or NormRoute(metrics, log)
    for where, norm in mods:
        wrap_norm(norm, where, route)
    log.info("glm5_fastpath: add + RMSNorm -> A0 (+ FP8 quant handed to the consumer) on input norms of layers %s, "
             "post-attention norms of layers %s", _ranges(picked["input"]),
             _ranges(picked["post_attention"]))
    return route
