#!/usr/bin/env python3
"""Bitwise A/B of two MegaMoE kernel source trees on one GPU (for kernel edits that must not change a bit).

Each tree runs in its own process (GLM5_FASTPATH_CSRC=<tree>; the JIT cache keys on the sources) on the same
GLM-5-sized weights and inputs, through moe.megamoe.debug_run, and dumps every intermediate: FC1 output a8 and
its scales, the FC2 slot values, the combined output. The comparison is exact (int views: -0 vs +0 and NaN
payloads count). Cases: setting (a) (32 experts + shared) at several token counts, each twice: plain random inputs
(the kernels' common paths) and inputs spanning a wide dynamic range (tokens scaled by 2^+-30, so rare paths such
as a division's slow path are taken too).

    python scripts/megamoe_bitwise_ab.py --a build/abx/prev/csrc --b csrc --out /tmp/ab
Exit status 1 when any tensor differs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKENS = (1, 3, 8, 40, 128, 256, 1024)
KEYS = ("a8", "a_scale", "slots", "out")


def _dump(out: Path, tokens: list[int]) -> None:
    from glm5_fastpath.bench import moe as B
    from glm5_fastpath.moe import megamoe as M
    from glm5_fastpath.ref.fp8 import quant_act_per_token

    dev = torch.device("cuda")
    raw = B.make_weights(33, seed=5, dev=dev)  # 32 routed + the shared expert, last
    wt = M.prepare_weights(*raw, num_shared=1)
    for m in tokens:
        for wide in (False, True):
            x8, xs, ids, wts = B.make_inputs(m, 32, seed=70 + m, dev=dev)
            if wide:  # a wide dynamic range across tokens (FC1 gates far from 0 / 1): the kernels' rare paths
                g = torch.Generator(device=dev).manual_seed(m)
                h = torch.randn(m, B.H, generator=g, device=dev)
                h *= torch.tensor([2.0 ** (30 * ((t % 5) - 2) / 2) for t in range(m)], device=dev)[:, None]
                x8, xs = quant_act_per_token(h.to(torch.bfloat16))
            d = M.debug_run(x8, xs, ids, wts, wt, routed_scaling_factor=2.5, combine=True)
            torch.save({k: d[k].cpu() for k in KEYS} | {"config": d["config"]}, out / f"m{m}{'w' if wide else ''}.pt")
            print(f"m={m} wide={wide} {d['config']}", flush=True)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", help="kernel source tree A (a csrc/ directory)")
    ap.add_argument("--b", help="kernel source tree B")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--keep-dumps", action="store_true",
                    help="keep OUT/a and OUT/b (the compared tensors: hundreds of MB at 4096 tokens); by default only "
                         "OUT/bitwise_ab.json stays")
    ap.add_argument("--dump-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    out = Path(args.out)
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.dump_only:
        out.mkdir(parents=True, exist_ok=True)
        _dump(out, tokens)
        return 0
    for side, tree in (("a", args.a), ("b", args.b)):
        env = dict(os.environ, GLM5_FASTPATH_CSRC=str(Path(tree).resolve()))
        r = subprocess.run([sys.executable, __file__, "--dump-only", "--out", str(out / side), "--tokens", args.tokens],
                           env=env)
        if r.returncode:
            print(f"tree {side} ({tree}) failed: rc {r.returncode}")
            return 2
    report, same = [], True
    for m, wide in ((m, w) for m in tokens for w in ("", "w")):
        a, b = torch.load(out / "a" / f"m{m}{wide}.pt"), torch.load(out / "b" / f"m{m}{wide}.pt")
        row = {"tokens": m, "wide_range_inputs": bool(wide), "config": a["config"]}
        for k in KEYS:
            diff = int((_bits(a[k]) != _bits(b[k])).sum())
            row[k] = diff
            same &= diff == 0
        report.append(row)
        print(json.dumps(row))
    (out / "bitwise_ab.json").write_text(json.dumps({"a": args.a, "b": args.b, "identical": same, "cases": report},
                                                    indent=1))
    if not args.keep_dumps:  # a device call returns its results as one small archive (session 12 lost one this way)
        for side in ("a", "b"):
            shutil.rmtree(out / side, ignore_errors=True)
    print("IDENTICAL" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
