"""Bytes moved, FLOPs and floor times per op of one GLM-5 decode layer: the one source of every floor.

Every benchmark in the project takes its floors from here, and the numbers reproduce
spec/glm5_layer.md section 7 and appendix A (tests/test_cost.py checks them row by row).

Model (spec section 7):
- One decode step of M query tokens; TP=1; FP8 block-quantized checkpoint as SGLang holds it at
  runtime (spec section 2). MB = 1e6 bytes.
- Weights: FP8 1 B/element plus fp32 128x128 block scales; bf16 2 B; norms' gammas count as weights.
- Activations: bf16 2 B; fp8 1 B plus one fp32 scale per 128-column group per token; fp32 4 B.
  Each op reads its inputs from HBM and writes its outputs to HBM once (no L2 reuse, so small
  activations are over-counted a little: spec section 8, item 5).
- Index-K cache 132 B/token (128 fp8 + fp32 scale), MLA latent KV cache bf16 1152 B/token (H200).
- t_mem = bytes / bandwidth. The project default is H200_COPY_BW (4.27 TB/s, measured copy,
  read + written); the spec tables use SPEC_BW (4.3 TB/s). t_compute = FLOPs / dense datasheet
  peak, FP8 tensor-core FLOPs at FP8_PEAK and everything else at BF16_PEAK. Every decode op here
  is far below its ridge point, so t_mem is the floor.

Two views of the attention prefix:
- `prefix_costs`: one row per SGLang kernel, exactly the rows of the appendix tables
  (A0 norm, A0 quant, B0, q_a/kv_a norms, C0, B1 GEMM, B1 post, D1 quant, D1 GEMM, D1 post,
  D0 quant, D0 GEMM, D2, rope, kv store, E1, E2).
- `fused_prefix_costs`: the ops of our op graph (A0, B0, C0, B1, D1, D0, D2, E1, E2), each the
  union of rows in PREFIX_FUSED_OPS. Each row lists the activation tensors it reads and writes
  (by name, with bytes); a fused op
    * reads a tensor only if one of its rows reads it and none of its rows produces it,
    * writes a tensor only if a row outside the op reads it (or nobody in the graph does: a graph
      output such as a cache entry or what the attention core consumes),
    * reads each weight of its rows once,
  so intermediates passed between fused rows (in registers / SMEM, or as split-K partials that
  at most round-trip through L2) cost nothing. That is the floor of the fused kernel. Rows that
  write the same tensor name compute the same values (D1.quant and D0.quant both quantize q_lora),
  so a fused op that computes it once serves every reader.

Per-row conventions behind the appendix numbers (not all stated in the spec, recovered from its
digits): RoPE rows read r fp32 cos/sin values per token (256 B); E1 reads the index-K cache, the
block table (4 B per 64-token page), q8, head weights and a context length per token and writes
fp32 logits; E2 reads the logits and gathers top-k slots through the page table (4 B each) and
writes top-k int32 ids; expert GEMMs read the token's activation once per (token, expert) pair.

Numbers the spec prints that this model does not reproduce exactly are listed in comments next
to the code they concern (search for "spec:").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from .config import FP8_BLOCK, INDEX_K_PAGE_TOKENS, Glm5Config

# ---- constants -------------------------------------------------------------------------------------

H200_COPY_BW = 4.27e12  # B/s, measured device-to-device copy (bytes read + written): default for floors
SPEC_BW = 4.3e12  # B/s, the value spec/glm5_layer.md section 7 and appendix A use
FP8_PEAK = 1979e12  # FLOP/s, H200 dense FP8 datasheet
BF16_PEAK = 989e12  # FLOP/s, H200 dense BF16 datasheet
MB = 1e6

BF16, FP32, FP8 = 2, 4, 1
INT32 = 4

Tensors = tuple[tuple[str, float], ...]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fp8_block_weight_bytes(n: int, k: int, block: int = FP8_BLOCK) -> int:
    """Bytes of an FP8 block-scaled [N, K] weight: N*K e4m3 + fp32 scales [ceil(N/128), ceil(K/128)]."""
    return n * k + 4 * _cdiv(n, block) * _cdiv(k, block)


def fp8_act_bytes(n: int, group: int = FP8_BLOCK) -> int:
    """Bytes of one token's FP8 activation row of width n: n e4m3 + fp32 scales per 128 columns."""
    return n + 4 * _cdiv(n, group)


def expert_bytes(cfg: Glm5Config) -> int:
    """One expert, w13 (gate ‖ up, [2I, H]) + w2 ([H, I]), FP8 with scales (37 757 952 B for GLM-5)."""
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    return fp8_block_weight_bytes(2 * I, H) + fp8_block_weight_bytes(H, I)


def expected_distinct_experts(M: int, E: int, k: int) -> float:
    """Expected number of distinct routed experts hit by M tokens, each picking k of E uniformly.

    E * (1 - (1 - k/E)^M): 8.0, 102.0, 222.4, 255.9 for GLM-5 at M = 1, 16, 64, 256 (spec section 6).
    The shared expert is not included.
    """
    if M < 0 or not 0 < k <= E:
        raise ValueError(f"expected_distinct_experts: need M >= 0 and 0 < k <= E, got {M=}, {E=}, {k=}")
    return E * (1.0 - (1.0 - k / E) ** M)


