"""The ping-pong sparse-MLA tile's synchronisation protocol, replayed on CPU (SparseMlaSplitPingPongTileT in
csrc/attn_core/sparse_mla_decode.cuh): the producer warp and the two consumer warpgroups as step programs over the
same barriers the kernel uses, run under random interleavings.

- mbarriers full[s] (32 producer arrivals per phase) / empty[s] (256 consumer arrivals), waited by parity: the
  producer waits empty[s] with parity ((j / S) & 1) ^ 1 before gathering block j into stage s = j % S; a consumer
  waits full[s] with parity (j / S) & 1 before reading block j;
- named barriers 2 / 3 (256 threads: the owner warpgroup's 128 arrive, the other's 128 sync) hand block j's softmax
  step from its owner (j % 2) to the other warpgroup; every step releases the stage of block j - 1 (stage_of);
- blocks go in pairs, an odd count padded with a virtual block n that reads block n - 1's stage and arrives / syncs
  like a real one but never waits on full.

Checked for n = 1..12 blocks and 3 / 4 stages: the run completes (no deadlock), every read of a stage happens
while it holds the block it should (filled for that block, not yet refilled), and the producer never refills a stage
before both warpgroups released it; 2 stages deadlock (hence the kernel's static_assert). The warpgroups are modelled as single actors (their 128 threads move together:
the kernel's steps are warpgroup-uniform)."""
from __future__ import annotations

import random

import pytest


class Deadlock(Exception):
    pass


class Sim:
    def __init__(self, n: int, stages: int):
        self.n, self.S = n, stages
        self.full_phase = [0] * stages     # completed phases
        self.full_cnt = [0] * stages
        self.empty_phase = [0] * stages
        self.empty_cnt = [0] * stages
        self.stage_block = [None] * stages  # which block's data a stage holds (after its full phase completes)
        self.pending_fill = [None] * stages
        self.named = {2: [0, 0], 3: [0, 0]}  # barrier id -> [arrivals of the current generation, syncs waiting]
        self.named_gen = {2: 0, 3: 0}
        self.handoff_log = []
        self.inflight = {0: set(), 1: set()}  # per warpgroup: stages its issued, not yet retired wgmma read

    # parity wait: passes once the phase with parity P has completed, i.e. completed phases > the last one of that parity
    @staticmethod
    def parity_done(completed: int, parity: int) -> bool:
        # the phase with parity P that a waiter wants is the latest one of that parity at or before `completed`
        # (fresh barrier: waiting for parity 1 passes at once, the "previous" phase)
        return (completed % 2) != parity

    def stage_of(self, j: int) -> int:
        return (j if j < self.n else self.n - 1) % self.S


