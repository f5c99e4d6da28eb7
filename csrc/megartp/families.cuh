// MegaRTP op families: thin adapters from one instruction (payload + operand row) to the existing
// tile functions of csrc/attn_pre/. Every adapter follows the same order, which the runtime relies on:
//   1. validate the payload (uniform; a failure leaves before any CTA-wide barrier),
//   2. prologue that reads no producer output (weights -> shared memory, cp.async),
//   3. ctx.wait_inputs() (the global events; the controller joins CTA-wide barriers after this),
//   4. the tile, writing its outputs; split-K: partial -> workspace, reduce counter, and in the
//      last arriver of the group the reduction (k-split order, deterministic) + the epilogue.
// The runtime then fences and signals.
//
// Shared memory (v1): every instruction gets the whole dynamic shared memory of the CTA (the launch
// gives the maximum over the families); no page map, so instruction i+1's weights are not
// prefetched while instruction i runs. The paged allocator is the next step.
//
// Families of v1 (device.py SUPPORTED_FAMILIES lists the same):
//   D2  D2AbsorbTile (+ D2KvStoreWarp: the head-0 tile of the last 128 latent columns stores the
//       whole KV rows of its tokens, c_kv and roped k_pe, exactly as the standalone KV warp does;
//       the other head-0 tiles store nothing, so the cache bytes equal the standalone kernel's).
//   B0  split-K partial on SkinnyGemmTile's mainloop (each weight tile summed by its last split) and row
//       finalisers running B0 split mode's row tile (B0Family).
//   B1  split-K partial; group epilogue SkinnyFinish<kEpiIdxK> (LayerNorm, RoPE, quant, cache store).
//   D1  split-K partial; per-head group epilogue SkinnyFinish<kEpiIdxQ> (needs index_head_dim 128:
//       one head = one 128-row tile).
//   (B1 stages the first token block's epilogue inputs in every partial, during its event wait: gemm_partial's
//   Stage; D1 and later blocks in finish_group().)
// The partials run SkinnyGemmTile::mainloop, which calls __syncthreads() once per K group: the
// controller warp joins those barriers (gemm_joins(); a CPU test trips when the tile code changes).
//   E1  E1IndexerLogitsTile with the 256 workers (8 warps, one 8-token n-tile per warp per page), q held
//       packed (e4m3, converted per MMA step: the unpacked f16 q would not fit the 168-register budget):
//       one tile per token row of the instruction's Q block over its KV window [kv0, kv1) (pages
//       bulk-copied into a kE1Stages ring); block-table reads before the event wait. Per token the same
//       MMA order and head reduction as the standalone kernel (any warp count), so its logits are
//       bitwise equal.
//   A0  A0AddRmsNormQuantRowTile: one token row per pass of the 256 workers (3 vectors per thread at
//       hidden 6144); bitwise the standalone cluster kernel's row (same partial sums in the same order).
//   C0  split-K partial of the head gate in C0HeadGateTile's fragment layout (bf16 mma.sync, weights on M,
//       tokens on N; weight fragments loaded after the wait: before it they spill) over the instruction's K chunk (128 or 256
//       columns: 4 or 8 warps along K, the others take the other half of the 32-token pass); warp partials
//       summed in warp order in shared memory -> fp32 workspace; the last arriver sums the splits in k-split
//       order and rounds to bf16. Not bitwise the cluster kernel (that one accumulates a CTA's 3 chunks inside
//       the MMA); the same bf16 result up to the last-bit rounding of a different fp32 sum order.
//   D0  one 128-row q_b tile (a head's nope / rope rows) over all of K: the skinny tile + SkinnyFinish's q_b
//       epilogue, bitwise the standalone kernel with one K split. Plans whose D0 tiles are not 128-row aligned
//       (heads of 96 rows: the small preset) are refused on the host.
//   E2  E2TopkTile (kCluster = false) with the 256 workers, one row at a time.
#pragma once

#include "runtime.cuh"

#include "../attn_pre/fp8_gemm_skinny.cuh"
#include "../attn_pre/d2_absorb_kv_store.cuh"
#include "../attn_pre/b0_row_norms.cuh"
#include "../attn_pre/e1_indexer_logits.cuh"
#include "../attn_pre/a0_add_rmsnorm_quant.cuh"
#include "../attn_pre/c0_head_gate.cuh"
#include "../attn_pre/e2_topk.cuh"

namespace glm5 {
namespace megartp {

namespace sk = ::glm5::attn_pre::skinny;

// Compile-time model dims (the kernel is compiled per config: megakernel.cu defines).
template <int kHidden_, int kQ_, int kKV_, int kR_, int kNope_, int kIdxHeads_, int kIdxDim_, int kTopk_>
struct Dims {
    static constexpr int kHidden = kHidden_;  // hidden_size (A0's row)
    static constexpr int kQ = kQ_;        // q_lora_rank
    static constexpr int kKV = kKV_;      // kv_lora_rank
    static constexpr int kR = kR_;        // qk_rope_head_dim
    static constexpr int kNope = kNope_;  // qk_nope_head_dim
    static constexpr int kIdxHeads = kIdxHeads_;  // index_n_heads (E1's q tile)
    static constexpr int kIdxDim = kIdxDim_;      // index_head_dim (E1's page rows)
    static constexpr int kTopk = kTopk_;          // index_topk (E2's output row)
    static constexpr int kQkv = kQ + kKV + kR;
};

constexpr int kFinalKSplit = -1;  // families.FINAL_K_SPLIT: the instruction is a row finaliser

// Why a tile was refused (error record detail; decoded by device.py UNSUPPORTED_DETAIL).
enum TileCheck : int32_t {
    kChkRows = 1,         // 0 <= m0 < m1 <= num_tokens
    kChkRowAlign = 2,     // m0 a multiple of the token block
    kChkN = 3,            // n0 on a 128-row block, n1 - n0 <= 128, n1 <= N
    kChkK = 4,            // k0, k1 on 128-column groups inside [0, K]
    kChkSplit = 5,        // k_split inside the reduce group's splits
    kChkGroup = 6,        // the reduce group's region [g0, g1) is not what the epilogue covers
    kChkReduce = 7,       // reduce counter / target out of range
    kChkHeadDim = 8,      // D1 needs index_head_dim == 128
    kChkD2Tile = 9,       // D2: head / latent tile out of range
    kChkE1Tile = 10,      // E1: rows / KV window (kv0 on a page, live tokens <= the window, heads / dim)
    kChkA0Hidden = 11,    // A0: the launch's hidden size is not the build's (GLM5_MRTP_H)
    kChkE2Row = 12,       // E2: rows, or a logits row past what one CTA's chunks hold (max_ctx)
};

// ---- split-K GEMM partial (B0, B1, D1) ------------------------------------------------------------

// The payload of every split-K family (families.SPLIT_K_PAYLOAD): same words for B0, B1, D1.
static_assert(isa::B0::payload::m0 == isa::B1::payload::m0 && isa::B0::payload::m0 == isa::D1::payload::m0 &&
                  isa::B0::payload::g1 == isa::B1::payload::g1 && isa::B0::payload::g1 == isa::D1::payload::g1,
              "split-K families share one payload layout");

struct SplitK {
    int m0, m1, n0, n1, k0, k1, k_split, g0, g1;
    int target;  // reduce group size (partials)

