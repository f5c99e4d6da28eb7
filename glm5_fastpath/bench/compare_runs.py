"""Compare engine settings over several engine processes each: is a difference larger than the spread?

Why: at batch 1 the decode ITL p50 of identical settings moved by up to 0.2 ms between fresh engine processes on one
machine (2.00-2.22 ms, H200 session 35), more than most single changes are worth, so an A/B of one engine per
setting can report noise as a gain. Run each setting in several engine processes (alternating: A B A B; e.g.
`c_engine_ab.sh` with RUNS="a1 b1:... a2 b2:..."), then:

    python -m glm5_fastpath.bench.compare_runs base=DIR,DIR w8=DIR,DIR [--mode fastpath] [--out DIR]
    glm5-fastpath bench compare-runs ...   (the same)

Each DIR holds one engine's `mode-<mode>.json` (bench offline's per-mode result; its offline.json is not needed).
Per batch size and label: the runs' ITL p50 (stream wall clock per token) and tok/s, their median and range; per
label after the first: the median's difference to the first label's and whether the two ranges are apart
("separated": every run of one setting beat every run of the other; needs two runs or more on each side). With --host-timing runs, the host loop's p50
period and host-busy share per run are listed too (bench/host_timing.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence


def parse_groups(items: Sequence[str]) -> list[tuple[str, list[Path]]]:
    """["label=dir,dir", ...] -> [(label, [dirs])], labels unique and in order."""
    out: list[tuple[str, list[Path]]] = []
    for it in items:
        label, sep, dirs = it.partition("=")
        label = label.strip()
        if not sep or not label or not dirs.strip():
            raise ValueError(f"expected LABEL=DIR[,DIR...], got {it!r}")
        if any(label == lab for lab, _ in out):
            raise ValueError(f"label {label!r} given twice")
        out.append((label, [Path(d.strip()) for d in dirs.split(",") if d.strip()]))
    if not out:
        raise ValueError("no LABEL=DIR groups given")
    return out


def load_run(d: Path, mode: str) -> dict:
    """One engine's result: DIR/mode-<mode>.json (or DIR itself when it is that file)."""
    p = d if d.is_file() else d / f"mode-{mode}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a readable bench offline result ({e})") from None


def run_row(res: dict, batch: int) -> dict | None:
    """ITL p50 (ms), tok/s and host-loop figures of one run at one batch size; None if it has no such batch."""
    br = (res.get("batches") or {}).get(str(batch))
    if not br or br.get("error"):
        return None
    itl = (br.get("itl_ms") or {}).get("p50")
    row = {"itl_p50_ms": itl, "tok_s": br.get("output_tok_s"), "calls": br.get("calls")}
    ht = ((res.get("host_timing") or {}).get(str(batch)) or {}).get("timed")
    if ht:
        row["host_loop_us"] = ht.get("iter_us_p50")
        row["host_busy_share"] = ht.get("host_busy_share")
    return row


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def compare(groups: list[tuple[str, list[dict]]]) -> dict:
    """groups: [(label, [run results])] -> {"batches": {b: {label: stats}}, "labels": [...]}."""
    batches = sorted({int(b) for _, runs in groups for r in runs for b in (r.get("batches") or {})})
    out: dict[str, Any] = {"labels": [lab for lab, _ in groups], "runs": {lab: len(rs) for lab, rs in groups},
                           "batches": {}}
    for b in batches:
        per: dict[str, Any] = {}
        for lab, runs in groups:
            rows = [x for x in (run_row(r, b) for r in runs) if x is not None]
            itl = [x["itl_p50_ms"] for x in rows if x.get("itl_p50_ms") is not None]
            tok = [x["tok_s"] for x in rows if x.get("tok_s") is not None]
            if not rows:
                continue
            st = {"n": len(rows), "itl_p50_ms": itl, "itl_median": _med(itl),
                  "itl_range": [min(itl), max(itl)] if itl else None, "tok_s": tok, "tok_s_median": _med(tok)}
            loops = [x["host_loop_us"] for x in rows if x.get("host_loop_us") is not None]
            if loops:
                st["host_loop_us"] = loops
                st["host_busy_share"] = [x.get("host_busy_share") for x in rows if x.get("host_loop_us") is not None]
            per[lab] = st
        base_lab = next((lab for lab, _ in groups if lab in per), None)
        if base_lab is not None:
            base = per[base_lab]
            for lab, st in per.items():
                if lab == base_lab or st["itl_median"] is None or base["itl_median"] is None:
                    continue
                st["itl_delta_ms"] = st["itl_median"] - base["itl_median"]
                lo, hi = st["itl_range"]
                blo, bhi = base["itl_range"]
                # one run shows no spread: "separated" needs at least two runs on each side
                st["separated"] = (hi < blo or lo > bhi) if min(len(st["itl_p50_ms"]), len(base["itl_p50_ms"])) >= 2 \
                    else None
        out["batches"][str(b)] = per
    return out


def render(cmp: dict, title: str = "Engine settings across engine processes") -> str:
    lines = [f"# {title}", "",
             "Per batch size and setting: the decode ITL p50 of each engine process (ms, stream wall clock), their "
             "median and the difference to the first setting's median; separated = the two settings' ranges do not "
             "overlap (- with fewer than two runs on a side). tok/s: median over the processes (includes each call's prefill).", "",
             "| batch | setting | runs | ITL p50 per run (ms) | median | vs " + cmp["labels"][0] +
             " | separated | tok/s median | host loop us per run | host busy share |",
             "|---:|---|---:|---|---:|---:|---|---:|---|---|"]
    for b, per in cmp["batches"].items():
        for lab, st in per.items():
            itl = ", ".join(f"{x:.3f}" for x in sorted(st["itl_p50_ms"])) or "-"
            d = st.get("itl_delta_ms")
            sep = st.get("separated")
            loops = ", ".join(f"{x:.0f}" for x in st.get("host_loop_us", [])) or "-"
            share = ", ".join("-" if x is None else f"{100 * x:.0f} %" for x in st.get("host_busy_share", [])) or "-"
            lines.append(f"| {b} | {lab} | {st['n']} | {itl} | "
                         f"{'-' if st['itl_median'] is None else format(st['itl_median'], '.3f')} | "
                         f"{'-' if d is None else format(d, '+.3f')} | {'-' if sep is None else ('yes' if sep else 'no')} | "
                         f"{'-' if st['tok_s_median'] is None else format(st['tok_s_median'], '.1f')} | {loops} | {share} |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("groups", nargs="+", metavar="LABEL=DIR[,DIR...]",
                   help="one setting: its label and the run dirs (each holds one engine's mode-<mode>.json)")
    p.add_argument("--mode", default="fastpath", choices=("fastpath", "stock"), help="which mode's result to read")
    p.add_argument("--out", default=None, help="write compare_runs.json / .md here (default: print only)")
    p.add_argument("--title", default="Engine settings across engine processes")


def run(a: argparse.Namespace) -> int:
    try:
        groups = [(lab, [load_run(d, a.mode) for d in dirs]) for lab, dirs in parse_groups(a.groups)]
    except ValueError as e:
        print(f"compare-runs: {e}", file=sys.stderr)
        return 2
    cmp = compare(groups)
    md = render(cmp, a.title)
    print(md, end="")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare_runs.json").write_text(json.dumps(cmp, indent=1) + "\n")
        (out / "compare_runs.md").write_text(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.compare_runs", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
