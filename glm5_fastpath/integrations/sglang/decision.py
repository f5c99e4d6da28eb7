"""Routing decisions as pure functions over plain values (no sglang, no torch): tested on CPU.

Two levels:

1. `check_model(facts)`: may glm5_fastpath touch this loaded model at all? Returns the first reason
   it may not (architecture, draft worker, GPU < sm_90, quantisation, parallel layout) or None.
2. `route_step(mode, m, table)`: for one forward pass (one decode step, one prefill chunk, ...) which
   path each component takes, with a reason. Prefill/extend, target-verify, idle and M above the
   largest bucket stay on SGLang's path; decode steps take the table's choice for their bucket if that
   executor is built, else SGLang's path with reason "executor_not_built". One opt-in exception: a prefill /
   extend pass of at most `prefill_moe_max` tokens (GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS, `prefill_moe_max_tokens()`,
   default 0 = off) sends its MoE to MegaMoE (reason "prefill_moe"; the prefix stays SGLang's): SGLang's Triton fused MoE is what the
   stock prefill runs on Hopper, and MegaMoE handles any token count (`bench moe-prefill` compares the two).

Built today: the prefix executor "cmp" (prefix_executor.py: our ops behind forward_absorb_prepare,
with its own per-layer / per-call fallbacks, glm5_fastpath_prefix_layer_total). "megartp" and every
MoE config are not built (issues #5, #6). The reasons are the `reason` label of glm5_fastpath_path_total.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...selection import STOCK, SelectionTable

ARCHITECTURE = "GlmMoeDsaForCausalLM"
MIN_CAPABILITY = (9, 0)
SUPPORTED_TP = frozenset({1})  # TP1 only for now: the prefix ops assume all 64 heads on one GPU (H_local = 64)

# Executors that exist and may be called (patch.EXECUTORS holds their functions).
BUILT_PREFIX: frozenset[str] = frozenset({"cmp"})
BUILT_MOE: frozenset[str] = frozenset({"megamoe"})  # MoE entries are "<family>[:<config>]": the family is checked


PREFILL_MOE = "megamoe"  # the MoE executor a prefill_moe pass takes (MegaMoE's default config for its M)


# A route's on / off environment switch: unset or empty means the route's default; any of SWITCH_OFF means off;
# anything else means on (GLM5_FASTPATH_V_UP, _FP8_LINEAR, _DSA_METADATA).
SWITCH_OFF = ("0", "off", "sglang", "stock", "false", "no")


def switch_raw(name: str) -> str:
    """The switch's value, stripped and lower-cased ("" when unset)."""
    return os.environ.get(name, "").strip().lower()


def switch_on(name: str, default: bool) -> bool:
    raw = switch_raw(name)
    return default if not raw else raw not in SWITCH_OFF


def executor_family(name: str) -> str:
    """The executor a table entry names: megamoe:bn16_s6_g512_w4 -> megamoe, cmp -> cmp, stock -> stock."""
    return name.split(":", 1)[0]

# reason codes (metric label values); the text is what the log says
REASONS = {
    "architecture": "model is not GlmMoeDsaForCausalLM",
    "draft_worker": "speculative draft worker (MTP/NextN model): left to SGLang",
    "gpu_arch": "GPU is older than Hopper sm_90 (or no CUDA GPU)",
    "quantization": "weights are not FP8 with 128x128 block scales",
    "parallel_layout": "parallel layout not supported yet (TP1 only; no EP/DP-attention/PP)",
    "prefill_extend": "prefill / extend / mixed batch: SGLang's path",
    "target_verify": "speculative target-verify batch: SGLang's path",
    "idle": "idle batch (DP attention): SGLang's path",
    "unknown_mode": "forward mode not recognised: SGLang's path",
    "empty_batch": "no tokens: SGLang's path",
    "above_largest_bucket": "M above the largest bucket of the selection table: SGLang's path",
    "table_selects_stock": "the selection table picks SGLang's path for this bucket",
    "executor_not_built": "the selected executor is not built yet: SGLang's path",
    "selected": "glm5_fastpath executor selected by the table",
    "prefill_moe": "prefill / extend chunk: MoE on MegaMoE (GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS), the rest SGLang's",
}