    static GLM5_DEVICE SplitK of(const isa::Instruction& ins) {
        namespace pl = isa::B0::payload;
        SplitK r;
        r.m0 = ins.w[pl::m0];
        r.m1 = ins.w[pl::m1];
        r.n0 = ins.w[pl::n0];
        r.n1 = ins.w[pl::n1];
        r.k0 = ins.w[pl::k0];
        r.k1 = ins.w[pl::k1];
        r.k_split = ins.w[pl::k_split];
        r.g0 = ins.w[pl::g0];
        r.g1 = ins.w[pl::g1];
        r.target = ins.w[isa::kReduceTarget];
        return r;
    }
    GLM5_DEVICE int rows() const { return m1 - m0; }
    GLM5_DEVICE int nk() const { return (k1 - k0) / sk::kBlockK; }
    // Partials per workspace element: the group's partials / the 128-row tiles of its region.
    GLM5_DEVICE int splits() const {
        const int tiles = (g1 - g0 + sk::kBlockN - 1) / sk::kBlockN;
        return tiles > 0 && target % tiles == 0 ? target / tiles : 0;
    }
};

// Token block of the GEMM tile. v1 instantiates one: 16 tokens (decode M <= 16 in one pass; a
// larger row block runs one mainloop per 16 rows, re-reading the weights from L2). NOTES: the
// 32- and 64-token blocks exceed the 168 registers a thread can have with 9 warps per CTA (three
// warps share one SM sub-partition's 16K registers) and spill; they need setmaxnreg (a controller
// warpgroup giving registers to the workers) first.
// Every split-K partial (B0, B1, D1) runs one mainloop instantiation (the plain tile) on the carve-up of the
// epilogue with the largest finish scratch (D1's): the finish inputs B1 stages at kOffRed before its K loop
// survive it (the scale arrays come after the scratch), and the megakernel holds one copy of the mainloop
// (one instantiation per family's epilogue spilled).
constexpr int kEpiGemmLayout =
    sk::finish_scratch_bytes(16, sk::kEpiIdxQ) >= sk::finish_scratch_bytes(16, sk::kEpiIdxK) ? sk::kEpiIdxQ : sk::kEpiIdxK;

template <int kTM_, int kStages_>
struct GemmCfg {
    static constexpr int kTM = kTM_;
    static constexpr int kStages = kStages_;
    static constexpr int kNT = kTM / 8;
    using Tile = sk::SkinnyGemmTile<kTM_, kStages_, sk::kEpiPlain, sk::kDiagOff, kEpiGemmLayout>;
    using Smem = sk::SkinnySmem<kTM_, kStages_, kEpiGemmLayout>;
    template <int kEpi>
    static constexpr bool fits() {  // kEpi's finish scratch inside the layout's
        return sk::finish_scratch_bytes(kTM_, kEpi) <= sk::finish_scratch_bytes(kTM_, kEpiGemmLayout) &&
               sk::SkinnySmem<kTM_, kStages_, kEpi>::kOffRed == Smem::kOffRed;
    }
    static_assert(fits<sk::kEpiPlain>() && fits<sk::kEpiIdxK>() && fits<sk::kEpiIdxQ>(), "finish scratch layout");
    static GLM5_DEVICE int smem_bytes(int nk) { return Smem::bytes(nk); }
};
// Weight stages in flight per SM (device.py gemm_stages(): 6, the stage count of ops/fp8_gemm.py STAGES[16]; the
// GLM5_FASTPATH_MRTP_GEMM_STAGES override is for measuring more). One megakernel CTA per SM runs one GEMM tile at a
// time, where the standalone kernels co-schedule CTAs, so its bytes in flight per SM are the stages alone.
#ifndef GLM5_MRTP_GEMM_STAGES
#define GLM5_MRTP_GEMM_STAGES 6
#endif
using Gemm = GemmCfg<16, GLM5_MRTP_GEMM_STAGES>;

GLM5_DEVICE int gemm_tm(int /*rows*/) { return Gemm::kTM; }

// CTA-wide barriers of the partial: SkinnyGemmTile::mainloop executes __syncthreads() once per K
// group, and the adapter runs one mainloop per token block of the tile.
GLM5_DEVICE int gemm_joins(const SplitK& r) {
    const int rows = r.rows(), nk = r.nk();
    if (rows <= 0 || nk <= 0) return 0;
    const int tm = gemm_tm(rows);
    return (rows + tm - 1) / tm * nk;
}

GLM5_DEVICE int cta_barrier_joins(const isa::Instruction& ins, const MegaParams& p) {
    const int op = ins.w[isa::kOpcode];
    if (op == static_cast<int>(isa::Opcode::B0) || op == static_cast<int>(isa::Opcode::B1) ||
        op == static_cast<int>(isa::Opcode::D1))
        return gemm_joins(SplitK::of(ins));
    if (op == static_cast<int>(isa::Opcode::D0)) {  // all of K (q_lora_rank) per 16-token block
        const int rows = ins.w[isa::D0::payload::m1] - ins.w[isa::D0::payload::m0], nk = p.q_lora / sk::kBlockK;
        if (rows <= 0 || nk <= 0) return 0;
        return (rows + gemm_tm(rows) - 1) / gemm_tm(rows) * nk;
    }
    return 0;
}

struct GemmOperands {
    const uint8_t* w;       // [N, K] e4m3
    const float* w_scale;   // [ceil(N/128), K/128]
    const uint8_t* x;       // [M, K] e4m3
    const float* x_scale;   // [M, K/128]
    float* ws;              // [splits, M, N] fp32
    int N, K;
};

// Uniform checks of a split-K payload against the GEMM (before any barrier).
template <bool kTrace>
GLM5_DEVICE int32_t check_split_k(const Ctx<kTrace>& c, const SplitK& r, const GemmOperands& g) {
    if (!(0 <= r.m0 && r.m0 < r.m1 && r.m1 <= c.p.num_tokens)) return kChkRows;
    if (r.m0 % gemm_tm(r.rows())) return kChkRowAlign;
    if (r.n0 < 0 || r.n0 % sk::kBlockN || r.n1 <= r.n0 || r.n1 - r.n0 > sk::kBlockN || r.n1 > g.N || g.N % 2)
        return kChkN;
    if (r.k0 < 0 || r.k0 % sk::kBlockK || r.k1 % sk::kBlockK || r.k1 <= r.k0 || r.k1 > g.K) return kChkK;
    const int s = r.splits();
    if (s < 1 || r.k_split < 0 || r.k_split >= s) return kChkSplit;
    const int rc = c.ins.w[isa::kReduceCounter];
    if (rc < 0 || rc >= c.p.num_counters || r.target < 1) return kChkReduce;
    return 0;
}

// The GEMM tile's parameter block lives in shared memory (CtaShared::family_params).
static_assert(sizeof(sk::SkinnyParams) <= kFamilyParamBytes, "SkinnyParams must fit CtaShared::family_params");

template <bool kTrace>
GLM5_DEVICE sk::SkinnyParams& gemm_params(const Ctx<kTrace>& c) {
    return *reinterpret_cast<sk::SkinnyParams*>(c.sh.family_params);
}

// The finish's inputs of token block tile_m (SkinnyFinish stage_pre, barrier, stage_tables: the RoPE rows by
// cp.async, waited for at the end of the partial). Not inlined: inlined, it pushed the megakernel past its
// 168 registers (spills); as a call it costs a few instructions.
template <class G, int kEpi>
__device__ __noinline__ void stage_epilogue_inputs(const sk::SkinnyParams& sp, int tile_m, int tile_n, uint8_t* smem,
                                                   int tid) {
    using Finish = sk::SkinnyFinish<G::kTM, kEpi>;
    static_assert(sk::SkinnySmem<G::kTM, G::kStages, kEpi>::kOffRed == G::Smem::kOffRed, "scratch offset");
    const sk::Scratch sc = Finish::scratch(smem + G::Smem::kOffRed);
    sk::Coord ce;
    ce.tile_m = tile_m;
    ce.tile_n = tile_n;
    ce.split = 0;
    ce.g_begin = 0;
    ce.nk = 0;
    ce.gmax = 0;
    Finish::stage_pre(sp, ce, sc, tid);
    sk::consumer_sync();
    Finish::stage_tables(sp, ce, sc, tid);
}

// No epilogue inputs to stage (B0: its reduce reads only the workspace).
struct NoEpilogueStaging {
    static constexpr int kEpi = sk::kEpiPlain;
    static constexpr bool kStageEarly = false;
    template <bool kTrace>
    static GLM5_DEVICE void params(const Ctx<kTrace>&, sk::SkinnyParams&) {}
};

// Marks 3..6 inside the first token block's epilogue (SkinnyFinish's hook: kMarkEntry..kMarkRows), 7 at the end.
constexpr int kMarkEpilogue0 = 3;
constexpr int kMarkFinishDone = kMarkEpilogue0 + sk::kMarkRows + 1;
static_assert(kMarkFinishDone < kTraceMarks, "trace marks");
// (The mark words' address, not the Ctx: the epilogue runs out of line, finish_epilogue.)
template <bool kTrace>
struct EpilogueMarks {
    unsigned long long* words;  // Ctx::mark_words() in the first token block's epilogue, else nullptr
    GLM5_DEVICE void operator()(int k) const {
        if constexpr (kTrace) {
            if (words != nullptr) words[kMarkEpilogue0 + k] = sync::globaltimer_ns();
        }
    }
};
template <bool kTrace>
GLM5_DEVICE EpilogueMarks<kTrace> epilogue_marks(const Ctx<kTrace>& c, bool first_block) {
    return EpilogueMarks<kTrace>{first_block ? c.mark_words() : nullptr};
}

// SkinnyFinish's epilogue out of line: ptxas allocates its registers apart from the rest of the kernel (inlined,
// the build spilled 4-20 bytes elsewhere). The epilogue runs cold, from L2, at ~50 ns per 128-byte line of
// code (session 20 calls 1-3), so its size matters: see SkinnyFinish::cta_reduce. (A dry run by B1's partials
// during their event wait, to warm it, took longer than the wait and gained nothing: call 3.)
template <class G, int kEpi, bool kTrace>
__device__ __noinline__ void finish_epilogue(const sk::SkinnyParams& sp, const sk::Coord& co, uint8_t* smem, int tid,
                                             float (&acc)[G::kNT][4], EpilogueMarks<kTrace> mark) {
    using Finish = sk::SkinnyFinish<G::kTM, kEpi>;
    Finish::epilogue(sp, co, Finish::scratch(smem + G::Smem::kOffRed), tid, acc, mark);
}

// Partial of rows [m0, m1) x weight rows [n0, n1) over K [k0, k1) -> ws[k_split, m, n] (fp32).
// The weight prologue of the first token block is issued before the event wait. Stage (B1 / D1): the
// finish's parameters go into the same SkinnyParams (Stage::params, worker 0). With Stage::kStageEarly
// (B1: its epilogue inputs, positions / slots / their RoPE rows, are step inputs no op writes) every
// partial stages the first token block's inputs (SkinnyFinish stage_pre / stage_tables) into the finish
// scratch before the event wait, so the last arriver finds them ready (finish_group). D1 stages in its
// finish: its w_raw comes from C0, and staging after the wait cost the partial a round trip (call 7).
template <class G, class Stage = NoEpilogueStaging, bool kTrace>
GLM5_DEVICE bool gemm_partial(const Ctx<kTrace>& c, const GemmOperands& g, const SplitK& r, uint8_t* smem) {
    sk::SkinnyParams& sp = gemm_params(c);
    if (c.tid == 0) {
        sp = sk::SkinnyParams{};
        sp.w = g.w;
        sp.w_scale = g.w_scale;
        sp.x = g.x;
        sp.x_scale = g.x_scale;
        sp.M = r.m1;  // rows >= m1 are zero-filled by the loads
        sp.N = g.N;
        sp.K = g.K;
        sp.splits = 1;  // the mainloop returns its own partial; the runtime reduces across instructions
        Stage::params(c, sp);
    }
    worker_sync<kBarWorkers>();
    sk::Coord co;
    co.tile_n = r.n0 / sk::kBlockN;
    co.split = 0;
    co.g_begin = r.k0 / sk::kBlockK;
    co.nk = r.nk();
    co.gmax = co.nk;
    const int tid = c.tid, lane = tid & 31, warp = tid >> 5, gg = lane >> 2, t = lane & 3;
    const int f = co.tile_n * sk::kBlockN + warp * 16 + 2 * gg;
    const int64_t slice = static_cast<int64_t>(r.k_split) * c.p.num_tokens;
    using Tile = typename G::Tile;
    co.tile_m = r.m0 / G::kTM;
    Tile::prologue(sp, co, smem, tid);  // the first token block's weights stream in during the wait
    if constexpr (Stage::kStageEarly)  // step inputs only: staged while the wait lasts
        stage_epilogue_inputs<G, Stage::kEpi>(sp, co.tile_m, r.g0 / sk::kBlockN, smem, tid);
    if (!c.wait_inputs()) {
        ptx::cp_async_wait<0>();
        return false;
    }
    for (int row0 = r.m0; row0 < r.m1; row0 += G::kTM) {
        if (row0 != r.m0) {
            co.tile_m = row0 / G::kTM;
            Tile::prologue(sp, co, smem, tid);
        }
        float acc[G::kNT][4];
        Tile::mainloop(sp, co, smem, tid, acc);
        if (f < g.N) {
#pragma unroll
            for (int j = 0; j < G::kNT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int m = row0 + j * 8 + 2 * t + e;
                    if (m < r.m1) sync::st_cg_f32x2(g.ws + (slice + m) * g.N + f, acc[j][e], acc[j][e + 2]);
                }
        }
        worker_sync<kBarWorkers>();  // the stages are free before the next token block's prologue
    }
    if constexpr (Stage::kStageEarly) ptx::cp_async_wait<0>();  // no staged copy outlives the partial
    return true;
}

// The reduced fp32 tile of rows [row0, row0 + kTM) x weight rows [128 tile_n, +128) in the
// SkinnyFinish fragment layout: sum over the splits in k-split order starting from 0 (as
// SkinnyFinish::reduce_splits does), 0 outside [.., m_end) x [.., N).
template <class G, bool kTrace>
GLM5_DEVICE void load_reduced(const Ctx<kTrace>& c, const GemmOperands& g, int splits, int tile_n, int row0, int m_end,
                              float (&acc)[G::kNT][4]) {
    const int tid = c.tid, lane = tid & 31, warp = tid >> 5, gg = lane >> 2, t = lane & 3;
    const int f = tile_n * sk::kBlockN + warp * 16 + 2 * gg;
    const int64_t plane = static_cast<int64_t>(c.p.num_tokens) * g.N;
    constexpr int kChunk = 4;  // splits whose loads are in flight together (a runtime loop would wait per load)
    bool ok[G::kNT][2];
#pragma unroll
    for (int j = 0; j < G::kNT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            ok[j][e] = row0 + j * 8 + 2 * t + e < m_end && f < g.N;
            acc[j][e] = acc[j][e + 2] = 0.0f;
        }
    for (int s0 = 0; s0 < splits; s0 += kChunk) {
        float2 v[G::kNT][2][kChunk];
#pragma unroll
        for (int j = 0; j < G::kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float* src = g.ws + static_cast<int64_t>(row0 + j * 8 + 2 * t + e) * g.N + f;
#pragma unroll
                for (int u = 0; u < kChunk; ++u)
                    v[j][e][u] = ok[j][e] && s0 + u < splits ? sync::ld_cg_f32x2(src + (s0 + u) * plane)
                                                              : make_float2(0.0f, 0.0f);
            }
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
            if (s0 + u >= splits) break;
#pragma unroll
            for (int j = 0; j < G::kNT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    acc[j][e] += v[j][e][u].x;
                    acc[j][e + 2] += v[j][e][u].y;
                }
        }
    }
}

template <bool kTrace>
GLM5_DEVICE bool check_smem(const Ctx<kTrace>& c, int need) {
    return static_cast<int>(sync::dynamic_smem_bytes()) >= need;
}

// ---- B0: QKV-A partial + row epilogue ----------------------------------------------------------------

// B0: the split-K partials and, per token row, a finaliser (the plan's B0 finalizer tiles, families.py
// `finalizer`), so that no single CTA reads the whole M block's partials or normalises all its rows:
//   partial:   the K slice of a 128-row weight tile; the tile's splits count on the tile's sub-counter
//              (reduce counter + 1 + tile: plan.py counter layout, `tile_counters`), and the last sums the
//              tile's columns (k-split order from 0, as SkinnyFinish::reduce_splits) into the raw bf16
//              q_a / kv_a / k_pe columns (q_lora / c_kv in place, k_pe final);
//   finaliser: k_split = kFinalKSplit, one token row; waits (an intra-op event) for every partial of its M
//              block, then runs split mode's row tile (B0RowNormsTile, kRowThreads threads) on its row.
// (A warp per row, as B0 fused mode, measured 7 us per row pass in the megakernel: a warp's IEEE divides and
// serial vectors; session 19 call 3.)
template <class D>
constexpr int b0_row_threads() {  // glm5_fastpath/ops/fp8_gemm.py _row_threads (bitwise = B0 split mode)
    constexpr int vecs = (D::kQ / 8) > ((D::kKV + D::kR) / 8) ? (D::kQ / 8) : ((D::kKV + D::kR) / 8);
    constexpr int t = (vecs + 31) / 32 * 32;
    return t < 32 ? 32 : (t > 256 ? 256 : t);
}

template <class D>
struct B0Family {
    static constexpr int kRowThreads = b0_row_threads<D>();
    using Rows = attn_pre::B0RowNormsTile<D::kQ, D::kKV, D::kR, kRowThreads, kBarB0Rows>;
    static_assert(D::kQ % 8 == 0 && D::kKV % 8 == 0 && D::kR % 8 == 0, "4-column groups never straddle q | kv | rope");
    static_assert(Rows::kScratchFloats <= 2 * kWorkerWarps, "CtaShared::scratch holds the row sums");
    static constexpr int kTiles = (D::kQkv + sk::kBlockN - 1) / sk::kBlockN;
    static constexpr int kItemUnroll = 2;  // 4-column items per thread whose split loads are in flight together
    static constexpr int kSplitChunk = 4;

