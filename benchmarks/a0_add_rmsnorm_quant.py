#!/usr/bin/env python3
"""Time the A0 kernel (residual add + RMSNorm + 1x128 FP8 quant) against a stock baseline.

For each M: our kernel with and without PDL, and the baseline, measured in the same run:
- baseline: torch.compile (inductor, default mode) of the same fused math in one function; if
  torch.compile fails the baseline is eager torch ops and the result says so. (SGLang's stock
  decode path runs sgl_kernel.fused_add_rmsnorm + sglang_per_token_group_quant_fp8, two kernels;
  neither is installed on the H200 machine, so they are not measured here.)
- method: K launches captured in one CUDA graph, each on its own rotating buffer set so the data
  touched per replay exceeds 2x L2 (at least --launches launches); the graph is replayed --replays
  times, each replay timed with CUDA events; time per launch = replay time / K; median and min.
- floor: bytes that must move (read hidden + residual + gamma, write x + residual_out + fp8 +
  scales) / 4.27e12 B/s (the H200's measured copy bandwidth, shared/anchors.md).

Writes <out>/a0_add_rmsnorm_quant.json and <out>/a0_add_rmsnorm_quant.md.

    python benchmarks/a0_add_rmsnorm_quant.py --out benchmarks/results/a0
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from glm5_fastpath.bench.meta import git_commit  # noqa: E402
from glm5_fastpath.bench.timing import l2_cache_bytes, time_launches  # noqa: E402
from glm5_fastpath.ops import add_rmsnorm_quant  # noqa: E402

BW_FLOOR = 4.27e12
EPS = 1e-5
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def a0_torch(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """The same math as the kernel, in torch ops (the baseline, compiled or eager)."""
    r = hidden.float() + residual.float()
    residual_out = r.to(BF16)
    x = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(BF16)
    xg = x.float().view(x.shape[0], -1, 128)
    s = xg.abs().amax(-1).clamp_min(1e-10) / 448.0
    q = (xg / s[..., None]).clamp(-448.0, 448.0).to(FP8).view(x.shape)
    return x, residual_out, q, s


def bytes_moved(m: int, h: int) -> int:
    g = h // 128
    return 2 * m * h * 2 + h * 2 + m * h * 2 + m * h * 2 + m * h + m * g * 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the JSON and markdown results")
    ap.add_argument("--m", default="1,16,64,128,256", help="comma-separated token counts")
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--launches", type=int, default=50, help="minimum launches per captured graph")
    ap.add_argument("--max-launches", type=int, default=2048, help="cap on launches per graph (small M)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true", help="baseline = eager torch ops")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("a0 benchmark: needs a CUDA GPU")
        return 1
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = l2_cache_bytes(dev)
    h = args.hidden
    ms = [int(x) for x in args.m.split(",") if x]

    baseline_label = "torch.compile (inductor) of the same fused math"
    baseline = a0_torch
    if not args.no_compile:
        try:
            baseline = torch.compile(a0_torch, dynamic=False, fullgraph=True)
            t = torch.randn(2, h, device=dev).to(BF16)
            baseline(t, t, t[0], EPS)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report, fall back, label honestly
            baseline_label = f"eager torch ops (torch.compile failed: {type(e).__name__}: {str(e)[:200]})"
            baseline = a0_torch
    else:
        baseline_label = "eager torch ops (--no-compile)"

    rows = []
    for m in ms:
        nbytes = bytes_moved(m, h)
        n_sets = max(1, math.ceil(2 * l2 / nbytes))
        n_launch = max(args.launches, min(n_sets, args.max_launches))
        n_sets = min(n_sets, n_launch)
        gen = torch.Generator(device=dev).manual_seed(m)
        sets = []
        for _ in range(n_sets):
            hid = (torch.randn(m, h, device=dev, generator=gen) * 0.5).to(BF16)
            res = (torch.randn(m, h, device=dev, generator=gen) * 2.0).to(BF16)
            w = (1.0 + 0.2 * torch.randn(h, device=dev, generator=gen)).to(BF16)
            outs = (torch.empty(m, h, dtype=BF16, device=dev), torch.empty(m, h, dtype=BF16, device=dev),
                    torch.empty(m, h, dtype=FP8, device=dev), torch.empty(m, h // 128, dtype=torch.float32, device=dev))
            sets.append((hid, res, w, outs))

        def ours(i, pdl):
            hid, res, w, outs = sets[i % n_sets]
            return add_rmsnorm_quant(hid, res, w, EPS, out=outs, pdl=pdl)

        def base(i):
            hid, res, w, _ = sets[i % n_sets]
            return baseline(hid, res, w, EPS)

        # correctness cross-check on set 0 (ours vs baseline, same math)
        o = ours(0, True)
        b = base(0)
        torch.cuda.synchronize()
        agree = {
            "residual_out_equal": bool(torch.equal(o.residual_out, b[1])),
            "x_bitwise_fraction": float((o.x.view(torch.int16) == b[0].view(torch.int16)).float().mean()),
            "fp8_bitwise_fraction": float((o.x_fp8.view(torch.uint8) == b[2].view(torch.uint8)).float().mean()),
            "scale_max_rel_diff": float(((o.x_scale - b[3]).abs() / b[3].abs()).max()),
        }

        floor_us = nbytes / BW_FLOOR * 1e6
        variants = {"ours_pdl": lambda i: ours(i, True), "ours_nopdl": lambda i: ours(i, False), "baseline": base}
        res_m = {"M": m, "H": h, "bytes": nbytes, "floor_us": floor_us, "launches_per_graph": n_launch,
                 "buffer_sets": n_sets, "agreement": agree}
        for name, fn in variants.items():
            t = time_launches(fn, n_launch, device=dev, replays=args.replays, warmup=3)
            res_m[name] = {"median_us": t.median_us, "min_us": t.min_us, "p90_us": t.p90_us, "method": t.method}
        rows.append(res_m)
        print(f"M={m:4d}: ours(PDL) {res_m['ours_pdl']['median_us']:7.2f} us  ours(noPDL) "
              f"{res_m['ours_nopdl']['median_us']:7.2f} us  baseline {res_m['baseline']['median_us']:7.2f} us  "
              f"floor {floor_us:6.2f} us  agree {agree}", flush=True)
        sets = []  # free this M's buffers before the next

    from glm5_fastpath.jit import find_nvcc
    from glm5_fastpath.jit.compiler import nvcc_version
    try:
        nvcc_v = nvcc_version(find_nvcc()).splitlines()[-1]
    except Exception:  # noqa: BLE001
        nvcc_v = "unknown"
    meta = {
        "gpu": torch.cuda.get_device_name(dev), "sm_count": props.multi_processor_count, "l2_bytes": l2,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "nvcc": nvcc_v, "hidden": h, "eps": EPS,
        "bandwidth_floor_Bps": BW_FLOOR, "replays": args.replays, "baseline": baseline_label,
        "method": "median of CUDA-graph replays of K launches over rotating buffer sets (> 2x L2), per launch",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "a0_add_rmsnorm_quant.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    md = [f"# A0 add + RMSNorm + FP8 quant (H={h})", "",
          f"{meta['gpu']} ({meta['sm_count']} SMs), {meta['date']}, commit `{meta['git_commit']}`, torch {meta['torch']}, "
          f"CUDA {meta['cuda']}, {meta['nvcc']}.", "",
          f"Baseline: {baseline_label}. Floor: bytes moved / {BW_FLOOR / 1e12:.2f} TB/s. {meta['method']}.", "",
          "| M | floor us | ours PDL us | ours no-PDL us | baseline us | ours PDL / floor | baseline / ours PDL | fp8 bitwise vs baseline |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, n, b = r["ours_pdl"]["median_us"], r["ours_nopdl"]["median_us"], r["baseline"]["median_us"]
        md.append(f"| {r['M']} | {r['floor_us']:.2f} | {o:.2f} | {n:.2f} | {b:.2f} | {o / r['floor_us']:.1f}x | "
                  f"{b / o:.2f}x | {r['agreement']['fp8_bitwise_fraction'] * 100:.3f} % |")
    (out / "a0_add_rmsnorm_quant.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
