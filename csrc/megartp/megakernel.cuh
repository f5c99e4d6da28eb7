// MegaRTP megakernel, version 1: one persistent CTA per queue of the host plan's instruction tensor
// [num_queues, max_queue_len, 32] (glm5_fastpath/attn_pre/megartp/plan.py), interpreting it.
// Roles, slots, handshakes and failure handling: runtime.cuh. Families: families.cuh.
//
// Per instruction i of queue q (the CTA's blockIdx.x; dynamic dispatch: the CTA's i-th claim from the one list):
//   controller  publishes i into slot i & 1 once instruction i - 2 released it (fetch: a 4-deep
//               register prefetch of the queue row, so the global load latency overlaps execution);
//               then, if instruction i - 1 has CTA-wide barriers, joins them.
//   workers     wait for the slot; validate; family prologue; global waits (bounded); tile;
//               barrier; thread 0: fence.acq_rel.gpu + red.release.gpu.add per signal, trace,
//               release the slot.
// Epoch: MegaParams.epoch >= 1 is the step number (waits target epoch x threshold); 0 means "the
// last completed epoch + 1" read from state[0] (CUDA-graph replays of one captured launch). Every CTA
// stores the epoch it ran into state[0] at exit either way (the same value), so both modes interleave.
#pragma once

#include "families.cuh"