    // The finaliser's loads of row m in Rows' register layout (q vectors from the raw q_lora, the tail from the
    // raw c_kv then k_pe); L2 loads: other CTAs wrote them this step.
    static GLM5_DEVICE void load_raw(typename Rows::RowRegs& row, const uint16_t* q, const uint16_t* kv,
                                     const uint16_t* pe, int64_t m, int tid) {
#pragma unroll
        for (int i = 0; i < Rows::kQIters; ++i) {
            const int v = i * kRowThreads + tid;
            row.q[i] = ptx::u32x4{0u, 0u, 0u, 0u};
            if (Rows::q_valid(v)) ptx::ld_cg_v4(q + m * D::kQ + v * 8, row.q[i].x, row.q[i].y, row.q[i].z, row.q[i].w);
        }
#pragma unroll
        for (int i = 0; i < Rows::kTailIters; ++i) {
            const int u = i * kRowThreads + tid;
            row.t[i] = ptx::u32x4{0u, 0u, 0u, 0u};
            if (!Rows::tail_valid(u)) continue;
            const uint16_t* src = u < D::kKV / 8 ? kv + m * D::kKV + u * 8 : pe + m * D::kR + (u * 8 - D::kKV);
            ptx::ld_cg_v4(src, row.t[i].x, row.t[i].y, row.t[i].z, row.t[i].w);
        }
    }

