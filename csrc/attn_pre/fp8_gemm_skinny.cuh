// Skinny block-scaled FP8 GEMM for decode (M <= 256 tokens) with fused epilogues.
//
//   y[m, n] = sum_g xs[m, g] * S[n / 128, g] * sum_{k in group g} x8[m, k] * W8[n, k]
//
// x8 [M, K] e4m3 + xs [M, K/128] fp32 (1x128 activation groups), W8 [N, K] e4m3 + S [ceil(N/128),
// K/128] fp32 (128x128 weight blocks); fp32 accumulation with "promotion": every 128-wide K group
// is summed on the tensor cores into a fresh fp32 partial, which is then scaled by xs*S and added
// to the fp32 accumulator (spec/glm5_layer.md section 5).
//
// Framework-free (raw pointers; bf16 as uint16_t, e4m3 as bytes), so the tile functions can run
// from the standalone launcher (fp8_gemm_skinny.cu) or, later, from a persistent megakernel.
//
// Two mainloops share everything after the K loop (SkinnyFinish: split-K publish / last-CTA
// reduce and every epilogue, on the register layout described under "Fragment trick"):
//   SkinnyGemmTile (this file)     cp.async ring + mma.sync m16n8k32 e4m3, 256 threads;
//   WgmmaGemmTile (fp8_gemm_wgmma.cuh)  TMA ring + wgmma m64nNk32 e4m3 (sm_90a), 256 math threads
//                                  + 1 producer warp; hands over in the same register layout.
// The finish synchronises only the 256 consumer threads (named barrier 1, consumer_sync()).
//
// ---- Decomposition --------------------------------------------------------------------------
// swapAB: weight rows sit on the MMA M side (16 per warp, 128 per CTA = one weight-scale block
// row), tokens on the MMA N side (n8 tiles; kTM = 8/16/32/64 tokens per CTA), so a 1-token decode
// wastes no weight bandwidth, only idle MMA columns. A CTA owns (n tile of 128 weight rows,
// K split s, token block of kTM): grid = (tiles_n, splits, tiles_m). 256 threads = 8 warps; warp w
// owns weight rows 16w .. 16w+15 of the tile for all kTM tokens.
//
// ---- Pipeline -------------------------------------------------------------------------------
// One stage = one 128-wide K group: 128 x 128 B of weights (16 KB) + kTM x 128 B of activations,
// fetched with 16-byte cp.async.cg into a kStages-deep ring (kStages-1 groups in flight ahead of
// the MMA). The weight stages of the prologue and the weight scales are issued BEFORE
// griddepcontrol.wait (they are not the previous kernel's output), so under PDL the HBM stream
// starts while the producer finishes; activations and their scales are loaded after the wait.
//
// ---- Fragment trick (no ldmatrix, no permute) ------------------------------------------------
// mma.m16n8k32 pairs A k-indices and B k-indices per thread; any k permutation applied to both
// gives the same dot product. Thread (g = lane/4, t = lane%4) takes the 16 contiguous bytes
// [16t, 16t+16) of a 64-byte K chunk for its A rows and its B token: bytes 0-7 feed one MMA,
// bytes 8-15 the next. So every fragment is one 16-byte ld.shared.
// MMA row g is weight row 2g and MMA row g+8 is weight row 2g+1 (of the warp's 16): each thread
// then holds features (2f, 2f+1) for tokens (2t, 2t+1) of each n8 tile — the pair an interleaved
// (GPT-J) RoPE rotates, and a 4-byte bf16x2 store.
// Shared-memory tiles are 128-byte rows with the 16-byte chunk index XOR-swizzled so the 8-lane
// phases of a 16-byte ld.shared hit 32 distinct banks: weights by bit 1 of the row (lanes of one
// phase read rows 4q and 4q+2), activations by bit 0 (rows 2q and 2q+1).
//
// ---- Split-K and the epilogue ---------------------------------------------------------------
// With splits > 1 every CTA writes its fp32 partial tile to a workspace in fragment order (each
// thread a float4 per n8 tile: fully coalesced), fences, and bumps a per-output-tile arrival
// counter; the LAST CTA to arrive resets the counter to 0 (so CUDA-graph replays need no memset),
// sums all partials in split order 0..S-1 (a fixed order: the result is bitwise deterministic
// whichever CTA arrives last), and runs the epilogue. No second kernel.
//
// Epilogues (kEpi):
//   kEpiPlain      y = bf16(acc) [M, N].
//   kEpiQkvA (B0)  bf16(acc) -> q_lora / c_kv buffers (raw) and k_pe (final); then a second-level
//                  per-token-block counter over the n tiles: the last tile CTA to finish a token
//                  block runs the row epilogue for its kTM tokens (RMSNorm of q_lora and c_kv in
//                  place, 1x128 FP8 quant of q_lora). Rows need every n tile, hence the counter.
//   kEpiQb (D0)    bf16(acc) -> q_nope, and interleaved RoPE on the trailing rope dims of each head
//                  -> q_pe (bf16).
//   kEpiIdxQ (D1)  bf16(acc), RoPE on the leading rope dims (kept fp32), per-(token, head) FP8 quant
//                  (s = max(amax, 1e-4)/448), head_w = (fp32(w_raw) * c) * s. A head (<= 128
//                  rows) lies inside one n tile, so the amax is a CTA reduction.
//   kEpiIdxK (B1)  bf16(acc) -> LayerNorm (fp32 affine) -> RoPE leading dims -> bf16 -> per-token
//                  FP8 quant (floor 1e-4) -> k8, scale, and the paged index-K cache store.
// Epilogue option (in the epilogue id's upper bits, epi_with_rot; -DGLM5_SKINNY_ROT=n in the launchers):
//   rotation n     D1 / B1 only (n = head dim, 16..128): the normalised n-point Walsh-Hadamard transform of
//                  every (token, head) row after RoPE, before the amax / quant (SGLang 0.5.14's indexer,
//                  glm5_fastpath/ref/prefix.py): D1 rotates the fp32 q; B1 rotates the bf16 k in fp32 and
//                  rounds the result to bf16 again. SkinnyFinish::rotated_rows (csrc/common/hadamard.cuh).
//                  Without it (the default) the code is exactly the unrotated epilogue.
// Elementwise epilogue math uses explicit _rn intrinsics in the reference's operation order (no
// FMA contraction), so RoPE / affine results match the PyTorch reference bit for bit given the
// same inputs; only reduction orders (GEMM sums, norms) differ.
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/hadamard.cuh"
#include "../common/pdl.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/ptx_mma_fp8.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {
namespace skinny {

constexpr int kBlockN = 128;      // weight rows per CTA = one weight-scale block row
constexpr int kBlockK = 128;      // K per stage = one scale group
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kWStageBytes = kBlockN * kBlockK;
constexpr int kIndexKPage = 64;   // tokens per index-K cache page

enum : int { kEpiPlain = 0, kEpiQkvA = 1, kEpiQb = 2, kEpiIdxQ = 3, kEpiIdxK = 4 };

// An epilogue id with options: bits 0-3 the epilogue (kEpi* above), bits 4-7 log2 of the Hadamard rotation
// length (0: none). Plain ids are their own encoding, so every unrotated instantiation (and its symbol
// names) is unchanged.
__host__ __device__ constexpr int epi_base(int epi) { return epi & 15; }
__host__ __device__ constexpr int epi_rot(int epi) { return (epi >> 4) & 15 ? 1 << ((epi >> 4) & 15) : 0; }
__host__ __device__ constexpr int epi_with_rot(int epi, int rot) { return rot > 1 ? epi | (wht::ilog2(rot) << 4) : epi; }

// Launch parameters. Field order is the ABI of glm5_fastpath/ops/fp8_gemm.py (_Params, a
// ctypes.Structure): 8-byte fields first, then 4-byte fields, total a multiple of 8.
struct SkinnyParams {
    // GEMM operands
    const uint8_t* w;          // [N, K] e4m3 row-major
    const float* w_scale;      // [ceil(N/128), K/128] fp32
    const uint8_t* x;          // [M, K] e4m3 row-major
    const float* x_scale;      // [M, K/128] fp32 row-major
    float* partials;           // split-K workspace (fp32), >= tiles_n*tiles_m*splits*128*kTM floats
    int* counters;             // [tiles_n*tiles_m] split arrivals, then [tiles_m] row arrivals (B0); zero at rest
    // outputs (by epilogue)
    uint16_t* out_a;           // plain: y [M,N]; B0: q_lora [M,Q]; D0: q_nope [M,H,nope]
    uint16_t* out_b;           // B0: c_kv [M,KV]; D0: q_pe [M,H,R]
    uint16_t* out_c;           // B0: k_pe [M,R]
    uint8_t* out_fp8;          // B0: q_lora_fp8 [M,Q]; D1: q8 [M,H,D]; B1: k8 [M,D]
    float* out_scale;          // B0: q_lora_scale [M,Q/128]; D1: q_scale [M,H]; B1: k_scale [M]
    float* out_head_w;         // D1: head_w [M,H]
    uint8_t* cache;            // B1: index-K cache [pages, 64*(D+4)] bytes
    // epilogue inputs
    const uint16_t* norm_a;    // B0: q_a_norm [Q] bf16
    const uint16_t* norm_b;    // B0: kv_a_norm [KV] bf16
    const float* ln_w;         // B1: k_norm weight [D] fp32
    const float* ln_b;         // B1: k_norm bias [D] fp32
    const uint16_t* w_raw;     // D1: [M,H] bf16
    const void* positions;     // [M] int32 / int64 (flags bit 0)
    const void* slots;         // B1: out_cache_loc [M] int32 / int64 (flags bit 1)
    const float* rope_table;   // [rope_table_len, R/2, 2] fp32 (cos, sin) of positions 0..len-1
    int64_t rope_table_len;
    double rope_theta;         // for positions outside the table (float64 fallback)
    int32_t M, N, K, splits;
    int32_t tiles_n, tiles_m;
    int32_t dim_a;             // B0: q_lora_rank; D0/D1: head dim (nope+rope / index head dim); B1: head dim
    int32_t dim_b;             // B0: kv_lora_rank; D0: nope dim; D1: heads
    int32_t rope_dim;          // R (B0: k_pe width)
    int32_t flags;             // bit 0: positions int64; bit 1: slots int64
    float eps;                 // B0: rms eps; B1: LayerNorm eps
    float head_w_scale;        // D1: n_heads^-0.5 * head_dim^-0.5
};

GLM5_DEVICE uint32_t swz_w(int row, int chunk) { return static_cast<uint32_t>(row * 128 + ((chunk ^ (((row >> 1) & 1) << 2)) << 4)); }
GLM5_DEVICE uint32_t swz_x(int row, int chunk) { return static_cast<uint32_t>(row * 128 + ((chunk ^ ((row & 1) << 2)) << 4)); }

GLM5_DEVICE float bf16_round(float v) { return ptx::bf16lo_to_f32(ptx::f32x2_to_bf16x2_rn(v, 0.0f)); }

constexpr int kRopePairsMax = 32;     // rope_dim <= 64 (checked on the host)
constexpr int kHeadsPerTileMax = 8;   // head_dim >= 16

// Rotation transpose buffer (SkinnyFinish::rotated_rows): 2 slots (double buffer) x 8 token rows (one n8
// tile) x kRotRowStride floats (the tile's 128 features + 4 of padding: a half-warp's float2 stores,
// (g = 0..3 | 4..7, t = 0..3) at float 16*warp + 2g of row 2t + e, land on 16 distinct 8-byte bank slots;
// rows stay 16-byte aligned for the float4 reads).
constexpr int kRotRowStride = 132;
constexpr int kRotBufBytes = 2 * 8 * kRotRowStride * 4;

// Bytes of SkinnyFinish<kTM, kEpi>'s scratch (mirrored by glm5_fastpath/ops/fp8_gemm.py scratch_bytes);
// epi may carry options (epi_with_rot).
__host__ __device__ constexpr int finish_scratch_bytes(int tm, int epi_opts) {
    const int epi = epi_base(epi_opts);
    return 3 * kWarps * tm * 4 + 16                                        // red + flag
           + ((epi == 2 || epi == 3 || epi == 4) ? tm * kRopePairsMax * 8 + tm * 8 : 0)  // cs + positions
           + (epi == 4 ? tm * 8 : 0)                                       // slots
           + (epi == 3 ? tm * kHeadsPerTileMax * 4 : 0)                    // w_raw
           + (epi_rot(epi_opts) ? kRotBufBytes : 0);                       // rotation exchange
}
// Shared-memory carve-up of one CTA (dynamic smem, 128-byte aligned base).
template <int kTM, int kStages, int kEpi = 0>
struct SkinnySmem {
    static constexpr int kXStageBytes = kTM * kBlockK;
    static constexpr int kOffW = 0;
    static constexpr int kOffX = kOffW + kStages * kWStageBytes;
    static constexpr int kOffRed = kOffX + kStages * kXStageBytes;    // SkinnyFinish scratch
    static constexpr int kOffWs = kOffRed + finish_scratch_bytes(kTM, kEpi);  // float[gmax]
    __host__ __device__ static constexpr int off_xs(int gmax) { return kOffWs + (gmax * 4 + 15) / 16 * 16; }
    __host__ __device__ static constexpr int bytes(int gmax) { return off_xs(gmax) + gmax * kTM * 4; }
};

// Diagnostic variants (benchmarks/fp8_gemm_sweep.py only; kDiag = 0 is the real kernel). Results
// are NOT the GEMM; every variant ends in the plain bf16 store so nothing is optimised away.
//   kDiagLoadsOnly  cp.async ring + waits + barriers; per stage one ld.shared word per thread feeds
//                   acc (no MMA, no promotion); no split-K reduce (split 0 stores).
//   kDiagNoReduce   full mainloop; the split-K publish / counter / reduce is skipped (split 0 stores).
//   kDiagNoLoads    the K loop re-reads the prologue's stages (no cp.async in the loop): MMA +
//                   promotion + barriers cost; split 0 stores.
enum : int { kDiagOff = 0, kDiagLoadsOnly = 1, kDiagNoReduce = 2, kDiagNoLoads = 3 };

// Scratch shared memory of the split-K finish and the epilogues (inside each mainloop's carve-up).
struct Scratch {
    float* red;     // float[3][kWarps][kTM]: cross-warp reductions of the epilogues
    int* flag;      // one int: "this CTA finishes the tile / the token block"
    float2* cs;     // RoPE epilogues: float2[kTM][kRopePairsMax] (cos, sin) of each token's position
    int64_t* idx;   // D0/D1/B1: int64[kTM] positions; B1: then int64[kTM] cache slots
    float* wraw;    // D1: float[kTM][kHeadsPerTileMax] fp32(w_raw) of the tile's heads
    float* rot;     // rotation option: float[2][8][kRotRowStride] (rotated_rows)
};



// Where a CTA sits in the problem.
struct Coord {
    int tile_n, split, tile_m;
    int g_begin, nk;  // first K group and number of K groups of this split
    int gmax;         // ceil(G / splits): smem sizing
};

GLM5_DEVICE Coord make_coord(const SkinnyParams& p, int tile_n, int split, int tile_m) {
    const int G = p.K / kBlockK;
    Coord c;
    c.tile_n = tile_n;
    c.split = split;
    c.tile_m = tile_m;
    c.g_begin = static_cast<int>((static_cast<int64_t>(split) * G) / p.splits);
    c.nk = static_cast<int>((static_cast<int64_t>(split + 1) * G) / p.splits) - c.g_begin;
    c.gmax = (G + p.splits - 1) / p.splits;
    return c;
}

// CTA barrier of the kThreads (= 256) consumer threads 0..255 only: named barrier 1, so a CTA may
// hold extra warps (the wgmma mainloop's TMA producer warp) that never reach the epilogue. In
// the 256-thread mma.sync kernel this is equivalent to __syncthreads().
GLM5_DEVICE void consumer_sync() { ptx::named_barrier_sync<1, kThreads>(); }

// Split-K finish + epilogues shared by both mainloops (mma.sync: SkinnyGemmTile below; wgmma:
// fp8_gemm_wgmma.cuh). Input: the CTA's fp32 tile in the mma.sync fragment order, held by the
// 256 consumer threads (8 warps): thread tid, warp = tid / 32, g = lane / 4, t = lane % 4 holds
// acc[j][e] = y[feature tile_n*128 + 16*warp + 2g + (e >> 1)][token tile_m*kTM + 8j + 2t + (e & 1)].
// Phase-mark hook of the B1 / D1 epilogues (mark(k), k = kMarkEntry..kMarkRows): the MegaRTP megakernel's
// trace build stamps its instruction's phase marks there; every other caller passes NoMarks (no code).
struct NoMarks {
    GLM5_DEVICE void operator()(int) const {}
};
constexpr int kMarkEntry = 0;   // staged inputs visible (stage_wait done)
constexpr int kMarkStats = 1;   // B1: LayerNorm mean / variance reduced; D1: = kMarkAffine
constexpr int kMarkAffine = 2;  // normalised / RoPE'd tile in registers (before the rotation / quant)
constexpr int kMarkRows = 3;    // rotation builds: the rows quantised and stored

template <int kTM, int kEpi>
struct SkinnyFinish {
    static_assert(kTM == 8 || kTM == 16 || kTM == 32 || kTM == 64 || kTM == 128, "token block: 8..128");
    static constexpr int kBase = epi_base(kEpi);  // the epilogue; kEpi may carry options
    static constexpr int kRot = epi_rot(kEpi);    // Hadamard rotation length (0: none)
    static_assert(kRot == 0 || ((kBase == kEpiIdxQ || kBase == kEpiIdxK) && kRot >= 16 && kRot <= kBlockN),
                  "rotation: D1 / B1 only, 16..128 (a row spans whole warps of 16 features)");
    static_assert(kEpi == epi_with_rot(kBase, kRot), "unknown epilogue option bits");
    static constexpr int kNT = kTM / 8;  // n8 tiles per warp
    static constexpr int kRedFloats = kWarps * kTM;
    static constexpr int kScratchBytes = finish_scratch_bytes(kTM, kEpi);
    static constexpr bool kRope = kBase == kEpiQb || kBase == kEpiIdxQ || kBase == kEpiIdxK;

