"""CPU tests of the JIT layer: cache key, cache entries, locking, errors, nvcc discovery, env vars.

Tests that run nvcc compile real code for sm_90a (no GPU needed) and are skipped without nvcc.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from glm5_fastpath.jit import (KernelCompileError, KernelSpec, NvccNotFoundError, arch_from_capability, cache_key,
                               compile_kernel, csrc_dir, env, find_nvcc, parse_ptxas_info)
from glm5_fastpath.jit import compiler
from glm5_fastpath.jit.compiler import collect_includes, gencode_flags

REPO = Path(__file__).resolve().parents[2]
FAKE_VERSION = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.0 (test)"
A0_6144 = KernelSpec("glm5_a0_add_rmsnorm_quant", source="attn_pre/a0_add_rmsnorm_quant.cu",
                     defines={"GLM5_A0_HIDDEN": 6144, "GLM5_A0_THREADS": 256})

try:
    NVCC = find_nvcc()
except NvccNotFoundError:
    NVCC = None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (compile tests need the CUDA toolkit)")

TINY = textwrap.dedent("""
    #include "common/pdl.cuh"
    extern "C" __global__ void tiny(float* out, int n) {
        glm5::ptx::griddep_wait();
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = 2.0f * i;
    }
""")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    """Every test gets its own cache dir and no debug flags from the caller's shell."""
    for name in env.VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLM5_FASTPATH_CACHE_DIR", str(tmp_path / "cache"))


def _copy_csrc(dst: Path) -> Path:
    shutil.copytree(csrc_dir(), dst, symlinks=False)
    return dst


# ---- key -------------------------------------------------------------------------------------------

def test_key_independent_of_absolute_path_and_stable_across_processes(tmp_path, monkeypatch):
    a = _copy_csrc(tmp_path / "one" / "deeper" / "csrc")
    b = _copy_csrc(tmp_path / "two" / "csrc")
    monkeypatch.setenv("GLM5_FASTPATH_CSRC", str(a))
    ka = cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION)
    plan = compiler._plan(A0_6144, "sm_90a", "<given>", FAKE_VERSION)
    blob = json.dumps(plan.manifest)
    assert str(tmp_path) not in blob and str(REPO) not in blob, blob  # no absolute path in the key
    monkeypatch.setenv("GLM5_FASTPATH_CSRC", str(b))
    kb = cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION)
    assert ka == kb
    monkeypatch.delenv("GLM5_FASTPATH_CSRC")
    assert cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION) == ka  # the package's own csrc/

    # a fresh interpreter (different hash seed, different cwd) computes the same key
    code = ("from glm5_fastpath.jit import KernelSpec, cache_key;"
            "s = KernelSpec('glm5_a0_add_rmsnorm_quant', source='attn_pre/a0_add_rmsnorm_quant.cu',"
            " defines={'GLM5_A0_HIDDEN': 6144, 'GLM5_A0_THREADS': 256});"
            f"print(cache_key(s, 'sm_90a', nvcc_version_text={FAKE_VERSION!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345",
                              "GLM5_FASTPATH_CSRC": str(b)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ka


def test_key_changes_when_a_transitively_included_header_changes(tmp_path, monkeypatch):
    root = _copy_csrc(tmp_path / "csrc")
    monkeypatch.setenv("GLM5_FASTPATH_CSRC", str(root))
    k0 = cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION)
    hdr = root / "common" / "convert.cuh"  # reached via a0_add_rmsnorm_quant.cuh, not from the .cu
    original = hdr.read_text()
    hdr.write_text(original + "\n// a comment is a change\n")
    k1 = cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION)
    assert k1 != k0
    hdr.write_text(original)
    assert cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION) == k0


def test_key_covers_defines_arch_compiler_and_debug_flags(monkeypatch):
    k = cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION)
    other_h = KernelSpec(A0_6144.name, source=A0_6144.source, defines={"GLM5_A0_HIDDEN": 512, "GLM5_A0_THREADS": 64})
    assert cache_key(other_h, "sm_90a", nvcc_version_text=FAKE_VERSION) != k
    assert cache_key(A0_6144, "sm_100a", nvcc_version_text=FAKE_VERSION) != k
    assert cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION + " other build") != k
    monkeypatch.setenv("GLM5_FASTPATH_LINEINFO", "1")
    assert cache_key(A0_6144, "sm_90a", nvcc_version_text=FAKE_VERSION) != k
    monkeypatch.delenv("GLM5_FASTPATH_LINEINFO")
    # defines given as a mapping in another order are the same spec and the same key
    same = KernelSpec(A0_6144.name, source=A0_6144.source, defines={"GLM5_A0_THREADS": "256", "GLM5_A0_HIDDEN": "6144"})
    assert same == A0_6144 and hash(same) == hash(A0_6144)
    assert cache_key(same, "sm_90a", nvcc_version_text=FAKE_VERSION) == k