    // Level 1: rows [m0, m1) x columns [n0, n1) = bf16(sum of the splits) -> the raw q_a | kv_a | k_pe columns.
    template <bool kTrace>
    static GLM5_DEVICE void tile_sum(const Ctx<kTrace>& c, const SplitK& r, const GemmOperands& g, int splits,
                                     uint16_t* q_raw, uint16_t* kv_raw, uint16_t* k_pe) {
        const int q4 = (r.n1 - r.n0) / 4, items = r.rows() * q4;
        const int64_t plane = static_cast<int64_t>(c.p.num_tokens) * D::kQkv;
        for (int it0 = c.tid; it0 < items; it0 += kWorkerThreads * kItemUnroll) {
            const float* src[kItemUnroll];
            bool ok[kItemUnroll];
            float4 acc[kItemUnroll];
#pragma unroll
            for (int u = 0; u < kItemUnroll; ++u) {
                const int it = it0 + u * kWorkerThreads;
                ok[u] = it < items;
                const int m = r.m0 + (ok[u] ? it / q4 : 0), col = r.n0 + 4 * (ok[u] ? it % q4 : 0);
                src[u] = g.ws + static_cast<int64_t>(m) * D::kQkv + col;
                acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            for (int s0 = 0; s0 < splits; s0 += kSplitChunk) {
                float4 v[kItemUnroll][kSplitChunk];
#pragma unroll
                for (int u = 0; u < kItemUnroll; ++u)
#pragma unroll
                    for (int k = 0; k < kSplitChunk; ++k)
                        v[u][k] = ok[u] && s0 + k < splits ? sync::ld_cg_f32x4(src[u] + (s0 + k) * plane)
                                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int k = 0; k < kSplitChunk; ++k) {
                    if (s0 + k >= splits) break;
#pragma unroll
                    for (int u = 0; u < kItemUnroll; ++u) {
                        acc[u].x += v[u][k].x;
                        acc[u].y += v[u][k].y;
                        acc[u].z += v[u][k].z;
                        acc[u].w += v[u][k].w;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < kItemUnroll; ++u) {
                if (!ok[u]) continue;
                const int it = it0 + u * kWorkerThreads;
                const int64_t m = r.m0 + it / q4;
                const int col = r.n0 + 4 * (it % q4);
                uint16_t* dst = col < D::kQ ? q_raw + m * D::kQ + col
                              : col < D::kQ + D::kKV ? kv_raw + m * D::kKV + (col - D::kQ)
                                                     : k_pe + m * D::kR + (col - D::kQ - D::kKV);
                ptx::st_global_v2(dst, ptx::f32x2_to_bf16x2_rn(acc[u].x, acc[u].y),
                                  ptx::f32x2_to_bf16x2_rn(acc[u].z, acc[u].w));
            }
        }
    }

    template <class G, bool kTrace>
    static GLM5_DEVICE bool body(const Ctx<kTrace>& c, const SplitK& r, const GemmOperands& g, uint8_t* smem) {
        namespace sl = isa::B0::slot;
        if (!gemm_partial<G>(c, g, r, smem)) return false;
        const int splits = r.splits();
        const bool tile_last = c.arrive_counter(c.ins.w[isa::kReduceCounter] + 1 + r.n0 / sk::kBlockN, 1u,
                                                static_cast<uint32_t>(splits));
        c.mark(0);
        if (!tile_last) return true;
        tile_sum(c, r, g, splits, c.template operand<uint16_t>(sl::q_lora), c.template operand<uint16_t>(sl::c_kv),
                 c.template operand<uint16_t>(sl::k_pe));
        c.mark(1);
        return true;
    }

    // A row finaliser (plan: one per token row, after every partial of its M block): split mode's row tile on
    // the raw row m0 (the host gives each finaliser one row: taskgraph._add_finalizers).
    template <bool kTrace>
    static GLM5_DEVICE bool finalize(const Ctx<kTrace>& c, const SplitK& r) {
        namespace sl = isa::B0::slot;
        if (!(0 <= r.m0 && r.m1 == r.m0 + 1 && r.m1 <= c.p.num_tokens)) return c.fail(kErrUnsupportedTile, kChkRows);
        if (r.g0 != 0 || r.g1 != D::kQkv) return c.fail(kErrUnsupportedTile, kChkGroup);
        if (!c.wait_inputs()) return false;
        if (c.tid >= kRowThreads) return true;
        // The norm weights with the raw row, in one round trip (held across the wait, they spilled elsewhere in the
        // kernel once the C0 family joined).
        typename Rows::Gamma gamma;
        Rows::load_gamma(gamma, c.template operand<const uint16_t>(sl::w_q_a_norm),
                         c.template operand<const uint16_t>(sl::w_kv_a_norm), c.tid);
        const int m = r.m0;
        uint16_t* q_lora = c.template operand<uint16_t>(sl::q_lora);
        uint16_t* c_kv = c.template operand<uint16_t>(sl::c_kv);
        uint16_t* k_pe = c.template operand<uint16_t>(sl::k_pe);
        typename Rows::RowRegs row;
        load_raw(row, q_lora, c_kv, k_pe, m, c.tid);
        const attn_pre::B0RowPtrs rp{nullptr, q_lora + m * D::kQ,
                                     c.template operand<uint8_t>(sl::q_lora_fp8) + static_cast<int64_t>(m) * D::kQ,
                                     c.template operand<float>(sl::q_lora_scale) + m * (D::kQ / 128),
                                     c_kv + m * D::kKV, k_pe + m * D::kR};
        Rows::finish(gamma, row, rp, c.p.rms_eps, c.sh.scratch, c.tid);  // the runtime's end barrier frees scratch
        return true;
    }

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::B0::slot;
        const SplitK r = SplitK::of(c.ins);
        if (r.k_split == kFinalKSplit) return finalize(c, r);
        GemmOperands g;
        g.w = c.template operand<const uint8_t>(sl::w_qkv_a_weight);
        g.w_scale = c.template operand<const float>(sl::w_qkv_a_scale_inv);
        g.x = c.template operand<const uint8_t>(sl::x_fp8);
        g.x_scale = c.template operand<const float>(sl::x_scale);
        g.ws = c.template operand<float>(sl::workspace);
        g.N = D::kQkv;
        g.K = c.p.hidden;
        int32_t chk = check_split_k(c, r, g);
        if (!chk && (r.g0 != 0 || r.g1 != D::kQkv)) chk = kChkGroup;  // the finalisers normalise whole rows
        if (!chk && c.ins.w[isa::kReduceCounter] + 1 + kTiles > c.p.num_counters)
            chk = kChkReduce;  // the tile sub-counters follow the group counter (plan.py counter layout)
        if (chk) return c.fail(kErrUnsupportedTile, chk);
        const int need = Gemm::smem_bytes(r.nk());
        if (!check_smem(c, need)) return c.fail(kErrSmemTooSmall, need);
        return body<Gemm>(c, r, g, smem);
    }
};

// ---- B1 (indexer K) and D1 (indexer Q): partial + SkinnyFinish epilogue -----------------------------

// The last arriver's epilogue of a B1 / D1 reduce group: per token block, SkinnyFinish's staging of the
// epilogue inputs (positions, slots, w_raw, RoPE (cos, sin): stage_pre, consumer barrier, stage_tables,
// waited for at the epilogue's entry; with kStagedEarly the first block's were staged by the partial),
// the reduced tile in fragment layout, then SkinnyFinish's epilogue (its parameters: gemm_params(c), set
// with the partial's by the family's Stage::params).
template <class G, int kEpi, bool kStagedEarly, bool kTrace>
GLM5_DEVICE void finish_group(const Ctx<kTrace>& c, const GemmOperands& g, const SplitK& r, uint8_t* smem) {
    using Finish = sk::SkinnyFinish<G::kTM, kEpi>;
    static_assert(sk::SkinnySmem<G::kTM, G::kStages, kEpi>::kOffRed == G::Smem::kOffRed, "scratch offset");
    const int splits = r.splits();
    const sk::SkinnyParams& sp = gemm_params(c);
    const sk::Scratch sc = Finish::scratch(smem + G::Smem::kOffRed);
    sk::Coord co;
    co.tile_n = r.g0 / sk::kBlockN;
    co.split = 0;
    co.g_begin = 0;
    co.nk = 0;
    co.gmax = 0;
    for (int row0 = r.m0; row0 < r.m1; row0 += G::kTM) {
        co.tile_m = row0 / G::kTM;
        if (!kStagedEarly || row0 != r.m0) {  // kStagedEarly: the partial staged the first block's (gemm_partial)
            Finish::stage_pre(sp, co, sc, c.tid);
            sk::consumer_sync();
            Finish::stage_tables(sp, co, sc, c.tid);
        }
        if (row0 == r.m0) c.mark(1);
        float acc[G::kNT][4];
        load_reduced<G>(c, g, splits, co.tile_n, row0, r.m1, acc);
        if (row0 == r.m0) c.mark(2);
        finish_epilogue<G, kEpi, kTrace>(sp, co, smem, c.tid, acc, epilogue_marks(c, row0 == r.m0));
        worker_sync<kBarWorkers>();  // the epilogue's scratch is reused by the next token block
    }
    c.mark(kMarkFinishDone);
}

template <class D>
struct B1Family {
    // The finish's parameters (with the partial's in one SkinnyParams) and the epilogue whose inputs the
    // partials stage.
    struct Stage {
        static constexpr int kEpi = sk::kEpiIdxK;
        static constexpr bool kStageEarly = true;
        template <bool kTrace>
        static GLM5_DEVICE void params(const Ctx<kTrace>& c, sk::SkinnyParams& sp) {
            namespace sl = isa::B1::slot;
            sp.dim_a = c.p.idx_dim;
            sp.rope_dim = D::kR;
            sp.ln_w = c.template operand<const float>(sl::w_indexer_k_norm_weight);
            sp.ln_b = c.template operand<const float>(sl::w_indexer_k_norm_bias);
            sp.positions = c.template operand<const void>(sl::positions);
            sp.slots = c.template operand<const void>(sl::out_cache_loc);
            sp.cache = c.template operand<uint8_t>(sl::index_k_cache_written);
            sp.out_fp8 = c.template operand<uint8_t>(sl::index_k_fp8);
            sp.out_scale = c.template operand<float>(sl::index_k_scale);
            sp.flags = 3;  // positions and out_cache_loc are int64 (graph TensorDefs)
            sp.eps = c.p.k_norm_eps;
            sp.rope_table = c.p.rope_table;
            sp.rope_table_len = c.p.rope_table_len;
            sp.rope_theta = c.p.rope_theta;
        }
    };

