"""Loading cubins and launching kernels through the CUDA driver API (cuda-python's bindings).

- A cubin is loaded once per (process, device) into the device's primary context, the one
  PyTorch uses, so our launches and torch's share streams and memory.
- Kernels launch with cuLaunchKernelEx on torch.cuda.current_stream() by default, with optional
  launch attributes: Programmatic Dependent Launch (PDL) and cluster dimensions. Dynamic shared
  memory above 48 KB is enabled per function with cuFuncSetAttribute on first use.
- Every CUresult is checked; a failure raises CudaDriverError naming the driver function, the
  kernel and the error name and text.
- Kernel arguments are ctypes values (c_int32, c_int64, c_float, c_void_p, ctypes.Structure) or
  torch tensors (passed as their data pointer); a bare Python int/float is refused because its
  width would be a guess. Their sizes are checked once against the cubin's own parameter layout
  (cuFuncGetParamInfo, CUDA 12.4+), so a Python/C signature mismatch fails loudly.

cuda-python versions: `cuda.bindings.driver` (cuda-bindings 12.6+ and 13.x) is preferred; the
old `cuda.cuda` module (cuda-python < 12.6) is the fallback. Only calls and structs present in
both are used; kernel parameters are passed as a raw `void**` address, which every version accepts.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from . import env
from .compiler import CompiledKernel, KernelSpec, arch_from_capability, compile_kernel

INSTALL_HINT = "pip install 'glm5-fastpath[kernels]'  (installs cuda-bindings)"

_driver: Any = None


def driver() -> Any:
    """The cuda-python driver module (imported on first use, never at package import)."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as d  # cuda-bindings >= 12.6, 13.x
        except ImportError:
            try:
                from cuda import cuda as d  # type: ignore[no-redef]  # cuda-python < 12.6
            except ImportError as e:
                raise ImportError(f"glm5_fastpath kernels need the CUDA driver bindings: {INSTALL_HINT}") from e
        _driver = d
    return _driver


class CudaDriverError(RuntimeError):
    """A CUDA driver call returned an error."""

    def __init__(self, what: str, code: Any, name: str, text: str):
        self.code = code
        super().__init__(f"glm5_fastpath: {what} failed: {name} ({text})")


