"""Just-in-time compilation of csrc/ kernels to a CUBIN with nvcc, cached on disk.

Nothing here needs a GPU, torch.cuda or cuda-python: with an explicit `arch` it is a pure
compile step (scripts/compile_check.py and the CPU tests use it that way).

Cache layout (root = $GLM5_FASTPATH_CACHE_DIR or ~/.cache/glm5_fastpath/jit)::

    <root>/<arch>/                       e.g. .../jit/sm_90a/
        <name>.<key[:32]>/               one entry per distinct compile, renamed into place whole
            kernel.cubin                 what the runtime loads
            manifest.json                everything the key covers, plus the (uncovered) command
            compile.log                  nvcc / ptxas output
            keep/                        only with GLM5_FASTPATH_JIT_KEEP: PTX, intermediates, SASS
        locks/<name>.<key[:32]>.lock     fcntl.flock target (never deleted)
        tmp/                             in-progress builds (same filesystem, so rename is atomic)

Cache key = sha256 over a JSON manifest of: the kernel name, the source text, the text of every
file reached through `#include "..."` (resolved like nvcc: the including file's directory, then
csrc/, then the extra include dirs; recorded as `csrc:<relative path>` so no absolute path enters
the key), the nvcc flags that affect the output (arch, -D defines, -O3, debug flags; not -I/-o
paths), the full `nvcc --version` text, the target arch, the package version and a schema number.
Angle-bracket includes (`<cute/...>`) are not hashed; a kernel that uses CUTLASS adds the CUTLASS
version header to the key instead.

Concurrency: a cross-process `fcntl.flock` on the entry's lock file, a second look for the entry
once the lock is held, a build in a private temp dir, fsync, then `os.replace` into place, so a
reader sees either no entry or a complete one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from . import env

log = logging.getLogger("glm5_fastpath.jit")

KEY_SCHEMA = 1
COMPILE_TIMEOUT_S = 600
_ENTRY_KEY_CHARS = 32
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)
_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")

# Flags every kernel is compiled with (part of the key). No fast-math: the kernels' rounding is
# specified bit for bit (IEEE divide and sqrt, round-to-nearest-even conversions).
BASE_FLAGS: tuple[str, ...] = (
    "-cubin",
    "-std=c++17",
    "-O3",
    "--expt-relaxed-constexpr",
    "-Xptxas=--warn-on-spills",
)
_NVCC_INSTALL_HINT = ("install the CUDA toolkit (nvcc 12.8+), set CUDA_HOME or GLM5_FASTPATH_NVCC, "
                      "or `pip install nvidia-cuda-nvcc`")


class KernelCompileError(RuntimeError):
    """nvcc failed. The message carries the full command and the full compiler output."""

    def __init__(self, name: str, command: Sequence[str], output: str, returncode: int | None):
        self.name = name
        self.command = shlex.join(command)
        self.output = output
        self.returncode = returncode
        status = "timed out" if returncode is None else f"exit code {returncode}"
        super().__init__(
            f"glm5_fastpath.jit: compiling kernel {name!r} failed ({status})\n"
            f"command: {self.command}\n"
            f"---- compiler output ----\n{output.rstrip()}\n---- end of compiler output ----")


class NvccNotFoundError(RuntimeError):
    """No usable nvcc. The message lists every place that was looked at."""


# ---- kernel specification -------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """One compile unit: a .cu under csrc/ (`source`) or inline text (`code`), plus its defines.

    name:        cache-entry name and, unless `functions` says otherwise, the extern "C" kernel.
    source:      path relative to the csrc/ root, e.g. "attn_pre/a0_add_rmsnorm_quant.cu".
    code:        inline CUDA source (tests, generated code); `#include "..."` resolves in csrc/.
    defines:     -D NAME=VALUE pairs (a mapping is accepted and normalised to a sorted tuple).
    flags:       extra nvcc flags (part of the key; must not carry paths).
    functions:   extern "C" kernel names the runtime may look up (default: (name,)).
    use_cutlass: add the CUTLASS/CuTe include directory (error if it cannot be found).
    """

    name: str
    source: str | None = None
    code: str | None = None
    defines: tuple[tuple[str, str], ...] | Mapping[str, object] = ()
    flags: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    use_cutlass: bool = False

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"KernelSpec: name {self.name!r} must match {_NAME_RE.pattern}")
        if (self.source is None) == (self.code is None):
            raise ValueError(f"KernelSpec {self.name!r}: give exactly one of source= (a csrc/ path) or code=")
        if self.source is not None and (os.path.isabs(self.source) or ".." in Path(self.source).parts):
            raise ValueError(f"KernelSpec {self.name!r}: source must be relative to csrc/ and stay inside it, "
                             f"got {self.source!r}")
        items = self.defines.items() if isinstance(self.defines, Mapping) else self.defines
        defines = tuple(sorted((str(k), _define_value(v)) for k, v in items))
        for k, _ in defines:
            if not _DEFINE_RE.match(k):
                raise ValueError(f"KernelSpec {self.name!r}: bad macro name {k!r}")
        object.__setattr__(self, "defines", defines)
        flags = tuple(str(f) for f in self.flags)
        for f in flags:
            if f.startswith(("-I", "-o", "--include-path", "--output-file", "-isystem")) or os.path.isabs(f):
                raise ValueError(f"KernelSpec {self.name!r}: flag {f!r} names a path; include dirs come from "
                                 "csrc/ and use_cutlass only (paths must stay out of the cache key)")
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "functions", tuple(self.functions) or (self.name,))

    def describe(self) -> str:
        d = " ".join(f"-D{k}={v}" for k, v in self.defines)
        return f"{self.name} ({self.source or '<inline>'}{' ' + d if d else ''})"


def _define_value(v: object) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, float, str)):
        return str(v)
    raise TypeError(f"KernelSpec define value must be int/float/str/bool, got {type(v).__name__}")


@dataclass(frozen=True)
class CompiledKernel:
    spec: KernelSpec
    arch: str
    key: str
    cubin: bytes = field(repr=False)
    log: str = field(repr=False)
    cache_hit: bool
    entry_dir: Path | None  # None when GLM5_FASTPATH_DISABLE_CACHE compiled into a deleted temp dir

    def resources(self) -> dict[str, "KernelResources"]:
        """Registers / smem / spills per function (only if compiled with -Xptxas -v)."""
        return parse_ptxas_info(self.log)


# ---- locating things ------------------------------------------------------------------------------

def csrc_dir() -> Path:
    """Root of the kernel sources: $GLM5_FASTPATH_CSRC, else the package's csrc/ (a symlink in a checkout)."""
    override = env.path("GLM5_FASTPATH_CSRC")
    p = Path(override) if override else Path(__file__).resolve().parent.parent / "csrc"
    if not p.is_dir():
        where = "GLM5_FASTPATH_CSRC" if override else "the installed package"
        raise FileNotFoundError(f"glm5_fastpath.jit: kernel source directory {p} (from {where}) does not exist")
    return p


def _nvcc_wheel_candidates() -> list[Path]:
    """nvcc inside the nvidia-cuda-nvcc wheel (12.x: nvidia/cuda_nvcc/bin, 13.x: nvidia/cu13/bin)."""
    import importlib.util
    out: list[Path] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return out
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cuda_nvcc/bin/nvcc", "cu13/bin/nvcc", "cu12/bin/nvcc"):
            out.append(Path(base) / sub)
    return out


def find_nvcc() -> str:
    """The nvcc to use: GLM5_FASTPATH_NVCC, CUDA_HOME/bin, PATH, /usr/local/cuda/bin, the pip wheel."""
    explicit = env.path("GLM5_FASTPATH_NVCC")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise NvccNotFoundError(f"GLM5_FASTPATH_NVCC={explicit!r} is not an executable file")
    tried: list[str] = []
    candidates: list[tuple[str, str | None]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append((f"${var}/bin/nvcc", os.path.join(os.environ[var], "bin", "nvcc")))
    candidates.append(("PATH", shutil.which("nvcc")))
    candidates.append(("/usr/local/cuda", "/usr/local/cuda/bin/nvcc"))
    candidates += [("nvidia-cuda-nvcc wheel", str(p)) for p in _nvcc_wheel_candidates()]
    for label, p in candidates:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
        tried.append(f"{label}: {p or 'not found'}")
    raise NvccNotFoundError("glm5_fastpath.jit: no nvcc found; " + _NVCC_INSTALL_HINT
                            + ". Looked at: GLM5_FASTPATH_NVCC (unset); " + "; ".join(tried))


def nvcc_version(nvcc: str) -> str:
    """Full `nvcc --version` output (part of the cache key), memoised per binary."""
    st = os.stat(nvcc)
    return _nvcc_version_cached(os.path.realpath(nvcc), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _nvcc_version_cached(nvcc: str, _mtime: int, _size: int) -> str:
    try:
        r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NvccNotFoundError(f"glm5_fastpath.jit: cannot run {nvcc} --version: {e}") from e
    if r.returncode != 0:
        raise NvccNotFoundError(f"glm5_fastpath.jit: {nvcc} --version failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout.strip()


def cutlass_include_dir() -> Path | None:
    """CUTLASS/CuTe headers: $GLM5_FASTPATH_CUTLASS_DIR, else the nvidia-cutlass wheel, else None."""
    override = env.path("GLM5_FASTPATH_CUTLASS_DIR")
    if override:
        p = Path(override)
        if not (p / "cute").is_dir():
            raise FileNotFoundError(f"GLM5_FASTPATH_CUTLASS_DIR={override!r} has no cute/ directory")
        return p
    import importlib.util
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = Path(base) / "source" / "include"
        if (p / "cute").is_dir():
            return p
    return None


# ---- arch -----------------------------------------------------------------------------------------

def arch_from_capability(major: int, minor: int) -> str:
    """(9, 0) -> "sm_90a". Architecture-specific ('a') targets, since the kernels use wgmma/setmaxnreg."""
    if major < 9:
        raise RuntimeError(f"glm5_fastpath kernels need a Hopper (sm_90) or newer GPU; this one is sm_{major}{minor}")
    return f"sm_{major}{minor}a"


def current_arch(device: object = None) -> str:
    """Arch of a torch CUDA device (default: the current one)."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("glm5_fastpath.jit: no CUDA device visible to torch; pass arch= to compile without one")
    return arch_from_capability(*torch.cuda.get_device_capability(device))


def gencode_flags(arch: str) -> list[str]:
    """sm_90a -> -gencode=arch=compute_90a,code=sm_90a (the -arch=sm_90a shorthand is avoided:
    with nvcc 13 it may also run a plain sm_90 pass that rejects wgmma/setmaxnreg)."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise ValueError(f"glm5_fastpath.jit: arch must look like sm_90a, got {arch!r}")
    return [f"-gencode=arch=compute_{m.group(1)}{m.group(2)},code={arch}"]


# ---- key ------------------------------------------------------------------------------------------

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _label(path: Path, roots: Sequence[tuple[str, Path]]) -> str:
    for name, root in roots:
        try:
            return f"{name}:{path.relative_to(root).as_posix()}"
        except ValueError:
            continue
    return f"outside:{path.name}"


def collect_includes(text: str, including_dir: Path | None, roots: Sequence[tuple[str, Path]]
                     ) -> list[tuple[str, str]]:
    """[(label, sha256 of text)] of every file reachable through `#include "..."`, depth first.

    A quoted include resolves, as nvcc does, against the including file's directory, then each
    root (csrc/, then extra include dirs) in order. Names that resolve nowhere are skipped (nvcc
    reports them if they matter). Includes in comments or dead #if branches are hashed too, which
    only makes the key more conservative.
    """
    roots = [(n, r.resolve()) for n, r in roots]
    seen: set[Path] = set()
    out: list[tuple[str, str]] = []

    def visit(src: str, here: Path | None) -> None:
        for inc in _INCLUDE_RE.findall(src):
            dirs = ([here] if here is not None else []) + [r for _, r in roots]
            for d in dirs:
                cand = Path(os.path.normpath(d / inc))
                if cand.is_file():
                    break
            else:
                continue
            cand = cand.resolve()
            if cand in seen:
                continue
            seen.add(cand)
            data = cand.read_bytes()
            out.append((_label(cand, roots), _sha256(data)))
            visit(data.decode("utf-8", errors="replace"), cand.parent)

    visit(text, including_dir.resolve() if including_dir is not None else None)
    return out


def _debug_flags() -> list[str]:
    out = []
    if env.flag("GLM5_FASTPATH_LINEINFO"):
        out.append("-lineinfo")
    if env.flag("GLM5_FASTPATH_PTXAS_VERBOSE"):
        out.append("-Xptxas=-v")
    if env.flag("GLM5_FASTPATH_JIT_KEEP"):
        out.append("--keep")  # --keep-dir=<path> is added at build time, outside the key
    return out


def key_flags(spec: KernelSpec, arch: str) -> list[str]:
    """The nvcc flags that shape the output (all of them part of the key)."""
    return [*BASE_FLAGS, *gencode_flags(arch), *(f"-D{k}={v}" for k, v in spec.defines), *spec.flags,
            *_debug_flags()]


@dataclass(frozen=True)
class _Plan:
    spec: KernelSpec
    arch: str
    nvcc: str
    manifest: dict
    key: str
    source_path: Path | None  # None for inline code
    include_dirs: tuple[Path, ...]
    flags: tuple[str, ...]

    @property
    def entry_name(self) -> str:
        return f"{self.spec.name}.{self.key[:_ENTRY_KEY_CHARS]}"


def _plan(spec: KernelSpec, arch: str, nvcc: str | None = None, nvcc_version_text: str | None = None) -> _Plan:
    from .. import __version__
    root = csrc_dir()
    roots: list[tuple[str, Path]] = [("csrc", root)]
    cutlass_id = None
    if spec.use_cutlass:
        cdir = cutlass_include_dir()
        if cdir is None:
            raise FileNotFoundError(f"glm5_fastpath.jit: kernel {spec.name!r} needs CUTLASS/CuTe headers: "
                                    "pip install 'glm5-fastpath[kernels]' (nvidia-cutlass) or set GLM5_FASTPATH_CUTLASS_DIR")
        roots.append(("cutlass", cdir))
        vh = cdir / "cutlass" / "version.h"
        cutlass_id = _sha256(vh.read_bytes()) if vh.is_file() else "unknown"
    if spec.source is not None:
        src_path = root / spec.source
        if not src_path.is_file():
            raise FileNotFoundError(f"glm5_fastpath.jit: kernel {spec.name!r}: {spec.source} not found under {root}")
        text = src_path.read_text(encoding="utf-8")
        label, here = f"csrc:{Path(spec.source).as_posix()}", src_path.parent
    else:
        src_path, text, label, here = None, spec.code or "", "<inline>", None
    if nvcc is None:
        nvcc = find_nvcc()
    if nvcc_version_text is None:
        nvcc_version_text = nvcc_version(nvcc)
    flags = key_flags(spec, arch)
    manifest = {
        "schema": KEY_SCHEMA,
        "name": spec.name,
        "source": label,
        "source_sha256": _sha256(text.encode("utf-8")),
        "includes": [list(x) for x in collect_includes(text, here, roots)],
        "flags": flags,
        "nvcc_version": nvcc_version_text,
        "arch": arch,
        "package_version": __version__,
        "cutlass": cutlass_id,
    }
    key = _sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    return _Plan(spec, arch, nvcc, manifest, key, src_path, tuple(r for _, r in roots), tuple(flags))


def cache_key(spec: KernelSpec, arch: str, *, nvcc_version_text: str | None = None) -> str:
    """The cache key of `spec` for `arch` (nvcc is located and queried unless its version text is given)."""
    nvcc = "<given>" if nvcc_version_text is not None else None
    return _plan(spec, arch, nvcc, nvcc_version_text).key


def cache_root(arch: str) -> Path:
    base = env.path("GLM5_FASTPATH_CACHE_DIR") or os.path.expanduser(env.default_of("GLM5_FASTPATH_CACHE_DIR"))
    return Path(base) / arch


# ---- build ----------------------------------------------------------------------------------------

def _find_cuobjdump(nvcc: str) -> str | None:
    beside = Path(nvcc).with_name("cuobjdump")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("cuobjdump")


def _build(plan: _Plan, workdir: Path) -> str:
    """Compile into workdir/kernel.cubin; write compile.log and manifest.json; return the log."""
    keep = "--keep" in plan.flags
    if plan.source_path is None:
        src = workdir / f"{plan.spec.name}.cu"
        src.write_text(plan.spec.code or "", encoding="utf-8")
    else:
        src = plan.source_path
    cubin = workdir / "kernel.cubin"
    cmd = [plan.nvcc, *plan.flags, *(f"-I{d}" for d in plan.include_dirs), "-o", str(cubin), str(src)]
    if keep:
        (workdir / "keep").mkdir(exist_ok=True)
        cmd.insert(-3, f"--keep-dir={workdir / 'keep'}")
    env.verbose(f"compiling {plan.spec.describe()} for {plan.arch}: {shlex.join(cmd)}")
    log.info("glm5_fastpath: compiling kernel %s for %s (first use; cached afterwards)", plan.spec.name, plan.arch)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise KernelCompileError(plan.spec.describe(), cmd, out + f"\n[timed out after {COMPILE_TIMEOUT_S} s]", None) from None
    output = r.stdout or ""
    if r.returncode != 0 or not cubin.is_file():
        raise KernelCompileError(plan.spec.describe(), cmd, output or "(no output)", r.returncode)
    dt = time.monotonic() - t0
    if output.strip():
        env.verbose(f"compiler output for {plan.spec.name}:\n{output.rstrip()}")
    if env.flag("GLM5_FASTPATH_PTXAS_VERBOSE") and not env.flag("GLM5_FASTPATH_JIT_VERBOSE"):
        print(f"[glm5_fastpath.jit] ptxas report for {plan.spec.describe()}:\n{output.rstrip()}", file=sys.stderr)
    _warn_spills(plan.spec.name, output)
    if keep:
        cuobjdump = _find_cuobjdump(plan.nvcc)
        if cuobjdump:
            s = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, timeout=120)
            (workdir / "keep" / "kernel.sass").write_text(s.stdout + s.stderr)
        else:
            (workdir / "keep" / "kernel.sass.missing").write_text("no cuobjdump beside nvcc or on PATH\n")
    (workdir / "compile.log").write_text(output)
    meta = dict(plan.manifest, key=plan.key, command=shlex.join(cmd), compile_seconds=round(dt, 3),
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    (workdir / "manifest.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return output


def _warn_spills(name: str, output: str) -> None:
    """A Python warning for every register spill ptxas reports (--warn-on-spills is always on)."""
    lines = [ln.strip() for ln in output.splitlines() if "warning" in ln.lower() and "spill" in ln.lower()]
    if not lines:  # -Xptxas -v reports spills without a warning line
        lines = [f"function {fn}: {r.spill_store_bytes} B spill stores, {r.spill_load_bytes} B spill loads"
                 for fn, r in parse_ptxas_info(output).items() if r.spill_store_bytes or r.spill_load_bytes]
    for ln in lines:
        warnings.warn(f"glm5_fastpath.jit: kernel {name} spills registers: {ln}", stacklevel=3)


def _fsync_tree(d: Path) -> None:
    for p in sorted(d.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(d)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive cross-process lock (fcntl.flock) on `path`; a no-op where fcntl does not exist."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic rename alone still keeps entries whole
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _load_entry(entry: Path, plan: _Plan) -> CompiledKernel | None:
    cubin, manifest = entry / "kernel.cubin", entry / "manifest.json"
    if not (cubin.is_file() and manifest.is_file()):
        return None
    try:
        if json.loads(manifest.read_text()).get("key") != plan.key:
            return None
        data = cubin.read_bytes()
    except (OSError, ValueError):
        return None
    if not data:
        return None
    logp = entry / "compile.log"
    return CompiledKernel(plan.spec, plan.arch, plan.key, data, logp.read_text() if logp.is_file() else "",
                          True, entry)


def compile_kernel(spec: KernelSpec, arch: str | None = None, *, device: object = None) -> CompiledKernel:
    """Compile `spec` for `arch` (default: the torch device's) or take it from the disk cache."""
    if arch is None:
        arch = current_arch(device)
    plan = _plan(spec, arch)

    if env.flag("GLM5_FASTPATH_DISABLE_CACHE"):
        keep = "--keep" in plan.flags
        work = Path(tempfile.mkdtemp(prefix=f"glm5_fastpath_{plan.entry_name}."))
        try:
            out = _build(plan, work)
            data = (work / "kernel.cubin").read_bytes()
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
        if keep:
            env.verbose(f"cache disabled; kept build of {spec.name} in {work}")
        return CompiledKernel(spec, arch, plan.key, data, out, False, work if keep else None)

    root = cache_root(arch)
    entry = root / plan.entry_name
    hit = _load_entry(entry, plan)
    if hit is None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"glm5_fastpath.jit: cannot create the kernel cache {root} ({e}); "
                               "set GLM5_FASTPATH_CACHE_DIR to a writable directory") from e
        with file_lock(root / "locks" / f"{plan.entry_name}.lock"):
            hit = _load_entry(entry, plan)  # another process may have built it while we waited
            if hit is None:
                return _build_into_cache(plan, root, entry)
    env.verbose(f"cache hit: {spec.describe()} -> {entry}")
    if env.flag("GLM5_FASTPATH_PTXAS_VERBOSE") and hit.log.strip():
        print(f"[glm5_fastpath.jit] ptxas report for {spec.describe()} (cached):\n{hit.log.rstrip()}", file=sys.stderr)
    return hit


def _build_into_cache(plan: _Plan, root: Path, entry: Path) -> CompiledKernel:
    tmp_root = root / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    if entry.exists():  # an unreadable/incomplete entry (e.g. written by a crashed older version)
        trash = Path(tempfile.mkdtemp(prefix=f"{plan.entry_name}.stale.", dir=tmp_root))
        os.replace(entry, trash / "entry")
        shutil.rmtree(trash, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{plan.entry_name}.", dir=tmp_root))
    try:
        out = _build(plan, work)
        _fsync_tree(work)
        try:
            os.replace(work, entry)
        except OSError:
            # Lost a race with a process that did not honour the lock (e.g. a filesystem without
            # flock): keep the winner's entry if it is whole.
            done = _load_entry(entry, plan)
            if done is None:
                raise
            return done
        _fsync_dir(root)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    done = _load_entry(entry, plan)
    if done is None:
        raise RuntimeError(f"glm5_fastpath.jit: cache entry {entry} unreadable right after it was written")
    return dataclasses.replace(done, cache_hit=False, log=out)


# ---- ptxas report ---------------------------------------------------------------------------------

@dataclass
class KernelResources:
    registers: int = 0
    barriers: int = 0
    smem_bytes: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0


_PTXAS_FN = re.compile(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_][\w$]*)'?")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas_info(output: str) -> dict[str, KernelResources]:
    """Per-function resources from `-Xptxas -v` output (empty when compiled without it)."""
    res: dict[str, KernelResources] = {}
    cur: str | None = None
    for line in output.splitlines():
        m = _PTXAS_FN.search(line)
        if m:
            cur = m.group(1)
            res.setdefault(cur, KernelResources())
            continue
        if cur is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            r = res[cur]
            r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes = (int(g) for g in m.groups())
            continue
        m = _PTXAS_USED.search(line)
        if m:
            r = res[cur]
            r.registers = int(m.group(1))
            r.barriers = int(m.group(2) or 0)
            r.smem_bytes = int(m.group(3) or 0)
    return res