    template <class G, bool kTrace>
    static GLM5_DEVICE bool body(const Ctx<kTrace>& c, const SplitK& r, const GemmOperands& g, uint8_t* smem) {
        if (!gemm_partial<G, Stage>(c, g, r, smem)) return false;
        if (!c.arrive_reduce()) return true;
        finish_group<G, Stage::kEpi, Stage::kStageEarly>(c, g, r, smem);
        return true;
    }

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::B1::slot;
        const SplitK r = SplitK::of(c.ins);
        GemmOperands g;
        g.w = c.template operand<const uint8_t>(sl::w_indexer_wk_weight);
        g.w_scale = c.template operand<const float>(sl::w_indexer_wk_scale_inv);
        g.x = c.template operand<const uint8_t>(sl::x_fp8);
        g.x_scale = c.template operand<const float>(sl::x_scale);
        g.ws = c.template operand<float>(sl::workspace);
        g.N = c.p.idx_dim;
        g.K = c.p.hidden;
        int32_t chk = check_split_k(c, r, g);
        if (!chk && (r.g0 != 0 || r.g1 != g.N || g.N > sk::kBlockN || g.x == nullptr)) chk = kChkGroup;
        if (chk) return c.fail(kErrUnsupportedTile, chk);
        const int need = Gemm::smem_bytes(r.nk());
        if (!check_smem(c, need)) return c.fail(kErrSmemTooSmall, need);
        return body<Gemm>(c, r, g, smem);
    }
};

template <class D>
struct D1Family {
    struct Stage {  // as B1Family::Stage, staged in the finish
        static constexpr int kEpi = sk::kEpiIdxQ;
        static constexpr bool kStageEarly = false;
        template <bool kTrace>
        static GLM5_DEVICE void params(const Ctx<kTrace>& c, sk::SkinnyParams& sp) {
            namespace sl = isa::D1::slot;
            sp.dim_a = c.p.idx_dim;
            sp.dim_b = c.p.idx_heads;
            sp.rope_dim = D::kR;
            sp.w_raw = c.template operand<const uint16_t>(sl::w_raw);
            sp.positions = c.template operand<const void>(sl::positions);
            sp.out_fp8 = c.template operand<uint8_t>(sl::index_q_fp8);
            sp.out_scale = c.template operand<float>(sl::index_q_scale);
            sp.out_head_w = c.template operand<float>(sl::head_w);
            sp.flags = 1;  // positions int64
            sp.head_w_scale = c.p.head_w_scale;
            sp.rope_table = c.p.rope_table;
            sp.rope_table_len = c.p.rope_table_len;
            sp.rope_theta = c.p.rope_theta;
        }
    };

    template <class G, bool kTrace>
    static GLM5_DEVICE bool body(const Ctx<kTrace>& c, const SplitK& r, const GemmOperands& g, uint8_t* smem) {
        if (!gemm_partial<G, Stage>(c, g, r, smem)) return false;
        if (!c.arrive_reduce()) return true;
        finish_group<G, Stage::kEpi, Stage::kStageEarly>(c, g, r, smem);
        return true;
    }

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::D1::slot;
        const SplitK r = SplitK::of(c.ins);
        GemmOperands g;
        g.w = c.template operand<const uint8_t>(sl::w_indexer_wq_b_weight);
        g.w_scale = c.template operand<const float>(sl::w_indexer_wq_b_scale_inv);
        g.x = c.template operand<const uint8_t>(sl::q_lora_fp8);
        g.x_scale = c.template operand<const float>(sl::q_lora_scale);
        g.ws = c.template operand<float>(sl::workspace);
        g.N = c.p.idx_heads * c.p.idx_dim;
        g.K = D::kQ;
        int32_t chk = c.p.idx_dim == sk::kBlockN ? check_split_k(c, r, g) : kChkHeadDim;
        if (!chk && (r.g0 != r.n0 || r.g1 != r.n1 || r.n1 - r.n0 != sk::kBlockN)) chk = kChkGroup;
        if (chk) return c.fail(kErrUnsupportedTile, chk);
        const int need = Gemm::smem_bytes(r.nk());
        if (!check_smem(c, need)) return c.fail(kErrSmemTooSmall, need);
        return body<Gemm>(c, r, g, smem);
    }
};