def _err_text(err: Any) -> tuple[str, str]:
    d = driver()
    try:
        name = d.cuGetErrorName(err)[1]
        text = d.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # the driver itself may be unusable
        name, text = str(err), "no error string available"
    return name, text


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python result tuple (err, *values); raise CudaDriverError unless err is success."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != 0:
        raise CudaDriverError(what, err, *_err_text(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# ---- devices and contexts -------------------------------------------------------------------------

@dataclass
class _DeviceState:
    index: int
    device: Any
    ctx: Any
    ctx_addr: int
    arch: str


_lock = threading.RLock()
_devices: dict[int, _DeviceState] = {}


def _device_state(index: int) -> _DeviceState:
    st = _devices.get(index)
    if st is not None:
        return st
    with _lock:
        st = _devices.get(index)
        if st is None:
            d = driver()
            check(d.cuInit(0), "cuInit")
            dev = check(d.cuDeviceGet(index), f"cuDeviceGet({index})")
            ctx = check(d.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain({index})")
            major = check(d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
            minor = check(d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
            st = _DeviceState(index, dev, ctx, int(ctx), arch_from_capability(int(major), int(minor)))
            _devices[index] = st
    return st


class _InContext:
    """Make the device's primary context current for a few driver calls, without leaving a trace.

    Pushes only when the thread's current context is another one (a thread that never touched
    CUDA, or one whose current device is a different GPU) and pops afterwards, so torch's idea
    of the current device is never changed.
    """

    __slots__ = ("st", "pushed")

    def __init__(self, st: _DeviceState):
        self.st = st
        self.pushed = False

    def __enter__(self) -> None:
        d = driver()
        cur = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) != self.st.ctx_addr:
            check(d.cuCtxPushCurrent(self.st.ctx), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc: Any) -> None:
        if self.pushed:
            check(driver().cuCtxPopCurrent(), "cuCtxPopCurrent")


# ---- argument packing -----------------------------------------------------------------------------

_CTYPES_SCALAR = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)


def pack_args(args: Sequence[Any]) -> tuple[list[Any], Any]:
    """Kernel arguments -> (objects to keep alive, ctypes void*[] whose address is kernelParams)."""
    vals: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, _CTYPES_SCALAR):
            vals.append(a)
        elif a is None:
            vals.append(ctypes.c_void_p(None))
        elif hasattr(a, "data_ptr") and callable(a.data_ptr):  # torch.Tensor (no torch import needed)
            vals.append(ctypes.c_void_p(a.data_ptr()))
        else:
            raise TypeError(f"kernel argument {i} is a {type(a).__name__}; pass a ctypes value "
                            "(c_int32 / c_int64 / c_float / c_void_p / Structure) or a tensor, so the ABI width is explicit")
    ptrs = (ctypes.c_void_p * max(len(vals), 1))(*[ctypes.addressof(v) for v in vals])
    return vals, ptrs


# ---- loaded modules and kernels ------------------------------------------------------------------

class Kernel:
    """One extern "C" function of a loaded cubin on one device."""

    def __init__(self, module: "Module", name: str):
        d = driver()
        self.module = module
        self.name = name
        self.device_index = module.device.index
        with _InContext(module.device):
            self.func = check(d.cuModuleGetFunction(module.handle, name.encode()), f"cuModuleGetFunction({name})")
            fa = d.CUfunction_attribute
            self.max_threads = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.func),
                                         f"cuFuncGetAttribute({name})"))
            self.num_regs = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_NUM_REGS, self.func),
                                      f"cuFuncGetAttribute({name})"))
            self.static_smem = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.func),
                                         f"cuFuncGetAttribute({name})"))
            self.local_bytes = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self.func),
                                         f"cuFuncGetAttribute({name})"))
            self.param_sizes = self._param_sizes()
            # The default dynamic-smem limit is 48 KB MINUS the static smem, not 48 KB: assuming 48 KB made
            # launches with static + dynamic > 48 KB fail with CUDA_ERROR_INVALID_VALUE (E2 on the H200).
            self._dyn_smem_limit = int(check(
                d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.func),
                f"cuFuncGetAttribute({name})"))
        self._checked_signatures: set[tuple[type, ...]] = set()

    def _param_sizes(self) -> tuple[int, ...] | None:
        d = driver()
        if not hasattr(d, "cuFuncGetParamInfo"):
            return None
        sizes = []
        for i in range(4096):
            try:
                r = d.cuFuncGetParamInfo(self.func, i)
            except Exception:  # bindings newer than the driver: the entry point is missing
                return None
            if int(r[0]) != 0:
                if i == 0 and int(r[0]) != int(d.CUresult.CUDA_ERROR_INVALID_VALUE):
                    return None  # driver too old for the query: skip the check
                break
            sizes.append(int(r[2]))
        return tuple(sizes)

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        d = driver()
        with _InContext(self.module.device):
            check(d.cuFuncSetAttribute(self.func, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       int(nbytes)), f"cuFuncSetAttribute({self.name}, max dynamic smem={nbytes})")
        self._dyn_smem_limit = int(nbytes)

    def _check_args(self, vals: Sequence[Any]) -> None:
        sig = tuple(type(v) for v in vals)
        if sig in self._checked_signatures or self.param_sizes is None:
            return
        got = tuple(ctypes.sizeof(v) for v in vals)
        if got != self.param_sizes:
            raise TypeError(f"glm5_fastpath: kernel {self.name} takes {len(self.param_sizes)} parameters of sizes "
                            f"{self.param_sizes} bytes; the launcher passed {len(got)} of sizes {got}")
        self._checked_signatures.add(sig)

    def _block(self, block: Sequence[int], smem: int) -> tuple[int, int, int]:
        """Checked block dims; raises the dynamic shared-memory limit to `smem` when needed."""
        bx, by, bz = _dim3(block, "block")
        if bx * by * bz > self.max_threads:
            raise ValueError(f"glm5_fastpath: kernel {self.name}: block {bx}x{by}x{bz} exceeds its "
                             f"{self.max_threads}-thread limit")
        if smem > self._dyn_smem_limit:
            self.set_max_dynamic_smem(smem)
        return bx, by, bz

    def _grid(self, grid: Sequence[int]) -> tuple[int, int, int]:
        gx, gy, gz = _dim3(grid, "grid")
        if gx > 2**31 - 1 or gy > 65535 or gz > 65535:
            raise ValueError(f"glm5_fastpath: kernel {self.name}: grid {gx}x{gy}x{gz} is too large")
        return gx, gy, gz

    def launch(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *, smem: int = 0,
               stream: Any = None, pdl: bool = False, cluster: Sequence[int] | None = None) -> None:
        """Launch on `stream` (default: torch's current stream of this kernel's device).

        pdl: add CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (ignored when
        GLM5_FASTPATH_DISABLE_PDL is set); cluster: (x, y, z) CTAs per cluster.
        """
        d = driver()
        gx, gy, gz = self._grid(grid)
        bx, by, bz = self._block(block, smem)
        vals, ptrs = pack_args(args)
        self._check_args(vals)

        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
        cfg.sharedMemBytes = int(smem)
        cfg.hStream = d.CUstream(_stream_handle(stream, self.device_index))
        attrs = []
        if pdl and not env.flag("GLM5_FASTPATH_DISABLE_PDL"):
            attrs.append(_pdl_attribute())
        prio = current_launch_priority()
        if prio is not None:
            attrs.append(_priority_attribute(prio))
        if cluster is not None:
            cx, cy, cz = _dim3(cluster, "cluster")
            a = d.CUlaunchAttribute()
            a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cx, cy, cz
            attrs.append(a)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        with _InContext(self.module.device):
            check(d.cuLaunchKernelEx(cfg, self.func, ctypes.addressof(ptrs), 0), f"cuLaunchKernelEx({self.name})")
        del vals  # parameters are copied at launch; keep them alive until here

    def prepare(self, block: Sequence[int], args: Sequence[Any], *, smem: int = 0, pdl: bool = False) -> "PreparedLaunch":
        """Pack `args` once for repeated eager launches of this kernel (PreparedLaunch): per launch only the grid,
        the stream and the ctypes scalars changed in place differ. For per-step launches outside CUDA graphs, where
        launch()'s packing and config building are host time on every step."""
        return PreparedLaunch(self, block, args, smem=smem, pdl=pdl)

    def max_active_clusters(self, block: Sequence[int], cluster: Sequence[int], *, smem: int = 0) -> int:
        """How many clusters of `cluster` CTAs of `block` threads with `smem` dynamic shared memory fit on the device at
        once (cuOccupancyMaxActiveClusters): a GPC whose SM count is not a multiple of the cluster size leaves SMs out."""
        d = driver()
        bx, by, bz = _dim3(block, "block")
        cx, cy, cz = _dim3(cluster, "cluster")
        if smem > self._dyn_smem_limit:
            self.set_max_dynamic_smem(smem)
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cx, cy, cz
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
        cfg.sharedMemBytes = int(smem)
        a = d.CUlaunchAttribute()
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cx, cy, cz
        cfg.attrs = [a]
        cfg.numAttrs = 1
        with _InContext(self.module.device):
            res = d.cuOccupancyMaxActiveClusters(self.func, cfg)
        check(res[0], f"cuOccupancyMaxActiveClusters({self.name})")
        return int(res[1])

    def __repr__(self) -> str:
        return (f"Kernel({self.name!r}, device={self.device_index}, regs={self.num_regs}, "
                f"static_smem={self.static_smem}, local={self.local_bytes})")


