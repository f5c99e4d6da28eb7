// MegaRTP megakernel, version 1: one persistent CTA per queue of the host plan's instruction tensor
// [num_queues, max_queue_len, 32] (glm5_fastpath/attn_pre/megartp/plan.py), interpreting it.
// Roles, slots, handshakes and failure handling: runtime.cuh. Families: families.cuh.
//
// Per instruction i of queue q (the CTA's blockIdx.x):
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

template <class D, bool kTrace>
GLM5_DEVICE void worker_role(const MegaParams& p, CtaShared& sh, uint8_t* smem, uint32_t epoch, int tid) {
    for (int i = 0; i < p.max_queue_len; ++i) {
        const int s = i & 1;
        const uint32_t seq = static_cast<uint32_t>(i >> 1) + 1u;
        // The controller publishes every slot promptly (it never waits on a global event), so this
        // wait is short; it needs no budget of its own.
        while (sync::ld_acquire_cta(&sh.full[s]) < seq) {
        }
        const Ctx<kTrace> c{p, sh, sh.slot[s], epoch, tid, i, s, seq};
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

    // Take part in instruction i's CTA-wide barriers once its inputs are ready.
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
    }
    if (tid == 0) {
        sh.abort = 0u;
        sh.last = 0;
    }
    __syncthreads();  // the only CTA-wide barrier outside the tiles
    if (tid >= kWorkerThreads) {
        const Controller<kTrace> ctl{p, sh, p.instructions + static_cast<int64_t>(blockIdx.x) * p.max_queue_len * isa::kInstrWords,
                                     tid & 31};
        ctl.run();
        return;
    }
    const uint32_t epoch = p.epoch != 0u ? p.epoch : sync::ld_relaxed_gpu(p.state) + 1u;
    worker_role<D, kTrace>(p, sh, smem, epoch, tid);
}

}  // namespace megartp
}  // namespace glm5