ENV_PREFILL_MOE = "GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS"
# largest prefill / extend pass (tokens) whose MoE runs on MegaMoE; above it (and at 0) SGLang's Triton fused MoE.
# MegaMoE takes 4096 tokens per launch; the executor splits bigger passes (moe_executor.prefill_chunk). Opt-in (e.g.
# 16384): per prefill chunk MegaMoE measured 1.03-1.13x faster than SGLang's Triton MoE at 128-4096 tokens (bench
# moe-prefill, H200, session 30), but in the engine (128-token prompts) throughput was level and the decode ITL p50 was
# 0.6-1.0 % higher at batch 1-16 with the route on, in both run orders, cause not separated yet (the route changes the
# generated tokens, hence the experts decode touches; in those runs it also grew the one MegaMoE workspace decode used
# to 4096 tokens, which prefill launches now keep apart: moe_executor.PREFILL_WORKSPACE, not yet run on the GPU), and
# SGLang's memory pools came out ~5.3 GB smaller with it (free memory at graph capture), more than its ~1 GB workspace.
DEFAULT_PREFILL_MOE_MAX = 0


def prefill_moe_max_tokens() -> int:
    """GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS (default DEFAULT_PREFILL_MOE_MAX; 0 keeps every prefill MoE on SGLang)."""
    raw = os.environ.get(ENV_PREFILL_MOE, "").strip()
    if not raw:
        return DEFAULT_PREFILL_MOE_MAX
    try:
        return max(0, int(raw))
    except ValueError:
        return DEFAULT_PREFILL_MOE_MAX

_EXTEND_MODES = frozenset({"EXTEND", "MIXED", "SPLIT_PREFILL", "DLLM_EXTEND", "DRAFT_EXTEND", "DRAFT_EXTEND_V2",
                           "PREBUILT"})


@dataclass(frozen=True)
class ModelFacts:
    """What install needs to know about the loaded model and its process, as plain values."""

    architecture: str | None
    is_draft_worker: bool = False
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    quant_method: str | None = None  # "fp8" for GLM-5-FP8
    weight_block_size: tuple[int, ...] | None = None  # (128, 128) for block FP8
    tp_size: int = 1
    ep_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    enable_dp_attention: bool = False
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Refusal:
    reason: str  # key of REASONS
    detail: str

    def message(self) -> str:
        return f"{REASONS[self.reason]} ({self.detail})"


def check_model(f: ModelFacts) -> Refusal | None:
    """None when the model may be routed; else the first reason not to touch it."""
    if f.architecture != ARCHITECTURE:
        return Refusal("architecture", f"architecture {f.architecture!r}")
    if f.is_draft_worker:
        return Refusal("draft_worker", "is_draft_worker=True")
    if f.capability is None or tuple(f.capability) < MIN_CAPABILITY:
        cap = "no CUDA GPU" if f.capability is None else f"sm_{f.capability[0]}{f.capability[1]}"
        return Refusal("gpu_arch", f"{f.gpu_name or 'GPU'}: {cap}, need sm_90+")
    if (f.quant_method or "").lower() != "fp8" or tuple(f.weight_block_size or ()) != (128, 128):
        return Refusal("quantization", f"quant_method={f.quant_method!r}, weight_block_size={f.weight_block_size!r}")
    if f.tp_size not in SUPPORTED_TP or f.ep_size != 1 or f.dp_size != 1 or f.pp_size != 1 or f.enable_dp_attention:
        return Refusal("parallel_layout", f"tp={f.tp_size} ep={f.ep_size} dp={f.dp_size} pp={f.pp_size} "
                                          f"dp_attention={f.enable_dp_attention}")
    return None


@dataclass(frozen=True)
class StepRoute:
    """Where one forward pass goes. `bucket` is None outside decode or above the table."""

    mode: str  # "decode" | "prefill_extend" | "target_verify" | "idle" | "unknown"
    m: int
    bucket: int | None
    prefix: str  # executor actually used: a name from BUILT_PREFIX or "stock"
    moe: str
    reason: str  # key of REASONS
    wanted_prefix: str = STOCK  # what the table asked for
    wanted_moe: str = STOCK

    @property
    def path(self) -> str:
        """'fast' when any component leaves SGLang's path, else 'stock' (metric label)."""
        return "fast" if (self.prefix != STOCK or self.moe != STOCK) else "stock"

    @property
    def bucket_label(self) -> str:
        return str(self.bucket) if self.bucket is not None else ("above" if self.reason == "above_largest_bucket" else "none")