// ---- D0: q_b GEMM N tile (all of K) + RoPE on the head's rope rows ------------------------------------------

// One 128-row tile of w.q_b (rows [n0, n1) = a head's nope / rope rows, 128-aligned: GLM-5's 256-row heads) over all of
// K for rows [m0, m1): the skinny tile's prologue (weights before the wait), the K loop, then SkinnyFinish's q_b
// epilogue (bf16 q_nope; RoPE'd q_pe) out of line. Positions / RoPE rows are step inputs: staged before the wait.
// Bitwise the standalone kernel with one K split (the same K loop and epilogue).
template <class D>
struct D0Family {
    static constexpr int kEpi = sk::kEpiQb;

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::D0::slot;
        namespace pl = isa::D0::payload;
        using G = Gemm;
        const MegaParams& p = c.p;
        const int m0 = c.ins.w[pl::m0], m1 = c.ins.w[pl::m1], n0 = c.ins.w[pl::n0], n1 = c.ins.w[pl::n1];
        constexpr int kHead = D::kNope + D::kR;
        const int N = p.num_heads * kHead, K = D::kQ;
        int32_t chk = 0;
        if (p.q_lora != K) chk = kChkK;  // the controller joins p.q_lora / 128 barriers per block (cta_barrier_joins)
        else if (!(0 <= m0 && m0 < m1 && m1 <= p.num_tokens)) chk = kChkRows;
        else if (m0 % G::kTM) chk = kChkRowAlign;
        else if (n0 < 0 || n0 % sk::kBlockN || n1 <= n0 || n1 - n0 > sk::kBlockN || n1 > N) chk = kChkN;
        if (chk) return c.fail(kErrUnsupportedTile, chk);
        const int need = G::smem_bytes(K / sk::kBlockK);
        if (!check_smem(c, need)) return c.fail(kErrSmemTooSmall, need);
        sk::SkinnyParams& sp = gemm_params(c);
        if (c.tid == 0) {
            sp = sk::SkinnyParams{};
            sp.w = c.template operand<const uint8_t>(sl::w_q_b_weight);
            sp.w_scale = c.template operand<const float>(sl::w_q_b_scale_inv);
            sp.x = c.template operand<const uint8_t>(sl::q_lora_fp8);
            sp.x_scale = c.template operand<const float>(sl::q_lora_scale);
            sp.M = m1;  // rows >= m1 are zero-filled by the loads
            sp.N = N;
            sp.K = K;
            sp.splits = 1;
            sp.out_a = c.template operand<uint16_t>(sl::q_nope);
            sp.out_b = c.template operand<uint16_t>(sl::q_pe);
            sp.positions = c.template operand<const void>(sl::positions);
            sp.dim_a = kHead;
            sp.dim_b = D::kNope;
            sp.rope_dim = D::kR;
            sp.flags = 1;  // positions int64 (graph TensorDefs)
            sp.rope_table = p.rope_table;
            sp.rope_table_len = p.rope_table_len;
            sp.rope_theta = p.rope_theta;
        }
        worker_sync<kBarWorkers>();
        sk::Coord co;
        co.tile_n = n0 / sk::kBlockN;
        co.split = 0;
        co.g_begin = 0;
        co.nk = K / sk::kBlockK;
        co.gmax = co.nk;
        co.tile_m = m0 / G::kTM;
        using Tile = typename G::Tile;
        Tile::prologue(sp, co, smem, c.tid);  // the first token block's weights stream in during the wait
        stage_epilogue_inputs<G, kEpi>(sp, co.tile_m, co.tile_n, smem, c.tid);  // step inputs: before the wait
        if (!c.wait_inputs()) {
            ptx::cp_async_wait<0>();
            return false;
        }
        for (int row0 = m0; row0 < m1; row0 += G::kTM) {
            if (row0 != m0) {
                co.tile_m = row0 / G::kTM;
                Tile::prologue(sp, co, smem, c.tid);
                stage_epilogue_inputs<G, kEpi>(sp, co.tile_m, co.tile_n, smem, c.tid);
            }
            float acc[G::kNT][4];
            Tile::mainloop(sp, co, smem, c.tid, acc);
            finish_epilogue<G, kEpi, kTrace>(sp, co, smem, c.tid, acc, EpilogueMarks<kTrace>{nullptr});
            worker_sync<kBarWorkers>();  // the stages and the epilogue scratch are free before the next block
        }
        ptx::cp_async_wait<0>();
        return true;
    }
};

// ---- D2: W_UK absorption (+ the MLA KV row store on head 0) ------------------------------------------

template <class D>
struct D2Family {
    using Tile1 = attn_pre::D2AbsorbTile<D::kNope, D::kKV, 1, 4, kBarD2>;  // rows <= 32 (ops/d2_absorb.py)
    using Tile2 = attn_pre::D2AbsorbTile<D::kNope, D::kKV, 2, 4, kBarD2>;
    using Kv = attn_pre::D2KvStoreWarp<D::kKV, D::kR>;
    static constexpr int kSmallRows = 32;
    static constexpr int kSmemBytes = Tile1::kSmemBytes > Tile2::kSmemBytes ? Tile1::kSmemBytes : Tile2::kSmemBytes;
    static_assert(Tile1::kWBytes == Tile2::kWBytes, "both variants stage the weight tile identically");

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::D2::slot;
        namespace pl = isa::D2::payload;
        const int m0 = c.ins.w[pl::m0], m1 = c.ins.w[pl::m1], head = c.ins.w[pl::head];
        const int n0 = c.ins.w[pl::n0], n1 = c.ins.w[pl::n1];
        const int heads = c.p.num_heads;
        if (!(0 <= m0 && m0 < m1 && m1 <= c.p.num_tokens)) return c.fail(kErrUnsupportedTile, kChkRows);
        if (head < 0 || head >= heads || n0 < 0 || n0 % Tile1::kNTile || n1 != n0 + Tile1::kNTile || n1 > D::kKV)
            return c.fail(kErrUnsupportedTile, kChkD2Tile);
        const int rows = m1 - m0;
        const int need = rows <= kSmallRows ? Tile1::kSmemBytes : Tile2::kSmemBytes;
        if (!check_smem(c, need)) return c.fail(kErrSmemTooSmall, need);
        const int ntile = n0 / Tile1::kNTile;
        Tile1::issue_weight_copies(smem, c.template operand<const uint16_t>(sl::w_w_kc), head, ntile, c.tid);
        if (!c.wait_inputs()) {
            ptx::cp_async_wait<0>();
            return false;
        }
        if (head == 0 && n1 == D::kKV) {  // while the weight tile streams in: the KV rows of the block
            const uint16_t* c_kv = c.template operand<const uint16_t>(sl::c_kv);
            const uint16_t* k_pe = c.template operand<const uint16_t>(sl::k_pe);
            const void* positions = c.template operand<const void>(sl::positions);
            const void* slots = c.template operand<const void>(sl::out_cache_loc);
            uint16_t* kv = c.template operand<uint16_t>(sl::kv_cache_written);
            for (int tok = m0 + (c.tid >> 5); tok < m1; tok += kWorkerWarps)
                Kv::run(c_kv, k_pe, positions, slots, /*idx64*/ 1, c.p.rope_inv_freq, kv, c.p.kv_num_slots, tok,
                        c.tid & 31);
        }
        const int64_t tok_off = static_cast<int64_t>(m0) * heads;
        const attn_pre::D2Ptrs dp{c.template operand<const uint16_t>(sl::q_nope) + tok_off * D::kNope,
                                  c.template operand<uint16_t>(sl::q_lat) + tok_off * D::kKV, rows, heads};
        if (rows <= kSmallRows) Tile1::run(smem, dp, head, ntile, c.tid);
        else Tile2::run(smem, dp, head, ntile, c.tid);
        return true;
    }
};

// ---- C0: head gate, split-K partials + last-arriver bf16 round ----------------------------------------------