# ---- one op ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCost:
    """FLOPs and HBM bytes of one op (a kernel row, or a fused op made of rows).

    name: unique key ("B0.gemm", or "B0" for a fused op); what: human description;
    act_bytes: activation / KV-cache bytes read + written (= sum of reads and writes when listed);
    fp8_flops: the part of flops that runs on FP8 tensor cores (the rest counts at the bf16 peak);
    reads / writes: (tensor name, bytes) of the activations, used to fuse rows (see module doc);
    parts: for a fused op, the rows folded into it.
    """

    name: str
    what: str
    flops: float
    weight_bytes: float
    act_bytes: float
    fp8_flops: float = 0.0
    reads: Tensors = ()
    writes: Tensors = ()
    parts: tuple[str, ...] = ()

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes

    def t_mem_us(self, bw: float = H200_COPY_BW) -> float:
        """Memory floor in microseconds at bandwidth bw (B/s)."""
        return self.bytes / bw * 1e6

    def t_compute_us(self, peak: float | None = None) -> float:
        """Compute floor in microseconds: at `peak` FLOP/s if given, else FP8 part at FP8_PEAK and rest at BF16_PEAK."""
        if peak is not None:
            return self.flops / peak * 1e6
        return (self.fp8_flops / FP8_PEAK + (self.flops - self.fp8_flops) / BF16_PEAK) * 1e6


def _op(name: str, what: str, flops: float, weight_bytes: float, reads: Iterable[tuple[str, float]],
        writes: Iterable[tuple[str, float]], *, fp8: bool = False) -> OpCost:
    reads, writes = tuple((t, float(b)) for t, b in reads), tuple((t, float(b)) for t, b in writes)
    act = sum(b for _, b in reads) + sum(b for _, b in writes)
    return OpCost(name, what, float(flops), float(weight_bytes), act, float(flops) if fp8 else 0.0, reads, writes)


def total(costs: Sequence[OpCost], name: str = "sum", what: str = "") -> OpCost:
    """The sum of a list of costs as one OpCost (no fusion: every row's bytes count)."""
    return OpCost(name, what, sum(c.flops for c in costs), sum(c.weight_bytes for c in costs),
                  sum(c.act_bytes for c in costs), sum(c.fp8_flops for c in costs),
                  parts=tuple(c.name for c in costs))


def floor_us(costs: Sequence[OpCost] | OpCost, bw: float = H200_COPY_BW) -> float:
    """Memory floor of ops run back to back: total bytes / bw, in microseconds. This is THE floor
    benchmarks report (every op here is bandwidth-bound; compute_floor_us gives the other bound)."""
    if isinstance(costs, OpCost):
        return costs.t_mem_us(bw)
    return sum(c.bytes for c in costs) / bw * 1e6


def compute_floor_us(costs: Sequence[OpCost], peak: float | None = None) -> float:
    return sum(c.t_compute_us(peak) for c in costs)


def find(costs: Sequence[OpCost], name: str) -> OpCost:
    for c in costs:
        if c.name == name:
            return c
    raise KeyError(f"no op {name!r} among {[c.name for c in costs]}")


# ---- fusion --------------------------------------------------------------------------------------------


def fuse(rows: Sequence[OpCost], groups: Mapping[str, Sequence[str]], elide: Mapping[str, str] | Iterable[str] = (),
         ) -> list[OpCost]:
    """Fold rows into fused ops. groups: fused name -> row names; elide: rows computed by no fused op.

    Names in groups that are not among rows are skipped (an option or a GLM-5.2 shared layer
    removes rows); a group with no row present is left out. Every present row must be in some
    group or in elide. A row may sit in several groups (recomputed by each). Tensor accounting as
    in the module doc: a group reads a tensor only if it does not produce it, writes it only if
    another group reads it (without producing it) or nobody reads it.
    """
    by_name = {r.name: r for r in rows}
    if len(by_name) != len(rows):
        raise ValueError(f"fuse: duplicate row names in {[r.name for r in rows]}")
    elide = set(elide)
    members = {g: [by_name[n] for n in names if n in by_name] for g, names in groups.items()}
    members = {g: m for g, m in members.items() if m}
    placed = {r.name for m in members.values() for r in m}
    stray = set(by_name) - placed - elide
    if stray:
        raise ValueError(f"fuse: rows {sorted(stray)} are in no fused op and not elided; groups={dict(groups)}")
    both = placed & elide
    if both:
        raise ValueError(f"fuse: rows {sorted(both)} are both grouped and elided")

    produced = {g: {t for r in m for t, _ in r.writes} for g, m in members.items()}
    # groups that read each tensor from HBM (they do not produce it themselves)
    ext_readers: dict[str, set[str]] = {}
    any_reader: set[str] = set()
    for g, m in members.items():
        for r in m:
            for t, _ in r.reads:
                any_reader.add(t)
                if t not in produced[g]:
                    ext_readers.setdefault(t, set()).add(g)

    out = []
    for g, m in members.items():
        reads: dict[str, float] = {}
        writes: dict[str, float] = {}
        for r in m:
            for t, b in r.reads:
                if t not in produced[g]:
                    reads[t] = max(reads.get(t, 0.0), b)
            for t, b in r.writes:
                if (ext_readers.get(t, set()) - {g}) or t not in any_reader:
                    writes[t] = max(writes.get(t, 0.0), b)
        names = tuple(r.name for r in m)
        out.append(_op_fused(g, " + ".join(names), m, reads, writes, names))
    return out


