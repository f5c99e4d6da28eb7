"""Hand-made MegaMoE trace rows for tests of the trace summaries (moe.megamoe.summarize_trace, bench.trace_rows).

Times are given in ns; the clock64 stamps are written at 2 cycles per ns (an SM clock of 2 GHz), the
%globaltimer stamps as ns. Columns follow moe.megamoe.TRACE_COLUMNS.
"""
from __future__ import annotations

import torch


def put_trace_row(rows: torch.Tensor, cta: int, n: int, claim: int, math_start: int, first_stage: int, mma_done: int,
                  epi_done: int, desc: int, spin: tuple[int, int] = (0, 0), stage_wait: int = 0, producer_wait: int = 0,
                  loader_wait: int = 0, phases: tuple[int, int, int] = (0, 0, 0), mma_wait: int = 0,
                  fold: int = 0) -> None:
    """Write task n of CTA `cta`: spin = the fc1_done spin's (start, end), *_wait / fold = durations, phases = the
    epilogue phase stamps (columns 13-15; 0 = not stamped)."""
    clk = lambda t: 2 * t  # noqa: E731
    vals = [claim, clk(spin[0]), clk(spin[1]), clk(math_start), clk(first_stage), clk(mma_done), clk(epi_done), desc,
            math_start, epi_done, clk(stage_wait), clk(producer_wait), clk(loader_wait), *(clk(p) for p in phases),
            clk(mma_wait), clk(fold)]
    if len(vals) != rows.shape[-1]:
        raise ValueError(f"put_trace_row: {len(vals)} columns, the rows have {rows.shape[-1]}")
    rows[cta, n] = torch.tensor(vals, dtype=rows.dtype)
