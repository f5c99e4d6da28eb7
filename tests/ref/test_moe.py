"""Reference MoE / dense FFN (glm5_fastpath.ref.moe) vs independent float64 formulations, on CPU.

The float64 side dequantizes weights itself, selects experts by sorting in Python, loops token by
token over its k experts plus the shared one, and applies rsf * w per routed expert and exactly 1x to
the shared expert. Two variants:
- "same quant": the same 1x128 quantization of h and of the (bf16) SwiGLU output, bf16 at the
  points where the kernels write bf16 -> compared with kind "fp8_same_quant";
- "exact": no activation quantization, float64 throughout -> compared with kind "fp8_vs_exact".
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ref.fp8 import quant_act_per_token, quant_weight_block
from glm5_fastpath.ref.moe import (
    MoERouting, dense_mlp_forward, distinct_experts, expected_distinct_experts, expert_ffn, moe_combine,
    moe_forward, moe_slot_outputs, route,
)
from glm5_fastpath.testing.numerics import assert_close, assert_equal, rel_err
from glm5_fastpath.weights import DenseMLPWeights, ExpertStore, Fp8Linear, MoEWeights, random_layer

BF16, F64 = torch.bfloat16, torch.float64
# Min gap between the k-th and (k+1)-th choice score of a drawn token: fp32 vs float64 router
# math differs by ~1e-7, so a wider gap makes the two top-k sets provably equal (no flaky ties).
ROUTE_MARGIN = 1e-5
SMALL_MOE_LAYER = 1  # small preset: first_k_dense_replace = 1
GLM5_MOE_LAYER = 3


# ---- independent float64 formulation ----------------------------------------------------------------

def ref_route64(h, gate, bias, k, norm=True):
    """-> (ids [M,k] long, weights [M,k] f64, logits f64, boundary margin [M] f64)."""
    logits = h.to(F64) @ gate.to(F64).t()
    s = 1.0 / (1.0 + torch.exp(-logits))
    choice = (s + bias.to(F64)).tolist()
    E = gate.shape[0]
    ids, margin = [], []
    for row in choice:
        order = sorted(range(E), key=lambda e: (-row[e], e))
        ids.append(order[:k])
        margin.append(row[order[k - 1]] - row[order[k]] if k < E else math.inf)
    ids = torch.tensor(ids, dtype=torch.long).reshape(-1, k)
    sel = s.gather(1, ids)
    w = sel / sel.sum(dim=1, keepdim=True) if norm else sel
    return ids, w, logits, torch.tensor(margin, dtype=F64)


def deq_weight64(lin: Fp8Linear) -> torch.Tensor:
    n, k = lin.weight.shape
    s = lin.scale_inv.to(F64)
    if n % 128 == 0 and k % 128 == 0:  # broadcast per 128x128 block (fast path, no expanded scale)
        return (lin.weight.to(F64).view(n // 128, 128, k // 128, 128) * s[:, None, :, None]).view(n, k)
    return lin.weight.to(F64) * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def deq_act64(x8, s):
    return x8.to(F64) * s.to(F64).repeat_interleave(128, dim=-1)


def silu64(x):
    return x / (1.0 + torch.exp(-x))


def ffn64(x, W13, W2, same_quant: bool):
    """x [T,H] f64 (the dequantized fp8 input for same_quant, raw h for exact) -> [T,H] f64."""
    inter = W13.shape[0] // 2
    gu = x @ W13.t()
    if same_quant:
        gu = gu.to(BF16).to(F64)  # FC1 writes bf16
    a = silu64(gu[:, :inter]) * gu[:, inter:]
    if same_quant:
        a8, a_s = quant_act_per_token(a.to(BF16))  # requant of the same bf16 SwiGLU output
        a = deq_act64(a8, a_s)
    return a @ W2.t()


def ref_moe64(h, w: MoEWeights, cfg: Glm5Config, ids, wts):
    """Explicit per-token loop: out[m] = sum_j rsf*w_j*E_{ids_j}(h_m) + 1.0*E_shared(h_m).

    Each (token, expert) term is evaluated on that token alone. The terms are grouped by expert only
    so each expert's float64 weights (300 MB at full size) are built once.
    -> (same-quant f64 [M,H], exact f64 [M,H]).
    """
    E, rsf = cfg.n_routed_experts, cfg.routed_scaling_factor
    h8, hs = quant_act_per_token(h)
    xq, xe = deq_act64(h8, hs), h.to(F64)
    terms: dict[int, list[tuple[int, float]]] = {}
    for m in range(h.shape[0]):
        for e, c in zip(ids[m].tolist(), wts[m].tolist()):
            terms.setdefault(int(e), []).append((m, rsf * float(c)))
        if cfg.n_shared_experts:
            terms.setdefault(E, []).append((m, 1.0))  # the shared expert counts exactly once
    out_q = torch.zeros(h.shape, dtype=F64)
    out_e = torch.zeros(h.shape, dtype=F64)
    for e, uses in terms.items():
        w13, w2 = w.experts.get(e)
        W13, W2 = deq_weight64(w13), deq_weight64(w2)
        for m, c in uses:
            out_q[m] += c * ffn64(xq[m:m + 1], W13, W2, True)[0]
            out_e[m] += c * ffn64(xe[m:m + 1], W13, W2, False)[0]
    return out_q, out_e


def draw_tokens(M, gate, bias, k):
    """Fresh bf16 tokens ~N(0,1) (RMSNorm output scale), redrawn where the top-k boundary is a near tie."""
    h = torch.randn(M, gate.shape[1]).to(BF16)
    for _ in range(100):
        bad = ref_route64(h, gate, bias, k)[3] < ROUTE_MARGIN
        if not bad.any():
            return h
        h[bad] = torch.randn(int(bad.sum()), gate.shape[1]).to(BF16)
    raise RuntimeError("could not draw tokens without near-tie routing")


def random_routing(M, E, k, *, force=None):
    """Distinct random ids per row (optionally with expert `force` in every row) and normalized weights."""
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(M)])
    if force is not None:
        for m in range(M):
            row = ids[m]
            if force not in row:
                row[torch.randint(k, ())] = force
    w = torch.rand(M, k) + 0.05
    return ids.to(torch.int32), (w / w.sum(1, keepdim=True)).float()


def sorted_rows(ids, w):
    order = ids.long().argsort(dim=1)
    return ids.long().gather(1, order), w.gather(1, order)


def check_route(op, cfg, h, gate, bias):
    k = cfg.num_experts_per_tok
    ids, w, logits = route(h, gate, bias, cfg)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and logits.dtype == torch.float32
    assert ids.shape == (h.shape[0], k) and w.shape == ids.shape
    rids, rw, rlogits, _ = ref_route64(h, gate, bias, k, cfg.norm_topk_prob)
    assert_close(op + " logits", logits, rlogits, kind="fp32")
    a_ids, a_w = sorted_rows(ids, w)
    b_ids, b_w = sorted_rows(rids, rw)
    assert_equal(op + " topk_ids (as sets)", a_ids, b_ids)
    assert_close(op + " topk_weights", a_w, b_w, kind="fp32")
    assert_close(op + " weights sum to 1", w.sum(1), torch.ones(h.shape[0], dtype=F64), kind="fp32")
    # ids come by descending choice score
    choice = (torch.sigmoid(logits) + bias).gather(1, ids.long())
    assert bool((choice[:, :-1] >= choice[:, 1:]).all()), f"{op}: ids not ordered by choice score"
    return ids, w


def check_moe(op, cfg, w, h, ids=None, wts=None):
    if ids is None:
        out, routing = moe_forward(h, w, cfg, return_routing=True)
        rids, rw, _, _ = ref_route64(h, w.gate, w.e_score_correction_bias, cfg.num_experts_per_tok)
        assert_equal(op + " routing (as sets)", sorted_rows(routing.topk_ids, routing.topk_weights)[0],
                     sorted_rows(rids, rw)[0])
    else:
        out = moe_forward(h, w, cfg, ids, wts)
        rids, rw = ids, wts
    assert out.dtype == BF16 and out.shape == h.shape
    ref_q, ref_e = ref_moe64(h, w, cfg, rids, rw)
    e_q = assert_close(op + " vs float64 same-quant", out, ref_q, kind="fp8_same_quant")
    e_e = assert_close(op + " vs float64 exact", out, ref_e, kind="fp8_vs_exact")
    print(f"{op}: rel_err same-quant {e_q:.2e}, exact {e_e:.2e}")
    return out


# ---- fixtures ----------------------------------------------------------------------------------------

@pytest.fixture
def small():
    return Glm5Config.preset("small")


@pytest.fixture
def small_moe(small, seed):
    return random_layer(small, SMALL_MOE_LAYER, seed).mlp


@pytest.fixture(scope="module")
def glm5_moe():
    """One full-size GLM-5 MoE layer (experts generated lazily, cached once touched), shared by this module."""
    s = int(os.environ.get("GLM5_FASTPATH_TEST_SEED", torch.seed() % (2**31)))
    print(f"glm5 layer seed={s}")
    cfg = Glm5Config.preset("glm5")
    return cfg, random_layer(cfg, GLM5_MOE_LAYER, s).mlp


# ---- routing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [1, 3, 16, 37])
def test_route_small(small, small_moe, M):
    h = draw_tokens(M, small_moe.gate, small_moe.e_score_correction_bias, small.num_experts_per_tok)
    check_route(f"route small M={M}", small, h, small_moe.gate, small_moe.e_score_correction_bias)


@pytest.mark.slow  # the first glm5 test builds the full-size layer (~5 s)
@pytest.mark.parametrize("M", [1, 3, 16])
def test_route_glm5(glm5_moe, seed, M):
    cfg, w = glm5_moe
    h = draw_tokens(M, w.gate, w.e_score_correction_bias, cfg.num_experts_per_tok)
    ids, _ = check_route(f"route glm5 M={M}", cfg, h, w.gate, w.e_score_correction_bias)
    assert ids.shape == (M, 8)


def test_route_bias_selects_but_weights_are_unbiased(small, seed):
    cfg, E, H, k = small, small.n_routed_experts, small.hidden_size, small.num_experts_per_tok
    # Token 0 sees logits l_e = gate[e, 0]: distinct bf16 values in a random expert order.
    perm = torch.randperm(E)
    levels = torch.linspace(2.0, -2.0, E)  # rank r gets levels[r]
    gate = torch.zeros(E, H)
    gate[perm, 0] = levels
    gate = gate.to(BF16)
    h = torch.zeros(2, H)
    h[:, 0] = 1.0
    h[1, 0] = 0.5  # a second token with the same ranking, different scores
    h = h.to(BF16)
    bias = torch.zeros(E)
    boosted = perm[-2:]  # the two worst experts by score get pushed into the top-k
    bias[boosted] = torch.tensor([1.0, 0.8])
    ids, w, _ = route(h, gate, bias, cfg)
    want = set(perm[: k - 2].tolist()) | set(boosted.tolist())
    for m in range(2):
        assert set(ids[m].tolist()) == want, f"bias did not change the selection: {ids[m].tolist()} vs {want}"
        s = torch.sigmoid(h[m].to(F64) @ gate.to(F64).t())
        sel = s[ids[m].long()]
        assert_close("route unbiased weights", w[m], sel / sel.sum(), kind="fp32")
        biased = (s + bias.to(F64))[ids[m].long()]
        assert rel_err(w[m], biased / biased.sum()) > 0.1, "weights look like they used the biased score"
    # the unbiased top-k would have been different
    assert set(torch.sigmoid(h[0].float() @ gate.float().t()).topk(k).indices.tolist()) != want


def test_route_ties_lower_id_wins(small):
    E, H, k = small.n_routed_experts, small.hidden_size, small.num_experts_per_tok
    gate = torch.zeros(E, H, dtype=BF16)  # every logit 0 -> every score 0.5
    h = torch.randn(3, H).to(BF16)
    ids, w, _ = route(h, gate, torch.zeros(E), small)
    assert_equal("route ties", ids, torch.arange(k, dtype=torch.int32).expand(3, k).contiguous())
    assert_close("route tie weights", w, torch.full((3, k), 1.0 / k), kind="fp32")
    bias = torch.zeros(E)
    bias[[9, 5, 12]] = 0.25  # equal boosts: ascending id among them, then the lowest unboosted ids
    ids, _, _ = route(h, gate, bias, small)
    assert ids[0].tolist() == [5, 9, 12, 0]


def test_route_without_norm(small, small_moe):
    cfg = small.replace(norm_topk_prob=False)
    h = draw_tokens(5, small_moe.gate, small_moe.e_score_correction_bias, cfg.num_experts_per_tok)
    ids, w, logits = route(h, small_moe.gate, small_moe.e_score_correction_bias, cfg)
    assert_close("route norm_topk_prob=False", w, torch.sigmoid(logits.to(F64)).gather(1, ids.long()), kind="fp32")


# ---- one expert / dense FFN --------------------------------------------------------------------------

def check_ffn(op, h, w13, w2):
    h8, hs = quant_act_per_token(h)
    y = expert_ffn(h8, hs, w13, w2)
    assert y.dtype == BF16 and y.shape == h.shape
    W13, W2 = deq_weight64(w13), deq_weight64(w2)
    assert_close(op + " vs float64 same-quant", y, ffn64(deq_act64(h8, hs), W13, W2, True), kind="fp8_same_quant")
    assert_close(op + " vs float64 exact", y, ffn64(h.to(F64), W13, W2, False), kind="fp8_vs_exact")


@pytest.mark.parametrize("T", [1, 3, 16])
def test_expert_ffn_small(small, small_moe, T):
    e = int(torch.randint(small.n_routed_experts + 1, ()))
    check_ffn(f"expert_ffn small e={e} T={T}", torch.randn(T, small.hidden_size).to(BF16), *small_moe.experts.get(e))


@pytest.mark.slow
def test_expert_ffn_glm5(glm5_moe, seed):
    cfg, w = glm5_moe
    e = int(torch.randint(cfg.n_routed_experts, ()))
    w13, w2 = w.experts.get(e)
    assert w13.shape == (2 * cfg.moe_intermediate_size, cfg.hidden_size) and w2.shape == (6144, 2048)
    check_ffn(f"expert_ffn glm5 e={e}", torch.randn(3, cfg.hidden_size).to(BF16), w13, w2)


def dense_ref(h, w: DenseMLPWeights):
    h8, hs = quant_act_per_token(h)
    W13, W2 = deq_weight64(w.gate_up), deq_weight64(w.down)
    return ffn64(deq_act64(h8, hs), W13, W2, True), ffn64(h.to(F64), W13, W2, False)


@pytest.mark.parametrize("M", [1, 3, 16, 37])
def test_dense_mlp_small(small, seed, M):
    w = random_layer(small, 0, seed).mlp
    assert isinstance(w, DenseMLPWeights) and w.gate_up.shape == (2 * small.intermediate_size, small.hidden_size)
    h = torch.randn(M, small.hidden_size).to(BF16)
    out = dense_mlp_forward(h, w)
    assert out.dtype == BF16 and out.shape == h.shape
    ref_q, ref_e = dense_ref(h, w)
    assert_close("dense_mlp_forward vs float64 same-quant", out, ref_q, kind="fp8_same_quant")
    assert_close("dense_mlp_forward vs float64 exact", out, ref_e, kind="fp8_vs_exact")


@pytest.mark.slow
def test_dense_mlp_glm5_dims(seed):
    cfg = Glm5Config.preset("glm5")
    H, inter = cfg.hidden_size, cfg.intermediate_size
    w = DenseMLPWeights(gate_up=Fp8Linear(*quant_weight_block(torch.randn(2 * inter, H) * H ** -0.5)),
                        down=Fp8Linear(*quant_weight_block(torch.randn(H, inter) * inter ** -0.5)))
    h = torch.randn(3, H).to(BF16)
    out = dense_mlp_forward(h, w)
    ref_q, ref_e = dense_ref(h, w)
    assert_close("dense_mlp_forward glm5 vs float64 same-quant", out, ref_q, kind="fp8_same_quant")
    assert_close("dense_mlp_forward glm5 vs float64 exact", out, ref_e, kind="fp8_vs_exact")


# ---- the MoE -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [1, 3, 16, 37])
def test_moe_forward_small(small, small_moe, M):
    h = draw_tokens(M, small_moe.gate, small_moe.e_score_correction_bias, small.num_experts_per_tok)
    check_moe(f"moe_forward small M={M}", small, small_moe, h)


@pytest.mark.slow
@pytest.mark.parametrize("M", [1, 3])
def test_moe_forward_glm5(glm5_moe, seed, M):
    cfg, w = glm5_moe
    h = draw_tokens(M, w.gate, w.e_score_correction_bias, cfg.num_experts_per_tok)
    check_moe(f"moe_forward glm5 M={M}", cfg, w, h)


def test_routing_is_exposed_and_reused(small, small_moe):
    h = draw_tokens(9, small_moe.gate, small_moe.e_score_correction_bias, small.num_experts_per_tok)
    out, r = moe_forward(h, small_moe, small, return_routing=True)
    assert isinstance(r, MoERouting) and r.logits is not None and r.logits.shape == (9, small.n_routed_experts)
    ids, w, _ = route(h, small_moe.gate, small_moe.e_score_correction_bias, small)
    assert_equal("moe_forward routing ids", r.topk_ids, ids)
    assert_equal("moe_forward routing weights", r.topk_weights, w)
    assert r.n_distinct == distinct_experts(ids)
    # passing the routing back in gives the same bits
    assert_equal("moe_forward with given routing", moe_forward(h, small_moe, small, ids, w), out)
    out2, r2 = moe_forward(h, small_moe, small, ids, w, return_routing=True)
    assert r2.logits is None and r2.topk_ids is ids


def test_shared_expert_counts_exactly_once(small, small_moe):
    E, k, H = small.n_routed_experts, small.num_experts_per_tok, small.hidden_size
    M = 7
    h = torch.randn(M, H).to(BF16)
    h8, hs = quant_act_per_token(h)
    y_shared = expert_ffn(h8, hs, *small_moe.experts.get(E))
    ids, _ = random_routing(M, E, k)
    # Routed weights 0: the output is the shared expert alone, at 1x (not 1/2.5x, not 2.5x).
    out = moe_forward(h, small_moe, small, ids, torch.zeros(M, k))
    assert_close("shared expert alone = 1x", out, y_shared, kind="bf16")
    # With real weights: (with shared) - (without shared) = the shared expert.
    ids, w = random_routing(M, E, k)
    with_shared = moe_forward(h, small_moe, small, ids, w)
    without = moe_forward(h, small_moe, small.replace(n_shared_experts=0), ids, w)
    assert_close("shared expert contribution", with_shared.double() - without.double(), y_shared, kind="bf16")
    # and the whole thing vs the float64 loop (which adds the shared expert with weight 1.0)
    check_moe("moe_forward shared", small, small_moe, h, ids, w)
    slots = moe_slot_outputs(h, small_moe, small, ids, w)
    assert slots.shape == (M, k + 1, H)
    assert_close("shared slot = E_shared / rsf", slots[:, -1], y_shared.double() / small.routed_scaling_factor,
                 kind="bf16")


def test_one_expert_gets_all_tokens(small, small_moe):
    E, k, M = small.n_routed_experts, small.num_experts_per_tok, 13
    hot = int(torch.randint(E, ()))
    ids, w = random_routing(M, E, k, force=hot)
    assert all(hot in row for row in ids.tolist())
    h = torch.randn(M, small.hidden_size).to(BF16)
    check_moe(f"moe_forward expert {hot} on every token", small, small_moe, h, ids, w)


def test_tokens_share_experts(small, small_moe):
    E, k, M = small.n_routed_experts, small.num_experts_per_tok, 16
    # Every token routed to the same k experts (in shuffled slot orders), incl. repeated tokens.
    base = torch.randperm(E)[:k]
    ids = torch.stack([base[torch.randperm(k)] for _ in range(M)]).to(torch.int32)
    w = torch.rand(M, k) + 0.05
    w = (w / w.sum(1, keepdim=True)).float()
    h = torch.randn(M, small.hidden_size).to(BF16)
    h[5] = h[2]
    assert distinct_experts(ids) == k
    check_moe("moe_forward all tokens on the same experts", small, small_moe, h, ids, w)
    # k = 1: a single expert for the whole batch
    cfg1 = small.replace(num_experts_per_tok=1)
    ids1 = torch.full((M, 1), int(base[0]), dtype=torch.int32)
    check_moe("moe_forward k=1 single expert", cfg1, small_moe, h, ids1, torch.ones(M, 1))


def test_only_selected_experts_are_fetched(small, small_moe):
    fetched = []

    def fetch(e):
        fetched.append(e)
        return small_moe.experts.get(e)

    lazy = MoEWeights(small_moe.gate, small_moe.e_score_correction_bias,
                      ExpertStore(len(small_moe.experts), fetch, cache=False))
    h = draw_tokens(3, small_moe.gate, small_moe.e_score_correction_bias, small.num_experts_per_tok)
    out, r = moe_forward(h, lazy, small, return_routing=True)
    want = sorted(set(r.topk_ids.flatten().tolist()) | {small.n_routed_experts})
    assert sorted(fetched) == want, f"fetched {sorted(fetched)}, selected {want}"  # each selected expert once
    assert_equal("lazy store", out, moe_forward(h, small_moe, small))


def test_slots_and_combine(small, small_moe):
    E, k, M, rsf = small.n_routed_experts, small.num_experts_per_tok, 5, small.routed_scaling_factor
    ids, w = random_routing(M, E, k)
    h = torch.randn(M, small.hidden_size).to(BF16)
    slots = moe_slot_outputs(h, small_moe, small, ids, w)
    h8, hs = quant_act_per_token(h)
    for m in range(M):
        for j in range(k):
            y = expert_ffn(h8[m:m + 1], hs[m:m + 1], *small_moe.experts.get(int(ids[m, j])))
            assert_close(f"slot ({m},{j})", slots[m:m + 1, j], y.double() * float(w[m, j]), kind="bf16")
    out = moe_combine(slots, rsf)
    assert_close("moe_combine", out, rsf * slots.double().sum(1), kind="bf16")
    assert_equal("moe_forward = combine(slots)", moe_forward(h, small_moe, small, ids, w), out)


def test_empty_batch(small, small_moe):
    h = torch.zeros(0, small.hidden_size, dtype=BF16)
    out, r = moe_forward(h, small_moe, small, return_routing=True)
    assert out.shape == (0, small.hidden_size) and r.topk_ids.shape == (0, small.num_experts_per_tok)


# ---- helpers and validation --------------------------------------------------------------------------

def test_expected_distinct_experts():
    got = [round(expected_distinct_experts(M), 1) for M in (1, 16, 64, 256)]
    assert got == [8.0, 102.0, 222.4, 255.9]  # spec section 6
    assert expected_distinct_experts(0) == 0.0
    assert expected_distinct_experts(3, E=16, k=4) == pytest.approx(16 * (1 - (12 / 16) ** 3))
    with pytest.raises(ValueError, match="expected_distinct_experts"):
        expected_distinct_experts(4, E=8, k=9)


def test_distinct_experts():
    assert distinct_experts(torch.tensor([[3, 1], [1, 7], [3, 9]])) == 4
    assert distinct_experts(torch.zeros(0, 8, dtype=torch.int32)) == 0


def test_input_validation(small, small_moe):
    E, H, k = small.n_routed_experts, small.hidden_size, small.num_experts_per_tok
    g, b = small_moe.gate, small_moe.e_score_correction_bias
    h = torch.randn(2, H).to(BF16)
    ids, w = random_routing(2, E, k)
    cases = [
        (lambda: route(h.float(), g, b, small), r"route: h must be bfloat16"),
        (lambda: route(h[:, :128], g, b, small), r"route: h must have shape"),
        (lambda: route(h, g.float(), b, small), r"route: gate must be bfloat16"),
        (lambda: route(h, g[:-1], b, small), r"route: gate must have shape"),
        (lambda: route(h, g, b.to(BF16), small), r"route: bias .* must be float32"),
        (lambda: moe_forward(h, small_moe, small, ids), r"moe_forward: pass both"),
        (lambda: moe_forward(h, small_moe, small, ids + E, w), r"out of range"),
        (lambda: moe_forward(h, small_moe, small, ids - 100, w), r"out of range"),
        (lambda: moe_forward(h, small_moe, small, ids.float(), w), r"topk_ids must be int32 or int64"),
        (lambda: moe_forward(h, small_moe, small, ids, w.double()), r"topk_weights must be float32"),
        (lambda: moe_forward(h, small_moe, small, ids[:1], w[:1]), r"topk_ids must have shape"),
        (lambda: moe_forward(h, small_moe, small, ids, w[:, :-1]), r"topk_weights must have shape"),
        (lambda: moe_forward(h, small_moe, small, torch.zeros(2, k, dtype=torch.int32), w), r"repeats an expert"),
        (lambda: moe_forward(h.float(), small_moe, small), r"moe_forward: h must be bfloat16"),
        (lambda: expert_ffn(*quant_act_per_token(h), small_moe.experts.get(0)[1], small_moe.experts.get(0)[0]),
         r"expert_ffn: w13"),
        (lambda: expert_ffn(h, torch.ones(2, H // 128), *small_moe.experts.get(0)), r"expert_ffn: h_fp8 must be"),
        (lambda: expert_ffn(quant_act_per_token(h)[0], torch.ones(2, 3), *small_moe.experts.get(0)),
         r"expert_ffn: h_scale must have shape"),
        (lambda: dense_mlp_forward(torch.randn(2, 256).to(BF16), random_layer(small, 0, 0).mlp),
         r"dense_mlp_forward: h must have shape"),
        (lambda: moe_combine(torch.zeros(2, 3, 4), 2.5), r"moe_combine: slots must be bfloat16"),
    ]
    for fn, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fn()
    # a store without the shared expert cannot serve a config that has one
    short = MoEWeights(g, b, ExpertStore(E, small_moe.experts.get))
    with pytest.raises(ValueError, match="moe_slot_outputs: weights hold 16 experts"):
        moe_forward(h, short, small, ids, w)
