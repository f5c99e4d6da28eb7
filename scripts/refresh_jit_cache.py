#!/usr/bin/env python3
"""Refresh a carried JIT cache archive (tar.xz of a GLM5_FASTPATH_CACHE_DIR) for the current csrc/.

The GPU machine starts bare; the H200 scripts unpack a cache built here (nvcc 13.0, no GPU needed) so kernels
load instead of compiling. A cache entry's key covers its source and every header it includes, so any kernel
edit leaves entries stale (their builds then happen on the GPU machine, on its clock). This script rebuilds each
entry of the archive whose key no longer matches the current sources (same name, source file and -D defines),
keeps the ones that still match, merges entries of other cache directories (--add, e.g. a
`benchmarks/fp8_gemm_sweep.py --warm` cache), and writes a new archive.

    python scripts/refresh_jit_cache.py .carry/jit.tar.xz --add /tmp/jit_sweep --out .carry/jit.tar.xz

A fresh checkout has no archive to refresh: --seed builds every variant the ops launch
(glm5_fastpath.ops.compile_check_specs(), the same list CI compile-checks), MegaMoE's builds and the fused router +
plan builds (moe.megamoe / moe.routed compile_check_specs) into the new archive as well:

    python scripts/refresh_jit_cache.py --seed --out .carry/jit.tar.xz
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm5_fastpath.jit import KernelSpec, compile_kernel  # noqa: E402
from glm5_fastpath.jit.compiler import _ENTRY_KEY_CHARS, BASE_FLAGS, cache_key, gencode_flags  # noqa: E402


def spec_of(manifest: dict) -> KernelSpec | None:
    """The KernelSpec an entry was built from (None: inline code, which cannot be rebuilt from its manifest)."""
    src = manifest.get("source", "")
    if not src.startswith("csrc:"):
        return None
    standard = set(BASE_FLAGS) | set(gencode_flags(manifest["arch"]))
    debug = {"-lineinfo", "-Xptxas=-v", "--keep"}  # env-driven (_debug_flags): the runtime's keys never have them
    defines, extra = [], []
    for f in manifest["flags"]:
        if f.startswith("-D"):
            k, _, v = f[2:].partition("=")
            defines.append((k, v))
        elif f not in standard and f not in debug:
            extra.append(f)
    return KernelSpec(manifest["name"], source=src[len("csrc:"):], defines=tuple(defines), flags=tuple(extra),
                      use_cutlass=manifest.get("cutlass") is not None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", nargs="?", default=None,
                    help="the cache archive to refresh (tar.xz of a cache dir holding sm_90a/...); optional with --seed")
    ap.add_argument("--seed", action="store_true",
                    help="also build every variant the ops launch (compile_check_specs) for --arch")
    ap.add_argument("--arch", default="sm_90a", help="the arch --seed builds for (default sm_90a)")
    ap.add_argument("--add", action="append", default=[], help="another cache dir whose entries are merged in")
    ap.add_argument("--out", required=True, help="the new archive (may be the input)")
    args = ap.parse_args(argv)
    if args.archive is None and not args.seed:
        ap.error("give an archive to refresh, or --seed")
    work = Path(tempfile.mkdtemp(prefix="glm5_jit_refresh."))
    old, new = work / "old", work / "new"
    old.mkdir(), new.mkdir()
    if args.archive is not None:
        subprocess.run(["tar", "-xJf", args.archive, "-C", str(old)], check=True)
    os.environ["GLM5_FASTPATH_CACHE_DIR"] = str(new)
    kept = rebuilt = skipped = 0
    for man in sorted(old.glob("*/*/manifest.json")):
        m = json.loads(man.read_text())
        arch, entry = man.parent.parent.name, man.parent
        spec = spec_of(m)
        if spec is None:  # inline code: cannot be rebuilt from its manifest; kept as it is
            shutil.copytree(entry, new / arch / entry.name, dirs_exist_ok=True)
            skipped += 1
            continue
        key = cache_key(spec, arch)
        if (new / arch / f"{spec.name}.{key[:_ENTRY_KEY_CHARS]}").exists():
            continue  # a debug-flag twin of an entry already refreshed
        if key == m.get("key"):
            shutil.copytree(entry, new / arch / entry.name)
            kept += 1
        else:
            compile_kernel(spec, arch)
            rebuilt += 1
            print(f"rebuilt {spec.describe()}", flush=True)
    seeded = 0
    if args.seed:
        from glm5_fastpath.moe import megamoe, routed
        from glm5_fastpath.ops import compile_check_specs
        # the ops' variants, MegaMoE's builds, and the fused router + plan builds of the decode buckets
        for spec in [*compile_check_specs(), *megamoe.compile_check_specs(), *routed.compile_check_specs()]:
            key = cache_key(spec, args.arch)
            if not (new / args.arch / f"{spec.name}.{key[:_ENTRY_KEY_CHARS]}").exists():
                compile_kernel(spec, args.arch)
                seeded += 1
    added = 0
    for d in args.add:
        for entry in sorted(Path(d).glob("*/*/manifest.json")):
            dst = new / entry.parent.parent.name / entry.parent.name
            if not dst.exists():
                shutil.copytree(entry.parent, dst)
                added += 1
    for tmp in new.glob("*/tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    for locks in new.glob("*/locks"):
        shutil.rmtree(locks, ignore_errors=True)
    out = Path(args.out).resolve()
    tmp_out = out.with_suffix(".new")
    subprocess.run(["tar", "-cJf", str(tmp_out), "-C", str(new), *sorted(p.name for p in new.iterdir())], check=True)
    tmp_out.replace(out)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{out}: kept {kept}, rebuilt {rebuilt}, seeded {seeded}, added {added}, inline entries kept as they are {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
