"""EP partition, dispatch plan, counts, combine map and symmetric-buffer layout (glm5_fastpath.moe.ep.layout).

The plan is checked against a brute-force restatement of its rules (every routed pair exactly once, on
the owner, in (local expert, src, token) order; shared pairs on the own rank; each remote token pulled
once, in (src, token) order) for uniform / skewed / nowhere / starved routing, padding tokens and M = 0.
"""
from __future__ import annotations

import pytest
import torch

from glm5_fastpath.moe.ep import layout as L
from glm5_fastpath.moe.ep.cases import make_routing

E, K = 16, 4


def _ids(tokens, part, kinds=None, avoid=(), pad=None, seed=0):
    kinds = kinds or ["uniform"] * part.world_size
    return [make_routing(m, part, K, seed * 100 + r, kinds[r], r, avoid, (pad or {}).get(r, ()))[0]
            for r, m in enumerate(tokens)]


CASES = {
    "uniform2": (2, [9, 5], None, (), None),
    "uniform4_m0": (4, [7, 0, 12, 3], None, (), None),
    "skewed4": (4, [10, 8, 6, 11], ["skewed"] * 4, (), None),
    "nowhere_starved4": (4, [9, 4, 13, 6], ["nowhere", "uniform", "skewed", "uniform"], (3,), {2: (1, 5)}),
    "nowhere2": (2, [6, 6], ["nowhere", "nowhere"], (), {0: (0,)}),
}


def _case(name):
    n, tokens, kinds, avoid, pad = CASES[name]
    part = L.EPPartition(E, n, 1)
    return part, _ids(tokens, part, kinds, avoid, pad, seed=len(name))


# ---- partition ---------------------------------------------------------------------------------------------

def test_partition_rules():
    p = L.EPPartition(256, 8, 1)
    assert p.experts_per_rank == 32 and p.num_local_total == 33 and p.shared_local_id == 32
    for e in (0, 31, 32, 200, 255):
        assert p.owner(e) == e // 32 and p.local_id(e) == e % 32
        assert p.global_id(p.owner(e), p.local_id(e)) == e
    assert list(p.local_experts(3)) == list(range(96, 128))
    assert p.weight_rows(3) == list(range(96, 128)) + [256]  # shared expert replicated, last
    assert L.EPPartition(256, 8, 0).weight_rows(0) == list(range(32))
    for bad in (dict(num_experts=10, world_size=4), dict(num_experts=16, world_size=0),
                dict(num_experts=16, world_size=2, num_shared=2), dict(num_experts=2, world_size=4)):
        with pytest.raises(L.EPLayoutError):
            L.EPPartition(**bad)
    with pytest.raises(L.EPLayoutError):
        p.owner(256)


# ---- plan vs brute force ---------------------------------------------------------------------------------------

