"""ops.prefetch.l2_prefetch: the range arithmetic and argument checks (CPU), and on the GPU that it changes no
memory, keeps stream order under PDL (a late producer, then the prefetch, then a PDL consumer of the producer's
output must see the final data), and captures into a CUDA graph."""
from __future__ import annotations

import ctypes

import pytest
import torch

from glm5_fastpath import ops
from glm5_fastpath.ops import prefetch as P
from glm5_fastpath.ref.fp8 import quant_act_per_token
from glm5_fastpath.testing.numerics import assert_equal
from glm5_fastpath.testing.pdl import late_producer, produce

FP8 = torch.float8_e4m3fn


# ---- ranges (pure arithmetic) ---------------------------------------------------------------------------

def test_k_prefix_of_a_row_major_weight():
    r = P.range_for(0x10000, (6144, 16384), (16384, 1), 1, 0.3)
    assert (r.base, r.row_stride, r.rows) == (0x10000, 16384, 6144)
    assert r.row_bytes == int(0.3 * 16384) // 16 * 16 and r.row_bytes % 16 == 0
    assert r.pieces == 6144  # one 16 KB piece per row


def test_whole_tensor_and_views_prefetch_their_byte_span():
    # contiguous 3-D, fraction 1: one range over all bytes
    r = P.range_for(0x1000, (64, 512, 256), (512 * 256, 256, 1), 2, 1.0)
    assert (r.rows, r.row_bytes) == (1, 64 * 512 * 256 * 2)
    # a transposed view covers the same storage
    t = P.range_for(0x1000, (64, 256, 512), (512 * 256, 1, 256), 2, 1.0)
    assert t == r
    # a fraction of a span: its first bytes, rounded in to 16-byte granules
    h = P.range_for(0x1008, (1000,), (1,), 1, 0.5)
    assert h.base == 0x1010 and h.row_bytes == (0x1008 + 500) // 16 * 16 - 0x1010


def test_nothing_to_prefetch():
    assert P.range_for(0x1000, (0, 8), (8, 1), 2, 1.0) is None
    assert P.range_for(0x1000, (3,), (1,), 2, 1.0) is None            # 6 bytes < one granule
    assert P.range_for(0x1000, (4, 16), (16, 1), 1, 0.5) is None       # 8-byte row prefixes


def test_misaligned_rows_fall_back_to_a_span_prefix():
    r = P.range_for(0x1000, (10, 100), (100, 1), 1, 0.5)  # 100-byte rows: not 16-byte aligned
    assert r.rows == 1 and r.row_bytes == 496


def test_grid_and_param_block():
    rs = [P.Range(0, 16384, 4096, 6144), P.Range(0, 2**24, 2**24, 1)]
    assert P.grid_for(rs, 132) == 132 and P.grid_for(rs[:0], 132) == 0
    assert P.grid_for([P.Range(0, 16, 16, 3)], 132) == 3
    assert P.grid_for([P.Range(0, 16, 16, 3)], 132, bulk=False) == 1
    assert P.grid_for([P.Range(0, 2**20, 2**20, 1)], 132, bulk=False) == 65  # 8193 line slots / 128 threads
    assert P.grid_for(rs, 132, bulk=False) == 132
    assert ctypes.sizeof(P._Params) == 4 * 32 + 16  # kMaxRanges L2Range + 3 x int32 (padded): the kernel's ABI


@pytest.mark.parametrize("tensors, fractions, match", [
    ("x", [1.0], "list of torch.Tensor"),
    ([torch.zeros(4)], [1.0, 1.0], "one float per tensor"),
    ([torch.zeros(4)] * 5, [1.0] * 5, "at most 4"),
    ([torch.zeros(4)], [0.0], r"in \(0, 1\]"),
    ([torch.zeros(4)], [1.5], r"in \(0, 1\]"),
    ([torch.zeros(4)], [True], r"in \(0, 1\]"),
    ([torch.zeros(4)], ["half"], r"numbers in \(0, 1\]"),
])
def test_bad_arguments_name_the_op(tensors, fractions, match):
    with pytest.raises(ValueError, match=f"l2_prefetch.*{match}"):
        ops.l2_prefetch(tensors, fractions)
    from glm5_fastpath.ops.prefetch import SideStream

    with pytest.raises(ValueError, match=f"l2_prefetch.*{match}"):  # the side-stream form validates the same way
        SideStream().issue(tensors, fractions)