    static GLM5_DEVICE Scratch scratch(uint8_t* base) {
        Scratch s;
        s.red = reinterpret_cast<float*>(base);
        s.flag = reinterpret_cast<int*>(base + 3 * kRedFloats * 4);
        uint8_t* q = base + 3 * kRedFloats * 4 + 16;  // 16-byte aligned
        s.cs = reinterpret_cast<float2*>(q);
        q += kRope ? kTM * kRopePairsMax * 8 : 0;
        s.idx = reinterpret_cast<int64_t*>(q);
        q += kRope ? kTM * 8 : 0;
        q += kBase == kEpiIdxK ? kTM * 8 : 0;
        s.wraw = reinterpret_cast<float*>(q);
        q += kBase == kEpiIdxQ ? kTM * kHeadsPerTileMax * 4 : 0;
        s.rot = reinterpret_cast<float*>(q);
        return s;
    }

    // ---- epilogue inputs staged in shared memory while the K loop runs ---------------------------
    // The RoPE epilogues used to load positions[m] and then rope_table[pos] (and D1 w_raw, B1 slots)
    // per accumulator element, interleaved with the output stores: the compiler cannot move a load
    // above a store that may alias it, so each element paid two dependent L2 round trips in series
    // (kTM = 128: 64 of them), and the float64 fallback was inlined 64 times (40-byte stack, ~1500
    // DFMA). Now, right after griddepcontrol.wait:
    //   stage_pre     (consumer threads) positions / slots / w_raw -> smem with plain loads (one
    //                 round trip, overlapped with the ring's first fill);
    //   -- consumer barrier --
    //   stage_tables  (cos, sin) of every (token, rope pair) the tile needs -> smem by 8-byte
    //                 cp.async (fire and forget; the float64 formula for positions outside the table,
    //                 computed here once per (token, pair), not in the epilogue);
    //   stage_wait    (epilogue entry) cp.async.wait_all + consumer barrier.
    // The values are the same bits as before, so the epilogue math stays bit-identical.
    static GLM5_DEVICE void stage_pre(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid) {
        if constexpr (kRope) {
            const int m0 = c.tile_m * kTM;
            if (tid < kTM) {
                const int m = m0 + tid;
                sc.idx[tid] = m < p.M ? load_index(p.positions, p.flags & 1, m) : 0;
                if constexpr (kBase == kEpiIdxK) sc.idx[kTM + tid] = m < p.M ? load_index(p.slots, p.flags & 2, m) : 0;
            }
            if constexpr (kBase == kEpiIdxQ) {
                const int D = p.dim_a, H = p.dim_b;
                const int hpt = kBlockN / D, head0 = c.tile_n * kBlockN / D;
                for (int i = tid; i < kTM * hpt; i += kThreads) {
                    const int r = i / hpt, h = i - r * hpt;
                    const int m = m0 + r;
                    sc.wraw[r * kHeadsPerTileMax + h] =
                        m < p.M ? ptx::bf16lo_to_f32(static_cast<uint32_t>(p.w_raw[static_cast<int64_t>(m) * H + head0 + h])) : 0.0f;
                }
            }
        }
    }