def _op_fused(name: str, what: str, rows: Sequence[OpCost], reads: dict[str, float], writes: dict[str, float],
              parts: tuple[str, ...]) -> OpCost:
    r, w = tuple(reads.items()), tuple(writes.items())
    return OpCost(name, what, sum(x.flops for x in rows), sum(x.weight_bytes for x in rows),
                  sum(reads.values()) + sum(writes.values()), sum(x.fp8_flops for x in rows), r, w, parts)


# ---- attention prefix ------------------------------------------------------------------------------

# Row names of prefix_costs, in appendix order, plus the SGLang fused wk ‖ weights_proj GEMM and the
# two halves of the MLA rope row that the fused view places apart (rope.q in D0, rope.k in D2).
PREFIX_ROWS = ("A0.norm", "A0.quant", "B0.gemm", "B0.q_a_norm", "B0.kv_a_norm", "C0.gemm", "C0+B1.gemm",
               "B1.gemm", "B1.post", "D1.quant", "D1.gemm", "D1.post", "D0.quant", "D0.gemm", "D2.bmm",
               "rope", "rope.q", "rope.k", "kv_store", "E1.logits", "E2.topk")

# Our op graph: which rows each fused op computes. Why each row sits where it does:
# - A0 = residual add + RMSNorm + per-token-group FP8 quant; it writes both the fp8 x (B0, B1)
#   and the bf16 x (C0), as the design article's A0 does ("hidden FP8/scale and norm" results).
# - B0 = QKV-A GEMM whose final row tile (after the split-K reduction) applies q_a_layernorm and
#   kv_a_layernorm and quantizes q_lora to FP8 ONCE for both consumers (the article's "B0 final
#   Q/scale tiles" that D0 and D1 wait on). So SGLang's two q_lora quants become one:
#   D0.quant runs in B0, D1.quant is elided (D1 reads the same fp8 q_lora).
# - C0 = head-gate GEMM (or SGLang's fused wk ‖ weights_proj bf16 GEMM with b1_c0="sglang_fused").
# - B1 = wk GEMM + LayerNorm + RoPE + FP8 quant + index-K cache store.
# - D1 = wq_b GEMM + RoPE + per-head quant + head weights (folding C0's gate).
# - D0 = q_b_proj GEMM with the MLA RoPE of q_pe in the epilogue of each head's second N tile
#   (it holds the rope dims): the q half of the appendix "rope" row.
# - D2 = W_UK absorption; its head-0 tiles also rope k_pe and store the latent KV row (c_kv
#   normed by B0): the k half of the "rope" row and the "kv store" row.
# - E1 = indexer logits.  E2 = top-k + page-table transform.
# This is the decomposition of glm5_fastpath/graph/prefix_graph.py.
PREFIX_FUSED_OPS: dict[str, tuple[str, ...]] = {
    "A0": ("A0.norm", "A0.quant"),
    "B0": ("B0.gemm", "B0.q_a_norm", "B0.kv_a_norm", "D0.quant"),
    "C0": ("C0.gemm", "C0+B1.gemm"),
    "B1": ("B1.gemm", "B1.post"),
    "D1": ("D1.gemm", "D1.post"),
    "D0": ("D0.gemm", "rope.q"),
    "D2": ("D2.bmm", "rope.k", "kv_store"),
    "E1": ("E1.logits",),
    "E2": ("E2.topk",),
}
PREFIX_ELIDED: dict[str, str] = {"D1.quant": "B0 quantizes q_lora once for D0 and D1"}


def _kv_list(M: int, kv_lens: int | Sequence[int]) -> list[int]:
    if isinstance(kv_lens, int):
        lens = [kv_lens] * M
    else:
        lens = [int(x) for x in kv_lens]
        if len(lens) != M:
            raise ValueError(f"kv_lens has {len(lens)} entries, expected one per query token ({M=})")
    if any(L < 1 for L in lens):
        raise ValueError(f"kv_lens must be >= 1 (the current token is in its own context), got {lens[:8]}...")
    return lens


