"""Static step inputs shared by every bucket's graph, bucket choice, and padding rows.

One set of input buffers sized for the largest bucket is allocated once; bucket b's graph is
captured on the views [:b] of them (so the addresses never change and rebinding a block table is a
copy). `load(m, bucket, inputs)` copies a step of m <= bucket rows into rows [:m] and writes
padding rows [m:bucket]:

| input | padding row value | why |
|---|---|---|
| hidden, residual | 0 | finite everywhere (RMSNorm of 0 is 0); the pad rows' outputs are deterministic |
| positions | 0 | a 1-token sequence at position 0 |
| out_cache_loc | pad_slot + row % 64 | B1 and D2 write the pad token's KV / index-K entries inside the reserved page, never into a real slot |
| seq_lens | 1 | E1 / E2 read exactly one token: logical 0 = row 0 of block_table[row, 0] |
| block_table | pad_page in every column (at allocation) | that token is pad_slot itself (pad_slot = pad_page * 64, see below) |
| topk_slots (shared layer input) | -1 | "no slot" |

pad_slot must be the first slot of a page reserved for padding (pad_slot % 64 == 0). Pad rows get
distinct slots of that page while there are <= 64 of them (the reference ops refuse duplicate slots);
past 64 they repeat, which the kernels tolerate (all pad rows compute identical entries from identical
inputs, so whichever write wins is the same bytes). E1 / E2 of a pad row read logical token 0 = slot
pad_slot (whatever the reserved page holds: finite or not, it only feeds that pad row's outputs). SGLang reserves slot 0 for padded
tokens: pass pad_slot=0 there.

Only the rows that held real data since the last load are re-padded (the buffers track a high-water
mark), and block-table rows are never re-padded: a stale block-table row of a pad token points at
real pages that E1 / E2 only READ (the writes of pad rows go to out_cache_loc = pad_slot), so the
bound table (rebind(block_table=...)) survives steps that omit it. Block-table columns [P:max_pages] of real rows are filled with
pad_page too (never read for seq_len <= 64 * P, the caller's contract).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ...config import INDEX_K_PAGE_TOKENS, Glm5Config

PAGE = INDEX_K_PAGE_TOKENS
BF16, I32, I64 = torch.bfloat16, torch.int32, torch.int64


class StagingError(ValueError):
    """Wrong step inputs (shape, dtype, device, M) for the executor."""


def check_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    b = tuple(int(x) for x in buckets)
    if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
        raise StagingError(f"buckets must be a non-empty strictly increasing list of positive ints, got {buckets}")
    return b


def pick_bucket(m: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= m."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise StagingError(f"M must be a positive int, got {m!r}")
    for b in buckets:
        if m <= b:
            return b
    raise StagingError(f"M={m} exceeds the largest bucket {buckets[-1]}: capture a larger bucket "
                       f"(buckets={tuple(buckets)}) or split the step")


def input_specs(cfg: Glm5Config, rows: int, max_pages: int, shared_layer: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    h = cfg.hidden_size
    specs = {"hidden": ((rows, h), BF16), "residual": ((rows, h), BF16), "positions": ((rows,), I64),
             "out_cache_loc": ((rows,), I64), "seq_lens": ((rows,), I32), "block_table": ((rows, max_pages), I32)}
    if shared_layer:
        specs["topk_slots"] = ((rows, cfg.index_topk), I32)
    return specs


PAD_VALUES = {"hidden": 0, "residual": 0, "positions": 0, "seq_lens": 1, "topk_slots": -1}


class StaticInputs:
    """The executor's input buffers (largest bucket rows) and the padding rule."""

    def __init__(self, cfg: Glm5Config, buckets: Sequence[int], max_pages: int, pad_slot: int, device,
                 shared_layer: bool = False):
        self.buckets = check_buckets(buckets)
        if max_pages < 1:
            raise StagingError(f"max_pages must be >= 1, got {max_pages}")
        self.cfg, self.max_pages, self.device = cfg, int(max_pages), torch.device(device)
        self.set_pad_slot(pad_slot)
        self.specs = input_specs(cfg, self.buckets[-1], self.max_pages, shared_layer)
        self.buf = {n: torch.empty(s, dtype=d, device=self.device) for n, (s, d) in self.specs.items()}
        self.pad(0, self.buckets[-1], block_table=True)
        self.dirty = 0  # rows [dirty:] hold padding

    def set_pad_slot(self, pad_slot: int) -> None:
        if isinstance(pad_slot, bool) or not isinstance(pad_slot, int) or pad_slot < 0 or pad_slot % PAGE:
            raise StagingError(f"pad_slot must be a non-negative multiple of {PAGE} (first slot of a reserved page), "
                               f"got {pad_slot!r}")
        self.pad_slot, self.pad_page = pad_slot, pad_slot // PAGE

    @property
    def max_ctx(self) -> int:
        """The captured E1 logits width: every token a block table row can address."""
        return self.max_pages * PAGE

    def views(self, bucket: int) -> dict[str, torch.Tensor]:
        return {n: t[:bucket] for n, t in self.buf.items()}

    def pad(self, start: int, stop: int, *, block_table: bool = False) -> None:
        """Write padding rows [start, stop) (block-table rows only when asked)."""
        if start >= stop:
            return
        for n, t in self.buf.items():
            if n == "block_table" and not block_table:
                continue
            if n == "out_cache_loc":
                t[start:stop].copy_(self.pad_slot + torch.arange(start, stop, device=t.device) % PAGE)
            elif n == "block_table":
                t[start:stop].fill_(self.pad_page)
            else:
                t[start:stop].fill_(PAD_VALUES[n])

    def check(self, inputs: Mapping[str, torch.Tensor], *, need_block_table: bool = True) -> int:
        """Validate a step's inputs -> M."""
        names = [n for n in self.specs if n != "block_table" or need_block_table]
        missing = [n for n in names if inputs.get(n) is None]
        if missing:
            raise StagingError(f"missing step inputs {missing}")
        m = None
        for n in names:
            t = inputs[n]
            shape, dtype = self.specs[n]
            if not isinstance(t, torch.Tensor):
                raise StagingError(f"{n} must be a tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                raise StagingError(f"{n} must be {dtype}, got {t.dtype}")
            if t.device != self.device:
                raise StagingError(f"{n} is on {t.device}, the executor on {self.device}")
            if t.dim() != len(shape):
                raise StagingError(f"{n} must be {len(shape)}-D {list(shape)} (rows first), got {list(t.shape)}")
            if n == "block_table":
                if t.shape[1] > self.max_pages:
                    raise StagingError(f"block_table has {t.shape[1]} columns > max_pages={self.max_pages} captured")
            elif tuple(t.shape[1:]) != tuple(shape[1:]):
                raise StagingError(f"{n} must be [M, {', '.join(map(str, shape[1:]))}], got {list(t.shape)}")
            if m is None:
                m = t.shape[0]
            elif t.shape[0] != m:
                raise StagingError(f"{n} has {t.shape[0]} rows, hidden has {m}")
        if m is None or m < 1:
            raise StagingError("a step needs M >= 1 rows")
        if m > self.buckets[-1]:
            raise StagingError(f"M={m} exceeds the largest bucket {self.buckets[-1]}")
        return m

    def load(self, inputs: Mapping[str, torch.Tensor], bucket: int) -> int:
        """Copy a step (validated) into rows [:M] and re-pad the rows [M:high-water mark) that held real
        data. block_table may be omitted (None): the bound one (rebind / an earlier step) is kept."""
        bt = inputs.get("block_table")
        m = self.check(inputs, need_block_table=bt is not None)
        if m > bucket:
            raise StagingError(f"M={m} > bucket {bucket}")
        for n in self.specs:
            t = inputs.get(n)
            if t is None:
                continue
            if n == "block_table":
                p = t.shape[1]
                self.buf[n][:m, :p].copy_(t, non_blocking=True)
                if p < self.max_pages:
                    self.buf[n][:m, p:].fill_(self.pad_page)
            else:
                self.buf[n][:m].copy_(t, non_blocking=True)
        self.pad(m, self.dirty)
        self.dirty = m
        return m

    def bind_block_table(self, block_table: torch.Tensor) -> None:
        """Copy a block table (rows = its first rows) into the static buffer (no re-capture)."""
        if block_table.dtype != I32 or block_table.dim() != 2 or block_table.device != self.device:
            raise StagingError(f"block_table must be 2-D int32 on {self.device}, got {block_table.dtype} "
                               f"{list(block_table.shape)} on {block_table.device}")
        r, p = block_table.shape
        if r > self.buckets[-1] or p > self.max_pages:
            raise StagingError(f"block_table {list(block_table.shape)} exceeds [{self.buckets[-1]}, {self.max_pages}]")
        self.buf["block_table"][:r, :p].copy_(block_table)
        if p < self.max_pages:
            self.buf["block_table"][:r, p:].fill_(self.pad_page)
