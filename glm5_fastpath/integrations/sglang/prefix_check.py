"""Shadow check of the prefix route inside a live SGLang model (eager decode, host syncs allowed).

`PrefixCheck(executor)` is an executor for patch.EXECUTORS["prefix"]: on every routed call it runs our
prefix AND SGLang's original forward_absorb_prepare on the same inputs and the same cache state, compares
everything the seam hands on, and returns SGLang's tuple (so the model's results stay the stock ones):

1. snapshot the index-K pages the step writes (pages of out_cache_loc);
2. ours -> tuple A; read the new tokens' index-K entries (e4m3 bytes + fp32 scale); check that no other
   byte of those pages changed; restore the pages;
3. SGLang's original -> tuple B; read the entries again;
4. compare: q_pe, k_pe, q_nope_out, k_nope (relative error), top-k (same form, same count of valid
   entries per row, per-row set overlap), index-K entries (dequantized relative error, bytes equal share),
   and, when the pool has set_mla_kv_buffer, the latent-KV bytes SGLang's backend stores from each
   tuple (written through the pool's own method, read back, stock's written last);
5. append one record (a dict) to `records`.

Used by scripts/h200_prefix_route_check.py on the H200 and by the CPU tests with faithful fakes.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ...config import INDEX_K_PAGE_TOKENS
from ...ref.fp8 import index_k_cache_load
from ...testing.numerics import THRESHOLDS, calc_diff, rel_err
from . import prefix_adapter as A
from .prefix_executor import PrefixExecutor, _bind_prepare

PAGE = INDEX_K_PAGE_TOKENS
TENSORS = (("q_pe", 0), ("k_pe", 1), ("q_nope_out", 2), ("k_nope", 3))
# pass criteria (ours vs SGLang; FP8 noise: the indexer key is an FP8 GEMM in ours, a bf16 GEMM in SGLang 0.5.23)
TOL = {"tensor_rel_err": THRESHOLDS["fp8_same_quant"], "index_k_rel_err": THRESHOLDS["fp8_vs_exact"],
       "mla_rel_err": THRESHOLDS["fp8_same_quant"], "topk_overlap": 0.95}


def _index_buffer(attn: Any, fb: Any) -> torch.Tensor | None:
    backend = A.attn_backend(fb)
    pool = getattr(backend, "token_to_kv_pool", None) or getattr(fb, "token_to_kv_pool", None)
    get = getattr(pool, "get_index_k_with_scale_buffer", None)
    if get is None:
        return None
    try:
        buf = get(attn.layer_id)
    except Exception:  # noqa: BLE001 - a shared layer's 0-row placeholder etc.
        return None
    return buf if isinstance(buf, torch.Tensor) and buf.numel() else None


def _clone(t: Any) -> Any:
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def topk_compare(ours: torch.Tensor, stock: torch.Tensor, pad: int = -1) -> dict[str, Any]:
    """Set overlap per row, equal valid counts, pad placement; -> metrics."""
    o, s = ours.detach().cpu(), stock.detach().cpu()
    out: dict[str, Any] = {"topk_shape_equal": tuple(o.shape) == tuple(s.shape) and o.dtype == s.dtype}
    if not out["topk_shape_equal"]:
        out.update(topk_overlap=0.0, topk_min_row_overlap=0.0, topk_valid_counts_equal=False)
        return out
    fr, counts_ok, dup = [], True, False
    for orow, srow in zip(o.tolist(), s.tolist()):
        ov, sv = [v for v in orow if v != pad], [v for v in srow if v != pad]
        counts_ok &= len(ov) == len(sv) and orow[len(ov):] == [pad] * (len(orow) - len(ov))
        dup |= len(set(ov)) != len(ov)
        fr.append(1.0 if not sv else len(set(ov) & set(sv)) / len(set(sv)))
    out.update(topk_overlap=sum(fr) / max(len(fr), 1), topk_min_row_overlap=min(fr) if fr else 1.0,
               topk_valid_counts_equal=counts_ok, topk_duplicates=dup)
    return out


def _index_entries(buf: torch.Tensor, loc: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    k8, s = index_k_cache_load(buf, loc, d)
    return k8.clone(), s.clone()


def _mla_rows(attn: Any, fb: Any, loc: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor | None:
    backend = A.attn_backend(fb)
    pool = getattr(backend, "token_to_kv_pool", None) or getattr(fb, "token_to_kv_pool", None)
    if not (hasattr(pool, "set_mla_kv_buffer") and hasattr(pool, "get_key_buffer")):
        return None
    pool.set_mla_kv_buffer(attn.attn_mqa, loc, k_nope, k_pe)
    return pool.get_key_buffer(attn.attn_mqa.layer_id)[loc.long()].clone()


class PrefixCheck:
    def __init__(self, executor: PrefixExecutor, records: list | None = None,
                 on_record: Callable[[dict], None] | None = None) -> None:
        self.ex = executor
        self.records = [] if records is None else records
        self.on_record = on_record

    def _add(self, rec: dict) -> None:
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def __call__(self, original: Callable, *args, **kwargs):
        attn = original.__self__
        route = self.ex.layer_route(attn)
        if route.refusal is not None:
            self._add({"layer": route.layer_id, "route": "stock", "reason": route.refusal.reason,
                       "detail": route.refusal.message(), "passed": None})
            return original(*args, **kwargs)
        b = _bind_prepare(args, kwargs)
        v = self.ex.call_refusal(attn, route, b)
        if isinstance(v, A.Refusal):
            self._add({"layer": route.layer_id, "route": "stock", "reason": v.reason, "detail": v.message(),
                       "passed": None})
            return original(*args, **kwargs)
        fb, cfg = b["forward_batch"], self.ex.cfg
        loc = v.out_cache_loc
        buf = _index_buffer(attn, fb)
        d = cfg.index_head_dim
        pages = snap = None
        if buf is not None:
            pages = torch.unique(loc.long() // PAGE)
            snap = buf[pages].clone()
        try:
            ours = list(self.ex.run(attn, route, v, b))
        except Exception as e:  # noqa: BLE001 - a failing route is a finding, not a crash of the step
            if buf is not None:
                buf[pages] = snap
            self._add({"layer": route.layer_id, "route": route.kind, "M": v.m, "passed": False,
                       "failures": [f"ours raised {type(e).__name__}: {e}"]})
            return original(*args, **kwargs)
        for i in (0, 1, 2, 3, 7):  # our outputs; the pass-through elements must stay the very objects
            ours[i] = _clone(ours[i])
        rec: dict[str, Any] = {"layer": route.layer_id, "route": route.kind, "M": v.m,
                               "topk_physical": v.topk_physical if route.kind == "full" else None}
        if v.seq_lens is not None:
            rec["max_seq_len"] = int(v.seq_lens.max())
        if buf is not None:
            ours_idx = _index_entries(buf, loc, d)
            after = buf[pages].clone()
            # only the new tokens' entries may change: mask them out and compare the rest of the pages
            keep = torch.ones_like(after, dtype=torch.bool)
            row = {int(p): i for i, p in enumerate(pages.tolist())}
            for slot in loc.long().tolist():
                r, off = row[slot // PAGE], slot % PAGE
                keep[r, off * d:(off + 1) * d] = False
                keep[r, PAGE * d + off * 4: PAGE * d + off * 4 + 4] = False
            rec["index_k_other_bytes_untouched"] = bool(torch.equal(after[keep], snap[keep]))
            buf[pages] = snap
        stock = original(*args, **kwargs)
        stock = tuple(stock)
        rec["tuple_len_equal"] = len(ours) == len(stock)
        rec["passthrough_equal"] = all(ours[i] is stock[i] or (ours[i] is None and stock[i] is None)
                                       for i in (4, 5, 6, 8)) and all(x is None for x in ours[9:])
        fails = []
        for name, i in TENSORS:
            a, s = ours[i], stock[i]
            ok_shape = tuple(a.shape) == tuple(s.shape) and a.dtype == s.dtype
            e = rel_err(a, s) if ok_shape else float("inf")
            rec[f"{name}_rel_err"], rec[f"{name}_calc_diff"] = e, calc_diff(a, s) if ok_shape else 1.0
            if not e <= TOL["tensor_rel_err"]:
                fails.append(f"{name} rel_err={e:.3e}")
        rec.update(topk_compare(ours[7], stock[7]))
        if not (rec["topk_valid_counts_equal"] and not rec.get("topk_duplicates")
                and rec["topk_overlap"] >= TOL["topk_overlap"]):
            fails.append(f"topk overlap={rec['topk_overlap']:.4f} counts_equal={rec['topk_valid_counts_equal']}")
        if buf is not None:
            st_idx = _index_entries(buf, loc, d)
            deq = lambda e: e[0].float() * e[1][:, None]  # noqa: E731
            rec["index_k_rel_err"] = rel_err(deq(ours_idx), deq(st_idx))
            rec["index_k_bytes_equal_frac"] = float((ours_idx[0].view(torch.uint8) == st_idx[0].view(torch.uint8))
                                                    .float().mean())
            rec["index_k_scale_rel_err"] = rel_err(ours_idx[1], st_idx[1])
            if not rec["index_k_rel_err"] <= TOL["index_k_rel_err"] or not rec["index_k_other_bytes_untouched"]:
                fails.append(f"index-K rel_err={rec['index_k_rel_err']:.3e} "
                             f"others_untouched={rec['index_k_other_bytes_untouched']}")
        ours_rows = _mla_rows(attn, fb, loc, ours[3], ours[1])
        if ours_rows is not None:
            stock_rows = _mla_rows(attn, fb, loc, stock[3], stock[1])  # stock's bytes stay, as the backend rewrites them
            if ours_rows.dtype in (torch.bfloat16, torch.float16, torch.float32):
                rec["mla_kv_rel_err"] = rel_err(ours_rows, stock_rows)
            else:
                rec["mla_kv_rel_err"] = None
            rec["mla_kv_bytes_equal_frac"] = float((ours_rows.view(torch.uint8) == stock_rows.view(torch.uint8))
                                                   .float().mean())
            if rec["mla_kv_rel_err"] is not None and not rec["mla_kv_rel_err"] <= TOL["mla_rel_err"]:
                fails.append(f"MLA KV rel_err={rec['mla_kv_rel_err']:.3e}")
        if not rec["tuple_len_equal"] or not rec["passthrough_equal"]:
            fails.append("tuple layout differs")
        rec["failures"], rec["passed"] = fails, not fails
        self._add(rec)
        return stock
