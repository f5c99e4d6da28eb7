"""The op families MegaRTP runs: one declarative row per family, the source of the opcode table.

A family is what one opcode of the persistent kernel executes. Each row declares, once:
- `slots`: what the op's row of the OperandPtrTable holds (slot i = the i-th name: a graph tensor
  name, or WORKSPACE). A graph op of this family binds the tensors it uses; other slots stay 0
  (e.g. B1 reads x_fp8/x_scale with the fp8 wk GEMM, x_bf16 with the bf16 one).
- `payload`: the names of the instruction's payload words (tile coordinates, row/column/K ranges).
- `payload_of(tile, graph, k_index)`: how the host fills them from a graph Tile.
- `split_k`: tiles are K-split partials. Every partial writes its fp32 partial into its own slice of
  the op's workspace (fp32 [num_k_splits, M, N_weight]); the last partial of its reduce group
  to arrive (a reduce counter reaching epoch x group size) sums the slices in k-split order
  (deterministic, interleaving-independent) and runs the epilogue on the group's region
  rows [m0, m1) x weight rows [g0, g1).
  `reduce_scope`: "m_block" = the group is every tile of the M block (the epilogue needs whole
  rows: B0's RMSNorms, B1's LayerNorm); "region" = the tiles writing the same region (D1: per head).
- `spec_widths`: payload (lo, hi) pairs whose widths select the compiled specialisation (spec id).
- `tile_counters`: the group's counter is followed by one sub-counter per 128-row weight tile of its
  region (plan.py counter layout); a tile's splits count there and the tile's last arriver sums the
  tile (B0: into the raw bf16 q_a / kv_a / k_pe columns).
- `finalizer`: the group's epilogue is not run by its last arriver but by finaliser tasks, one per
  token row of the group (the design article's B0 finalizer tiles; taskgraph.py makes them): each waits
  for the group's partials (an intra-op event) and writes the op's outputs for its row, so the
  consumers wait for the rows they read and the rows are finished on as many SMs as there are rows.
  A finaliser's payload is the split-K payload of its row with k_split = FINAL_K_SPLIT.

Op names of the graph select the family (OpDef.name == family name).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...graph.op_graph import GraphError, OpGraph, Tile

WORKSPACE = "workspace"
SPLIT_K_PAYLOAD = ("m0", "m1", "n0", "n1", "k0", "k1", "k_split", "g0", "g1")
FINAL_K_SPLIT = -1  # k_split of a finaliser task (families with `finalizer`)


def raw_tensor(op: str) -> str:
    """The pseudo tensor a finalizer family's partials write and its finalisers read (not a graph tensor:
    the partials' summed, not yet finished, columns)."""
    return f"{op}.raw"


def final_payload(g0: int, g1: int, m: int) -> tuple[int, ...]:
    """Split-K payload of the finaliser of token row m of a group over weight rows [g0, g1)."""
    return (m, m + 1, g0, g1, 0, 0, FINAL_K_SPLIT, g0, g1)

PayloadFn = Callable[[Tile, OpGraph, int], tuple[int, ...]]


@dataclass(frozen=True)
class OpFamily:
    name: str
    slots: tuple[str, ...]
    payload: tuple[str, ...]
    payload_of: PayloadFn
    split_k: bool = False
    weight: str | None = None  # split-K: the [N, K] weight whose rows are the workspace columns
    reduce_scope: str = "m_block"
    spec_widths: tuple[tuple[str, str], ...] = ()
    tile_counters: bool = False
    finalizer: bool = False
    doc: str = ""

    def spec_key(self, payload: tuple[int, ...]) -> tuple:
        p = dict(zip(self.payload, payload))
        return (self.name,) + tuple(p[b] - p[a] for a, b in self.spec_widths)


def _rows(tile: Tile) -> tuple[int, int]:
    """Token rows of a tile: every write region's first dim is the token (M) dim in this graph."""
    rows = {region[0] for region in tile.writes.values()}
    if len(rows) != 1:
        raise GraphError(f"{tile.op} tile {tile.index}: write regions disagree on the token rows {sorted(rows)}")
    return rows.pop()


def _split_k_payload(weight: str, scope: str) -> PayloadFn:
    def fn(tile: Tile, graph: OpGraph, k_index: int) -> tuple[int, ...]:
        if tile.k_range is None:
            raise GraphError(f"{tile.op} tile {tile.index}: split-K family but the tile has no k_range")
        m0, m1 = _rows(tile)
        n0, n1 = tile.reads[weight][0]
        g0, g1 = (0, int(graph.tensors[weight].shape[0])) if scope == "m_block" else (n0, n1)
        return (m0, m1, n0, n1, *tile.k_range, k_index, g0, g1)
    return fn


def _rows_payload(tile: Tile, graph: OpGraph, k_index: int) -> tuple[int, ...]:
    return _rows(tile)