def producer(sim: Sim):
    for j in range(sim.n):
        st = j % sim.S
        while not Sim.parity_done(sim.empty_phase[st], ((j // sim.S) & 1) ^ 1):
            yield "wait empty"
        assert sim.pending_fill[st] is None
        assert all(st not in f for f in sim.inflight.values()), f"stage {st} refilled under an in-flight wgmma"
        sim.pending_fill[st] = j
        yield "issue copies"
        # the 32 lanes' cp.async.mbarrier.arrive.noinc land (as one event here)
        sim.stage_block[st] = j
        sim.pending_fill[st] = None
        sim.full_cnt[st] += 32
        assert sim.full_cnt[st] == 32
        sim.full_cnt[st] = 0
        sim.full_phase[st] += 1
        yield "arrived full"


def wait_full(sim: Sim, j: int):
    st = j % sim.S
    while not Sim.parity_done(sim.full_phase[st], (j // sim.S) & 1):
        yield "wait full"
    assert sim.stage_block[st] == j, (j, st, sim.stage_block[st])


def read_stage(sim: Sim, j: int, wg: int | None = None):
    """A wgmma reading block j's stage (or, for a stand-in / virtual block, stage_of(j)'s current block); with wg,
    the read stays in flight until that warpgroup's next wait (retire)."""
    st = sim.stage_of(j)
    want = j if j < sim.n else sim.n - 1
    assert sim.stage_block[st] == want and sim.pending_fill[st] is None, (j, st, sim.stage_block[st])
    if wg is not None:
        sim.inflight[wg].add(st)


def retire(sim: Sim, wg: int):
    """wgmma_wait<0>: every wgmma this warpgroup issued has finished reading its stages."""
    sim.inflight[wg].clear()


def release(sim: Sim, j_prev: int):
    st = sim.stage_of(j_prev)
    sim.empty_cnt[st] += 128
    if sim.empty_cnt[st] == 256:
        sim.empty_cnt[st] = 0
        sim.empty_phase[st] += 1


def _bar_count(sim: Sim, bid: int) -> None:
    """128 threads reach named barrier bid; the barrier completes (a new generation) at 256 (bar.arrive's count)."""
    sim.named[bid][0] += 128
    assert sim.named[bid][0] <= 256, f"barrier {bid} over-arrived: a warpgroup arrived twice in one generation"
    if sim.named[bid][0] == 256:
        sim.named[bid][0] = 0
        sim.named_gen[bid] += 1


def bar_arrive(sim: Sim, bid: int):
    _bar_count(sim, bid)
    yield "arrive"


def bar_sync(sim: Sim, bid: int):
    gen = sim.named_gen[bid]
    _bar_count(sim, bid)
    while sim.named_gen[bid] == gen:
        yield "sync"


def consumer(sim: Sim, wg: int):
    n = sim.n
    # prologue: the first own block's S (n == 1, wg 1: a stand-in over block 0's stage)
    jf = wg if wg < n else 0
    yield from wait_full(sim, jf)
    read_stage(sim, jf, wg)
    own_inflight = jf  # the S in flight reads this block's stage until the next wait
    j = 0
    while True:
        pair = (j, j + 1)
        for step_j in pair:
            if step_j % 2 == wg:  # own step
                read_stage(sim, own_inflight)  # S(step_j) (or its stand-in) retires here
                retire(sim, wg)
                virt = step_j >= n
                sim.handoff_log.append((wg, step_j, "publish"))
                yield from bar_arrive(sim, 2 + wg)
                if step_j >= 1:
                    release(sim, step_j - 1)
                read_stage(sim, step_j, wg)  # P V(step_j)
                if step_j + 2 < n:
                    yield from wait_full(sim, step_j + 2)
                    own_inflight = step_j + 2
                else:
                    own_inflight = step_j if step_j < n else n - 1  # the stand-in reads block step_j's stage
                read_stage(sim, own_inflight, wg)
                del virt
            else:  # the other warpgroup's step
                yield from bar_sync(sim, 2 + (1 - wg))
                sim.handoff_log.append((wg, step_j, "consume"))
                retire(sim, wg)  # wgmma_wait<0> before the rescale
                if step_j >= 1:
                    release(sim, step_j - 1)
                if step_j < n:
                    yield from wait_full(sim, step_j)
                read_stage(sim, step_j, wg)  # P V(step_j)
            yield "step"
        j += 2
        if not j < n:
            break


def run(n: int, stages: int, seed: int) -> Sim:
    sim = Sim(n, stages)
    actors = {"producer": producer(sim), "wg0": consumer(sim, 0), "wg1": consumer(sim, 1)}
    rng = random.Random(seed)
    stuck = 0
    while actors:
        name = rng.choice(sorted(actors))
        try:
            tag = next(actors[name])
        except StopIteration:
            del actors[name]
            stuck = 0
            continue
        stuck = stuck + 1 if tag in ("wait empty", "wait full", "sync") else 0
        if stuck > 10000:
            raise Deadlock(f"n={n} stages={stages}: every actor waits ({sorted(actors)})")
    return sim


def test_two_stages_deadlock():
    """Why the kernel static_asserts kStages >= 3: an own step j waits for block j + 2, whose stage (with 2 stages,
    block j's) is released only by the steps of block j + 1, which come after it."""
    with pytest.raises(Deadlock):
        run(3, 2, 0)
    from glm5_fastpath.jit import csrc_dir
    assert "static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024" in (
        csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("n", list(range(1, 13)))
def test_protocol_completes_and_reads_the_right_blocks(n, stages):
    for seed in range(20):
        sim = run(n, stages, seed)
        padded = n + (n % 2)
        # every block's softmax step published once by its owner and consumed once by the other warpgroup
        pubs = sorted(j for wg, j, what in sim.handoff_log if what == "publish")
        cons = sorted(j for wg, j, what in sim.handoff_log if what == "consume")
        assert pubs == list(range(padded)) and cons == list(range(padded))
        assert all(wg == j % 2 for wg, j, what in sim.handoff_log if what == "publish")


def test_kernel_source_matches_the_model():
    """The kernel's barrier counts and parities are the ones the model runs."""
    from glm5_fastpath.jit import csrc_dir
    text = (csrc_dir() / "attn_core" / "sparse_mla_decode.cuh").read_text()
    body = text[text.index("struct SparseMlaSplitPingPongTileT"):text.index("using SparseMlaSplitPingPongTile")]
    for expr in ("sm90::mbar_init(full_bar(sbase, st), 32);",
                 "sm90::mbar_init(empty_bar(sbase, st), kConsumerThreads);",
                 "sm90::mbar_wait(empty_bar(c.sbase, st), ((j / kStages) & 1) ^ 1);",
                 "sm90::mbar_wait<true>(full_bar(c.sbase, st), (j / kStages) & 1);",
                 "bar_arrive<kBarHandoff + kWg>();", "bar_sync<kBarHandoff + (1 - kWg)>();",
                 "if (j >= 1) sm90::mbar_arrive(empty_bar(c.sbase, stage_of(j - 1, n)));",
                 "static GLM5_DEVICE int stage_of(int j, int n) { return (j < n ? j : n - 1) % kStages; }",
                 "own_step<0>(cs, c, p, j, wtid, tq);", "other_step<0>(cs, c, j + 1, wtid);",
                 "other_step<1>(cs, c, j, wtid);", "own_step<1>(cs, c, p, j + 1, wtid, tq);"):
        assert expr in body, expr
