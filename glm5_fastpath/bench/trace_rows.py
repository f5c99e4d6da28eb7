"""Read MegaMoE trace rows saved by `bench moe --trace` (trace_rows/<setting>_M<tokens>.pt): per task kind the
distribution of each phase, the task-boundary costs and the tail, for the small-M analysis (session 7's open
question: at 1 token the FC1 epilogue averaged ~8 us and the first stage ~5 us per task).

    python -m glm5_fastpath.bench.trace_rows OUT/trace_rows/b_M1.pt [more.pt ...]

Columns of a row: moe.megamoe.TRACE_COLUMNS (claim and the global-timer stamps in ns, the phase stamps in SM clock
cycles). Per kind (FC1 / FC2) and phase the report gives p10 / p50 / p90 / max in us:
- claim lead: the task's claim -> the math taking it (global timer; ~0 means the math waited for the scheduler);
- idle before: the math's gap since the CTA's previous task ended (global timer);
- first stage: math start -> first stage landed; mma: first stage -> last fold; epilogue: last fold -> done;
- fc1_done spin (FC2 tasks that waited).
Then the tail: the CTAs that finished last, with their last task's kind and phases.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

PHASES = ("claim_lead", "idle_before", "first_stage", "mma", "epilogue", "spin")


def _q(x: torch.Tensor) -> dict[str, float] | None:
    if x.numel() == 0:
        return None
    x = x.double()
    return {"n": int(x.numel()), "p10": float(torch.quantile(x, 0.1)), "p50": float(torch.quantile(x, 0.5)),
            "p90": float(torch.quantile(x, 0.9)), "max": float(x.max())}


def details(rows: torch.Tensor, tail_ctas: int = 5) -> dict[str, Any]:
    """Per kind and phase the quantiles (us), and the last-finishing CTAs' final tasks."""
    from ..moe.megamoe import trace_frame

    f = trace_frame(rows)
    r, done, fc2, ghz, c2us = f.r, f.done, f.fc2, f.ghz, f.us_per_cycle
    if not bool(done.any()):
        return {"tasks": 0}
    prev_end = torch.zeros_like(r[..., 9])
    prev_end[:, 1:] = r[:, :-1, 9]
    phase = {
        "claim_lead": (r[..., 8] - r[..., 0]).double() / 1e3,
        "idle_before": f.gap_ns.double() / 1e3,
        "first_stage": (r[..., 4] - r[..., 3]).double() * c2us,
        "mma": (r[..., 5] - r[..., 4]).double() * c2us,
        "epilogue": (r[..., 6] - r[..., 5]).double() * c2us,
        "spin": (r[..., 2] - r[..., 1]).double() * c2us,
    }
    has = {"first_stage": r[..., 4] > 0, "mma": (r[..., 4] > 0) & (r[..., 5] > 0), "epilogue": r[..., 5] > 0,
           "spin": (r[..., 1] > 0) & (r[..., 2] > 0), "claim_lead": r[..., 0] > 0, "idle_before": prev_end > 0}
    out: dict[str, Any] = {"tasks": int(done.sum()), "sm_ghz": ghz, "kinds": {}}
    for kind, sel in (("fc1", done & ~fc2), ("fc2", done & fc2)):
        out["kinds"][kind] = {p: _q(phase[p][sel & has[p]]) for p in PHASES}
    ends = torch.where(done, r[..., 9], torch.zeros_like(r[..., 9]))
    last_idx = ends.argmax(dim=1)
    cta_end = ends.max(dim=1).values
    t0 = int(r[..., 0][r[..., 0] > 0].min())
    order = torch.argsort(cta_end, descending=True)[:tail_ctas]
    tail = []
    for c in order.tolist():
        n = int(last_idx[c])
        if not bool(done[c, n]):
            continue
        tail.append({"cta": c, "end_us": (int(cta_end[c]) - t0) / 1e3, "kind": "fc2" if bool(fc2[c, n]) else "fc1",
                     **{p: float(phase[p][c, n]) for p in PHASES if bool(has[p][c, n])}})
    out["median_cta_end_us"] = float((cta_end[cta_end > 0].double() - t0).median()) / 1e3
    out["tail"] = tail
    return out


def markdown(name: str, d: dict[str, Any]) -> str:
    if not d.get("tasks"):
        return f"## {name}\n\nno finished task rows\n"
    lines = [f"## {name}", "", f"{d['tasks']} tasks, SM clock {d['sm_ghz']:.2f} GHz; median CTA end "
             f"{d['median_cta_end_us']:.1f} us after the first claim.", "",
             "| kind | phase | n | p10 us | p50 us | p90 us | max us |", "|---|---|---:|---:|---:|---:|---:|"]
    for kind, ph in d["kinds"].items():
        for p in PHASES:
            q = ph.get(p)
            if q:
                lines.append(f"| {kind} | {p} | {q['n']} | {q['p10']:.2f} | {q['p50']:.2f} | {q['p90']:.2f} | "
                             f"{q['max']:.2f} |")
    lines += ["", "Last CTAs to finish (their final task):", ""]
    for t in d["tail"]:
        ph = ", ".join(f"{p} {t[p]:.2f}" for p in PHASES if p in t)
        lines.append(f"- CTA {t['cta']}: ends at {t['end_us']:.1f} us, {t['kind']} ({ph})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.trace_rows", description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="trace_rows/*.pt written by `bench moe --trace`")
    ap.add_argument("--tail", type=int, default=5, help="how many last-finishing CTAs to list")
    a = ap.parse_args(argv)
    for f in a.files:
        blob = torch.load(f, map_location="cpu", weights_only=False)
        rows = blob["rows"] if isinstance(blob, dict) else blob
        name = Path(f).name + (f" ({blob.get('config')}, {blob.get('tokens')} tokens)" if isinstance(blob, dict) else "")
        sys.stdout.write(markdown(name, details(rows, a.tail)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