def prefix_costs(cfg: Glm5Config, M: int, kv_lens: int | Sequence[int], *, shared_kv: bool = False,
                 d2: str = "bf16", b1_c0: str = "split", act_quant_separate: bool = True,
                 indexer: bool = True, split_rope: bool = False) -> list[OpCost]:
    """Rows of the attention prefix (A0 … E2) for M query tokens, one per SGLang kernel (appendix A).

    kv_lens: context length per query token (int: the same for all), including the current token.
    shared_kv: the M tokens belong to ONE sequence (spec-verify / MTP, the article's E1 assumption):
      the index-K cache and block table are read once (for the longest context) instead of per token.
    d2: "bf16" (SGLang: w_kc dequantized to bf16) or "fp8" (W_UK requantized to 128x128 blocks per head).
    b1_c0: "split" (the article's and the spec tables' form: C0 = bf16 weights_proj [32,H] reading
      bf16 x, B1 = FP8 wk [128,H] reading fp8 x) or "sglang_fused" (one bf16 GEMM wk ‖ weights_proj
      [160,H] reading bf16 x, row "C0+B1.gemm"; +0.79 MB of weights).
    act_quant_separate: True = SGLang's separate activation-quant kernels (the appendix rows). False =
      each quant folded into its neighbour: "A0.norm+quant", and "D1.gemm"/"D0.gemm" quantizing
      bf16 q_lora in their prologue (they then read 2 B/element of q_lora instead of fp8 + scales).
    indexer: False for a GLM-5.2 "shared" layer (cfg.is_full_indexer_layer(layer) is False):
      C0, B1, D1, E1 and E2 do not run (spec section 3.1).
    split_rope: the MLA "rope" row as two rows, "rope.q" (q_pe) and "rope.k" (k_pe), each reading
      its own cos/sin (the fused view runs them in different ops).
    """
    if M < 1:
        raise ValueError(f"prefix_costs: need M >= 1, got {M=}")
    if d2 not in ("bf16", "fp8"):
        raise ValueError(f"prefix_costs: d2 must be 'bf16' or 'fp8', got {d2!r}")
    if b1_c0 not in ("split", "sglang_fused"):
        raise ValueError(f"prefix_costs: b1_c0 must be 'split' or 'sglang_fused', got {b1_c0!r}")
    lens = _kv_list(M, kv_lens)
    c = cfg
    H, ql, kvl, r = c.hidden_size, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim
    nh, nope = c.num_attention_heads, c.qk_nope_head_dim
    ih, idim = c.index_n_heads, c.index_head_dim
    cos_sin = FP32 * r  # r/2 cos + r/2 sin fp32 values per token, gathered by position
    x8 = fp8_act_bytes(H)
    ql8 = fp8_act_bytes(ql)
    idx_entry = idim + FP32  # index-K cache: 128 fp8 + one fp32 scale per token (132 B)
    kv_entry = BF16 * c.kv_cache_dim  # MLA latent KV, bf16 on H200 (1152 B)

    rows: list[OpCost] = []
    add = rows.append
    add(_op("A0.norm", f"fused_add_rmsnorm({H}) [input_layernorm]", 5 * H * M, BF16 * H,
            [("h_prev", M * BF16 * H), ("resid_in", M * BF16 * H)],
            [("resid", M * BF16 * H), ("x", M * BF16 * H)]))
    add(_op("A0.quant", "per_token_group_quant_fp8(x,128) [SGLang: separate]", 2 * H * M, 0,
            [("x", M * BF16 * H)], [("x8", M * x8)]))
    N_a = c.qkv_a_out
    add(_op("B0.gemm", f"QKV-A fp8 GEMM K={H} N={N_a} (DeepGEMM)", 2 * N_a * H * M, fp8_block_weight_bytes(N_a, H),
            [("x8", M * x8)],
            [("q_lora_raw", M * BF16 * ql), ("c_kv_raw", M * BF16 * kvl), ("k_pe_raw", M * BF16 * r)], fp8=True))
    add(_op("B0.q_a_norm", f"q_a_layernorm RMSNorm({ql})", 4 * ql * M, BF16 * ql,
            [("q_lora_raw", M * BF16 * ql)], [("q_lora", M * BF16 * ql)]))
    add(_op("B0.kv_a_norm", f"kv_a_layernorm RMSNorm({kvl})", 4 * kvl * M, BF16 * kvl,
            [("c_kv_raw", M * BF16 * kvl)], [("c_kv", M * BF16 * kvl)]))
    if indexer:
        if b1_c0 == "split":
            # spec: C0 writes its gate as fp32 (the article's fp32 K-split partials, 4 B/head) while the
            # D1 post row reads it as bf16 (2 B/head, SGLang's bf16 GEMM output). Kept as printed.
            add(_op("C0.gemm", f"Head-Gate weights_proj bf16 GEMM K={H} N={ih}", 2 * ih * H * M, BF16 * ih * H,
                    [("x", M * BF16 * H)], [("w_raw", M * FP32 * ih)]))
            add(_op("B1.gemm", f"Indexer-K wk fp8 GEMM K={H} N={idim} (checkpoint fp8)", 2 * idim * H * M,
                    fp8_block_weight_bytes(idim, H), [("x8", M * x8)], [("k_idx_raw", M * BF16 * idim)], fp8=True))
        else:
            n = idim + ih
            add(_op("C0+B1.gemm", f"SGLang wk_weights_proj bf16 GEMM K={H} N={n}", 2 * n * H * M, BF16 * n * H,
                    [("x", M * BF16 * H)], [("k_idx_raw", M * BF16 * idim), ("w_raw", M * BF16 * ih)]))
        add(_op("B1.post", f"k LayerNorm+RoPE({r}, interleaved)+fp8 quant+store idxK", 12 * idim * M, 2 * FP32 * idim,
                [("k_idx_raw", M * BF16 * idim), ("cos_sin", M * cos_sin)], [("idx_k_new", M * idx_entry)]))
        add(_op("D1.quant", "q_lora act quant (for wq_b)", 2 * ql * M, 0, [("q_lora", M * BF16 * ql)],
                [("q_lora8", M * ql8)]))
        N_i = ih * idim
        add(_op("D1.gemm", f"Indexer-Q wq_b fp8 GEMM K={ql} N={N_i}", 2 * N_i * ql * M, fp8_block_weight_bytes(N_i, ql),
                [("q_lora8", M * ql8)], [("q_idx", M * BF16 * N_i)], fp8=True))
        add(_op("D1.post", f"q RoPE({r})+per-head fp8 quant+head weights", 6 * N_i * M, 0,
                [("q_idx", M * BF16 * N_i), ("w_raw", M * BF16 * ih), ("cos_sin", M * cos_sin)],
                [("q_idx8", M * FP8 * N_i), ("head_w", M * FP32 * ih)]))
    add(_op("D0.quant", "q_lora act quant (for q_b_proj)", 2 * ql * M, 0, [("q_lora", M * BF16 * ql)],
            [("q_lora8", M * ql8)]))
    N_q = nh * c.qk_head_dim
    add(_op("D0.gemm", f"q_b_proj fp8 GEMM K={ql} N={N_q}", 2 * N_q * ql * M, fp8_block_weight_bytes(N_q, ql),
            [("q_lora8", M * ql8)], [("q_nope", M * BF16 * nh * nope), ("q_pe", M * BF16 * nh * r)], fp8=True))
    if d2 == "bf16":
        w_uk = BF16 * nh * nope * kvl
    else:  # per head [kvl, nope] FP8 with its own 128x128 scales (kv_b's blocks straddle heads: requantized)
        w_uk = nh * fp8_block_weight_bytes(kvl, nope)
    add(_op("D2.bmm", f"W_UK absorb bmm {d2} [{nh}]x(Mx{nope})x({nope}x{kvl})", 2 * nh * nope * kvl * M, w_uk,
            [("q_nope", M * BF16 * nh * nope)], [("q_lat", M * BF16 * nh * kvl)], fp8=d2 == "fp8"))
    if split_rope:  # each half gathers its own cos/sin
        add(_op("rope.q", f"MLA RoPE q_pe({nh}x{r}) interleaved", 6 * nh * r * M, 0,
                [("q_pe", M * BF16 * nh * r), ("cos_sin", M * cos_sin)], [("q_pe_roped", M * BF16 * nh * r)]))
        add(_op("rope.k", f"MLA RoPE k_pe({r}) interleaved", 6 * r * M, 0,
                [("k_pe_raw", M * BF16 * r), ("cos_sin", M * cos_sin)], [("k_pe", M * BF16 * r)]))
    else:
        add(_op("rope", f"MLA RoPE q_pe({nh}x{r})+k_pe({r}) interleaved", 6 * (nh * r + r) * M, 0,
                [("q_pe", M * BF16 * nh * r), ("k_pe_raw", M * BF16 * r), ("cos_sin", M * cos_sin)],
                [("q_pe_roped", M * BF16 * nh * r), ("k_pe", M * BF16 * r)]))
    add(_op("kv_store", f"MLA latent KV store ({kvl} normed + {r} roped)", 0, 0,
            [("c_kv", M * BF16 * kvl), ("k_pe", M * BF16 * r)], [("kv_new", M * kv_entry)]))
    if indexer:
        rows += _indexer_select_rows(c, lens, shared_kv)
    if not act_quant_separate:
        rows = _fold_act_quants(rows)
    return rows