def test_include_resolution_order_and_labels(tmp_path):
    root = tmp_path / "csrc"
    (root / "common").mkdir(parents=True)
    (root / "op").mkdir()
    (root / "common" / "y.cuh").write_text('#pragma once\n#include "z.cuh"\n')   # z resolves beside y
    (root / "common" / "z.cuh").write_text("#pragma once\n")
    (root / "op" / "local.cuh").write_text('#include "../common/y.cuh"\n')       # relative to op/
    (root / "op" / "k.cu").write_text('#include "local.cuh"\n#include "common/y.cuh"\n#include <cute/tensor.hpp>\n'
                                       '#include "missing.cuh"\n')
    inc = collect_includes((root / "op" / "k.cu").read_text(), root / "op", [("csrc", root)])
    assert [lbl for lbl, _ in inc] == ["csrc:op/local.cuh", "csrc:common/y.cuh", "csrc:common/z.cuh"]


def test_spec_validation():
    with pytest.raises(ValueError, match="exactly one"):
        KernelSpec("k", source="a.cu", code="x")
    with pytest.raises(ValueError, match="relative"):
        KernelSpec("k", source="/abs/a.cu")
    with pytest.raises(ValueError, match="names a path"):
        KernelSpec("k", code="x", flags=("-I/usr/include",))
    with pytest.raises(ValueError, match="name"):
        KernelSpec("bad name", code="x")
    assert KernelSpec("k", code="x").functions == ("k",)


def test_arch_mapping():
    assert arch_from_capability(9, 0) == "sm_90a"
    assert arch_from_capability(10, 0) == "sm_100a"
    with pytest.raises(RuntimeError, match="Hopper"):
        arch_from_capability(8, 0)
    assert gencode_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(ValueError):
        gencode_flags("90a")


# ---- nvcc discovery -----------------------------------------------------------------------------------

def _fake_exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_nvcc_discovery_order(tmp_path, monkeypatch):
    explicit = _fake_exe(tmp_path / "explicit" / "nvcc")
    home = _fake_exe(tmp_path / "cudahome" / "bin" / "nvcc")
    onpath = _fake_exe(tmp_path / "onpath" / "nvcc")
    monkeypatch.setenv("PATH", str(onpath.parent))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cudahome"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("GLM5_FASTPATH_NVCC", str(explicit))
    assert find_nvcc() == str(explicit)
    monkeypatch.delenv("GLM5_FASTPATH_NVCC")
    assert find_nvcc() == str(home)
    monkeypatch.delenv("CUDA_HOME")
    assert find_nvcc() == str(onpath)
    monkeypatch.setenv("GLM5_FASTPATH_NVCC", str(tmp_path / "nope" / "nvcc"))
    with pytest.raises(NvccNotFoundError, match="GLM5_FASTPATH_NVCC"):
        find_nvcc()


# ---- env vars ---------------------------------------------------------------------------------------

