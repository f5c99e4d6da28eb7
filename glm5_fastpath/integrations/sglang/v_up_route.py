"""The V-up route: MLA's V up-projection after the sparse-MLA attention core (SGLang's W_UV bmm) at decode sizes,
computed by our kernel glm5_fastpath.ops.mla_v_up.mla_v_up_quant, which also writes the 1x128 FP8 quant of its
output; o_proj takes that quant instead of quantising its input again:

    attn_mqa (sparse MLA) -> o [T, H, 512]
    SGLang:  y = torch.bmm(o.transpose(0, 1), w_vc) (cuBLAS, bf16) [T, H * V] -> o_proj(y): act quant + FP8 GEMM
    ours:    y, y8, ys = mla_v_up_quant(o, w_vc) (one PDL kernel) -> o_proj(y): the FP8-linear route takes (y8, ys)

(V = v_head_dim, GLM-5: 256; each 1x128 quant group is 128 output columns of one head.) Why: on the H200 engine
profile at batch 1 the 8 cuBLAS W_UV bmms of a step were ~53 us exposed (docs/decode_budget.md), ~6.6 us per layer
against a 3.9 us bytes floor (16.8 MB of bf16 W_UV for 64 heads), and o_proj's act quant is another launch per layer.
Each CTA of our kernel copies its 128 x 512 W_UV slice into shared memory before griddepcontrol.wait, i.e. while the
sparse-MLA combine still runs, and does the quant in its epilogue (ops/mla_v_up.py).

Measured (H200, 2026-12-03, session 34, benchmarks/results/2026-12-03_h200_session34/):
- per op (`bench v-up`): 6.7-6.9 us at 1-16 tokens against SGLang's bmm 6.5-7.3 us and bmm + act quant 8.2-8.8 us
  (1.22-1.31x), 1.5-1.7x its 4.0-4.5 us bytes floor; slower than bmm + quant at 64 tokens (11.4 against 10.0 us);
- in the chain sparse MLA -> W_UV (+ quant) -> o_proj: 1.06x / 1.04x at 1 / 2 tokens, 0.97-1.03x at 4-32 (the kernel's
  139-227 KB of shared memory per CTA keeps o_proj's GEMM from starting its weight prefetch beside it);
- in the engine (same machine, both orders, 256 output tokens): ITL p50 2.01-2.02 ms against 2.11-2.14 at batch 1,
  5.26-5.27 against 5.21-5.22 at batch 8, 7.97-7.99 against 7.95-7.96 at batch 16.
So it is **on by default at <= 2 decode tokens** (DEFAULT_MAX_TOKENS; GLM5_FASTPATH_V_UP_MAX_TOKENS raises it, up to
64 = ops.mla_v_up.MAX_TOKENS); GLM5_FASTPATH_V_UP=0 (or off / sglang / stock / false / no) keeps SGLang's bmm
everywhere.

Seam: `forward_absorb_core(q_pe, k_pe, q_nope_out, k_nope, forward_batch, zero_allocator, positions, topk_indices,
llama_4_scaling[, fusion_plan, attention_output_gate])` of each decoder layer's `self_attn` (DeepseekV2AttentionMLA;
DeepseekMLAForwardMixin in sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla; 0.5.14 has the
first nine parameters, 0.5.23 adds the last two). DeepseekV2AttentionMLA.forward_core calls
`self.forward_absorb_core(*inner_state)`, so an instance attribute takes the call; `unpatch_v_up` removes it. For a
routed call the wrapper does what SGLang's DSA decode branch does, with the bmm replaced:

    attn_output = self.attn_mqa(q_nope_out, k_nope, k_nope, forward_batch, q_rope=q_pe, k_rope=k_pe
                                [, topk_indices=topk_indices])        # the same call: KV save + sparse MLA
    y, y8, ys = mla_v_up_quant(attn_output.view(-1, H, 512), self.w_vc)
    STASH.put(y, y8, ys); output, _ = self.o_proj(y)
    return output | (output, None) | (output, topk_indices)         # by self.next_skip_topk, as SGLang's tail

The hand-off is norm_route's QuantStash (STASH), keyed by y's object identity and version counter: o_proj's
FP8-linear route (linear_route.ours_linear) takes (y8, ys) for exactly that y, unmodified; any other input, or
SGLang's own o_proj method (above the FP8-linear route's token limit, or with that route off), quantises as before,
so without the FP8-linear route the quant is computed and left unused. The stash is ONE entry shared with the norm
route; that is safe because per layer the puts and takes alternate: input norm put -> prefix take -> V-up put ->
o_proj take -> post-attention norm put -> MoE take (each put replaces an entry its consumer has already taken or
refused).

A call goes to SGLang's original (counted in glm5_fastpath_v_up_total{route="stock", reason}, logged once per
reason) when any branch of SGLang's core other than the plain DSA decode + bf16 bmm would run (REASONS):
- compiling: inside a torch.compile trace or SGLang's piecewise (torch.compile) CUDA graph;
- backend: the module's attention backend (`current_attention_backend`, set per batch) is not dsa / nsa;
- mode: not a decode pass (extend, idle, target-verify, ...);
- tokens: T = q_nope_out.shape[0] is 0 or above the limit;
- llama4_scaling / fusion_plan / output_gate / sink: SGLang's llama-4 scaling, 0.5.23's fused-bmm plan, an
  attention-output gate or a learnable attention sink is in play;
- rope_fused: `_skip_rope_for_dsa_tilelang_fused()` (0.5.14, ROCm) or `_fuse_rope_for_trtllm_mla(forward_batch)`
  (FP8 KV with TRT-LLM DSA kernels) is true, or raised;
- dcp: decode context parallelism (dcp_size > 1 or is_dcp_mla_decode_phase);
- lora: a kv_b LoRA correction (SGLang's _SGLANG_EXPERIMENTAL_LORA_OPTI, is_kv_b_lora_active, kv_b_lora_correction,
  read from the forward_mla module the original method comes from);
- bmm: use_deep_gemm_bmm (FP8 DeepGEMM bmm), a GGUF split kv_b (Kimi), or a HIP / MUSA build;
- weight: w_vc is not bf16 [H, 512, V] with the 512 contiguous (SGLang's layout) on a routed device, or
  kv_lora_rank is not 512 or v_head_dim not a multiple of 128 (an FP8 w_vc takes SGLang's bmm_fp8);
- args: a call shape the wrapper does not know (extra positional or unknown keyword arguments);
- shape: attn_mqa's output does not hold T * H * 512 elements;
- error: our kernel raised (logged as a warning once).
For "shape" and "error" attn_mqa has already run; the original then runs it again, which writes the same latent
KV into the same cache slots (idempotent) and recomputes the attention: correct, only slower, for that call.
Routed calls count {route="ours", reason="routed"} (host side: under CUDA graphs a call is a capture, not a replay).
Install wraps only layers whose w_vc the op takes (ops.mla_v_up._check_inputs, 16-byte aligned) and whose
kv_lora_rank / v_head_dim are 512 / a multiple of 128; the per-call checks above repeat the cheap ones.

W8 form (opt-in, GLM5_FASTPATH_V_UP_W8=1; engine-measured in session 35, no step-time change beyond run-to-run noise:
benchmarks/results/2026-12-03_h200_session35/): at install each
wrapped layer whose kv_b_proj holds the FP8 source of its w_vc (e4m3 rows + 128x128 block scales whose dequantisation
is bitwise attn.w_vc: checked once, w8_source) gets the W8 kernel, which reads those rows (8.4 MB per GLM-5 layer
instead of 16.8) and computes the same bits; the others keep the bf16 kernel, logged with the reason.
GLM5_FASTPATH_V_UP_W8_MIN_TOKENS=N keeps the bf16 kernel below N tokens on W8 layers too (w8_min_tokens).

Math (ops/mla_v_up.py): y[t, h, :] = bf16(sum_l o[t, h, l] * w_vc[h, l, :]) with fp32 accumulation of exact bf16
products, like cuBLAS's bf16 bmm but in another sum order, so y may differ from SGLang's in the last bf16 bit; (y8,
ys) are bitwise act_quant_fp8(y), what the FP8-linear route's act quant would compute from y (SGLang's own
per-token-group quant, on its o_proj path, uses the same 1x128 scheme but may round an element differently).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from .decision import switch_on
from .norm_route import STASH, QuantStash, _compiling

logger = logging.getLogger("glm5_fastpath")

ENV = "GLM5_FASTPATH_V_UP"
ENV_MAX_TOKENS = "GLM5_FASTPATH_V_UP_MAX_TOKENS"
ENV_W8 = "GLM5_FASTPATH_V_UP_W8"  # opt-in: W_UV from SGLang's FP8 kv_b_proj (ops.mla_v_up_quant_w8)
ENV_W8_MIN_TOKENS = "GLM5_FASTPATH_V_UP_W8_MIN_TOKENS"  # W8 layers take the bf16 kernel below this many tokens
W8_ATTR = "__glm5_fastpath_v_up_w8__"  # on an attention module: (kv_b weight e4m3, its block scales, qk_nope_head_dim)
DEFAULT_ON = True
MAX_TOKENS = 64  # ops.mla_v_up.MAX_TOKENS (not imported: this module loads without the ops; a test checks it)
DEFAULT_MAX_TOKENS = 2  # engine: faster at batch 1, 1 % slower at 8; op chain: faster at 1-2 tokens only (module doc)
L_DIM = 512  # kv_lora_rank (ops.mla_v_up.L_DIM)
V_BLOCK = 128  # v_head_dim must be a multiple: one FP8 quant group (ops.mla_v_up.V_BLOCK)
BACKENDS = ("dsa", "nsa")  # SGLang's DSA backend ("nsa": its deprecated alias)
METHOD = "forward_absorb_core"
# forward_absorb_core's parameters: 0.5.14 has the first 9, 0.5.23 adds the last two
PARAMS = ("q_pe", "k_pe", "q_nope_out", "k_nope", "forward_batch", "zero_allocator", "positions", "topk_indices",
          "llama_4_scaling", "fusion_plan", "attention_output_gate")
REQUIRED = 9
ORIGINAL_ATTR = "__glm5_fastpath_original__"
MARK = "__glm5_fastpath_v_up__"  # on a wrapped attention module: its layer index

from ...metrics import V_UP_TOTAL as METRIC, seam_counter  # noqa: E402  listed in metrics.METRICS

REASONS = {
    "routed": "our W_UV kernel with o_proj's 1x128 FP8 quant, handed to o_proj",
    "compiling": "inside a torch.compile trace / SGLang's piecewise CUDA graph (the hand-off is host Python)",
    "backend": "the attention backend is not DSA (dsa / nsa)",
    "mode": "not a decode pass (extend / idle / target-verify)",
    "tokens": "T is 0 or more than GLM5_FASTPATH_V_UP_MAX_TOKENS",
    "llama4_scaling": "llama_4_scaling is given",
    "fusion_plan": "SGLang's fused MLA bmm plan (fusion_plan) is given",
    "output_gate": "an attention-output gate is given",
    "sink": "a learnable attention sink",
    "rope_fused": "SGLang's fused RoPE + KV-cache path (TileLang DSA / TRT-LLM MLA) would run, or its check raised",
    "dcp": "decode context parallelism",
    "lora": "a kv_b LoRA correction is active (or its check raised)",
    "bmm": "another W_UV bmm in SGLang (DeepGEMM FP8 bmm / GGUF kv_b / HIP / MUSA)",
    "weight": "w_vc not bf16 [H, 512, V] in SGLang's layout on a routed device, or kv_lora_rank not 512 / v_head_dim "
              "not a multiple of 128",
    "args": "forward_absorb_core called with arguments the wrapper does not know",
    "shape": "attn_mqa's output is not T x H x 512 (attention recomputed by SGLang's core for this call)",
    "error": "our kernel raised; SGLang's core for this call (attention recomputed)",
}


def enabled() -> bool:
    return switch_on(ENV, DEFAULT_ON)


def max_tokens() -> int:
    """GLM5_FASTPATH_V_UP_MAX_TOKENS clamped to 0..MAX_TOKENS (the kernel's builds); a bad value: the default."""
    try:
        return min(MAX_TOKENS, max(0, int(os.environ.get(ENV_MAX_TOKENS, DEFAULT_MAX_TOKENS))))
    except ValueError:
        return DEFAULT_MAX_TOKENS


def w8_enabled() -> bool:
    """GLM5_FASTPATH_V_UP_W8=1: read W_UV as kv_b_proj's FP8 rows (module doc, "W8 form"); off by default."""
    return os.environ.get(ENV_W8, "").strip().lower() in ("1", "on", "true", "yes")


def w8_min_tokens() -> int:
    """GLM5_FASTPATH_V_UP_W8_MIN_TOKENS (default 1, clamped to 1..MAX_TOKENS + 1): a W8 layer runs the bf16 kernel
    on fewer tokens. Why: in the op chain sparse MLA -> W_UV -> o_proj (H200, session 35) W8 was 1.7 us slower than
    the bf16 form at 1 token and 1-7 us faster at 2-16; a bad value: the default."""
    try:
        return min(MAX_TOKENS + 1, max(1, int(os.environ.get(ENV_W8_MIN_TOKENS, 1))))
    except ValueError:
        return 1


def w8_source(attn: Any) -> tuple | str:
    """(kv_b weight, block scales, nope) when SGLang's kv_b_proj holds the FP8 source of this layer's w_vc: e4m3
    [H * (nope + V), 512] + fp32 128x128 scales the W8 op takes, AND their dequantisation is bitwise attn.w_vc (one
    check at install: the W8 kernel then multiplies by exactly SGLang's weights); else the reason (a str)."""
    import torch

    kv_b = getattr(attn, "kv_b_proj", None)
    w, s = getattr(kv_b, "weight", None), getattr(kv_b, "weight_scale_inv", None)
    nope = getattr(attn, "qk_nope_head_dim", None)
    if not isinstance(w, torch.Tensor) or not isinstance(s, torch.Tensor) or not isinstance(nope, int):
        return "no kv_b_proj.weight / weight_scale_inv / qk_nope_head_dim"
    mv = op_module()
    h = int(attn.w_vc.shape[0])
    try:
        mv._check_w8(attn.w_vc.new_empty((1, 1, L_DIM)).expand(1, h, L_DIM), w, s, nope)
    except mv.MlaVUpInputError as e:
        return str(e)
    if w.data_ptr() % 16 or s.data_ptr() % 16:
        return "kv_b_proj weight / scales not 16-byte aligned"
    if not torch.equal(mv.dequant_w_vc(w, s, h, nope), attn.w_vc):
        return "kv_b_proj's dequantisation is not this layer's w_vc (another dequantisation or scale format)"
    return w, s, nope


def op_module() -> Any:
    """glm5_fastpath.ops.mla_v_up, the module (the package attribute `ops.mla_v_up_quant` is the function)."""
    import importlib

    return importlib.import_module("glm5_fastpath.ops.mla_v_up")


def ours_v_up(o: Any, w_vc: Any) -> Any:
    """Our kernel on SGLang's tensors: VUpResult(y [T, H*V] bf16, y8 [T, H*V] e4m3, ys [T, H*V/128] fp32), PDL."""
    return op_module().mla_v_up_quant(o, w_vc, pdl=True)


def ours_v_up_w8(o: Any, w8: Any, scale: Any, nope: int) -> Any:
    """The W8 form on kv_b_proj's FP8 rows (w8_source): bitwise ours_v_up on the w_vc they dequantise to."""
    return op_module().mla_v_up_quant_w8(o, w8, scale, nope, pdl=True)


def counter(registry: Any) -> Any:
    return seam_counter(registry, METRIC, "MLA V up-projection (W_UV bmm after the sparse-MLA core) calls by route "
                        "(ours = our kernel with o_proj's FP8 quant handed on; stock = SGLang's forward_absorb_core) "
                        "and reason; host-side, so under CUDA graphs a call is a capture, not a replay.")


# ---- checks --------------------------------------------------------------------------------------------------

def sglang_globals(attn: Any, original: Any = None) -> dict:
    """The globals of the module SGLang's forward_absorb_core comes from (forward_mla: its LoRA / platform flags):
    the class's method (not an instance wrapper), else `original`, unwrapped through __wrapped__."""
    fn = getattr(type(attn), METHOD, None) or original
    fn = getattr(fn, "__func__", fn)
    for _ in range(8):
        if getattr(fn, "__wrapped__", None) is None:
            break
        fn = fn.__wrapped__
    g = getattr(fn, "__globals__", None)
    if isinstance(g, dict):
        return g
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    return vars(mod) if mod is not None else {}


def _v_ok(v: Any) -> bool:
    return isinstance(v, int) and v > 0 and v % V_BLOCK == 0


def weight_why_not(attn: Any, devices: tuple[str, ...]) -> str | None:
    """The cheap per-call form of the op's w_vc rules (ops.mla_v_up._check_inputs); None when they hold."""
    import torch

    w = getattr(attn, "w_vc", None)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.dim() != 3:
        return "weight"
    h, v = getattr(attn, "num_local_heads", None), getattr(attn, "v_head_dim", None)
    if getattr(attn, "kv_lora_rank", None) != L_DIM or not _v_ok(v) or tuple(w.shape) != (h, L_DIM, v):
        return "weight"
    if w.stride(1) != 1 or w.stride(2) % 8 or (h > 1 and w.stride(0) % 8) or w.device.type not in devices:
        return "weight"
    return None


def _probe(fn: Callable[[], Any]) -> bool | None:
    """fn()'s truth, None when it raised."""
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - a check SGLang's own code would run: its branch, not ours
        return None


def call_why_not(attn: Any, a: dict, limit: int, devices: tuple[str, ...], g: dict) -> str | None:
    """None when SGLang's core would take the plain DSA decode branch with the bf16 bmm (module doc), else the
    reason key. a: the call's arguments by name (PARAMS); g: the forward_mla module's globals."""
    import torch

    piecewise = g.get("is_in_tc_piecewise_cuda_graph")
    if _compiling() or (callable(piecewise) and _probe(piecewise) is not False):
        return "compiling"
    if getattr(attn, "current_attention_backend", None) not in BACKENDS:
        return "backend"
    fm = getattr(a["forward_batch"], "forward_mode", None)
    if fm is None or _probe(fm.is_decode) is not True:
        return "mode"
    for other in ("is_idle", "is_extend", "is_target_verify"):
        f = getattr(fm, other, None)
        if f is not None and _probe(f) is not False:
            return "mode"
    q = a["q_nope_out"]
    if not isinstance(q, torch.Tensor) or q.dim() < 1 or not 1 <= int(q.shape[0]) <= limit:
        return "tokens"
    if a["llama_4_scaling"] is not None:
        return "llama4_scaling"
    if a.get("fusion_plan") is not None:
        return "fusion_plan"
    if a.get("attention_output_gate") is not None:
        return "output_gate"
    if getattr(attn, "learnable_sink_param", None) is not None:
        return "sink"
    for name, args in (("_skip_rope_for_dsa_tilelang_fused", ()), ("_fuse_rope_for_trtllm_mla", (a["forward_batch"],))):
        f = getattr(attn, name, None)
        if f is not None and _probe(lambda f=f, args=args: f(*args)) is not False:
            return "rope_fused"
    dcp = getattr(attn, "dcp_size", 1)
    if not isinstance(dcp, int) or dcp > 1:
        return "dcp"
    f = getattr(attn, "is_dcp_mla_decode_phase", None)
    if f is not None and _probe(lambda: f(a["forward_batch"])) is not False:
        return "dcp"
    if g.get("_SGLANG_EXPERIMENTAL_LORA_OPTI", False):
        return "lora"
    for name in ("is_kv_b_lora_active", "kv_b_lora_correction"):  # 0.5.14 / 0.5.23 (both: either active)
        f = g.get(name)
        if callable(f) and _probe(lambda f=f: f(attn)) is not False:
            return "lora"
    if (getattr(attn, "use_deep_gemm_bmm", False) or getattr(attn, "_kimi_split_gguf_kv_b", False)
            or g.get("_is_hip", False) or g.get("_is_musa", False)):
        return "bmm"
    return weight_why_not(attn, devices)


def module_why_not(attn: Any, devices: tuple[str, ...] = ("cuda",)) -> str | None:
    """At install: None when `attn`'s w_vc is one our op takes (the op's own checks, and 16-byte aligned) and its
    dims are what the kernel computes (kv_lora_rank 512, v_head_dim a multiple of 128), else a short reason."""
    import torch

    if not callable(getattr(attn, METHOD, None)):
        return f"no {METHOD}"
    w = getattr(attn, "w_vc", None)
    if not isinstance(w, torch.Tensor):
        return "no w_vc tensor"
    if w.dtype != torch.bfloat16:
        return f"w_vc is {w.dtype}, not bf16 (SGLang's FP8 bmm stays)"
    rank, v = getattr(attn, "kv_lora_rank", None), getattr(attn, "v_head_dim", None)
    if rank != L_DIM or not _v_ok(v):
        return f"kv_lora_rank / v_head_dim {rank} / {v}, not {L_DIM} / a multiple of {V_BLOCK}"
    h = getattr(attn, "num_local_heads", None)
    if w.dim() != 3 or tuple(w.shape) != (h, L_DIM, v):
        return f"w_vc of shape {tuple(w.shape)}, not (num_local_heads, kv_lora_rank, v_head_dim) = {(h, L_DIM, v)}"
    if w.device.type not in devices:
        return f"w_vc on {w.device}"
    mv = op_module()
    # a one-token o of the right shape and layout (a broadcast row: 1 KB) to ask the op about w_vc
    o = w.new_empty((1, 1, L_DIM)).expand(1, int(w.shape[0]), L_DIM)
    try:
        mv._check_inputs(o, w)
    except mv.MlaVUpInputError as e:
        return str(e)
    if w.data_ptr() % 16:
        return "w_vc data not 16-byte aligned"
    return None


# ---- the route ---------------------------------------------------------------------------------------------

def _bind(args: tuple, kwargs: dict) -> dict | None:
    """forward_absorb_core's arguments by name, None for a call shape this wrapper does not know."""
    if len(args) > len(PARAMS) or any(k not in PARAMS for k in kwargs):
        return None
    a = dict(zip(PARAMS, args))
    for k, v in kwargs.items():
        if k in a:
            return None
        a[k] = v
    if any(p not in a for p in PARAMS[:REQUIRED]):
        return None
    return a


def _tail(attn: Any, output: Any, topk_indices: Any) -> Any:
    """SGLang's return: output alone, or with the top-k handed to the next layer (index cache, next_skip_topk)."""
    nxt = getattr(attn, "next_skip_topk", None)
    if nxt is None:
        return output
    if not nxt:
        return output, None
    return output, topk_indices


class VUpRoute:
    """The wrappers' shared state: limit, once-per-reason log, metrics, the kernel call (injectable for CPU tests)."""

    def __init__(self, metrics: Any = None, log: logging.Logger = logger, limit: int | None = None,
                 devices: tuple[str, ...] = ("cuda",), run: Callable[..., Any] | None = None,
                 stash: QuantStash = STASH) -> None:
        # run: (o [T, H, 512], w_vc) -> (y, y8, ys); default ours_v_up
        self.metrics, self.log, self.devices, self.stash = metrics, log, devices, stash
        self.run = run if run is not None else ours_v_up
        self.run_w8 = ours_v_up_w8  # layers install_v_up gave a W8 source (GLM5_FASTPATH_V_UP_W8=1)
        self._sglang_globals: dict = {}  # attention class -> its forward_mla module's globals
        self.limit = max_tokens() if limit is None else min(MAX_TOKENS, max(0, limit))
        self.w8_min = w8_min_tokens()
        self._once: set = set()

    def _globals(self, attn: Any, original: Any) -> dict:
        """sglang_globals, looked up once per attention class (not per call)."""
        g = self._sglang_globals.get(type(attn))
        if g is None:
            g = self._sglang_globals[type(attn)] = sglang_globals(attn, original)
        return g

    def note(self, route: str, reason: str, level: int = logging.INFO) -> None:
        if (route, reason) not in self._once:
            self._once.add((route, reason))
            self.log.log(level, "glm5_fastpath: V up-projection (W_UV) -> %s (%s); logged once",
                         "ours" if route == "ours" else "SGLang", REASONS.get(reason, reason))
        if self.metrics is not None:
            counter(self.metrics.registry).labels(route=route, reason=reason).inc()

    def call(self, original: Callable, attn: Any, *args, **kwargs):
        a = _bind(args, kwargs)
        why = "args" if a is None else call_why_not(attn, a, self.limit, self.devices, self._globals(attn, original))
        if why is not None:
            self.note("stock", why)
            return original(*args, **kwargs)
        q_nope_out, k_nope, fb, topk = a["q_nope_out"], a["k_nope"], a["forward_batch"], a["topk_indices"]
        t, h = int(q_nope_out.shape[0]), int(attn.num_local_heads)
        attn_output = attn.attn_mqa(q_nope_out, k_nope, k_nope, fb, q_rope=a["q_pe"], k_rope=a["k_pe"],
                                    **({"topk_indices": topk} if topk is not None else {}))
        # From here on attn_mqa has run (it saved the latent KV of this step into the cache). Falling back means
        # calling SGLang's core, which runs attn_mqa again: the same values into the same cache slots (idempotent)
        # and the attention recomputed, so the result is SGLang's, only slower, for this call.
        if getattr(attn_output, "numel", lambda: -1)() != t * h * L_DIM:
            self.note("stock", "shape")
            return original(*args, **kwargs)
        try:
            w8 = attn.__dict__.get(W8_ATTR) if t >= self.w8_min else None
            o = attn_output.view(-1, h, L_DIM)
            y, y8, ys = self.run(o, attn.w_vc) if w8 is None else self.run_w8(o, *w8)
        except Exception as e:  # noqa: BLE001 - never take the server down: SGLang's core, loudly, once
            if ("stock", "error") not in self._once:
                self._once.add(("stock", "error"))  # this warning is the one log line of the reason
                self.log.warning("glm5_fastpath: V up-projection (W_UV): our kernel raised %s: %s; SGLang's "
                                 "forward_absorb_core for this call", type(e).__name__, e)
            self.note("stock", "error", logging.WARNING)
            return original(*args, **kwargs)
        self.stash.put(y, y8, ys)  # o_proj's act quant of exactly this y (linear_route.ours_linear takes it)
        self.note("ours", "routed")
        output, _ = attn.o_proj(y)
        return _tail(attn, output, topk)


def wrap_attention(attn: Any, route: VUpRoute, index: int | None = None) -> None:
    """Give `attn` an instance forward_absorb_core that calls route.call(original, attn, ...); idempotent."""
    if ORIGINAL_ATTR in getattr(attn.__dict__.get(METHOD), "__dict__", {}):
        return
    original = getattr(attn, METHOD)

    def forward_absorb_core(*args, **kwargs):
        return route.call(original, attn, *args, **kwargs)

    setattr(forward_absorb_core, ORIGINAL_ATTR, original)
    forward_absorb_core.__glm5_fastpath_route__ = route
    attn.__dict__[MARK] = index
    attn.__dict__[METHOD] = forward_absorb_core


def targets(model: Any) -> list[tuple[int, Any]]:
    """[(layer index, self_attn)] of the decoder layers whose self_attn has forward_absorb_core and w_vc."""
    out = []
    for i, layer in enumerate(getattr(getattr(model, "model", model), "layers", None) or []):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "__dict__") and callable(getattr(attn, METHOD, None)) \
                and hasattr(attn, "w_vc"):
            out.append((i, attn))
    return out