template <class D>
struct C0Family {
    static constexpr int kHeads = D::kIdxHeads;
    static constexpr int kHeadTiles = (kHeads + 15) / 16;
    static constexpr int kTok = 32;    // tokens per pass: 4 n8 tiles
    static constexpr int kPitch = 36;  // floats per token row of a warp's partial (C0HeadGateTile::kRedPitch)
    static constexpr int kQuads = kHeads / 4;
    static constexpr int kSmemBytes = kWorkerWarps * kTok * kPitch * 4;
    static_assert(kHeads % 4 == 0 && kHeads >= 4 && kHeads <= 32, "heads: a multiple of 4, at most two m16 tiles");
    static_assert(kTok * kQuads <= kWorkerThreads, "one (token, head quad) per worker in the partial sum");

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
    }

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::C0::slot;
        const SplitK r = SplitK::of(c.ins);
        const int H = c.p.hidden;
        const int width = r.k1 - r.k0;
        GemmOperands shape{};  // the split-K payload checks of the FP8 families, on the gate's [heads, hidden]
        shape.N = kHeads;
        shape.K = H;
        int32_t chk = check_split_k(c, r, shape);
        if (!chk && (r.n0 != 0 || r.n1 != kHeads || r.g0 != 0 || r.g1 != kHeads)) chk = kChkGroup;
        else if (!chk && width != 128 && width != 256) chk = kChkK;  // the fragment layout's 4 or 8 warps along K
        if (chk) return c.fail(kErrUnsupportedTile, chk);
        if (!check_smem(c, kSmemBytes)) return c.fail(kErrSmemTooSmall, kSmemBytes);

        const int tid = c.tid, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int slots = width / 32;             // warps along K: 4 or 8
        const int nt_per = 4 * slots / kWorkerWarps;  // n8 tiles of a warp: 2 or 4
        const int grp = warp / slots;             // which n8 tiles: [grp * nt_per, (grp + 1) * nt_per)
        const int col = r.k0 + (warp % slots) * 32 + 8 * t;
        // This lane's weight fragments (rows g, g + 8 of each head tile), loaded after the wait: held across
        // the wait loop they spill (the wait of a C0 instruction is A0's x rows, short in a prefix plan).
        if (!c.wait_inputs()) return false;
        const uint16_t* wp = c.template operand<const uint16_t>(sl::w_indexer_weights_proj);
        ptx::u32x4 wv[kHeadTiles][2];
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = mt * 16 + hh * 8 + g;
                wv[mt][hh] = row < kHeads ? ptx::ld_global_nc_v4(wp + static_cast<int64_t>(row) * H + col)
                                          : ptx::u32x4{0u, 0u, 0u, 0u};
            }

        const uint16_t* x = c.template operand<const uint16_t>(sl::x_bf16);
        float* ws = c.template operand<float>(sl::workspace);
        float* red = reinterpret_cast<float*>(smem);
        const int64_t slice = static_cast<int64_t>(r.k_split) * c.p.num_tokens;
        for (int tok0 = r.m0; tok0 < r.m1; tok0 += kTok) {
            ptx::u32x4 xv[4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int tok = tok0 + nt * 8 + g;
                const bool mine = nt / nt_per == grp;
                xv[nt] = mine && tok < r.m1 ? ptx::ld_global_v4(x + static_cast<int64_t>(tok) * H + col)
                                            : ptx::u32x4{0u, 0u, 0u, 0u};
            }
            float acc[kHeadTiles][4][4];
#pragma unroll
            for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll
            for (int st = 0; st < 2; ++st)
#pragma unroll
                for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        if (nt / nt_per != grp || tok0 + nt * 8 >= r.m1) continue;  // warp-uniform
                        ptx::mma_m16n8k16_bf16(acc[mt][nt], word(wv[mt][0], 2 * st), word(wv[mt][1], 2 * st),
                                               word(wv[mt][0], 2 * st + 1), word(wv[mt][1], 2 * st + 1),
                                               word(xv[nt], 2 * st), word(xv[nt], 2 * st + 1));
                    }
            // warp partials -> [warp][token][head] (the cluster tile's layout and pitch)
            float* mine_red = red + warp * kTok * kPitch;
#pragma unroll
            for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    if (nt / nt_per != grp) continue;
                    const int h = mt * 16 + g, tk = nt * 8 + 2 * t;
                    mine_red[tk * kPitch + h] = acc[mt][nt][0];
                    mine_red[(tk + 1) * kPitch + h] = acc[mt][nt][1];
                    mine_red[tk * kPitch + h + 8] = acc[mt][nt][2];
                    mine_red[(tk + 1) * kPitch + h + 8] = acc[mt][nt][3];
                }
            worker_sync<kBarWorkers>();
            if (tid < kTok * kQuads) {  // (token, head quad): the warps of its n8 tile, in warp order
                const int tk = tid / kQuads, q = tid % kQuads, m = tok0 + tk;
                if (m < r.m1) {
                    const int tgrp = (tk / 8) / nt_per;
                    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    for (int w = tgrp * slots; w < (tgrp + 1) * slots; ++w) {
                        const float4 v = *reinterpret_cast<const float4*>(red + (w * kTok + tk) * kPitch + 4 * q);
                        sum.x += v.x;
                        sum.y += v.y;
                        sum.z += v.z;
                        sum.w += v.w;
                    }
                    float* dst = ws + (slice + m) * kHeads + 4 * q;
                    sync::st_cg_f32x2(dst, sum.x, sum.y);
                    sync::st_cg_f32x2(dst + 2, sum.z, sum.w);
                }
            }
            worker_sync<kBarWorkers>();  // the partial scratch is reused by the next pass
        }
        if (!c.arrive_reduce()) return true;
        // Last arriver: w_raw[m0:m1] = bf16(sum of the splits in k-split order).
        const int splits = r.splits();
        const int64_t plane = static_cast<int64_t>(c.p.num_tokens) * kHeads;
        uint16_t* w_raw = c.template operand<uint16_t>(sl::w_raw);
        for (int i = tid; i < (r.m1 - r.m0) * kQuads; i += kWorkerThreads) {
            const int m = r.m0 + i / kQuads, q = i % kQuads;
            const float* src = ws + static_cast<int64_t>(m) * kHeads + 4 * q;
            float a = 0.0f, b = 0.0f, cc = 0.0f, d = 0.0f;
            for (int sp = 0; sp < splits; ++sp) {
                const float2 lo = sync::ld_cg_f32x2(src + sp * plane), hi = sync::ld_cg_f32x2(src + sp * plane + 2);
                a += lo.x;
                b += lo.y;
                cc += hi.x;
                d += hi.y;
            }
            ptx::st_global_v2(w_raw + static_cast<int64_t>(m) * kHeads + 4 * q, ptx::f32x2_to_bf16x2_rn(a, b),
                              ptx::f32x2_to_bf16x2_rn(cc, d));
        }
        return true;
    }
};

// ---- A0: residual add + RMSNorm + 1x128 FP8 quant, rows [m0, m1) ---------------------------------------------

template <class D>
struct A0Family {
    using Tile = attn_pre::A0AddRmsNormQuantRowTile<D::kHidden, kWorkerThreads, kBarA0>;
    static constexpr int kSmemBytes = Tile::kSmemBytes;

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::A0::slot;
        namespace pl = isa::A0::payload;
        const int m0 = c.ins.w[pl::m0], m1 = c.ins.w[pl::m1];
        if (!(0 <= m0 && m0 < m1 && m1 <= c.p.num_tokens)) return c.fail(kErrUnsupportedTile, kChkRows);
        if (c.p.hidden != D::kHidden) return c.fail(kErrUnsupportedTile, kChkA0Hidden);
        if (!check_smem(c, kSmemBytes)) return c.fail(kErrSmemTooSmall, kSmemBytes);
        if (!c.wait_inputs()) return false;  // A0 is the prefix's first op: no waits in a prefix plan
        constexpr int kGroups = D::kHidden / Tile::kGroup;
        for (int m = m0; m < m1; ++m) {
            const int64_t off = static_cast<int64_t>(m) * D::kHidden;
            const attn_pre::A0RowPtrs rp{c.template operand<const uint16_t>(sl::hidden) + off,
                                         c.template operand<const uint16_t>(sl::residual) + off,
                                         c.template operand<uint16_t>(sl::x_bf16) + off,
                                         c.template operand<uint16_t>(sl::residual_out) + off,
                                         c.template operand<uint8_t>(sl::x_fp8) + off,
                                         c.template operand<float>(sl::x_scale) + static_cast<int64_t>(m) * kGroups, 1};
            Tile::run(c.template operand<const uint16_t>(sl::w_input_norm), rp, c.p.rms_eps,
                      reinterpret_cast<float*>(smem), c.tid);
            worker_sync<kBarWorkers>();  // every read of the row's partials is done before the next row writes them
        }
        return true;
    }
};