# act_quant_separate=False: quant row -> (row it folds into, name of the merged row)
_QUANT_FOLDS = {"A0.quant": ("A0.norm", "A0.norm+quant"), "D1.quant": ("D1.gemm", "D1.gemm"),
                "D0.quant": ("D0.gemm", "D0.gemm")}


def _fold_act_quants(rows: list[OpCost]) -> list[OpCost]:
    by_name = {r.name: r for r in rows}
    into = {host: (q, new) for q, (host, new) in _QUANT_FOLDS.items() if q in by_name}
    groups: dict[str, tuple[str, ...]] = {}
    for r in rows:
        if r.name in _QUANT_FOLDS:
            continue
        q, new = into.get(r.name, (None, r.name))
        groups[new] = (r.name,) if q is None else (q, r.name)
    out = []
    for f in fuse(rows, groups):
        if len(f.parts) == 1:
            out.append(by_name[f.parts[0]])
        else:
            out.append(replace(f, what=" + ".join(by_name[n].what for n in f.parts)))
    return out


def _indexer_select_rows(c: Glm5Config, lens: list[int], shared_kv: bool) -> list[OpCost]:
    """E1 (paged MQA logits) and E2 (top-k + page-table transform) for the given context lengths."""
    M = len(lens)
    ih, idim, topk = c.index_n_heads, c.index_head_dim, c.index_topk
    idx_entry = idim + FP32
    page = INDEX_K_PAGE_TOKENS
    if shared_kv:
        # one sequence: its index-K cache and block table are read once, for the longest context
        Lmax = max(lens)
        cache, table = Lmax * idx_entry, _cdiv(Lmax, page) * INT32
    else:
        cache, table = sum(lens) * idx_entry, sum(_cdiv(L, page) for L in lens) * INT32
    Ls = sum(lens)
    kv_desc = "one shared KV sequence" if shared_kv else "per sequence"
    Ltxt = str(lens[0]) if len(set(lens)) == 1 else f"{min(lens)}..{max(lens)}"
    # FLOPs per (token, key): the fp8 dot products 2*ih*idim, plus ReLU, head-weight multiply and the
    # sum over heads (3*ih). spec: section 7.1 writes "(= 2*32*128*L)" but prints 0.0679 GFLOP at
    # L=8192, which is (2*32*128 + 3*32)*L; the appendix values are reproduced here.
    e1 = _op("E1.logits", f"fp8_paged_mqa_logits (DeepGEMM) L={Ltxt} {kv_desc}", (2 * ih * idim + 3 * ih) * Ls, 0,
             [("idx_k_cache", cache), ("block_table", table), ("q_idx8", M * FP8 * ih * idim),
              ("head_w", M * FP32 * ih), ("ctx_len", M * INT32)],
             [("logits", FP32 * Ls)], fp8=True)
    # top-k writes [M, topk] slot ids (-1 padded when L < topk) after gathering them through the page table
    e2 = _op("E2.topk", f"top-{topk} + page-table transform (sgl_kernel)", 2 * Ls, 0,
             [("logits", FP32 * Ls), ("page_table_gather", M * INT32 * topk)], [("topk_idx", M * INT32 * topk)])
    return [e1, e2]