namespace glm5 {
namespace megartp {

// Header checks every instruction passes before its family runs (uniform across the workers).
template <bool kTrace>
GLM5_DEVICE int32_t check_header(const Ctx<kTrace>& c) {
    const isa::Instruction& ins = c.ins;
    const int nw = ins.w[isa::kWaitCount], ns = ins.w[isa::kSignalCount];
    if (nw < 0 || nw > isa::kMaxWaits) return 1;
    if (ns < 0 || ns > isa::kMaxSignals) return 2;
    for (int k = 0; k < ns; ++k) {
        const int ev = ins.signal_event(k);
        if (ev < 0 || ev >= c.p.num_counters || ins.signal_increment(k) < 1) return 3;
    }
    if (ins.w[isa::kOpcode] != static_cast<int>(isa::Opcode::NOOP)) {
        const int row = ins.w[isa::kOperandRow];
        if (row < 0 || row >= c.p.num_ops) return 4;
    }
    return 0;
}

// Execute one instruction (workers). false: the CTA leaves (uniform).
template <class D, bool kTrace>
GLM5_DEVICE bool dispatch(const Ctx<kTrace>& c, uint8_t* smem) {
    const int32_t bad = check_header(c);
    if (bad) return c.fail(kErrBadInstruction, bad);
    switch (static_cast<isa::Opcode>(c.ins.w[isa::kOpcode])) {
        case isa::Opcode::NOOP: return c.wait_inputs();
        case isa::Opcode::A0: return A0Family<D>::run(c, smem);
        case isa::Opcode::B0: return B0Family<D>::run(c, smem);
        case isa::Opcode::C0: return C0Family<D>::run(c, smem);
        case isa::Opcode::B1: return B1Family<D>::run(c, smem);
        case isa::Opcode::D1: return D1Family<D>::run(c, smem);
        case isa::Opcode::D0: return D0Family<D>::run(c, smem);
        case isa::Opcode::D2: return D2Family<D>::run(c, smem);
        case isa::Opcode::E1: return E1Family<D>::run(c, smem);
        case isa::Opcode::E2: return E2Family<D>::run(c, smem);
        default: return c.fail(kErrUnsupportedOpcode, c.ins.w[isa::kOpcode]);
    }
}

// The workers' bounded wait for slot s to carry use count seq (instruction i of this CTA). false: the CTA
// leaves (the budget ran out, recorded by worker 0, or another thread of the CTA / grid failed).
GLM5_DEVICE bool wait_slot(const MegaParams& p, CtaShared& sh, int s, uint32_t seq, int i, uint32_t epoch, int tid) {
    const long long t0 = clock64();
    for (uint32_t n = 1; sync::ld_acquire_cta(&sh.full[s]) < seq; ++n) {
        if ((n & 255) != 0) continue;
        if (*reinterpret_cast<volatile const uint32_t*>(&sh.abort)) return false;
        if (tid == 0) {
            const long long dt = clock64() - t0;
            if (dt > p.wait_budget_cycles || grid_aborted(p)) {
                if (dt > p.wait_budget_cycles)
                    record_error(p, kErrSlotTimeout, i, nullptr, epoch, -1, 0, seq, sync::ld_acquire_cta(&sh.full[s]),
                                 /*role: slot wait*/ 2, s, dt);
                sync::st_release_cta(&sh.abort, 1u);
                return false;
            }
        }
    }
    return true;
}

template <class D, bool kTrace>
GLM5_DEVICE void worker_role(const MegaParams& p, CtaShared& sh, uint8_t* smem, uint32_t epoch, int tid) {
    const bool dynamic = dynamic_dispatch(p);  // (a kernel parameter: no register across the loop)
    for (int i = 0; dynamic || i < p.max_queue_len; ++i) {
        const int s = i & 1;
        const uint32_t seq = static_cast<uint32_t>(i >> 1) + 1u;
        // The controller publishes every slot promptly (it never waits on a global event), so this wait is
        // short. It is bounded anyway: a controller stuck elsewhere (a protocol bug) becomes an error record
        // (kErrSlotTimeout; worker 0 checks the clock, every worker leaves on the CTA's abort flag) instead of
        // a kernel that never ends (session 23 c5: one unexplained hang without a record).
        if (sync::ld_acquire_cta(&sh.full[s]) < seq && !wait_slot(p, sh, s, seq, i, epoch, tid)) return;
        if (dynamic && *reinterpret_cast<volatile const int32_t*>(&sh.index[s]) < 0) break;  // the list is used up
        const Ctx<kTrace> c{p, sh, sh.slot[s], epoch, tid, s, seq};
        if constexpr (kTrace) {
            if (tid == 0)
                for (int k = 0; k < kTraceMarks; ++k) c.trace(kTraceMark0 + k, 0ull);  // a previous step's marks
        }
        if (!dispatch<D>(c, smem)) return;
        worker_sync<kBarWorkers>();  // outputs written by every worker; the slot and smem are no longer read
        if (tid == 0) {
            const int ns = c.ins.w[isa::kSignalCount];
            if (ns > 0) {
                sync::fence_acq_rel_gpu();
                for (int k = 0; k < ns; ++k)
                    sync::red_release_gpu_add(p.counters + c.ins.signal_event(k),
                                              static_cast<uint32_t>(c.ins.signal_increment(k)));
            }
            if constexpr (kTrace) {
                c.trace(2, sync::globaltimer_ns());
                c.trace(3, (static_cast<unsigned long long>(sync::smid()) << 32) |
                               (static_cast<unsigned long long>(c.ins.w[isa::kOpcode] & 0xffffff) << 8) | 1ull);
            }
            sync::st_release_cta(&sh.done[s], seq);
        }
    }
    // Every CTA publishes the epoch it ran (one value; CUDA-graph replays read it at start, after this launch
    // completed) and counts its exit. Neither waits for a reply, so the CTA leaves at once: picking the last CTA
    // by an atomic's old value cost every CTA a round trip at exit (the empty plan's 3.05 us, session 19).
    if (tid == 0) {
        sync::st_relaxed_gpu(p.state, epoch);
        sync::red_relaxed_gpu_add(p.state + 1, 1u);
    }
}

// The controller warp (lane = 0..31; lane l carries instruction word l).
template <bool kTrace>
struct Controller {
    const MegaParams& p;
    CtaShared& sh;
    const int32_t* row;  // this queue's instructions
    int lane;

    GLM5_DEVICE bool aborted() const { return *reinterpret_cast<volatile const uint32_t*>(&sh.abort) != 0; }

    // ---- dynamic dispatch: one topologically ordered list; each CTA claims its next instruction ----------
    // The claim counter only grows: every step takes exactly max_queue_len + gridDim.x claims (one per
    // instruction, then one "used up" per CTA), so claim value mod that period is the list index in every
    // epoch, with no reset and no epoch needed here (host: max_epoch keeps the counter below 2^32).
    // Deadlock-free: a CTA runs its claims in list order, so an instruction waits only for instructions
    // earlier in the list, each already claimed by a running CTA that waits only for earlier ones in turn.
    //
    // When: the CTA claims instruction i + 1 `delay` (the host's estimate of i's run time minus the claim
    // latency, params.claim_delay_ns) after i has its inputs, or once i is done, whichever comes first. A CTA
    // blocked on a producer, or busy with a long tile, claims nothing: the list goes to the CTAs that can run
    // it next (static queues' head-of-line blocking), while the claim and fetch latency (~1-2 us) overlaps the
    // end of i. During the CTA-wide barriers of a GEMM instruction the controller is inside bar.sync, so there
    // the claim advances one split phase per barrier (atomic issued, index and loads issued, published): no
    // phase waits on memory while the workers wait for the controller at a barrier.
    struct Claim {
        int phase = 0;     // 0 not started, 1 atomic issued, 2 loads issued, 3 published
        uint32_t v = 0u;   // the atomic's old value (lane 0)
        int idx = -1;      // list index, -1: used up
        int32_t word = 0;  // this lane's instruction word
        int32_t delay = 0; // the claimed instruction's claim delay (lane 0)
    };