def mode_kind(mode_name: str | None) -> str:
    """Map SGLang's ForwardMode name (e.g. 'DECODE') to our kinds."""
    n = (mode_name or "").upper()
    if n == "DECODE":
        return "decode"
    if n == "IDLE":
        return "idle"
    if n == "TARGET_VERIFY":
        return "target_verify"
    if n in _EXTEND_MODES:
        return "prefill_extend"
    return "unknown"


def route_step(mode_name: str | None, m: int, table: SelectionTable,
               built_prefix: frozenset[str] | None = None, built_moe: frozenset[str] | None = None,
               prefill_moe_max: int = 0) -> StepRoute:
    built_prefix = BUILT_PREFIX if built_prefix is None else built_prefix
    built_moe = BUILT_MOE if built_moe is None else built_moe
    kind = mode_kind(mode_name)
    if kind == "prefill_extend" and 1 <= m <= prefill_moe_max and PREFILL_MOE in built_moe:
        return StepRoute(kind, m, None, STOCK, PREFILL_MOE, "prefill_moe", STOCK, PREFILL_MOE)
    if kind != "decode":
        reason = {"idle": "idle", "target_verify": "target_verify", "prefill_extend": "prefill_extend"}.get(kind, "unknown_mode")
        return StepRoute(kind, m, None, STOCK, STOCK, reason)
    look = table.lookup(m)
    if look.choice is None:
        return StepRoute(kind, m, None, STOCK, STOCK, look.reason)
    c = look.choice
    prefix = c.prefix if c.prefix in built_prefix else STOCK
    moe = c.moe if executor_family(c.moe) in built_moe else STOCK
    if c.prefix == STOCK and c.moe == STOCK:
        reason = "table_selects_stock"
    elif (c.prefix != STOCK and prefix == STOCK) or (c.moe != STOCK and moe == STOCK):
        reason = "executor_not_built"
    else:
        reason = "selected"
    return StepRoute(kind, m, c.tokens, prefix, moe, reason, c.prefix, c.moe)


def component_log_line(component: str, r: StepRoute) -> str:
    """The one log line for (component, bucket/mode, reason), e.g.
    'glm5_fastpath: bucket 16 -> stock (prefix executor not built yet)'."""
    impl = r.prefix if component == "prefix" else r.moe
    wanted = r.wanted_prefix if component == "prefix" else r.wanted_moe
    label = "MoE" if component == "moe" else "prefix"
    where = f"bucket {r.bucket}" if r.bucket is not None else f"{r.mode} M={r.m}"
    if impl != STOCK and r.reason == "prefill_moe":
        return f"glm5_fastpath: {where} -> {impl} ({label}: {REASONS[r.reason]})"
    if impl != STOCK:
        return f"glm5_fastpath: {where} -> {impl} ({label})"
    if r.bucket is not None and wanted != STOCK:
        return f"glm5_fastpath: {where} -> stock ({label} executor {wanted} not built yet)"
    if r.bucket is not None:
        built = BUILT_PREFIX if component == "prefix" else BUILT_MOE
        if not built:
            return f"glm5_fastpath: {where} -> stock ({label} executor not built yet)"
        return f"glm5_fastpath: {where} -> stock ({label}: selection table picks stock)"
    return f"glm5_fastpath: {where} -> stock ({label}: {REASONS[r.reason]})"


def step_log_line(r: StepRoute) -> str:
    where = f"bucket {r.bucket}" if r.bucket is not None else f"{r.mode} M={r.m}"
    return f"glm5_fastpath: {where} step -> {r.path} ({REASONS[r.reason]})"


class OnceLog:
    """Remembers which keys were logged, so each (component, bucket/mode, reason) is logged once."""

    def __init__(self) -> None:
        self._seen: set[tuple] = set()

    def first(self, *key) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        return True