    // Rope pair i is needed by this tile when some head's row of that pair lies in the tile.
    static GLM5_DEVICE bool tile_needs_pair(const SkinnyParams& p, const Coord& c, int i) {
        const int hd = p.dim_a;
        const int off = kBase == kEpiQb ? p.dim_b : 0;  // D0: rope dims trail the nope dims
        const int n0 = c.tile_n * kBlockN, n1 = min(n0 + kBlockN, p.N);
        for (int h = n0 / hd; h * hd < n1; ++h) {
            const int f = h * hd + off + 2 * i;
            if (f >= n0 && f < n1) return true;
        }
        return false;
    }

    static GLM5_DEVICE void stage_tables(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid) {
        if constexpr (kRope) {
            const int P = p.rope_dim >> 1;
            const int m_end = min(kTM, p.M - c.tile_m * kTM);
            const float2* table = reinterpret_cast<const float2*>(p.rope_table);
            for (int e = tid; e < kTM * kRopePairsMax; e += kThreads) {
                const int r = e / kRopePairsMax, i = e - r * kRopePairsMax;
                if (i >= P || r >= m_end || !tile_needs_pair(p, c, i)) continue;
                const int64_t pos = sc.idx[r];
                const uint32_t dst = ptx::smem_addr(sc.cs + e);
                if (pos >= 0 && pos < p.rope_table_len) {
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(table + (pos * P + i)) : "memory");
                } else {
                    sc.cs[e] = rope_cs_f64(p, pos, i);
                }
            }
        }
    }