def _brute_plan(ids_all, part, d):
    epr, k = part.experts_per_rank, ids_all[0].shape[1]
    per_expert = {le: [] for le in range(part.num_local_total)}
    for src, ids in enumerate(ids_all):
        for t in range(ids.shape[0]):
            if int(ids[t, 0]) < 0:
                continue
            for j in range(k):
                e = int(ids[t, j])
                if e // epr == d:
                    per_expert[e % epr].append((src, t, j))
            if part.num_shared and src == d:
                per_expert[epr].append((d, t, k))
    for le in per_expert:
        per_expert[le].sort()
    pool = sorted({(s, t) for le in per_expert for (s, t, _) in per_expert[le] if s != d})
    return per_expert, pool


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_matches_brute_force(name):
    part, ids_all = _case(name)
    plans = L.plan_all(ids_all, part)
    M = [int(i.shape[0]) for i in ids_all]
    for d, p in enumerate(plans):
        want, pool = _brute_plan(ids_all, part, d)
        for le in range(part.num_local_total):
            assert p.expert_pairs(le) == want[le], (name, d, le)
        assert list(zip(p.pool_src.tolist(), p.pool_token.tolist())) == pool
        assert p.expert_counts() == [len(want[le]) for le in range(part.num_local_total)]
        # pair_row addresses [own tokens | pulled pool rows]
        for i in range(p.num_pairs):
            s, t, r = int(p.pair_src[i]), int(p.pair_token[i]), int(p.pair_row[i])
            if s == d:
                assert r == t
            else:
                assert r >= M[d] and pool[r - M[d]] == (s, t)
        assert p.num_tokens == tuple(M)
        assert L.dispatch_plan(ids_all, part, d).expert_pairs(0) == p.expert_pairs(0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_pair_exactly_once_and_counts(name):
    part, ids_all = _case(name)
    plans = L.plan_all(ids_all, part)
    k, N = K, part.world_size
    seen = {}
    for d, p in enumerate(plans):
        for s, t, j in zip(p.pair_src.tolist(), p.pair_token.tolist(), p.pair_slot.tolist()):
            assert (s, t, j) not in seen
            seen[(s, t, j)] = d
    for s, ids in enumerate(ids_all):
        for t in range(ids.shape[0]):
            for j in range(k + 1):
                if int(ids[t, 0]) < 0:
                    assert (s, t, j) not in seen  # padding tokens: no pairs, not even the shared one
                elif j < k:
                    assert seen[(s, t, j)] == part.owner(int(ids[t, j]))
                else:
                    assert seen[(s, t, j)] == s  # the shared expert runs on the token's own rank
    pc, tc = L.pair_counts(ids_all, part), L.token_counts(ids_all, part)
    for s in range(N):
        for d in range(N):
            p = plans[d]
            assert int(pc[s, d]) == int(((p.pair_src == s) & (p.pair_slot < k)).sum())
            if s != d:
                assert int(tc[s, d]) == int((p.pool_src == s).sum())  # off-diagonal: rows pulled
    tr = L.traffic(ids_all, part, hidden=256)
    assert torch.equal(tr.dispatch_rows, torch.tensor([p.num_pulled for p in plans]))
    assert torch.equal(tr.dispatch_bytes, tr.dispatch_rows * (256 + 8))


def test_starved_and_nowhere_ranks():
    part, ids_all = _case("nowhere_starved4")
    plans = L.plan_all(ids_all, part)
    # rank 3 is avoided by every token: only its own shared pairs, nothing pulled
    assert plans[3].expert_counts()[:part.experts_per_rank] == [0] * part.experts_per_rank
    assert plans[3].num_pulled == 0 and plans[3].expert_counts()[-1] == ids_all[3].shape[0]
    # rank 0's tokens route nowhere locally: no pair of rank 0 on rank 0 except the shared ones
    p0 = plans[0]
    assert int(((p0.pair_src == 0) & (p0.pair_slot < K)).sum()) == 0
    assert L.pair_counts(ids_all, part)[0, 0] == 0
    # padding rows of rank 2 (tokens 1 and 5) appear nowhere
    for p in plans:
        assert not bool(((p.pair_src == 2) & ((p.pair_token == 1) | (p.pair_token == 5))).any())


def test_combine_map_inverts_the_plans():
    part, ids_all = _case("nowhere_starved4")
    plans = L.plan_all(ids_all, part)
    maps = L.combine_maps(plans)
    for s, cm in enumerate(maps):
        M, S = cm.dst_rank.shape
        assert S == K + 1
        for t in range(M):
            for j in range(S):
                d, i = int(cm.dst_rank[t, j]), int(cm.dst_pair[t, j])
                if int(ids_all[s][t, 0]) < 0:
                    assert d == L.PAD and i == L.PAD
                    continue
                p = plans[d]
                assert (int(p.pair_src[i]), int(p.pair_token[i]), int(p.pair_slot[i])) == (s, t, j)


def test_plan_input_errors():
    part = L.EPPartition(E, 2, 1)
    ok = torch.zeros(2, K, dtype=torch.int32) + torch.arange(K, dtype=torch.int32)
    with pytest.raises(L.EPLayoutError, match="world_size"):
        L.plan_all([ok], part)
    with pytest.raises(L.EPLayoutError, match="span"):
        L.plan_all([ok, ok + 20], part)
    dup = ok.clone()
    dup[0, 1] = dup[0, 0]
    with pytest.raises(L.EPLayoutError, match="twice"):
        L.plan_all([ok, dup], part)
    with pytest.raises(L.EPLayoutError, match="columns"):
        L.plan_all([ok, ok[:, :2]], part)
    with pytest.raises(L.EPLayoutError, match="rank="):
        L.dispatch_plan([ok, ok], part, 2)


def test_plan_is_deterministic_and_independent_of_id_dtype():
    part, ids_all = _case("skewed4")
    a = L.plan_all(ids_all, part)
    b = L.plan_all([i.long() for i in ids_all], part)
    for x, y in zip(a, b):
        assert torch.equal(x.pair_src, y.pair_src) and torch.equal(x.pair_token, y.pair_token)
        assert torch.equal(x.pair_row, y.pair_row) and x.expert_offsets == y.expert_offsets


# ---- buffers ------------------------------------------------------------------------------------------------------

def test_buffer_layout_offsets_and_sizes():
    lay = L.buffer_layout(6144, 2048, 256, 8, world_size=8, max_tokens=64)
    for sym in (True, False):
        fs = [f for f in lay.fields if f.symmetric == sym]
        for a, b in zip(fs, fs[1:]):
            assert a.offset % L.FIELD_ALIGN == 0 and a.offset + a.nbytes <= b.offset
    assert lay.field("slots").nbytes == 64 * 9 * 6144 * 2
    assert lay.field("x8").nbytes == 64 * 6144 and lay.field("topk_ids").shape == (2, 64, 8)  # ids: 2 parities
    assert lay.field("slots_fp8").nbytes == 64 * 8 * 6144 and lay.field("slots_e8m0").nbytes == 64 * 8 * 192
    assert lay.field("combine_ctr").shape == (64, 24)
    assert lay.recv_cap == 7 * 64
    assert lay.pairs_cap == 8 * 64 * 8 + 64 + 8 * 33
    assert lay.symmetric_bytes >= sum(f.nbytes for f in lay.fields if f.symmetric)
    only_a = L.buffer_layout(6144, 2048, 256, 8, world_size=8, max_tokens=64, modes=("A",))
    assert "out_pool" not in {f.name for f in only_a.fields} and only_a.symmetric_bytes < lay.symmetric_bytes
    with pytest.raises(L.EPLayoutError):
        L.buffer_layout(6144, 2048, 256, 8, world_size=8, max_tokens=64, modes=("C",))


def test_worst_case_caps_hold_for_adversarial_routing():
    """Every token of every rank routed to rank 0's experts: pool and pair capacity exactly suffice."""
    part = L.EPPartition(E, 4, 1)
    T = 6
    ids_all = [torch.stack([torch.randperm(part.experts_per_rank)[:K] for _ in range(T)]).int() for _ in range(4)]
    p0 = L.plan_all(ids_all, part)[0]
    recv, pairs = L.worst_case_caps(4, T, K, E, 1)
    assert p0.num_pulled == recv == 3 * T
    assert p0.num_pairs + L.PAIR_ALIGN * part.num_local_total <= pairs


def test_glm5_size_table():
    rows = L.glm5_size_table()
    assert len(rows) == len(L.TABLE_TOKENS) * len(L.TABLE_EP)
    r = next(x for x in rows if x["ep"] == 8 and x["max_tokens"] == 4096)
    assert r["A"] == 4096 * 9 * 6144 * 2  # 453 MB slot buffer
    assert r["inputs"] == 4096 * (6144 + 48 * 4 + 2 * 8 * 4 + 8 * 4)
    md = L.format_size_table(rows)
    assert md.count("\n") == len(rows) + 1 and "| 8 | 4096 |" in md