class PreparedLaunch:
    """A kernel launch packed once (Kernel.prepare): the parameter block, block dims, shared memory and attributes stay;
    `launch(grid, stream)` sets the grid and the stream and launches. Scalars are ctypes objects in `vals` (set
    `vals[i].value` before a launch); tensor arguments are their data pointers AT PREPARE TIME, so the tensors must
    stay alive and in place (static buffers). No launch priority (eager launches outside the CMP executor)."""

    __slots__ = ("kernel", "vals", "ptrs", "cfg", "_stream")

    def __init__(self, kernel: Kernel, block: Sequence[int], args: Sequence[Any], *, smem: int = 0, pdl: bool = False):
        d = driver()
        bx, by, bz = kernel._block(block, smem)
        self.kernel = kernel
        self.vals, self.ptrs = pack_args(args)
        kernel._check_args(self.vals)
        cfg = d.CUlaunchConfig()
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
        cfg.sharedMemBytes = int(smem)
        attrs = [_pdl_attribute()] if pdl and not env.flag("GLM5_FASTPATH_DISABLE_PDL") else []
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        self.cfg = cfg
        self._stream: int | None = None

    def launch(self, grid: Sequence[int], stream: Any = None) -> None:
        d = driver()
        gx, gy, gz = self.kernel._grid(grid)
        cfg = self.cfg
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
        h = _stream_handle(stream, self.kernel.device_index)
        if h != self._stream:
            cfg.hStream = d.CUstream(h)
            self._stream = h
        with _InContext(self.kernel.module.device):
            check(d.cuLaunchKernelEx(cfg, self.kernel.func, ctypes.addressof(self.ptrs), 0),
                  f"cuLaunchKernelEx({self.kernel.name})")


_pdl_attr: Any = None
_priority = threading.local()


@contextlib.contextmanager
def launch_priority(priority: int | None):
    """Every Kernel.launch on this thread inside the block carries CU_LAUNCH_ATTRIBUTE_PRIORITY = priority (None:
    no attribute, the stream's priority applies). Lower numbers run first when CTAs compete for SMs (the range is
    priority_range()). CUDA graphs captured by torch keep it: torch instantiates with
    cudaGraphInstantiateFlagUseNodePriority, so a kernel node replays with the priority it was captured with.
    Used by the CMP executor to let a critical-path branch's CTAs take SMs before another branch's."""
    prev = getattr(_priority, "value", None)
    _priority.value = priority
    try:
        yield
    finally:
        _priority.value = prev


