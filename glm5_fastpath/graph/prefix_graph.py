"""The GLM-5 decode attention prefix as an op graph (ops A0, B0, C0, B1, D1, D0, D2, E1, E2).

Def-use follows spec/glm5_layer.md section 3.2; each op's `ref` is the reference op of
glm5_fastpath/ref/prefix.py, and its `tiles` is the design article's decomposition
(megartp-cmp-attention-prefix section 4: at M=16, KV=8192 shared: A0 16, B0 84, C0 48, B1 8,
D1 128, D0 128, D2 256, E1 64 = 732 tiles; E2 adds one per row).

Tile decisions (all sizes are PrefixTiling fields, defaults = the article's; dims come from cfg):
- GEMM tiles are (M block, N block[, K split]); every decode M <= block_m gives one M block.
- Split-K K ranges are whole 128-column groups (the activation scale granularity); a split count
  larger than the number of groups is clamped.
- B0: N = q_lora + kv_lora + rope in block_n tiles (21 for GLM-5) x b0_split_k. The row epilogue
  (reduce, q_a/kv_a RMSNorm, q_lora quant) needs whole rows; the article leaves it unnamed.
- C0: N = 32 fits one tile; K split into H/c0_k_chunk chunks arranged (k_outer, k_inner) = 12 x 4.
  The factorization is the article's number, its meaning is inferred (spec section 8.3).
- B1: b1_split_k K splits; the last partial to land runs LayerNorm/RoPE/quant/store (one
  "cache written" event, as the article's event69 >= 1).
- D1: one N tile per indexer head (the epilogue is per head) x d1_split_k over q_lora.
- D0: per head, ceil(qk_head / block_n) N tiles (2 for GLM-5: [nope 0:128], [nope 128:192 | rope]).
- D2: per head, ceil(kv_lora / block_n) N tiles; the head-0 tiles also store the MLA KV row
  (c_kv columns, and the last one the roped k_pe).
- E1: per KV sequence (request): Q blocks of e1_q_rows/(index heads) tokens (4 at 32 heads) x KV
  splits of e1_kv_split tokens (512 = 8 pages). Shared KV (ShapeContext.shared_kv) gives the
  article's 4 x 16 = 64 at M=16, KV=8192. M independent sequences give one Q block per token and
  ceil(seq_len/512) splits each (16 x 16 = 256 at M=16, L=8192). A request's last split also writes
  the -inf tail up to max_ctx, so the logits are covered exactly once.
- E2: one tile per row.

Indexer rotation (`indexer_rotate`, default off): B1 and D1 apply the normalised 128-point Walsh-Hadamard
rotation after RoPE, before the FP8 quant (rotate=True of the reference / the ops), so the index-K cache holds
rotated keys: the format of SGLang 0.5.14's indexer (ref/prefix.py, "Hadamard rotation"). It is a property of
the serving engine's cache, not of the model, so the caller (the SGLang seam) decides it per layer; tiles,
tensors and def-use do not change (E1 reads rotated q and k alike: q.k is invariant).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..config import FP8_BLOCK, INDEX_K_PAGE_TOKENS, Glm5Config
from ..ref import prefix as P
from ..ref.fp8 import FP8, index_k_page_bytes
from ..weights import AttnWeights, Fp8Linear, IndexerWeights
from .op_graph import GraphError, OpDef, OpGraph, Region, ShapeContext, TensorDef, Tile

BF16, F32, I32, I64, U8 = torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.uint8
INDEXER_OPS = ("C0", "B1", "D1", "E1", "E2")
D2_WEIGHTS = ("bf16", "fp8")  # build_prefix_graph(d2_weights=...): the form of W_UK D2 reads
ENV_D2_WEIGHTS = "GLM5_FASTPATH_D2_WEIGHTS"  # d2_weights_request(): bf16 / fp8 / auto


def d2_weights_request() -> str:
    """GLM5_FASTPATH_D2_WEIGHTS as given (default "bf16"), validated: one of D2_WEIGHTS or "auto" (fp8 where the
    weights carry W_UK's FP8 form; attn_pre.cmp.executor.resolve_d2_weights). Read by the CMP executor, the SGLang
    seam and ops.d2_absorb.precompile."""
    from ..jit import env

    want = env.text(ENV_D2_WEIGHTS) or "bf16"
    if want not in D2_WEIGHTS + ("auto",):
        raise ValueError(f"{ENV_D2_WEIGHTS}={want!r}: expected one of {D2_WEIGHTS + ('auto',)}")
    return want


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PrefixTiling:
    block_m: int = 64  # GEMM M tile; decode M <= 64 is one block (the article's leading "1")
    block_n: int = 128  # GEMM N tile (B0, D0, D2)
    b0_split_k: int = 4  # B0: K = 6144 in 4 splits of 1536
    c0_k_chunk: int = 128  # C0: one 128-wide K chunk per tile ...
    c0_k_inner: int = 4  # ... arranged (chunks / 4) x 4 = 12 x 4
    b1_split_k: int = 4  # B1: 4 K splits of 1536 (the article: 8; 4 is faster in the megakernel, session 21 call 3)
    d1_split_k: int = 4  # D1: per head, 4 K splits of 512
    e1_q_rows: int = 128  # E1: (token, head) rows per Q block = 4 tokens x 32 heads
    e1_kv_split: int = 512  # E1: KV tokens per split (8 pages of 64)

    def __post_init__(self) -> None:
        for f, v in self.__dict__.items():
            if not isinstance(v, int) or v < 1:
                raise GraphError(f"PrefixTiling.{f} must be a positive int, got {v!r}")
        if self.block_n % FP8_BLOCK or self.c0_k_chunk % FP8_BLOCK:
            raise GraphError(f"PrefixTiling: block_n and c0_k_chunk must be multiples of {FP8_BLOCK} (scale groups)")


def _m_blocks(m: int, bm: int) -> list[tuple[int, int]]:
    return [(i, min(i + bm, m)) for i in range(0, m, bm)]


def _k_splits(k: int, parts: int, group: int = FP8_BLOCK) -> list[tuple[int, int]]:
    """`parts` (clamped to the number of groups) balanced K ranges on `group` boundaries."""
    g = _cdiv(k, group)
    parts = min(parts, g)
    bounds = [min(g * i // parts * group, k) for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def _groups(a: int, b: int) -> tuple[int, int]:
    """Scale-group columns covering element columns [a, b)."""
    return a // FP8_BLOCK, _cdiv(b, FP8_BLOCK)


# ---- weights <-> named tensors --------------------------------------------------------------------------

def _lin_tensors(prefix: str, lin: Fp8Linear) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": lin.weight, f"{prefix}.scale_inv": lin.scale_inv}


def weight_tensors(w: AttnWeights) -> dict[str, torch.Tensor]:
    """The prefix's weights as graph tensors (names `w.<AttnWeights field path>`)."""
    t = {"w.input_norm": w.input_norm, "w.q_a_norm": w.q_a_norm, "w.kv_a_norm": w.kv_a_norm, "w.w_kc": w.w_kc}
    if getattr(w, "w_kc_fp8", None) is not None:  # the FP8 form of W_UK, for graphs built with d2_weights="fp8"
        t.update({"w.w_kc_fp8": w.w_kc_fp8, "w.w_kc_scale": w.w_kc_scale})
    t.update(_lin_tensors("w.qkv_a", w.qkv_a))
    t.update(_lin_tensors("w.q_b", w.q_b))
    if w.indexer is not None:
        i = w.indexer
        t.update(_lin_tensors("w.indexer.wq_b", i.wq_b))
        t.update(_lin_tensors("w.indexer.wk", i.wk))
        t.update({"w.indexer.k_norm_weight": i.k_norm_weight, "w.indexer.k_norm_bias": i.k_norm_bias,
                  "w.indexer.weights_proj": i.weights_proj})
    return t


def _lin_view(ins: Mapping[str, torch.Tensor], prefix: str) -> Fp8Linear | None:
    if f"{prefix}.weight" not in ins:
        return None
    return Fp8Linear(ins[f"{prefix}.weight"], ins[f"{prefix}.scale_inv"])


def _weights_view(ins: Mapping[str, torch.Tensor]) -> AttnWeights:
    """AttnWeights holding only the weights the op declared as inputs (others None): an op that
    reads an undeclared weight fails instead of silently working."""
    idx = IndexerWeights(wq_b=_lin_view(ins, "w.indexer.wq_b"), wk=_lin_view(ins, "w.indexer.wk"),
                         k_norm_weight=ins.get("w.indexer.k_norm_weight"), k_norm_bias=ins.get("w.indexer.k_norm_bias"),
                         weights_proj=ins.get("w.indexer.weights_proj"))
    return AttnWeights(input_norm=ins.get("w.input_norm"), qkv_a=_lin_view(ins, "w.qkv_a"),
                       q_a_norm=ins.get("w.q_a_norm"), kv_a_norm=ins.get("w.kv_a_norm"), q_b=_lin_view(ins, "w.q_b"),
                       w_kc=ins.get("w.w_kc"), w_vc=None, o_proj=None, indexer=idx,
                       w_kc_fp8=ins.get("w.w_kc_fp8"), w_kc_scale=ins.get("w.w_kc_scale"))


def _wdef(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> TensorDef:
    return TensorDef(name, shape, dtype, "weight")


def _fp8_wdefs(prefix: str, n: int, k: int) -> list[TensorDef]:
    return [_wdef(f"{prefix}.weight", (n, k), FP8), _wdef(f"{prefix}.scale_inv", (_cdiv(n, 128), _cdiv(k, 128)), F32)]


# ---- the graph --------------------------------------------------------------------------------------------

def build_prefix_graph(cfg: Glm5Config, full_indexer: bool = True, tiling: PrefixTiling = PrefixTiling(),
                       indexer_k_gemm: str = "fp8", impl=None, indexer_rotate: bool = False,
                       d2_weights: str = "bf16") -> OpGraph:
    """The prefix graph; full_indexer=False is a GLM-5.2 shared layer (no C0/B1/D1/E1/E2; topk_slots
    becomes a caller-supplied input: the previous full layer's top-k).

    impl: the namespace the ops call (default the reference, glm5_fastpath.ref.prefix); any namespace
    with the same function names and signatures works, e.g. glm5_fastpath.ops (the kernels).
    indexer_rotate: B1 / D1 with the Hadamard rotation (module doc); passed to the ops only when on, so a
    namespace without the `rotate` argument still builds the default graph.
    d2_weights: W_UK as D2 reads it: "bf16" (w.w_kc, SGLang's load-time dequant) or "fp8" (w.w_kc_fp8 +
    w.w_kc_scale, the checkpoint's kv_b bytes: half the weight bytes, the same q_lat bit for bit; see
    ref.fp8.w_kc_fp8_from_kv_b)."""
    impl = P if impl is None else impl
    if d2_weights not in D2_WEIGHTS:
        raise GraphError(f"d2_weights must be one of {D2_WEIGHTS}, got {d2_weights!r}")
    d2_fp8 = d2_weights == "fp8"
    if indexer_k_gemm not in ("fp8", "bf16"):
        raise GraphError(f"indexer_k_gemm must be 'fp8' or 'bf16', got {indexer_k_gemm!r}")
    if not isinstance(indexer_rotate, bool):
        raise GraphError(f"indexer_rotate must be a bool, got {indexer_rotate!r}")
    if indexer_rotate and (cfg.index_head_dim < 1 or cfg.index_head_dim & (cfg.index_head_dim - 1)):
        raise GraphError(f"indexer_rotate needs a power-of-two index_head_dim, got {cfg.index_head_dim}")
    rot_kw = {"rotate": True} if indexer_rotate else {}
    c, tp = cfg, tiling
    H, Q, KVL, R = c.hidden_size, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim
    NH, NOPE, QKH = c.num_attention_heads, c.qk_nope_head_dim, c.qk_head_dim
    HI, DI, NQKV, KVD = c.index_n_heads, c.index_head_dim, c.qkv_a_out, c.kv_cache_dim
    TOPK, PAGE = c.index_topk, INDEX_K_PAGE_TOKENS
    HG, QG = H // FP8_BLOCK, Q // FP8_BLOCK

    T = TensorDef
    tensors = [
        # step inputs
        T("hidden", ("M", H), BF16, "input", doc="previous layer output"),
        T("residual", ("M", H), BF16, "input"),
        T("positions", ("M",), I64, "input"),
        T("out_cache_loc", ("M",), I64, "input", doc="physical slot of each new token (both caches)"),
        T("seq_lens", ("M",), I32, "input", doc="KV length incl. the new token"),
        T("block_table", ("M", "max_pages"), I32, "input", doc="64-token pages"),
        # caches and their in-place versions (region row m = slot out_cache_loc[m])
        T("kv_cache", ("num_slots", KVD), BF16, "cache"),
        T("kv_cache_written", ("num_slots", KVD), BF16, "cache", inplace_of="kv_cache", region_shape=("M", KVD)),
        T("index_k_cache", ("num_pages", index_k_page_bytes(DI)), U8, "cache"),
        T("index_k_cache_written", ("num_pages", index_k_page_bytes(DI)), U8, "cache", inplace_of="index_k_cache",
          region_shape=("M", DI + 4), doc="region: D_i fp8 bytes + 4 scale bytes of token m"),
        # weights
        _wdef("w.input_norm", (H,), BF16), *_fp8_wdefs("w.qkv_a", NQKV, H), _wdef("w.q_a_norm", (Q,), BF16),
        _wdef("w.kv_a_norm", (KVL,), BF16), *_fp8_wdefs("w.q_b", NH * QKH, Q), *((_wdef("w.w_kc_fp8", (NH, NOPE, KVL), FP8), _wdef("w.w_kc_scale", (NH, NOPE, _cdiv(KVL, 128)), F32)) if d2_fp8
          else (_wdef("w.w_kc", (NH, NOPE, KVL), BF16),)),
        _wdef("w.indexer.weights_proj", (HI, H), BF16), *_fp8_wdefs("w.indexer.wk", DI, H),
        _wdef("w.indexer.k_norm_weight", (DI,), F32), _wdef("w.indexer.k_norm_bias", (DI,), F32),
        *_fp8_wdefs("w.indexer.wq_b", HI * DI, Q),
        # intermediates
        T("x_bf16", ("M", H), BF16, "intermediate"), T("x_fp8", ("M", H), FP8, "intermediate"),
        T("x_scale", ("M", HG), F32, "intermediate"),
        T("q_lora", ("M", Q), BF16, "intermediate"), T("q_lora_fp8", ("M", Q), FP8, "intermediate"),
        T("q_lora_scale", ("M", QG), F32, "intermediate"),
        T("c_kv", ("M", KVL), BF16, "intermediate"), T("k_pe", ("M", R), BF16, "intermediate", doc="not roped"),
        T("w_raw", ("M", HI), BF16, "intermediate"),
        T("index_k_fp8", ("M", DI), FP8, "intermediate"), T("index_k_scale", ("M",), F32, "intermediate"),
        T("index_q_fp8", ("M", HI, DI), FP8, "intermediate"), T("index_q_scale", ("M", HI), F32, "intermediate"),
        T("head_w", ("M", HI), F32, "intermediate"),
        T("q_nope", ("M", NH, NOPE), BF16, "intermediate"),
        T("logits", ("M", "max_ctx"), F32, "intermediate"),
        # results the sparse MLA core consumes
        T("residual_out", ("M", H), BF16, "output"),
        T("q_pe", ("M", NH, R), BF16, "output", doc="roped"),
        T("q_lat", ("M", NH, KVL), BF16, "output"),
        T("topk_slots", ("M", TOPK), I32, "output", doc="physical KV slots, -1 padded"),
    ]

    # ---- refs: adapters from named tensors to the reference ops ----
    def ref_a0(i):
        x, r, x8, xs = impl.a0_add_rmsnorm_quant(i["hidden"], i["residual"], i["w.input_norm"], c.rms_norm_eps)
        return {"x_bf16": x, "residual_out": r, "x_fp8": x8, "x_scale": xs}

    def ref_b0(i):
        return impl.b0_qkv_a(i["x_fp8"], i["x_scale"], _weights_view(i), c)

    def ref_c0(i):
        return {"w_raw": impl.c0_head_gate(i["x_bf16"], i["w.indexer.weights_proj"])}

    def ref_b1(i):
        k8, s = impl.b1_indexer_k(i.get("x_bf16"), i.get("x_fp8"), i.get("x_scale"), _weights_view(i).indexer,
                               i["positions"], i["out_cache_loc"], i["index_k_cache"], c, gemm=indexer_k_gemm, **rot_kw)
        return {"index_k_fp8": k8, "index_k_scale": s, "index_k_cache_written": i["index_k_cache"]}

    def ref_d1(i):
        q8, s, hw = impl.d1_indexer_q(i["q_lora_fp8"], i["q_lora_scale"], i["w_raw"], _weights_view(i).indexer,
                                   i["positions"], c, **rot_kw)
        return {"index_q_fp8": q8, "index_q_scale": s, "head_w": hw}

    def ref_d0(i):
        q_nope, q_pe = impl.d0_q_b(i["q_lora_fp8"], i["q_lora_scale"], _weights_view(i), i["positions"], c)
        return {"q_nope": q_nope, "q_pe": q_pe}

    def ref_d2(i):
        q_lat = impl.d2_absorb_and_kv_store(i["q_nope"], i["c_kv"], i["k_pe"], _weights_view(i), i["positions"],
                                         i["out_cache_loc"], i["kv_cache"], c)
        return {"q_lat": q_lat, "kv_cache_written": i["kv_cache"]}

    def ref_e1(i):
        return {"logits": impl.e1_indexer_logits(i["index_q_fp8"], i["head_w"], i["index_k_cache_written"],
                                              i["seq_lens"], i["block_table"], c)}

    def ref_e2(i):
        return {"topk_slots": impl.e2_topk(i["logits"], i["seq_lens"], i["block_table"], TOPK)}

    # ---- tiles ----
    def tiles_a0(ctx: ShapeContext) -> list[Tile]:
        out = []
        for m in range(ctx.M):
            r = (m, m + 1)
            out.append(Tile("A0", m, (m,), writes={"x_bf16": (r, (0, H)), "residual_out": (r, (0, H)),
                                                   "x_fp8": (r, (0, H)), "x_scale": (r, (0, HG))},
                            reads={"hidden": (r, (0, H)), "residual": (r, (0, H))}))
        return out

    def tiles_b0(ctx: ShapeContext) -> list[Tile]:
        out = []
        pieces = (("q_lora", 0, Q), ("c_kv", Q, Q + KVL), ("k_pe", Q + KVL, NQKV))
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            for nb, n0 in enumerate(range(0, NQKV, tp.block_n)):
                n1 = min(n0 + tp.block_n, NQKV)
                writes: dict[str, Region] = {}
                for name, a, b in pieces:
                    lo, hi = max(n0, a), min(n1, b)
                    if lo < hi:
                        writes[name] = ((m0, m1), (lo - a, hi - a))
                        if name == "q_lora":
                            writes["q_lora_fp8"] = writes[name]
                            writes["q_lora_scale"] = ((m0, m1), _groups(lo, hi))
                for ks, (k0, k1) in enumerate(_k_splits(H, tp.b0_split_k)):
                    reads = {"x_fp8": ((m0, m1), (k0, k1)), "x_scale": ((m0, m1), _groups(k0, k1)),
                             "w.qkv_a.weight": ((n0, n1), (k0, k1)), "w.qkv_a.scale_inv": (_groups(n0, n1), _groups(k0, k1))}
                    out.append(Tile("B0", len(out), (mb, nb, ks), writes, reads, k_range=(k0, k1)))
        return out

    def tiles_c0(ctx: ShapeContext) -> list[Tile]:
        out = []
        chunks = [(k, min(k + tp.c0_k_chunk, H)) for k in range(0, H, tp.c0_k_chunk)]
        inner = min(tp.c0_k_inner, len(chunks))
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            for kc, (k0, k1) in enumerate(chunks):
                out.append(Tile("C0", len(out), (mb, kc // inner, kc % inner), {"w_raw": ((m0, m1), (0, HI))},
                                {"x_bf16": ((m0, m1), (k0, k1)), "w.indexer.weights_proj": ((0, HI), (k0, k1))},
                                k_range=(k0, k1)))
        return out

    def tiles_b1(ctx: ShapeContext) -> list[Tile]:
        out = []
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            r = (m0, m1)
            writes = {"index_k_fp8": (r, (0, DI)), "index_k_scale": (r,), "index_k_cache_written": (r, (0, DI + 4))}
            for ks, (k0, k1) in enumerate(_k_splits(H, tp.b1_split_k)):
                reads = ({"x_fp8": (r, (k0, k1)), "x_scale": (r, _groups(k0, k1))} if indexer_k_gemm == "fp8"
                         else {"x_bf16": (r, (k0, k1))})
                reads.update({"w.indexer.wk.weight": ((0, DI), (k0, k1)), "positions": (r,), "out_cache_loc": (r,)})
                out.append(Tile("B1", len(out), (mb, ks), writes, reads, k_range=(k0, k1)))
        return out

    def tiles_d1(ctx: ShapeContext) -> list[Tile]:
        out = []
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            r = (m0, m1)
            for h in range(HI):
                hh = (h, h + 1)
                writes = {"index_q_fp8": (r, hh, (0, DI)), "index_q_scale": (r, hh), "head_w": (r, hh)}
                for ks, (k0, k1) in enumerate(_k_splits(Q, tp.d1_split_k)):
                    reads = {"q_lora_fp8": (r, (k0, k1)), "q_lora_scale": (r, _groups(k0, k1)), "w_raw": (r, hh),
                             "w.indexer.wq_b.weight": ((h * DI, (h + 1) * DI), (k0, k1)), "positions": (r,)}
                    out.append(Tile("D1", len(out), (mb, h, ks), writes, reads, k_range=(k0, k1)))
        return out

    def tiles_d0(ctx: ShapeContext) -> list[Tile]:
        out = []
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            r = (m0, m1)
            for h in range(NH):
                hh = (h, h + 1)
                for nt, c0 in enumerate(range(0, QKH, tp.block_n)):
                    c1 = min(c0 + tp.block_n, QKH)
                    writes: dict[str, Region] = {}
                    if c0 < NOPE:
                        writes["q_nope"] = (r, hh, (c0, min(c1, NOPE)))
                    if c1 > NOPE:
                        writes["q_pe"] = (r, hh, (max(c0, NOPE) - NOPE, c1 - NOPE))
                    reads = {"q_lora_fp8": (r, (0, Q)), "q_lora_scale": (r, (0, QG)),
                             "w.q_b.weight": ((h * QKH + c0, h * QKH + c1), (0, Q)), "positions": (r,)}
                    out.append(Tile("D0", len(out), (mb, h, nt), writes, reads))
        return out

    def tiles_d2(ctx: ShapeContext) -> list[Tile]:
        out = []
        n_tiles = list(range(0, KVL, tp.block_n))
        for mb, (m0, m1) in enumerate(_m_blocks(ctx.M, tp.block_m)):
            r = (m0, m1)
            for h in range(NH):
                hh = (h, h + 1)
                for nt, n0 in enumerate(n_tiles):
                    n1 = min(n0 + tp.block_n, KVL)
                    writes: dict[str, Region] = {"q_lat": (r, hh, (n0, n1))}
                    reads: dict[str, Region] = {"q_nope": (r, hh, (0, NOPE))}
                    if d2_fp8:
                        reads.update({"w.w_kc_fp8": (hh, (0, NOPE), (n0, n1)),
                                      "w.w_kc_scale": (hh, (0, NOPE), (n0 // 128, _cdiv(n1, 128)))})
                    else:
                        reads["w.w_kc"] = (hh, (0, NOPE), (n0, n1))
                    if h == 0:  # head-0 tiles also store the MLA KV row; the last one takes the roped k_pe too
                        last = nt == len(n_tiles) - 1
                        writes["kv_cache_written"] = (r, (n0, KVD if last else n1))
                        reads.update({"c_kv": (r, (n0, n1)), "out_cache_loc": (r,)})
                        if last:
                            reads.update({"k_pe": (r, (0, R)), "positions": (r,)})
                    out.append(Tile("D2", len(out), (mb, h, nt), writes, reads))
        return out

    def tiles_e1(ctx: ShapeContext) -> list[Tile]:
        out = []
        tok_per_block = max(1, tp.e1_q_rows // HI)
        split = tp.e1_kv_split
        for req, (t0, t1, kv_len) in enumerate(ctx.requests()):
            n_splits = max(1, _cdiv(kv_len, split))
            for qb, q0 in enumerate(range(t0, t1, tok_per_block)):
                q1 = min(q0 + tok_per_block, t1)
                r = (q0, q1)
                for s in range(n_splits):
                    k0 = s * split
                    k1 = min(k0 + split, kv_len) if s < n_splits - 1 else ctx.max_ctx  # last split: -inf tail too
                    reads = {"index_q_fp8": (r, (0, HI), (0, DI)), "head_w": (r, (0, HI)), "seq_lens": (r,),
                             "block_table": (r, (k0 // PAGE, max(k0 // PAGE, _cdiv(min(k1, kv_len), PAGE))))}
                    out.append(Tile("E1", len(out), (req, qb, s), {"logits": (r, (k0, k1))}, reads))
        return out

    def tiles_e2(ctx: ShapeContext) -> list[Tile]:
        return [Tile("E2", m, (m,), {"topk_slots": ((m, m + 1), (0, TOPK))},
                     {"logits": ((m, m + 1), (0, ctx.max_ctx)), "seq_lens": ((m, m + 1),)})
                for m in range(ctx.M)]

    fp8_w = lambda p: (f"{p}.weight", f"{p}.scale_inv")  # noqa: E731
    b1_x = ("x_fp8", "x_scale") if indexer_k_gemm == "fp8" else ("x_bf16",)
    ops = [
        OpDef("A0", ("hidden", "residual", "w.input_norm"), ("x_bf16", "residual_out", "x_fp8", "x_scale"),
              ref_a0, tiles_a0, ("token",), doc="residual add + RMSNorm + 1x128 FP8 quant"),
        OpDef("B0", ("x_fp8", "x_scale", *fp8_w("w.qkv_a"), "w.q_a_norm", "w.kv_a_norm"),
              ("q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe"), ref_b0, tiles_b0,
              ("m_block", "n_block", "k_split"), reduce_extent=H,
              doc="QKV-A FP8 GEMM; row epilogue after the K reduce: q_a/kv_a RMSNorm, q_lora quant"),
        OpDef("C0", ("x_bf16", "w.indexer.weights_proj"), ("w_raw",), ref_c0, tiles_c0,
              ("m_block", "k_outer", "k_inner"), reduce_extent=H, doc="head gate bf16 GEMM, K-split partials reduced for D1"),
        OpDef("B1", (*b1_x, *fp8_w("w.indexer.wk"), "w.indexer.k_norm_weight", "w.indexer.k_norm_bias",
                     "positions", "out_cache_loc", "index_k_cache"),
              ("index_k_fp8", "index_k_scale", "index_k_cache_written"), ref_b1, tiles_b1, ("m_block", "k_split"),
              reduce_extent=H, doc=f"indexer K: wk GEMM ({indexer_k_gemm}) + LayerNorm + RoPE"
                                   f"{' + Hadamard' if indexer_rotate else ''} + quant + cache store"),
        OpDef("D1", ("q_lora_fp8", "q_lora_scale", "w_raw", *fp8_w("w.indexer.wq_b"), "positions"),
              ("index_q_fp8", "index_q_scale", "head_w"), ref_d1, tiles_d1, ("m_block", "head", "k_split"),
              reduce_extent=Q, doc=f"indexer Q: wq_b GEMM + RoPE{' + Hadamard' if indexer_rotate else ''} + per-head quant "
                                   "+ head weights"),
        OpDef("D0", ("q_lora_fp8", "q_lora_scale", *fp8_w("w.q_b"), "positions"), ("q_nope", "q_pe"), ref_d0, tiles_d0,
              ("m_block", "head", "n_block"), doc="q_b_proj FP8 GEMM + MLA q RoPE"),
        OpDef("D2", ("q_nope", "c_kv", "k_pe", *(("w.w_kc_fp8", "w.w_kc_scale") if d2_fp8 else ("w.w_kc",)),
                     "positions", "out_cache_loc", "kv_cache"),
              ("q_lat", "kv_cache_written"), ref_d2, tiles_d2, ("m_block", "head", "n_block"),
              doc=f"W_UK absorption ({d2_weights} W_UK) + k_pe RoPE + MLA KV store"),
        OpDef("E1", ("index_q_fp8", "head_w", "index_k_cache_written", "seq_lens", "block_table"), ("logits",),
              ref_e1, tiles_e1, ("request", "q_block", "kv_split"), doc="paged MQA indexer logits"),
        OpDef("E2", ("logits", "seq_lens", "block_table"), ("topk_slots",), ref_e2, tiles_e2, ("token",),
              doc="top-k + page-table transform"),
    ]
    g = OpGraph(ops, tensors, name=f"glm5_prefix[{'full' if full_indexer else 'shared'}{',rotated' if indexer_rotate and full_indexer else ''}"
                                   f"{',d2fp8' if d2_fp8 else ''}]")
    if not full_indexer:
        g = g.without(INDEXER_OPS, retype={"topk_slots": "input"}, name=g.name)
    return g.validate()


def prefix_graph_for_layer(cfg: Glm5Config, layer: int, tiling: PrefixTiling = PrefixTiling(),
                           indexer_k_gemm: str = "fp8", indexer_rotate: bool = False) -> OpGraph:
    return build_prefix_graph(cfg, cfg.is_full_indexer_layer(layer), tiling, indexer_k_gemm,
                              indexer_rotate=indexer_rotate)


def prefix_env(graph: OpGraph, *, hidden: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
               out_cache_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, w: AttnWeights,
               kv_cache: torch.Tensor, index_k_cache: torch.Tensor | None = None,
               prev_topk: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The caller-supplied tensors of `graph` (inputs, weights, caches) by name."""
    env = {"hidden": hidden, "residual": residual, "positions": positions, "out_cache_loc": out_cache_loc,
           "seq_lens": seq_lens, "block_table": block_table, "kv_cache": kv_cache}
    if index_k_cache is not None:
        env["index_k_cache"] = index_k_cache
    if prev_topk is not None:
        env["topk_slots"] = prev_topk
    env.update(weight_tensors(w))
    need = set(graph.external_tensors())
    return {k: v for k, v in env.items() if k in need}


def op_impls(cfg: Glm5Config, impl, *, full_indexer: bool = True, indexer_k_gemm: str = "fp8",
             indexer_rotate: bool = False) -> dict:
    """Per-op callables (named tensors in -> named tensors out) bound to `impl`, for run_eager(impls=...)."""
    g = build_prefix_graph(cfg, full_indexer=full_indexer, indexer_k_gemm=indexer_k_gemm, impl=impl,
                           indexer_rotate=indexer_rotate)
    return {name: op.ref for name, op in g.ops.items()}