// ---- E2: top-k of a token row's logits -> physical KV slots ---------------------------------------------------

// E2TopkTile with the 256 workers (kCluster = false: one CTA per row, rows [m0, m1) in turn), out of line. kItems =
// 8: chunks of 2048 positions, chunk 0 in registers, chunks 1.. in the dynamic shared memory after the tile's Smem
// (device.py e2_smem_bytes) as far as it goes and the rest re-read from global memory. The tile's code runs cold
// (fetched per SM per launch), so its unrolled size is latency: kItems = 16 (4096-position chunks) was 15.7 K SASS
// instructions against 9.1 K at 8 (session 21). kItems = 32 (an 8192-logit row in one chunk) spills 12-20 B.
// The output equals the standalone kernel's (the selected set and its order are a function of the row alone:
// e2_topk.cuh contract).
constexpr int kE2Items = 8;

template <class D>
struct E2Family {
    using Tile = attn_pre::E2TopkTile<kWorkerThreads, kE2Items, /*kCluster=*/false, kBarE2, /*kRolledStores=*/true>;
    static constexpr int kChunk = Tile::kChunk;
    static constexpr int kChunkOff = (static_cast<int>(sizeof(typename Tile::Smem)) + 15) / 16 * 16;
    static_assert(kWorkerThreads != 256 || kChunkOff == 19248, "device.py E2_SMEM_BYTES");  // Smem: not kItems

    // Out of line: ptxas allocates the tile's row registers apart from the rest of the kernel.
    template <bool kTrace>
    static __device__ __noinline__ bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::E2::slot;
        namespace pl = isa::E2::payload;
        const MegaParams& p = c.p;
        const int m0 = c.ins.w[pl::m0], m1 = c.ins.w[pl::m1];
        if (!(0 <= m0 && m0 < m1 && m1 <= p.num_tokens) || p.max_ctx < 1 || p.bt_width < 1)
            return c.fail(kErrUnsupportedTile, kChkE2Row);
        if (!check_smem(c, kChunkOff)) return c.fail(kErrSmemTooSmall, kChunkOff);
        const int chunks = (p.max_ctx + kChunk - 1) / kChunk;
        const int room = (static_cast<int>(sync::dynamic_smem_bytes()) - kChunkOff) / (kChunk * 4);
        auto& s = *reinterpret_cast<typename Tile::Smem*>(smem);
        for (int m = m0; m < m1; ++m) {
            attn_pre::E2RowArgs a;
            a.logits = c.template operand<const float>(sl::logits) + static_cast<int64_t>(m) * p.max_ctx;
            a.width = p.max_ctx;
            a.seq_len = c.template operand<const int32_t>(sl::seq_lens) + m;
            a.bt = c.template operand<const int32_t>(sl::block_table) + static_cast<int64_t>(m) * p.bt_width;
            a.bt_cols = p.bt_width;
            a.out = c.template operand<int32_t>(sl::topk_slots) + static_cast<int64_t>(m) * D::kTopk;
            a.topk = D::kTopk;
            a.seq_len_64 = false;  // graph TensorDefs: seq_lens, block_table int32
            a.bt_64 = false;
            a.chunks = chunks;
            a.smem_chunks = min(chunks - 1, room);
            a.chunk_smem = reinterpret_cast<uint32_t*>(smem + kChunkOff);
            a.n_cta = 1;
            a.rank = 0;
            Tile::prologue(s, c.tid);
            // seq_lens / block_table are step inputs (no producer): read before the wait; the logits (E1) after it.
            const attn_pre::E2Meta meta = Tile::load_meta(a, s, c.tid);
            if (m == m0 && !c.wait_inputs()) return false;
            worker_sync<kBarWorkers>();  // the zeroed histograms and the page entries are visible
            Tile::run(a, meta, s, c.tid);
            worker_sync<kBarWorkers>();  // the tile's shared memory is reused by the next row
        }
        return true;
    }
};

// ---- E1: paged FP8 indexer logits of a Q block's rows over one KV window ----------------------------------

// KV window per instruction: the graph's E1 split (prefix_graph.TileParams.e1_kv_split = 512 tokens = 8
// pages; device.py E1_MAX_PAGES). A last split's window runs to max_ctx, but only its live tokens
// (< seq_len, at most 8 pages past kv0) are read; the rest of the row is written -inf.
constexpr int kE1Stages = 4;    // pages in flight (8, the whole window, was no faster: session 18 call 8)
constexpr int kE1MaxPages = 8;  // live pages per window

template <class D>
struct E1Family {
    using Tile = attn_pre::E1IndexerLogitsTile<D::kIdxHeads, D::kIdxDim, kE1Stages, kE1MaxPages, kWorkerThreads, kBarE1,
                                               /*kPackedQ=*/true>;
    static constexpr int kSmemBytes = Tile::kSmemBytes;

    template <bool kTrace>
    static GLM5_DEVICE bool run(const Ctx<kTrace>& c, uint8_t* smem) {
        namespace sl = isa::E1::slot;
        namespace pl = isa::E1::payload;
        const int q0 = c.ins.w[pl::q0], q1 = c.ins.w[pl::q1], kv0 = c.ins.w[pl::kv0], kv1 = c.ins.w[pl::kv1];
        const MegaParams& p = c.p;
        if (!(0 <= q0 && q0 < q1 && q1 <= p.num_tokens)) return c.fail(kErrUnsupportedTile, kChkRows);
        const int32_t* seq_lens = c.template operand<const int32_t>(sl::seq_lens);
        // Live tokens of a row: seq_len clamped to [0, min(max_ctx, block-table capacity)] (host-checked to fit int32).
        const int cap = min(p.max_ctx, p.bt_width * Tile::kPageTokens);
        // Uniform checks (every worker reads the same words): the window and each row's live tokens.
        bool ok = p.idx_heads == D::kIdxHeads && p.idx_dim == D::kIdxDim && kv0 >= 0 && kv0 % Tile::kPageTokens == 0 &&
                  kv1 > kv0 && kv1 <= p.max_ctx && p.bt_width >= 1;
        for (int m = q0; ok && m < q1; ++m) ok = min(max(seq_lens[m], 0), min(cap, kv1)) - kv0 <= Tile::kMaxTokens;
        if (!ok) return c.fail(kErrUnsupportedTile, kChkE1Tile);
        if (!check_smem(c, kSmemBytes)) return c.fail(kErrSmemTooSmall, kSmemBytes);
        for (int m = q0; m < q1; ++m) {
            attn_pre::E1TileArgs a;
            a.q = c.template operand<const uint8_t>(sl::index_q_fp8) +
                  static_cast<int64_t>(m) * (D::kIdxHeads * D::kIdxDim);
            a.head_w = c.template operand<const float>(sl::head_w) + static_cast<int64_t>(m) * D::kIdxHeads;
            a.cache = c.template operand<const uint8_t>(sl::index_k_cache_written);
            a.block_table = c.template operand<const int32_t>(sl::block_table) + static_cast<int64_t>(m) * p.bt_width;
            a.logits = c.template operand<float>(sl::logits) + static_cast<int64_t>(m) * p.max_ctx;
            a.num_pages = p.idx_cache_pages;
            a.seq_len = min(max(seq_lens[m], 0), cap);
            a.t0 = kv0;
            a.t_end = kv1;
            // seq_lens / block_table are step inputs (no producer): read before the wait; q, head_w (D1)
            // and the cache (B1) after it.
            Tile::prologue(a, smem, c.tid, /*l2_prefetch=*/false);
            if (m == q0 && !c.wait_inputs()) return false;
            Tile::run(a, smem, c.tid);
            worker_sync<kBarWorkers>();  // the ring, ids and logits buffer are reused by the next row
        }
        return true;
    }
};

}  // namespace megartp
}  // namespace glm5
