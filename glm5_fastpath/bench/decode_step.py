"""`glm5-fastpath bench decode-step`: one full GLM-5 decode step (every layer of the model) on a GPU,
without SGLang: our paths vs the stock kernel sequence, per token bucket, against the step's bytes floor.

    glm5-fastpath bench decode-step --out DIR [--synthetic-layers 4 --dense-layers 1 | --model DIR]
        [--buckets 1,8,16,32,64,128] [--kv-len 8192] [--paths ours,stock] [--repeat 20] [--dry-run]

Model: `--synthetic-layers N [--dense-layers D] [--preset glm5|glm5.2]` (default 4 layers: 1 dense + 3 MoE)
generates random full-dims weights directly on the GPU (the distributions of weights.layer_tensor_specs,
i.e. what make-checkpoint writes, but not bit-identical to it; nothing touches the disk: an 8-layer
full-dims checkpoint is 53 GB), router weights N(0, 0.02) and a ZERO correction bias (realistic,
spread routing). `--model DIR` (make-checkpoint output or a real GLM-5-FP8 directory) uses its
config and weights (`--num-layers N`: only the first N layers; `--randomize-routers`: N(0, 0.02)
routers and zero bias instead of the checkpoint's).

One decode step = for each layer: attention prefix -> attention core -> post-attention add+RMSNorm(+quant)
-> MoE or dense MLP; then final add+RMSNorm + lm_head. Who computes what:

| piece | ours | stock |
|---|---|---|
| attention prefix (A0..E2) | CMP executor (attn_pre/cmp, per-bucket mode) over glm5_fastpath.ops | bench/stock_prefix.py sequence (DeepGEMM GEMMs + paged MQA logits, cuBLAS, torch.compile'd fused small ops, torch.topk E2 stand-in) on main + alt stream, as `bench prefix` |
| attention core: sparse MLA over the top-k + W_UV + o quant + o_proj | SHARED (same code for both): torch gather + bf16 bmm + fp32 softmax, cuBLAS W_UV bmm, compiled 1x128 quant, DeepGEMM o_proj | same |
| post-attention add+RMSNorm + 1x128 FP8 quant | A0 kernel (ops.add_rmsnorm_quant) | compiled add+RMSNorm + compiled quant |
| MoE (router, 256 routed + 1 shared expert, combine) | router kernel (ops.moe_route) + MegaMoE (moe.mega_moe, shared expert fused) | bf16->fp32 router GEMM + compiled sigmoid/top-k (flashinfer fused_topk stand-in) + DeepGEMM fp8_mega_moe (routed) + DeepGEMM shared expert + compiled combine |
| dense MLP (layers < first_k_dense_replace) | SHARED: DeepGEMM gate_up, compiled SwiGLU + quant, DeepGEMM down | same |
| final add+RMSNorm + lm_head (bf16 cuBLAS) | SHARED | same |

The stock sparse-MLA kernel (FlashMLA sparse, sglang-kernel) is not available without SGLang, so the
attention core is the SAME implementation in both paths, timed separately and labelled "shared"; the
step totals include it (and are honest about it), the ours/stock ratio compares prefix + norm + MoE.
Without DeepGEMM the stock prefix has no fair stand-in (E1), so the stock path is skipped with the
reason, and the shared GEMMs fall back to bf16 cuBLAS on dequantized weights (labelled). If DeepGEMM
lacks fp8_mega_moe, the stock MoE falls back to the eager reference (ref/moe.py, host syncs): the stock
step is then timed eagerly and no speedup is reported.

Timing (bench/timing.py): each whole step is captured in ONE CUDA graph per path per bucket (the CMP
executor's enqueue() is captured inside it, with its side streams forked from and joined to the capture
stream; DeepGEMM's buffer copies are inside the stock step) and replayed --repeat times; median per step.
A step streams GBs of weights, far past 2x L2, so no input rotation is needed. The per-layer breakdown
comes from separately captured pieces (prefix, shared core, rest = post-attention norm, MLP, tail); each
piece graph rotates over every layer of its kind (different weights per launch); a kind with a single
layer repeats it (the report flags pieces whose rotated bytes do not cover 2x L2). The stock E2 top-k is
a torch.topk stand-in (~80 us at M=16, SGLang's fused top-k ~3 us, shared/anchors.md): its time is
measured alone and an adjusted stock figure (stand-in replaced by 3 us per indexer layer) is reported
next to the raw one.

Floor: cost.layer_summary(fused_prefix=True) per layer (MoE weight bytes from the distinct experts the
routing actually touched) + final norm + lm_head, at 4.27 TB/s and at the copy bandwidth measured in
the run. Correctness (same run, eager, outside the timed graphs), TEACHER-FORCED per layer: our pieces of
layer L run on the stock path's recorded inputs of L and are compared with the stock path's outputs on
identical inputs: prefix outputs (q_lat, q_pe, residual, the current token's KV and index-K cache entries),
the attention core on the STOCK top-k, the post-attention norm, the MLP / MoE on the STOCK routing, each
relative L2 <= --tol (default 0.03; the FP8 index-K entry <= 2^-4, the e4m3 half-ULP, --tol-fp8; the core
<= 0.05, --tol-core: it amplifies the q differences of FP8 requantisation ~2x); the indexer top-k and router expert overlaps on identical inputs
(near-tie flips) >= --min-topk-overlap / --min-expert-overlap (0.9). The free-running steps' end-to-end
drift (final hidden state, lm_head argmax, per-layer selections) is reported as information only: there
the paths' selections differ at near-ties and the differences compound over layers (selection
sensitivity, not kernel numerics).

Output: DIR/decode_step.json, decode_step.md, decode_step.png (matplotlib). `--append` merges the
buckets of this run into an existing decode_step.json (split a long run over several commands).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import cost
from ..config import INDEX_K_PAGE_TOKENS, Glm5Config

PAGE = INDEX_K_PAGE_TOKENS
PATHS = ("ours", "stock")
DEFAULT_BUCKETS = (1, 8, 16, 32, 64, 128)
MAX_BUCKET = 256  # our router / prefix kernels serve decode batches up to 256 tokens
DEFAULT_SYNTHETIC_LAYERS, DEFAULT_DENSE_LAYERS = 4, 1
H200_GIB = 139.0  # the lent H200's usable memory (dry-run assumption when no GPU is visible)
E2_SGLANG_US = 3.0  # SGLang's fused top-k + page transform at decode sizes (shared/anchors.md)
RESERVE_BYTES = 3 * 2**30  # CUDA context, cuBLAS / inductor workspaces, allocator slack
FILES = ("decode_step.json", "decode_step.md", "decode_step.png")
CMP_AUTO_PDL_MAX_M = 16  # README / run 5-6: PDL helps at M <= 16; above, multistream without PDL
GIB = 2**30


def _log(msg: str) -> None:
    print(f"[decode-step {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- plan: arguments, layers, memory (CPU only) ----------------------------------------------------------------


# FP8 values judged against a different formulation of the same quantization: where the two paths' fp32 values
# fall on either side of a rounding boundary the e4m3 codes differ by one ULP (2^-3 relative); 2^-4 (the
# relative half-ULP) bounds the rel L2 of the dequantized entry even if every element rounded the other way,
# while a wrong formula (RoPE, rotation, LayerNorm, scale) gives O(1). Measured on an H200 (2026-11-29): 0.036-0.046.
TOL_FP8 = 2.0 ** -4
FP8_PIECES = ("index_k_entry",)
# The attention core runs on our q / KV entry: their FP8-requantisation-level differences (q_lat rel L2 ~0.015)
# pass through a softmax over 2048 selected keys of random synthetic caches, which about doubles them (measured
# 0.025-0.033 on an H200, 2026-11-29). A wrong q or KV entry gives O(1).
TOL_CORE = 0.05


@dataclass(frozen=True)
class LayerPlan:
    index: int
    moe: bool
    full_indexer: bool

    @property
    def kind(self) -> str:
        return ("moe" if self.moe else "dense") + ("" if self.full_indexer else "/shared-indexer")


@dataclass
class Plan:
    cfg: Glm5Config
    source: str  # "synthetic" | "model"
    model: str | None
    layers: list[LayerPlan]
    buckets: list[int]
    kv_pattern: list[int]  # sequence i has kv_pattern[i % len] tokens of context (incl. the current one)
    paths: list[str]
    cmp_modes: dict[int, str]
    megamoe_configs: dict[int, str]
    out: str
    repeat: int = 20
    seed: int = 0
    pieces: bool = True
    lm_head: bool = True
    tol: float = 0.03  # per-piece relative L2 tolerance of the teacher-forced check (FP8 numerics)
    tol_fp8: float = TOL_FP8  # FP8 pieces (the index-K cache entry): the e4m3 half-ULP bound
    tol_core: float = TOL_CORE  # the attention core on our prefix outputs
    min_topk_overlap: float = 0.9
    min_expert_overlap: float = 0.9
    budget_s: float | None = None
    append: bool = False
    randomize_routers: bool = False
    prewarm: int = 8
    memory: dict[str, Any] = field(default_factory=dict)

    def kv_lens(self, m: int) -> list[int]:
        return [self.kv_pattern[i % len(self.kv_pattern)] for i in range(m)]

    @property
    def moe_layers(self) -> list[LayerPlan]:
        return [lp for lp in self.layers if lp.moe]

    def setup_key(self) -> dict[str, Any]:
        """What must match for --append to merge two runs' buckets."""
        return {"source": self.source, "model": self.model, "config": self.cfg.source,
                "layers": [dataclasses.asdict(lp) for lp in self.layers], "kv_pattern": self.kv_pattern,
                "lm_head": self.lm_head, "seed": self.seed, "randomize_routers": self.randomize_routers}