def fused_prefix_costs(cfg: Glm5Config, M: int, kv_lens: int | Sequence[int], *, shared_kv: bool = False,
                       d2: str = "bf16", b1_c0: str = "split", indexer: bool = True,
                       groups: Mapping[str, Sequence[str]] | None = None,
                       elide: Mapping[str, str] | None = None) -> list[OpCost]:
    """The prefix as the fused ops of our op graph (A0, B0, C0, B1, D1, D0, D2, E1, E2), each with
    its own floor: rows folded per PREFIX_FUSED_OPS (or `groups`), intermediates not re-read."""
    rows = prefix_costs(cfg, M, kv_lens, shared_kv=shared_kv, d2=d2, b1_c0=b1_c0, indexer=indexer, split_rope=True)
    groups = PREFIX_FUSED_OPS if groups is None else groups
    elide = PREFIX_ELIDED if elide is None else elide
    unknown = {n for names in groups.values() for n in names} - set(PREFIX_ROWS)
    if unknown:
        raise ValueError(f"fused_prefix_costs: unknown row names {sorted(unknown)}; rows are {PREFIX_ROWS}")
    return fuse(rows, groups, elide)


# ---- attention core (for context) ---------------------------------------------------------------------


def attn_core_costs(cfg: Glm5Config, M: int, kv_lens: int | Sequence[int], *, shared_kv: bool = False) -> list[OpCost]:
    """Sparse MLA over the top-k selected slots (F0), W_UV (F1) and o_proj (F2).

    Each token attends to min(index_topk, L) latent KV rows. With shared_kv the M tokens' selections
    come from one sequence; the KV rows read are then the expected union under uniform independent
    selection, L * (1 - (1 - t/L)^M) with t = min(topk, L) (between t and min(L, M*t)).
    spec: the appendix core tables have no act-quant row for o before o_proj (SGLang runs one,
    ~50 KB/token); it is left out here too so the tables reproduce.
    """
    lens = _kv_list(M, kv_lens)
    c = cfg
    nh, kvl, r, v = c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.v_head_dim
    H, topk = c.hidden_size, c.index_topk
    kv_entry = BF16 * c.kv_cache_dim
    sel = [min(topk, L) for L in lens]
    if shared_kv:
        L = max(lens)
        t = min(topk, L)
        rows_read = L * (1.0 - (1.0 - t / L) ** M)
    else:
        rows_read = float(sum(sel))
    f0 = _op("F0.sparse_mla", f"sparse MLA decode (top-{topk}, bf16 latent KV {c.kv_cache_dim})",
             sum(sel) * nh * (2 * c.kv_cache_dim + 2 * kvl), 0,
             [("kv_cache", rows_read * kv_entry), ("q_lat", M * BF16 * nh * kvl),
              ("q_pe_roped", M * BF16 * nh * r), ("topk_idx", M * INT32 * topk)],
             [("o_lat", M * BF16 * nh * kvl)])
    f1 = _op("F1.w_uv", f"W_UV bmm bf16 (Mx{kvl})x({kvl}x{v}) x{nh} heads", 2 * nh * kvl * v * M, BF16 * nh * kvl * v,
             [("o_lat", M * BF16 * nh * kvl)], [("o", M * BF16 * nh * v)])
    K_o = nh * v
    f2 = _op("F2.o_proj", f"o_proj fp8 GEMM K={K_o} N={H}", 2 * K_o * H * M, fp8_block_weight_bytes(H, K_o),
             [("o8", M * fp8_act_bytes(K_o))], [("attn_out", M * BF16 * H)], fp8=True)
    return [f0, f1, f2]


# ---- MoE -----------------------------------------------------------------------------------------------