def _d0(tile: Tile, graph: OpGraph, k_index: int) -> tuple[int, ...]:
    n0, n1 = tile.reads["w.q_b.weight"][0]
    return (*_rows(tile), tile.coords[1], n0, n1)


def _d2(tile: Tile, graph: OpGraph, k_index: int) -> tuple[int, ...]:
    r, hh, (n0, n1) = tile.writes["q_lat"]
    return (*r, hh[0], n0, n1)


def _e1(tile: Tile, graph: OpGraph, k_index: int) -> tuple[int, ...]:
    (q0, q1), (kv0, kv1) = tile.writes["logits"]
    return (tile.coords[0], q0, q1, kv0, kv1)


_GEMM_WIDTHS = (("n0", "n1"), ("k0", "k1"))

FAMILIES: tuple[OpFamily, ...] = (
    OpFamily("A0", ("hidden", "residual", "w.input_norm", "x_bf16", "residual_out", "x_fp8", "x_scale"),
             ("m0", "m1"), _rows_payload, doc="residual add + RMSNorm + FP8 quant, one token row per tile"),
    OpFamily("B0", ("x_fp8", "x_scale", "w.qkv_a.weight", "w.qkv_a.scale_inv", "w.q_a_norm", "w.kv_a_norm",
                    "q_lora", "q_lora_fp8", "q_lora_scale", "c_kv", "k_pe", WORKSPACE),
             SPLIT_K_PAYLOAD, _split_k_payload("w.qkv_a.weight", "m_block"),
             split_k=True, weight="w.qkv_a.weight", spec_widths=_GEMM_WIDTHS, tile_counters=True, finalizer=True,
             doc="QKV-A FP8 GEMM partial (its weight tile summed by the tile's last split); finaliser per token "
                 "row: q_a/kv_a RMSNorm + q_lora quant"),
    OpFamily("C0", ("x_bf16", "w.indexer.weights_proj", "w_raw", WORKSPACE),
             SPLIT_K_PAYLOAD, _split_k_payload("w.indexer.weights_proj", "m_block"),
             split_k=True, weight="w.indexer.weights_proj", spec_widths=_GEMM_WIDTHS,
             doc="head-gate bf16 GEMM partial; reduce role: bf16 round"),
    OpFamily("B1", ("x_bf16", "x_fp8", "x_scale", "w.indexer.wk.weight", "w.indexer.wk.scale_inv",
                    "w.indexer.k_norm_weight", "w.indexer.k_norm_bias", "positions", "out_cache_loc", "index_k_cache",
                    "index_k_fp8", "index_k_scale", "index_k_cache_written", WORKSPACE),
             SPLIT_K_PAYLOAD, _split_k_payload("w.indexer.wk.weight", "m_block"),
             split_k=True, weight="w.indexer.wk.weight", spec_widths=_GEMM_WIDTHS,
             doc="indexer-K GEMM partial; reduce role: LayerNorm + RoPE + quant + index-K cache store"),
    OpFamily("D1", ("q_lora_fp8", "q_lora_scale", "w_raw", "w.indexer.wq_b.weight", "w.indexer.wq_b.scale_inv",
                    "positions", "index_q_fp8", "index_q_scale", "head_w", WORKSPACE),
             SPLIT_K_PAYLOAD, _split_k_payload("w.indexer.wq_b.weight", "region"),
             split_k=True, weight="w.indexer.wq_b.weight", reduce_scope="region", spec_widths=_GEMM_WIDTHS,
             doc="indexer-Q GEMM partial; reduce role per head: RoPE + quant + head weight"),
    OpFamily("D0", ("q_lora_fp8", "q_lora_scale", "w.q_b.weight", "w.q_b.scale_inv", "positions", "q_nope", "q_pe"),
             ("m0", "m1", "head", "n0", "n1"), _d0, spec_widths=(("n0", "n1"),),
             doc="q_b_proj FP8 GEMM N tile (n = rows of w.q_b) + MLA q RoPE on the head's rope columns"),
    OpFamily("D2", ("q_nope", "c_kv", "k_pe", "w.w_kc", "positions", "out_cache_loc", "kv_cache", "q_lat",
                    "kv_cache_written"),
             ("m0", "m1", "head", "n0", "n1"), _d2, spec_widths=(("n0", "n1"),),
             doc="W_UK absorption N tile; head-0 tiles store c_kv columns (the last one also roped k_pe)"),
    OpFamily("E1", ("index_q_fp8", "head_w", "index_k_cache_written", "seq_lens", "block_table", "logits"),
             ("request", "q0", "q1", "kv0", "kv1"), _e1, doc="indexer logits of tokens [q0,q1) x KV [kv0,kv1)"),
    OpFamily("E2", ("logits", "seq_lens", "block_table", "topk_slots"), ("m0", "m1"), _rows_payload,
             doc="top-k + page-table transform, one token row per tile"),
)