    // One phase of claiming instruction i (this CTA's i-th): see Claim.
    GLM5_DEVICE void advance(Claim& c, int i) const {
        if (c.phase == 0) {
            if (lane == 0) c.v = sync::atom_add_relaxed_gpu(p.counters + p.claim_counter, 1u);
        } else if (c.phase == 1) {
            const uint32_t v = __shfl_sync(0xffffffffu, c.v, 0);
            const uint32_t at = v % (static_cast<uint32_t>(p.max_queue_len) + gridDim.x);
            c.idx = at < static_cast<uint32_t>(p.max_queue_len) ? static_cast<int>(at) : -1;
            if (c.idx >= 0) {
                c.word = sync::ld_nc_s32(p.instructions + static_cast<int64_t>(c.idx) * isa::kInstrWords + lane);
                if (lane == 0 && p.claim_delay_ns != nullptr) c.delay = sync::ld_nc_s32(p.claim_delay_ns + c.idx);
            }
        } else if (c.phase == 2) {
            // Slot i & 1 is free: instruction i - 2 is done (instruction i - 1 has its inputs or is done).
            const int s = i & 1;
            sh.slot[s].w[lane] = c.word;
            __syncwarp();
            if (lane == 0) {
                sh.index[s] = c.idx;
                sync::st_release_cta(&sh.full[s], static_cast<uint32_t>(i >> 1) + 1u);
                if constexpr (kTrace) {
                    if (c.idx >= 0) p.trace[static_cast<int64_t>(c.idx) * kTraceWords] = sync::globaltimer_ns();
                }
            }
        }
        ++c.phase;
    }

    GLM5_DEVICE uint64_t now() const { return __shfl_sync(0xffffffffu, sync::globaltimer_ns(), 0); }  // warp-uniform

    // Instruction i is published; run its controller part (barrier joins) and claim + publish instruction i + 1.
    // delay_ns: i's claim delay in, i + 1's out. -> the claimed index (-1: used up, the stop is published),
    // -2: the CTA aborts.
    GLM5_DEVICE int step_dynamic(int i, int32_t& delay_ns) const {
        const int s = i & 1;
        const uint32_t seq = static_cast<uint32_t>(i >> 1) + 1u;
        // i has its inputs (the workers publish ready after its global waits), or is done
        while (sync::ld_acquire_cta(&sh.ready) < static_cast<uint32_t>(i + 1) && sync::ld_acquire_cta(&sh.done[s]) < seq) {
            if (aborted()) return -2;
        }
        const uint64_t claim_at = now() + static_cast<uint64_t>(max(delay_ns, 0));
        Claim c;
        const int n = cta_barrier_joins(sh.slot[s], p);  // ready was published after go (same thread, release)
        for (int k = 0; k < n; ++k) {
            sync::bar_sync_cta();
            if (c.phase > 0 || now() >= claim_at) {
                if (c.phase < 3) advance(c, i + 1);
            }
        }
        if (c.phase == 0) {  // no barriers (or the delay outlasted them): wait for the delay or the end of i
            while (sync::ld_acquire_cta(&sh.done[s]) < seq) {
                const uint64_t t = now();
                if (t >= claim_at) break;
                if (claim_at - t > 1000u) __nanosleep(256);  // leave the issue slots to the workers
                if (aborted()) return -2;
            }
        }
        while (c.phase < 3) advance(c, i + 1);
        delay_ns = __shfl_sync(0xffffffffu, c.delay, 0);
        return c.idx;
    }