    static GLM5_DEVICE void stage_wait() {
        if constexpr (kRope) {
            ptx::cp_async_wait<0>();
            consumer_sync();
        }
    }

    // ---- split-K: publish the partial, count arrivals; the last CTA reduces --------------------
    // Every split's CTA stores its fp32 tile in fragment order (a float4 per thread and n8 tile:
    // coalesced), fences, and bumps the tile's arrival counter; the LAST to arrive resets the
    // counter (graph replays need no memset) and sums the partials in split order 0..S-1
    // (bitwise deterministic whichever CTA is last). Returns false in every other CTA.
    static GLM5_DEVICE bool reduce_splits(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                          float (&acc)[kNT][4]) {
        if (p.splits == 1) return true;
        const int lane = tid & 31, warp = tid >> 5;
        const int tile = c.tile_m * p.tiles_n + c.tile_n;
        const int64_t tile_base = static_cast<int64_t>(tile) * p.splits;
        float* mine = p.partials + ((((tile_base + c.split) * kWarps + warp) * kNT) * 32 + lane) * 4;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
            ptx::st_cg_f32x4(mine + j * 32 * 4, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        __threadfence();
        consumer_sync();
        int* s_flag = sc.flag;
        if (tid == 0) {
            const int old = atomicAdd(p.counters + tile, 1);
            const int last = old == p.splits - 1;
            if (last) atomicExch(p.counters + tile, 0);  // self-reset for the next launch / graph replay
            *s_flag = last;
        }
        consumer_sync();
        if (!*s_flag) return false;
        __threadfence();
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
        for (int s = 0; s < p.splits; ++s) {  // fixed order: deterministic
            const float* src = p.partials + ((((tile_base + s) * kWarps + warp) * kNT) * 32 + lane) * 4;
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
                const float4 v = ptx::ld_cg_f32x4(src + j * 32 * 4);
                acc[j][0] += v.x;
                acc[j][1] += v.y;
                acc[j][2] += v.z;
                acc[j][3] += v.w;
            }
        }
        return true;
    }

    // ---- epilogue helpers -----------------------------------------------------------------
    // acc[j][e]: feature f = tile_n*128 + 16*warp + 2g + (e >> 1), token m = tile_m*kTM + 8j + 2t + (e & 1).

    static GLM5_DEVICE int64_t load_index(const void* base, bool is64, int i) {
        return is64 ? reinterpret_cast<const int64_t*>(base)[i] : static_cast<int64_t>(reinterpret_cast<const int32_t*>(base)[i]);
    }

    // (cos, sin) of rope pair i at position pos outside the host table: the reference formula in
    // float64 (never inlined: it only runs for out-of-table positions, once per (token, pair)).
    static __device__ __noinline__ float2 rope_cs_f64(const SkinnyParams& p, int64_t pos, int i) {
        const double inv = 1.0 / pow(p.rope_theta, static_cast<double>(2 * i) / static_cast<double>(p.rope_dim));
        const double ang = static_cast<double>(pos) * inv;
        return make_float2(static_cast<float>(cos(ang)), static_cast<float>(sin(ang)));
    }

    // out[2i] = x0*c - x1*s, out[2i+1] = x1*c + x0*s (each product rounded, as the reference).
    static GLM5_DEVICE void rope_pair(float& x0, float& x1, float2 cs) {
        const float o0 = __fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y));
        const float o1 = __fadd_rn(__fmul_rn(x1, cs.x), __fmul_rn(x0, cs.y));
        x0 = o0;
        x1 = o1;
    }

    // Per token of the CTA: reduce v[j][e] (e = token parity) over the 16 features of each warp
    // (lanes with the same t), then over warps [w0, w0 + nw) through the shared buffer `red`.
    template <bool kMax>
    static GLM5_DEVICE void cta_reduce(float (&v)[kNT][2], float* red, int w0, int nw, int tid) {
        const int lane = tid & 31, warp = tid >> 5, t = lane & 3;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = v[j][e];
#pragma unroll
                for (int off = 4; off < 32; off <<= 1) {
                    const float y = __shfl_xor_sync(0xffffffffu, x, off);
                    x = kMax ? fmaxf(x, y) : x + y;
                }
                v[j][e] = x;
            }
        if ((lane >> 2) == 0) {
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) red[warp * kTM + j * 8 + 2 * t + e] = v[j][e];
        }
        consumer_sync();
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = red[w0 * kTM + j * 8 + 2 * t + e];
                // A fixed bound with a uniform predicate: straight-line code. (The runtime bound nw was
                // unrolled with remainder loops into ~450 instructions per call, 60 % of B1's epilogue; in
                // the MegaRTP megakernel that code runs cold, at ~50 ns per 128-byte line.) Same order.
#pragma unroll
                for (int w = 1; w < kWarps; ++w) {
                    if (w < nw) {
                        const float y = red[(w0 + w) * kTM + j * 8 + 2 * t + e];
                        x = kMax ? fmaxf(x, y) : x + y;
                    }
                }
                v[j][e] = x;
            }
    }

    // ---- Hadamard rotation (epilogue option) --------------------------------------------------
    // D1 / B1 with kRot: after RoPE (B1: and the bf16 rounding) the tile goes through shared memory from
    // the accumulator's fragment layout (x[j][e] = feature 16*warp + 2g + (e >> 1) of token 8j + 2t + (e & 1))
    // to one token row per warp, 4 contiguous features per lane (features 4*lane .. 4*lane + 3), one n8
    // tile (8 tokens, one per warp) per round. There every (token, head) row of kRot features is kRot/4
    // aligned lanes, so the whole normalised Walsh-Hadamard transform is register butterflies + lane
    // shuffles (wht::transform_rows4), the per-row amax a shuffle reduction, and the FP8 / scale / cache
    // stores 4 contiguous bytes per lane (coalesced). The rounds are double-buffered (sc.rot): a slot is
    // rewritten two rounds later, after the next barrier, so one consumer barrier per round suffices.
    // `row(r, v)` gets token r (< m_end, warp-uniform) of the tile and this lane's rotated features v[0..3];
    // every consumer thread must call rotated_rows (barriers, shuffles).
    template <class RowFn>
    static GLM5_DEVICE void rotated_rows(const float (&x)[kNT][4], const Scratch& sc, int tid, int m_end, RowFn&& row) {
        static_assert(kRot >= 16, "rotated_rows: a rotation option is needed");
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
            float* buf = sc.rot + (j & 1) * 8 * kRotRowStride;
#pragma unroll
            for (int e = 0; e < 2; ++e)
                *reinterpret_cast<float2*>(buf + (2 * t + e) * kRotRowStride + 16 * warp + 2 * g) =
                    make_float2(x[j][e], x[j][e + 2]);
            consumer_sync();
            const int r = 8 * j + warp;
            if (r < m_end) {  // warp-uniform
                const float4 q = *reinterpret_cast<const float4*>(buf + warp * kRotRowStride + 4 * lane);
                float v[4] = {q.x, q.y, q.z, q.w};
                wht::transform_rows4<kRot>(v, lane);
                row(r, v);
            }
        }
    }

    // Max of |v| over the kRot / 4 lanes of this lane's row (rotated_rows layout).
    static GLM5_DEVICE float row_amax(const float (&v)[4]) {
        float a = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
        for (int mask = 1; mask < kRot / 4; mask <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, mask));
        return a;
    }

    // e4m3 of v[0..3] / s, packed in feature order (byte i = feature 4*lane + i).
    static GLM5_DEVICE uint32_t quant4(const float (&v)[4], float s) {
        const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(v[0] / s, v[1] / s);
        const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(v[2] / s, v[3] / s);
        return lo | (hi << 16);
    }

    // ---- epilogues ------------------------------------------------------------------------
    template <class Marks = NoMarks>
    static GLM5_DEVICE void epilogue(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                     float (&acc)[kNT][4], const Marks& mark = Marks{}) {
        stage_wait();  // staged positions / (cos, sin) / slots / w_raw visible to every consumer thread
        mark(kMarkEntry);
        if constexpr (kBase == kEpiPlain) {
            epi_plain(p, c, tid, acc);
        } else if constexpr (kBase == kEpiQkvA) {
            epi_qkv_a(p, c, sc, tid, acc);
        } else if constexpr (kBase == kEpiQb) {
            epi_q_b(p, c, sc, tid, acc);
        } else if constexpr (kBase == kEpiIdxQ) {
            epi_idx_q(p, c, sc, tid, acc, mark);
        } else {
            epi_idx_k(p, c, sc, tid, acc, mark);
        }
    }

    static GLM5_DEVICE void epi_plain(const SkinnyParams& p, const Coord& c, int tid, float (&acc)[kNT][4]) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int f = c.tile_n * kBlockN + warp * 16 + 2 * g;
        if (f >= p.N) return;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = c.tile_m * kTM + j * 8 + 2 * t + e;
                if (m < p.M)
                    *reinterpret_cast<uint32_t*>(p.out_a + static_cast<int64_t>(m) * p.N + f) =
                        ptx::f32x2_to_bf16x2_rn(acc[j][e], acc[j][e + 2]);
            }
    }

    // B0, part 1 (every tile): raw bf16 GEMM output to q_lora / c_kv (normalised in place later)
    // and k_pe (final). Part 2 (the last tile of a token block): the row epilogue.
    static GLM5_DEVICE void epi_qkv_a(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                      float (&acc)[kNT][4]) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int Q = p.dim_a, KV = p.dim_b, R = p.rope_dim;
        const int f = c.tile_n * kBlockN + warp * 16 + 2 * g;
        if (f < p.N) {
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int64_t m = c.tile_m * kTM + j * 8 + 2 * t + e;
                    if (m >= p.M) continue;
                    const uint32_t v = ptx::f32x2_to_bf16x2_rn(acc[j][e], acc[j][e + 2]);
                    uint16_t* dst = f < Q ? p.out_a + m * Q + f
                                  : f < Q + KV ? p.out_b + m * KV + (f - Q)
                                               : p.out_c + m * R + (f - Q - KV);
                    *reinterpret_cast<uint32_t*>(dst) = v;
                }
        }
        // Second-level arrival: the last n tile of this token block runs the row epilogue.
        __threadfence();
        consumer_sync();
        int* s_flag = sc.flag;
        if (tid == 0) {
            int* cnt = p.counters + p.tiles_n * p.tiles_m + c.tile_m;
            const int old = atomicAdd(cnt, 1);
            const int last = old == p.tiles_n - 1;
            if (last) atomicExch(cnt, 0);
            *s_flag = last;
        }
        consumer_sync();
        if (!*s_flag) return;
        __threadfence();
        const int m_end = min(p.M, (c.tile_m + 1) * kTM);
        for (int m = c.tile_m * kTM + warp; m < m_end; m += kWarps) qkv_a_row(p, m, lane);
    }

    // One token row of B0 by one warp: q_lora = RMSNorm(raw q) (in place), c_kv = RMSNorm(raw kv)
    // (in place), q_lora_fp8 / q_lora_scale = 1x128 quant of the bf16 q_lora.
    // Vector v (8 bf16) of a row belongs to lane v % 32; a 128-column group = 16 vectors = a half warp.
    static constexpr int kMaxQVecsPerLane = 8;   // q_lora_rank <= 2048
    static constexpr int kMaxKvVecsPerLane = 2;  // kv_lora_rank <= 512

    static GLM5_DEVICE void qkv_a_row(const SkinnyParams& p, int64_t m, int lane) {
        const int Q = p.dim_a, KV = p.dim_b;
        const int nq = Q / 8, nkv = KV / 8;
        uint16_t* qrow = p.out_a + m * Q;
        uint16_t* kvrow = p.out_b + m * KV;
        uint32_t qv[kMaxQVecsPerLane][4], kv[kMaxKvVecsPerLane][4];
        // Norm weights loaded with the row (one round trip): ld.global.nc below a st.global (asm
        // volatile, "memory") cannot be hoisted, so loading them inside the store loop serialised them.
        ptx::u32x4 gq[kMaxQVecsPerLane], gk[kMaxKvVecsPerLane];
#pragma unroll
        for (int i = 0; i < kMaxQVecsPerLane; ++i)
            if (i * 32 + lane < nq) gq[i] = ptx::ld_global_nc_v4(p.norm_a + (i * 32 + lane) * 8);
#pragma unroll
        for (int i = 0; i < kMaxKvVecsPerLane; ++i)
            if (i * 32 + lane < nkv) gk[i] = ptx::ld_global_nc_v4(p.norm_b + (i * 32 + lane) * 8);
        float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
        for (int i = 0; i < kMaxQVecsPerLane; ++i) {
            const int v = i * 32 + lane;
            if (v < nq) ptx::ld_cg_v4(qrow + v * 8, qv[i][0], qv[i][1], qv[i][2], qv[i][3]);
            else qv[i][0] = qv[i][1] = qv[i][2] = qv[i][3] = 0u;
        }
#pragma unroll
        for (int i = 0; i < kMaxKvVecsPerLane; ++i) {
            const int v = i * 32 + lane;
            if (v < nkv) ptx::ld_cg_v4(kvrow + v * 8, kv[i][0], kv[i][1], kv[i][2], kv[i][3]);
            else kv[i][0] = kv[i][1] = kv[i][2] = kv[i][3] = 0u;
        }
#pragma unroll
        for (int i = 0; i < kMaxQVecsPerLane; ++i)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float a = ptx::bf16lo_to_f32(qv[i][w]), b = ptx::bf16hi_to_f32(qv[i][w]);
                ssq = fmaf(a, a, ssq);
                ssq = fmaf(b, b, ssq);
            }
#pragma unroll
        for (int i = 0; i < kMaxKvVecsPerLane; ++i)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float a = ptx::bf16lo_to_f32(kv[i][w]), b = ptx::bf16hi_to_f32(kv[i][w]);
                ssk = fmaf(a, a, ssk);
                ssk = fmaf(b, b, ssk);
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            ssq += __shfl_xor_sync(0xffffffffu, ssq, off);
            ssk += __shfl_xor_sync(0xffffffffu, ssk, off);
        }
        const float rq = 1.0f / sqrtf(ssq / static_cast<float>(Q) + p.eps);
        const float rk = 1.0f / sqrtf(ssk / static_cast<float>(KV) + p.eps);

        uint8_t* q8row = p.out_fp8 + m * Q;
        float* qsrow = p.out_scale + m * (Q / 128);
#pragma unroll
        for (int i = 0; i < kMaxQVecsPerLane; ++i) {
            if (i * 32 >= nq) break;  // warp-uniform
            const int v = i * 32 + lane;
            const bool ok = v < nq;
            float y[8];
            float amax = 0.0f;
            ptx::u32x4 out;
            uint32_t* ow = &out.x;
            if (ok) {
                const uint32_t* gw = &gq[i].x;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const float a = __fmul_rn(__fmul_rn(ptx::bf16lo_to_f32(qv[i][w]), rq), ptx::bf16lo_to_f32(gw[w]));
                    const float b = __fmul_rn(__fmul_rn(ptx::bf16hi_to_f32(qv[i][w]), rq), ptx::bf16hi_to_f32(gw[w]));
                    ow[w] = ptx::f32x2_to_bf16x2_rn(a, b);
                    y[2 * w] = ptx::bf16lo_to_f32(ow[w]);
                    y[2 * w + 1] = ptx::bf16hi_to_f32(ow[w]);
                    amax = fmaxf(amax, fmaxf(fabsf(y[2 * w]), fabsf(y[2 * w + 1])));
                }
                ptx::st_global_v4(qrow + v * 8, out);
            } else {
#pragma unroll
                for (int w = 0; w < 8; ++w) y[w] = 0.0f;
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const float s = fmaxf(amax, 1e-10f) / 448.0f;
            if (ok) {
                uint32_t q[2];
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(y[4 * w] / s, y[4 * w + 1] / s);
                    const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(y[4 * w + 2] / s, y[4 * w + 3] / s);
                    q[w] = lo | (hi << 16);
                }
                ptx::st_global_v2(q8row + v * 8, q[0], q[1]);
                if ((lane & 15) == 0) qsrow[v / 16] = s;
            }
        }
#pragma unroll
        for (int i = 0; i < kMaxKvVecsPerLane; ++i) {
            const int v = i * 32 + lane;
            if (v >= nkv) continue;
            const uint32_t* gw = &gk[i].x;
            ptx::u32x4 out;
            uint32_t* ow = &out.x;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float a = __fmul_rn(__fmul_rn(ptx::bf16lo_to_f32(kv[i][w]), rk), ptx::bf16lo_to_f32(gw[w]));
                const float b = __fmul_rn(__fmul_rn(ptx::bf16hi_to_f32(kv[i][w]), rk), ptx::bf16hi_to_f32(gw[w]));
                ow[w] = ptx::f32x2_to_bf16x2_rn(a, b);
            }
            ptx::st_global_v4(kvrow + v * 8, out);
        }
    }

    // D0: q = bf16(acc) viewed [M, H, hd]; dims < nope -> q_nope; dims >= nope -> RoPE -> q_pe.
    // (cos, sin) from the staged smem table (stage_tables); the stores are fire-and-forget and no
    // global load follows them, so nothing serialises.
    static GLM5_DEVICE void epi_q_b(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                    float (&acc)[kNT][4]) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int hd = p.dim_a, nope = p.dim_b, R = p.rope_dim;
        const int H = p.N / hd;
        const int f = c.tile_n * kBlockN + warp * 16 + 2 * g;
        if (f >= p.N) return;
        const int head = f / hd, d = f - head * hd;
        const bool rope = d >= nope;
        const int m0 = c.tile_m * kTM;
        const int m_end = min(kTM, p.M - m0);
        uint16_t* dst = rope ? p.out_b + (static_cast<int64_t>(m0) * H + head) * R + (d - nope)
                             : p.out_a + (static_cast<int64_t>(m0) * H + head) * nope + d;
        const int64_t row_stride = rope ? static_cast<int64_t>(H) * R : static_cast<int64_t>(H) * nope;
        const float2* cs = sc.cs + (rope ? (d - nope) >> 1 : 0);
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = j * 8 + 2 * t + e;
                if (r >= m_end) continue;
                float x0 = bf16_round(acc[j][e]), x1 = bf16_round(acc[j][e + 2]);
                if (rope) rope_pair(x0, x1, cs[r * kRopePairsMax]);
                *reinterpret_cast<uint32_t*>(dst + r * row_stride) = ptx::f32x2_to_bf16x2_rn(x0, x1);
            }
    }

    // D1: q = bf16(acc) viewed [M, H, D]; RoPE on dims < R in fp32 (no rounding after); [kRot: fp32
    // Walsh-Hadamard of each (token, head) row;] per (token, head) s = max(amax, 1e-4)/448,
    // q8 = e4m3(q / s); head_w = (fp32(w_raw) * c) * s.
    template <class Marks>
    static GLM5_DEVICE void epi_idx_q(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                      float (&acc)[kNT][4], const Marks& mark) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int D = p.dim_a, H = p.dim_b, R = p.rope_dim;
        const int f = c.tile_n * kBlockN + warp * 16 + 2 * g;  // N = H*D is a multiple of 128 (checked on the host)
        const int head = f / D, d = f - head * D;
        const int m_end = min(kTM, p.M - c.tile_m * kTM);
        const float2* cs = sc.cs + (d >> 1);
        float x[kNT][4];
        float am[kNT][2];
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = j * 8 + 2 * t + e;
                float x0 = bf16_round(acc[j][e]), x1 = bf16_round(acc[j][e + 2]);
                if (d < R && r < m_end) rope_pair(x0, x1, cs[r * kRopePairsMax]);
                x[j][e] = x0;
                x[j][e + 2] = x1;
                if constexpr (kRot == 0) am[j][e] = fmaxf(fabsf(x0), fabsf(x1));
            }
        mark(kMarkStats);
        mark(kMarkAffine);
        if constexpr (kRot != 0) {  // the fp32 q of each (token, head), no rounding (ref.prefix.d1_head_epilogue)
            // Row layout (rotated_rows): lane holds features 4*lane.. of the tile; head rows of kRot = D.
            const int fr = c.tile_n * kBlockN + 4 * (tid & 31);
            const int hr = fr / D, dr = fr - hr * D;
            const int hlr = hr - c.tile_n * kBlockN / D;
            rotated_rows(x, sc, tid, m_end, [&](int r, const float (&v)[4]) {
                const int64_t m = static_cast<int64_t>(c.tile_m) * kTM + r;
                const float s = fmaxf(row_amax(v), 1e-4f) / 448.0f;
                *reinterpret_cast<uint32_t*>(p.out_fp8 + (m * H + hr) * D + dr) = quant4(v, s);
                if (dr == 0) {
                    const float wr = sc.wraw[r * kHeadsPerTileMax + hlr];
                    p.out_scale[m * H + hr] = s;
                    p.out_head_w[m * H + hr] = __fmul_rn(__fmul_rn(wr, p.head_w_scale), s);
                }
            });
            mark(kMarkRows);
            return;
        }
        const int wph = D / 16;  // warps per head
        float* red = sc.red;
        cta_reduce<true>(am, red, (warp / wph) * wph, wph, tid);
        const int hl = head - c.tile_n * kBlockN / D;  // head within the tile
        const int64_t m0 = c.tile_m * kTM;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = j * 8 + 2 * t + e;
                if (r >= m_end) continue;
                const int64_t m = m0 + r;
                const float s = fmaxf(am[j][e], 1e-4f) / 448.0f;
                const uint16_t q = ptx::f32x2_to_e4m3x2_satfinite(x[j][e] / s, x[j][e + 2] / s);
                *reinterpret_cast<uint16_t*>(p.out_fp8 + (m * H + head) * D + d) = q;
                if (d == 0) {
                    const float wr = sc.wraw[r * kHeadsPerTileMax + hl];
                    p.out_scale[m * H + head] = s;
                    p.out_head_w[m * H + head] = __fmul_rn(__fmul_rn(wr, p.head_w_scale), s);
                }
            }
    }

    // B1: key = bf16(acc) [M, D] (N = D <= 128: one tile); LayerNorm (fp32 affine); RoPE on dims < R;
    // bf16; [kRot: Walsh-Hadamard of the bf16 k in fp32, bf16 again;] s = max(amax, 1e-4)/448;
    // k8 = e4m3(k / s); store k8, s and the index-K cache entry.
    template <class Marks>
    static GLM5_DEVICE void epi_idx_k(const SkinnyParams& p, const Coord& c, const Scratch& sc, int tid,
                                      float (&acc)[kNT][4], const Marks& mark) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int D = p.dim_a, R = p.rope_dim;
        const int nw = D / 16;  // warps holding real features
        const int d = warp * 16 + 2 * g;
        const int m_end = min(kTM, p.M - c.tile_m * kTM);
        const float2* cs = sc.cs + (d >> 1);
        float* red = sc.red;
        float x[kNT][4];
        float r[kNT][2];
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                x[j][e] = bf16_round(acc[j][e]);
                x[j][e + 2] = bf16_round(acc[j][e + 2]);
                r[j][e] = __fadd_rn(x[j][e], x[j][e + 2]);
            }
        cta_reduce<false>(r, red, 0, nw, tid);  // warps >= nw hold zeros and are not summed
        float mean[kNT][2];
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                mean[j][e] = r[j][e] / static_cast<float>(D);
                const float d0 = __fsub_rn(x[j][e], mean[j][e]), d1 = __fsub_rn(x[j][e + 2], mean[j][e]);
                r[j][e] = __fadd_rn(__fmul_rn(d0, d0), __fmul_rn(d1, d1));
            }
        cta_reduce<false>(r, red + kRedFloats, 0, nw, tid);
        mark(kMarkStats);
        const bool live = warp < nw;
        float lw0 = 0.f, lw1 = 0.f, lb0 = 0.f, lb1 = 0.f;
        if (live) {
            lw0 = p.ln_w[d];
            lw1 = p.ln_w[d + 1];
            lb0 = p.ln_b[d];
            lb1 = p.ln_b[d + 1];
        }
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r_ = j * 8 + 2 * t + e;
                const float rstd = 1.0f / sqrtf(r[j][e] / static_cast<float>(D) + p.eps);
                float k0 = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[j][e], mean[j][e]), rstd), lw0), lb0);
                float k1 = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[j][e + 2], mean[j][e]), rstd), lw1), lb1);
                if (live && d < R && r_ < m_end) rope_pair(k0, k1, cs[r_ * kRopePairsMax]);
                k0 = live ? bf16_round(k0) : 0.0f;
                k1 = live ? bf16_round(k1) : 0.0f;
                x[j][e] = k0;
                x[j][e + 2] = k1;
                if constexpr (kRot == 0) r[j][e] = fmaxf(fabsf(k0), fabsf(k1));
            }
        mark(kMarkAffine);
        if constexpr (kRot != 0) {  // bf16 k -> fp32 rotation -> bf16 (ref.prefix.b1_key_epilogue)
            // Row layout (rotated_rows): lane holds features 4*lane.. of the key (D = kRot <= 128; lanes past D
            // hold the zeros of the warps past D and form their own rows, never stored).
            const int64_t page_bytes = static_cast<int64_t>(kIndexKPage) * (D + 4);
            const int dr = 4 * (tid & 31);
            rotated_rows(x, sc, tid, m_end, [&](int r_, const float (&v0)[4]) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = bf16_round(v0[i]);
                const float s = fmaxf(row_amax(v), 1e-4f) / 448.0f;
                if (dr >= D) return;
                const int m = c.tile_m * kTM + r_;
                const uint32_t q = quant4(v, s);
                *reinterpret_cast<uint32_t*>(p.out_fp8 + static_cast<int64_t>(m) * D + dr) = q;
                const int64_t slot = sc.idx[kTM + r_];
                uint8_t* page = p.cache + (slot / kIndexKPage) * page_bytes;
                const int64_t off = slot % kIndexKPage;
                *reinterpret_cast<uint32_t*>(page + off * D + dr) = q;
                if (dr == 0) {
                    p.out_scale[m] = s;
                    *reinterpret_cast<float*>(page + static_cast<int64_t>(kIndexKPage) * D + off * 4) = s;
                }
            });
            mark(kMarkRows);
            return;
        }
        cta_reduce<true>(r, red + 2 * kRedFloats, 0, nw, tid);
        if (!live) return;
        const int64_t page_bytes = static_cast<int64_t>(kIndexKPage) * (D + 4);
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r_ = j * 8 + 2 * t + e;
                if (r_ >= m_end) continue;
                const int m = c.tile_m * kTM + r_;
                const float s = fmaxf(r[j][e], 1e-4f) / 448.0f;
                const uint16_t q = ptx::f32x2_to_e4m3x2_satfinite(x[j][e] / s, x[j][e + 2] / s);
                *reinterpret_cast<uint16_t*>(p.out_fp8 + static_cast<int64_t>(m) * D + d) = q;
                const int64_t slot = sc.idx[kTM + r_];
                uint8_t* page = p.cache + (slot / kIndexKPage) * page_bytes;
                const int64_t off = slot % kIndexKPage;
                *reinterpret_cast<uint16_t*>(page + off * D + d) = q;
                if (d == 0) {
                    p.out_scale[m] = s;
                    *reinterpret_cast<float*>(page + static_cast<int64_t>(kIndexKPage) * D + off * 4) = s;
                }
            }
    }
};

// kLayoutEpi: the shared-memory carve-up (SkinnySmem) is that of epilogue kLayoutEpi (default kEpi). The
// MegaRTP megakernel runs the plain tile on the carve-up with the largest finish scratch, where its
// families stage their finish inputs themselves.
template <int kTM, int kStages, int kEpi, int kDiag = kDiagOff, int kLayoutEpi = kEpi>
struct SkinnyGemmTile {
    static_assert(kTM == 8 || kTM == 16 || kTM == 32 || kTM == 64, "token block: 8, 16, 32 or 64");
    static_assert(kStages >= 2 && kStages <= 8, "2..8 stages (cp.async.wait_group immediates)");
    static_assert(kDiag == kDiagOff || kEpi == kEpiPlain, "diagnostic variants use the plain epilogue");
    static_assert(kDiag >= kDiagOff && kDiag <= kDiagNoLoads, "diagnostic mode 0..3");
    static constexpr int kNT = kTM / 8;  // n8 MMA tiles per warp
    using Smem = SkinnySmem<kTM, kStages, kLayoutEpi>;
    static_assert(finish_scratch_bytes(kTM, kEpi) <= finish_scratch_bytes(kTM, kLayoutEpi), "kEpi's scratch must fit");

    using Finish = SkinnyFinish<kTM, kEpi>;

    static GLM5_DEVICE Coord coord(const SkinnyParams& p, int tile_n, int split, int tile_m) {
        return make_coord(p, tile_n, split, tile_m);
    }

    // ---- loads ----------------------------------------------------------------------------
    static GLM5_DEVICE void load_w_stage(const SkinnyParams& p, const Coord& c, uint32_t s_w, int stage, int slot,
                                         int tid) {
        const int n0 = c.tile_n * kBlockN;
        const int64_t kbyte = static_cast<int64_t>(c.g_begin + stage) * kBlockK;
        const uint32_t base = s_w + slot * kWStageBytes;
#pragma unroll
        for (int i = 0; i < kWStageBytes / 16 / kThreads; ++i) {
            const int ch = tid + i * kThreads;
            const int r = ch >> 3, cc = ch & 7;
            const int row = n0 + r;
            const bool ok = row < p.N;
            const uint8_t* src = p.w + (static_cast<int64_t>(ok ? row : 0) * p.K + kbyte + cc * 16);
            ptx::cp_async_16_weights(base + swz_w(r, cc), src, ok ? 16u : 0u);
        }
    }

    static GLM5_DEVICE void load_x_stage(const SkinnyParams& p, const Coord& c, uint32_t s_x, int stage, int slot,
                                         int tid) {
        const int m0 = c.tile_m * kTM;
        const int64_t kbyte = static_cast<int64_t>(c.g_begin + stage) * kBlockK;
        const uint32_t base = s_x + slot * Smem::kXStageBytes;
#pragma unroll
        for (int ch = tid; ch < kTM * 8; ch += kThreads) {
            const int r = ch >> 3, cc = ch & 7;
            const int tok = m0 + r;
            const bool ok = tok < p.M;
            const uint8_t* src = p.x + (static_cast<int64_t>(ok ? tok : 0) * p.K + kbyte + cc * 16);
            ptx::cp_async_16(base + swz_x(r, cc), src, ok ? 16u : 0u);
        }
    }

    // Before griddepcontrol.wait: weight stages 0..kStages-2 (one commit group each) and the
    // weight scales of this split. Nothing here reads the previous kernel's output.
    static GLM5_DEVICE void prologue(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid) {
        const uint32_t s_w = ptx::smem_addr(smem + Smem::kOffW);
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (s < c.nk) load_w_stage(p, c, s_w, s, s, tid);
            ptx::cp_async_commit();
        }
        float* s_ws = reinterpret_cast<float*>(smem + Smem::kOffWs);
        const int G = p.K / kBlockK;
        for (int i = tid; i < c.nk; i += kThreads) s_ws[i] = __ldg(p.w_scale + static_cast<int64_t>(c.tile_n) * G + c.g_begin + i);
    }

    // After griddepcontrol.wait: activations, the K loop, split-K reduction. Returns false when
    // this CTA is not the one that finishes the tile (it then has nothing more to do).
    static GLM5_DEVICE bool mainloop(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid,
                                     float (&acc)[kNT][4]) {
        const int lane = tid & 31, warp = tid >> 5;
        const int g = lane >> 2, t = lane & 3;
        const uint32_t s_w = ptx::smem_addr(smem + Smem::kOffW);
        const uint32_t s_x = ptx::smem_addr(smem + Smem::kOffX);
        const float* s_ws = reinterpret_cast<const float*>(smem + Smem::kOffWs);
        float* s_xs = reinterpret_cast<float*>(smem + Smem::off_xs(c.gmax));
        const int G = p.K / kBlockK;
        const int m0 = c.tile_m * kTM;

#pragma unroll
        for (int s = 0; s < kStages - 1; ++s)
            if (s < c.nk) load_x_stage(p, c, s_x, s, s, tid);
        ptx::cp_async_commit();
        for (int i = tid; i < c.nk * kTM; i += kThreads) {
            const int gi = i / kTM, r = i % kTM;
            const int tok = m0 + r;
            s_xs[i] = tok < p.M ? p.x_scale[static_cast<int64_t>(tok) * G + c.g_begin + gi] : 0.0f;
        }
        if constexpr (Finish::kRope) {  // epilogue inputs -> smem while the K loop runs (see SkinnyFinish)
            const Scratch sc = Finish::scratch(smem + Smem::kOffRed);
            Finish::stage_pre(p, c, sc, tid);
            consumer_sync();
            Finish::stage_tables(p, c, sc, tid);  // joins the loop's first cp.async group
        }

#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

        // Row offsets (bytes) of this thread's fragments inside a stage.
        const int ra0 = warp * 16 + 2 * g;  // weight row 2g of the warp -> MMA row g
        const int ra1 = ra0 + 1;            // weight row 2g+1 -> MMA row g+8

        for (int it = 0; it < c.nk; ++it) {
            // Groups committed so far: (kStages-1) weight groups + 1 activation group + it loop groups.
            // Stage it is complete once at most min(it, kStages-2) groups are pending.
            ptx::cp_async_wait_dyn(it < kStages - 2 ? it : kStages - 2);
            __syncthreads();  // stage `it` visible to all warps; slot (it-1) % kStages free
            {
                const int nxt = it + kStages - 1;
                if (kDiag != kDiagNoLoads && nxt < c.nk) {
                    const int slot = nxt % kStages;
                    load_w_stage(p, c, s_w, nxt, slot, tid);
                    load_x_stage(p, c, s_x, nxt, slot, tid);
                }
                ptx::cp_async_commit();
            }
            const int slot = kDiag == kDiagNoLoads ? it % (kStages - 1) : it % kStages;
            const uint32_t w_st = s_w + slot * kWStageBytes;
            const uint32_t x_st = s_x + slot * Smem::kXStageBytes;
            if constexpr (kDiag == kDiagLoadsOnly) {
                uint32_t a, b, cc, d;
                ptx::lds_v4(w_st + tid * 16, a, b, cc, d);
                acc[0][0] += __uint_as_float((a ^ b ^ cc ^ d) & 0x3f7fffffu);
                acc[0][1] += __uint_as_float(*reinterpret_cast<const uint32_t*>(smem + Smem::kOffX + slot * Smem::kXStageBytes
                                                                                + (tid % (kTM * 32)) * 4) & 0x3f7fffffu);
                continue;
            }

            float part[kNT][4];
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[j][e] = 0.0f;

#pragma unroll
            for (int kc = 0; kc < 2; ++kc) {  // two 64-byte K chunks per 128-byte stage row
                const int chunk = kc * 4 + t;
                uint32_t a0[4], a1[4];
                ptx::lds_v4(w_st + swz_w(ra0, chunk), a0[0], a0[1], a0[2], a0[3]);
                ptx::lds_v4(w_st + swz_w(ra1, chunk), a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
                for (int j = 0; j < kNT; ++j) {
                    uint32_t b[4];
                    ptx::lds_v4(x_st + swz_x(j * 8 + g, chunk), b[0], b[1], b[2], b[3]);
                    ptx::mma_m16n8k32_e4m3(part[j], a0[0], a1[0], a0[1], a1[1], b[0], b[1]);
                    ptx::mma_m16n8k32_e4m3(part[j], a0[2], a1[2], a0[3], a1[3], b[2], b[3]);
                }
            }
            // Promotion: acc += partial * (xs[token, g] * S[tile, g]).
            const float ws = s_ws[it];
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
                const float s0 = s_xs[it * kTM + j * 8 + 2 * t] * ws;
                const float s1 = s_xs[it * kTM + j * 8 + 2 * t + 1] * ws;
                acc[j][0] = fmaf(part[j][0], s0, acc[j][0]);
                acc[j][1] = fmaf(part[j][1], s1, acc[j][1]);
                acc[j][2] = fmaf(part[j][2], s0, acc[j][2]);
                acc[j][3] = fmaf(part[j][3], s1, acc[j][3]);
            }
        }
        ptx::cp_async_wait<0>();  // nothing may be in flight into smem when the CTA moves on / exits
        if (p.splits == 1) return true;
        if constexpr (kDiag != kDiagOff) return c.split == 0 || acc[0][0] == 1234.5f;  // keep the work alive
        return Finish::reduce_splits(p, c, Finish::scratch(smem + Smem::kOffRed), tid, acc);
    }

    static GLM5_DEVICE void epilogue(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid,
                                     float (&acc)[kNT][4]) {
        Finish::epilogue(p, c, Finish::scratch(smem + Smem::kOffRed), tid, acc);
    }
};

}  // namespace skinny
}  // namespace attn_pre
}  // namespace glm5