def current_launch_priority() -> int | None:
    return getattr(_priority, "value", None)


def priority_range(device: Any = None) -> tuple[int, int]:
    """(least, greatest) launch / stream priority on `device` (default: torch's current one), e.g. (0, -5):
    greatest runs first. Queried inside the device's primary context."""
    d = driver()
    with _InContext(_device_state(_device_index(device))):
        least, greatest = check(d.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return int(least), int(greatest)


_priority_attrs: dict[int, Any] = {}


def _priority_attribute(priority: int) -> Any:
    a = _priority_attrs.get(int(priority))
    if a is None:  # one struct per value, as for the PDL attribute
        d = driver()
        a = d.CUlaunchAttribute()
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PRIORITY
        a.value.priority = int(priority)
        _priority_attrs[int(priority)] = a
    return a


def _pdl_attribute() -> Any:
    global _pdl_attr
    if _pdl_attr is None:
        d = driver()
        a = d.CUlaunchAttribute()
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        _pdl_attr = a
    return _pdl_attr


def _dim3(v: Sequence[int] | int, what: str) -> tuple[int, int, int]:
    t = (int(v), 1, 1) if isinstance(v, int) else tuple(int(x) for x in v) + (1,) * (3 - len(v))
    if len(t) != 3 or min(t) < 1:
        raise ValueError(f"glm5_fastpath: {what} dims must be 1-3 positive ints, got {v!r}")
    return t  # type: ignore[return-value]


def _stream_handle(stream: Any, device_index: int) -> int:
    if stream is None:
        import torch
        return torch.cuda.current_stream(device_index).cuda_stream
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        return int(stream.cuda_stream)
    return int(stream)  # a cuda-python CUstream


class Module:
    """A cubin loaded into one device's primary context (unloaded never: lives for the process)."""

    def __init__(self, compiled: CompiledKernel, device: _DeviceState):
        d = driver()
        if compiled.arch != device.arch:
            raise RuntimeError(f"glm5_fastpath: cubin for {compiled.arch} cannot run on device {device.index} ({device.arch})")
        self.compiled = compiled
        self.device = device
        image = ctypes.create_string_buffer(compiled.cubin, len(compiled.cubin))
        with _InContext(device):
            self.handle = check(d.cuModuleLoadData(ctypes.addressof(image)), f"cuModuleLoadData({compiled.spec.name})")
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = Kernel(self, name)
        return k

    def copy_global(self, name: str, out: Any = None, nbytes: int | None = None) -> None:
        """A `__device__` array of this module (a diagnostic build's marks): copy its first out.nbytes bytes into
        the torch tensor `out`, or (out None) zero its first `nbytes` (all of it by default). Synchronous: the
        device is synchronised before and after, so it never races a launch."""
        import torch
        d = driver()
        torch.cuda.synchronize(self.device.index)
        with _InContext(self.device):
            ptr, size = check(d.cuModuleGetGlobal(self.handle, name.encode()), f"cuModuleGetGlobal({name})")
            if out is not None:
                n = out.numel() * out.element_size()
                if n > int(size):
                    raise ValueError(f"glm5_fastpath: {name} holds {int(size)} bytes, {n} requested")
                check(d.cuMemcpyDtoD(out.data_ptr(), ptr, n), f"cuMemcpyDtoD({name})")
            else:
                check(d.cuMemsetD8(ptr, 0, int(size) if nbytes is None else min(int(nbytes), int(size))),
                      f"cuMemsetD8({name})")
        torch.cuda.synchronize(self.device.index)


_modules: dict[tuple[str, int], Module] = {}
_kernels: dict[tuple[KernelSpec, int, str], Kernel] = {}


def _device_index(device: Any) -> int:
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"glm5_fastpath: kernels run on CUDA devices, got {dev}")
    return dev.index if dev.index is not None else torch.cuda.current_device()


def get_kernel(spec: KernelSpec, function: str | None = None, device: Any = None) -> Kernel:
    """Compile (or take from cache), load once per (process, device), and return the function handle."""
    idx = _device_index(device)
    fn = function or spec.functions[0]
    k = _kernels.get((spec, idx, fn))
    if k is not None:
        return k
    if fn not in spec.functions:
        raise ValueError(f"glm5_fastpath: {fn!r} is not among kernel {spec.name!r}'s functions {spec.functions}")
    with _lock:
        k = _kernels.get((spec, idx, fn))
        if k is None:
            st = _device_state(idx)
            compiled = compile_kernel(spec, st.arch)
            mod = _modules.get((compiled.key, idx))
            if mod is None:
                mod = _modules[(compiled.key, idx)] = Module(compiled, st)
            k = _kernels[(spec, idx, fn)] = mod.kernel(fn)
    return k
