// MegaRTP device runtime, the parts every family adapter uses: kernel parameters, the error record,
// the trace buffer, the per-CTA shared control block and the per-instruction context (Ctx) with the
// event wait (bounded), failure reporting and operand access.
//
// Roles of one CTA (kThreads = 288, one CTA per SM, persistent):
//   warps 0-7  workers (tid 0..255): execute the instruction in the current slot: validate, family
//              prologue (weights), wait for the global events (warp 0 polls, bounded by a clock64
//              budget), the tile, a barrier, then the signals (fence + red.release) and the slot
//              release. Family tile functions see exactly the 256 threads they were written for.
//   warp 8     controller: fetches its queue row (a 4-deep register prefetch of 128-byte
//              instructions), publishes instruction i+1 into the free slot while the workers run
//              instruction i, and takes part in the CTA-wide barriers (bar.sync 0) of tile functions
//              that use __syncthreads() (cta_barrier_joins()).
//
// Slots: two 128-byte instruction slots in shared memory. Slot s = i & 1 carries instruction i; its
// use counter u = i >> 1. full[s] = u + 1 publishes it (controller, st.release.cta), go[s] = u + 1
// says its global waits are satisfied (workers; only for instructions with CTA-wide barriers),
// done[s] = u + 1 releases it (workers, after the signals). All handshake words only grow.
//
// Failure: a wait that exceeds the budget (an event wait, or the workers' wait for the controller to
// publish the next slot), or an instruction the kernel cannot execute, writes one
// error record (the first failing thread in the grid claims it) and the CTA leaves early: every
// worker returns at the same point (after a worker barrier, reading the shared abort flag), and the
// controller returns from whatever handshake it is in. Other CTAs notice the record (its kind word
// is nonzero) inside their own waits and leave too. No trap: the CUDA context survives and the host
// raises with the record's contents (glm5_fastpath/attn_pre/megartp/device.py, decode_error).
#pragma once

#include <stdint.h>

#include "../common/arch.cuh"
#include "../common/pdl.cuh"
#include "isa_generated.h"
#include "sync.cuh"

