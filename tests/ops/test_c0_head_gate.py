"""C0 head gate w_raw = bf16(x . weights_proj^T): the custom op against the reference.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings; the CPU tests check argument
validation, the fake implementation and (without a GPU) the kernel's fragment layout: a Python
emulation of its per-lane 16-byte loads, K permutation, mma.sync fragments, cross-warp scratch and
the cluster's K reduction (each CTA's partial pushed to the token's owner CTA, summed there in rank
order) reproduces x . W^T exactly.

What is compared, and why each bar is where it is:
- w_raw vs ref.prefix.c0_head_gate (fp32 accumulation, bf16 out): kind "bf16", and tighter: every
  element within one bf16 ulp of the reference (both round an fp32 sum of the same 6144 products,
  in different orders), except elements below 1e-3 of the output's rms (cancellation); at most 2 %
  of the elements differ at all.
- Determinism: the K reduction has a fixed order (warps, then cluster ranks), so repeated calls (and
  PDL on/off, and launches on two streams at once: there is no shared workspace) agree bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops.c0_head_gate import C0Config, c0_head_gate, config_for
from glm5_fastpath.ref.prefix import c0_head_gate as ref_c0
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "c0_head_gate"
BF16 = torch.bfloat16
M_VALUES = [1, 2, 3, 8, 9, 16, 31, 64, 127, 128, 129, 200, 256]


def make_x(m: int, h: int, seed: int, device: str = "cuda") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g) * (1 + 3 * torch.rand(1, h, generator=g) ** 8)  # a few large channels
    if m >= 3:
        x[2].zero_()  # an all-zero token: w_raw row exactly 0
    return x.to(BF16).to(device)


def _ordered_bf16(t: torch.Tensor) -> torch.Tensor:
    b = t.detach().cpu().contiguous().view(torch.int16).to(torch.int32)
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def check_w_raw(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, ctx: str, max_frac: float = 0.02) -> None:
    assert_no_poison(OP, out, names=["w_raw"])
    ref = ref_c0(x.cpu(), w.cpu())
    assert_close(OP, out, ref, kind="bf16", context=ctx)
    o, r = out.detach().cpu(), ref
    ulps = (_ordered_bf16(o) - _ordered_bf16(r)).abs()
    rms = r.double().pow(2).mean().sqrt().item()
    tiny = r.double().abs() < 1e-3 * rms
    bad = (ulps > 1) & ~tiny
    assert not bad.any(), (f"{OP} [{ctx}]: {int(bad.sum())} elements differ from the reference by more than one bf16 "
                           f"ulp, first at {bad.nonzero()[:4].tolist()}")
    frac = (ulps > 0).double().mean().item()
    assert frac <= max_frac, f"{OP} [{ctx}]: {frac:.4f} of the elements differ from the reference (> {max_frac})"


# ---- CPU: the kernel's fragment layout, emulated -------------------------------------------------------

def _mma(a, b, c):
    """mma.m16n8k16 on per-lane fragments: a [32][4][2], b [32][2][2], c [32][4] -> new c (float64)."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for e in range(2):
            A[g, 2 * t + e], A[g + 8, 2 * t + e] = a[lane][0][e], a[lane][1][e]
            A[g, 2 * t + 8 + e], A[g + 8, 2 * t + 8 + e] = a[lane][2][e], a[lane][3][e]
            B[2 * t + e, g], B[2 * t + 8 + e, g] = b[lane][0][e], b[lane][1][e]
    C = A @ B
    return [[c[l][0] + C[l >> 2, 2 * (l & 3)].item(), c[l][1] + C[l >> 2, 2 * (l & 3) + 1].item(),
             c[l][2] + C[(l >> 2) + 8, 2 * (l & 3)].item(), c[l][3] + C[(l >> 2) + 8, 2 * (l & 3) + 1].item()]
            for l in range(32)]