def install_v_up(model: Any, metrics: Any = None, log: logging.Logger = logger, precompile: bool = True,
                 devices: tuple[str, ...] = ("cuda",), route: VUpRoute | None = None) -> list[int]:
    """Wrap forward_absorb_core of the decoder layers whose W_UV our kernel takes (module doc), after compiling the
    kernel (never inside the first request). Returns the wrapped layers' indices: [] when the route is off,
    nothing qualifies or the kernel cannot be prepared (then SGLang's bmm everywhere, logged)."""
    from .prefix_executor import _ranges

    if not enabled():
        raw = os.environ.get(ENV, "").strip()
        log.info("glm5_fastpath: V up-projection: %s; SGLang's W_UV bmm everywhere",
                 f"{ENV}={raw}" if raw else f"off by default ({ENV}=1 turns it on)")
        return []
    picked, mods, refused = [], [], {}
    for i, attn in targets(model):
        why = module_why_not(attn, devices)
        if why is None:
            picked.append(i)
            mods.append((i, attn))
        else:
            refused.setdefault(why, []).append(i)
    for why, ids in refused.items():
        log.info("glm5_fastpath: V up-projection: layers %s keep SGLang's W_UV bmm (%s)", _ranges(ids), why)
    if not mods:
        return []
    if precompile:
        try:
            dev = mods[0][1].w_vc.device
            if dev.type == "cuda":
                op_module().precompile(dev)
        except Exception as e:  # noqa: BLE001 - no GPU toolchain: SGLang's bmm, say why
            log.warning("glm5_fastpath: V up-projection kernel unavailable (%s: %s); SGLang's W_UV bmm stays",
                        type(e).__name__, e)
            return []
    route = route or VUpRoute(metrics, log, devices=devices)
    w8_layers, w8_refused = [], {}
    for i, attn in mods:
        wrap_attention(attn, route, i)
        if w8_enabled():
            src = w8_source(attn)
            if isinstance(src, str):
                w8_refused.setdefault(src, []).append(i)
            else:
                attn.__dict__[W8_ATTR] = src
                w8_layers.append(i)
    if w8_enabled():
        for why, ids in w8_refused.items():
            log.info("glm5_fastpath: V up-projection: layers %s keep the bf16 w_vc (%s=1: %s)", _ranges(ids), ENV_W8, why)
        if w8_layers:
            log.info("glm5_fastpath: V up-projection: layers %s read W_UV from kv_b_proj's FP8 rows (%s=1; half the "
                     "bytes, the same bf16 weights)", _ranges(w8_layers), ENV_W8)
    log.info("glm5_fastpath: V up-projection: forward_absorb_core -> our W_UV + FP8 quant kernel (quant handed to "
             "o_proj) on layers %s at <= %d decode tokens (%s=0 turns it off)", _ranges(picked), route.limit, ENV)
    return picked


def unpatch_v_up(model: Any) -> int:
    """Remove every wrapper install_v_up added; returns how many."""
    n = 0
    for layer in getattr(getattr(model, "model", model), "layers", None) or []:
        attn = getattr(layer, "self_attn", None)
        fn = getattr(attn, "__dict__", {}).get(METHOD)
        if fn is not None and getattr(fn, ORIGINAL_ATTR, None) is not None:
            del attn.__dict__[METHOD]
            attn.__dict__.pop(MARK, None)
            attn.__dict__.pop(W8_ATTR, None)
            n += 1
    return n