namespace glm5 {
namespace megartp {

namespace isa = ::glm5_fastpath::megartp;

constexpr int kWorkerThreads = 256;
constexpr int kWorkerWarps = kWorkerThreads / 32;
constexpr int kThreads = kWorkerThreads + 32;  // + the controller warp
constexpr int kControllerWarp = kWorkerWarps;

// Named barriers. 0 is the whole CTA (tile functions' __syncthreads, joined by the controller).
enum : int {
    kBarCta = 0,
    kBarSkinnyConsumer = 1,  // attn_pre::skinny::consumer_sync (fixed id 1, 256 threads)
    kBarWorkers = 2,         // this runtime: the 256 workers
    kBarD2 = 3,              // D2AbsorbTile's K-block barrier
    kBarB0Rows = 4,          // B0RowNormsTile's row-sum barrier
    kBarE1 = 5,              // E1IndexerLogitsTile's page barrier
    kBarA0 = 6,              // A0AddRmsNormQuantRowTile's partial-sum barrier
    kBarE2 = 7,              // E2TopkTile's row barrier
};

// Kernel parameters. ABI of glm5_fastpath/attn_pre/megartp/device.py (_Params): 8-byte fields
// first, then 4-byte fields; the size is asserted on both sides.
struct MegaParams {
    const int32_t* instructions;   // [num_queues, max_queue_len, 32] int32
    uint32_t* counters;            // [num_counters]: events, then split-K reduce counters (zero once, never reset)
    const uint64_t* operands;      // [num_ops, 16] device pointers (OperandPtrTable)
    int32_t* error;                // [kErrorWords] error record, zero at rest
    unsigned long long* trace;     // [num_queues, max_queue_len, kTraceWords] (trace builds only)
    uint32_t* state;               // [kStateWords]: last completed epoch, CTA exit counter
    const double* rope_inv_freq;   // [rope / 2] float64 (D2's k_pe RoPE, as ops.d2_absorb)
    const float* rope_table;       // [rope_table_len, rope / 2, 2] fp32 (cos, sin) (GEMM epilogues)
    const int32_t* claim_delay_ns; // dynamic dispatch: per list entry, how long after its inputs are ready its CTA
                                   // claims the next entry (the host's run-time estimate minus the claim latency);
                                   // nullptr: at once
    int64_t rope_table_len;
    int64_t kv_num_slots;          // rows of the MLA KV cache (D2 store skips slots outside)
    int64_t wait_budget_cycles;    // bounded-wait guard (clock64 cycles per wait)
    double rope_theta;             // RoPE fallback for positions outside the table
    uint32_t epoch;                // step number >= 1; 0 = take state[0] + 1 (CUDA-graph replays)
    int32_t num_queues;            // = gridDim.x
    int32_t max_queue_len;
    int32_t num_ops;
    int32_t num_counters;
    int32_t num_tokens;            // M of the plan (split-K workspace rows)
    int32_t hidden;                // hidden size (K of B0 / B1)
    int32_t num_heads;             // MLA heads (q_nope / q_lat token stride)
    int32_t idx_heads;             // indexer heads
    int32_t idx_dim;               // indexer head dim
    float rms_eps;                 // B0 q_a / kv_a RMSNorm
    float k_norm_eps;              // B1 LayerNorm
    float head_w_scale;            // D1: fp32(index_n_heads^-0.5 * index_head_dim^-0.5)
    int32_t max_ctx;               // E1: logits row stride (columns per token row)
    int64_t idx_cache_pages;       // E1: pages of the index-K cache (ids outside [0, pages) are never read)
    int32_t bt_width;              // E1: block-table row width (pages per row; rows are contiguous)
    int32_t q_lora;                // q_lora_rank (K of D0; the controller's barrier count of a D0 tile)
    // Dynamic dispatch (plan scheduler "dynamic"): >= 0 names the claim counter, and the instruction tensor is
    // one topologically ordered list [1, max_queue_len, 32] that the CTAs take from in order (megakernel.cuh
    // Controller::run_dynamic). -1: static queues, one per CTA.
    int32_t claim_counter;
    int32_t reserved;
};
static_assert(sizeof(MegaParams) == 184, "MegaParams ABI (device.py _Params) changed");

GLM5_DEVICE bool dynamic_dispatch(const MegaParams& p) { return p.claim_counter >= 0; }

// Where instruction `pos` of this CTA lives in [num_queues, max_queue_len, ...] tensors (instructions, trace):
// its queue row (static), or the one list (dynamic: pos is the list index the CTA claimed).
GLM5_DEVICE int64_t instr_index(const MegaParams& p, int pos) {
    return dynamic_dispatch(p) ? static_cast<int64_t>(pos) : static_cast<int64_t>(blockIdx.x) * p.max_queue_len + pos;
}

constexpr int kStateWords = 4;  // [0] last completed epoch (every CTA stores it at exit), [1] CTAs exited (monotone), [2..3] unused

// ---- error record -------------------------------------------------------------------------------
constexpr int kErrorWords = 16;
enum ErrorKind : int32_t {
    kErrNone = 0,
    kErrWaitTimeout = 1,      // an event wait exceeded wait_budget_cycles
    kErrUnsupportedOpcode = 2,
    kErrBadInstruction = 3,   // a field out of range (counts, operand row, event id, epoch)
    kErrUnsupportedTile = 4,  // the family cannot run this payload (detail names the check)
    kErrSmemTooSmall = 5,     // the launch gave less dynamic shared memory than the family needs
    kErrSlotTimeout = 6,      // the workers waited past the budget for the controller to publish the next slot
};
enum ErrorField : int {
    kErrKind = 0, kErrQueue = 1, kErrPos = 2, kErrOpcode = 3, kErrEvent = 4, kErrThreshold = 5,
    kErrTarget = 6, kErrObserved = 7, kErrEpoch = 8, kErrTile = 9, kErrOperandRow = 10, kErrRole = 11,
    kErrSmid = 12, kErrDetail = 13, kErrCycles = 14, kErrClaim = 15,
};

// ---- trace ------------------------------------------------------------------------------------------
// Per instruction: [0] fetched (slot published, controller), [1] inputs ready (waits satisfied),
// [2] done (signals issued), [3] smid << 32 | opcode << 8 | 1 (valid), [4..11] the family's phase marks
// (Ctx::mark; 0 = not reached: cleared when the instruction starts). %globaltimer nanoseconds.
// B1 / D1: mark 0 = partial stored and counted; in the reduce group's last arriver, mark 1 = epilogue
// inputs staged, mark 2 = splits summed (first token block), marks 3-6 inside the first block's
// epilogue (families.cuh EpilogueMarks), mark 7 = every block's epilogue done. B0 partials: 0 =
// counted on its weight tile, 1 = the tile summed (trace.py PHASES).
constexpr int kTraceWords = 12;
constexpr int kTraceMark0 = 4;
constexpr int kTraceMarks = 8;

constexpr int kFamilyParamBytes = 256;

struct alignas(16) CtaShared {
    isa::Instruction slot[2];
    uint32_t full[2];
    uint32_t go[2];
    uint32_t done[2];
    int32_t index[2];   // dynamic dispatch: the list index of the slot's instruction, -1 = no more (stop)
    uint32_t ready;     // dynamic dispatch: i + 1 once the CTA's instruction i has its inputs (the next claim's cue)
    uint32_t abort;     // set once by a worker (thread 0) at a point every worker passes together
    int32_t last;       // split-K: this CTA is the last arriver of the reduce group
    float scratch[2 * kWorkerWarps];  // B0RowNormsTile row-sum partials (B0 finalisers)
    // A family's parameter block (e.g. the GEMM tile's SkinnyParams), written by worker 0 before a
    // worker barrier: read from shared memory on demand, it costs no registers across the tile.
    alignas(16) unsigned char family_params[kFamilyParamBytes];
};

// Record the first failure of the grid (claim word CAS), then publish its kind (release): other CTAs
// poll the kind word in their waits.
GLM5_DEVICE void record_error(const MegaParams& p, int32_t kind, int pos, const isa::Instruction* ins, uint32_t epoch,
                              int32_t event, int32_t threshold, uint32_t target, uint32_t observed, int32_t role,
                              int32_t detail, int64_t cycles) {
    if (atomicCAS(p.error + kErrClaim, 0, 1) != 0) return;
    int32_t* e = p.error;
    e[kErrQueue] = dynamic_dispatch(p) ? 0 : static_cast<int32_t>(blockIdx.x);  // (queue, pos) index the instruction tensor
    e[kErrPos] = pos;
    e[kErrOpcode] = ins ? ins->w[isa::kOpcode] : -1;
    e[kErrEvent] = event;
    e[kErrThreshold] = threshold;
    e[kErrTarget] = static_cast<int32_t>(target);
    e[kErrObserved] = static_cast<int32_t>(observed);
    e[kErrEpoch] = static_cast<int32_t>(epoch);
    e[kErrTile] = ins ? ins->w[isa::kTileIndex] : -1;
    e[kErrOperandRow] = ins ? ins->w[isa::kOperandRow] : -1;
    e[kErrRole] = role;
    e[kErrSmid] = static_cast<int32_t>(sync::smid());
    e[kErrDetail] = detail;
    e[kErrCycles] = static_cast<int32_t>(cycles > 0x7fffffff ? 0x7fffffff : cycles);
    __threadfence();
    sync::st_release_gpu(e + kErrKind, kind);
}

GLM5_DEVICE bool grid_aborted(const MegaParams& p) { return sync::ld_relaxed_gpu(p.error + kErrKind) != 0; }

template <int kBarrierId>
GLM5_DEVICE void worker_sync() {
    ptx::named_barrier_sync<kBarrierId, kWorkerThreads>();
}

// How many CTA-wide barriers (bar.sync 0) the workers execute for this instruction after its
// global waits: defined by the families (families.cuh) so the controller joins exactly as many.
GLM5_DEVICE int cta_barrier_joins(const isa::Instruction& ins, const MegaParams& p);

// One instruction as the workers see it.
template <bool kTrace>
struct Ctx {
    const MegaParams& p;
    CtaShared& sh;
    const isa::Instruction& ins;
    uint32_t epoch;
    int tid;   // worker thread 0..255
    int slot;
    uint32_t seq;