@pytest.mark.parametrize("hidden, heads, m, nt", [(512, 4, 5, 1), (512, 32, 11, 1), (4096, 32, 9, 1), (1536, 8, 21, 2)])
def test_fragment_layout_emulation(hidden, heads, m, nt):
    """Mirror of C0HeadGateClusterTile (load_weights / run): per-lane 16-byte rows of each owned K chunk,
    MMA steps, the [warp][token][head] scratch, the push of each CTA partial to the token's owner CTA
    (slot [rank][token / cluster]) and the owner's sum in rank order. (4096, 32): a cluster of 8 CTAs
    with 2 chunks each; (1536, 8): a cluster of 6 and 16-token tiles (the nt = 2 variant), padded
    head rows of zeros, a partial last tile."""
    torch.manual_seed(0)
    cfg = C0Config(hidden, heads, nt)
    C, tok_tile = cfg.cluster, cfg.tok_tile
    chunks = cfg.splits // C
    slots = -(-tok_tile // C)
    x = torch.randn(m, hidden, dtype=torch.float64)
    w = torch.randn(heads, hidden, dtype=torch.float64)

    def wrow(row, col):  # C0HeadGateTile::load_weights: rows >= heads are zeros
        return w[row, col:col + 8] if row < heads else torch.zeros(8, dtype=torch.float64)

    def xrow(tok, col):
        return x[tok, col:col + 8] if tok < m else torch.zeros(8, dtype=torch.float64)

    word = lambda v, i: (v[2 * i].item(), v[2 * i + 1].item())  # noqa: E731
    out = torch.full((m, heads), float("nan"), dtype=torch.float64)
    for tile in range(-(-m // tok_tile)):
        tok_base = tile * tok_tile
        valid = min(tok_tile, m - tok_base)
        recv = torch.full((C, C, slots, heads), float("nan"), dtype=torch.float64)  # [owner][sender][slot][head]
        received = torch.zeros(C, dtype=torch.int64)  # bytes, as the owner's mbarrier counts them
        for rank in range(C):
            red = torch.zeros(8, tok_tile, 36, dtype=torch.float64)
            for warp in range(8):
                acc = {(mt, n): [[0.0] * 4 for _ in range(32)] for mt in range(2) for n in range(nt)}
                for c in range(chunks):
                    chunk = rank * chunks + c
                    col = [chunk * 256 + warp * 32 + 8 * (l & 3) for l in range(32)]  # C0HeadGateTile::column
                    u = {(mt, hh): [wrow(mt * 16 + hh * 8 + (l >> 2), col[l]) for l in range(32)]
                         for mt in range(2) for hh in range(2)}
                    xv = {n: [xrow(tok_base + n * 8 + (l >> 2), col[l]) for l in range(32)] for n in range(nt)}
                    for st in range(2):
                        for mt in range(2):
                            if mt * 16 >= heads:
                                continue
                            a = [[word(u[(mt, 0)][l], 2 * st), word(u[(mt, 1)][l], 2 * st),
                                  word(u[(mt, 0)][l], 2 * st + 1), word(u[(mt, 1)][l], 2 * st + 1)] for l in range(32)]
                            for n in range(nt):
                                if n * 8 >= valid:
                                    continue
                                b = [[word(xv[n][l], 2 * st), word(xv[n][l], 2 * st + 1)] for l in range(32)]
                                acc[(mt, n)] = _mma(a, b, acc[(mt, n)])
                for (mt, n), cc in acc.items():  # red[warp][tk][h], pitch 36
                    for l in range(32):
                        h, tk = mt * 16 + (l >> 2), n * 8 + 2 * (l & 3)
                        red[warp, tk, h], red[warp, tk + 1, h] = cc[l][0], cc[l][1]
                        red[warp, tk, h + 8], red[warp, tk + 1, h + 8] = cc[l][2], cc[l][3]
            # the lanes' scratch stores of one instruction hit 32 distinct banks
            assert len({(2 * (l & 3) * 36 + (l >> 2)) % 32 for l in range(32)}) == 32
            part = red.sum(0)[:, :heads]  # the 8 warps (fixed order in the kernel)
            for tk in range(tok_tile):  # step 3: thread (tk, quad) pushes 16 bytes per quad
                owner, slot = tk % C, tk // C
                assert torch.isnan(recv[owner, rank, slot]).all(), "a slot written twice"
                recv[owner, rank, slot] = part[tk]
                received[owner] += heads * 4
        for owner in range(C):  # the mbarrier's expected bytes: cluster * owned_tokens(rank) * heads * 4
            owned = (tok_tile - 1 - owner) // C + 1 if owner < tok_tile else 0
            assert int(received[owner]) == C * owned * heads * 4
            for slot in range(owned):
                tk = slot * C + owner
                if tk < valid:
                    out[tok_base + tk] = recv[owner, :, slot].sum(0)  # ranks in order in the kernel
    want = x @ w.t()
    assert not torch.isnan(out).any()
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12), (out - want).abs().max()


def test_configs():
    c = config_for(6144, 32)
    assert c == C0Config(6144, 32, 1) and (c.splits, c.cluster, c.tok_tile) == (24, 8, 8)
    assert c.grid(1) == (8, 1, 1) and c.grid(16) == (8, 2, 1) and c.grid(128) == (8, 16, 1)
    big = config_for(6144, 32, 129)
    assert (big.nt, big.tok_tile, big.grid(129), big.grid(256)) == (2, 16, (8, 9, 1), (8, 16, 1))
    assert config_for(512, 4).splits == 2 and config_for(512, 4).cluster == 2
    assert config_for(1536, 32).cluster == 6 and config_for(7168, 32).cluster == 7
    assert dict(c.spec.defines) == {"GLM5_C0_HIDDEN": "6144", "GLM5_C0_HEADS": "32", "GLM5_C0_NT": "1",
                                    "GLM5_C0_CLUSTER": "8"}
    for h, n in ((6000, 32), (0, 32), (256 * 65, 32)):
        with pytest.raises(ValueError, match="hidden size"):
            config_for(h, n)
    for n in (0, 2, 6, 36):
        with pytest.raises(ValueError, match="indexer heads"):
            config_for(6144, n)


# ---- CPU: validation and fake implementation ---------------------------------------------------------

@pytest.mark.parametrize("x, w, match", [
    (torch.zeros(4, 512), torch.zeros(4, 512, dtype=BF16), "x_bf16 must be torch.bfloat16"),
    (torch.zeros(4, 512, dtype=BF16), torch.zeros(4, 512), "weights_proj must be torch.bfloat16"),
    (torch.zeros(4, 512, dtype=BF16), torch.zeros(4, 256, dtype=BF16), "weights_proj has 256 columns"),
    (torch.zeros(512, 4, dtype=BF16).t(), torch.zeros(4, 512, dtype=BF16), "x_bf16 must be contiguous"),
    (torch.zeros(1, 4, 512, dtype=BF16), torch.zeros(4, 512, dtype=BF16), "x_bf16 must be 2-D"),
    (torch.zeros(257, 512, dtype=BF16), torch.zeros(4, 512, dtype=BF16), "exceeds the supported maximum of 256"),
    (torch.zeros(4, 384, dtype=BF16), torch.zeros(4, 384, dtype=BF16), "multiple of 256"),
    (torch.zeros(4, 512, dtype=BF16), torch.zeros(6, 512, dtype=BF16), "indexer heads"),
    (torch.zeros(4, 512, dtype=BF16), torch.zeros(4, 512, dtype=BF16), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(x, w, match):
    with pytest.raises(ValueError, match=match) as ei:
        c0_head_gate(x, w)
    assert "glm5_fastpath.c0_head_gate" in str(ei.value)


def test_fake_shapes_and_compile_meta():
    x = torch.empty(7, 6144, dtype=BF16, device="meta")
    w = torch.empty(32, 6144, dtype=BF16, device="meta")
    out = torch.ops.glm5_fastpath.c0_head_gate(x, w, True)
    assert tuple(out.shape) == (7, 32) and out.dtype == BF16
    got = torch.compile(lambda a, b: c0_head_gate(a, b), backend="aot_eager", fullgraph=True)(x, w)
    assert tuple(got.shape) == (7, 32)


# ---- GPU -------------------------------------------------------------------------------------------------

GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")


@pytest.fixture(scope="module")
def glm5_weights_proj():
    from glm5_fastpath.weights import random_layer
    return random_layer(GLM5, 3, 4321, device="cuda").attn.indexer.weights_proj


@pytest.fixture(scope="module")
def small_weights_proj():
    from glm5_fastpath.weights import random_layer
    return random_layer(SMALL, 0, 77, device="cuda").attn.indexer.weights_proj


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_glm5(m, seed, glm5_weights_proj, no_pdl_override):
    x = make_x(m, 6144, seed + m)
    out = c0_head_gate(x, glm5_weights_proj)
    torch.cuda.synchronize()
    check_w_raw(x, glm5_weights_proj, out, f"glm5 {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64, 256])
def test_matches_reference_small_preset(m, seed, small_weights_proj):
    x = make_x(m, SMALL.hidden_size, seed + m)
    out = c0_head_gate(x, small_weights_proj)
    torch.cuda.synchronize()
    check_w_raw(x, small_weights_proj, out, f"small {m=} {seed=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 100, 200, 256])
def test_deterministic_and_pdl_off(m, seed, glm5_weights_proj):
    x = make_x(m, 6144, seed)
    outs = [c0_head_gate(x, glm5_weights_proj) for _ in range(3)] + [c0_head_gate(x, glm5_weights_proj, pdl=False)]
    torch.cuda.synchronize()
    for o in outs[1:]:
        assert_equal(OP, o, outs[0], context=f"run to run {m=}")


@pytest.mark.gpu
def test_empty_batch_and_errors(glm5_weights_proj):
    out = c0_head_gate(torch.empty(0, 6144, dtype=BF16, device="cuda"), glm5_weights_proj)
    assert tuple(out.shape) == (0, 32)
    x = make_x(4, 6144, 0)
    with pytest.raises(ValueError, match="one device"):
        c0_head_gate(x, glm5_weights_proj.cpu())
    buf = torch.empty(4 * 6144 + 8, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        c0_head_gate(buf[1:1 + 4 * 6144].view(4, 6144), glm5_weights_proj)


# ---- PDL ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 129, 256])
def test_waits_for_the_late_producer_under_pdl(m, seed, glm5_weights_proj, no_pdl_override):
    """The producer (A0's stand-in) spins ~50 us, then writes x; C0 launched with PDL right behind it
    loads its weights early but must read only the fresh x. A second C0 launch right behind the first
    (PDL-overlapped: its clusters start and arm their barriers while the first still runs) must agree."""
    producer = late_producer()
    x_true = make_x(m, 6144, seed)
    x = torch.full_like(x_true, 7.0)
    c0_head_gate(x_true, glm5_weights_proj)  # compile + load first
    for _ in range(3):
        x.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, x_true, x)
        out = c0_head_gate(x, glm5_weights_proj, pdl=True)
        out2 = c0_head_gate(x, glm5_weights_proj, pdl=True)
        torch.cuda.synchronize()
        check_w_raw(x_true, glm5_weights_proj, out, f"PDL after producer {m=}")
        assert_equal(OP, out2, out, context="second PDL launch")


# ---- CUDA graphs ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 77, 250])
def test_cuda_graph_capture_and_replay(m, seed, glm5_weights_proj, no_pdl_override):
    producer = late_producer()
    x_src = make_x(m, 6144, seed)
    static_x = torch.empty_like(x_src)
    c0_head_gate(x_src, glm5_weights_proj)  # warm up (compile, load) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, x_src, static_x)
        out = c0_head_gate(static_x, glm5_weights_proj, pdl=True)
        out2 = c0_head_gate(static_x, glm5_weights_proj, pdl=True)
    for step in range(3):
        x_src.copy_(make_x(m, 6144, seed + 100 + step))
        poison_(out)
        poison_(out2)
        static_x.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        check_w_raw(x_src, glm5_weights_proj, out, f"graph replay {step} {m=}")
        assert_equal(OP, out2, out, context="second captured launch")


@pytest.mark.gpu
def test_opcheck_fake(seed, glm5_weights_proj):
    x = make_x(4, 6144, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.c0_head_gate.default, (x, glm5_weights_proj, True),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 256])
def test_kernel_resources_report(m):
    """No local memory (spills), the param layout check active, <= 128 registers (two CTAs per SM)."""
    from glm5_fastpath.jit import get_kernel
    k = get_kernel(config_for(6144, 32, m).spec)
    assert k.local_bytes == 0, k
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 4), k.param_sizes
    assert 0 < k.num_regs <= 128 and k.max_threads >= 256, k


@pytest.mark.gpu
def test_two_streams_at_once(seed, glm5_weights_proj):
    """No shared workspace: launches on two streams may overlap (both after one producer event)."""
    xs = [make_x(m, 6144, seed + m) for m in (16, 200)]
    want = [c0_head_gate(x, glm5_weights_proj) for x in xs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in xs]
    ready = torch.cuda.Event()
    ready.record()
    outs = []
    for _ in range(3):
        for st, x in zip(streams, xs):
            with torch.cuda.stream(st):
                st.wait_event(ready)
                outs.append((x, c0_head_gate(x, glm5_weights_proj)))
    torch.cuda.synchronize()
    for i, (x, o) in enumerate(outs):
        assert_equal(OP, o, want[i % 2], context=f"two streams, launch {i}")
        check_w_raw(x, glm5_weights_proj, o, f"two streams, launch {i}")
