"""The late producer of the GPU PDL tests: a kernel that lets its dependents launch at once, spins,
then writes a consumer's input. A consumer launched with PDL right behind it starts early and must
still read only the fresh data (its griddepcontrol.wait is what the tests check).

    producer = late_producer()
    produce(producer, x_true, x)          # x <- x_true, ~SPIN_NS after the launch
    out = op(x, ..., pdl=True)            # must see x_true
"""
from __future__ import annotations

import ctypes
from typing import Any

SPIN_NS = 50_000
PRODUCER_CTAS = 8  # few CTAs: the dependent grid fits beside them and really starts early
PRODUCER_THREADS = 256
FUNCTION = "glm5_test_spin_then_copy"

SOURCE = r"""
#include "common/pdl.cuh"
// Lets its dependents launch at once, spins spin_ns, then copies src -> dst (16-byte vectors).
extern "C" __global__ void glm5_test_spin_then_copy(const uint4* src, uint4* dst, long long n_vec,
                                                    unsigned long long spin_ns) {
    glm5::ptx::griddep_launch_dependents();
    const uint64_t t0 = glm5::ptx::globaltimer_ns();
    while (glm5::ptx::globaltimer_ns() - t0 < spin_ns) {
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def late_producer_spec() -> Any:
    from ..jit import KernelSpec
    return KernelSpec("glm5_test_late_producer", code=SOURCE, functions=(FUNCTION,))


def late_producer(device: Any = None) -> Any:
    """The producer kernel (compiled and loaded on first use)."""
    from ..jit import get_kernel
    return get_kernel(late_producer_spec(), FUNCTION, device)


def produce(producer: Any, src: Any, dst: Any, spin_ns: int = SPIN_NS) -> None:
    """Launch `producer` (no PDL attribute itself): dst <- src after ~spin_ns; both contiguous, same byte size."""
    nbytes = src.numel() * src.element_size()
    assert nbytes % 16 == 0, f"late producer copies 16-byte vectors: {nbytes=}"
    producer.launch((PRODUCER_CTAS, 1, 1), (PRODUCER_THREADS, 1, 1),
                    [src, dst, ctypes.c_int64(nbytes // 16), ctypes.c_uint64(spin_ns)], pdl=False)