    // Index of the instruction in its queue (dynamic dispatch: in the list). Derived, not stored: the slot's
    // use count gives the CTA's instruction count i = 2 (seq - 1) + slot; the list index is in shared memory
    // (no register held across the tile for the error and trace paths).
    GLM5_DEVICE int pos() const {
        return dynamic_dispatch(p) ? *reinterpret_cast<volatile const int32_t*>(&sh.index[slot])
                                   : 2 * static_cast<int>(seq - 1u) + slot;
    }

    // Operand slot of the op's OperandPtrTable row (validated before the family runs).
    template <class T>
    GLM5_DEVICE T* operand(int s) const {
        const uint64_t* row = p.operands + static_cast<int64_t>(ins.w[isa::kOperandRow]) * isa::kOperandSlots;
        return reinterpret_cast<T*>(sync::ld_nc_u64(row + s));
    }

    // Uniform failure before any CTA-wide barrier of the instruction: every worker calls it with the
    // same arguments and returns false; thread 0 records and raises the CTA abort flag.
    GLM5_DEVICE bool fail(int32_t kind, int32_t detail = 0, int32_t event = -1) const {
        if (tid == 0) {
            record_error(p, kind, pos(), &ins, epoch, event, 0, 0, 0, /*role*/ 0, detail, 0);
            sync::st_release_cta(&sh.abort, 1u);
        }
        return false;
    }

