"""Host cost of launching one CUDA graph, by node count and launch kind (issue #9: is the batch-1 step host-paced?).

At batch 1 the engine's decode step is ~2.0-2.2 ms while its GPU is busy ~1.95 ms (session 35), and the host loop
ends every iteration with one cudaGraphLaunch of the whole decode step (~195 kernel nodes with glm5_fastpath, ~240
stock). Under the torch profiler that call took 0.44 ms (session 26), but CUPTI lengthens it. This probe measures it
without a profiler: graphs of N tiny kernels, captured with torch.cuda.graph, replayed R times, the host time of each
`replay()` call (perf_counter around the call; the GPU work of one replay is far shorter than the interval between
calls, so the queue never fills and the call never blocks) and the GPU time per replay (CUDA events).

Kinds:
  torch   x.add_(1) on a 1-element tensor: plain kernel nodes, no PDL
  pdl     glm5_fastpath act_quant_fp8 on one 128-element row with pdl=True: kernel nodes with the programmatic
          stream-serialization attribute, what our CMP / route kernels are
  mixed   alternating torch / pdl nodes (the engine's graph: our PDL kernels between SGLang's plain ones)
  streams pdl nodes on 2 streams forked and joined every 8 nodes (CMP's branches)

usage: python3 benchmarks/graph_launch_cost.py [--nodes 25,50,100,200,400] [--replays 200] [--out DIR]
Writes graph_launch_cost.json / .md under DIR (default benchmarks/results/graph_launch_cost).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

KINDS = ("torch", "pdl", "mixed", "streams")


def parse_nodes(spec: str) -> list[int]:
    try:
        out = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--nodes: comma-separated positive integers, got {spec!r}") from None
    if not out or out[0] < 1 or out[-1] > 4096:
        raise SystemExit(f"--nodes: values in 1..4096, got {spec!r}")
    return out


def build(kind: str, n: int, torch, act_quant):
    """A graph of n nodes of `kind` plus the tensors it keeps alive."""
    dev = torch.device("cuda")
    x1 = torch.zeros(1, device=dev)
    row = torch.randn(1, 128, device=dev, dtype=torch.bfloat16)
    x8 = torch.empty(1, 128, device=dev, dtype=torch.float8_e4m3fn)
    sc = torch.empty(1, 1, device=dev, dtype=torch.float32)
    side = torch.cuda.Stream()

    def node(i: int) -> None:
        if kind == "torch" or (kind == "mixed" and i % 2 == 0):
            x1.add_(1)
        else:
            act_quant(row, out=(x8, sc), pdl=True)

    def body() -> None:
        if kind != "streams":
            for i in range(n):
                node(i)
            return
        main = torch.cuda.current_stream()
        i = 0
        while i < n:
            side.wait_stream(main)
            k = min(8, n - i)
            for j in range(k):
                if j % 2 == 0:
                    node(i + j)
                else:
                    with torch.cuda.stream(side):
                        node(i + j)
            main.wait_stream(side)
            i += k

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # warm-up: JIT loads, allocator
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return g, (x1, row, x8, sc, side)


def measure(g, replays: int, torch, gap_s: float) -> dict:
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    host = []
    for _ in range(replays):
        t0 = time.perf_counter()
        g.replay()
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()  # the next call starts on an idle GPU, as the engine's graph launch at batch 1
        if gap_s:
            time.sleep(gap_s)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(replays):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return {"host_us_p50": statistics.median(host), "host_us_p10": sorted(host)[len(host) // 10],
            "host_us_p90": sorted(host)[(9 * len(host)) // 10], "gpu_us_per_replay": e0.elapsed_time(e1) * 1e3 / replays}


def render(res: dict) -> str:
    lines = [f"# CUDA-graph launch host cost ({res['gpu']}, {res['date']}, commit {res['commit']})", "",
             "Host time of one `CUDAGraph.replay()` call (median of the replays, each on an idle GPU) and GPU time per "
             "replay (back to back), by kind and node count (benchmarks/graph_launch_cost.py).", "",
             "| kind | nodes | host us p50 | p10 | p90 | host us per node | GPU us per replay |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['kind']} | {r['nodes']} | {r['host_us_p50']:.1f} | {r['host_us_p10']:.1f} | "
                     f"{r['host_us_p90']:.1f} | {r['host_us_p50'] / r['nodes']:.2f} | {r['gpu_us_per_replay']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="25,50,100,200,400")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="sleep between timed replays")
    ap.add_argument("--out", default="benchmarks/results/graph_launch_cost")
    a = ap.parse_args(argv)
    nodes = parse_nodes(a.nodes)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SystemExit(f"--kinds: a comma-separated subset of {','.join(KINDS)}, got {a.kinds!r}")
    if a.replays < 10:
        raise SystemExit("--replays: at least 10")
    import torch

    if not torch.cuda.is_available():
        print("graph_launch_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    rows = []
    for kind in kinds:
        for n in nodes:
            g, keep = build(kind, n, torch, act_quant_fp8)
            r = measure(g, a.replays, torch, a.gap_ms / 1e3)
            rows.append({"kind": kind, "nodes": n, **r})
            print(f"{kind:8s} {n:5d} nodes: host {r['host_us_p50']:8.1f} us, GPU {r['gpu_us_per_replay']:8.1f} us",
                  flush=True)
            del g, keep
    from glm5_fastpath.bench.meta import git_commit, utc_now

    res = {"gpu": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "replays": a.replays, "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph_launch_cost.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "graph_launch_cost.md").write_text(render(res))
    print(f"wrote {out}/graph_launch_cost.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