def test_env_flags_parse_and_fail_loudly(monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH_JIT_VERBOSE", "Yes")
    assert env.flag("GLM5_FASTPATH_JIT_VERBOSE") is True
    monkeypatch.setenv("GLM5_FASTPATH_JIT_VERBOSE", "off")
    assert env.flag("GLM5_FASTPATH_JIT_VERBOSE") is False
    monkeypatch.setenv("GLM5_FASTPATH_JIT_VERBOSE", "maybe")
    with pytest.raises(ValueError, match="GLM5_FASTPATH_JIT_VERBOSE"):
        env.flag("GLM5_FASTPATH_JIT_VERBOSE")
    with pytest.raises(KeyError):
        env.flag("GLM5_FASTPATH_NOT_A_THING")


def test_env_docstring_table_lists_exactly_the_registered_variables():
    documented = set(re.findall(r"^\| `(GLM5_FASTPATH_[A-Z0-9_]+)` \|", env.__doc__, re.M))
    assert documented == set(env.VARS), (documented ^ set(env.VARS))


def test_print_config_once(monkeypatch, capsys):
    monkeypatch.setenv("GLM5_FASTPATH_PRINT_CONFIGS", "1")
    env.print_config("test_op_print_once", {"H": 6144}, {"threads": 256})
    env.print_config("test_op_print_once", {"H": 6144}, {"threads": 256})
    err = capsys.readouterr().err
    assert err.count("test_op_print_once(H=6144) -> threads=256") == 1


# ---- ptxas report / runtime helpers that need no GPU ---------------------------------------------

def test_parse_ptxas_info():
    log = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function 'k1' for 'sm_90a'
        ptxas info    : Function properties for k1
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 58 registers, used 1 barriers, 32 bytes smem
        ptxas info    : Compiling entry function 'k2' for 'sm_90a'
        ptxas info    : Function properties for k2
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 10 registers
        """)
    r = parse_ptxas_info(log)
    assert (r["k1"].registers, r["k1"].smem_bytes, r["k1"].spill_store_bytes, r["k1"].spill_load_bytes,
            r["k1"].stack_bytes, r["k1"].barriers) == (58, 32, 4, 12, 8, 1)
    assert (r["k2"].registers, r["k2"].smem_bytes, r["k2"].spill_store_bytes) == (10, 0, 0)


def test_pack_args_refuses_untyped_python_numbers():
    from glm5_fastpath.jit.runtime import pack_args
    keep, ptrs = pack_args([ctypes.c_int32(7), ctypes.c_float(1.5), None])
    assert len(keep) == 3
    assert ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_int32)).contents.value == 7
    with pytest.raises(TypeError, match="ctypes"):
        pack_args([7])


def test_ops_import_needs_neither_cuda_python_nor_a_gpu():
    code = textwrap.dedent("""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "cuda" or name.startswith("cuda."):
                    raise ImportError("blocked for the test: " + name)
        sys.meta_path.insert(0, Block())
        import glm5_fastpath.ops
        from glm5_fastpath.jit import runtime
        try:
            runtime.driver()
        except ImportError as e:
            assert "pip install 'glm5-fastpath[kernels]'" in str(e), e
            print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr


def test_compile_check_skips_cleanly_without_nvcc(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("compile_check", REPO / "scripts" / "compile_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def no_nvcc():
        raise NvccNotFoundError("none here")
    monkeypatch.setattr(mod, "find_nvcc", no_nvcc)
    assert mod.main([]) == 0
    assert "skipped" in capsys.readouterr().out


# ---- real compiles ----------------------------------------------------------------------------------

@needs_nvcc
def test_compile_then_cache_hit(tmp_path):
    spec = KernelSpec("tiny", code=TINY)
    first = compile_kernel(spec, "sm_90a")
    assert not first.cache_hit and first.cubin[:4] == b"\x7fELF"
    second = compile_kernel(spec, "sm_90a")
    assert second.cache_hit and second.cubin == first.cubin and second.key == first.key
    root = tmp_path / "cache" / "sm_90a"
    entries = [p.name for p in root.iterdir() if p.name not in ("locks", "tmp")]
    assert entries == [f"tiny.{first.key[:32]}"]
    assert sorted(p.name for p in (root / entries[0]).iterdir()) == ["compile.log", "kernel.cubin", "manifest.json", "tiny.cu"]  # inline source kept
    assert list((root / "tmp").iterdir()) == []  # no half-built leftovers
    assert json.loads((root / entries[0] / "manifest.json").read_text())["key"] == first.key


@needs_nvcc
def test_disable_cache_always_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH_DISABLE_CACHE", "1")
    spec = KernelSpec("tiny", code=TINY)
    assert not compile_kernel(spec, "sm_90a").cache_hit
    assert not compile_kernel(spec, "sm_90a").cache_hit
    assert not (tmp_path / "cache").exists()


@needs_nvcc
def test_compile_error_carries_command_and_full_log(tmp_path):
    bad = KernelSpec("broken", code='#include "common/pdl.cuh"\nextern "C" __global__ void broken() { this_is_not_cuda; }\n')
    with pytest.raises(KernelCompileError) as ei:
        compile_kernel(bad, "sm_90a")
    msg = str(ei.value)
    assert "this_is_not_cuda" in msg and "error" in msg          # the compiler's own diagnostic
    assert "-gencode=arch=compute_90a,code=sm_90a" in msg and "nvcc" in msg  # the command
    assert ei.value.returncode not in (0, None)
    root = tmp_path / "cache" / "sm_90a"
    assert not any(p.name.startswith("broken.") for p in root.iterdir())
    assert list((root / "tmp").iterdir()) == []


@needs_nvcc
def test_two_processes_compile_once(tmp_path):
    """Both processes miss, one builds under the lock, the other waits and then hits."""
    calls = tmp_path / "compiles.log"
    slow = tmp_path / "slow_nvcc"
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" --version "*) ;; *) echo x >> "{calls}"; sleep 2;; esac\n'
                    f'exec "{NVCC}" "$@"\n')
    slow.chmod(0o755)
    code = textwrap.dedent(f"""
        from glm5_fastpath.jit import KernelSpec, compile_kernel
        ck = compile_kernel(KernelSpec("tiny", code={TINY!r}), "sm_90a")
        print("HIT" if ck.cache_hit else "BUILT", ck.key)
    """)
    envv = {**os.environ, "PYTHONPATH": str(REPO), "GLM5_FASTPATH_NVCC": str(slow),
            "GLM5_FASTPATH_CACHE_DIR": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=envv) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = sorted(o[0].split()[0] for o in outs)
    keys = {o[0].split()[1] for o in outs}
    assert results == ["BUILT", "HIT"] and len(keys) == 1, outs
    assert calls.read_text().count("x") == 1
    root = tmp_path / "cache" / "sm_90a"
    assert len([p for p in root.iterdir() if p.name.startswith("tiny.")]) == 1
    assert list((root / "tmp").iterdir()) == []


