"""MoE router (logits + sigmoid/bias top-k + renorm, one kernel) against glm5_fastpath.ref.moe.route.

GPU tests (marked gpu) need an sm_90 GPU, nvcc and cuda-bindings. CPU tests: validation, the fake
implementation, a compile of the two specs (no spills), and a Python mirror of the kernel's top-k
epilogue (per-lane strided experts, butterfly argmax with the lower-id tie rule) against the reference.

What is compared, and why each bar is where it is:
- logits vs the reference's fp32 logits: both are fp32 sums of the same 6144 exact bf16 x bf16 products
  in different orders (ours: mma.sync k16 steps, 8 warps, 24 splits; the reference: CPU BLAS), so the
  per-element difference is bounded by c * u * sum_k |h_k w_k| with u = 2^-24; a random-walk estimate
  gives c ~ sqrt(6144) ~ 80 (u * 80 = 4.7e-6), the worst case c = 6144 (3.7e-4). The bar is
  2e-5 * sum_k |h_k w_k| per element (4x the estimate, 18x below the worst case) plus kind "fp32"
  (1e-5) on the relative norm.
- ids: exact against the reference (order included) except at near-ties: where the reference's k-th and
  (k+1)-th choice scores are within 1e-5, the ids in that band are excluded from the set comparison;
  where two neighbours inside the top-k are within 1e-5, only the set is compared. Independently the
  ids must be exactly the stable top-k of the kernel's OWN logits (sigmoid + bias in fp32 on the host),
  with the same 1e-5 band for the host-vs-device sigmoid (a few ulp).
- weights: s_ref[ids_kernel] / (sum + 1e-20) recomputed from the reference's scores at the kernel's ids,
  kind "fp32" (the only difference is the logits' summation order through sigmoid, < 1e-6 relative);
  rows whose ids equal the reference's also against the reference's weights. `scaled` is bitwise
  weights * 2.5.
- Determinism: fixed reduction orders -> repeated calls (and PDL on/off) agree bit for bit; the arrival
  counters return to zero.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ops import moe_router as R
from glm5_fastpath.ops.moe_router import RouterConfig, config_for, moe_route, moe_route_scaled
from glm5_fastpath.ref.moe import route as ref_route
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, poison_
from glm5_fastpath.testing.pdl import late_producer, produce

OP = "moe_router"
BF16 = torch.bfloat16
M_VALUES = [1, 2, 3, 8, 16, 31, 64, 128, 256]
GLM5 = Glm5Config.preset("glm5")
SMALL = Glm5Config.preset("small")
TIE_BAND = 1e-5


def make_h(m: int, h: int, seed: int, device: str = "cuda") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g) * (1 + 3 * torch.rand(1, h, generator=g) ** 8)  # a few large channels
    if m >= 3:
        x[2].zero_()  # an all-zero token: logits 0, s = 0.5, selection by the bias alone
    return x.to(BF16).to(device)


# ---- checks -----------------------------------------------------------------------------------------------

def _stable_topk(choice: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]


def _check_ids_against(ids: torch.Tensor, choice: torch.Tensor, k: int, ctx: str) -> None:
    """ids [M, k] (int) vs the stable top-k of choice [M, E] (fp32/64), with the 1e-5 near-tie band."""
    ref_ids = _stable_topk(choice, k)
    cs = choice.gather(1, _stable_topk(choice, k + 1) if choice.shape[1] > k else ref_ids)
    for r in range(ids.shape[0]):
        got, want = ids[r].tolist(), ref_ids[r].tolist()
        assert len(set(got)) == k and all(0 <= e < choice.shape[1] for e in got), f"{OP} [{ctx}] row {r}: bad ids {got}"
        if got == want:
            continue
        c = choice[r].double()
        kth = float(cs[r, k - 1])
        band = {e for e in range(choice.shape[1]) if abs(float(c[e]) - kth) <= TIE_BAND}
        if choice.shape[1] > k and float(cs[r, k - 1]) - float(cs[r, k]) > TIE_BAND:
            band = set()
        assert set(got) - band == set(want) - band, (f"{OP} [{ctx}] row {r}: ids {got} vs reference {want} "
                                                     f"(boundary band {sorted(band)})")
        assert set(got) <= set(want) | band, f"{OP} [{ctx}] row {r}: ids {got} outside top-{k} {want} + band {sorted(band)}"
        # order: by descending choice, up to near-ties
        cg = [float(c[e]) for e in got]
        assert all(cg[i] >= cg[i + 1] - TIE_BAND for i in range(k - 1)), f"{OP} [{ctx}] row {r}: ids {got} not ordered ({cg})"


def check_route(h, gate, bias, cfg, out, ctx: str, scaled=None) -> None:
    ids, w, logits = out
    k, E = cfg.num_experts_per_tok, cfg.n_routed_experts
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and logits.dtype == torch.float32
    assert tuple(ids.shape) == (h.shape[0], k) and tuple(w.shape) == (h.shape[0], k) and tuple(logits.shape) == (h.shape[0], E)
    assert_no_poison(OP, w, logits, names=["topk_weights", "logits"])
    hc, gc, bc = h.cpu(), gate.cpu(), bias.cpu()
    r_ids, r_w, r_logits = ref_route(hc, gc, bc, cfg)
    lo, ids_c, w_c = logits.cpu(), ids.cpu().long(), w.cpu()
    # logits
    assert_close(OP, lo, r_logits, kind="fp32", context=f"logits {ctx}")
    absdot = hc.double().abs() @ gc.double().abs().t()
    bad = (lo.double() - r_logits.double()).abs() > 2e-5 * absdot + 1e-30
    assert not bad.any(), f"{OP} [{ctx}]: {int(bad.sum())} logits beyond 2e-5 * sum|h w|, first at {bad.nonzero()[:4].tolist()}"
    # ids: against the reference, and against the kernel's own logits
    r_scores = torch.sigmoid(r_logits)
    _check_ids_against(ids_c, r_scores + bc, k, f"vs reference {ctx}")
    _check_ids_against(ids_c, torch.sigmoid(lo) + bc, k, f"vs own logits {ctx}")
    # weights
    sg = r_scores.gather(1, ids_c)
    want_w = sg / (sg.sum(-1, keepdim=True) + 1e-20)
    assert_close(OP, w_c, want_w, kind="fp32", context=f"weights at the kernel's ids {ctx}")
    same = (ids_c == r_ids.long()).all(dim=1)
    if same.any():
        assert_close(OP, w_c[same], r_w[same], kind="fp32", context=f"weights vs reference {ctx}")
    assert torch.allclose(w_c.double().sum(-1), torch.ones(w_c.shape[0], dtype=torch.float64), atol=1e-5)
    if scaled is not None:
        assert_equal(OP, scaled.cpu(), w_c * cfg.routed_scaling_factor, context=f"scaled {ctx}")


def _counters_are_zero():
    for ws in R._workspaces.values():
        assert int(ws.counters.abs().sum()) == 0, f"arrival counters not reset: {ws.counters.tolist()}"


# ---- CPU: the top-k epilogue, mirrored -----------------------------------------------------------------

def _select_key(choice: float, e: int) -> int:
    """RouterTile::select_key: order-preserving fp32 bits of the choice (high word; 0 for NaN), ~id (low word)."""
    if choice != choice:
        return ~e & 0xFFFFFFFF
    b = int(np.array(choice, dtype=np.float32).view(np.uint32))
    hi = (~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000)
    return (hi << 32) | (~e & 0xFFFFFFFF)


def _emulate_epilogue(logits: torch.Tensor, bias: torch.Tensor, k: int):
    """Python mirror of RouterTile::topk_pass for one token (lane L owns experts L + 32j): per round the lane's
    max key, a butterfly max over the warp, the owner zeroes the winner's key and sends its score."""
    E = logits.shape[0]
    per_lane = -(-E // 32)
    score = torch.sigmoid(logits)
    choice = score + bias
    key = [[_select_key(float(choice[lane + 32 * j]), lane + 32 * j) if lane + 32 * j < E else 0
            for j in range(per_lane)] for lane in range(32)]
    ids, ss = [], []
    for _ in range(k):
        best = [max(key[lane]) for lane in range(32)]
        off = 16
        while off:
            best = [max(best[lane], best[lane ^ off]) for lane in range(32)]
            off >>= 1
        assert len(set(best)) == 1, "butterfly must leave every lane with the same winner"
        wid = ~best[0] & 0xFFFFFFFF
        owner = [(lane, j) for lane in range(32) for j in range(per_lane) if key[lane][j] == best[0]]
        assert owner == [(wid & 31, wid >> 5)], "exactly the winner's slot holds the winning key"
        key[wid & 31][wid >> 5] = 0
        ids.append(wid)
        ss.append(float(score[wid]))
    s = torch.tensor(ss, dtype=torch.float32)
    tot = torch.zeros((), dtype=torch.float32)
    for v in s:  # selection order
        tot = tot + v
    return torch.tensor(ids, dtype=torch.int32), s / (tot + 1e-20)


def _pow2_at_least(n: int) -> int:
    return 1 if n <= 1 else 2 * _pow2_at_least((n + 1) // 2)


def _cx_desc(x: list, a: int, b: int) -> None:
    if x[a] < x[b]:
        x[a], x[b] = x[b], x[a]


def _emulate_bitonic_epilogue(logits: torch.Tensor, bias: torch.Tensor, k: int):
    """Python mirror of RouterTile::topk_keys + topk_pass (the default build): each lane sorts its keys with the same
    bitonic network (0-padded to a power of two) and keeps its top kList; five butterfly steps merge partner lists
    (c_i = max(a_i, b_{L-1-i}), then the half-cleaner); lane r takes the r-th key, its score from lane id & 31, slot
    id >> 5; the sum in selection order from 0."""
    E = logits.shape[0]
    per_lane = -(-E // 32)
    n_local, n_list = _pow2_at_least(per_lane), _pow2_at_least(k)
    score = torch.sigmoid(logits)
    choice = score + bias
    top = []
    for lane in range(32):
        x = [_select_key(float(choice[lane + 32 * j]), lane + 32 * j) if j < per_lane and lane + 32 * j < E else 0
             for j in range(n_local)]
        kk = 2
        while kk <= n_local:
            j = kk >> 1
            while j:
                for i in range(n_local):
                    lo = i ^ j
                    if lo > i:
                        if i & kk == 0:
                            _cx_desc(x, i, lo)
                        else:
                            _cx_desc(x, lo, i)
                j >>= 1
            kk <<= 1
        top.append([x[i] if i < n_local else 0 for i in range(n_list)])
    off = 1
    while off < 32:
        new = []
        for lane in range(32):
            a, b = top[lane], top[lane ^ off]
            c = [max(a[i], b[n_list - 1 - i]) for i in range(n_list)]
            j = n_list >> 1
            while j:
                for i in range(n_list):
                    if i ^ j > i:
                        _cx_desc(c, i, i ^ j)
                j >>= 1
            new.append(c)
        top = new
        off <<= 1
    assert all(t == top[0] for t in top), "every lane must end with the same list"
    assert top[0] == sorted(top[0], reverse=True), "the merged list is sorted"
    ids = [~top[0][r] & 0xFFFFFFFF for r in range(k)]
    ss = [float(score[i]) for i in ids]  # lane id & 31, slot id >> 5 holds expert id's score
    tot = torch.zeros((), dtype=torch.float32)
    for v in ss:
        tot = tot + torch.tensor(v, dtype=torch.float32)
    s = torch.tensor(ss, dtype=torch.float32)
    return torch.tensor(ids, dtype=torch.int32), s / (tot + 1e-20)


@pytest.mark.parametrize("E, k", [(256, 8), (16, 4), (64, 6), (256, 1), (40, 3), (1024, 32)])
def test_bitonic_epilogue_equals_the_round_loop(E, k):
    """The default build's bitonic merge selects the same ids in the same order as the round loop (the diagnostic
    GLM5_ROUTER_TOPK_ROUNDS build), so the weights are bitwise the same: random rows, exact ties, negative choices."""
    torch.manual_seed(E * 31 + k)
    for trial in range(6):
        logits = torch.randn(E) * 2
        bias = (torch.randn(E) * 0.01).float() - (torch.rand(E) * 1.2 if trial >= 3 else 0.0)
        if trial % 2:
            logits[:: max(1, E // 8)] = 20.0
            bias[:: max(1, E // 8)] = 0.0
        a_ids, a_w = _emulate_bitonic_epilogue(logits, bias, k)
        b_ids, b_w = _emulate_epilogue(logits, bias, k)
        assert a_ids.tolist() == b_ids.tolist(), (trial, a_ids.tolist(), b_ids.tolist())
        assert torch.equal(a_w, b_w)


def test_bitonic_epilogue_nan_choices_keep_valid_ids():
    E, k = 64, 8
    logits = torch.full((E,), float("nan"))
    logits[[5, 40, 17]] = torch.tensor([0.5, 2.0, -1.0])
    ids, _ = _emulate_bitonic_epilogue(logits, torch.zeros(E), k)
    assert ids.tolist() == [40, 5, 17, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("E, k", [(256, 8), (16, 4), (64, 6)])
def test_epilogue_emulation_matches_reference_with_ties(E, k):
    torch.manual_seed(E + k)
    for trial in range(8):
        logits = torch.randn(E) * 2
        bias = (torch.randn(E) * 0.01).float()
        if trial >= 4:  # negative choices (the key's sign flip), mixed with positive ones
            bias = bias - torch.rand(E) * 1.2
        if trial % 2:  # exact ties: duplicated logits/bias, including across lanes and slots of one lane
            for a, b in ((3, 3 + 32 % E), (5, 1), (E - 1, 0)):
                logits[a], bias[a] = logits[b], bias[b]
            logits[:: max(1, E // 8)] = 20.0
            bias[:: max(1, E // 8)] = 0.0
        ids, w = _emulate_epilogue(logits, bias, k)
        # ref.moe.route's rule applied to these fp32 logits (route itself takes h and gate, not logits)
        choice = torch.sigmoid(logits) + bias
        want = torch.sort(choice, descending=True, stable=True).indices[:k]
        assert ids.tolist() == want.tolist(), (trial, ids.tolist(), want.tolist())
        sw = torch.sigmoid(logits)[want]
        assert torch.allclose(w, sw / (sw.sum() + 1e-20), rtol=1e-6, atol=0)


def test_epilogue_emulation_nan_choices_keep_valid_ids():
    """Fewer than k numbers in a row (NaN logits): the numbers first (by choice), then the NaN experts by id;
    every id is a valid expert (no -1 from an empty key)."""
    E, k = 64, 8
    logits = torch.full((E,), float("nan"))
    logits[[5, 40, 17]] = torch.tensor([0.5, 2.0, -1.0])
    ids, _ = _emulate_epilogue(logits, torch.zeros(E), k)
    assert ids.tolist() == [40, 5, 17, 0, 1, 2, 3, 4]


# ---- CPU: configs, validation, fake -------------------------------------------------------------------

def test_configs():
    c = config_for(6144, 256, 8)
    assert c == RouterConfig(6144, 256, 8) and (c.splits, c.groups, c.group_experts) == (24, 8, 32)
    assert c.counter_words == 73 and c.partial_floats * 4 == 6291456  # 72 split-K counters + the decode one
    assert (c.decode_experts_per_cta, c.decode_ctas) == (2, 128)
    s = config_for(512, 16, 4)
    assert (s.splits, s.groups, s.group_experts) == (2, 1, 16)
    assert (s.decode_experts_per_cta, s.decode_ctas) == (4, 4)
    for h in (6000, 0, 256 * 65):
        with pytest.raises(ValueError, match="hidden size"):
            config_for(h, 256, 8)
    for e in (0, 2, 18, 48, 257):
        with pytest.raises(ValueError, match="routed experts"):
            config_for(6144, e, 8)
    for k in (0, 33, 17):
        with pytest.raises(ValueError, match="top-k"):
            config_for(6144, 16 if k == 17 else 256, k)


def test_every_split_k_config_still_builds_with_the_decode_kernel(nvcc_jit):
    """The decode kernel shares the cubin: hidden sizes that are not a multiple of 1024 and expert counts it
    does not take must still build (its kernel compiles to a no-op there and is never selected)."""
    for hidden, experts in ((768, 256), (1280, 32), (256, 4), (2560, 12)):
        cfg = config_for(hidden, experts, 2)
        res = nvcc_jit(cfg.spec).resources()
        assert res[R.FUNCTION].spill_store_bytes == 0 and R.FUNCTION_DECODE in res
    assert not config_for(256, 4, 2).decode_supported and not R.use_decode(1, True, config_for(256, 4, 2))
    assert config_for(768, 256, 8).decode_supported and R.use_decode(1, True, config_for(768, 256, 8))


def test_decode_kernel_selection(monkeypatch, caplog):
    """The decode kernel runs for 1 <= M <= 32 when asked (decode=True) or, with decode=None, when
    GLM5_FASTPATH_ROUTER_DECODE=1, or up to 4 tokens (measured faster there) when it is unset; never above 32
    tokens; =0 turns it off."""
    monkeypatch.delenv(R.ENV_DECODE, raising=False)
    assert R.decode_enabled() is None and all(R.use_decode(m, None) for m in (1, 2, 3, 4))
    assert not R.use_decode(5, None) and not R.use_decode(0, None)
    assert not R.use_decode(1, None, config_for(256, 4, 2))  # a config it does not take
    monkeypatch.setenv(R.ENV_DECODE, "0")
    assert R.decode_enabled() is False and not R.use_decode(1, None)
    monkeypatch.setenv(R.ENV_DECODE, "auto")
    assert R.decode_enabled() is None
    monkeypatch.setenv(R.ENV_DECODE, "maybe")  # unknown: auto, with a warning (logged once)
    with caplog.at_level(logging.WARNING, logger="glm5_fastpath"):
        assert R.decode_enabled() is None and R.use_decode(2, None)
    assert "'maybe'" in caplog.text
    monkeypatch.delenv(R.ENV_DECODE)
    assert R.use_decode(1, True) and R.use_decode(32, True) and not R.use_decode(33, True)
    assert not R.use_decode(0, True) and not R.use_decode(8, False)
    monkeypatch.setenv(R.ENV_DECODE, "1")
    assert R.use_decode(8, None) and not R.use_decode(8, False) and not R.use_decode(64, None)
    with pytest.raises(ValueError, match="decode must be None or a bool"):
        moe_route(_t((4, 512)), _t((16, 512)), _t(16, torch.float32), SMALL, decode=1)


def test_decode_tile_constants_match_python():
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "moe" / "router.cuh").read_text()
    assert "static constexpr int kKParts = kChunks % 4 == 0 ? 4 : (kChunks % 2 == 0 ? 2 : 1);" in text
    assert "static constexpr int kEpc = kWarps / kKParts;" in text
    assert "static constexpr bool kSupported = kExperts % kEpc == 0;" in text
    assert f"static constexpr int kMaxTokens = {R.DECODE_SLICE_MAX};" in text
    assert "static constexpr int kCounter = Base::kCounterWords;" in text  # the extra counter word
    # lane columns of the gate and of h are the same ones, and the K parts tile [0, H) exactly once
    assert "gate + static_cast<int64_t>(e) * kHidden + part * kKPerWarp;" in text
    assert "w.v[i] = ptx::ld_global_nc_v4(row + (32 * i + lane) * 8);" in text
    assert "const uint16_t* hcol = p.h + part * kKPerWarp + lane * 8;" in text
    assert "hcol + static_cast<int64_t>(m) * kHidden + 32 * 8 * i" in text
    for hidden in (6144, 512, 768, 1280, 2560, 256):
        chunks = hidden // 256
        parts = 4 if chunks % 4 == 0 else (2 if chunks % 2 == 0 else 1)
        assert config_for(hidden, 256, 8).decode_experts_per_cta == 8 // parts
        per = hidden // parts
        cols = sorted(p * per + (32 * i + lane) * 8 + j for p in range(parts) for i in range(per // 256)
                      for lane in range(32) for j in range(8))
        assert cols == list(range(hidden))


def _t(shape, dtype=BF16, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


@pytest.mark.parametrize("h, gate, bias, match", [
    (_t((4, 512), torch.float32), _t((16, 512)), _t(16, torch.float32), "h must be torch.bfloat16"),
    (_t((4, 512)), _t((16, 512), torch.float32), _t(16, torch.float32), "gate must be torch.bfloat16"),
    (_t((4, 512)), _t((16, 512)), _t(16, BF16), "bias .* must be torch.float32"),
    (_t((4, 512)), _t((16, 256)), _t(16, torch.float32), "gate has 256 columns"),
    (_t((4, 512)), _t((16, 512)), _t(8, torch.float32), "bias has 8 entries"),
    (_t((512, 4)).t(), _t((16, 512)), _t(16, torch.float32), "h must be contiguous"),
    (_t((1, 4, 512)), _t((16, 512)), _t(16, torch.float32), "h must be 2-D"),
    (_t((257, 512)), _t((16, 512)), _t(16, torch.float32), "exceeds the supported maximum of 256"),
    (_t((4, 512)), _t((16, 512)), _t(16, torch.float32), "CUDA device"),
])
def test_bad_inputs_raise_naming_the_op(h, gate, bias, match):
    with pytest.raises(ValueError, match=match) as ei:
        moe_route(h, gate, bias, SMALL)
    assert "glm5_fastpath.moe_router" in str(ei.value)


def test_bad_cfg_raise_naming_the_op():
    h, g, b = _t((4, 512)), _t((16, 512)), _t(16, torch.float32)
    for bad, match in ((SMALL.__class__.preset("glm5"), "cfg.hidden_size"),):
        with pytest.raises(ValueError, match=match):
            moe_route(h, g, b, bad)
    import dataclasses
    if dataclasses.is_dataclass(SMALL):
        with pytest.raises(ValueError, match="norm_topk_prob"):
            moe_route(h, g, b, dataclasses.replace(SMALL, norm_topk_prob=False))
    with pytest.raises(ValueError, match="experts"):  # gate with 17 experts
        moe_route(h, _t((17, 512)), _t(17, torch.float32), SMALL)


def test_fake_shapes_and_compile_meta():
    h = torch.empty(7, 6144, dtype=BF16, device="meta")
    g = torch.empty(256, 6144, dtype=BF16, device="meta")
    b = torch.empty(256, dtype=torch.float32, device="meta")
    ids, w, lo, sc = torch.ops.glm5_fastpath.moe_router(h, g, b, 8, 2.5, True)
    assert (tuple(ids.shape), ids.dtype) == ((7, 8), torch.int32)
    assert (tuple(w.shape), w.dtype, tuple(lo.shape), lo.dtype, tuple(sc.shape)) == ((7, 8), torch.float32, (7, 256), torch.float32, (7, 8))
    got = torch.compile(lambda a, c, d: moe_route(a, c, d, GLM5), backend="aot_eager", fullgraph=True)(h, g, b)
    assert [tuple(t.shape) for t in got] == [(7, 8), (7, 8), (7, 256)]


def test_compile_check_specs_build_without_spills(nvcc_jit):
    specs = R.compile_check_specs()
    assert [dict(s.defines)["GLM5_ROUTER_EXPERTS"] for s in specs] == ["256", "16", "256"]
    assert [dict(s.defines).get("GLM5_ROUTER_PHASES") for s in specs] == [None, None, "1"]  # the phase-mark build
    for spec in specs:
        assert spec.functions == (R.FUNCTION, R.FUNCTION_DECODE)
        built = nvcc_jit(spec).resources()
        for fn in spec.functions:
            res = built[fn]
            assert res.spill_store_bytes == 0 and res.spill_load_bytes == 0 and res.stack_bytes == 0, (fn, res)
            assert 0 < res.registers <= 128, (fn, res)  # 3 CTAs of 256 threads per SM at <= 85


def test_phase_summary():
    """phase_summary on hand-made marks (ns): three CTAs, one winner; rows that never reached entry are ignored."""
    t = 1_000_000
    marks = [[t, t + 2000, t + 5000, 0, 0, 0, 0, 3],
             [t + 400, t + 2100, t + 6000, t + 7000, t + 9500, 0, t + 8200, 5],
             [t + 100, t + 2050, t + 5500, 0, 0, 0, 0, 3],
             [0] * 8]
    d = R.phase_summary(torch.tensor(marks))
    assert d["ctas"] == 3 and d["sms"] == 2 and d["last_entry_us"] == pytest.approx(0.4)
    assert d["wait_released_median_us"] == pytest.approx(2.05) and d["wait_released_last_us"] == pytest.approx(2.1)
    assert d["own_work_median_us"] == pytest.approx(3.45)  # 3.0, 3.9, 3.45
    assert d["last_part_stored_us"] == pytest.approx(6.0) and d["topk_start_us"] == pytest.approx(7.0)
    assert d["topk_us"] == pytest.approx(2.5) and d["topk_end_us"] == pytest.approx(9.5)
    assert d["level1_done_last_us"] is None and d["topk_loads_us"] == pytest.approx(1.2)
    assert "topk_loads_us" not in R.phase_summary([[t, t, t, t + 1, t + 2, 0, 0, 1]])  # no mark 6: no load split
    assert R.phase_summary([[0] * 8]) == {"ctas": 0}
    assert R.PHASE_NAMES[:3] == ("entry", "past_wait", "part_stored")


# ---- GPU -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def glm5_router():
    from glm5_fastpath.weights import random_layer
    mlp = random_layer(GLM5, 3, 4321, device="cuda").mlp
    return mlp.gate.contiguous(), mlp.e_score_correction_bias.contiguous()


@pytest.fixture(scope="module")
def small_router():
    from glm5_fastpath.weights import random_layer
    mlp = random_layer(SMALL, 3, 77, device="cuda").mlp
    return mlp.gate.contiguous(), mlp.e_score_correction_bias.contiguous()


def _poison_allocator(m: int, cfg) -> None:
    """Fill the caching allocator's next blocks of the op's output sizes with poison, so an unwritten
    output element shows up as NaN / INT_MIN."""
    k, E = cfg.num_experts_per_tok, cfg.n_routed_experts
    bufs = [torch.empty(m, k, dtype=torch.int32, device="cuda"), torch.empty(m, k, device="cuda"),
            torch.empty(m, E, device="cuda"), torch.empty(m, k, device="cuda")]
    for b in bufs:
        poison_(b)
    del bufs


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_VALUES)
def test_matches_reference_glm5(m, seed, glm5_router, no_pdl_override):
    gate, bias = glm5_router
    h = make_h(m, GLM5.hidden_size, seed + m)
    _poison_allocator(m, GLM5)
    ids, w, lo, sc = moe_route_scaled(h, gate, bias, GLM5)
    torch.cuda.synchronize()
    assert int(ids.min()) >= 0 and int(ids.max()) < GLM5.n_routed_experts, "unwritten / out-of-range ids"
    check_route(h, gate, bias, GLM5, (ids, w, lo), f"glm5 {m=} {seed=}", scaled=sc)
    _counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64, 256])
def test_matches_reference_small_preset(m, seed, small_router):
    gate, bias = small_router
    h = make_h(m, SMALL.hidden_size, seed + m)
    _poison_allocator(m, SMALL)
    out = moe_route(h, gate, bias, SMALL)
    torch.cuda.synchronize()
    check_route(h, gate, bias, SMALL, out, f"small {m=} {seed=}")
    _counters_are_zero()


@pytest.mark.gpu
def test_exact_ties_lower_id_wins(seed, glm5_router):
    """Experts 3, 7 (one CTA, rows 3 and 7 of its first m16 tile) and 250 (another CTA) get identical gate rows and bias, and a
    bias large enough to be selected: they tie exactly and must come first in ascending id order."""
    gate, bias = (t.clone() for t in glm5_router)
    gate[7] = gate[3]
    gate[250] = gate[3]
    bias[[3, 7, 250]] = 5.0
    h = make_h(16, GLM5.hidden_size, seed)
    ids, w, lo = moe_route(h, gate, bias, GLM5)
    torch.cuda.synchronize()
    assert_equal(OP, lo[:, 7], lo[:, 3], context="identical gate rows give identical logits")
    assert_equal(OP, lo[:, 250], lo[:, 3], context="identical gate rows give identical logits")
    assert ids[:, :3].cpu().tolist() == [[3, 7, 250]] * 16, ids[:, :3].cpu().tolist()
    r_ids, _, _ = ref_route(h.cpu(), gate.cpu(), bias.cpu(), GLM5)
    assert r_ids[:, :3].tolist() == [[3, 7, 250]] * 16
    check_route(h, gate, bias, GLM5, (ids, w, lo), "exact ties")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 100, 256])
def test_deterministic_and_pdl_off(m, seed, glm5_router):
    gate, bias = glm5_router
    h = make_h(m, GLM5.hidden_size, seed)
    outs = [moe_route_scaled(h, gate, bias, GLM5) for _ in range(3)] + [moe_route_scaled(h, gate, bias, GLM5, pdl=False)]
    torch.cuda.synchronize()
    for o in outs[1:]:
        for a, b, name in zip(o, outs[0], ("ids", "weights", "logits", "scaled")):
            assert_equal(OP, a, b, context=f"run to run {name} {m=}")
    _counters_are_zero()


@pytest.mark.gpu
def test_empty_batch_and_errors(glm5_router):
    gate, bias = glm5_router
    ids, w, lo = moe_route(torch.empty(0, 6144, dtype=BF16, device="cuda"), gate, bias, GLM5)
    assert [tuple(t.shape) for t in (ids, w, lo)] == [(0, 8), (0, 8), (0, 256)]
    h = make_h(4, 6144, 0)
    with pytest.raises(ValueError, match="one device"):
        moe_route(h, gate.cpu(), bias, GLM5)
    with pytest.raises(ValueError, match="one device"):
        moe_route(h, gate, bias.cpu(), GLM5)
    buf = torch.empty(4 * 6144 + 8, dtype=BF16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        moe_route(buf[1:1 + 4 * 6144].view(4, 6144), gate, bias, GLM5)
    with pytest.raises(ValueError, match="exceeds the supported maximum"):
        moe_route(torch.zeros(257, 6144, dtype=BF16, device="cuda"), gate, bias, GLM5)


# ---- PDL ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_waits_for_the_late_producer_under_pdl(m, seed, glm5_router, no_pdl_override):
    """The producer (the post-attention norm's stand-in) spins ~50 us, then writes h; the router launched
    with PDL right behind it loads the gate early but must read only the fresh h. Two router launches back
    to back also check that a PDL-overlapped second launch does not race the first on the workspace."""
    gate, bias = glm5_router
    producer = late_producer()
    h_true = make_h(m, GLM5.hidden_size, seed)
    h = torch.full_like(h_true, 7.0)
    moe_route(h_true, gate, bias, GLM5)  # compile + load first
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        out = moe_route(h, gate, bias, GLM5, pdl=True)
        out2 = moe_route(h, gate, bias, GLM5, pdl=True)
        torch.cuda.synchronize()
        check_route(h_true, gate, bias, GLM5, out, f"PDL after producer {m=}")
        for a, b in zip(out2, out):
            assert_equal(OP, a, b, context="second PDL launch")
    _counters_are_zero()


# ---- CUDA graphs ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 77])
def test_cuda_graph_capture_and_replay(m, seed, glm5_router, no_pdl_override):
    gate, bias = glm5_router
    producer = late_producer()
    h_src = make_h(m, GLM5.hidden_size, seed)
    static_h = torch.empty_like(h_src)
    moe_route(h_src, gate, bias, GLM5)  # warm up (compile, load, workspace) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        produce(producer, h_src, static_h)
        out = moe_route_scaled(static_h, gate, bias, GLM5, pdl=True)
        out2 = moe_route_scaled(static_h, gate, bias, GLM5, pdl=True)
    for step in range(3):
        h_src.copy_(make_h(m, GLM5.hidden_size, seed + 100 + step))
        for t in (*out, *out2):
            poison_(t)
        static_h.fill_(7.0)
        g.replay()
        torch.cuda.synchronize()
        check_route(h_src, gate, bias, GLM5, out[:3], f"graph replay {step} {m=}", scaled=out[3])
        for a, b in zip(out2, out):
            assert_equal(OP, a, b, context="second captured launch")
    _counters_are_zero()


@pytest.mark.gpu
def test_opcheck_fake(seed, glm5_router):
    gate, bias = glm5_router
    h = make_h(4, GLM5.hidden_size, seed)
    torch.library.opcheck(torch.ops.glm5_fastpath.moe_router.default, (h, gate, bias, 8, 2.5, True),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
def test_kernel_resources_report():
    from glm5_fastpath.jit import get_kernel
    k = get_kernel(config_for(6144, 256, 8).spec)
    assert k.local_bytes == 0, k
    # h, gate, bias, logits, ids, weights, scaled, partials, counters, M, rsf, x8, x_scale, quant eps, tokens per CTA
    assert k.param_sizes is None or k.param_sizes == (8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 8, 8, 4, 4), k.param_sizes
    assert 0 < k.num_regs <= 128 and k.max_threads >= 256, k


# ---- decode kernel (M <= 32) ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 7, 16, 31, 32])
def test_decode_kernel_matches_reference(m, seed, glm5_router, no_pdl_override):
    """RouterDecodeTile (whole-K dot products, one arrival level) against the reference, over poisoned
    outputs; deterministic run to run; the counters return to zero."""
    gate, bias = glm5_router
    h = make_h(m, GLM5.hidden_size, seed + 3 * m)
    _poison_allocator(m, GLM5)
    ids, w, lo, sc = moe_route_scaled(h, gate, bias, GLM5, decode=True)
    torch.cuda.synchronize()
    assert int(ids.min()) >= 0 and int(ids.max()) < GLM5.n_routed_experts, "unwritten / out-of-range ids"
    check_route(h, gate, bias, GLM5, (ids, w, lo), f"decode {m=} {seed=}", scaled=sc)
    again = moe_route_scaled(h, gate, bias, GLM5, decode=True)
    torch.cuda.synchronize()
    for a, b, name in zip(again, (ids, w, lo, sc), ("ids", "weights", "logits", "scaled")):
        assert_equal(OP, a, b, context=f"decode run to run {name} {m=}")
    _counters_are_zero()


def test_decode_grid_rows():
    """The decode kernel's token slices: <= 32 tokens a row, rows covering M exactly, at most DECODE_SLICES rows
    while M fits them (the kernel is chosen up to 32 tokens; past 96 the 32-token rows decide)."""
    for m in range(1, 257):
        t = R.decode_tokens_per_cta(m)
        rows = -(-m // t)
        assert 1 <= t <= R.DECODE_SLICE_MAX and (rows - 1) * t < m <= rows * t, m
        assert rows <= max(R.DECODE_SLICES, -(-m // R.DECODE_SLICE_MAX)), m


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 8, 17, 32])
def test_decode_kernel_token_slices_give_the_one_row_bits(m, seed, glm5_router, no_pdl_override, monkeypatch):
    """Dealing the tokens over grid rows changes no bit: per token the summation order is the same."""
    gate, bias = glm5_router
    h = make_h(m, GLM5.hidden_size, seed + 5 * m)
    sliced = moe_route_scaled(h, gate, bias, GLM5, decode=True)
    monkeypatch.setattr(R, "decode_tokens_per_cta", lambda mm: mm)  # one grid row: the former decode grid
    one = moe_route_scaled(h, gate, bias, GLM5, decode=True)
    torch.cuda.synchronize()
    for a, b, name in zip(sliced, one, ("ids", "weights", "logits", "scaled")):
        assert_equal(OP, a, b, context=f"decode sliced vs one row {name} {m=}")
    _counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7])
def test_decode_kernel_small_preset(m, seed, small_router):
    gate, bias = small_router
    h = make_h(m, SMALL.hidden_size, seed + m)
    out = moe_route(h, gate, bias, SMALL, decode=True)
    torch.cuda.synchronize()
    check_route(h, gate, bias, SMALL, out, f"decode small {m=}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 32])
def test_decode_kernel_waits_for_the_late_producer_under_pdl(m, seed, glm5_router, no_pdl_override):
    gate, bias = glm5_router
    producer = late_producer()
    h_true = make_h(m, GLM5.hidden_size, seed)
    h = torch.full_like(h_true, 7.0)
    moe_route(h_true, gate, bias, GLM5, decode=True)
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        out = moe_route(h, gate, bias, GLM5, pdl=True, decode=True)
        out2 = moe_route(h, gate, bias, GLM5, pdl=True, decode=True)
        torch.cuda.synchronize()
        check_route(h_true, gate, bias, GLM5, out, f"decode PDL after producer {m=}")
        for a, b in zip(out2, out):
            assert_equal(OP, a, b, context="second decode PDL launch")
    _counters_are_zero()


@pytest.mark.gpu
def test_decode_kernel_graph_replay_and_fallback_above_32(seed, glm5_router, no_pdl_override):
    gate, bias = glm5_router
    h_src = make_h(16, GLM5.hidden_size, seed)
    static_h = h_src.clone()
    moe_route(h_src, gate, bias, GLM5, decode=True)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = moe_route_scaled(static_h, gate, bias, GLM5, decode=True)
    for step in range(3):
        static_h.copy_(make_h(16, GLM5.hidden_size, seed + 50 + step))
        for t in out:
            poison_(t)
        g.replay()
        torch.cuda.synchronize()
        check_route(static_h, gate, bias, GLM5, out[:3], f"decode graph replay {step}", scaled=out[3])
    big = make_h(33, GLM5.hidden_size, seed)  # above 32 tokens: the split-K kernel, whatever decode says
    check_route(big, gate, bias, GLM5, moe_route(big, gate, bias, GLM5, decode=True), "decode=True, M=33")
    _counters_are_zero()


# ---- router + MegaMoE input quant in one kernel (moe_route_quant) ------------------------------------------

def test_router_quant_fake_shapes():
    h = torch.empty(5, 6144, dtype=BF16, device="meta")
    g = torch.empty(256, 6144, dtype=BF16, device="meta")
    b = torch.empty(256, dtype=torch.float32, device="meta")
    out = torch.ops.glm5_fastpath.moe_router_quant(h, g, b, 8, 2.5, True, None)
    assert [(tuple(t.shape), t.dtype) for t in out[4:]] == [((5, 6144), torch.float8_e4m3fn), ((5, 48), torch.float32)]


def _route_quant_into(cfg, h, gate, bias, decode, pdl=False):
    """moe_route_quant's kernel into freshly poisoned outputs (so an unwritten x8 byte / scale shows as NaN)."""
    rc = R.config_for(cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok)
    ids, w, lo, sc = R._outputs(h, rc)
    x8, xs = R._quant_outputs(h)
    for t in (ids, w, lo, sc, x8, xs):
        poison_(t)
    R._launch(rc, h, gate, bias, lo, ids, w, sc, float(cfg.routed_scaling_factor), pdl, decode, x8, xs)
    return ids, w, lo, x8, xs


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [None, True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 17, 32, 33, 64, 256])
def test_gpu_router_quant_equals_router_then_act_quant(m, decode, seed, glm5_router, no_pdl_override):
    """The fused quant is the act-quant group tile: x8 / x_scale bit for bit act_quant_fp8(h), and the routing
    outputs bit for bit moe_route's (same kernel, same decode choice); every output poisoned before the launch."""
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    gate, bias = glm5_router
    h = make_h(m, GLM5.hidden_size, seed + 11 * m + (0 if decode is None else 5 + int(decode)))
    ids0, w0, lo0 = moe_route(h, gate, bias, GLM5, decode=decode)
    x8_0, xs_0 = act_quant_fp8(h)
    ids, w, lo, x8, xs = _route_quant_into(GLM5, h, gate, bias, decode)
    torch.cuda.synchronize()
    for a, b, name in ((ids, ids0, "ids"), (w, w0, "weights"), (lo, lo0, "logits"), (xs, xs_0, "x_scale")):
        assert_equal(OP, a, b, context=f"router quant {name} {m=} {decode=}")
    assert torch.equal(x8.view(torch.uint8), x8_0.view(torch.uint8)), f"x8 bytes differ {m=} {decode=}"
    got = R.moe_route_quant(h, gate, bias, GLM5, decode=decode)  # the public entry point: same bits
    torch.cuda.synchronize()
    assert torch.equal(got[3].view(torch.uint8), x8_0.view(torch.uint8)) and torch.equal(got[4], xs_0)
    _counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("m", [1, 7, 20, 32])
def test_gpu_router_quant_small_preset_multi_pass(m, decode, seed, small_router):
    """The small preset's decode grid (4 CTAs x 16 half-warps) deals its M x 4 quant groups in several passes from
    M = 17 on; the split-K grid has one expert group there."""
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    gate, bias = small_router
    h = make_h(m, SMALL.hidden_size, seed + 3 * m)
    ids, w, lo, x8, xs = _route_quant_into(SMALL, h, gate, bias, decode)
    x8_0, xs_0 = act_quant_fp8(h)
    torch.cuda.synchronize()
    assert torch.equal(x8.view(torch.uint8), x8_0.view(torch.uint8)) and torch.equal(xs, xs_0), f"{m=} {decode=}"
    check_route(h, gate, bias, SMALL, (ids, w, lo), f"small router quant {m=} {decode=}")


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [True, False])
def test_gpu_router_quant_captures_and_waits_for_the_late_producer(decode, seed, glm5_router, no_pdl_override):
    from glm5_fastpath.ops.act_quant import act_quant_fp8

    gate, bias = glm5_router
    producer = late_producer()
    h_true = make_h(8, GLM5.hidden_size, seed)
    h = torch.full_like(h_true, 7.0)
    R.moe_route_quant(h_true, gate, bias, GLM5, decode=decode)
    want = act_quant_fp8(h_true)
    for _ in range(3):
        h.fill_(7.0)
        torch.cuda.synchronize()
        produce(producer, h_true, h)
        out = _route_quant_into(GLM5, h, gate, bias, decode, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(out[3].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(out[4], want[1])
    static_h = h_true.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = R.moe_route_quant(static_h, gate, bias, GLM5, decode=decode)
    for step in range(2):
        static_h.copy_(make_h(8, GLM5.hidden_size, seed + 70 + step))
        poison_(got[3])
        poison_(got[4])
        g.replay()
        torch.cuda.synchronize()
        x8, xs = act_quant_fp8(static_h)
        assert torch.equal(got[3].view(torch.uint8), x8.view(torch.uint8)) and torch.equal(got[4], xs)
    _counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("decode", [True, False])
def test_phase_build_same_outputs_and_ordered_marks(m, decode, glm5_router):
    """The phase-mark build: bitwise the normal build's outputs; every CTA marks entry <= past_wait <= part stored;
    exactly one CTA (the decode kernel) / one per token tile (split-K) wins the last arrival, after every CTA's part."""
    gate, bias = glm5_router
    cfg = GLM5
    rcfg = R.config_for(cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok)
    h = (torch.randn(m, cfg.hidden_size, device="cuda", generator=torch.Generator("cuda").manual_seed(m)) * 0.5
         ).to(torch.bfloat16)
    want = moe_route(h, gate, bias, cfg, decode=decode)
    function = R.FUNCTION_DECODE if decode else R.FUNCTION
    ctas = (rcfg.decode_ctas * -(-m // R.decode_tokens_per_cta(m)) if decode
            else rcfg.splits * rcfg.groups * -(-m // R.TOK_TILE))
    with R.phase_build():
        R.reset_phases(rcfg, "cuda", function)
        got = moe_route(h, gate, bias, cfg, decode=decode)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert_equal(OP, a, b, context=f"phase build vs production {decode=} {m=}")
    marks = R.read_phases(rcfg, ctas, "cuda", function).cpu()
    assert (marks[:, 0] > 0).all() and (marks[:, 1] >= marks[:, 0]).all() and (marks[:, 2] >= marks[:, 1]).all()
    winners = marks[marks[:, 3] > 0]
    assert len(winners) == 1 and (winners[:, 4] >= winners[:, 3]).all()
    assert int(winners[0, 3]) >= int(marks[:, 2].max())
    d = R.phase_summary(marks)
    assert d["ctas"] == ctas and d["topk_end_us"] >= d["topk_start_us"] >= d["last_part_stored_us"] > 0
    # outside the context the normal build runs again (no marks written)
    R.reset_phases(rcfg, "cuda", function)
    moe_route(h, gate, bias, cfg, decode=decode)
    torch.cuda.synchronize()
    assert int(R.read_phases(rcfg, ctas, "cuda", function).abs().sum()) == 0


# ---- the bitonic top-k against the round loop it replaced ------------------------------------------------------

def _route_both_builds(h, gate, bias, cfg, decode):
    out = moe_route_scaled(h, gate, bias, cfg, decode=decode)
    with R.topk_rounds_build():
        old = moe_route_scaled(h, gate, bias, cfg, decode=decode)
    torch.cuda.synchronize()
    rcfg = config_for(cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok)
    fn = R.FUNCTION_DECODE if R.use_decode(h.shape[0], decode, rcfg) else R.FUNCTION
    dev = torch.cuda.current_device()
    assert (rcfg, dev, fn) in R._kernels and (rcfg, dev, fn + "+rounds") in R._kernels, "both builds were launched"
    assert R._kernels[(rcfg, dev, fn)] is not R._kernels[(rcfg, dev, fn + "+rounds")]
    return out, old


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 17, 32, 33, 100, 256])
def test_gpu_bitonic_topk_equals_the_round_loop(m, decode, seed, glm5_router, no_pdl_override):
    """Default build (bitonic merge) and GLM5_ROUTER_TOPK_ROUNDS build: bitwise the same ids, weights, logits, scaled
    weights, with exact ties (three identical gate rows with a large bias) and a row of NaN-free negative choices."""
    if decode and m > R.DECODE_MAX_TOKENS:
        pytest.skip("the decode kernel takes at most DECODE_MAX_TOKENS tokens")
    gate, bias = (t.clone() for t in glm5_router)
    gate[7] = gate[3]
    gate[250] = gate[3]
    bias[[3, 7, 250]] = 5.0
    bias[100:140] -= 2.0
    h = make_h(m, GLM5.hidden_size, seed + m)
    out, old = _route_both_builds(h, gate, bias, GLM5, decode)
    for a, b, name in zip(out, old, ("ids", "weights", "logits", "scaled")):
        assert_equal(OP, a, b, context=f"bitonic vs rounds {name} {m=} {decode=}")
    assert out[0][:, :3].cpu().tolist() == [[3, 7, 250]] * m
    check_route(h, gate, bias, GLM5, out[:3], f"bitonic {m=} {decode=}", scaled=out[3])
    _counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("m", [1, 7, 40])
def test_gpu_bitonic_topk_small_preset(m, decode, seed, small_router):
    """16 experts, top-4: one key per lane, lists padded to 4 (the padding paths of topk_keys)."""
    if decode and m > R.DECODE_MAX_TOKENS:
        pytest.skip("the decode kernel takes at most DECODE_MAX_TOKENS tokens")
    gate, bias = small_router
    h = make_h(m, SMALL.hidden_size, seed + m)
    out, old = _route_both_builds(h, gate, bias, SMALL, decode)
    for a, b, name in zip(out, old, ("ids", "weights", "logits", "scaled")):
        assert_equal(OP, a, b, context=f"small bitonic vs rounds {name} {m=} {decode=}")
    check_route(h, gate, bias, SMALL, out[:3], f"small bitonic {m=} {decode=}")