def test_cpu_is_a_no_op_and_the_op_is_registered():
    x = torch.randn(64, 64)
    before = x.clone()
    ops.l2_prefetch([x], [0.5])
    torch.ops.glm5_fastpath.l2_prefetch([x], [1.0], True)
    assert torch.equal(x, before)
    with pytest.raises(ValueError, match="pdl must be a bool"):
        ops.l2_prefetch([x], pdl=1)
    with pytest.raises(ValueError, match="bulk must be a bool"):
        ops.l2_prefetch([x], bulk="yes")
    side = P.SideStream()
    assert not side.issue([x]) and not side.pending


def test_kernel_spec_is_compile_checked():
    assert P.SPEC in ops.compile_check_specs()


# ---- GPU ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [False, True])
def test_prefetch_changes_no_memory(bulk, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randint(0, 255, (6144, 16384), dtype=torch.uint8, device="cuda", generator=g)
    v = torch.randn(64, 512, 256, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    w0, v0 = w.clone(), v.clone()
    for f in (0.3, 1.0):
        ops.l2_prefetch([w, v], [f, 1.0], bulk=bulk)
    side = P.SideStream()
    side.issue([w, v], [0.5, 1.0], bulk=bulk)
    side.join()
    torch.cuda.synchronize()
    assert torch.equal(w, w0) and torch.equal(v, v0)


@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("m", [1, 16])
def test_pdl_consumer_after_the_prefetch_still_waits_for_the_late_producer(m, bulk, seed, no_pdl_override):
    """producer (spins, then writes h) -> l2_prefetch (PDL) -> act_quant_fp8 (PDL) reading h: the prefetch
    kernel writes nothing, so only its own griddepcontrol.wait keeps the consumer behind the producer."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.randint(0, 255, (4096, 8192), dtype=torch.uint8, device="cuda", generator=g)
    h_true = torch.randn(m, 6144, device="cuda", generator=g).to(torch.bfloat16)
    h = torch.full_like(h_true, 7.0)
    ref8, refs = quant_act_per_token(h_true)
    producer = late_producer()
    ops.act_quant_fp8(h_true)  # compile + load outside the timed order
    ops.l2_prefetch([weight])
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        ops.l2_prefetch([weight], [0.5], pdl=True, bulk=bulk)
        x8, xs = ops.act_quant_fp8(h, pdl=True)
        torch.cuda.synchronize()
        assert_equal("l2_prefetch->act_quant", x8.view(torch.uint8), ref8.view(torch.uint8), context=f"{m=}")
        assert_equal("l2_prefetch->act_quant", xs, refs, context=f"{m=}")


@pytest.mark.gpu
def test_captures_into_a_cuda_graph(seed, no_pdl_override):
    g = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.randint(0, 255, (2048, 4096), dtype=torch.uint8, device="cuda", generator=g)
    h = torch.randn(8, 6144, device="cuda", generator=g).to(torch.bfloat16)
    ops.act_quant_fp8(h)
    ops.l2_prefetch([weight])
    torch.cuda.synchronize()
    side = P.SideStream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.l2_prefetch([weight, h], [0.25, 1.0])
        side.issue([weight], [1.0])  # forked off the capturing stream, joined before the capture ends
        x8, xs = ops.act_quant_fp8(h, pdl=True)
        side.join()
    for step in range(2):
        h.copy_(torch.randn(8, 6144, device="cuda", generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        r8, rs = quant_act_per_token(h)
        assert_equal("graph", x8.view(torch.uint8), r8.view(torch.uint8), context=f"replay {step}")
        assert_equal("graph", xs, rs, context=f"replay {step}")