    GLM5_DEVICE void run_dynamic() const {
        Claim c0;
        while (c0.phase < 3) advance(c0, 0);
        int32_t delay_ns = __shfl_sync(0xffffffffu, c0.delay, 0);
        for (int i = 0, idx = c0.idx; idx >= 0; ++i) {
            idx = step_dynamic(i, delay_ns);
            if (idx == -2) return;
        }
    }

    GLM5_DEVICE int32_t fetch(int i) const { return i < p.max_queue_len ? sync::ld_nc_s32(row + i * isa::kInstrWords + lane) : 0; }

    // Instruction i into slot i & 1 once instruction i - 2 has released it.
    GLM5_DEVICE bool publish(int i, int32_t word) const {
        if (i >= p.max_queue_len) return true;
        const int s = i & 1;
        const uint32_t use = static_cast<uint32_t>(i >> 1);
        while (sync::ld_acquire_cta(&sh.done[s]) < use) {
            if (aborted()) return false;
        }
        sh.slot[s].w[lane] = word;
        __syncwarp();
        if (lane == 0) {
            sync::st_release_cta(&sh.full[s], use + 1u);
            if constexpr (kTrace) {
                p.trace[(static_cast<int64_t>(blockIdx.x) * p.max_queue_len + i) * kTraceWords] = sync::globaltimer_ns();
            }
        }
        return true;
    }

    // Take part in instruction i's CTA-wide barriers once its inputs are ready (static queues; step_dynamic has
    // its own barrier loop, which advances the next claim between barriers).
    GLM5_DEVICE bool join(int i) const {
        if (i >= p.max_queue_len) return true;
        const int s = i & 1;
        const int n = cta_barrier_joins(sh.slot[s], p);
        if (n <= 0) return true;
        const uint32_t seq = static_cast<uint32_t>(i >> 1) + 1u;
        while (sync::ld_acquire_cta(&sh.go[s]) < seq) {
            if (aborted()) return false;
        }
        for (int k = 0; k < n; ++k) sync::bar_sync_cta();
        return true;
    }

    // publish(i + 1) before join(i): the next instruction is visible while this one runs. Unrolled
    // by 4 so every prefetched word stays in its own register (no moves that would wait on a load).
    GLM5_DEVICE void run() const {
        const int L = p.max_queue_len;
        int32_t r0 = fetch(0), r1 = fetch(1), r2 = fetch(2), r3 = fetch(3);
        if (!publish(0, r0)) return;
        r0 = fetch(4);
        for (int b = 0; b < L; b += 4) {
            if (!publish(b + 1, r1)) return;
            r1 = fetch(b + 5);
            if (!join(b)) return;
            if (!publish(b + 2, r2)) return;
            r2 = fetch(b + 6);
            if (!join(b + 1)) return;
            if (!publish(b + 3, r3)) return;
            r3 = fetch(b + 7);
            if (!join(b + 2)) return;
            if (!publish(b + 4, r0)) return;
            r0 = fetch(b + 8);
            if (!join(b + 3)) return;
        }
    }
};

template <class D, bool kTrace>
GLM5_DEVICE void megakernel_body(const MegaParams& p) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ CtaShared sh;
    const int tid = threadIdx.x;
    if (tid < 2) {
        sh.full[tid] = 0u;
        sh.go[tid] = 0u;
        sh.done[tid] = 0u;
        sh.index[tid] = 0;
    }
    if (tid == 0) {
        sh.ready = 0u;
        sh.abort = 0u;
        sh.last = 0;
    }
    // A claim counter outside the counters: every CTA leaves before its first instruction (uniform).
    if (dynamic_dispatch(p) && p.claim_counter >= p.num_counters) {
        if (tid == 0) record_error(p, kErrBadInstruction, -1, nullptr, p.epoch, p.claim_counter, 0, 0, 0, 0, /*detail*/ 5, 0);
        return;
    }
    __syncthreads();  // the only CTA-wide barrier outside the tiles
    if (tid >= kWorkerThreads) {
        const Controller<kTrace> ctl{p, sh, p.instructions + instr_index(p, 0) * isa::kInstrWords, tid & 31};
        if (dynamic_dispatch(p)) {
            ctl.run_dynamic();
        } else {
            ctl.run();
        }
        return;
    }
    const uint32_t epoch = p.epoch != 0u ? p.epoch : sync::ld_relaxed_gpu(p.state) + 1u;
    worker_role<D, kTrace>(p, sh, smem, epoch, tid);
}

}  // namespace megartp
}  // namespace glm5