    GLM5_DEVICE void trace(int field, unsigned long long v) const {
        if constexpr (kTrace) {
            p.trace[instr_index(p, pos()) * kTraceWords + field] = v;
        }
    }

    // Where mark(k) stores (trace builds, worker thread 0; nullptr otherwise): for hooks in shared tile code.
    GLM5_DEVICE unsigned long long* mark_words() const {
        if constexpr (kTrace) {
            if (tid == 0) return p.trace + instr_index(p, pos()) * kTraceWords + kTraceMark0;
        }
        return nullptr;
    }

    // Phase mark k of this instruction (trace builds; worker thread 0 stamps it).
    GLM5_DEVICE void mark(int k) const {
        if constexpr (kTrace) {
            if (tid == 0) trace(kTraceMark0 + k, sync::globaltimer_ns());
        }
    }

    // Spin (one lane per wait) until counter[event] >= epoch * threshold, bounded by the budget.
    GLM5_DEVICE bool spin_one(int k) const {
        const int32_t ev = ins.wait_event(k);
        const int32_t thr = ins.wait_threshold(k);
        if (ev < 0 || ev >= p.num_counters || thr < 1) {
            record_error(p, kErrBadInstruction, pos(), &ins, epoch, ev, thr, 0, 0, 0, /*detail: wait k*/ k, 0);
            return false;
        }
        const uint32_t target = epoch * static_cast<uint32_t>(thr);
        const uint32_t* ctr = p.counters + ev;
        uint32_t v = sync::ld_relaxed_gpu(ctr);
        if (v >= target) return true;
        const long long t0 = clock64();
        for (uint32_t n = 1;; ++n) {
            if (n > 64) __nanosleep(n > 1024 ? 256 : 32);
            v = sync::ld_relaxed_gpu(ctr);
            if (v >= target) return true;
            if ((n & 15) == 0) {
                if (grid_aborted(p)) return false;
                const long long dt = clock64() - t0;
                if (dt > p.wait_budget_cycles) {
                    record_error(p, kErrWaitTimeout, pos(), &ins, epoch, ev, thr, target, v, /*role*/ 0, k, dt);
                    return false;
                }
            }
        }
    }

    // The instruction's global waits, then (for instructions with CTA-wide barriers) tell the
    // controller to join. Every worker calls it once, after the family's weight prologue; false:
    // the CTA is leaving (every worker returns false at this point).
    GLM5_DEVICE bool wait_inputs() const {
        const int nw = ins.w[isa::kWaitCount];
        if (nw > 0) {
            if (tid < 32) {
                bool ok = tid < nw ? spin_one(tid) : true;
                ok = __all_sync(0xffffffffu, ok);
                if (ok) {
                    sync::fence_acq_rel_gpu();  // acquire side of the producers' release (and L1 invalidation)
                } else if (tid == 0) {
                    sync::st_release_cta(&sh.abort, 1u);
                }
            }
            worker_sync<kBarWorkers>();
            if (*reinterpret_cast<volatile const uint32_t*>(&sh.abort)) return false;
        }
        if (tid == 0) {
            trace(1, sync::globaltimer_ns());
            if (cta_barrier_joins(ins, p) > 0) sync::st_release_cta(&sh.go[slot], seq);
            if (dynamic_dispatch(p)) sync::st_release_cta(&sh.ready, 2u * (seq - 1u) + static_cast<uint32_t>(slot) + 1u);
        }
        return true;
    }

    // Split-K: count this partial in the reduce counter; true (uniformly) in the last arriver.
    // Called by all workers after their partial stores.
    GLM5_DEVICE bool arrive_reduce() const {
        const bool last = arrive_counter(ins.w[isa::kReduceCounter], 1u, static_cast<uint32_t>(ins.w[isa::kReduceTarget]));
        mark(0);
        return last;
    }

    // Add `add` to counter[c] once this CTA's stores are fenced; true (uniformly) in the CTA whose add
    // completes epoch x target. Called by all workers.
    GLM5_DEVICE bool arrive_counter(int32_t c, uint32_t add, uint32_t target) const {
        __threadfence();
        worker_sync<kBarWorkers>();
        if (tid == 0) {
            const uint32_t old = sync::atom_add_acq_rel_gpu(p.counters + c, add);
            sh.last = (old + add == epoch * target) ? 1 : 0;
        }
        worker_sync<kBarWorkers>();
        const bool last = sh.last != 0;
        if (last) sync::fence_acq_rel_gpu();
        return last;
    }
};

}  // namespace megartp
}  // namespace glm5
