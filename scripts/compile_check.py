#!/usr/bin/env python3
"""Compile every kernel under csrc/ for a target arch (default sm_90a) without a GPU; CI's check.

Builds each csrc/**/*.cu with its default macros, plus every variant the ops launch
(glm5_fastpath.ops.compile_check_specs()), with `-Xptxas -v`, and prints registers, shared
memory, stack and spills per kernel function. Exit status: 0 when everything compiled (and, unless
--allow-spills, nothing spills), 1 otherwise; 0 with a "skipped" line when no nvcc is found.

    python scripts/compile_check.py                   # sm_90a, throwaway cache
    python scripts/compile_check.py --arch sm_90a --json out.json --cache-dir /tmp/jit
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from glm5_fastpath.jit import (KernelCompileError, KernelSpec, NvccNotFoundError, compile_kernel, csrc_dir,  # noqa: E402
                               find_nvcc)


def discover_specs() -> list[KernelSpec]:
    """The ops' launch variants, then every other .cu under csrc/ with its default macros."""
    from glm5_fastpath.ops import compile_check_specs
    specs = list(compile_check_specs())
    covered = {s.source for s in specs}
    root = csrc_dir()
    for cu in sorted(root.rglob("*.cu")):
        rel = cu.relative_to(root).as_posix()
        if rel not in covered:
            specs.append(KernelSpec("check_" + rel[:-3].replace("/", "_").replace("-", "_"), source=rel))
    return specs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a", help="target, e.g. sm_90a (default)")
    ap.add_argument("--cache-dir", default=None, help="JIT cache root to use (default: a temporary directory)")
    ap.add_argument("--allow-spills", action="store_true", help="do not fail on register spills")
    ap.add_argument("--json", default=None, help="write the per-kernel resource table here")
    args = ap.parse_args(argv)

    try:
        nvcc = find_nvcc()
    except NvccNotFoundError as e:
        print(f"compile_check: skipped, no nvcc on this machine ({e})")
        return 0
    print(f"compile_check: nvcc={nvcc} arch={args.arch}")

    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="glm5_compile_check.")
        args.cache_dir = tmp.name
    os.environ["GLM5_FASTPATH_CACHE_DIR"] = args.cache_dir
    os.environ["GLM5_FASTPATH_PTXAS_VERBOSE"] = "1"
    os.environ["GLM5_FASTPATH_JIT_VERBOSE"] = "0"

    failures, spills, rows = 0, 0, []
    for spec in discover_specs():
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # the ptxas report is summarised below
                ck = compile_kernel(spec, args.arch)
        except KernelCompileError as e:
            failures += 1
            print(f"FAIL {spec.describe()}\n{e}\n")
            continue
        dt = time.monotonic() - t0
        res = ck.resources()
        if not res:
            print(f"ok   {spec.describe()}: no kernel functions ({dt:.1f} s)")
        for fn, r in res.items():
            spilled = r.spill_store_bytes or r.spill_load_bytes
            spills += bool(spilled)
            tag = "SPILL" if spilled else "ok  "
            print(f"{tag} {spec.describe()} :: {fn}: {r.registers} regs, {r.smem_bytes} B smem, "
                  f"{r.stack_bytes} B stack, spills {r.spill_store_bytes}/{r.spill_load_bytes} B ({dt:.1f} s)")
            rows.append({"spec": spec.describe(), "function": fn, "registers": r.registers, "smem_bytes": r.smem_bytes,
                         "stack_bytes": r.stack_bytes, "spill_store_bytes": r.spill_store_bytes,
                         "spill_load_bytes": r.spill_load_bytes, "barriers": r.barriers, "seconds": round(dt, 2)})
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": args.arch, "kernels": rows}, indent=1))
    if tmp is not None:
        tmp.cleanup()
    bad = failures or (spills and not args.allow_spills)
    print(f"compile_check: {len(rows)} functions, {failures} failed, {spills} spilling -> {'FAIL' if bad else 'OK'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
