"""What this machine can run, and why not: GPU, compute capability, compiler, bindings, SGLang.

Used by `glm5-fastpath info`, by the demo to pick the best available path, and by the
SGLang plugin to log which path each case takes.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from dataclasses import dataclass, field


@dataclass
class PathStatus:
    name: str
    available: bool
    why: str


@dataclass
class PlatformInfo:
    torch_version: str
    cuda_available: bool
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None
    num_sms: int | None = None
    num_gpus: int = 0
    peer_access: bool | None = None  # every visible GPU can map every other's memory (the EP kernel's NVLink loads/stores)
    l2_bytes: int | None = None
    nvcc: str | None = None
    cuda_python: str | None = None
    cutlass: str | None = None
    sglang: str | None = None
    deep_gemm: str | None = None
    paths: list[PathStatus] = field(default_factory=list)

    @property
    def is_hopper(self) -> bool:
        return self.capability is not None and self.capability[0] == 9


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution found among names (None if none is)."""
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _nvcc() -> str | None:
    try:
        from .jit.compiler import find_nvcc  # the JIT layer's own discovery order
        return find_nvcc()
    except Exception:  # noqa: BLE001 - info must never fail
        return shutil.which("nvcc")


def detect() -> PlatformInfo:
    import torch

    info = PlatformInfo(torch_version=torch.__version__, cuda_available=torch.cuda.is_available())
    if info.cuda_available:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.gpu_name, info.capability = p.name, (p.major, p.minor)
        info.num_sms = p.multi_processor_count
        info.l2_bytes = getattr(p, "L2_cache_size", None)
        info.num_gpus = torch.cuda.device_count()
        if info.num_gpus > 1:
            try:
                info.peer_access = all(torch.cuda.can_device_access_peer(a, b) for a in range(info.num_gpus)
                                       for b in range(info.num_gpus) if a != b)
            except Exception:  # noqa: BLE001 - info must never fail
                info.peer_access = None
    info.nvcc = _nvcc()
    info.cuda_python = dist_version("cuda-bindings", "cuda-python")
    info.cutlass = dist_version("nvidia-cutlass")
    info.sglang = dist_version("sglang")
    info.deep_gemm = dist_version("sgl-deep-gemm", "deep-gemm", "deep_gemm")
    info.paths = _paths(info)
    return info


def _paths(i: PlatformInfo) -> list[PathStatus]:
    out = [PathStatus("reference (pure PyTorch)", True, "always available (CPU or CUDA)")]
    if not i.cuda_available:
        kern_why = "no CUDA GPU visible"
    elif not i.is_hopper:
        kern_why = f"GPU {i.gpu_name} is sm_{i.capability[0]}{i.capability[1]}; the kernels target Hopper sm_90a"
    elif i.nvcc is None:
        kern_why = "nvcc not found (set CUDA_HOME or GLM5_FASTPATH_NVCC) — kernels are compiled just-in-time"
    elif i.cuda_python is None:
        kern_why = "cuda-python missing: pip install 'glm5-fastpath[kernels]'"
    else:
        kern_why = ""
    ok = kern_why == ""
    out.append(PathStatus("JIT kernels (attention prefix ops A0..E2, MoE router, act quant)", ok,
                          kern_why or f"sm_{i.capability[0]}{i.capability[1]}, nvcc {i.nvcc}; correct on H200, "
                                      "tuning toward the bytes floor in progress (issue #3)"))
    out.append(PathStatus("CMP executor (prefix: CUDA graph + streams + PDL)", ok, kern_why or "built (issue #4)"))
    out.append(PathStatus("MegaMoE (fused FP8 MoE)", ok, kern_why or "built"))
    if not ok:
        ep_why = kern_why
    elif i.num_gpus < 2:
        ep_why = f"{i.num_gpus} GPU visible: expert parallelism needs 2-8 (simulated ranks on one GPU still run: moe.ep.simulate)"
    elif i.peer_access is False:
        ep_why = f"{i.num_gpus} GPUs, but not all pairs have peer access (the EP kernel reads and writes peers' memory)"
    else:
        ep_why = ""
    out.append(PathStatus("MegaMoE across GPUs (expert parallel)", ep_why == "",
                          ep_why or f"{i.num_gpus} GPUs with peer access; `glm5-fastpath bench moe --ep "
                                    f"{min(i.num_gpus, 8)}` (measured at EP2 on H200s; issue #8)"))
    out.append(PathStatus("MegaRTP executor (prefix megakernel)", False,
                          "in progress (issue #5): host plan + megakernel for part of the op graph; the SGLang route "
                          "does not select it yet"))
    routes = ("routes decode steps per the selection table: the attention prefix to CMP and the MoE to MegaMoE "
              "(the shipped H200 table is measured; other GPUs keep SGLang's path until `glm5-fastpath tune`), "
              "and, wherever the table routes a bucket to our kernels, the DSA sparse-MLA core at <= 16 tokens to "
              "our split-KV kernel (GLM5_FASTPATH_SPARSE_MLA=sglang keeps FlashMLA)")
    if i.sglang is None:
        out.append(PathStatus("SGLang plugin", False, f"sglang not installed (pip install 'glm5-fastpath[sglang]'); "
                              "with it, --enable-glm5-fastpath " + routes))
    else:
        out.append(PathStatus("SGLang plugin", ok, f"sglang {i.sglang} found; --enable-glm5-fastpath " + routes
                              + ("" if ok else f"; here: {kern_why}, so SGLang's path")))
    if i.deep_gemm is None:
        out.append(PathStatus("stock baselines (DeepGEMM)", False, "sgl-deep-gemm not installed (pip install 'glm5-fastpath[baselines]')"))
    else:
        out.append(PathStatus("stock baselines (DeepGEMM)", i.cuda_available, f"sgl-deep-gemm {i.deep_gemm}" + ("" if i.cuda_available else ", but no GPU")))
    return out


def render(info: PlatformInfo) -> str:
    lines = [f"torch        {info.torch_version}"]
    if info.cuda_available:
        cap = f"sm_{info.capability[0]}{info.capability[1]}" if info.capability else "?"
        l2 = f", L2 {info.l2_bytes / 2**20:.0f} MiB" if info.l2_bytes else ""
        lines.append(f"GPU          {info.gpu_name} ({cap}, {info.num_sms} SMs{l2})")
    else:
        lines.append("GPU          none (CUDA not available)")
    lines += [f"nvcc         {info.nvcc or 'not found'}",
              f"cuda-python  {info.cuda_python or 'not installed'}",
              f"cutlass      {info.cutlass or 'not installed'}",
              f"sglang       {info.sglang or 'not installed'}",
              f"deep_gemm    {info.deep_gemm or 'not installed'}", "", "paths:"]
    for p in info.paths:
        lines.append(f"  [{'x' if p.available else ' '}] {p.name:42s} {p.why}")
    return "\n".join(lines)
