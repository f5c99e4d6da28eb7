#!/usr/bin/env python3
"""Compile a define variant of cached kernels: every entry of a JIT cache dir whose source matches one of
--sources is rebuilt with --define NAME=VALUE added, into the same cache, in parallel (nvcc runs outside the GIL).

For A/B runs of a build switch on the GPU machine, whose carried cache holds the default builds only: run it there
before the benchmark (16 cores) so the variant loads instead of compiling inside the timed process, e.g.

    python scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \\
        --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from glm5_fastpath.jit import compile_kernel  # noqa: E402
from refresh_jit_cache import spec_of  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=os.environ.get("GLM5_FASTPATH_CACHE_DIR"), help="cache dir (default: "
                    "$GLM5_FASTPATH_CACHE_DIR)")
    ap.add_argument("--define", required=True, metavar="NAME=VALUE")
    ap.add_argument("--sources", required=True, help="comma-separated csrc-relative sources")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args(argv)
    if not a.cache:
        ap.error("--cache or GLM5_FASTPATH_CACHE_DIR is needed")
    name, sep, value = a.define.partition("=")
    if not name or not sep:
        ap.error(f"--define {a.define!r}: expected NAME=VALUE")
    sources = {s.strip() for s in a.sources.split(",") if s.strip()}
    os.environ["GLM5_FASTPATH_CACHE_DIR"] = a.cache
    specs = {}
    for man in sorted(Path(a.cache).glob(f"{a.arch}/*/manifest.json")):
        spec = spec_of(json.loads(man.read_text()))
        if spec is None or spec.source not in sources or name in dict(spec.defines):
            continue
        v = replace(spec, defines=tuple(spec.defines) + ((name, value),))
        specs[v.describe()] = v
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        for _ in ex.map(lambda s: compile_kernel(s, a.arch), specs.values()):
            pass
    print(f"{len(specs)} variants with -D{name}={value} in {a.cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
