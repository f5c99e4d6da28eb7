"""Does data that sits in L2 make a read (or a prefix GEMM) faster on this GPU? (session 24, issue #4)

Why: the prefix's early GEMMs (B0 at 16 tokens: 16 MB in ~10 us, ~40 % of HBM bandwidth) leave HBM idle, so
pulling later ops' weights (D0's 34 MB q_b) into L2 during that window could shorten the prefix. Session 6's probe
(bench l2-prefetch) saw no gain, but its read kernel ran at ~2 TB/s and its bulk form used few CTAs, so it did not
decide whether L2-resident data reads faster. This probe decides that first, per size:

- cold: the data was evicted (a 512 MB write in between), then read;
- warm: read once, then read again (whatever L2 kept of it);
- pf_line / pf_bulk: evicted, then glm5_fastpath::l2_prefetch (128-byte line prefetches / 16 KB bulk prefetches),
  an idle wait long enough for the prefetch to land, then read.

The read is torch's fp32 sum (a bandwidth-bound reduction) and D0's q_b GEMM (ops.d0_q_b at 16 tokens, the
kernel the CMP prefix runs), each replayed from a CUDA graph so no host time falls between the events; the eviction
and the idle wait before it keep the GPU busy long past the host's launch. Times: CUDA events around the read
alone, median of --reps. Writes JSON + markdown. (c2 of session 24 timed eager calls and an int32 sum: host-bound
and a ~0.5 TB/s read, so its numbers decided nothing.)

    python benchmarks/l2_residency_probe.py --out DIR [--sizes-mb 8,16,32,48] [--reps 30]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
from pathlib import Path
from types import SimpleNamespace

import torch

SM_CLOCK_HZ = 1.98e9  # H200 boost clock: torch.cuda._sleep counts SM cycles


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        return "?"


def graphed(fn):
    """fn captured once into a CUDA graph -> its replay (after one eager warm-up call)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def _time(prep, read, reps: int) -> float:
    """Median of CUDA-event times of read() after prep() (prep's work is outside the events)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps + 3):
        prep()
        e0.record()
        read()
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(out[3:])


def probe(read, tensors, reps: int, flush: torch.Tensor, sleep_cycles: int) -> dict[str, float]:
    from glm5_fastpath.ops.prefetch import l2_prefetch

    def evict():
        flush.fill_(1)

    def cold():
        evict()
        torch.cuda._sleep(sleep_cycles)

    def warm():
        evict()
        read()
        torch.cuda._sleep(sleep_cycles)

    def pf(bulk):
        def f():
            evict()
            l2_prefetch(tensors, pdl=False, bulk=bulk)
            torch.cuda._sleep(sleep_cycles)
        return f

    return {"cold": _time(cold, read, reps), "warm": _time(warm, read, reps),
            "pf_line": _time(pf(False), read, reps), "pf_bulk": _time(pf(True), read, reps)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes-mb", default="8,16,32,48")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--sleep-us", type=float, default=40.0, help="idle wait after the prefetch (us)")
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    sleep_cycles = int(a.sleep_us * 1e-6 * SM_CLOCK_HZ)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for mb in [int(s) for s in a.sizes_mb.split(",")]:
        x = torch.rand(((mb << 20) // 4,), device=dev)
        r = probe(graphed(lambda: x.sum()), [x], a.reps, flush, sleep_cycles)
        r.update(what=f"fp32 sum, {mb} MB", mb=float(mb))
        rows.append(r)
        print(json.dumps(r), flush=True)
    # D0 (q_b + RoPE) at 16 tokens: 16384 x 2048 e4m3 weight, 128 x 16 fp32 scales (33.6 MB)
    from glm5_fastpath.config import Glm5Config
    from glm5_fastpath.ops import d0_q_b

    cfg = Glm5Config.preset("glm5")
    n, k, m = cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), cfg.q_lora_rank, 16
    w = (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)
    ws = torch.rand(n // 128, k // 128, device=dev) * 0.01 + 0.001
    x8 = (torch.randn(m, k, device=dev)).to(torch.float8_e4m3fn)
    xs = torch.rand(m, k // 128, device=dev) * 0.01 + 0.001
    pos = torch.arange(m, device=dev, dtype=torch.int64) + 100
    wt = SimpleNamespace(q_b=SimpleNamespace(weight=w, scale_inv=ws))
    read = graphed(lambda: d0_q_b(x8, xs, wt, pos, cfg, pdl=False))
    for frac in (1.0, 0.5):
        # 0.5: the first half of the weight's rows (all K slices of those row tiles)
        tensors = [w, ws] if frac == 1.0 else [w[: n // 2], ws]
        r = probe(read, tensors, a.reps, flush, sleep_cycles)
        r.update(what=f"D0 q_b GEMM, M=16, prefetch {frac:g} of the weight", mb=(w.numel() + ws.numel() * 4) / 2**20)
        rows.append(r)
        print(json.dumps(r), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": _commit(), "reps": a.reps, "sleep_us": a.sleep_us, "l2_bytes": torch.cuda.get_device_properties(dev).L2_cache_size}
    (out / "l2_residency.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"# L2 residency probe ({meta['gpu']}, {meta['date']}, commit `{meta['commit']}`)", "",
          f"Median of {a.reps} CUDA-event times of the read alone (us); idle wait {a.sleep_us:g} us after a prefetch. "
          "Module doc of benchmarks/l2_residency_probe.py.", "",
          "| read | MB | cold | warm | pf_line | pf_bulk | warm / cold | pf_bulk / cold |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['what']} | {r['mb']:.1f} | {r['cold']:.2f} | {r['warm']:.2f} | {r['pf_line']:.2f} | {r['pf_bulk']:.2f} "
                  f"| {r['warm'] / r['cold']:.2f} | {r['pf_bulk'] / r['cold']:.2f} |")
    (out / "l2_residency.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