def _distinct_routed(cfg: Glm5Config, M: int, distinct_experts: float | None, routing) -> float:
    E = cfg.n_routed_experts
    if distinct_experts is not None and routing is not None:
        raise ValueError("moe_costs: pass distinct_experts or routing, not both")
    if routing is not None:
        ids = routing.tolist() if hasattr(routing, "tolist") else routing
        flat: set[int] = set()
        for row in ids:
            flat.update(int(e) for e in (row if isinstance(row, (list, tuple)) else [row]))
        # SGLang's fused topk_ids carry the shared expert as id E: it is added separately
        return float(len({e for e in flat if 0 <= e < E}))
    if distinct_experts is not None:
        if not 0 <= distinct_experts <= E:
            raise ValueError(f"moe_costs: distinct_experts={distinct_experts} outside [0, {E}]")
        return float(distinct_experts)
    return expected_distinct_experts(M, E, cfg.num_experts_per_tok)


def moe_costs(cfg: Glm5Config, M: int, *, distinct_experts: float | None = None, routing=None) -> list[OpCost]:
    """MoE of one layer, SGLang's Triton fused_moe path with the shared expert fused (spec section 6).

    distinct_experts: distinct ROUTED experts the M tokens hit (the shared expert is always added);
    None -> the expectation under uniform routing, E*(1-(1-k/E)^M); worst case min(E, k*M).
    routing: alternatively the top-k expert ids [M, k] (tensor / array / nested lists); ids >= E
    (SGLang's fused shared expert) are ignored. Weight bytes count each touched expert once;
    activation bytes count every (token, expert) pair, M*(k + n_shared).
    """
    if M < 1:
        raise ValueError(f"moe_costs: need M >= 1, got {M=}")
    c = cfg
    H, I, E, k, S = c.hidden_size, c.moe_intermediate_size, c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts
    D = _distinct_routed(c, M, distinct_experts, routing)
    touched = D + S
    pairs = M * (k + S)
    x8 = fp8_act_bytes(H)
    a8 = fp8_act_bytes(I)
    w13, w2 = fp8_block_weight_bytes(2 * I, H), fp8_block_weight_bytes(H, I)
    return [
        _op("M0.norm", f"fused_add_rmsnorm({H}) [post_attention_layernorm]", 5 * H * M, BF16 * H,
            [("attn_out", M * BF16 * H), ("resid", M * BF16 * H)], [("resid2", M * BF16 * H), ("h", M * BF16 * H)]),
        _op("M1.router", f"router gate bf16 GEMM K={H} N={E} -> fp32", 2 * E * H * M, BF16 * E * H,
            [("h", M * BF16 * H)], [("router_logits", M * FP32 * E)]),
        _op("M2.topk", f"sigmoid+bias top-{k} (n_group=1)+renorm (flashinfer fused_topk_deepseek)", 10 * E * M, FP32 * E,
            [("router_logits", M * FP32 * E)], [("topk_ids+weights", M * (INT32 + FP32) * k)]),
        _op("M3.quant", "per_token_group_quant_fp8(x,128)", 2 * H * M, 0, [("h", M * BF16 * H)], [("h8", M * x8)]),
        _op("M4.fc1", f"FC1 w13 fp8 grouped GEMM K={H} N={2 * I} ({D:.1f}+{S} experts)", 2 * 2 * I * H * pairs,
            touched * w13, [("h8", pairs * x8)], [("gate_up", pairs * BF16 * 2 * I)], fp8=True),
        _op("M5.act", "silu(gate)*up", 4 * I * pairs, 0, [("gate_up", pairs * BF16 * 2 * I)], [("act", pairs * BF16 * I)]),
        _op("M6.quant", "per_token_group_quant_fp8(h,128)", 2 * I * pairs, 0, [("act", pairs * BF16 * I)],
            [("act8", pairs * a8)]),
        _op("M7.fc2", f"FC2 w2 fp8 grouped GEMM K={I} N={H}", 2 * H * I * pairs, touched * w2,
            [("act8", pairs * a8)], [("expert_out", pairs * BF16 * H)], fp8=True),
        _op("M8.combine", f"moe_sum_reduce (topk-weighted sum x{c.routed_scaling_factor:g})", 2 * H * pairs, 0,
            [("expert_out", pairs * BF16 * H)], [("moe_out", M * BF16 * H)]),
    ]


def dense_mlp_costs(cfg: Glm5Config, M: int) -> list[OpCost]:
    """The dense MLP of layers 0..first_k_dense_replace-1 (FP8 DeepGEMM GEMMs, bf16 in between)."""
    c = cfg
    H, I = c.hidden_size, c.intermediate_size
    x8, a8 = fp8_act_bytes(H), fp8_act_bytes(I)
    return [
        _op("M0.norm", f"fused_add_rmsnorm({H}) [post_attention_layernorm]", 5 * H * M, BF16 * H,
            [("attn_out", M * BF16 * H), ("resid", M * BF16 * H)], [("resid2", M * BF16 * H), ("h", M * BF16 * H)]),
        _op("M3.quant", "per_token_group_quant_fp8(x,128)", 2 * H * M, 0, [("h", M * BF16 * H)], [("h8", M * x8)]),
        _op("MD1.gate_up", f"dense gate_up fp8 GEMM K={H} N={2 * I}", 2 * 2 * I * H * M, fp8_block_weight_bytes(2 * I, H),
            [("h8", M * x8)], [("gate_up", M * BF16 * 2 * I)], fp8=True),
        _op("M5.act", "silu(gate)*up", 4 * I * M, 0, [("gate_up", M * BF16 * 2 * I)], [("act", M * BF16 * I)]),
        _op("M6.quant", "per_token_group_quant_fp8(h,128)", 2 * I * M, 0, [("act", M * BF16 * I)], [("act8", M * a8)]),
        _op("MD2.down", f"dense down fp8 GEMM K={I} N={H}", 2 * H * I * M, fp8_block_weight_bytes(H, I),
            [("act8", M * a8)], [("moe_out", M * BF16 * H)], fp8=True),
    ]


