"""Kernel JIT layer: csrc/ CUDA sources -> nvcc -> cached CUBIN -> cuda-python driver launch.

- `compiler`: nvcc discovery, the content-addressed disk cache, compile-only mode (no GPU needed).
- `runtime`: cubin loading per (process, device) and cuLaunchKernelEx launches (needs cuda-python,
  imported lazily: importing this package needs neither a GPU nor cuda-python).
- `env`: the documented GLM5_FASTPATH_* debug variables (see its docstring table).
"""
from . import env
from .compiler import (
    CompiledKernel,
    KernelCompileError,
    KernelResources,
    KernelSpec,
    NvccNotFoundError,
    arch_from_capability,
    cache_key,
    cache_root,
    compile_kernel,
    csrc_dir,
    find_nvcc,
    parse_ptxas_info,
)


def get_kernel(spec, function=None, device=None):
    """Compile/load `spec` on `device` and return its runtime.Kernel (imports cuda-python on first call)."""
    from .runtime import get_kernel as _get
    return _get(spec, function, device)


__all__ = [
    "CompiledKernel", "KernelCompileError", "KernelResources", "KernelSpec", "NvccNotFoundError",
    "arch_from_capability", "cache_key", "cache_root", "compile_kernel", "csrc_dir", "env", "find_nvcc",
    "get_kernel", "parse_ptxas_info",
]