@needs_nvcc
def test_keep_writes_ptx_next_to_the_cubin(monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH_JIT_KEEP", "1")
    ck = compile_kernel(KernelSpec("tiny", code=TINY), "sm_90a")
    kept = [p.name for p in (ck.entry_dir / "keep").iterdir()]
    assert any(n.endswith(".ptx") for n in kept), kept


@needs_nvcc
@pytest.mark.parametrize("hidden", [6144, 512])
def test_a0_kernel_compiles_for_sm90a_without_spills(monkeypatch, hidden):
    from glm5_fastpath.ops.add_rmsnorm_quant import config_for
    monkeypatch.setenv("GLM5_FASTPATH_PTXAS_VERBOSE", "1")
    ck = compile_kernel(config_for(hidden).spec, "sm_90a")
    res = ck.resources()["glm5_a0_add_rmsnorm_quant"]
    assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, res
    assert 0 < res.registers <= 128, res


# ---- runtime against a fake driver (real cuda-python structs, fake driver calls) -------------------

class _FakeDriver:
    """Records what runtime.py asks of the driver; structs and enums come from the real bindings."""

    def __init__(self, real, param_sizes):
        self.real = real
        self.param_sizes = list(param_sizes)
        self.ctx_stack = [real.CUcontext(0)]  # a thread with no current context
        self.launches = []
        self.fail_launch = None
        for n in ("CUresult", "CUfunction_attribute", "CUdevice_attribute", "CUlaunchConfig", "CUlaunchAttribute",
                  "CUlaunchAttributeID", "CUstream"):
            setattr(self, n, getattr(real, n))
        self.ok = real.CUresult.CUDA_SUCCESS

    def cuInit(self, flags):
        return (self.ok,)

    def cuDeviceGet(self, i):
        return self.ok, self.real.CUdevice(i)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self.ok, self.real.CUcontext(0x1000)

    def cuDeviceGetAttribute(self, attr, dev):
        return self.ok, 9 if attr == self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR else 0

    def cuCtxGetCurrent(self):
        return self.ok, self.ctx_stack[-1]

    def cuCtxPushCurrent(self, ctx):
        self.ctx_stack.append(ctx)
        return (self.ok,)

    def cuCtxPopCurrent(self):
        return self.ok, self.ctx_stack.pop()

    def cuModuleLoadData(self, addr):
        self.image_head = ctypes.string_at(addr, 4)
        return self.ok, self.real.CUmodule(0x2000)

    def cuModuleGetFunction(self, mod, name):
        self.function_name = name
        return self.ok, self.real.CUfunction(0x3000)

    def cuFuncGetAttribute(self, attr, f):
        fa = self.CUfunction_attribute
        return self.ok, {fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 256, fa.CU_FUNC_ATTRIBUTE_NUM_REGS: 58}.get(attr, 0)

    def cuFuncSetAttribute(self, f, attr, value):
        self.smem_set = value
        return (self.ok,)

    def cuFuncGetParamInfo(self, f, i):
        if i >= len(self.param_sizes):
            return self.CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0
        return self.ok, 8 * i, self.param_sizes[i]

    def cuLaunchKernelEx(self, cfg, f, params, extra):
        if self.fail_launch is not None:
            return (self.fail_launch,)
        ptrs = (ctypes.c_void_p * len(self.param_sizes)).from_address(params)
        raw = [ctypes.string_at(ptrs[i], n) for i, n in enumerate(self.param_sizes)]
        attrs = {int(a.id): a for a in cfg.attrs[: cfg.numAttrs]}
        self.launches.append(dict(grid=(cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                                  block=(cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), smem=cfg.sharedMemBytes,
                                  stream=int(cfg.hStream), raw=raw, attrs=attrs, ctx=int(self.ctx_stack[-1])))
        return (self.ok,)

    def cuGetErrorName(self, err):
        return self.ok, b"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"

    def cuGetErrorString(self, err):
        return self.ok, b"too many resources requested for launch"


def test_runtime_launch_path_with_a_fake_driver(monkeypatch):
    real = pytest.importorskip("cuda.bindings.driver")
    from glm5_fastpath.jit import runtime
    from glm5_fastpath.jit.compiler import CompiledKernel

    fake = _FakeDriver(real, (8, 4, 4, 8))
    monkeypatch.setattr(runtime, "_driver", fake)
    monkeypatch.setattr(runtime, "_devices", {})
    monkeypatch.setattr(runtime, "_modules", {})
    monkeypatch.setattr(runtime, "_kernels", {})
    spec = KernelSpec("fake_kernel", code="// not compiled")
    monkeypatch.setattr(runtime, "compile_kernel",
                        lambda s, arch: CompiledKernel(s, arch, "k" * 64, b"\x7fELF-fake", "", True, None))
    k = runtime.get_kernel(spec, device=0)
    assert runtime.get_kernel(spec, device=0) is k  # loaded once per (process, device)
    assert fake.image_head == b"\x7fELF" and fake.function_name == b"fake_kernel"
    assert (k.num_regs, k.max_threads, k.param_sizes) == (58, 256, (8, 4, 4, 8))

    t = torch_tensor_stub(0xABCDEF00)
    k.launch((3, 2), 128, [t, ctypes.c_int32(-5), ctypes.c_float(1.5), ctypes.c_int64(2**40)], stream=1234,
             pdl=True, cluster=(2, 1, 1), smem=64 * 1024)
    rec = fake.launches[-1]
    assert rec["grid"] == (3, 2, 1) and rec["block"] == (128, 1, 1) and rec["stream"] == 1234
    assert rec["smem"] == 64 * 1024 and fake.smem_set == 64 * 1024  # > 48 KB raised the function's limit
    assert rec["ctx"] == 0x1000 and len(fake.ctx_stack) == 1  # pushed the primary context, popped it after
    assert rec["raw"] == [(0xABCDEF00).to_bytes(8, "little"), (-5).to_bytes(4, "little", signed=True),
                          bytes(ctypes.c_float(1.5)), (2**40).to_bytes(8, "little")]
    ids = real.CUlaunchAttributeID
    pdl = rec["attrs"][int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)]
    assert pdl.value.programmaticStreamSerializationAllowed == 1
    cl = rec["attrs"][int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)].value.clusterDim
    assert (cl.x, cl.y, cl.z) == (2, 1, 1)

    with runtime.launch_priority(-3):  # the CMP executor's _prio modes: one attribute per launch in the block
        assert runtime.current_launch_priority() == -3
        k.launch(1, 32, [t, ctypes.c_int32(0), ctypes.c_float(0), ctypes.c_int64(0)], stream=1234)
    assert runtime.current_launch_priority() is None
    assert rec is not fake.launches[-1]
    assert fake.launches[-1]["attrs"][int(ids.CU_LAUNCH_ATTRIBUTE_PRIORITY)].value.priority == -3
    assert int(ids.CU_LAUNCH_ATTRIBUTE_PRIORITY) not in rec["attrs"]  # none outside the block

    monkeypatch.setenv("GLM5_FASTPATH_DISABLE_PDL", "1")
    k.launch(1, 32, [t, ctypes.c_int32(0), ctypes.c_float(0), ctypes.c_int64(0)], stream=1234, pdl=True)
    assert fake.launches[-1]["attrs"] == {}

    with pytest.raises(TypeError, match="sizes"):  # an int64 where the kernel takes an int32
        k.launch(1, 32, [t, ctypes.c_int64(0), ctypes.c_float(0), ctypes.c_int64(0)], stream=1234)
    with pytest.raises(ValueError, match="256-thread limit"):
        k.launch(1, 512, [t, ctypes.c_int32(0), ctypes.c_float(0), ctypes.c_int64(0)], stream=1234)
    fake.fail_launch = real.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(runtime.CudaDriverError, match=r"cuLaunchKernelEx\(fake_kernel\).*OUT_OF_RESOURCES"):
        k.launch(1, 32, [t, ctypes.c_int32(0), ctypes.c_float(0), ctypes.c_int64(0)], stream=1234)
    assert len(fake.ctx_stack) == 1


class torch_tensor_stub:  # noqa: N801 - stands in for a torch.Tensor (only data_ptr is used)
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr
