"""Digest of the prefix FP8 GEMMs' outputs, to show a build switch leaves them bitwise unchanged (session 24).

Runs the plain skinny FP8 GEMM (ops.fp8_gemm_skinny, the tuned config per shape and M) on the four prefix GEMM shapes
(QKV-A 2624x6144, q_b 16384x2048, indexer Q 4096x2048, indexer K 128x6144) at several M, with fixed-seed inputs,
and prints one sha256 per (shape, M) as JSON. Run it once per value of the switch (each in a fresh process: the
switch is read when kernel specs are built) and compare the files:

    GLM5_FASTPATH_FP8_GEMM_INFLIGHT=0 python benchmarks/skinny_output_digest.py --out a.json
    GLM5_FASTPATH_FP8_GEMM_INFLIGHT=2 python benchmarks/skinny_output_digest.py --out b.json
    python benchmarks/skinny_output_digest.py --compare a.json b.json      # exit 1 when any digest differs
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

SHAPES = {"qkv_a": (2624, 6144), "q_b": (16384, 2048), "index_q": (4096, 2048), "index_k": (128, 6144)}


def digests(ms: list[int], seed: int) -> dict[str, str]:
    import torch

    from glm5_fastpath.ops import fp8_gemm_skinny

    dev = torch.device("cuda")
    out: dict[str, str] = {}
    for name, (n, k) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(seed)
        w = (torch.randn(n, k, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
        ws = torch.rand(-(-n // 128), k // 128, device=dev, generator=g) * 0.01 + 0.001  # N = 2624: 21 blocks
        lin = SimpleNamespace(weight=w, scale_inv=ws)
        for m in ms:
            x8 = torch.randn(m, k, device=dev, generator=g).to(torch.float8_e4m3fn)
            xs = torch.rand(m, k // 128, device=dev, generator=g) * 0.01 + 0.001
            ys = [fp8_gemm_skinny(x8, xs, lin, pdl=False) for _ in range(3)]  # 3 runs: a race shows as a mismatch
            torch.cuda.synchronize()
            h = [hashlib.sha256(y.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16] for y in ys]
            out[f"{name} M={m}"] = h[0] if len(set(h)) == 1 else "RUNS DIFFER: " + ",".join(h)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--ms", default="1,3,16,31,64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = p.parse_args(argv)
    if a.compare:
        x, y = (json.loads(Path(f).read_text()) for f in a.compare)
        bad = [key for key in sorted(set(x) | set(y)) if x.get(key) != y.get(key) or "DIFFER" in str(x.get(key))]
        print(json.dumps({"compared": len(set(x) | set(y)), "differ": bad}))
        return 1 if bad else 0
    d = digests([int(s) for s in a.ms.split(",")], a.seed)
    text = json.dumps(d, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