def parse_int_list(s: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bench decode-step: {what} must be a comma list of integers, got {s!r}") from None
    if not vals:
        raise ValueError(f"bench decode-step: {what} is empty")
    return vals


def cmp_mode_for(m: int, requested: str, table=None) -> str:
    """The CMP mode of bucket m: `requested` unless it is "auto"; auto = the selection table's cmp_mode
    when a table is given (and covers m), else "full" (PDL after the weight prefetch) up to M=16 and
    "multistream" above (where PDL measured no gain on the H200)."""
    if requested != "auto":
        return requested
    if table is not None:
        look = table.lookup(m)
        if look.choice is not None:
            return look.choice.cmp_mode
    return "full" if m <= CMP_AUTO_PDL_MAX_M else "multistream"


def _synthetic_config(preset: str, layers: int, dense: int) -> Glm5Config:
    base = Glm5Config.preset(preset)
    return base.replace(num_hidden_layers=layers, first_k_dense_replace=dense, num_nextn_predict_layers=0,
                        source=f"<preset {preset}: synthetic {layers} layers ({dense} dense), full dims>")


def _prepare_weights_copies() -> bool:
    """Whether moe.prepare_weights copies w13 (the interleaved copy) or reads it in place (zero-copy):
    asked of the code itself on tiny CPU tensors. Assumes a copy if it cannot tell."""
    try:
        import torch

        from ..moe import megamoe as MM
        fp8 = torch.float8_e4m3fn
        w13, w2 = torch.zeros(2, 256, 256, dtype=fp8), torch.zeros(2, 256, 128, dtype=fp8)
        mw = MM.prepare_weights(w13, torch.ones(2, 2, 2), w2, torch.ones(2, 2, 1), num_shared=1)
        return mw.w13.untyped_storage().data_ptr() != w13.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - conservative
        return True


def estimate_memory(cfg: Glm5Config, layers: Sequence[LayerPlan], buckets: Sequence[int], kv_pattern: Sequence[int],
                    paths: Sequence[str], lm_head: bool, *, prepare_copies: bool = True,
                    capacity_bytes: float | None = None) -> dict[str, Any]:
    """GPU memory of the benchmark (bytes per component, GiB totals). Upper bounds where unknown: DeepGEMM's
    fp8_mega_moe weight transform is assumed to copy every routed expert (w13 and w2)."""
    c = cfg
    fw = cost.fp8_block_weight_bytes
    H, nh, I, Id, E, S = (c.hidden_size, c.num_attention_heads, c.moe_intermediate_size, c.intermediate_size,
                          c.n_routed_experts, c.n_shared_experts)
    mmax = max(buckets)
    stock = "stock" in paths
    attn = (fw(c.qkv_a_out, H) + fw(nh * c.qk_head_dim, c.q_lora_rank) + 2 * nh * c.qk_nope_head_dim * c.kv_lora_rank
            + 2 * nh * c.kv_lora_rank * c.v_head_dim + fw(H, nh * c.v_head_dim)
            + 2 * (2 * H + c.q_lora_rank + c.kv_lora_rank))
    indexer = (fw(c.index_n_heads * c.index_head_dim, c.q_lora_rank) + fw(c.index_head_dim, H)
               + 2 * c.index_n_heads * H + 8 * c.index_head_dim)
    expert = fw(2 * I, H) + fw(H, I)
    lens = [kv_pattern[i % len(kv_pattern)] for i in range(mmax)]
    pages = sum(-(-L // PAGE) for L in lens) + 1
    comp: dict[str, float] = {"attention weights": 0.0, "stock prefix weight copies": 0.0, "MoE experts (checkpoint layout)": 0.0,
                              "MegaMoE prepared w13 copy": 0.0, "DeepGEMM transformed experts (upper bound)": 0.0,
                              "stock shared-expert copy": 0.0, "routers": 0.0, "dense MLPs": 0.0,
                              "KV + index-K caches": 0.0}
    for lp in layers:
        comp["attention weights"] += attn + (indexer if lp.full_indexer else 0)
        if stock:
            comp["stock prefix weight copies"] += fw(c.qkv_a_out, H) + fw(nh * c.qk_head_dim, c.q_lora_rank) + (
                fw(c.index_n_heads * c.index_head_dim, c.q_lora_rank) + 2 * (c.index_head_dim + c.index_n_heads) * H
                if lp.full_indexer else 0)
        comp["KV + index-K caches"] += pages * PAGE * c.kv_cache_dim * 2 + (pages * c.index_k_page_bytes if lp.full_indexer else 0)
        if lp.moe:
            comp["MoE experts (checkpoint layout)"] += (E + S) * expert
            comp["routers"] += 2 * E * H + 4 * E
            if "ours" in paths and prepare_copies:
                comp["MegaMoE prepared w13 copy"] += (E + S) * fw(2 * I, H)
            if stock:
                comp["DeepGEMM transformed experts (upper bound)"] += E * expert
                comp["stock shared-expert copy"] += S * expert
        else:
            comp["dense MLPs"] += fw(2 * Id, H) + fw(H, Id)
    comp["final norm + lm_head"] = (c.vocab_size * H * 2 if lm_head else 0) + 2 * H
    scratch = (mmax * c.index_topk * c.kv_cache_dim * 2 * 3  # core: gathered KV + scores
               + (mmax * c.vocab_size * 2 * 2 if lm_head else 0) + mmax * (E + 1) * H * 2 + 64 * 2**20)
    comp["activations / graph pools (estimate)"] = scratch
    comp["reserve (context, cuBLAS, inductor, allocator)"] = RESERVE_BYTES
    total = sum(comp.values())
    cap = capacity_bytes if capacity_bytes is not None else H200_GIB * GIB
    return {"components_bytes": comp, "total_bytes": total, "total_gib": total / GIB, "capacity_gib": cap / GIB,
            "fits": total <= 0.97 * cap, "prepare_weights_copies_w13": prepare_copies}


def make_plan(args: argparse.Namespace, *, capacity_bytes: float | None = None) -> Plan:
    """Validate the arguments and resolve model, layers, buckets, modes and the memory estimate (CPU only)."""
    from ..moe.megamoe import MAX_TOKENS, default_config

    P = "bench decode-step"
    if args.model and args.synthetic_layers is not None:
        raise ValueError(f"{P}: pass --model DIR or --synthetic-layers N, not both")
    if args.model and args.dense_layers is not None:
        raise ValueError(f"{P}: --dense-layers is for --synthetic-layers (a checkpoint's config decides)")
    if not args.model and args.num_layers is not None:
        raise ValueError(f"{P}: --num-layers is for --model (use --synthetic-layers N for a synthetic model)")
    if not args.model and args.randomize_routers:
        raise ValueError(f"{P}: --randomize-routers is for --model (synthetic routers are always N(0, 0.02), zero bias)")
    if args.model:
        from ..checkpoint import load_config

        cfg = load_config(args.model)  # FileNotFoundError / ConfigError (a ValueError) name the problem
        n = cfg.num_hidden_layers if args.num_layers is None else args.num_layers
        if not 1 <= n <= cfg.num_hidden_layers:
            raise ValueError(f"{P}: --num-layers {n} outside 1..{cfg.num_hidden_layers} ({args.model})")
        cfg = cfg.replace(num_hidden_layers=n) if n != cfg.num_hidden_layers else cfg
        source, model = "model", str(args.model)
    else:
        n = DEFAULT_SYNTHETIC_LAYERS if args.synthetic_layers is None else args.synthetic_layers
        d = min(DEFAULT_DENSE_LAYERS, n) if args.dense_layers is None else args.dense_layers
        if n < 1:
            raise ValueError(f"{P}: --synthetic-layers must be >= 1, got {n}")
        if not 0 <= d <= n:
            raise ValueError(f"{P}: --dense-layers must be in 0..{n}, got {d}")
        cfg = _synthetic_config(args.preset, n, d)
        source, model = "synthetic", None
    if cfg.hidden_size != 6144 or cfg.n_routed_experts != 256:
        # our kernels are built and tuned for GLM-5's dims; the small preset is for CPU tests only
        raise ValueError(f"{P}: {cfg.source} is not a full-dims GLM-5 config (hidden {cfg.hidden_size}, "
                         f"{cfg.n_routed_experts} experts); the kernels are built for GLM-5's shapes")
    buckets = parse_int_list(args.buckets, "--buckets")
    if any(b < 1 or b > MAX_BUCKET for b in buckets):
        raise ValueError(f"{P}: --buckets must be in 1..{MAX_BUCKET} (decode batches), got {buckets}")
    if len(set(buckets)) != len(buckets):
        raise ValueError(f"{P}: --buckets has duplicates: {buckets}")
    buckets = sorted(buckets)
    kv = parse_int_list(args.kv_len, "--kv-len")
    if any(L < 1 or L >= cfg.max_position_embeddings for L in kv):
        raise ValueError(f"{P}: --kv-len values must be in 1..{cfg.max_position_embeddings - 1}, got {kv}")
    paths = [p for p in str(args.paths).split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths or len(set(paths)) != len(paths):
        raise ValueError(f"{P}: --paths must be a comma list of {', '.join(PATHS)} (each once), got {args.paths!r}")
    paths = [p for p in PATHS if p in paths]
    if args.repeat < 1:
        raise ValueError(f"{P}: --repeat must be >= 1, got {args.repeat}")
    for name in ("tol", "tol_fp8", "tol_core"):
        v = getattr(args, name)
        if not 0 < v < 1:
            raise ValueError(f"{P}: --{name.replace('_', '-')} must be in (0, 1), got {v}")
    if not 0 <= args.min_topk_overlap <= 1:
        raise ValueError(f"{P}: --min-topk-overlap must be in [0, 1], got {args.min_topk_overlap}")
    if not 0 <= args.min_expert_overlap <= 1:
        raise ValueError(f"{P}: --min-expert-overlap must be in [0, 1], got {args.min_expert_overlap}")
    if args.budget_s is not None and args.budget_s <= 0:
        raise ValueError(f"{P}: --budget-s must be > 0, got {args.budget_s}")
    table = None
    if args.selection:
        from ..selection import load as load_table

        table = load_table(args.selection)
    from ..attn_pre.cmp.modes import MODES

    if args.cmp_mode != "auto" and args.cmp_mode not in MODES:
        raise ValueError(f"{P}: --cmp-mode must be auto or one of {', '.join(MODES)}, got {args.cmp_mode!r}")
    modes = {m: cmp_mode_for(m, args.cmp_mode, table) for m in buckets}
    layers = [LayerPlan(i, cfg.is_moe_layer(i), cfg.is_full_indexer_layer(i)) for i in range(cfg.num_hidden_layers)]
    if not layers[0].full_indexer:
        raise ValueError(f"{P}: layer 0 of {cfg.source} has no indexer (a shared layer needs an earlier full one)")
    mm = {}
    if any(lp.moe for lp in layers):
        if max(buckets) > MAX_TOKENS:
            raise ValueError(f"{P}: MegaMoE serves at most {MAX_TOKENS} tokens")
        mm = {m: default_config(m, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts, 132,
                                cfg.moe_intermediate_size).name for m in buckets}
    plan = Plan(cfg=cfg, source=source, model=model, layers=layers, buckets=buckets, kv_pattern=kv, paths=paths,
                cmp_modes=modes, megamoe_configs=mm, out=args.out, repeat=args.repeat, seed=args.seed,
                pieces=not args.no_pieces, lm_head=not args.no_lm_head, tol=args.tol, tol_fp8=args.tol_fp8,
                tol_core=args.tol_core,
                min_topk_overlap=args.min_topk_overlap, min_expert_overlap=args.min_expert_overlap,
                budget_s=args.budget_s, append=args.append,
                randomize_routers=args.randomize_routers, prewarm=args.prewarm)
    plan.memory = estimate_memory(cfg, layers, buckets, kv, paths, plan.lm_head,
                                  prepare_copies=_prepare_weights_copies() if "ours" in paths else False,
                                  capacity_bytes=capacity_bytes)
    return plan


def check_model_tensors(plan: Plan) -> str:
    """Header-only check that the checkpoint holds every tensor of the selected layers (+ norm, lm_head)."""
    if plan.model is None:
        return ""
    from ..checkpoint import CheckpointSource, expected_layer_tensors

    with CheckpointSource(plan.model) as src:
        n = 0
        for lp in plan.layers:
            n += src.check(expected_layer_tensors(plan.cfg, lp.index))
        need = ["model.norm.weight"] + (["lm_head.weight" if not plan.cfg.tie_word_embeddings
                                         else "model.embed_tokens.weight"] if plan.lm_head else [])
        for name in need:
            src.stored(name)
    return f"{n + len(need)} tensors present with the expected dtype and shape"


def estimate_runtime_s(plan: Plan) -> dict[str, float]:
    """A rough wall-clock estimate (H200, warm JIT caches). Cold caches add our kernels' nvcc compile
    (minutes, once per machine) and DeepGEMM's JIT (prewarmed in parallel processes)."""
    n_moe = len(plan.moe_layers)
    setup = 25 + 12 * n_moe + 3 * (len(plan.layers) - n_moe) + (15 if plan.lm_head else 0) + 0.002 * max(plan.buckets) * max(plan.kv_pattern) / 64
    per = []
    for m in plan.buckets:
        fl = step_floor(plan.cfg, plan.layers, m, plan.kv_lens(m), {}, plan.lm_head)["floor_us"]
        step_s = 3.0 * fl * 1e-6  # both paths together, ~1.5x floor each
        t = 35 + (12 if plan.pieces else 0) + step_s * (plan.repeat + 6) * (2 + (3 if plan.pieces else 0))
        per.append(t)
    return {"setup_s": setup, "per_bucket_s": per, "total_s": setup + sum(per)}


# ---- floors (CPU) -----------------------------------------------------------------------------------------------


def tail_bytes(cfg: Glm5Config, m: int, lm_head: bool) -> float:
    """Final add+RMSNorm (read h, r, weight; write x) + bf16 lm_head (weight once, x in, logits out)."""
    H, V = cfg.hidden_size, cfg.vocab_size
    b = 3 * m * H * 2 + H * 2
    if lm_head:
        b += V * H * 2 + m * H * 2 + m * V * 2
    return float(b)


def step_floor(cfg: Glm5Config, layers: Sequence[LayerPlan], m: int, kv_lens: Sequence[int],
               routing: Mapping[int, Any], lm_head: bool, bw: float = cost.H200_COPY_BW) -> dict[str, Any]:
    """Bytes floor of one decode step: per layer cost.layer_summary (fused prefix; MoE weights of the distinct
    experts in routing[layer], the uniform-routing expectation where absent) + the tail, at bw."""
    rows = []
    for lp in layers:
        lc = cost.layer_summary(cfg, m, list(kv_lens), layer=lp.index,
                                routing=routing.get(lp.index) if lp.moe else None, fused_prefix=True)
        pre, core, mlp = (sum(c.bytes for c in part) for part in (lc.prefix, lc.core, lc.mlp))
        rows.append({"layer": lp.index, "prefix_bytes": pre, "core_bytes": core, "mlp_bytes": mlp,
                     "bytes": pre + core + mlp, "floor_us": (pre + core + mlp) / bw * 1e6,
                     "prefix_floor_us": pre / bw * 1e6, "core_floor_us": core / bw * 1e6, "mlp_floor_us": mlp / bw * 1e6})
    tb = tail_bytes(cfg, m, lm_head)
    total = sum(r["bytes"] for r in rows) + tb
    return {"layers": rows, "tail_bytes": tb, "tail_floor_us": tb / bw * 1e6, "bytes": total,
            "floor_us": total / bw * 1e6, "bw": bw}


# ---- numerics helpers (CPU and GPU) ----------------------------------------------------------------------------


def set_overlap(a, b) -> float:
    """Mean over rows of |valid(a) & valid(b)| / |valid(a)| for two [M, K] integer id tensors padded with -1."""
    import torch

    a = a.long()
    b = b.long()
    bs = torch.sort(b, dim=1).values.contiguous()
    idx = torch.searchsorted(bs, a.contiguous()).clamp(max=bs.shape[1] - 1)
    hit = (bs.gather(1, idx) == a) & (a >= 0)
    denom = (a >= 0).sum(1).clamp_min(1)
    return float((hit.sum(1).double() / denom.double()).mean())


def compare(a, b) -> dict[str, Any]:
    """a (ours) vs b (stock): relative L2 ||a-b||/||b||, max |a-b| / max |b|, both finite."""
    import torch

    a, b = a.double(), b.double()
    fin = bool(torch.isfinite(a).all() and torch.isfinite(b).all())
    nb = float(b.norm()) or 1e-30
    mb = float(b.abs().max()) or 1e-30
    return {"rel_l2": float((a - b).norm()) / nb, "max_rel": float((a - b).abs().max()) / mb, "finite": fin}


def cache_digest(t, chunk: int = 1 << 24) -> tuple[int, int]:
    """An exact content digest of a (GB-sized) cache tensor without copying it: int64 sums of its 16-bit words,
    plain and position-weighted (weights 1..251), over chunks. Equal contents -> equal digests; any change of a
    word changes the plain sum unless others compensate it exactly, which the weighted sum then catches."""
    import torch

    flat = t.detach().contiguous().reshape(-1)
    w = flat.view(torch.int16) if flat.numel() * flat.element_size() % 2 == 0 else flat.view(torch.uint8)
    s1 = torch.zeros((), dtype=torch.int64, device=t.device)
    s2 = torch.zeros((), dtype=torch.int64, device=t.device)
    for a in range(0, w.numel(), chunk):
        c = w[a:a + chunk].long()
        s1 += c.sum()
        s2 += (c * (torch.arange(a, a + c.numel(), device=t.device) % 251 + 1)).sum()
    return int(s1), int(s2)


def dequant_rows(k8, s):
    """fp32 values of per-row FP8 entries (index-K cache rows: k8 [T, D] e4m3, scale [T] fp32)."""
    return k8.float() * s.float()[:, None]


def _worst(cmps) -> float | None:
    """The largest rel L2 of some compare() results (inf where one is not finite)."""
    vals = [c["rel_l2"] if c.get("finite", True) else float("inf") for c in cmps]
    return max(vals) if vals else None




def teacher_forced_failures(row: Mapping[str, Any], tol: float, min_topk: float, min_expert: float,
                            tol_fp8: float = TOL_FP8, tol_core: float = TOL_CORE) -> list[str]:
    """The pass criteria of one layer of the teacher-forced check (every comparison on identical inputs):
    prefix outputs and cache entries, attention core on the stock top-k, post-attention norm, MLP / MoE on the
    stock routing: rel L2 <= tol (FP8 cache entries: tol_fp8; the core: tol_core) and finite; indexer top-k and expert overlap >= the minimums; each path wrote
    the current token's cache entries before reading them and the caches were left as found. The chained
    layer output and the stock re-run are information."""
    i = row["layer"]
    fails = []
    for piece, cmps in (("prefix", row.get("prefix", {})), ("norm", row.get("rest", {})),
                        ("core", {"out": row["core"]} if "core" in row else {}),
                        ("mlp", {"out": row["mlp"]} if "mlp" in row else {})):
        for name, c in cmps.items():
            what = piece if name == "out" else f"{piece} {name}"
            t = tol_fp8 if name in FP8_PIECES else tol_core if piece == "core" else tol
            if not c.get("finite", True):
                fails.append(f"layer {i} {what}: not finite")
            elif not c["rel_l2"] <= t:
                fails.append(f"layer {i} {what}: rel L2 {c['rel_l2']:.4f} > tol {t:g}")
    if row.get("topk_overlap") is not None and row["topk_overlap"] < min_topk:
        fails.append(f"layer {i} indexer top-k overlap {row['topk_overlap']:.4f} < {min_topk:g} (identical inputs)")
    if row.get("expert_overlap") is not None and row["expert_overlap"] < min_expert:
        fails.append(f"layer {i} expert overlap {row['expert_overlap']:.4f} < {min_expert:g} (identical inputs)")
    cs = row.get("caches", {})
    for key, msg in (("ours_writes_current", "our prefix did not write the current token's cache entries"),
                     ("stock_writes_current", "the stock prefix did not write the current token's cache entries"),
                     ("restored", "the caches differ after the check (restore failed)")):
        if cs.get(key) is False:
            fails.append(f"layer {i}: {msg}")
    return fails


def summarize_teacher_forced(rows: list[dict[str, Any]], tol: float, min_topk: float, min_expert: float,
                             e2e: Mapping[str, Any] | None = None, tol_fp8: float = TOL_FP8,
                             tol_core: float = TOL_CORE) -> dict[str, Any]:
    """The bucket's correctness record from the teacher-forced layer rows (each gets failures / passed), the
    worst error per piece, the lowest selection agreements, and the end-to-end drift (information)."""
    fails: list[str] = []
    for r in rows:
        r["failures"] = teacher_forced_failures(r, tol, min_topk, min_expert, tol_fp8, tol_core)
        r["passed"] = not r["failures"]
        fails += r["failures"]
    tk = [r["topk_overlap"] for r in rows if r.get("topk_overlap") is not None]
    eo = [r["expert_overlap"] for r in rows if r.get("expert_overlap") is not None]
    rr = [r["stock_rerun"]["max_rel_l2"] for r in rows if (r.get("stock_rerun") or {}).get("max_rel_l2") is not None]
    worst = {"prefix": _worst([c for r in rows for c in r.get("prefix", {}).values()]),
             "core": _worst([r["core"] for r in rows if "core" in r]),
             "norm": _worst([c for r in rows for c in r.get("rest", {}).values()]),
             "mlp": _worst([r["mlp"] for r in rows if "mlp" in r]),
             "layer_out": _worst([c for r in rows for c in r.get("layer_out", {}).values()]),
             "stock_rerun": max(rr) if rr else None}
    return {"method": "teacher-forced per layer", "tol": tol, "tol_fp8": tol_fp8, "tol_core": tol_core,
            "min_topk_overlap": min_topk,
            "min_expert_overlap": min_expert, "layers": rows, "worst": worst,
            "min_topk_overlap_seen": min(tk) if tk else None, "min_expert_overlap_seen": min(eo) if eo else None,
            "caches_ok": all(v is not False for r in rows for v in r.get("caches", {}).values()),
            "passed": not fails, "failures": fails, "e2e_drift": dict(e2e) if e2e is not None else None}


def _dequant_act(x8, xs):
    from ..ref.fp8 import dequant_act

    return dequant_act(x8, xs)


def silu_and_mul(gu):
    """SwiGLU of a gate || up row block: [M, 2I] bf16 -> bf16(silu(g) * u) [M, I] (fp32 math)."""
    import torch
    import torch.nn.functional as F

    g, u = gu.float().chunk(2, dim=-1)
    return (F.silu(g) * u).to(torch.bfloat16)


def route_topk(logits, bias, k: int):
    """noaux_tc routing on fp32 router logits (n_group = 1): top-k of sigmoid + bias, weights from the
    unbiased scores, renormalised (no routed_scaling_factor) -> (ids [M, k] int32, weights [M, k] fp32)."""
    import torch

    s = torch.sigmoid(logits.float())
    ids = torch.topk(s + bias, k, dim=-1, sorted=True).indices
    w = s.gather(1, ids)
    return ids.to(torch.int32), w / (w.sum(dim=-1, keepdim=True) + 1e-20)


def combine_shared(routed, shared, rsf: float):
    """bf16(rsf * routed + shared): DeepGEMM's routed output (weights without the scaling) + the shared expert."""
    import torch

    return (routed.float() * rsf + shared.float()).to(torch.bfloat16)


def sparse_mla(q_lat, q_pe, kv_cache, slots, scale: float):
    """The shared attention core's sparse MLA: softmax over the valid top-k slots of (q . [c_kv | k_pe]) * scale,
    bf16 bmm (fp32 accumulate) for the scores and P.V, fp32 softmax -> o_lat [M, heads, kv_lora] bf16.
    Capture-safe (no host synchronisation). Rows need at least one valid slot (decode: seq_len >= 1)."""
    import torch

    m, nh, r = q_lat.shape
    k = slots.shape[1]
    kv = kv_cache.index_select(0, slots.clamp_min(0).reshape(-1).long()).view(m, k, kv_cache.shape[1])
    q = torch.cat([q_lat, q_pe], dim=-1)
    s = torch.bmm(q, kv.transpose(1, 2)).float() * scale
    s = s.masked_fill((slots < 0)[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(q_lat.dtype)
    return torch.bmm(p, kv[..., :r])


# ---- the benchmark on the GPU ----------------------------------------------------------------------------------


@dataclass
class _Layer:
    plan: LayerPlan
    attn: Any  # weights.AttnWeights
    post_norm: Any
    kv: Any = None
    ik: Any = None
    dense: Any = None  # weights.DenseMLPWeights
    gate: Any = None
    bias: Any = None
    raw: tuple | None = None  # stacked experts (w13, s13, w2, s2), checkpoint layout
    mm: Any = None  # MegaMoEWeights
    dg: Any = None  # _StockMegaMoE
    shared_lins: tuple | None = None  # stock shared expert (w13 Fp8Linear, w2 Fp8Linear)
    ref_moe: Any = None  # weights.MoEWeights over raw (reference fallback)
    executors: dict = field(default_factory=dict)
    stock_bound: dict = field(default_factory=dict)
    w: dict = field(default_factory=dict)  # shared GEMM weights by name

    @property
    def i(self) -> int:
        return self.plan.index


class _StockMegaMoE:
    """DeepGEMM fp8_mega_moe for one layer (bench/moe.py's DeepGemmMegaMoE); the symmetric buffer and the
    process group are created once and shared by every layer (the layers run one after the other)."""

    def __init__(self, first: "_StockMegaMoE | None", experts: int, max_tokens: int, routed, dev):
        from .moe import DeepGemmMegaMoE

        if first is None:
            self.impl = DeepGemmMegaMoE(experts, max_tokens, routed, dev)
            return
        import copy

        from ..moe import megamoe as MM

        impl = copy.copy(first.impl)  # same module, group and buffer
        w13, s13, w2, s2 = routed
        tr = getattr(impl.dg, "transform_weights_for_mega_moe_sm90", None)
        if tr is not None:
            impl.l1, impl.l2 = tr((w13, s13), (w2, s2))
        else:
            impl.l1, impl.l2 = (MM.interleave_gate_up(w13), s13), (w2, s2)
        self.impl = impl

    def __call__(self, x8, xs, ids, wts, m: int, hidden: int):
        import torch

        self.impl.load(x8, xs, ids, wts)
        y = torch.empty(m, hidden, dtype=torch.bfloat16, device=x8.device)
        return self.impl(y)


class StepBench:
    """Weights, caches and both paths of one decode step; per bucket: eager check, whole-step graphs, pieces."""

    def __init__(self, plan: Plan, device):
        import torch

        self.plan, self.cfg, self.dev = plan, plan.cfg, torch.device(device)
        self.layers: list[_Layer] = []
        self.notes: list[str] = []
        self.labels: dict[str, dict[str, str]] = {}
        self.unavailable: dict[str, str] = {}
        self.stock_moe_fallback = ""
        self.h0 = self.r0 = None
        self.inp: dict[str, Any] = {}
        self.M = 0
        self.prefix_impl: Any = None  # our prefix's op namespace: None = glm5_fastpath.ops (the kernels)

    # -- setup --------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        import torch

        from ..attn_pre.cmp.bench import StockChain
        from .stock_prefix import Compiled, prewarm_jobs, start_prewarm, wait_prewarm

        p, c, dev = self.plan, self.cfg, self.dev
        t0 = time.perf_counter()
        self.chain = StockChain(c, str(dev))  # the stock prefix + the shared building blocks (quant, GEMM)
        self.sp = self.chain.sp
        if self.sp.dg is None:
            self.notes.append(f"DeepGEMM unavailable ({self.sp.dg_reason}): shared FP8 GEMMs run as bf16 cuBLAS on "
                              "dequantized weights (FALLBACK)")
        if "stock" in p.paths and self.chain.reason:
            self.unavailable["stock"] = self.chain.reason + " (E1 paged MQA logits has no fair stand-in)"
        procs = []
        if self.sp.dg is not None and p.prewarm > 0:
            jobs = prewarm_jobs(c, p.buckets, max(p.kv_pattern))
            H, I, Id, nh = c.hidden_size, c.moe_intermediate_size, c.intermediate_size, c.num_attention_heads
            for m in p.buckets:
                jobs += [f"gemm:{H},{nh * c.v_head_dim},{m}"]
                if any(lp.moe for lp in p.layers):
                    jobs += [f"gemm:{2 * I},{H},{m}", f"gemm:{H},{I},{m}"]
                if any(not lp.moe for lp in p.layers):
                    jobs += [f"gemm:{2 * Id},{H},{m}", f"gemm:{H},{Id},{m}"]
            procs = start_prewarm(jobs, min(p.prewarm, os.cpu_count() or 1), _log)
            _log(f"DeepGEMM JIT prewarm: {len(jobs)} kernels in {len(procs)} background processes")
        self._c = {n: Compiled(fn, n, True) for n, fn in (("silu_and_mul", silu_and_mul), ("route_topk", route_topk),
                                                          ("combine_shared", combine_shared))}
        self._router_gemm = self._pick_router_gemm()
        self._make_step_inputs()
        _log(f"step inputs ready ({time.perf_counter() - t0:.1f} s)")
        src = None
        if p.model:
            from ..checkpoint import CheckpointSource

            src = CheckpointSource(p.model)
        first_dg = None
        for lp in p.layers:
            t1 = time.perf_counter()
            L = self._load_layer(lp, src)
            if lp.moe:
                first_dg = self._prepare_moe(L, first_dg)
            self.layers.append(L)
            _log(f"layer {lp.index} ({lp.kind}) ready in {time.perf_counter() - t1:.1f} s; "
                 f"{torch.cuda.memory_allocated(dev) / GIB:.1f} GiB allocated")
        self._load_tail(src)
        if src is not None:
            src.close()
        if procs:
            w = wait_prewarm(procs, 480)
            _log(f"DeepGEMM prewarm done: {w}")
        self._labels()
        _log(f"setup done in {time.perf_counter() - t0:.1f} s; {torch.cuda.memory_allocated(dev) / GIB:.1f} GiB allocated")

    def _pick_router_gemm(self):
        """SGLang's router GEMM is bf16 x bf16 -> fp32 output; torch.mm(..., out_dtype=float32) does that when
        this torch has it, else an fp32 GEMM on an fp32 copy of the gate (labelled)."""
        import torch
        import torch.nn.functional as F

        a = torch.randn(4, 256, device=self.dev).bfloat16()
        b = torch.randn(32, 256, device=self.dev).bfloat16()
        try:
            torch.mm(a, b.t(), out_dtype=torch.float32)
            self.router_label = "cuBLAS bf16 x bf16 -> fp32 (torch.mm out_dtype)"
            return lambda h, gate, gate32: torch.mm(h, gate.t(), out_dtype=torch.float32)
        except Exception:  # noqa: BLE001
            self.router_label = "fp32 GEMM on an fp32 copy of the gate (this torch has no mm out_dtype)"
            return lambda h, gate, gate32: F.linear(h.float(), gate32)

    def _make_step_inputs(self) -> None:
        import torch

        from ..testing.decode_step import make_decode_step

        p = self.plan
        mmax = max(p.buckets)
        step = make_decode_step(self.cfg, p.kv_lens(mmax), seed=p.seed, device=self.dev, spare_pages=1)
        bt = step.block_table
        used = set(bt[bt >= 0].unique().tolist())
        self.pad_page = min(set(range(step.index_k_cache.shape[0])) - used)
        step.block_table = torch.where(bt >= 0, bt, torch.full_like(bt, self.pad_page)).contiguous()
        self.base = step

    def _gen(self, layer: int, salt: int):
        import torch

        g = torch.Generator(device=self.dev)
        g.manual_seed((self.plan.seed * 1_000_003 + layer * 7919 + salt) & 0x7FFF_FFFF_FFFF)
        return g

    def _synthetic_source(self, lp: LayerPlan):
        """name -> tensor on the GPU, the distributions of weights.layer_tensor_specs (experts excluded), with
        the router correction bias at zero."""
        import torch

        from ..ref.fp8 import quant_weight_block
        from ..weights import layer_tensor_specs, stored_layout

        specs = {s.name: s for s in layer_tensor_specs(self.cfg, lp.index)
                 if ".experts." not in s.name and ".shared_experts." not in s.name}
        gen, dev, cache = self._gen(lp.index, 1), self.dev, {}

        def get(name: str):
            if name in cache:
                return cache.pop(name)
            base = name.removesuffix("_scale_inv") if name.endswith("weight_scale_inv") else name
            if base not in specs:
                raise KeyError(f"no synthetic tensor {name!r} in layer {lp.index}")
            s = specs[base]
            lay = stored_layout(s)
            if s.kind == "bias":  # e_score_correction_bias: zero (realistic spread routing)
                w = torch.zeros(s.shape, device=dev)
            elif s.kind == "norm":
                w = 1.0 + s.std * torch.randn(s.shape, generator=gen, device=dev)
            else:
                w = s.std * torch.randn(s.shape, generator=gen, device=dev)
            if s.kind == "fp8":
                w8, sc = quant_weight_block(w)
                out = {lay[0][0]: w8, lay[1][0]: sc}
            else:
                out = {s.name: w.to(lay[0][1])}
            t = out.pop(name)
            cache.update(out)
            return t

        return get

    def _load_layer(self, lp: LayerPlan, src) -> _Layer:
        import torch

        from ..weights import assemble_layer

        c, dev = self.cfg, self.dev
        if src is None:
            lw = assemble_layer(c, lp.index, self._synthetic_source(lp), device=dev)
        else:
            from ..checkpoint import load_layer

            lw = load_layer(src, lp.index, device=dev)
        L = _Layer(lp, lw.attn, lw.post_attn_norm)
        L.kv = self.base.kv_cache if not self.layers else self.base.kv_cache.clone()
        if lp.full_indexer:
            L.ik = self.base.index_k_cache if not self.layers else self.base.index_k_cache.clone()
        L.w["o_proj"] = self._gemm_weight(lw.attn.o_proj)
        if lp.moe:
            L.gate, L.bias = lw.mlp.gate.contiguous(), lw.mlp.e_score_correction_bias.float().contiguous()
            if src is not None and self.plan.randomize_routers:
                g = self._gen(lp.index, 2)
                L.gate = (0.02 * torch.randn(L.gate.shape, generator=g, device=dev)).to(torch.bfloat16)
                L.bias = torch.zeros_like(L.bias)
            L.gate32 = L.gate.float() if "fp32 copy" in self.router_label else None
            L.raw = self._experts_synthetic(lp) if src is None else self._experts_checkpoint(lp, src)
        else:
            L.dense = lw.mlp
            L.w["gate_up"] = self._gemm_weight(lw.mlp.gate_up)
            L.w["down"] = self._gemm_weight(lw.mlp.down)
        return L

    def _gemm_weight(self, lin):
        """A shared-GEMM weight: (w8, scale) for DeepGEMM, or the bf16 dequantized copy for the fallback."""
        import torch

        if self.sp.dg is not None:
            return (lin.weight, lin.scale_inv.float().contiguous())
        return lin.dequant().to(torch.bfloat16).contiguous()

    def _experts_synthetic(self, lp: LayerPlan):
        import torch

        from ..ref.fp8 import quant_weight_block

        c, dev = self.cfg, self.dev
        H, I, n = c.hidden_size, c.moe_intermediate_size, c.n_routed_experts + c.n_shared_experts
        fp8 = torch.float8_e4m3fn
        g = self._gen(lp.index, 3)
        w13 = torch.empty(n, 2 * I, H, dtype=fp8, device=dev)
        s13 = torch.empty(n, 2 * I // 128, H // 128, dtype=torch.float32, device=dev)
        w2 = torch.empty(n, H, I, dtype=fp8, device=dev)
        s2 = torch.empty(n, H // 128, I // 128, dtype=torch.float32, device=dev)
        for e in range(n):  # the specs' std: K^-0.5 (gate/up: H^-0.5, down: I^-0.5)
            w13[e], s13[e] = quant_weight_block(torch.randn(2 * I, H, generator=g, device=dev) * H ** -0.5)
            w2[e], s2[e] = quant_weight_block(torch.randn(H, I, generator=g, device=dev) * I ** -0.5)
        return w13, s13, w2, s2

    def _experts_checkpoint(self, lp: LayerPlan, src):
        import torch

        from ..weights import _as_fp8

        c, dev = self.cfg, self.dev
        H, I, E = c.hidden_size, c.moe_intermediate_size, c.n_routed_experts
        n = E + c.n_shared_experts
        if I % 128:
            raise ValueError(f"moe_intermediate_size {I} is not a multiple of 128")
        fp8 = torch.float8_e4m3fn
        w13 = torch.empty(n, 2 * I, H, dtype=fp8, device=dev)
        s13 = torch.empty(n, 2 * I // 128, H // 128, dtype=torch.float32, device=dev)
        w2 = torch.empty(n, H, I, dtype=fp8, device=dev)
        s2 = torch.empty(n, H // 128, I // 128, dtype=torch.float32, device=dev)
        p = f"model.layers.{lp.index}."
        for e in range(n):
            ep = p + (f"mlp.experts.{e}." if e < E else "mlp.shared_experts.")
            gp, up, dn = (_as_fp8(src, ep + k) for k in ("gate_proj", "up_proj", "down_proj"))
            w13[e, :I].copy_(gp.weight)
            w13[e, I:].copy_(up.weight)
            s13[e, : I // 128].copy_(gp.scale_inv)
            s13[e, I // 128:].copy_(up.scale_inv)
            w2[e].copy_(dn.weight)
            s2[e].copy_(dn.scale_inv)
        return w13, s13, w2, s2

    def _prepare_moe(self, L: _Layer, first_dg):
        from ..moe import megamoe as MM
        from ..weights import ExpertStore, Fp8Linear, MoEWeights

        c, p = self.cfg, self.plan
        E, S = c.n_routed_experts, c.n_shared_experts
        w13, s13, w2, s2 = L.raw
        if "ours" in p.paths:
            L.mm = MM.prepare_weights(w13, s13, w2, s2, num_shared=S)
            MM.precompile(L.mm, c.num_experts_per_tok, max_tokens=max(p.buckets), device=self.dev,
                          configs=[self._mm_config(m) for m in p.buckets])
        if "stock" in p.paths and "stock" not in self.unavailable:
            L.shared_lins = tuple((Fp8Linear(w13[E + j].clone(), s13[E + j].clone()), Fp8Linear(w2[E + j].clone(), s2[E + j].clone()))
                                  for j in range(S))
            L.w["shared"] = [(self._gemm_weight(a), self._gemm_weight(b)) for a, b in L.shared_lins]
            if not self.stock_moe_fallback:
                try:
                    L.dg = _StockMegaMoE(first_dg, E, max(p.buckets), tuple(t[:E] for t in L.raw), self.dev)
                    first_dg = first_dg or L.dg
                except Exception as e:  # noqa: BLE001 - the stock MoE falls back, and the report says so
                    self.stock_moe_fallback = (f"DeepGEMM fp8_mega_moe unavailable ({type(e).__name__}: {str(e)[:200]}): "
                                               "stock MoE = eager reference (ref/moe.py), NOT a fair baseline")
                    self.notes.append(self.stock_moe_fallback)
            if self.stock_moe_fallback:
                def fetch(e, raw=L.raw):
                    return Fp8Linear(raw[0][e], raw[1][e]), Fp8Linear(raw[2][e], raw[3][e])
                L.ref_moe = MoEWeights(L.gate, L.bias, ExpertStore(E + S, fetch, cache=False))
        if L.ref_moe is None:
            L.raw = None  # MegaMoE / DeepGEMM hold what they need (views or copies): unreferenced copies are freed
        return first_dg

    def _sms(self) -> int:
        import torch

        return torch.cuda.get_device_properties(self.dev).multi_processor_count

    def _mm_config(self, m: int):
        from ..moe import megamoe as MM

        c = self.cfg
        return MM.default_config(m, c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, self._sms(),
                                 c.moe_intermediate_size)

    def _load_tail(self, src) -> None:
        import torch

        c, dev = self.cfg, self.dev
        H, V = c.hidden_size, c.vocab_size
        if src is None:
            g = self._gen(10_000, 4)
            self.final_norm = (1.0 + 0.05 * torch.randn(H, generator=g, device=dev)).to(torch.bfloat16)
            self.lm_head = None
            if self.plan.lm_head:
                self.lm_head = torch.empty(V, H, dtype=torch.bfloat16, device=dev)
                for a in range(0, V, 8192):
                    b = min(V, a + 8192)
                    self.lm_head[a:b] = (torch.randn(b - a, H, generator=g, device=dev) * H ** -0.5).to(torch.bfloat16)
        else:
            self.final_norm = src("model.norm.weight").to(dev, torch.bfloat16)
            self.lm_head = None
            if self.plan.lm_head:
                name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
                self.lm_head = src(name).to(dev, torch.bfloat16).contiguous()

    def _labels(self) -> None:
        dg = self.sp.dg is not None
        gemm = "DeepGEMM fp8_gemm_nt" if dg else "FALLBACK bf16 cuBLAS on dequantized weights"
        self.labels = {
            "prefix": {"ours": "CMP executor (attn_pre/cmp; mode per bucket) over glm5_fastpath.ops kernels A0..E2",
                       "stock": "stock_prefix sequence on main + alt stream (DeepGEMM GEMMs + fp8_paged_mqa_logits, "
                                "cuBLAS bf16 wk||weights_proj + W_UK bmm, torch.compile'd norm/rope/quant/store, "
                                "E2 = torch.topk stand-in)"},
            "core": {"shared": f"SHARED: torch KV gather + bf16 bmm scores + fp32 softmax + bf16 bmm P.V, cuBLAS W_UV "
                               f"bmm, compiled 1x128 quant, {gemm} o_proj (FlashMLA sparse is not available without "
                               "sglang-kernel)"},
            "rest": {"ours": "A0 kernel: add + RMSNorm + 1x128 FP8 quant (ops.add_rmsnorm_quant)",
                     "stock": "torch.compile'd add+RMSNorm + torch.compile'd 1x128 FP8 quant"},
            "moe": {"ours": "router kernel (ops.moe_route) + MegaMoE (moe.mega_moe, shared expert fused, x2.5 in "
                            "the combine)",
                    "stock": self.stock_moe_fallback or (
                        f"router {self.router_label} + compiled sigmoid/bias top-8/renorm (flashinfer "
                        f"fused_topk_deepseek stand-in) + DeepGEMM fp8_mega_moe on the 256 routed experts (input "
                        f"copies into its symmetric buffer included) + shared expert ({gemm} gate_up, compiled "
                        f"SwiGLU, compiled quant, {gemm} down) + compiled x2.5 combine")},
            "dense": {"shared": f"SHARED: {gemm} gate_up, compiled SwiGLU + compiled quant, {gemm} down"},
            "tail": {"shared": "SHARED: compiled final add+RMSNorm" + (" + bf16 cuBLAS lm_head" if self.plan.lm_head
                                                                         else " (lm_head off)")},
        }
        for path in PATHS:
            why = ("not run (--paths)" if path not in self.plan.paths else
                   f"skipped: {self.unavailable[path]}" if path in self.unavailable else "")
            if why:
                for v in self.labels.values():
                    if path in v:
                        v[path] = why

    # -- per bucket ------------------------------------------------------------------------------------------------

    def set_bucket(self, m: int) -> None:
        from types import SimpleNamespace

        from ..testing.decode_step import DecodeStep

        b = self.base
        self.M = m
        self.h0, self.r0 = b.hidden[:m].contiguous(), b.residual[:m].contiguous()
        self.inp = {"positions": b.positions[:m].contiguous(), "out_cache_loc": b.out_cache_loc[:m].contiguous(),
                    "seq_lens": b.seq_lens[:m].contiguous(), "block_table": b.block_table[:m].contiguous()}
        self.mode = self.plan.cmp_modes[m]
        self.mm_cfg = self._mm_config(m) if any(L.plan.moe for L in self.layers) else None
        if "stock" in self.plan.paths and "stock" not in self.unavailable:
            for L in self.layers:
                st = DecodeStep(self.h0, self.r0, self.inp["positions"], self.inp["seq_lens"], self.inp["block_table"],
                                self.inp["out_cache_loc"], L.kv, L.ik)
                if L.plan.full_indexer:
                    L.stock_bound[m] = self.chain.bind(SimpleNamespace(w=L.attn, step=st), L.i)
                else:
                    L.stock_bound[m] = self._bind_shared(L, st)

    def _bind_shared(self, L: _Layer, st) -> dict[str, Any]:
        """StockChain.bind for a GLM-5.2 shared-indexer layer (no indexer weights)."""
        import torch

        from ..ref.rope import rope_cos_sin

        c, sp = self.cfg, self.sp
        cos, sin = rope_cos_sin(torch.arange(int(st.positions.max()) + 1, device=self.dev), c.qk_rope_head_dim,
                                c.rope_theta)
        return {"w": L.attn, "s": st, "cos_sin": torch.cat([cos, sin], -1).contiguous(),
                "qkv_a": sp._fp8_weight("qkv_a", L.attn.qkv_a, L.i), "q_b": sp._fp8_weight("q_b", L.attn.q_b, L.i)}

    def _executor(self, L: _Layer):
        from ..attn_pre.cmp.executor import CmpExecutor

        ex = L.executors.get(self.mode)
        if ex is None:
            ex = CmpExecutor(self.cfg, L.attn, self.dev, buckets=(max(self.plan.buckets),), mode=self.mode,
                             kv_cache=L.kv, index_k_cache=L.ik, max_pages=self.base.block_table.shape[1],
                             pad_slot=self.pad_page * PAGE, impl=self.prefix_impl)
            ex.prepare()
            from ..graph.prefix_graph import weight_tensors

            ex._bench_weights = {k: v for k, v in weight_tensors(L.attn).items() if k in ex.graph.tensors}
            L.executors[self.mode] = ex
        return ex

    # -- the pieces (each enqueues on the current stream; capture-safe) -------------------------------------------

    def prefix(self, path: str, L: _Layer, h, r, prev_topk):
        """-> (q_lat, q_pe, topk_slots, residual_out)."""
        if path == "ours":
            ex = self._executor(L)
            env = dict(ex._bench_weights)
            env.update(hidden=h, residual=r, kv_cache=L.kv, **self.inp)
            if L.plan.full_indexer:
                env["index_k_cache"] = L.ik
            else:
                env["topk_slots"] = prev_topk
            out = ex.enqueue(self.M, {k: v for k, v in env.items() if k in ex.graph.tensors})
            return out["q_lat"], out["q_pe"], out["topk_slots"], out["residual_out"]
        d = L.stock_bound[self.M]
        d["s"] = dataclasses.replace(d["s"], hidden=h, residual=r)
        if L.plan.full_indexer:
            res, q_pe, q_lat, topk = self.chain.enqueue(d)
            return q_lat, q_pe, topk, res
        return self._stock_shared_prefix(d, prev_topk)

    def _stock_shared_prefix(self, d, prev_topk):
        """The stock sequence of a GLM-5.2 shared layer: #1-#5, #12-#15 (no indexer), the previous top-k."""
        import torch

        c, sp = self.cfg, self.sp
        C = sp._c
        w, s, cs = d["w"], d["s"], d["cos_sin"]
        q_end, kv_end = c.q_lora_rank, c.q_lora_rank + c.kv_lora_rank
        nh, nope = c.num_attention_heads, c.qk_nope_head_dim
        x, res = C["add_rmsnorm"](s.hidden, s.residual, w.input_norm, c.rms_norm_eps)
        x8, xs = sp._quant(x)
        qkv = sp._gemm(x8, xs, d["qkv_a"], c.qkv_a_out)
        q_lora, c_kv = C["qkv_a_norms"](qkv, w.q_a_norm, w.kv_a_norm, q_end, kv_end, c.rms_norm_eps)
        q8, qs = sp._quant(q_lora)
        q = sp._gemm(q8, qs, d["q_b"], nh * c.qk_head_dim).view(-1, nh, c.qk_head_dim)
        q_pe = C["rope_q_pe"](q[..., nope:], cs, s.positions)
        q_lat = torch.bmm(q[..., :nope].transpose(0, 1), w.w_kc).transpose(0, 1)
        C["kv_rope_store"](c_kv, qkv[:, kv_end:], cs, s.positions, s.kv_cache, s.out_cache_loc)
        return q_lat, q_pe, prev_topk, res

    def core(self, L: _Layer, q_lat, q_pe, topk):
        """SHARED attention core over the given top-k slots (the step passes its own prefix's; the teacher-forced
        check passes the stock path's): sparse MLA -> W_UV -> 1x128 quant -> o_proj -> [M, H] bf16. Reads L.kv,
        including the current token's entry the prefix wrote."""
        import torch

        c = self.cfg
        m = q_lat.shape[0]
        o_lat = sparse_mla(q_lat, q_pe, L.kv, topk, c.softmax_scale)
        o = torch.bmm(o_lat.transpose(0, 1), L.attn.w_vc).transpose(0, 1).reshape(m, -1)
        o8, os_ = self.sp._quant(o)
        return self.sp._gemm(o8, os_, L.w["o_proj"], c.hidden_size)

    def rest(self, path: str, L: _Layer, attn, res):
        """Post-attention add+RMSNorm + 1x128 quant -> (x bf16, residual_out, x8, x_scale)."""
        c = self.cfg
        if path == "ours":
            from .. import ops

            return tuple(ops.add_rmsnorm_quant(attn, res, L.post_norm, c.rms_norm_eps,
                                               scale_layout="row" if L.plan.moe else "col_tma"))
        x, r2 = self.sp._c["add_rmsnorm"](attn, res, L.post_norm, c.rms_norm_eps)
        x8, xs = self.sp._quant(x)
        return x, r2, x8, xs

    def route(self, path: str, L: _Layer, x):
        """The MoE router of a path on x [M, H] bf16 -> (topk_ids [M, k] int32, topk_weights [M, k] fp32, without
        routed_scaling_factor)."""
        c = self.cfg
        if path == "ours":
            from .. import ops

            ids, wts, _ = ops.moe_route(x, L.gate, L.bias, c)
            return ids, wts
        logits = self._router_gemm(x, L.gate, getattr(L, "gate32", None))
        return self._c["route_topk"](logits, L.bias, c.num_experts_per_tok)

    def mlp(self, path: str, L: _Layer, x, x8, xs, routing: tuple | None = None):
        """MoE (path-specific) or dense MLP (shared) -> (out [M, H] bf16, routed ids, routing weights; both None
        for a dense layer). routing=(ids, weights) forces the experts (the teacher-forced check runs our MoE on the
        stock path's routing); None (the step, the timed graphs) routes with the path's own router."""
        c, sp = self.cfg, self.sp
        H = c.hidden_size
        if not L.plan.moe:
            gu = sp._gemm(x8, xs, L.w["gate_up"], 2 * c.intermediate_size)
            a8, as_ = sp._quant(self._c["silu_and_mul"](gu))
            return sp._gemm(a8, as_, L.w["down"], H), None, None
        ids, wts = self.route(path, L, x) if routing is None else routing
        if path == "ours":
            from ..moe import megamoe as MM

            return MM.mega_moe(x8, xs, ids, wts, L.mm, routed_scaling_factor=c.routed_scaling_factor,
                               config=self.mm_cfg), ids, wts
        if L.ref_moe is not None:
            from ..ref.moe import moe_forward

            return moe_forward(x, L.ref_moe, c, ids, wts), ids, wts
        y = L.dg(x8, xs, ids, wts, x.shape[0], H)
        for (w13, w2) in L.w["shared"]:
            gu = sp._gemm(x8, xs, w13, 2 * c.moe_intermediate_size)
            a8, as_ = sp._quant(self._c["silu_and_mul"](gu))
            y = self._c["combine_shared"](y, sp._gemm(a8, as_, w2, H), c.routed_scaling_factor)
        return y, ids, wts

    def tail(self, h, r):
        """SHARED final add+RMSNorm (+ lm_head) -> (x_final [M, H] bf16, logits [M, V] bf16 or None)."""
        import torch.nn.functional as F

        xf, _ = self.sp._c["add_rmsnorm"](h, r, self.final_norm, self.cfg.rms_norm_eps)
        return xf, (F.linear(xf, self.lm_head) if self.lm_head is not None else None)

    def run_step(self, path: str, rec: dict | None = None):
        h, r, prev = self.h0, self.r0, None
        for L in self.layers:
            if rec is not None:
                rec[("in", L.i)] = (h, r, prev)
            pre = self.prefix(path, L, h, r, prev)
            attn = self.core(L, *pre[:3])
            post = self.rest(path, L, attn, pre[3])
            y, ids, wts = self.mlp(path, L, post[0], post[2], post[3])
            if rec is not None:
                rec[("prefix", L.i)], rec[("attn", L.i)], rec[("rest", L.i)] = pre, attn, post
                rec[("mlp", L.i)], rec[("ids", L.i)], rec[("routing", L.i)] = y, ids, (ids, wts)
            if L.plan.full_indexer:
                prev = pre[2]
            h, r = y, post[1]
        out = self.tail(h, r)
        if rec is not None:
            rec["final_in"], rec["final"] = (h, r), out
        return out

    # -- measurements -------------------------------------------------------------------------------------------------

    def _time(self, fn: Callable[[int], Any], launches: int, graph: bool = True) -> dict[str, Any]:
        from .timing import CudaContextLost, time_launches

        try:
            return time_launches(fn, launches, device=self.dev, replays=self.plan.repeat, graph=graph).to_dict()
        except CudaContextLost:
            raise
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            traceback.print_exc()
            return {"error": f"{type(e).__name__}: {str(e)[:400]}"}

    # -- correctness (eager, after the recording steps, before the timed graphs) ----------------------------------

    def e2e_drift(self, ours: Mapping, stock: Mapping) -> dict[str, Any]:
        """The two free-running eager steps compared (INFORMATION, not a pass criterion: see E2E_NOTE): final
        hidden state, lm_head argmax, and per layer the attention / MLP outputs and the selections each path made
        on its own (diverging) inputs."""
        fin = compare(ours["final"][0], stock["final"][0])
        out: dict[str, Any] = {"final_hidden": fin, "layers": [], "note": E2E_NOTE}
        if ours["final"][1] is not None:
            out["logits_argmax_agree"] = float((ours["final"][1].argmax(-1) == stock["final"][1].argmax(-1)).float().mean())
        for L in self.layers:
            row = {"layer": L.i, "attn_out": compare(ours[("attn", L.i)], stock[("attn", L.i)]),
                   "mlp_out": compare(ours[("mlp", L.i)], stock[("mlp", L.i)])}
            if L.plan.full_indexer:
                row["topk_overlap"] = set_overlap(ours[("prefix", L.i)][2], stock[("prefix", L.i)][2])
            if L.plan.moe:
                row["expert_overlap"] = set_overlap(ours[("ids", L.i)], stock[("ids", L.i)])
            out["layers"].append(row)
        ov = [r["topk_overlap"] for r in out["layers"] if "topk_overlap" in r]
        eo = [r["expert_overlap"] for r in out["layers"] if "expert_overlap" in r]
        out["min_topk_overlap_seen"] = min(ov) if ov else None
        out["mean_expert_overlap"] = sum(eo) / len(eo) if eo else None
        return out

    def _entries(self, L: _Layer) -> dict[str, Any]:
        """Copies of the current token's entries in layer L's caches: kv [M, kv_cache_dim] bf16 and, with an
        indexer, ik = (k8 [M, D] e4m3, scale [M] fp32)."""
        from ..ref.fp8 import index_k_cache_load

        slots = self.inp["out_cache_loc"].long()
        e: dict[str, Any] = {"kv": L.kv.index_select(0, slots)}
        if L.ik is not None:
            e["ik"] = index_k_cache_load(L.ik, slots, self.cfg.index_head_dim)
        return e

    def _write_entries(self, L: _Layer, e: Mapping[str, Any]) -> None:
        from ..ref.fp8 import index_k_cache_store

        slots = self.inp["out_cache_loc"].long()
        L.kv.index_copy_(0, slots, e["kv"])
        if L.ik is not None:
            index_k_cache_store(L.ik, slots, *e["ik"])

    def _poison_entries(self, L: _Layer) -> None:
        """NaN into the current token's entries (KV row; index-K bytes 0xFF = e4m3 NaN and a NaN scale): a path
        that reads them before writing them shows as non-finite output, one that never writes them is caught
        by _written."""
        import torch

        m, dev = self.M, L.kv.device
        e: dict[str, Any] = {"kv": torch.full((m, L.kv.shape[1]), float("nan"), dtype=L.kv.dtype, device=dev)}
        if L.ik is not None:
            e["ik"] = (torch.full((m, self.cfg.index_head_dim), 0xFF, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn),
                       torch.full((m,), float("nan"), dtype=torch.float32, device=dev))
        self._write_entries(L, e)

    @staticmethod
    def _written(e: Mapping[str, Any]) -> bool:
        import torch

        ok = bool(torch.isfinite(e["kv"].float()).all())
        if "ik" in e:
            ok = ok and bool(torch.isfinite(dequant_rows(*e["ik"])).all())
        return ok

    @staticmethod
    def _entry_cmp(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        out = {"kv_entry": compare(a["kv"], b["kv"])}
        if "ik" in a:
            out["index_k_entry"] = compare(dequant_rows(*a["ik"]), dequant_rows(*b["ik"]))
        return out

    def _digests(self, L: _Layer) -> tuple:
        return (cache_digest(L.kv),) + ((cache_digest(L.ik),) if L.ik is not None else ())

    def teacher_forced_layer(self, L: _Layer, stock: Mapping) -> dict[str, Any]:
        """Layer L of OUR path fed the STOCK path's recorded inputs of that layer, each piece compared with the
        stock path's recorded output on identical inputs:
        - prefix on stock's (h, r, prev_topk): q_lat, q_pe, residual_out, and the current token's KV / index-K
          cache entries it writes; its top-k vs stock's: the indexer's selection agreement (reported);
        - attention core on OUR q_lat / q_pe and KV entry but the STOCK top-k (the core is shared code, so this
          is how our prefix numerics look through attention, without selection differences);
        - post-attention norm (+ quant) on stock's attention output and residual;
        - MLP on stock's quantized input; a MoE on the STOCK routing (ids, weights): our MegaMoE vs stock's MoE;
          our router on stock's input vs stock's ids: the router's selection agreement (reported);
        - the whole layer chained on our own intermediates (stock selection): information.
        Caches: the stock eager step left its current-token entries in L's caches. They are saved, poisoned,
        rewritten by a stock re-run of the prefix (which must reproduce its record), poisoned again, written by
        our prefix (read by the core above), then restored; the caches' digests must match the state found."""
        import torch

        h, r, prev = stock[("in", L.i)]
        s_pre, s_attn, s_rest, s_mlp = (stock[(k, L.i)] for k in ("prefix", "attn", "rest", "mlp"))
        s_ids, s_wts = stock[("routing", L.i)]
        row: dict[str, Any] = {"layer": L.i, "kind": L.plan.kind}
        digest0 = self._digests(L)
        saved = self._entries(L)
        stock_writes = ours_writes = None
        try:
            # the stock prefix again, on its own inputs, over poisoned entries
            self._poison_entries(L)
            again = self.prefix("stock", L, h, r, prev)
            e_stock = self._entries(L)
            rr = [compare(again[k], s_pre[k]) for k in (0, 1, 3)] + list(self._entry_cmp(e_stock, saved).values())
            row["stock_rerun"] = {"max_rel_l2": _worst(rr),
                                  "topk_overlap": set_overlap(again[2], s_pre[2]) if L.plan.full_indexer else None}
            stock_writes = self._written(e_stock)
            # ours, same inputs
            self._poison_entries(L)
            pre = self.prefix("ours", L, h, r, prev)
            e_ours = self._entries(L)
            ours_writes = self._written(e_ours)
            row["prefix"] = {"q_lat": compare(pre[0], s_pre[0]), "q_pe": compare(pre[1], s_pre[1]),
                             "residual_out": compare(pre[3], s_pre[3]), **self._entry_cmp(e_ours, saved)}
            if L.plan.full_indexer:
                row["topk_overlap"] = set_overlap(pre[2], s_pre[2])
            attn = self.core(L, pre[0], pre[1], s_pre[2])  # the stock top-k; reads our KV entry
            row["core"] = compare(attn, s_attn)
            rest = self.rest("ours", L, s_attn, s_pre[3])
            row["rest"] = {"x": compare(rest[0], s_rest[0]), "residual": compare(rest[1], s_rest[1]),
                           "x_fp8": compare(_dequant_act(rest[2], rest[3]), _dequant_act(s_rest[2], s_rest[3]))}
            # fresh contiguous copies for our MegaMoE (its contract: contiguous, aligned; the recorded stock tensors may be
            # compiled-kernel outputs), and row-major activation scales (A0 writes them so; the stock quant's are MN-major)
            routing = (s_ids.clone(memory_format=torch.contiguous_format),
                       s_wts.clone(memory_format=torch.contiguous_format)) if L.plan.moe else None
            x8, xs = ((s_rest[2].clone(memory_format=torch.contiguous_format),
                       s_rest[3].clone(memory_format=torch.contiguous_format)) if L.plan.moe else s_rest[2:4])
            row["mlp"] = compare(self.mlp("ours", L, s_rest[0], x8, xs, routing=routing)[0], s_mlp)
            if L.plan.moe:
                row["expert_overlap"] = set_overlap(self.route("ours", L, s_rest[0])[0], s_ids)
            chain = self.rest("ours", L, attn, pre[3])
            y = self.mlp("ours", L, chain[0], chain[2], chain[3], routing=routing)[0]
            row["layer_out"] = {"hidden": compare(y, s_mlp), "residual": compare(chain[1], s_rest[1])}
        finally:  # the stock step's entries back, whatever happened above
            self._write_entries(L, saved)
        row["caches"] = {"stock_writes_current": stock_writes, "ours_writes_current": ours_writes,
                         "restored": self._digests(L) == digest0}
        return row

    def check(self, ours: Mapping, stock: Mapping) -> dict[str, Any]:
        """The correctness of bucket M: the teacher-forced per-layer check (pass / fail) plus the end-to-end
        drift of the free-running steps (information)."""
        p = self.plan
        e2e = self.e2e_drift(ours, stock)  # first: the re-runs below reuse per-layer executors ours' record came from
        rows = [self.teacher_forced_layer(L, stock) for L in self.layers]
        return summarize_teacher_forced(rows, p.tol, p.min_topk_overlap, p.min_expert_overlap, e2e, p.tol_fp8, p.tol_core)

    def pieces(self, recs: Mapping[str, dict]) -> dict[str, Any]:
        """Separately captured pieces: per path prefix[full|shared], rest, mlp[moe]; shared core, mlp[dense], tail.
        Each graph rotates over the layers of its kind (launch i -> layer i % n)."""
        from .timing import l2_cache_bytes

        out: dict[str, Any] = {"ours": {}, "stock": {}, "shared": {}}
        l2 = l2_cache_bytes(self.dev)
        M = self.M
        kv = self.plan.kv_lens(M)
        c = self.cfg

        def launches(n: int) -> int:
            return n * max(1, -(-4 // n))

        def grp(pred) -> list[_Layer]:
            return [L for L in self.layers if pred(L)]

        def note(res: dict, layers: list[_Layer], bytes_per: float | None) -> dict:
            """bytes_per: the weights + KV one launch streams (None: activations only, L2 residency is what the
            real step has too, not flagged)."""
            if "median_us" in res:
                res["layers"] = [L.i for L in layers]
                if bytes_per is not None:
                    n = max(1, len(layers))
                    res["rotated_bytes"] = bytes_per * n
                    res["covers_2x_l2"] = bytes_per * n >= 2 * l2
            return res

        prefix_bytes = {full: sum(x.bytes for x in cost.fused_prefix_costs(c, M, kv, indexer=full)) for full in (True, False)}
        for path, rec in recs.items():
            for full, key in ((True, "prefix[full]"), (False, "prefix[shared]")):
                Ls = grp(lambda L, f=full: L.plan.full_indexer == f)
                if Ls:
                    def f(i, Ls=Ls, path=path, rec=rec):
                        L = Ls[i % len(Ls)]
                        h, r, prev = rec[("in", L.i)]
                        return self.prefix(path, L, h, r, prev)
                    out[path][key] = note(self._time(f, launches(len(Ls))), Ls, prefix_bytes[full])
            Ls = list(self.layers)

            def f_rest(i, path=path, rec=rec):
                L = Ls[i % len(Ls)]
                return self.rest(path, L, rec[("attn", L.i)], rec[("prefix", L.i)][3])
            out[path]["rest"] = note(self._time(f_rest, launches(len(Ls))), Ls, None)
            Lm = grp(lambda L: L.plan.moe)
            if Lm:
                def f_moe(i, path=path, rec=rec):
                    L = Lm[i % len(Lm)]
                    x, _, x8, xs = rec[("rest", L.i)]
                    return self.mlp(path, L, x, x8, xs)
                eager = path == "stock" and bool(self.stock_moe_fallback)
                out[path]["mlp[moe]"] = note(self._time(f_moe, launches(len(Lm)), graph=not eager), Lm,
                                             sum(x.bytes for x in cost.moe_costs(c, M)))
        rec = recs.get("ours") or recs.get("stock")
        Ls = list(self.layers)

        def f_core(i):
            L = Ls[i % len(Ls)]
            return self.core(L, *rec[("prefix", L.i)][:3])
        core_b = sum(x.bytes for x in cost.attn_core_costs(c, M, kv))
        out["shared"]["core"] = note(self._time(f_core, launches(len(Ls))), Ls, core_b)
        Ld = grp(lambda L: not L.plan.moe)
        if Ld:
            def f_dense(i):
                L = Ld[i % len(Ld)]
                x, _, x8, xs = rec[("rest", L.i)]
                return self.mlp("ours", L, x, x8, xs)
            out["shared"]["mlp[dense]"] = note(self._time(f_dense, launches(len(Ld))), Ld,
                                               sum(x.bytes for x in cost.dense_mlp_costs(c, M)))
        out["shared"]["tail"] = note(self._time(lambda i: self.tail(*rec["final_in"]), 4), [],
                                     tail_bytes(c, M, self.plan.lm_head))
        if "stock" in recs and "stock" not in self.unavailable:
            import torch

            logits = torch.randn(M, max(kv), device=self.dev)
            sl, bt = self.inp["seq_lens"], self.inp["block_table"]
            out["stock"]["e2_standin"] = self._time(
                lambda i: self.sp._c["topk_translate"](logits, sl, bt, c.index_topk), 8)
        return out

    def bench_bucket(self, m: int) -> dict[str, Any]:
        import torch

        from .timing import cuda_context_error

        p = self.plan
        self.set_bucket(m)
        row: dict[str, Any] = {"M": m, "kv_lens": _kv_summary(p.kv_lens(m)), "cmp_mode": self.mode,
                               "megamoe_config": self.mm_cfg.name if self.mm_cfg is not None else None,
                               "steps": {}, "errors": {}}
        recs: dict[str, dict] = {}
        for path in p.paths:
            if path in self.unavailable:
                row["steps"][path] = {"skipped": self.unavailable[path]}
                continue
            try:
                rec: dict = {}
                self.run_step(path, rec)
                torch.cuda.synchronize(self.dev)
                recs[path] = rec
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                row["errors"][path] = f"eager step: {type(e).__name__}: {str(e)[:400]}"
                err = cuda_context_error(self.dev)
                if err:
                    raise RuntimeError(f"CUDA context lost after the {path} step at M={m}: {err}") from e
        if "ours" in recs and "stock" in recs:
            try:
                row["correctness"] = self.check(recs["ours"], recs["stock"])
                torch.cuda.synchronize(self.dev)
            except Exception as e:  # noqa: BLE001 - a check that could not run fails the bucket; timing goes on
                traceback.print_exc()
                msg = f"check raised {type(e).__name__}: {str(e)[:400]}"
                row["correctness"] = {"method": "teacher-forced per layer", "layers": [], "passed": False,
                                      "failures": [msg], "error": msg}
                err = cuda_context_error(self.dev)
                if err:
                    raise RuntimeError(f"CUDA context lost in the correctness check at M={m}: {err}") from e
        routing = {}
        for path, rec in recs.items():
            de = {L.i: int(rec[("ids", L.i)].unique().numel()) for L in self.layers if L.plan.moe}
            row.setdefault("distinct_experts", {})[path] = de
            if not routing:
                routing = {L.i: rec[("ids", L.i)].cpu() for L in self.layers if L.plan.moe}
        row["routing_from"] = next(iter(recs), None)
        row["floor"] = step_floor(self.cfg, p.layers, m, p.kv_lens(m), routing, p.lm_head)
        row["floor_measured_bw"] = step_floor(self.cfg, p.layers, m, p.kv_lens(m), routing, p.lm_head,
                                              bw=self.copy_bw)["floor_us"]
        for path in recs:
            eager = path == "stock" and bool(self.stock_moe_fallback)
            row["steps"][path] = self._time(lambda i, path=path: self.run_step(path), 1, graph=not eager)
            _log(f"M={m} {path}: step {row['steps'][path].get('median_us', row['steps'][path])}")
        if p.pieces and recs:
            row["pieces"] = self.pieces(recs)
        row["memory_peak_gib"] = torch.cuda.max_memory_allocated(self.dev) / GIB
        for L in self.layers:
            L.stock_bound.pop(m, None)
        recs.clear()
        torch.cuda.empty_cache()
        return row


def _kv_summary(lens: Sequence[int]) -> dict[str, Any]:
    return {"min": min(lens), "max": max(lens), "mean": sum(lens) / len(lens), "n": len(lens)}


# ---- derived numbers, report (CPU) ------------------------------------------------------------------------------


def _med(x: Any) -> float | None:
    return x.get("median_us") if isinstance(x, Mapping) else None


def derive_bucket(row: dict[str, Any], layers: Sequence[LayerPlan], stock_moe_fallback: bool = False) -> dict[str, Any]:
    """speedups, time / floor, the E2-adjusted stock figure and the per-layer breakdown from the pieces."""
    fl = row["floor"]["floor_us"]
    o, s = _med(row["steps"].get("ours")), _med(row["steps"].get("stock"))
    d: dict[str, Any] = {"ours_over_floor": o / fl if o else None, "stock_over_floor": s / fl if s else None,
                         "speedup": (s / o) if (o and s and not stock_moe_fallback) else None}
    pcs = row.get("pieces") or {}
    e2 = _med(pcs.get("stock", {}).get("e2_standin"))
    n_idx = sum(1 for lp in layers if lp.full_indexer)
    if s and e2 is not None:
        d["stock_adjusted_us"] = s - n_idx * max(0.0, e2 - E2_SGLANG_US)
        d["speedup_adjusted"] = d["stock_adjusted_us"] / o if (o and not stock_moe_fallback) else None
    if pcs:
        fl_l = {r["layer"]: r for r in row["floor"]["layers"]}
        sh = pcs.get("shared", {})
        per, sums = [], {"ours": 0.0, "stock": 0.0}
        for lp in layers:
            r: dict[str, Any] = {"layer": lp.index, "kind": lp.kind, "floor_us": fl_l[lp.index]["floor_us"]}
            core = _med(sh.get("core"))
            r["core"] = core
            for path in ("ours", "stock"):
                pp = pcs.get(path, {})
                if not pp:
                    continue
                pre = _med(pp.get("prefix[full]" if lp.full_indexer else "prefix[shared]"))
                rest = _med(pp.get("rest"))
                mlp = _med(pp.get("mlp[moe]")) if lp.moe else _med(sh.get("mlp[dense]"))
                parts = (pre, core, rest, mlp)
                tot = sum(parts) if all(v is not None for v in parts) else None
                r[path] = {"prefix": pre, "rest": rest, "mlp": mlp, "layer": tot}
                if tot is not None and sums[path] is not None:
                    sums[path] += tot
                else:
                    sums[path] = None
            per.append(r)
        tail = _med(sh.get("tail"))
        d["per_layer"] = per
        d["tail_us"] = tail
        core, dense = _med(sh.get("core")), _med(sh.get("mlp[dense]"))
        n_dense = sum(1 for lp in layers if not lp.moe)
        if core is not None and tail is not None and (dense is not None or not n_dense):
            shared = core * len(layers) + tail + (dense or 0.0) * n_dense
            d["shared_us"] = shared  # the same code in both paths: core x layers + dense MLPs + tail
            if o and s and o > shared and not stock_moe_fallback:
                d["speedup_excl_shared"] = (s - shared) / (o - shared)
        d["pieces_sum_us"] = {k: (v + tail if (v and tail is not None) else None) for k, v in sums.items()
                              if pcs.get(k)}
    row["derived"] = d
    return row


def _f(x: Any, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def render_markdown(rep: Mapping[str, Any]) -> str:
    m = rep["meta"]
    lines = [f"# GLM-5 decode step: ours vs stock ({m['gpu']}, {m['date']}, commit {m['commit']})", "",
             f"Model: {m['model_desc']}. Layers: " + ", ".join(f"{lp['index']} {lp['kind']}" for lp in m["layers"])
             + f". KV per sequence: {m['kv_desc']}. lm_head: {'on' if m['lm_head'] else 'off'}. "
             f"DeepGEMM: {m['deep_gemm']}. Copy bandwidth measured: {_f(m.get('copy_bandwidth_tb_s'), '.2f')} TB/s.", "",
             "Step times: median of CUDA-graph replays of the WHOLE step (all layers + final norm + lm_head), one "
             "graph per path per bucket. Floor: bytes one step must move (cost.py, fused prefix, MoE weights of the "
             "distinct experts the routing touched) at 4.27 TB/s. The attention core is the SAME code in both paths "
             "(shared; see below), so ours/stock compares prefix + post-attention norm + MoE; 'shared us' = the "
             "separately timed shared pieces (core x layers + dense MLPs + final norm/lm_head), and 'excl. shared' "
             "is (stock - shared) / (ours - shared).", "",
             "| M | CMP mode | MegaMoE config | distinct experts / MoE layer | floor us | ours us | stock us | "
             "stock/ours | ours/floor | stock/floor | shared us | stock/ours excl. shared | stock adj. us (E2 at 3 us) | "
             "adj. stock/ours | check |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rep["buckets"]:
        d = r.get("derived", {})
        de = r.get("distinct_experts", {}).get(r.get("routing_from") or "", {})
        de_s = ", ".join(str(v) for v in de.values()) or "-"
        chk = r.get("correctness")
        chk_s = "-" if not chk else ("ok" if chk["passed"] else "FAIL")
        cell = {}
        for path in ("ours", "stock"):
            st = r["steps"].get(path)
            cell[path] = (_f(_med(st)) if _med(st) is not None else
                          ("skipped" if isinstance(st, Mapping) and "skipped" in st else
                           ("err" if st is not None or path in r.get("errors", {}) else "-")))
        lines.append(f"| {r['M']} | {r.get('cmp_mode', '-')} | {r.get('megamoe_config') or '-'} | {de_s} | "
                     f"{_f(r['floor']['floor_us'])} | {cell['ours']} | {cell['stock']} | {_f(d.get('speedup'), '.2f')} | "
                     f"{_f(d.get('ours_over_floor'), '.2f')} | {_f(d.get('stock_over_floor'), '.2f')} | "
                     f"{_f(d.get('shared_us'))} | {_f(d.get('speedup_excl_shared'), '.2f')} | "
                     f"{_f(d.get('stock_adjusted_us'))} | {_f(d.get('speedup_adjusted'), '.2f')} | {chk_s} |")
    lines += ["", "## What runs where", "", "| piece | ours | stock |", "|---|---|---|"]
    for k, v in m.get("labels", {}).items():
        if "shared" in v:
            lines.append(f"| {k} | {v['shared']} | (same) |")
        else:
            lines.append(f"| {k} | {v.get('ours', '-')} | {v.get('stock', '-')} |")
    for r in rep["buckets"]:
        d = r.get("derived", {})
        if not d.get("per_layer"):
            continue
        lines += ["", f"## Per-layer breakdown, M={r['M']} (separately timed pieces, us; core = shared)", "",
                  "| layer | kind | prefix ours | prefix stock | core (shared) | norm ours | norm stock | MLP ours | "
                  "MLP stock | layer ours | layer stock | layer floor |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for x in d["per_layer"]:
            o, s = x.get("ours", {}), x.get("stock", {})
            lines.append(f"| {x['layer']} | {x['kind']} | {_f(o.get('prefix'))} | {_f(s.get('prefix'))} | {_f(x['core'])} | "
                         f"{_f(o.get('rest'))} | {_f(s.get('rest'))} | {_f(o.get('mlp'))} | {_f(s.get('mlp'))} | "
                         f"{_f(o.get('layer'))} | {_f(s.get('layer'))} | {_f(x['floor_us'])} |")
        ps = d.get("pieces_sum_us", {})
        lines.append(f"| tail | final norm + lm_head (shared) | | | | | | | | {_f(d.get('tail_us'))} | "
                     f"{_f(d.get('tail_us'))} | {_f(r['floor']['tail_floor_us'])} |")
        lines.append(f"| **sum of pieces** | | | | | | | | | **{_f(ps.get('ours'))}** | **{_f(ps.get('stock'))}** | "
                     f"**{_f(r['floor']['floor_us'])}** |")
        lines.append(f"| **whole step (one graph)** | | | | | | | | | **{_f(_med(r['steps'].get('ours')))}** | "
                     f"**{_f(_med(r['steps'].get('stock')))}** | |")
        e2 = _med((r.get("pieces") or {}).get("stock", {}).get("e2_standin"))
        if e2 is not None:
            lines.append(f"\nstock E2 stand-in (torch.topk + translate) alone: {e2:.1f} us per indexer layer "
                         f"(SGLang's fused top-k: ~{E2_SGLANG_US:g} us).")
        flags = [f"{path} {k}" for path, pp in (r.get("pieces") or {}).items() for k, v in pp.items()
                 if isinstance(v, Mapping) and v.get("covers_2x_l2") is False]
        if flags:
            lines.append("Pieces whose rotated weights do not cover 2x L2 (may read from L2): " + ", ".join(flags) + ".")
    chk = [r for r in rep["buckets"] if r.get("correctness")]
    if chk:
        lines += render_correctness(chk)
    lines += ["", "## Method", "", m.get("method", "")]
    notes = list(m.get("notes", []))
    for r in rep["buckets"]:
        notes += [f"M={r['M']} {k}: {v}" for k, v in r.get("errors", {}).items()]
        notes += [f"M={r['M']} {k}: {v['error']}" for k, v in r["steps"].items() if isinstance(v, Mapping) and "error" in v]
        notes += [f"M={r['M']} {k}: skipped: {v['skipped']}" for k, v in r["steps"].items()
                  if isinstance(v, Mapping) and "skipped" in v]
        for path, pp in (r.get("pieces") or {}).items():
            notes += [f"M={r['M']} piece {path} {k}: {v['error']}" for k, v in pp.items()
                      if isinstance(v, Mapping) and "error" in v]
    notes += [f"bucket {b['M']}: {b['skipped']}" for b in rep.get("skipped", [])]
    if notes:
        lines += ["", "## Notes, fallbacks and errors", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _rel(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "-"
    return f"{c['rel_l2']:.4f}" if c.get("finite", True) else "NaN"


def _rel_worst(cs: Mapping[str, Any] | None) -> str:
    w = _worst(list((cs or {}).values()))
    return "-" if w is None else ("NaN" if w == float("inf") else f"{w:.4f}")


def _exact(x: float | None) -> str:
    return "-" if x is None else ("exact" if x == 0 else f"{x:.2e}")


def _is_teacher_forced(c: Mapping[str, Any]) -> bool:
    return c.get("method") == "teacher-forced per layer"


def render_correctness(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The correctness sections of the report: the teacher-forced per-layer check (pass / fail; a summary per
    bucket and a per-layer table) and the end-to-end drift (information). Buckets merged (--append) from a run
    before the teacher-forced check show their end-to-end check only."""
    tf = [r for r in rows if _is_teacher_forced(r["correctness"])]
    lines = []
    if tf:
        c0 = tf[0]["correctness"]
        lines += ["", "## Correctness: teacher-forced per layer (ours on the stock path's inputs, same top-k and "
                      "routing)", "",
                  "Each layer of OUR path is fed the STOCK path's recorded inputs of that layer (eager, outside the "
                  "timed graphs) and each piece is compared with the stock path's output on identical inputs: prefix "
                  "outputs (q_lat, q_pe, residual, the current token's KV and index-K cache entries); the attention "
                  "core on our prefix outputs but the STOCK top-k (the core is shared code: this is our prefix's "
                  "numerics seen through attention); the post-attention norm (+ FP8 quant); the MLP / MoE on the "
                  "stock's quantized input and the STOCK routing (our MegaMoE vs the stock MoE). Selection agreement "
                  "on identical inputs (indexer top-k, router experts) is reported on its own: near-tie flips. "
                  "Errors: relative L2, ||ours - stock|| / ||stock||.", "",
                  "| M | prefix (worst) | core, stock top-k | norm | MLP / MoE, stock routing | layer out, chained "
                  "(info) | min top-k overlap | min expert overlap | stock re-run (info) | caches | passed |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in tf:
            c = r["correctness"]
            w = c.get("worst", {})
            n = len(c["failures"])
            passed = "yes" if c["passed"] else f"NO ({n} failure{'s' if n != 1 else ''}, below)"
            lines.append(f"| {r['M']} | {_f(w.get('prefix'), '.4f')} | {_f(w.get('core'), '.4f')} | "
                         f"{_f(w.get('norm'), '.4f')} | {_f(w.get('mlp'), '.4f')} | {_f(w.get('layer_out'), '.4f')} | "
                         f"{_f(c.get('min_topk_overlap_seen'), '.4f')} | {_f(c.get('min_expert_overlap_seen'), '.4f')} | "
                         f"{_exact(w.get('stock_rerun'))} | {'ok' if c.get('caches_ok', True) else 'PROBLEM'} | "
                         f"{passed} |")
        lines += ["", "Per layer (relative L2 on identical inputs; overlaps on identical inputs):", "",
                  "| M | layer | kind | q_lat | q_pe | residual | KV entry | index-K entry | core, stock top-k | norm | "
                  "MLP / MoE, stock routing | layer out (info) | top-k overlap | expert overlap | result |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in tf:
            for x in r["correctness"]["layers"]:
                pr = x.get("prefix", {})
                res = "ok" if x.get("passed") else "FAIL: " + "; ".join(
                    f.removeprefix(f"layer {x['layer']}").lstrip(": ") for f in x.get("failures", []))
                lines.append(f"| {r['M']} | {x['layer']} | {x.get('kind', '-')} | {_rel(pr.get('q_lat'))} | "
                             f"{_rel(pr.get('q_pe'))} | {_rel(pr.get('residual_out'))} | {_rel(pr.get('kv_entry'))} | "
                             f"{_rel(pr.get('index_k_entry'))} | {_rel(x.get('core'))} | {_rel_worst(x.get('rest'))} | "
                             f"{_rel(x.get('mlp'))} | {_rel_worst(x.get('layer_out'))} | "
                             f"{_f(x.get('topk_overlap'), '.4f')} | {_f(x.get('expert_overlap'), '.4f')} | {res} |")
        lines.append(f"\nPass (per layer, identical inputs): every piece above <= {c0['tol']:g} relative L2 and finite "
                     f"(--tol; the FP8 index-K entry <= {c0.get('tol_fp8', TOL_FP8):g}, --tol-fp8: the e4m3 half-ULP; "
                     f"the core <= {c0.get('tol_core', TOL_CORE):g}, --tol-core), indexer top-k overlap >= {c0['min_topk_overlap']:g} and expert overlap >= "
                     f"{c0['min_expert_overlap']:g}, each path wrote the current token's cache entries before reading "
                     "them (checked by poisoning them first) and the caches were left as found (digests). 'layer out' "
                     "(our whole layer chained on its own intermediates, stock selection) and 'stock re-run' (the "
                     "stock prefix run again on its own inputs vs its record: run-to-run determinism) are information.")
        fails = [f"M={r['M']} {f}" for r in tf for f in r["correctness"]["failures"]]
        if fails:
            lines += ["", "Failures:", ""] + [f"- {f}" for f in fails]
    e2e = [(r["M"], r["correctness"].get("e2e_drift") if _is_teacher_forced(r["correctness"]) else r["correctness"])
           for r in rows]
    e2e = [(m, d) for m, d in e2e if d and "final_hidden" in d]
    if e2e:
        lines += ["", "### End-to-end drift (information, not a pass criterion)", "", E2E_NOTE, "",
                  "| M | final hidden rel L2 | max abs err / max abs | lm_head argmax agree | min top-k overlap | "
                  "mean expert overlap |", "|---:|---:|---:|---:|---:|---:|"]
        for m, d in e2e:
            eo = [x["expert_overlap"] for x in d.get("layers", []) if "expert_overlap" in x]
            lines.append(f"| {m} | {d['final_hidden']['rel_l2']:.4f} | {d['final_hidden']['max_rel']:.4f} | "
                         f"{_f(d.get('logits_argmax_agree'), '.3f')} | {_f(d.get('min_topk_overlap_seen'), '.4f')} | "
                         f"{_f(sum(eo) / len(eo) if eo else None, '.3f')} |")
        lines += ["", "Per layer, free-running (M: layer: top-k overlap / expert overlap / attn-out rel L2 / MLP-out "
                      "rel L2):", ""]
        for m, d in e2e:
            parts = [f"{x['layer']}: {_f(x.get('topk_overlap'), '.4f')} / {_f(x.get('expert_overlap'), '.3f')} / "
                     f"{x['attn_out']['rel_l2']:.4f} / {x['mlp_out']['rel_l2']:.4f}" for x in d.get("layers", [])]
            lines.append(f"- M={m}: " + "; ".join(parts))
        old = [m for m, _ in e2e if not any(r["M"] == m for r in tf)]
        if old:
            lines.append(f"\nM={old}: merged from a run before the teacher-forced check; its pass / fail was the "
                         "end-to-end tolerance of that run.")
    return lines


def render_png(rep: Mapping[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return None
    rows = rep["buckets"]
    if not rows:
        return None
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.27
    for k, (name, get) in enumerate((("ours", lambda r: _med(r["steps"].get("ours"))),
                                     ("stock", lambda r: _med(r["steps"].get("stock"))),
                                     ("floor", lambda r: r["floor"]["floor_us"]))):
        ax.bar([x + (k - 1) * w for x in xs], [(get(r) or 0) / 1e3 for r in rows], w, label=name)
    ax.set_xticks(xs, [str(r["M"]) for r in rows])
    ax.set_xlabel("tokens per step (M)")
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"GLM-5 decode step, {len(rep['meta']['layers'])} layers ({rep['meta']['gpu']})", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return str(path)


def write_results(rep: dict[str, Any], out: str | Path) -> None:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    if render_png(rep, d / FILES[2]):
        rep["meta"]["png"] = FILES[2]
    (d / FILES[0]).write_text(json.dumps(rep, indent=1, default=str))
    (d / FILES[1]).write_text(render_markdown(rep))


def merge_existing(rep: dict[str, Any], out: str | Path) -> dict[str, Any]:
    """--append: the buckets of an earlier decode_step.json in `out` that this run did not measure."""
    f = Path(out) / FILES[0]
    if not f.exists():
        return rep
    old = json.loads(f.read_text())
    if old.get("meta", {}).get("setup") != rep["meta"]["setup"]:
        raise ValueError(f"bench decode-step: --append: {f} was measured with a different model / layers / KV / "
                         "seed; use another --out")
    mine = {r["M"] for r in rep["buckets"]}
    kept = [r for r in old.get("buckets", []) if r["M"] not in mine]
    rep["buckets"] = sorted(kept + rep["buckets"], key=lambda r: r["M"])
    runs = [x | {"buckets": [b for b in x.get("buckets", []) if b not in mine]}
            for x in old["meta"].get("merged_from", []) if x.get("started") != rep["meta"].get("started")]
    if old["meta"].get("started") != rep["meta"].get("started"):  # (else: this run's own earlier write)
        runs.append({k: old["meta"].get(k) for k in ("date", "commit", "started")}
                    | {"buckets": sorted(r["M"] for r in kept)})
    rep["meta"]["merged_from"] = [x for x in runs if x["buckets"]]  # earlier runs still contributing buckets
    return rep


E2E_NOTE = (
    "End-to-end drift is information, not a pass criterion: each path runs the whole step on its own outputs, so "
    "its router and indexer pick slightly different experts / KV tokens at near-ties; with random synthetic KV caches "
    "the sparse attention output swings when a few % of the selected tokens differ, and the differences compound over "
    "layers. It measures selection sensitivity, not kernel numerics (the teacher-forced check above does).")

METHOD = (
    "Per bucket M (M sequences, each with its KV context in per-layer paged caches from "
    "testing.decode_step.make_decode_step; ours and stock share the caches, each path writes the current "
    "token's entries before reading them): (1) one eager step per path records every layer's tensors; the "
    "correctness check then runs OUR pieces of each layer eagerly on the STOCK path's recorded inputs of that layer "
    "(teacher-forced: attention core on the stock top-k, MoE on the stock routing) and compares each with the stock "
    "output, and reports the two free-running steps' end-to-end drift as information; it saves, poisons, lets each "
    "path rewrite and finally restores the current token's cache entries, checking the caches' digests (outside "
    "every timed graph); (2) the whole step per path is captured in one CUDA graph "
    "(bench.timing.time_launches, 1 launch per graph, --repeat replays, median; our CMP prefix is enqueued into "
    "that graph with its side streams, DeepGEMM's buffer copies are inside the stock graph); (3) pieces are "
    "captured separately, each graph rotating over the layers of its kind (>= 4 launches per graph). Floors: "
    "cost.layer_summary(fused_prefix=True) per layer + final norm + lm_head; MoE weights from the routing of the "
    "eager run. The stock E2 is a torch.topk stand-in; 'stock adj.' replaces its measured time by ~3 us per "
    "indexer layer (SGLang's fused top-k, shared/anchors.md): an estimate, not a measurement.")


def format_plan(plan: Plan) -> str:
    c = plan.cfg
    mem = plan.memory
    rt = estimate_runtime_s(plan)
    lines = ["glm5-fastpath bench decode-step: plan (dry run; nothing allocated)",
             f"  model:    {'checkpoint ' + plan.model if plan.model else 'synthetic, random weights generated on the GPU'} "
             f"({c.source})",
             f"  layers:   {len(plan.layers)}: " + ", ".join(f"{lp.index} {lp.kind}" for lp in plan.layers),
             "  routers:  " + ("N(0, 0.02), zero correction bias" if plan.source == "synthetic" or plan.randomize_routers
                                else "the checkpoint's"),
             f"  buckets:  {plan.buckets}",
             "  KV:       " + (f"{plan.kv_pattern[0]} per sequence" if len(plan.kv_pattern) == 1
                                else f"pattern {plan.kv_pattern} (cycled over the sequences)"),
             f"  paths:    {', '.join(plan.paths)}; lm_head {'on' if plan.lm_head else 'off'}; pieces "
             f"{'on' if plan.pieces else 'off'}; repeat {plan.repeat}",
             f"  check:    teacher-forced per layer, each piece rel L2 <= {plan.tol:g} (FP8 entries {plan.tol_fp8:g}, core "
             f"{plan.tol_core:g}) on identical inputs; indexer "
             f"top-k overlap >= {plan.min_topk_overlap:g}, expert overlap >= {plan.min_expert_overlap:g}; end-to-end "
             "drift reported as information",
             "  CMP mode per bucket: " + ", ".join(f"{m}: {v}" for m, v in plan.cmp_modes.items()),
             "  MegaMoE config per bucket: " + (", ".join(f"{m}: {v}" for m, v in plan.megamoe_configs.items()) or "-"),
             "  step floor per bucket (uniform-routing expectation, 4.27 TB/s): " + ", ".join(
                 f"{m}: {step_floor(c, plan.layers, m, plan.kv_lens(m), {}, plan.lm_head)['floor_us'] / 1e3:.2f} ms"
                 for m in plan.buckets),
             "", f"  GPU memory estimate: {mem['total_gib']:.1f} GiB of {mem['capacity_gib']:.0f} GiB "
                 f"({'fits' if mem['fits'] else 'DOES NOT FIT: use fewer layers, smaller buckets or --paths ours'}); "
                 f"MegaMoE prepare_weights {'copies w13' if mem['prepare_weights_copies_w13'] else 'is zero-copy'}"]
    for k, v in mem["components_bytes"].items():
        if v:
            lines.append(f"    {k:48s} {v / GIB:8.2f} GiB")
    lines += ["", f"  rough run time (H200, warm JIT caches): setup {rt['setup_s'] / 60:.1f} min + "
                  + " + ".join(f"{m}: {t / 60:.1f}" for m, t in zip(plan.buckets, rt["per_bucket_s"]))
                  + f" min = {rt['total_s'] / 60:.1f} min (cold caches: + our nvcc JIT, several minutes once)",
              "", "  method: " + METHOD]
    return "\n".join(lines)


def _meta(plan: Plan, bench: StepBench | None, copy_bw: dict | None) -> dict[str, Any]:
    import torch

    from .meta import git_commit, utc_now
    from .stock_prefix import deep_gemm_info

    dgi = deep_gemm_info()
    c = plan.cfg
    n_moe = len(plan.moe_layers)
    desc = (f"checkpoint {plan.model} ({len(plan.layers)} layers" + (", routers randomized N(0, 0.02), zero bias"
                                                                       if plan.randomize_routers else "") + ")"
            if plan.model else f"synthetic {len(plan.layers)} layers ({len(plan.layers) - n_moe} dense + {n_moe} MoE), "
            f"{c.source}; random weights on the GPU, routers N(0, 0.02), zero correction bias")
    kv = plan.kv_pattern
    return {"gpu": torch.cuda.get_device_name(bench.dev) if bench else "?", "date": _dt.date.today().isoformat(),
            "started": utc_now(), "commit": git_commit(), "torch": torch.__version__,
            "deep_gemm": (dgi["version"] or "available") if dgi["available"] else f"not available ({dgi['reason']})",
            "copy_bandwidth_tb_s": copy_bw["bytes_per_s"] / 1e12 if copy_bw else None, "copy_bandwidth": copy_bw,
            "model_desc": desc, "kv_desc": f"{kv[0]}" if len(kv) == 1 else f"pattern {kv}",
            "layers": [{"index": lp.index, "kind": lp.kind} for lp in plan.layers], "lm_head": plan.lm_head,
            "paths": plan.paths, "repeat": plan.repeat, "setup": plan.setup_key(), "memory_estimate": plan.memory,
            "labels": bench.labels if bench else {}, "notes": list(bench.notes) if bench else [],
            "stock_moe_fallback": bench.stock_moe_fallback if bench else "", "method": METHOD,
            "floor_bw": cost.H200_COPY_BW}


def run_bench(plan: Plan, device=None) -> dict[str, Any]:
    import torch

    from .timing import cuda_context_error, measure_copy_bandwidth

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    t0 = time.monotonic()
    bench = StepBench(plan, dev)
    bench.copy_bw = cost.H200_COPY_BW
    bw = measure_copy_bandwidth(dev)
    bench.copy_bw = bw["bytes_per_s"]
    bench.setup()
    rep = {"meta": _meta(plan, bench, bw), "buckets": [], "skipped": []}
    last = 0.0
    for m in plan.buckets:
        el = time.monotonic() - t0
        if plan.budget_s is not None and el + last > plan.budget_s:
            rep["skipped"].append({"M": m, "skipped": f"time budget: {el:.0f} s spent + ~{last:.0f} s per bucket > "
                                                      f"--budget-s {plan.budget_s:g}"})
            _log(rep["skipped"][-1]["skipped"])
            continue
        t1 = time.monotonic()
        _log(f"bucket M={m} (CMP mode {plan.cmp_modes[m]})")
        try:
            row = bench.bench_bucket(m)
        except Exception as e:  # noqa: BLE001 - recorded; the next bucket still runs unless the context is gone
            traceback.print_exc()
            lost = cuda_context_error(dev)
            rep["skipped"].append({"M": m, "skipped": f"error: {type(e).__name__}: {str(e)[:400]}"
                                                      + (f"; CUDA context lost: {lost}" if lost else "")})
            if lost:
                break
            continue
        derive_bucket(row, plan.layers, bool(bench.stock_moe_fallback))
        rep["buckets"].append(row)
        last = time.monotonic() - t1
        rep["meta"]["notes"] = list(bench.notes)
        out = dict(rep)
        if plan.append:
            out = merge_existing(json.loads(json.dumps(rep, default=str)), plan.out)
        write_results(out, plan.out)
        d = row["derived"]
        _log(f"M={m} done in {last:.0f} s: ours {_f(_med(row['steps'].get('ours')))} us, stock "
             f"{_f(_med(row['steps'].get('stock')))} us, floor {row['floor']['floor_us']:.1f} us, speedup "
             f"{_f(d.get('speedup'), '.2f')}; check "
             f"{(row.get('correctness') or {}).get('passed', '-')}")
    rep["meta"]["wall_s"] = time.monotonic() - t0
    out = merge_existing(json.loads(json.dumps(rep, default=str)), plan.out) if plan.append else rep
    write_results(out, plan.out)
    print(render_markdown(out))
    _log(f"wrote {Path(plan.out) / FILES[0]}, {FILES[1]} in {rep['meta']['wall_s']:.0f} s")
    return out


# ---- command line -----------------------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="directory for decode_step.json / .md / .png")
    ap.add_argument("--model", default=None, help="checkpoint dir (make-checkpoint or GLM-5-FP8): its config and weights")
    ap.add_argument("--num-layers", type=int, default=None, help="with --model: only the first N layers (default all)")
    ap.add_argument("--randomize-routers", action="store_true",
                    help="with --model: router weights N(0, 0.02) and zero correction bias instead of the checkpoint's")
    ap.add_argument("--synthetic-layers", type=int, default=None,
                    help=f"random full-dims weights generated on the GPU, N layers (default {DEFAULT_SYNTHETIC_LAYERS})")
    ap.add_argument("--dense-layers", type=int, default=None,
                    help=f"with --synthetic-layers: the first D layers are dense (default {DEFAULT_DENSE_LAYERS})")
    ap.add_argument("--preset", choices=("glm5", "glm5.2"), default="glm5", help="config of the synthetic model")
    ap.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)), help="token counts M (one step each)")
    ap.add_argument("--kv-len", default="8192",
                    help="context per sequence incl. the current token; a comma list is cycled over the sequences")
    ap.add_argument("--paths", default="ours,stock", help="comma list of ours, stock")
    ap.add_argument("--repeat", type=int, default=20, help="graph replays per measurement (median reported)")
    ap.add_argument("--cmp-mode", default="auto", help="CMP mode for every bucket, or auto (--selection table, else "
                                                       f"full up to M={CMP_AUTO_PDL_MAX_M} and multistream above)")
    ap.add_argument("--selection", default=None, help="selection table JSON whose cmp_mode auto uses per bucket")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-pieces", action="store_true", help="skip the per-layer breakdown (whole steps only)")
    ap.add_argument("--no-lm-head", action="store_true", help="leave the final lm_head GEMM out of the step")
    ap.add_argument("--tol", type=float, default=0.03,
                    help="max relative L2 error of each piece of each layer, ours vs stock on IDENTICAL inputs "
                         "(teacher-forced: prefix outputs and cache entries, attention core on the stock top-k, "
                         "post-attention norm, MLP / MoE on the stock routing); the end-to-end final-hidden drift is "
                         "reported, not judged")
    ap.add_argument("--tol-fp8", type=float, default=TOL_FP8,
                    help="--tol for FP8 pieces (the current token's index-K cache entry, dequantized): default 2^-4, "
                         "the e4m3 relative half-ULP (two formulations of one FP8 quantization differ by one code "
                         "where their fp32 values straddle a rounding boundary)")
    ap.add_argument("--tol-core", type=float, default=TOL_CORE,
                    help="--tol for the attention core on our prefix outputs (it amplifies their FP8-level differences "
                         "about 2x on random synthetic caches)")
    ap.add_argument("--min-topk-overlap", type=float, default=0.9,
                    help="min indexer top-k overlap per layer, ours vs stock on identical inputs (near-tie flips)")
    ap.add_argument("--min-expert-overlap", type=float, default=0.9,
                    help="min routed-expert overlap per MoE layer, ours vs stock router on identical inputs")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new buckets once this many seconds (plus one bucket's time) are spent")
    ap.add_argument("--append", action="store_true", help="merge into an existing decode_step.json in --out")
    ap.add_argument("--prewarm", type=int, default=8, help="background processes JIT-compiling DeepGEMM kernels (0: off)")
    ap.add_argument("--dry-run", action="store_true", help="validate the arguments and print the plan (works on a CPU)")


def _gpu_capacity() -> float | None:
    import torch

    try:
        return float(torch.cuda.mem_get_info()[1]) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a dry run never fails on this
        return None


def run(args: argparse.Namespace) -> int:
    import torch

    plan = make_plan(args, capacity_bytes=_gpu_capacity() if args.dry_run else None)  # argument errors first
    if args.dry_run:
        print(format_plan(plan))
        if plan.model:
            print("  checkpoint: " + check_model_tensors(plan))
        return 0
    if not torch.cuda.is_available():
        raise ValueError("bench decode-step: needs a CUDA GPU (sm_90: H100 / H200) and none is visible; "
                         "`--dry-run` prints the plan on any machine")
    cc = torch.cuda.get_device_capability()
    if tuple(cc) < (9, 0):
        raise ValueError(f"bench decode-step: needs an sm_90 GPU (H100 / H200); {torch.cuda.get_device_name()} "
                         f"is sm_{cc[0]}{cc[1]}")
    plan.memory = estimate_memory(plan.cfg, plan.layers, plan.buckets, plan.kv_pattern, plan.paths, plan.lm_head,
                                  prepare_copies=plan.memory["prepare_weights_copies_w13"],
                                  capacity_bytes=torch.cuda.mem_get_info()[1])
    if not plan.memory["fits"]:
        raise ValueError(f"bench decode-step: the plan needs ~{plan.memory['total_gib']:.0f} GiB, the GPU has "
                         f"{plan.memory['capacity_gib']:.0f} GiB (see --dry-run): use fewer layers, smaller buckets or "
                         "--paths ours")
    if plan.model:
        check_model_tensors(plan)
    rep = run_bench(plan)
    failed = [r["M"] for r in rep["buckets"] if r.get("correctness") and not r["correctness"]["passed"]]
    if failed:
        print(f"bench decode-step: teacher-forced correctness check FAILED at M={failed} (see "
              f"{Path(plan.out) / FILES[1]})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.decode_step", description=__doc__.splitlines()[0])
    add_arguments(ap)
    try:
        return run(ap.parse_args(argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"bench decode-step: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