# ---- whole layer -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """Prefix + attention core + MLP (MoE or dense) of one decoder layer, TP=1."""

    prefix: tuple[OpCost, ...]
    core: tuple[OpCost, ...]
    mlp: tuple[OpCost, ...]

    @property
    def ops(self) -> list[OpCost]:
        return [*self.prefix, *self.core, *self.mlp]

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.ops)

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.ops)

    def floor_us(self, bw: float = H200_COPY_BW) -> float:
        return floor_us(self.ops, bw)

    def summary(self, bw: float = H200_COPY_BW) -> dict[str, dict[str, float]]:
        """{prefix|core|mlp|layer: {MB, us, GFLOP}} at bandwidth bw."""
        out = {}
        for name, ops in (("prefix", self.prefix), ("core", self.core), ("mlp", self.mlp), ("layer", self.ops)):
            b = sum(c.bytes for c in ops)
            out[name] = {"MB": b / MB, "us": b / bw * 1e6, "GFLOP": sum(c.flops for c in ops) / 1e9}
        return out


def layer_summary(cfg: Glm5Config, M: int, kv_lens: int | Sequence[int], *, layer: int | None = None,
                  indexer: bool | None = None, shared_kv: bool = False, distinct_experts: float | None = None,
                  routing=None, fused_prefix: bool = False, **prefix_opts) -> LayerCost:
    """Costs of one decoder layer.

    layer=None: an MoE layer with a full indexer (the spec's model). Otherwise the layer's own kind:
    a dense MLP below first_k_dense_replace, and no C0/B1/D1/E1/E2 on a GLM-5.2 shared-indexer
    layer (indexer=True/False overrides that). fused_prefix: the prefix as our fused ops instead of
    SGLang's kernel rows. prefix_opts (d2, b1_c0, act_quant_separate) go to the prefix function.
    """
    if indexer is None:
        indexer = True if layer is None else cfg.is_full_indexer_layer(layer)
    moe = True if layer is None else cfg.is_moe_layer(layer)
    if fused_prefix:
        prefix = fused_prefix_costs(cfg, M, kv_lens, shared_kv=shared_kv, indexer=indexer, **prefix_opts)
    else:
        prefix = prefix_costs(cfg, M, kv_lens, shared_kv=shared_kv, indexer=indexer, **prefix_opts)
    core = attn_core_costs(cfg, M, kv_lens, shared_kv=shared_kv)
    mlp = moe_costs(cfg, M, distinct_experts=distinct_experts, routing=routing) if moe else dense_mlp_costs(cfg, M)
    return LayerCost(tuple(prefix), tuple(core), tuple(mlp))


# ---- rendering -----------------------------------------------------------------------------------------


def _g(x: float) -> str:
    """4 significant digits, like the spec tables."""
    return "0" if x == 0 else f"{x:.4g}"


def render_markdown(costs: Sequence[OpCost], bw: float = H200_COPY_BW, *, title: str | None = None,
                    measured_us: Mapping[str, float] | None = None, sum_row: bool = True) -> str:
    """A markdown table of costs with the appendix's columns (t_mem at bw), plus "measured (us)" and
    "x floor" (measured / t_mem) columns when measured_us (op name -> microseconds) is given. The sum
    row's measured time is the sum of the ops' when every op has one."""
    head = ["op", "what", "GFLOP", "weight MB", "act MB", "total MB", f"t_mem @{bw / 1e12:g}TB/s (us)",
            "t_compute @peak (us)"]
    if measured_us is not None:
        head += ["measured (us)", "x floor"]
    lines = [f"#### {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]

    def row(c: OpCost, t: float | None, bold: bool = False) -> str:
        cells = [c.name, c.what, _g(c.flops / 1e9), _g(c.weight_bytes / MB), _g(c.act_bytes / MB), _g(c.bytes / MB),
                 _g(c.t_mem_us(bw)), _g(c.t_compute_us())]
        if measured_us is not None:
            cells += ["", ""] if t is None else [_g(t), f"{t / c.t_mem_us(bw):.2f}"]
        if bold:
            cells = [f"**{x}**" if x else x for x in cells]
        return "| " + " | ".join(cells) + " |"

    mu = measured_us or {}
    lines += [row(c, mu.get(c.name)) for c in costs]
    if sum_row and costs:
        t_sum = sum(mu[c.name] for c in costs) if all(c.name in mu for c in costs) else None
        lines.append(row(total(costs), t_sum, bold=True))
    return "\n".join(lines) + "\n"
