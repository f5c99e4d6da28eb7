// MegaMoE for Hopper (sm_90a): one persistent, warp-specialised, fused FP8 MoE kernel (FC1 + SwiGLU +
// 1x128 FP8 requant + FC2 + routing weight + deterministic top-k combine), plus the small in-graph plan
// kernel that turns topk_ids into per-expert token lists and an ordered task list. Tile/role functions
// only; the thin __global__ launchers are in megamoe.cu, the host side in glm5_fastpath/moe/megamoe.py.
//
// Math (glm5_fastpath/ref/moe.py, rounding point by rounding point):
//   pair (t, j): expert e = topk_ids[t, j] (j < k) or the shared expert E_local (j == k), weight
//                w = topk_weights[t, j] or fp32(1 / routed_scaling) for the shared expert
//   FC1        gu = bf16(sum_g xs[t,g] * S13[row/128, g] * x8[t, g] . W13[row, g])   (fp32 accumulate)
//   act        a  = bf16(silu(g) * u); a8, as = 1x128 quant of a (as = max(amax, 1e-10) / 448, a8 = fp8(a / as))
//   FC2        y  = bf16((sum_g as[g] * S2[n/128, g] * a8 . W2[n]) * w)             -> slot buffer (t, j)
//   combine    out[t] = bf16(rsf * sum_{j = 0..S-1} fp32(y[t, j]))                    fixed slot order
//
// Work decomposition (narrow builds, kBN <= 64: all tasks cover 256 weight rows, 128 K per pipeline stage; the wide
// build's differences are listed below):
//   FC1 task (e, rt, b): rows [256 rt, 256 rt + 256) of the gate/up weight interleaved by 8 rows
//     ([g0..7, u0..7, g8..15, u8..15, ...], gathered in that order by one 5-D TMA box from the natural
//     gate || up layout: no weight copy) = intermediate channels
//     [128 rt, 128 rt + 128) = exactly one 1x128 quant group of FC2's input; token block b (kBN tokens)
//     of expert e. 48 K stages (H = 6144). Writes a8 rows + their scales, then fc1_done[e, b] += 1.
//   FC2 task (e, rt, b): output rows [256 rt, 256 rt + 256); 16 K stages (I = 2048); waits until
//     fc1_done[e, b] == I / 128 (all FC1 tiles of that token block); writes bf16 weighted slot values,
//     then the last of the S contributors of (token, rt) reduces the S slots in order into `out`.
//   swapAB: weight rows on the wgmma M side (m64 x 2 per math warpgroup), tokens on N = kBN.
//   Wide mode (kBN = 128, MegaMoE::kWide): 128-row wgmma tiles (one m64 half per math warpgroup). An FC1 task still
//   covers its 256-row quant group, as two 128-row passes of 48 stages; FC2 tasks are 128 output rows (H / 128 of them
//   per token block, combine counters per 128 channels).
//
// CTA = 3 warpgroups (384 threads), one CTA per SM, persistent, tasks claimed dynamically with one
// global atomic in list order (the plan orders FC1 of expert group g+1 before FC2 of group g):
//   WG0 warp 0  weight producer + scheduler: claims a task, publishes it in a 4-slot smem task ring,
//               streams its weight tiles with TMA (32 KB boxes; wide: 16 KB; 128B swizzle) into the stage ring.
//               Never waits on a cross-CTA counter.
//   WG0 warps 1-3 activation loaders (kLoaderWarps): per task, warp 1 puts the column info (pair codes,
//               routing weights) into the task slot; for FC2 each spins on fc1_done (acquire) first; they
//               gather the token block's activation rows (FC1: x8 rows by token id; FC2: contiguous a8 rows)
//               and their scales with 16-byte cp.async (manual 128B swizzle) into the same stage, rows split
//               over the warps, arriving with cp.async.mbarrier.arrive. (Pool build, kPool: they first copy every
//               pair's token row into an expert-grouped pool; each stage's rows are then one TMA box.)
//   WG1, WG2    math: each owns 128 of the 256 weight rows (two m64 halves; wide: 64 of 128, one half) x kBN tokens; per stage 4 k32
//               wgmma per half into a temporary, then acc += tmp * (x_scale[token] * w_scale[block]);
//               fused epilogues (SwiGLU/quant for FC1, weight/slot store/combine for FC2).
// Deadlock freedom: tasks are processed in claim order per CTA and every FC2 task depends only on FC1
// tasks earlier in the global list, so the earliest unfinished claimed task can always progress, whichever CTAs are
// running. The pool build adds a grid-wide wait (every copy warp's share of the pool, ctrl[5]): it needs all CTAs resident
// at once (one CTA per SM, as launched; not under MPS / green-context SM limits or next to a kernel that waits for
// this one). A work-stealing copy (a global row cursor) would lift that; not built.
//
// Counters (graph-replay safe, no memset): the plan kernel (which waits for the previous grid with
// griddepcontrol.wait) zeroes the claim counter and the fc1_done counters it uses; the combine
// counters return to zero when their last contributor resets them (the end combine, kFlagEndCombine, uses none: its
// grid-wide done count ctrl[6] is zeroed by the plan kernel like ctrl[5]). Diagnostics: after a launch
// ctrl[2] (tasks finished) == ctrl[0] (tasks planned), ctrl[1] (claims) == ctrl[0] + grid size
// (each CTA's last claim finds the end), ctrl[3] (output tiles combined) == M * H / stage_rows(kBN).
#pragma once

#include <cuda.h>
#include <stdio.h>

#include "../common/arch.cuh"
#include "../common/cluster.cuh"
#include "../common/convert.cuh"
#include "../common/pdl.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/sm90_tma.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/vec_io.cuh"

// GLM5_MEGAMOE_PLAN_ACTIVE=1 (GLM5_FASTPATH_MOE_PLAN_ACTIVE=1, opt-in, its own cubin): the plan's task phase deals the
// active experts over the warps (a compact list the scan writes) instead of every expert id (warp w: ids w, w + 32,
// ...), so no warp gets more than ceil(active / warps) experts. Why: at 8 tokens (58 active of 257) the task phase took
// 3.97-4.15 us against 1.09 at 1 token (session 38 trace builds); the guess: with ids dealt round-robin the busiest of
// the 32 warps draws 4-5 active experts, each a chain of shared-memory reads and divisions. The task list is the same
// either way (each expert's tasks go to positions fixed by the scan), so the outputs are bitwise the same.
#ifndef GLM5_MEGAMOE_PLAN_ACTIVE
#define GLM5_MEGAMOE_PLAN_ACTIVE 0
#endif
#ifndef GLM5_MEGAMOE_SPIN_LIMIT_CYCLES
#define GLM5_MEGAMOE_SPIN_LIMIT_CYCLES (1ull << 34)  // ~9 s: a lost fc1_done arrival fails loudly
#endif
// Define GLM5_MEGAMOE_TIMEOUT_PRINTF to print the fc1_done wait's state before its trap. Opt-in: the
// printf costs the loader warp (small register budget) a stack frame and spills (as GLM5_MBAR_TIMEOUT_PRINTF).

namespace glm5 {
namespace moe {
namespace megamoe {

constexpr int kThreads = 384;      // WG0 producers, WG1 + WG2 math
constexpr int kMathThreads = 256;  // two math warpgroups
constexpr int kTileRows = 256;     // weight rows of an FC1 task (one 128-channel quant group) and of a narrow FC2 task
constexpr int kBK = 128;           // K per stage = one FP8 scale block
constexpr int kWideBN = 128;       // the wide token block: 128-row wgmma tiles (see MegaMoE::kWide)
// Weight rows per pipeline stage (= per wgmma tile): 256 for token blocks up to 64, 128 for the wide block.
__host__ __device__ constexpr int stage_rows(int bn) { return bn == kWideBN ? 128 : kTileRows; }
constexpr int kTaskSlots = 4;      // smem task ring depth
constexpr int kMaxExperts = 512;   // 9-bit expert field of a task descriptor
constexpr int kPlanStampBase = 8;  // trace build: ctrl[8..19] hold the plan's phase stamps (MegaMoE::plan_stamp)
constexpr int kPlanStamps = 12;
constexpr int kMaxSlots = 16;      // slots per token (top-k + shared), 4-bit field of a pair code
constexpr int kPairAlign = 8;      // each expert's pair range starts at a multiple of 8
constexpr int kSplitMaxBN = 16;    // split-K FC1 tiles only for token blocks up to 16 (partial scratch size)
constexpr int kPlanThreads = 1024;
// setmaxnreg split: 56 * 128 + 224 * 256 = 64512 = 168 * 384, the launch allocation (.inc can only take
// what .dec released). NOTES: 40 / 232 spilled the loader warp (28-32 B) once the FC2 path was reachable.
constexpr int kProducerRegs = 56;
constexpr int kMathRegs = 224;
static_assert(kProducerRegs * 128 + kMathRegs * kMathThreads <= 65536 / kThreads / 8 * 8 * kThreads,
              "register split exceeds the launch allocation");
constexpr int kMathBarrier = 1;    // named barrier of the 256 math threads
// Activation loader warps (WG0 warps 1..kLoaderWarps; the rest of WG0 but warp 0 idles). Its own cubin per value.
#ifndef GLM5_MEGAMOE_LOADER_WARPS
#define GLM5_MEGAMOE_LOADER_WARPS 3
#endif
constexpr int kLoaderWarps = GLM5_MEGAMOE_LOADER_WARPS;
// Warps per CTA that copy the token pool at kernel start (pool builds): the loader warps and the 8 math warps (the math
// has nothing to do before the pool is complete, and its registers hold a whole row's loads in flight).
constexpr int kPoolCopyWarps = kLoaderWarps + 8;
static_assert(kLoaderWarps >= 1 && kLoaderWarps <= 3, "activation loader warps: WG0 warps 1..3");

// Trace build (GLM5_MEGAMOE_TRACE=1, a separate cubin; glm5_fastpath/moe/megamoe.py trace_run): per CTA and
// claimed task n < trace_cap, one row of kTraceCols int64 in trace[cta][n][:]:
//   0 claim (scheduler, %globaltimer ns)
//   1 fc1_done spin start, 2 spin end (loader, clock64; FC2 tasks that had to wait)
//   3 math start (descriptor seen), 4 first stage landed, 5 last MMA folded, 6 epilogue done (math, clock64)
//   7 the task descriptor
//   8 math start, 9 epilogue done (%globaltimer ns: lines CTAs up; it may tick only every ~1 us)
//   10 math: cycles waiting for stages 1.. of the K loop (full barrier: weights and activations landed)
//   11 weight producer: cycles waiting for free stages (empty barrier) while streaming this task
//   12 activation loader (warp 1, the first loader warp): cycles waiting for free stages (empty barrier) while loading
//   this task (columns 1 / 2 are warp 1's fc1_done spin too)
//   13 / 14 / 15 FC1 epilogue phases (math, clock64): SwiGLU + amax exchanged (first barrier), FP8 quant staged in
//   shared memory (second barrier), a8 rows stored (before the fc1_done release); split-K tiles stamp them only
//   on the finisher that runs the epilogue. FC2 tasks: slot values stored (this thread's stores issued), combine
//   counters counted (after the barrier that follows the atomics), 15 unused (the combine ends at column 6)
//   16 math: cycles in the K loop's wgmma waits (wait_group: the tensor cores behind), 17 math: cycles issuing the
//   folds (from the wait's return to the fold's last instruction issued; LDS of the column scales included)
//   (which side waits tells whether the K loop is bound by the loads (10 high, 11 / 12 low) or by the math
//   (10 low, 11 / 12 high); 11 high with 12 low points at the activation loader)
//   Since the per-task wgmma width (session 9) the math reads the task's column info before its K loop, so
//   column 4 - column 3 (first stage) includes that (short) wait too.
// Durations inside a task use the SM's clock64 (cycles; comparable within one CTA), the cross-CTA span the
// global timer. Unwritten cells stay as the host filled them (0). The normal build compiles none of it.
#ifndef GLM5_MEGAMOE_TRACE
#define GLM5_MEGAMOE_TRACE 0
#endif
constexpr bool kTrace = GLM5_MEGAMOE_TRACE != 0;

// Lean fences (GLM5_MEGAMOE_LEAN_FENCES=1, its own cubin; MegaMoEConfig.lean_fences). Three cross-CTA hand-offs
// (split-K FC1 partials, fc1_done, the combine's slot values) pass through five handoff_fence() sites. The lean
// build publishes with the math threads' named barrier + ONE releasing atomic (atom.acq_rel / red.release .gpu)
// and consumes with ONE acquiring atomic / ld.acquire + barrier. That is enough under the PTX memory model:
// bar.sync (named or not) synchronizes its participants; release -> acquire at gpu scope synchronizes through the
// counter's RMW chain; base causality order is transitive ("cumulativity"), so the weak data stores before the
// barrier are ordered before the loads after it (PTX ISA, memory consistency model: synchronizes-with, base
// causality order). CUTLASS's GenericBarrier and cooperative-groups grid sync use the same pattern. The default
// build keeps a fence.gpu (__threadfence) in every thread at each site as well (formally redundant). Why lean: at
// 1 token the FC1 epilogue (split exchange + quant + fc1_done) averaged ~8 us per task on the H200 (session 7
// trace), longer than the 6-stage weight ring covers, and the per-thread fences wait under full HBM load. The
// fc1_done consumer (the FC2 loader warp) has every lane acquire the counter itself (no reliance on __syncwarp
// carrying lane 0's acquire), in both builds.
#ifndef GLM5_MEGAMOE_LEAN_FENCES
#define GLM5_MEGAMOE_LEAN_FENCES 0
#endif
constexpr bool kLeanFences = GLM5_MEGAMOE_LEAN_FENCES != 0;
// Token pool (GLM5_MEGAMOE_POOL=1, its own cubin; MegaMoEConfig.pool): the dispatch target of the design. At kernel
// start the loader warps of all CTAs copy every pair's token row (x8 [t], 6 KB, and its 48 scales) into its pair row of
// a pool [pairs_cap, H] (the expert-grouped order of pair_list), then count themselves done; FC1's activations are then
// one contiguous run of pool rows per token block, loaded with ONE 2-D TMA box {128, kBN} per stage (as FC2's from act
// [pairs_cap, I]), instead of kBN x 8 16-byte cp.async gathers. Why: at (a) 1024 tokens the loader warps almost never
// waited for free stages (4 of 45 us per FC1 task) while the math waited 14 us for full ones and the weight producer
// 40 us for free ones (session-11 trace): the gathers set the pace. (One TMA box per token ROW was tried first:
// bitwise equal and 26-31 % slower, the TMA unit's per-request cost.) The pool and act rows are written through the
// generic proxy and read through the async proxy (TMA), so their hand-offs carry proxy fences on both sides. The
// activation scales stay on cp.async (4 per 16-byte copy, as FC2's).
#ifndef GLM5_MEGAMOE_POOL
#define GLM5_MEGAMOE_POOL 0
#endif
constexpr bool kPool = GLM5_MEGAMOE_POOL != 0;

// Diagnostic builds (GLM5_MEGAMOE_DIAG, a bit mask, its own cubin; MegaMoEConfig.diag, name suffix "_d<mask>", for
// `bench moe --configs` only: the outputs are meaningless). They time the kernel with parts removed, to see where the
// time goes (docs/megamoe_large_m.md, session 11):
//   1 no loads: the weight producer and the activation loaders arrive on the stage barriers without loading anything
//     (the stages are zeroed at start, so the math folds zeros: no NaN slow paths; a pool build still copies its pool);
//   2 no epilogues: FC1 tasks only release fc1_done (after the math barrier), FC2 tasks write nothing;
//   4 no folds: each wgmma temporary is consumed by one add instead of the scaled fold.
#ifndef GLM5_MEGAMOE_DIAG
#define GLM5_MEGAMOE_DIAG 0
#endif
constexpr bool kNoLoad = (GLM5_MEGAMOE_DIAG & 1) != 0;
constexpr bool kNoEpilogue = (GLM5_MEGAMOE_DIAG & 2) != 0;
constexpr bool kNoFold = (GLM5_MEGAMOE_DIAG & 4) != 0;
// Token-major wide build (GLM5_MEGAMOE_TOKEN_MAJOR=1 with the wide block, its own cubin; MegaMoEConfig.token_major, name
// suffix "_t"). The wgmma operands swap roles: each math warpgroup takes 64 of the block's 128 tokens on the M side and
// all 128 weight rows of the stage on N (m64n128k32, A = tokens, B = weights; same shared-memory stages, same bytes per
// MAC). Why: with tokens on N (swapAB) the fold's activation scale is per column, so every thread reads 32 column
// scales per stage and forms 64 products (16 LDS.64 + 64 FMUL + 64 FFMA per stage and thread; the scale loads were
// ~34 % of the shared-memory wavefronts of the wide build at (a) 1024 tokens, Nsight Compute, session 13). Token-major,
// the scale is per row: 2 token scales x the gate / up block scale = 4 products, then one FFMA per element. FC1's
// per-token quant amax stays inside a warp (4 lanes), FC2 writes each token's channels with a 4-lane transpose.
#ifndef GLM5_MEGAMOE_TOKEN_MAJOR
#define GLM5_MEGAMOE_TOKEN_MAJOR 0
#endif
// Expert parallelism (GLM5_MEGAMOE_EP=1, its own cubin; glm5_fastpath/moe/ep/kernel.py, docs/megamoe_ep.md; issue #8):
// one kernel per rank, the ranks' symmetric buffers (torch symmetric memory: the same layout at every rank, mapped into
// every peer) addressed through Params::peer and the Params::sym_* offsets. Pool builds with the end combine only. Per call:
//   plan      entry barrier (epoch: st.release.sys ready[me] at every peer, ld.acquire.sys all ready[r]), then it gathers
//             every rank's token count, topk ids and weights into the local workspace and plans this rank's pairs: the
//             routed pairs whose expert it owns (global id / e_local == rank) + the shared pairs of its own tokens.
//             Pair code = (src << kEpTokBits | t) << 4 | j; the routing weight of pair row r goes to pair_weight[r].
//   dispatch  the pool copy pulls each pair's token row (x8 + scales) from the source rank's symmetric buffer (NVLink).
//   FC2       mode A (ep_mode 0): slot values go straight to the SOURCE rank's symmetric slot buffer (16-byte remote
//             stores); mode B (1): into this rank's symmetric out_pool by pair row, whose location the plan kernel wrote
//             into the source's pair_loc.
//   combine   after its last task a CTA counts itself done; the last CTA of the rank releases done[me] = epoch at every
//             peer (.sys); every rank's math warps wait for done[r] == epoch of all ranks, then combine their own tokens
//             (mode B: reading the owners' out_pool rows).
// No host synchronisation, CUDA-graph safe (the epoch lives in device memory). Every rank must call, also with M = 0.
#ifndef GLM5_MEGAMOE_EP
#define GLM5_MEGAMOE_EP 0
#endif
constexpr bool kEP = GLM5_MEGAMOE_EP != 0;
// CTA pairs (GLM5_MEGAMOE_PAIR=1, its own cubin; MegaMoEConfig.pair, name suffix "_c"): the grid is launched as clusters of
// two CTAs that claim the task list two entries at a time (rank 0's weight producer claims, forwards the index to rank 1
// through distributed shared memory; rank r runs entry index + r). The plan lists a split-K FC1 tile's two K halves at
// (even, odd) positions (every segment of the list has an even length when FC1 tiles are split), so both halves of a tile
// land on the two CTAs of one cluster at the same time, and the hand-off is a DSMEM transfer instead of split_exchange's
// global round trips: rank 1 st.async's its fp32 partial into rank 0's shared memory (completing the bytes on rank 0's
// barrier), rank 0 adds it and runs the epilogue. Why: at 1 token the global hand-off (stores, a releasing atomic, the
// partner's loads, all queued behind the SM's in-flight weight stream) took ~5.5 us per FC1 tile (session 30's trace),
// and FC2 tasks spun on those tiles' fc1_done. The same sums (a + b, commutative): bitwise equal to the unpaired build.
// A pair whose two entries are not the halves of one tile (cannot happen with the plan above; checked anyway) falls back
// to split_exchange. Narrow, non-pool, non-token-major, single-GPU builds with split-K blocks (kBN <= kSplitMaxBN) only.
// Measured (H200, session 33): bitwise equal, and no faster: 82.5 / 81.9 against 83.0 / 81.4 us at 1 token (settings b /
// a); rank 0 waits for the slower half (the trace's FC1 epilogue 3.9 against 5.4 us per task, the gain eaten by later
// fc1_done spins), and claiming two entries at a time costs 5-7 % where nothing is split. A first-finisher variant
// (either rank runs the epilogue, a DSMEM counter decides) was 4.5 us SLOWER at 1 token and was reverted. Opt-in; kept
// as the cluster base for weight multicast across a CTA pair.
#ifndef GLM5_MEGAMOE_PAIR
#define GLM5_MEGAMOE_PAIR 0
#endif
constexpr bool kPair = GLM5_MEGAMOE_PAIR != 0;
constexpr int kMaxRanks = 8;
constexpr int kEpTokBits = 20;  // token field of an EP pair code's token part (src << 20 | t)
// int32 words of the symmetric signal block (EpParams::sym_sig): epoch (the local call counter), num_tokens of the current
// call, ready[kMaxRanks] (entry barrier: written by the peers), done[kMaxRanks] (exit barrier: written by the peers).
constexpr int kSigEpoch = 0, kSigTokens = 1, kSigReady = 2, kSigDone = 2 + kMaxRanks, kSigWords = 2 + 2 * kMaxRanks;
constexpr int kTraceCols = 18;
struct TraceBuf {
    int64_t* rows;  // [gridDim.x][cap][kTraceCols] or nullptr
    int32_t cap;
    GLM5_DEVICE void put(int n, int col, int64_t v) const {
        if (kTrace && rows != nullptr && n < cap)
            rows[(static_cast<int64_t>(blockIdx.x) * cap + n) * kTraceCols + col] = v;
    }
};
GLM5_DEVICE int64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return static_cast<int64_t>(t);
}
GLM5_DEVICE int64_t clock_cycles() { return static_cast<int64_t>(clock64()); }

// Task descriptor: bit 31 FC2, bits 22..30 expert, bits 16..21 row tile, bit 15 split-K FC1 tile,
// bit 14 which K half (split only), bits 0..13 token block.
__host__ __device__ constexpr int32_t encode_task(int fc2, int e, int rt, int b, int split = 0, int half = 0) {
    return static_cast<int32_t>((static_cast<uint32_t>(fc2) << 31) | (static_cast<uint32_t>(e) << 22) |
                                (static_cast<uint32_t>(rt) << 16) | (static_cast<uint32_t>(split) << 15) |
                                (static_cast<uint32_t>(half) << 14) | static_cast<uint32_t>(b));
}
__host__ __device__ constexpr int task_fc2(int32_t d) { return static_cast<int>(static_cast<uint32_t>(d) >> 31); }
__host__ __device__ constexpr int task_expert(int32_t d) { return static_cast<int>((static_cast<uint32_t>(d) >> 22) & 511u); }
__host__ __device__ constexpr int task_rt(int32_t d) { return static_cast<int>((static_cast<uint32_t>(d) >> 16) & 63u); }
__host__ __device__ constexpr int task_split(int32_t d) { return static_cast<int>((static_cast<uint32_t>(d) >> 15) & 1u); }
__host__ __device__ constexpr int task_half(int32_t d) { return static_cast<int>((static_cast<uint32_t>(d) >> 14) & 1u); }
__host__ __device__ constexpr int task_block(int32_t d) { return static_cast<int>(static_cast<uint32_t>(d) & 0x3fffu); }
constexpr int kMaxBlocks = 1 << 14;
// End of the task list (what the scheduler publishes once the claim counter passes the last task).
// NOTES: an FC2 descriptor has bit 31 set, i.e. it is a NEGATIVE int32, so a sign test must never be
// the end test (v1 tested desc < 0: every CTA stopped at its first FC2 claim, no FC2 task or combine
// ran and the output stayed unwritten). -1 has the split bit set with fc2 = 1, which no planned task
// has (split-K exists only for FC1 tiles), so it cannot collide with a real descriptor.
constexpr int32_t kTaskEnd = -1;
__host__ __device__ constexpr bool task_is_end(int32_t d) { return d == kTaskEnd; }
static_assert(!task_is_end(encode_task(1, 511, 63, kMaxBlocks - 1)) && !task_is_end(encode_task(1, 0, 0, 0)) &&
                  !task_is_end(encode_task(0, 511, 63, kMaxBlocks - 1, 1, 1)) && encode_task(1, 0, 0, 0) < 0,
              "the end sentinel differs from every task descriptor (FC2 descriptors are negative)");
static_assert(task_expert(encode_task(1, 300, 23, 4095)) == 300 && task_rt(encode_task(1, 300, 23, 4095)) == 23 &&
                  task_block(encode_task(1, 300, 23, 4095)) == 4095 && task_fc2(encode_task(1, 300, 23, 4095)) == 1 &&
                  task_split(encode_task(0, 511, 63, 16383, 1, 1)) == 1 && task_half(encode_task(0, 511, 63, 16383, 1, 1)) == 1 &&
                  task_block(encode_task(0, 511, 63, 16383, 1, 1)) == 16383,
              "task encoding");

// Pair code: token << 4 | slot (slot < kMaxSlots).
__host__ __device__ constexpr int32_t encode_pair(int t, int j) { return (t << 4) | j; }

// Kernel parameters (ABI of glm5_fastpath/moe/megamoe.py::_Params; both kernels take it).
struct Params {
    const uint8_t* x;          // [M, H] e4m3, activations quantised 1x128
    const float* x_scale;      // [M, H/128] fp32
    const void* topk_ids;      // [M, k] int32 (ids_int64 = 0) or int64, routed expert ids in [0, e_local);
                               // a row whose first id is negative is padding (CUDA-graph batch padding,
                               // SGLang masks it with -1): no pairs, not even the shared expert; out row = 0
    const float* topk_w;       // [M, k] fp32, normalised, without routed_scaling_factor
    const float* w13_scale;    // [E_tot, 2I/128, H/128] fp32 (natural gate||up block order)
    const float* w2_scale;     // [E_tot, H/128, I/128] fp32
    uint16_t* out;             // [M, H] bf16
    // workspace (glm5_fastpath/moe/megamoe.py::Workspace)
    int32_t* expert_cnt;       // [kMaxExperts] pairs per expert
    int32_t* expert_off;       // [kMaxExperts] first pair row (multiple of kPairAlign)
    int32_t* blk_base;         // [kMaxExperts] first token-block index (fc1_done)
    int32_t* pair_list;        // [pairs_cap] pair codes, grouped by expert
    int32_t* tasks;            // [tasks_cap] task descriptors in claim order
    int32_t* ctrl;             // [32]: 0 num_tasks, 1 claim counter, 2 tasks finished, 3 output tiles combined,
                               //      4 pair rows (pool build), 5 loader warps done copying into the pool
    int32_t* fc1_done;         // [blocks_cap]
    int32_t* combine_ctr;      // [max_tokens, H/128] (H / stage_rows(kBN) used per token), zero at rest
    int32_t* split_ctr;        // [split_max_tiles], zero at rest (split-K FC1 tiles: first/last finisher)
    float* split_partial;      // [split_max_tiles][2 halves][256 threads][kBN] fp32 partial accumulators
    uint8_t* act;              // [pairs_cap, I] e4m3: FC1 output (FC2 input)
    float* act_scale;          // [I/128, pairs_cap] fp32 (transposed: a block's scales are contiguous)
    uint16_t* slots;           // [max_tokens, S, H] bf16 weighted FC2 outputs
    uint8_t* pool;             // [pairs_cap, H] e4m3: the token pool (pool build; pair row r = token of pair_list[r])
    float* pool_scale;         // [H/128, pairs_cap] fp32 its scales (transposed, as act_scale)
    int32_t num_tokens;        // M
    int32_t topk;              // k routed slots per token
    int32_t num_slots;         // S = k + n_shared
    int32_t e_local;           // routed experts (the shared expert is index e_local)
    int32_t n_shared;          // 0 or 1
    int32_t ids_int64;         // topk_ids element type
    int32_t group_size;        // active experts per scheduling group
    int32_t pairs_cap;         // rows of act / entries of pair_list (multiple of 8)
    int32_t tasks_cap;
    int32_t blocks_cap;
    int32_t split_max_tiles;   // split every FC1 tile in two K halves when the call has at most this many
    int32_t flags;             // kFlagFc1Only / kFlagNoCombine (diagnostics), kFlagEndCombine
    float shared_weight;       // fp32(1 / routed_scaling_factor)
    float routed_scaling;      // applied in the combine
    // ---- expert parallelism (kEP builds; zero elsewhere) ----
    uint64_t peer[kMaxRanks];  // symmetric buffer base of each rank (peer[rank] = this rank's own)
    int64_t sym_x;             // byte offsets of the symmetric fields (identical at every rank): x8 [T, H] e4m3,
    int64_t sym_xs;            //   x_scale [T, H/128] fp32,
    int64_t sym_w;             //   topk_weights [T, k] fp32,
    int64_t sym_ids;           //   topk_ids [T, k] int32,
    int64_t sym_sig;           //   signals [kSigWords] int32,
    int64_t sym_slots;         //   slots [T, S, H] bf16 (combine mode A: written by the ranks that own the pairs' experts)
    int64_t sym_loc;           //   pair_loc [T, S] int32 (mode B: owner rank << 24 | its pair row, written by the owner)
    int64_t sym_opool;         //   out_pool [pairs_cap, H] bf16 (mode B: this rank's FC2 outputs by pair row)
    int32_t* g_ids;            // local [world * T, k] int32: every rank's topk ids, gathered by the plan (src-major)
    float* g_w;                // local [world * T, k] fp32: their routing weights
    float* pair_weight;        // local [pairs_cap] fp32: routing weight of each pair row
    int32_t rank;
    int32_t world;
    int32_t ep_max_tokens;     // T (rows of the symmetric per-token fields)
    int32_t ep_mode;           // combine mode: 0 = A (FC2 stores into the source's slots), 1 = B (FC2 stores into the
                               // local out_pool; the source reads the owners' pools after the exit barrier)
};

static_assert(sizeof(Params) == 232 + 8 * kMaxRanks + 8 * 8 + 3 * 8 + 16,
              "Params ABI: glm5_fastpath/moe/megamoe.py::_Params (PARAMS_BYTES)");

constexpr int32_t kFlagFc1Only = 1;    // plan FC1 tasks only
constexpr int32_t kFlagNoCombine = 2;  // FC2 writes its slot values; no combine counters, `out` untouched
constexpr int32_t kFlagEndCombine = 4;  // pool builds: FC2 writes its slot values only; after a grid-wide count of the
                                       // CTAs that finished their tasks (ctrl[6]) every math warp combines tiles
// moe/overlap.py: the shared expert and the routed experts of one MoE call as two launches sharing one slot buffer and its
// combine counters. kFlagSharedOnly plans the shared expert's pairs only and reads no topk_ids (the router may still be
// writing them); kFlagRoutedOnly plans the routed pairs only. The combine threshold stays S contributions per slot row.
constexpr int32_t kFlagSharedOnly = 8;
constexpr int32_t kFlagRoutedOnly = 16;

// ---- private PTX helpers (one instruction each) ------------------------------------------------------

GLM5_DEVICE void cp_async_4(uint32_t dst_smem, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst_smem), "l"(src) : "memory");
}

GLM5_DEVICE int32_t ld_acquire_gpu(const int32_t* p) {
    int32_t v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

GLM5_DEVICE void red_release_gpu_add(int32_t* p, int32_t v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE int32_t ld_acquire_sys(const int32_t* p) {
    int32_t v;
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

GLM5_DEVICE void st_release_sys(int32_t* p, int32_t v) {
    asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE void red_relaxed_gpu_add(int32_t* p, int32_t v) {
    asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE int32_t atom_acq_rel_gpu_add(int32_t* p, int32_t v) {
    int32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

GLM5_DEVICE void st_shared_u8(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u8 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
GLM5_DEVICE void st_shared_u16(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(static_cast<uint16_t>(v)) : "memory");
}

// Spin (this thread; 64 ns naps) until the only-growing counter *ctr reaches want, acquiring it; after
// GLM5_MEGAMOE_SPIN_LIMIT_CYCLES run on_timeout() (diagnostics) and trap, so a lost release fails loudly.
template <class OnTimeout>
GLM5_DEVICE void spin_acquire_geq(const int32_t* ctr, int32_t want, OnTimeout on_timeout) {
    const long long t0 = clock64();
    while (ld_acquire_gpu(ctr) < want) {
        __nanosleep(64);
        if (static_cast<unsigned long long>(clock64() - t0) > GLM5_MEGAMOE_SPIN_LIMIT_CYCLES) {
            on_timeout();
            __trap();
        }
    }
}

// Order this thread's generic-proxy global accesses with its async-proxy ones (TMA) across a hand-off.
GLM5_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

GLM5_DEVICE void st_global_u32(void* p, uint32_t v) {
    asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE float round_bf16(float x) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

GLM5_DEVICE uint32_t lane_id() { return threadIdx.x & 31u; }

// a / b rounded to nearest for b > 0 without the division's range check: the reciprocal + Newton step + residual
// correction that nvcc's IEEE division runs when its check (FCHK) passes (MUFU.RCP, five FFMAs), and a == 0 -> a.
// The check branches to a slow-path call, which keeps the compiler from overlapping consecutive divisions: the FC1
// epilogue's 3 x 16 divisions per thread ran one after the other (session-10 trace: ~3-6 us of a 7-12 us epilogue).
// Exact (the same bits as a / b) when div_rn_fast_ok(a, b): b and a (unless 0) inside [2^-60, 2^60], so the
// reciprocal, the quotient and the residual stay normal. Callers test the whole warp and otherwise divide.
GLM5_DEVICE float div_rn_nocheck(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = fmaf(r, fmaf(-b, r, 1.0f), r);
    const float q = fmaf(a, r, 0.0f);
    return a == 0.0f ? a : fmaf(r, fmaf(-b, q, a), q);
}
GLM5_DEVICE bool div_rn_fast_ok(float a, float b) {
    const float aa = fabsf(a);
    return b >= 0x1p-60f && b <= 0x1p60f && (a == 0.0f || (aa >= 0x1p-60f && aa <= 0x1p60f));
}

// A per-thread fence.gpu on a cross-CTA hand-off, except in the lean-fences build (kLeanFences above).
GLM5_DEVICE void handoff_fence() {
    if constexpr (!kLeanFences) __threadfence();
}

// ---- shared-memory layout of the persistent kernel ---------------------------------------------------
// (glm5_fastpath/moe/megamoe.py::smem_bytes mirrors kBytes; keep the two in sync.)
template <int kBN, int kStages>
struct Smem {
    static constexpr int kWStage = stage_rows(kBN) * kBK;             // weight rows x 128 B (TMA, 128B swizzle)
    static constexpr int kAStage = kBN * kBK;                          // token rows x 128 B (swizzled)
    static constexpr int kW = 0;                                       // weights, 1024-aligned
    static constexpr int kA = kW + kStages * kWStage;                  // activations, 1024-aligned
    static constexpr int kSA = kA + kStages * kAStage;                 // activation scales [kStages][kBN]
    static constexpr int kOut = kSA + kStages * kBN * 4;               // FC1 output staging [kBN][128] e4m3
                                                                       // (wide: first also the pass-0 stash, 16 KB)
    static constexpr int kRed = kOut + kBN * kBK;                      // amax exchange [8 warps][kBN]
    static constexpr int kFlag = kRed + 8 * kBN * 4;                   // combine: last-contributor flags [kBN]
    static constexpr int kCode = kFlag + kBN * 4;                      // per task slot: pair codes [T][kBN]
    static constexpr int kWgt = kCode + kTaskSlots * kBN * 4;          // per task slot: routing weights [T][kBN]
    static constexpr int kMeta = kWgt + kTaskSlots * kBN * 4;          // per task slot: {p0, cnt, blk, 0}
    static constexpr int kDesc = kMeta + kTaskSlots * 16;              // per task slot: descriptor
    // CTA-pair builds (kPair): rank 1's fp32 split-K partial [256 math threads][kBN] (rank 0 reads it), the claim mailbox
    // [T] (rank 1: the entry index rank 0 claimed) and per task slot the pair flag (both entries are one tile's halves)
    static constexpr int kXBuf = kPair ? (kDesc + kTaskSlots * 4 + 15) / 16 * 16 : kDesc + kTaskSlots * 4;  // 16-B st.async
    static constexpr int kMail = kXBuf + (kPair ? kMathThreads * kBN * 4 : 0);
    static constexpr int kPairFlag = kMail + (kPair ? kTaskSlots * 4 : 0);
    static constexpr int kBar = (kPairFlag + (kPair ? kTaskSlots * 4 : 0) + 7) / 8 * 8;  // mbarriers
    // full[S] (1 TMA arrival + 32 cp.async arrivals per loader warp + tx), empty[S] (8 math warps),
    // tfull[T] (producer), tinfo[T] (warp 1's 32 lanes), tempty[T] (the loader warps + 8 math warps);
    // kPair: xfull (rank 0: its math thread 0's arrival + rank 1's st.async bytes), xempty (rank 1: rank 0's math thread 0),
    // cfull[T] (rank 1: its producer's arrival + rank 0's 4 st.async bytes), cempty[T] (rank 0: rank 1's producer)
    static constexpr int kNumBars = 2 * kStages + 3 * kTaskSlots + (kPair ? 2 + 2 * kTaskSlots : 0);
    static constexpr int kBytes = kBar + kNumBars * 8;
    static constexpr int kAlloc = kBytes + 1024;  // + slack to round the dynamic smem base up to 1024
    static_assert(kAStage % 1024 == 0, "activation stages must stay 1024-byte aligned (128B swizzle)");
    static_assert(kAlloc <= 232448, "shared memory budget (227 KB per block)");
};

template <int kH, int kI, int kBN, int kStages>
struct MegaMoE {
    // Wide mode (kBN = 128, for hundreds of tokens per expert): each wgmma tile is 128 weight rows x 128 tokens, one
    // m64n128 half per math warpgroup (64 accumulator floats, as two m64n64 halves at kBN = 64; 256 rows x 128 tokens
    // would need 128 + 64 and spilled in every variant tried). Per K stage it moves 32 KB (16 KB weights + 16 KB tokens)
    // for the MMA work of 40 KB at kBN = 64, and each wgmma reads 6 KB of operands per 64 tensor cycles instead of 4 KB
    // per 32. An FC1 task still owns one 128-channel quant group (256 interleaved rows) and runs it as two passes of
    // 128 rows over the same token block: pass 0 stashes its SwiGLU output (bf16) in the FC1 staging area, pass 1
    // quantises both halves; the weight producer and the loaders stream the 2 x H/128 stages back to back.
    static constexpr bool kWide = kBN == kWideBN;
    // The math warps trap out of line (mbar_wait<true>, math_trap) in the wide builds (an inline trap caps ptxas at the
    // launch allocation; math_trap).
    static constexpr bool kTokenMajor = GLM5_MEGAMOE_TOKEN_MAJOR != 0;
    static constexpr bool kTrapOutOfLine = kWide || kTokenMajor;
    static_assert(!kTokenMajor || kBN == 64 || kWide, "token-major builds: bn64 (narrow) or bn128 (wide)");
    // Token-major wgmma: m64 (tokens) x n128 (weight rows). Wide: warpgroup wg takes tokens [64 wg, 64 wg + 64) and the
    // stage's 128 rows; narrow (bn64): the block's 64 tokens and rows [128 wg, 128 wg + 128) of the 256-row tile.
    static constexpr int kTmN = 128;
    static constexpr int kRows = stage_rows(kBN);  // weight rows per stage / wgmma tile
    static constexpr int kPasses = kWide ? 2 : 1;  // 128-row passes of an FC1 task
    static_assert(kH % 256 == 0 && kH / kRows <= 63, "hidden size: multiple of 256 (FC2 row tiles: 6-bit field)");
    static_assert(kI % 128 == 0 && kI / 128 <= 63, "intermediate size: multiple of 128 (quant groups)");
    static_assert(kBN == 8 || kBN == 16 || kBN == 32 || kBN == 64 || kBN == kWideBN,
                  "token block (bn128 with 256-row tiles spills: 2 x 64 + 64 accumulator floats; bn128 is the wide mode)");
    static_assert(kStages >= 2 && kStages <= 8, "stages");

    using L = Smem<kBN, kStages>;
    static constexpr int kKb1 = kH / kBK;         // FC1 K stages (per pass)
    static constexpr int kKb2 = kI / kBK;         // FC2 K stages
    static constexpr int kT1 = 2 * kI / kTileRows;  // FC1 tasks per token block (= I/128 = fc1_done target)
    static constexpr int kT2 = kH / kRows;        // FC2 row tiles per expert (= combine counters per token)
    // accumulator floats per m64 half per thread (wide: the one half; token-major: m64 x n128)
    static constexpr int kNAcc = kTokenMajor ? 64 : kBN / 2;
    static constexpr int kNAcc1 = kWide || kTokenMajor ? 1 : kNAcc;  // the second half's (unused in wide / token-major)
    static constexpr int kNJ = kTokenMajor ? 16 : kBN / 8;           // 8-column groups
    static_assert(!kWide || 256 * 64 <= kBN * kBK, "the pass-0 stash (256 threads x 32 bf16) fits the FC1 staging area");

    // ================================ plan kernel (1 CTA, 1024 threads) ================================
    struct PlanSmem {
        int cnt[kMaxExperts];
        int cursor[kMaxExperts];
        int off[kMaxExperts];
        int nblk[kMaxExperts];
        int bb[kMaxExperts];
        int rank[kMaxExperts];
        int gbb[kMaxExperts + 1];
        int f1s[kMaxExperts];
        int f2s[kMaxExperts];
#if GLM5_MEGAMOE_PLAN_ACTIVE
        int active[kMaxExperts];  // active rank -> expert (the scan's order)
#endif
        int totals[4];  // 0 pairs rows, 1 blocks, 2 active experts, 3 tasks
    };

    // Trace build only: the plan's phase boundaries as thread 0's clock64 offsets from the plan's start (cycles) in
    // ctrl[kPlanStampBase + k], k = 1..kPlanStamps-1 (ctrl[kPlanStampBase] = the start's globaltimer, low 32 bits, so
    // the plan can be placed against the persistent kernel's task stamps). The normal build compiles none of it.
    static GLM5_DEVICE void plan_stamp(const Params& p, int k, int64_t t0) {
        if constexpr (kTrace) {
            if (threadIdx.x == 0) p.ctrl[kPlanStampBase + k] = static_cast<int32_t>(clock_cycles() - t0);
        }
    }

    static GLM5_DEVICE int64_t topk_id(const Params& p, int t, int j) {
        const int64_t idx = static_cast<int64_t>(t) * p.topk + j;
        return p.ids_int64 ? static_cast<const int64_t*>(p.topk_ids)[idx]
                           : static_cast<int64_t>(static_cast<const int32_t*>(p.topk_ids)[idx]);
    }

    // Padding token (first id negative): takes no pairs and gets a zero output row from the plan kernel.
    static GLM5_DEVICE bool token_masked(const Params& p, int t) { return topk_id(p, t, 0) < 0; }
    // The plan's view (kFlagSharedOnly: no token is padding; the ids are not read) and whether slot j belongs to this
    // launch (kFlagSharedOnly / kFlagRoutedOnly).
    static GLM5_DEVICE bool plan_token_masked(const Params& p, int t) {
        return (p.flags & kFlagSharedOnly) ? false : token_masked(p, t);
    }
    static GLM5_DEVICE bool slot_in_launch(const Params& p, int j) {
        if (p.flags & kFlagSharedOnly) return j >= p.topk;
        if (p.flags & kFlagRoutedOnly) return j < p.topk;
        return true;
    }

    // ---- pair addressing: the token's activation row, its scales and its slot row (kEP: at the source rank) ----------
    static_assert(!kEP || kPool, "the EP build runs on the token pool (its dispatch target) and the end combine");
    static_assert(!kPair || (!kPool && !kWide && !kTokenMajor && !kEP && kBN <= kSplitMaxBN && kNAcc1 == kNAcc &&
                             kNAcc % 4 == 0 && 2 * kNAcc == kBN),
                  "CTA pairs: narrow, non-pool, single-GPU builds with split-K blocks only");
    static GLM5_DEVICE int code_src(int32_t c) { return kEP ? (c >> 4) >> kEpTokBits : 0; }
    static GLM5_DEVICE int code_tok(int32_t c) { return kEP ? (c >> 4) & ((1 << kEpTokBits) - 1) : c >> 4; }
    // Symmetric base of rank r: static parameter indices (a dynamic index into the parameter array would copy it to
    // the stack).
    static GLM5_DEVICE uint64_t peer_base(const Params& p, int r) {
        uint64_t b = p.peer[0];
#pragma unroll
        for (int i = 1; i < kMaxRanks; ++i)
            if (r == i) b = p.peer[i];
        return b;
    }
    template <class T>
    static GLM5_DEVICE T* sym_ptr(const Params& p, int r, int64_t off) {
        return reinterpret_cast<T*>(peer_base(p, r) + static_cast<uint64_t>(off));
    }
    static GLM5_DEVICE const uint8_t* pair_x(const Params& p, int32_t c) {
        if constexpr (kEP) return sym_ptr<const uint8_t>(p, code_src(c), p.sym_x) + static_cast<int64_t>(code_tok(c)) * kH;
        return p.x + static_cast<int64_t>(c >> 4) * kH;
    }
    static GLM5_DEVICE const float* pair_xs(const Params& p, int32_t c) {
        if constexpr (kEP)
            return sym_ptr<const float>(p, code_src(c), p.sym_xs) + static_cast<int64_t>(code_tok(c)) * (kH / kBK);
        return p.x_scale + static_cast<int64_t>(c >> 4) * (kH / kBK);
    }
    // Slot (t, j) of pair code c: [H] bf16.
    static GLM5_DEVICE uint16_t* pair_slot(const Params& p, int32_t c, int S) {
        if constexpr (kEP)
            return sym_ptr<uint16_t>(p, code_src(c), p.sym_slots) + (static_cast<int64_t>(code_tok(c)) * S + (c & 15)) * kH;
        return p.slots + (static_cast<int64_t>(c >> 4) * S + (c & 15)) * kH;
    }

    // Expert of pair (t, j) of an unmasked token.
    static GLM5_DEVICE int pair_expert(const Params& p, int t, int j) {
        if (j >= p.topk) return p.e_local;  // the fused shared expert
        const int64_t e = topk_id(p, t, j);
        if (e < 0 || e >= p.e_local) {
            printf("glm5 megamoe: topk_ids[%d][%d] = %lld is outside the routed experts [0, %d)\n", t, j,
                   static_cast<long long>(e), p.e_local);
            __trap();
        }
        return static_cast<int>(e);
    }

    // Expert of order position q: the shared expert first (largest token count), then routed ids ascending.
    static GLM5_DEVICE int order_expert(const Params& p, int q) {
        return p.n_shared ? (q == 0 ? p.e_local : q - 1) : q;
    }

    // ---- EP plan pieces (kEP) ----------------------------------------------------------------------------------------
    // First gathered token of each rank (exclusive scan of the ranks' token counts; [world] = the total).
    static GLM5_DEVICE int* ep_base_smem() {
        __shared__ int base[kMaxRanks + 1];
        return base;
    }
    static GLM5_DEVICE __noinline__ void ep_spin_timeout(const char* what, int rank, int r, int epoch, int seen) {
        printf("glm5 megamoe ep: %s barrier timeout: rank %d waits for rank %d (epoch %d, sees %d, block %d)\n", what,
               rank, r, epoch, seen, blockIdx.x);
        __trap();
    }
    // Entry barrier + gather (plan kernel): bump the epoch, publish this call's token count, release ready[me] = epoch at
    // every rank, acquire every rank's ready, then copy every rank's topk ids and weights (its symmetric fields, already
    // written by earlier kernels on its stream) into g_ids / g_w, src-major. Returns the number of gathered tokens.
    static GLM5_DEVICE int ep_gather(const Params& p) {
        __shared__ int32_t epoch_s;
        int* base = ep_base_smem();
        const int tid = threadIdx.x;
        int32_t* sig = sym_ptr<int32_t>(p, p.rank, p.sym_sig);
        if (tid == 0) {
            const int32_t epoch = sig[kSigEpoch] + 1;
            sig[kSigEpoch] = epoch;
            sig[kSigTokens] = p.num_tokens;
            epoch_s = epoch;
            __threadfence_system();
            for (int r = 0; r < p.world; ++r) st_release_sys(sym_ptr<int32_t>(p, r, p.sym_sig) + kSigReady + p.rank, epoch);
        }
        __syncthreads();
        if (tid < p.world) {
            const int32_t epoch = epoch_s;
            const long long t0 = clock64();
            while (ld_acquire_sys(sig + kSigReady + tid) != epoch) {
                __nanosleep(32);
                if (static_cast<unsigned long long>(clock64() - t0) > GLM5_MEGAMOE_SPIN_LIMIT_CYCLES)
                    ep_spin_timeout("entry", p.rank, tid, epoch, ld_acquire_sys(sig + kSigReady + tid));
            }
            base[tid + 1] = ld_acquire_sys(sym_ptr<int32_t>(p, tid, p.sym_sig) + kSigTokens);
        }
        __syncthreads();  // orders every thread's remote loads below after the acquires above
        if (tid == 0) {
            base[0] = 0;
            for (int r = 0; r < p.world; ++r) {
                if (base[r + 1] < 0 || base[r + 1] > p.ep_max_tokens) {
                    printf("glm5 megamoe ep: rank %d has %d tokens (capacity %d)\n", r, base[r + 1], p.ep_max_tokens);
                    __trap();
                }
                base[r + 1] += base[r];
            }
        }
        __syncthreads();
        // one flat loop over every rank's entries: all remote loads of a thread in flight together (4 per unrolled round)
        const int k = p.topk, total = base[p.world] * k;
#pragma unroll 4
        for (int i = tid; i < total; i += kPlanThreads) {
            int r = 0;
            while (i >= base[r + 1] * k) ++r;
            const int li = i - base[r] * k;
            p.g_ids[i] = sym_ptr<const int32_t>(p, r, p.sym_ids)[li];
            p.g_w[i] = sym_ptr<const float>(p, r, p.sym_w)[li];
        }
        __syncthreads();
        return base[p.world];
    }
    static GLM5_DEVICE int ep_src(int gi) {
        const int* base = ep_base_smem();
        int r = 0;
        while (gi >= base[r + 1]) ++r;
        return r;
    }
    // Gathered token gi: padding (first id negative)?
    static GLM5_DEVICE bool gtok_masked(const Params& p, int gi) {
        if constexpr (kEP) return p.g_ids[static_cast<int64_t>(gi) * p.topk] < 0;
        return token_masked(p, gi);
    }
    // Local expert of pair (gi, j) of an unmasked gathered token; kEP: -1 when another rank owns it (routed ids are global:
    // rank r owns [r e_local, (r + 1) e_local); the shared expert is this rank's own tokens' only).
    static GLM5_DEVICE int gpair_expert(const Params& p, int gi, int j) {
        if constexpr (kEP) {
            if (j >= p.topk) return ep_src(gi) == p.rank ? p.e_local : -1;
            const int e = p.g_ids[static_cast<int64_t>(gi) * p.topk + j];
            if (e < 0 || e >= p.world * p.e_local) {
                printf("glm5 megamoe ep: topk id %d of gathered token %d slot %d is outside [0, %d)\n", e, gi, j,
                       p.world * p.e_local);
                __trap();
            }
            return e / p.e_local == p.rank ? e - p.rank * p.e_local : -1;
        }
        return pair_expert(p, gi, j);
    }

    static GLM5_DEVICE void plan(const Params& p, PlanSmem& s) {
        ptx::griddep_launch_dependents();  // the persistent kernel may start its setup now
        ptx::griddep_wait();               // topk_ids come from the router; the previous MoE launch is done
        plan_body<kPlanThreads>(p, s);
    }

    // The plan's work, by the kPT threads of one CTA (all of them call it; it uses __syncthreads): the plan kernel
    // (1024 threads) and the fused router + plan kernel's last CTA (csrc/moe/router_plan.cu, 256 threads, after its
    // own griddepcontrol.wait). Outputs do not depend on kPT except the order of pairs inside an expert's list (the
    // shared-memory atomics' order), which only decides the column a pair takes in its token block.
    template <int kPT>
    static GLM5_DEVICE void plan_body(const Params& p, PlanSmem& s) {
        static_assert(kPT % 32 == 0 && kPT >= 64 && kPT <= kPlanThreads, "plan threads: whole warps, 64..1024");
        static_assert(!kEP || kPT == kPlanThreads, "the EP gather runs with the plan kernel's 1024 threads");
        const int tid = threadIdx.x;
        const int E = p.e_local + p.n_shared;
        const int S = p.num_slots;

        [[maybe_unused]] const int64_t t0 = kTrace ? clock_cycles() : 0;
        if constexpr (kTrace) {
            if (tid == 0) p.ctrl[kPlanStampBase] = static_cast<int32_t>(globaltimer_ns());
        }
        int ntok = p.num_tokens;           // tokens whose pairs are planned (kEP: every rank's)
        if constexpr (kEP) ntok = ep_gather(p);
        const int pairs = ntok * S;

        for (int e = tid; e < kMaxExperts; e += kPT) s.cnt[e] = 0, s.cursor[e] = 0;
        if (tid == 0) s.totals[0] = 0;  // "some token is padding" until the scan below reuses the word
        __syncthreads();
        plan_stamp(p, 1, t0);
        for (int i = tid; i < pairs; i += kPT) {
            if constexpr (kEP) {
                if (gtok_masked(p, i / S)) continue;
                const int e = gpair_expert(p, i / S, i % S);
                if (e >= 0) atomicAdd(&s.cnt[e], 1);
            } else {
                if (slot_in_launch(p, i % S) && !plan_token_masked(p, i / S))
                    atomicAdd(&s.cnt[pair_expert(p, i / S, i % S)], 1);
            }
        }
        for (int t = tid; t < p.num_tokens; t += kPT)
            if (plan_token_masked(p, t)) s.totals[0] = 1;
        __syncthreads();
        plan_stamp(p, 2, t0);
        // Padding tokens: zero output rows (nothing else writes them); 16-byte stores. Skipped (block-uniform) when no
        // token is padding, the decode case: the loop is M x H/8 iterations.
        if (s.totals[0] != 0) {
            for (int i = tid; i < p.num_tokens * (kH / 8); i += kPT) {
                const int t = i / (kH / 8);
                if (token_masked(p, t)) ptx::st_global_v4(p.out + static_cast<int64_t>(i) * 8, ptx::u32x4{0u, 0u, 0u, 0u});
            }
        }
        __syncthreads();  // the flag word is rewritten by warp 0's scan below
        plan_stamp(p, 3, t0);

        // Warp 0: exclusive scans in order position q over pair rows (8-aligned), token blocks, active rank.
        if (tid < 32) {
            const int per = (E + 31) / 32;
            const int q0 = tid * per, q1 = min(E, q0 + per);
            int srow = 0, sblk = 0, sact = 0;
            for (int q = q0; q < q1; ++q) {
                const int c = s.cnt[order_expert(p, q)];
                srow += (c + kPairAlign - 1) / kPairAlign * kPairAlign;
                sblk += (c + kBN - 1) / kBN;
                sact += c > 0;
            }
            int xrow = srow, xblk = sblk, xact = sact;  // inclusive warp scans
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, xrow, d), b = __shfl_up_sync(0xffffffffu, xblk, d),
                          c = __shfl_up_sync(0xffffffffu, xact, d);
                if (tid >= d) xrow += a, xblk += b, xact += c;
            }
            if (tid == 31) s.totals[0] = xrow, s.totals[1] = xblk, s.totals[2] = xact;
            xrow -= srow, xblk -= sblk, xact -= sact;
            for (int q = q0; q < q1; ++q) {
                const int e = order_expert(p, q);
                const int c = s.cnt[e];
                s.off[e] = xrow;
                s.bb[e] = xblk;
                s.nblk[e] = (c + kBN - 1) / kBN;
                s.rank[e] = c > 0 ? xact : -1;
#if GLM5_MEGAMOE_PLAN_ACTIVE
                if (c > 0) s.active[xact] = e;
#endif
                xrow += (c + kPairAlign - 1) / kPairAlign * kPairAlign;
                xblk += s.nblk[e];
                xact += c > 0;
            }
        }
        __syncthreads();
        plan_stamp(p, 4, t0);
        const int n_active = s.totals[2];
        const int G = max(1, p.group_size);
        const int n_groups = (n_active + G - 1) / G;
        for (int e = tid; e < E; e += kPT)
            if (s.rank[e] >= 0 && s.rank[e] % G == 0) s.gbb[s.rank[e] / G] = s.bb[e];
        if (tid == 0) s.gbb[n_groups] = s.totals[1];
        __syncthreads();
        plan_stamp(p, 5, t0);
        // Few FC1 tiles (small batches): split each in two K halves so the tail of the FC1 phase is
        // finer-grained (the second finisher adds the first one's partial and runs the epilogue).
        const int split = kBN <= kSplitMaxBN && s.totals[1] * kT1 <= p.split_max_tiles ? 2 : 1;
        // Segment order: F1(0) | F1(1) F2(0) | F1(2) F2(1) | ... | F1(n-1) F2(n-2) | F2(n-1).
        if (tid == 0) {
            const bool fc1_only = p.flags & kFlagFc1Only;
            int cur = 0;
            for (int g = 0; g < n_groups; ++g) {
                s.f1s[g] = cur;
                cur += (s.gbb[g + 1] - s.gbb[g]) * kT1 * split;
                if (g >= 1 && !fc1_only) {
                    s.f2s[g - 1] = cur;
                    cur += (s.gbb[g] - s.gbb[g - 1]) * kT2;
                }
            }
            if (n_groups > 0 && !fc1_only) {
                s.f2s[n_groups - 1] = cur;
                cur += (s.gbb[n_groups] - s.gbb[n_groups - 1]) * kT2;
            }
            s.totals[3] = cur;
            if (s.totals[0] > p.pairs_cap || cur > p.tasks_cap || s.totals[1] > p.blocks_cap ||
                s.totals[1] > kMaxBlocks) {
                printf("glm5 megamoe: workspace too small: rows %d > %d or tasks %d > %d or blocks %d > %d\n",
                       s.totals[0], p.pairs_cap, cur, p.tasks_cap, s.totals[1], p.blocks_cap);
                __trap();
            }
        }
        __syncthreads();

        plan_stamp(p, 6, t0);
        // Pair lists (order within an expert is the atomics' order: it only decides which columns of a
        // token block a pair lands in; every column is computed independently, so results do not depend on it).
        for (int i = tid; i < pairs; i += kPT) {
            const int t = i / S, j = i % S;
            if constexpr (kEP) {
                if (gtok_masked(p, t)) continue;
                const int e = gpair_expert(p, t, j);
                if (e < 0) continue;
                const int pos = atomicAdd(&s.cursor[e], 1);
                const int src = ep_src(t);
                const int tl = t - ep_base_smem()[src];
                p.pair_list[s.off[e] + pos] = encode_pair(src << kEpTokBits | tl, j);
                p.pair_weight[s.off[e] + pos] = j < p.topk ? p.g_w[static_cast<int64_t>(t) * p.topk + j] : p.shared_weight;
                if (p.ep_mode)  // mode B: tell the source where (rank, pair row) its slot (tl, j) will be
                    sym_ptr<int32_t>(p, src, p.sym_loc)[static_cast<int64_t>(tl) * S + j] = p.rank << 24 | (s.off[e] + pos);
            } else {
                if (!slot_in_launch(p, j) || plan_token_masked(p, t)) continue;
                const int e = pair_expert(p, t, j);
                const int pos = atomicAdd(&s.cursor[e], 1);
                p.pair_list[s.off[e] + pos] = encode_pair(t, j);
            }
        }
        if constexpr (kTrace) __syncthreads();  // (trace build: the stamp covers every thread's phase)
        plan_stamp(p, 7, t0);
        // Tasks: one warp per active expert; FC1 (rt, b) and FC2 (rt, b) with the token block innermost,
        // so the blocks of one weight tile are claimed back to back (the second reads it from L2).
        const int warp = tid >> 5, lane = tid & 31;
        const bool fc1_only = p.flags & kFlagFc1Only;
#if GLM5_MEGAMOE_PLAN_ACTIVE
        for (int r = warp; r < n_active; r += kPT / 32) {
            const int e = s.active[r];
#else
        for (int e = warp; e < E; e += kPT / 32) {
            const int r = s.rank[e];
            if (r < 0) continue;
#endif
            const int g = r / G, nb = s.nblk[e], within = s.bb[e] - s.gbb[g];
            const int s1 = s.f1s[g] + within * kT1 * split;
            for (int i = lane; i < nb * kT1 * split; i += 32) {
                const int h = i % split, rb = i / split;  // (rt, b, half), half innermost
                p.tasks[s1 + i] = encode_task(0, e, rb / nb, rb % nb, split - 1, h);
            }
            if (!fc1_only) {
                const int s2 = s.f2s[g] + within * kT2;
                for (int i = lane; i < nb * kT2; i += 32) p.tasks[s2 + i] = encode_task(1, e, i / nb, i % nb);
            }
        }
        if constexpr (kTrace) __syncthreads();
        plan_stamp(p, 8, t0);
        for (int i = tid; i < s.totals[1]; i += kPT) p.fc1_done[i] = 0;
        for (int e = tid; e < kMaxExperts; e += kPT) {
            const bool in = e < E;
            p.expert_cnt[e] = in ? s.cnt[e] : 0;
            p.expert_off[e] = in ? s.off[e] : 0;
            p.blk_base[e] = in ? s.bb[e] : 0;
        }
        if (tid == 0) p.ctrl[0] = s.totals[3], p.ctrl[1] = 0, p.ctrl[2] = 0, p.ctrl[3] = 0;
        if constexpr (kEP) {
            // mode B: the pair_loc stores above reach the sources before anything this rank releases later (the exit
            // barrier's done flag, after the persistent kernel)
            if (p.ep_mode) __threadfence_system();
        }
        if constexpr (kPool) {
            // the pool copy walks every pair row: mark each expert's alignment padding rows (code -1)
            for (int e = tid; e < E; e += kPT)
                for (int r = s.cnt[e]; r < (s.cnt[e] + kPairAlign - 1) / kPairAlign * kPairAlign; ++r)
                    p.pair_list[s.off[e] + r] = -1;
            if (tid == 0) p.ctrl[4] = s.totals[0], p.ctrl[5] = 0, p.ctrl[6] = 0;
        }
        if constexpr (kTrace) __syncthreads();
        plan_stamp(p, 9, t0);
    }

    // ================================ persistent kernel ================================================
    struct Bars {
        uint32_t base;
        GLM5_DEVICE uint32_t full(int s) const { return base + 8u * s; }
        GLM5_DEVICE uint32_t empty(int s) const { return base + 8u * (kStages + s); }
        GLM5_DEVICE uint32_t tfull(int t) const { return base + 8u * (2 * kStages + t); }
        GLM5_DEVICE uint32_t tinfo(int t) const { return base + 8u * (2 * kStages + kTaskSlots + t); }
        GLM5_DEVICE uint32_t tempty(int t) const { return base + 8u * (2 * kStages + 2 * kTaskSlots + t); }
        // CTA-pair builds only (kPair)
        GLM5_DEVICE uint32_t xfull() const { return base + 8u * (2 * kStages + 3 * kTaskSlots); }
        GLM5_DEVICE uint32_t xempty() const { return base + 8u * (2 * kStages + 3 * kTaskSlots + 1); }
        GLM5_DEVICE uint32_t cfull(int t) const { return base + 8u * (2 * kStages + 3 * kTaskSlots + 2 + t); }
        GLM5_DEVICE uint32_t cempty(int t) const { return base + 8u * (2 * kStages + 4 * kTaskSlots + 2 + t); }
    };

    // ---- CTA pairs (kPair): the cluster's claims and the split-K hand-off over DSMEM ----------------------------
    // Claim n of the cluster (its task-ring slot n % T): rank 0 takes two entries of the list and forwards the index into
    // rank 1's mailbox slot (st.async, 4 bytes on rank 1's cfull); rank 1 reads it and hands the slot back (cempty).
    static GLM5_DEVICE int pair_claim(const Params& p, uint8_t* sm, uint32_t sbase, const Bars& bar, int n,
                                      uint32_t rank) {
        const int slot = n % kTaskSlots;
        const uint32_t par = (n / kTaskSlots) & 1u;
        const uint32_t mail = sbase + L::kMail + 4u * slot;
        if (rank == 0) {
            const int c = atomicAdd(&p.ctrl[1], 2);
            ptx::mbarrier_wait_parity_cluster(bar.cempty(slot), par ^ 1u);  // rank 1 read claim n - T
            ptx::st_async_b32(ptx::mapa_shared(mail, 1), static_cast<uint32_t>(c), ptx::mapa_shared(bar.cfull(slot), 1));
            return c;
        }
        sm90::mbar_arrive_expect_tx(bar.cfull(slot), 4);
        ptx::mbarrier_wait_parity_cluster(bar.cfull(slot), par);
        const int c = *reinterpret_cast<volatile int32_t*>(sm + L::kMail + 4 * slot);
        ptx::mbarrier_arrive_remote(ptx::mapa_shared(bar.cempty(slot), 0));
        return c;
    }

    // A paired split-K FC1 tile (kPair, both halves on this cluster): rank 1 st.async's its fp32 partial (per math
    // thread acc0 then acc1, kBN floats) into rank 0's exchange buffer once rank 0 released the previous one (xempty)
    // and is done (false); rank 0 waits for the bytes (xfull), adds them (a + b as in split_exchange: the same bits)
    // and runs the epilogue (true). xcnt: this rank's paired exchanges so far (the barriers' phase).
    static GLM5_DEVICE bool pair_exchange(uint8_t* sm, uint32_t sbase, const Bars& bar, uint32_t xcnt,
                                          float (&acc0)[kNAcc], float (&acc1)[kNAcc1]) {
        const int mt = threadIdx.x - 128;
        const uint32_t buf = sbase + L::kXBuf + static_cast<uint32_t>(mt) * kBN * 4u;
        if (ptx::cluster_ctarank() != 0) {
            ptx::mbarrier_wait_parity_cluster(bar.xempty(), (xcnt & 1u) ^ 1u);
            const uint32_t dst = ptx::mapa_shared(buf, 0), rbar = ptx::mapa_shared(bar.xfull(), 0);
#pragma unroll
            for (int i = 0; i < kNAcc; i += 4) {
                ptx::st_async_v4_b32(dst + 4u * i, __float_as_uint(acc0[i]), __float_as_uint(acc0[i + 1]),
                                     __float_as_uint(acc0[i + 2]), __float_as_uint(acc0[i + 3]), rbar);
                ptx::st_async_v4_b32(dst + 4u * (kNAcc + i), __float_as_uint(acc1[i]), __float_as_uint(acc1[i + 1]),
                                     __float_as_uint(acc1[i + 2]), __float_as_uint(acc1[i + 3]), rbar);
            }
            return false;
        }
        if (mt == 0) sm90::mbar_arrive_expect_tx(bar.xfull(), kMathThreads * kBN * 4);
        ptx::mbarrier_wait_parity_cluster(bar.xfull(), xcnt & 1u);
        const float* other = reinterpret_cast<const float*>(sm + L::kXBuf) + mt * kBN;
#pragma unroll
        for (int i = 0; i < kNAcc; i += 4) {
            const float4 a = *reinterpret_cast<const float4*>(other + i);
            const float4 b = *reinterpret_cast<const float4*>(other + kNAcc + i);
            acc0[i] += a.x, acc0[i + 1] += a.y, acc0[i + 2] += a.z, acc0[i + 3] += a.w;
            acc1[i] += b.x, acc1[i + 1] += b.y, acc1[i + 2] += b.z, acc1[i + 3] += b.w;
        }
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();  // every thread's reads before the buffer goes back
        if (mt == 0) ptx::mbarrier_arrive_remote(ptx::mapa_shared(bar.xempty(), 1));
        return true;
    }

    // ---- WG0 warp 0, one lane: scheduler + weight TMA --------------------------------------------------
    static GLM5_DEVICE void weight_producer(const CUtensorMap* tm_w13, const CUtensorMap* tm_w2, const Params& p,
                                            uint8_t* sm, uint32_t sbase, const Bars& bar, const TraceBuf& tr) {
        const int num_tasks = p.ctrl[0];
        int32_t* desc_ring = reinterpret_cast<int32_t*>(sm + L::kDesc);
        const uint64_t policy = sm90::l2_policy_evict_first();
        uint32_t it = 0;
        [[maybe_unused]] const uint32_t rank = kPair ? ptx::cluster_ctarank() : 0u;
        [[maybe_unused]] bool exhausted = false;
        for (int n = 0;; ++n) {
            const int slot = n % kTaskSlots;
            const uint32_t tpar = (n / kTaskSlots) & 1u;
            int t, pair = 0;
            if constexpr (kPair) {
                // The cluster's claim c (entries c, c + 1): rank r runs c + r. Once a claim reached the end of the
                // list (c + 2 >= num_tasks) neither rank claims again (rank 1 would wait for a forward that never
                // comes), so both stop at the same claim.
                const int c = exhausted ? num_tasks : pair_claim(p, sm, sbase, bar, n, rank);
                exhausted = c + 2 >= num_tasks;
                t = c + static_cast<int>(rank);
                // both entries one split-K tile's K halves (half r on rank r): the DSMEM hand-off; both ranks agree
                if (c + 1 < num_tasks) {
                    const int32_t d0 = p.tasks[c], d1 = p.tasks[c + 1];
                    pair = task_split(d0) && task_half(d0) == 0 && (d0 | (1 << 14)) == d1;
                }
            } else {
                t = atomicAdd(&p.ctrl[1], 1);
            }
            const int32_t desc = t < num_tasks ? p.tasks[t] : kTaskEnd;
            if constexpr (kTrace) {
                if (!task_is_end(desc)) tr.put(n, 0, globaltimer_ns()), tr.put(n, 7, desc);
            }
            sm90::mbar_wait(bar.tempty(slot), tpar ^ 1u);
            desc_ring[slot] = desc;
            if constexpr (kPair) reinterpret_cast<int32_t*>(sm + L::kPairFlag)[slot] = pair;
            sm90::mbar_arrive(bar.tfull(slot));
            if (task_is_end(desc)) break;
            const int e = task_expert(desc), rt = task_rt(desc);
            const bool fc2 = task_fc2(desc);
            // FC2: 2-D map over w2 [E_tot * H, I], box = kRows rows at row0. FC1: 5-D map over w13 whose
            // box (dims: K, 8 rows, gate|up, group of 8 rows, expert) lands rows in the interleaved order
            // g0..7 u0..7 g8..15 ...: tile rt = 16 groups of 8 channels of expert e (wide: pass q = groups
            // [8 q, 8 q + 8) of them, a box of 8 groups). The host decides whether w13 is natural (gate || up)
            // or pre-interleaved through the map's strides.
            const int row0 = e * kH + rt * kRows;
            const int nk = fc2 ? kKb2 : (task_split(desc) ? kKb1 / 2 : kKb1 * kPasses);
            const int kb0 = task_half(desc) * (kKb1 / 2);
            // Read exactly once unless the expert has several token blocks (those re-read it from L2).
            const bool once = p.expert_cnt[e] <= kBN;
            [[maybe_unused]] uint32_t empty_wait = 0;  // 32-bit: the trace build's loader warps have no registers to spare
            for (int kb = 0; kb < nk; ++kb, ++it) {
                const int s = it % kStages;
                if constexpr (kTrace) {
                    const uint32_t c0 = static_cast<uint32_t>(clock_cycles());
                    sm90::mbar_wait(bar.empty(s), ((it / kStages) & 1u) ^ 1u);
                    empty_wait += static_cast<uint32_t>(clock_cycles()) - c0;
                } else {
                    sm90::mbar_wait(bar.empty(s), ((it / kStages) & 1u) ^ 1u);
                }
                if constexpr (kNoLoad) {
                    sm90::mbar_arrive(bar.full(s));
                    continue;
                }
                sm90::mbar_arrive_expect_tx(bar.full(s), L::kWStage);
                const uint32_t dst = sbase + L::kW + s * L::kWStage;
                // FC1 pass (wide) and K block inside it
                const int pass = fc2 || kPasses == 1 ? 0 : kb / kKb1;
                const int k0 = (kb0 + kb - pass * kKb1) * kBK;
                const int grp = rt * (kTileRows / 16) + pass * (kRows / 16);
                if (fc2) {
                    if (once)
                        sm90::tma_load_2d_hint(tm_w2, dst, bar.full(s), k0, row0, policy);
                    else
                        sm90::tma_load_2d(tm_w2, dst, bar.full(s), k0, row0);
                } else {
                    if (once)
                        sm90::tma_load_5d_hint(tm_w13, dst, bar.full(s), k0, 0, 0, grp, e, policy);
                    else
                        sm90::tma_load_5d(tm_w13, dst, bar.full(s), k0, 0, 0, grp, e);
                }
            }
            if constexpr (kTrace) tr.put(n, 11, empty_wait);
        }
    }

    // ---- the token pool's dispatch copy (pool builds, kernel start) ---------------------------------------------
    // Pair row r <- token row of pair_list[r] (x8 and its scales), rows spread over the kPoolCopyWarps copy warps of
    // every CTA; then count this warp done (release, ctrl[5]). FC1 loads wait for all of them (act_loader).
    // kManyInFlight (a wide build's math warp): all 12 of a lane's 16-byte loads of a row in flight before its stores
    // (48 registers); otherwise 4 (a loader warp has 56 registers in all). The copy is latency-bound: with the loader
    // warps alone (6 KB in flight per CTA) it took ~100 us at (a) 1024 tokens and ~560 us at 4096 before the first FC1
    // stage (session-13 trace: the first-stage wait of the pool builds).
    template <bool kManyInFlight>
    static GLM5_DEVICE void pool_copy(const Params& p, int w0, uint32_t lane) {
        constexpr int kChunks = kH / 16 / 32;  // 16-byte chunks per lane and row
        static_assert(kH % 512 == 0, "pool copy: whole 16-byte chunks per lane");
        const int rows = p.ctrl[4];
        const int nw = static_cast<int>(gridDim.x) * kPoolCopyWarps;
        if constexpr (kEP) {
            // EP: a remote row costs an NVLink round trip per batch of loads, so a row is split into parts of 4 chunks
            // per lane (2 KB at H = 6144), each one work item with all its loads (and part 0 also the row's scales) in
            // flight at once: one round trip per item, and at decode sizes (a few rows) more warps share the rows.
            constexpr int kPer = kChunks < 4 ? kChunks : 4, kParts = (kChunks + kPer - 1) / kPer;
            static_assert(kH / kBK <= 64, "EP pool copy: at most 2 scales per lane");
            for (int it = w0; it < rows * kParts; it += nw) {
                const int r = it / kParts, part = it - r * kParts;
                const int32_t c = p.pair_list[r];
                if (c < 0) continue;  // an expert's alignment padding
                const uint8_t* src = pair_x(p, c) + 16 * lane + 512 * kPer * part;
                uint8_t* dst = p.pool + static_cast<int64_t>(r) * kH + 16 * lane + 512 * kPer * part;
                const float* xs = pair_xs(p, c);
                ptx::u32x4 v[kPer];
#pragma unroll
                for (int q = 0; q < kPer; ++q)
                    if (kPer * part + q < kChunks) v[q] = ptx::ld_global_v4(src + 512 * q);
                float sc[2] = {0.f, 0.f};
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    if (part == 0 && lane + 32 * h < kH / kBK) sc[h] = xs[lane + 32 * h];
#pragma unroll
                for (int q = 0; q < kPer; ++q)
                    if (kPer * part + q < kChunks) ptx::st_global_v4(dst + 512 * q, v[q]);
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    if (part == 0 && lane + 32 * h < kH / kBK)
                        p.pool_scale[static_cast<int64_t>(lane + 32 * h) * p.pairs_cap + r] = sc[h];
            }
        }
        for (int r = w0; r < (kEP ? 0 : rows); r += nw) {  // single GPU, one warp per row (EP: the row parts above)
            const int32_t c = p.pair_list[r];
            if (c < 0) continue;  // an expert's alignment padding
            const int t = c >> 4;
            const uint8_t* src = kEP ? pair_x(p, c) + 16 * lane : p.x + static_cast<int64_t>(t) * kH + 16 * lane;
            uint8_t* dst = p.pool + static_cast<int64_t>(r) * kH + 16 * lane;
            if constexpr (kManyInFlight) {
                ptx::u32x4 v[kChunks];
#pragma unroll
                for (int q = 0; q < kChunks; ++q) v[q] = ptx::ld_global_v4(src + 512 * q);
#pragma unroll
                for (int q = 0; q < kChunks; ++q) ptx::st_global_v4(dst + 512 * q, v[q]);
            } else {
#pragma unroll 4
                for (int q = 0; q < kChunks; ++q) ptx::st_global_v4(dst + 512 * q, ptx::ld_global_v4(src + 512 * q));
            }
            for (int g = lane; g < kH / kBK; g += 32)
                p.pool_scale[static_cast<int64_t>(g) * p.pairs_cap + r] =
                    kEP ? pair_xs(p, c)[g] : p.x_scale[static_cast<int64_t>(t) * (kH / kBK) + g];
        }
        fence_proxy_async_global();  // for the TMA reads of these rows (async proxy)
        __threadfence();
        __syncwarp();
        if (lane == 0) red_release_gpu_add(p.ctrl + 5, 1);
    }

    // ---- WG0 warps 1..kLoaderWarps: activation loaders ----------------------------------------------------
    // Warp 1 (lw 0) publishes the task's column info (pair codes, routing weights, {p0, cnt, blk}); every
    // loader warp then gathers its share of the token rows of each stage (row i goes to warp (i / 4) % kLoaderWarps)
    // with 16-byte cp.async, and each of its lanes arrives on the stage's full barrier once its copies land. One warp
    // could not keep up from 32-token blocks on: its cp.async issue held the ring (session 9 trace: the weight
    // producer waited 59 of a 74 us FC1 task for free stages, the loader 8, the math 26 for full stages).
    static GLM5_DEVICE void act_loader(const CUtensorMap* tm_pool, const CUtensorMap* tm_act, const Params& p, uint8_t* sm,
                                       uint32_t sbase, const Bars& bar, const TraceBuf& tr, int lw) {
        const uint32_t lane = lane_id();
        const int32_t* desc_ring = reinterpret_cast<const int32_t*>(sm + L::kDesc);
        int32_t* meta = reinterpret_cast<int32_t*>(sm + L::kMeta);
        [[maybe_unused]] bool pooled = false;
        if constexpr (kPool) pool_copy<false>(p, static_cast<int>(blockIdx.x) * kPoolCopyWarps + lw, lane);
        uint32_t it = 0;
        for (int n = 0;; ++n) {
            const int slot = n % kTaskSlots;
            const uint32_t tpar = (n / kTaskSlots) & 1u;
            sm90::mbar_wait(bar.tfull(slot), tpar);
            const int32_t desc = desc_ring[slot];
            if (task_is_end(desc)) break;
            const bool fc2 = task_fc2(desc);
            int32_t* code = reinterpret_cast<int32_t*>(sm + L::kCode) + slot * kBN;
            int p0, cnt, blk;
            if (lw == 0) {
                // Column info of this task slot (the math warps read it in their epilogue).
                const int e = task_expert(desc), b = task_block(desc);
                p0 = p.expert_off[e] + b * kBN;
                cnt = min(kBN, p.expert_cnt[e] - b * kBN);
                blk = p.blk_base[e] + b;
                float* wgt = reinterpret_cast<float*>(sm + L::kWgt) + slot * kBN;
                for (int i = lane; i < kBN; i += 32) {
                    const int32_t c = i < cnt ? p.pair_list[p0 + i] : -1;
                    code[i] = c;
                    float w = 0.f;
                    if (c >= 0) {
                        if constexpr (kEP) {
                            w = p.pair_weight[p0 + i];  // the plan's copy (the source rank's topk weight)
                        } else {
                            const int tt = c >> 4, jj = c & 15;
                            w = jj < p.topk ? p.topk_w[static_cast<int64_t>(tt) * p.topk + jj] : p.shared_weight;
                        }
                    }
                    wgt[i] = w;
                }
                if (lane == 0) meta[slot * 4 + 0] = p0, meta[slot * 4 + 1] = cnt, meta[slot * 4 + 2] = blk;
                __syncwarp();
                sm90::mbar_arrive(bar.tinfo(slot));
            } else {
                // the other loader warps read what warp 1 published (the slot stays theirs until they arrive on tempty)
                sm90::mbar_wait(bar.tinfo(slot), tpar);
                p0 = meta[slot * 4 + 0], cnt = meta[slot * 4 + 1], blk = meta[slot * 4 + 2];
            }
            if (fc2) {  // FC2 input = FC1 output of this (expert, token block): all kT1 row tiles must be done
                if (lane == 0) {
                    const int32_t* ctr = p.fc1_done + blk;
                    if (ld_acquire_gpu(ctr) < kT1) {
                        if constexpr (kTrace) {
                            if (lw == 0) tr.put(n, 1, clock_cycles());
                        }
                        spin_acquire_geq(ctr, kT1, [&] {
#ifdef GLM5_MEGAMOE_TIMEOUT_PRINTF
                            printf("glm5 megamoe: fc1_done timeout: block %d token-block %d count %d of %d (cta %d)\n",
                                   blk, task_block(desc), ld_acquire_gpu(ctr), kT1, blockIdx.x);
#endif
                        });
                        if constexpr (kTrace) {
                            if (lw == 0) tr.put(n, 2, clock_cycles());
                        }
                    }
                }
                __syncwarp();
                // each lane's own acquire of the (only growing) counter: its cp.async reads below are then ordered
                // after the FC1 tiles' releases without relying on bar.warp.sync for cross-lane memory ordering
                while (ld_acquire_gpu(p.fc1_done + blk) < kT1) {  // lane 0 saw >= kT1: at most a few re-reads
                }
                if constexpr (kPool) fence_proxy_async_global();  // the rows below are read through the async proxy
            }
            if constexpr (kPool) {
                if (!fc2 && !pooled) {  // every copy warp of the grid has copied its pool rows
                    const int32_t want = static_cast<int32_t>(gridDim.x) * kPoolCopyWarps;
                    if (lane == 0) spin_acquire_geq(p.ctrl + 5, want, [] {});
                    __syncwarp();
                    while (ld_acquire_gpu(p.ctrl + 5) < want) {  // each lane's own acquire (as for fc1_done)
                    }
                    fence_proxy_async_global();  // the pool rows are read through the async proxy (TMA)
                    pooled = true;
                }
            }
            const int nk = fc2 ? kKb2 : (task_split(desc) ? kKb1 / 2 : kKb1 * kPasses);
            const int chunk = lane & 7;
            [[maybe_unused]] uint32_t empty_wait = 0;  // 32-bit: the trace build's loader warps have no registers to spare
            for (int kb = task_half(desc) * (kKb1 / 2), kend = kb + nk; kb < kend; ++kb, ++it) {
                const int s = it % kStages;
                if constexpr (kTrace) {
                    const uint32_t c0 = static_cast<uint32_t>(clock_cycles());
                    sm90::mbar_wait(bar.empty(s), ((it / kStages) & 1u) ^ 1u);
                    empty_wait += static_cast<uint32_t>(clock_cycles()) - c0;
                } else {
                    sm90::mbar_wait(bar.empty(s), ((it / kStages) & 1u) ^ 1u);
                }
                const uint32_t dst = sbase + L::kA + s * L::kAStage;
                const int kc = fc2 || kPasses == 1 ? kb : kb % kKb1;  // K block (wide FC1: both passes read x)
                if constexpr (kNoLoad) {
                    sm90::cp_async_16_mbar_arrive(bar.full(s));  // nothing pending: arrives at once
                    continue;
                }
                if constexpr (kPool) {
                    // one box of kBN rows from row p0 (rows past cnt: the next expert's, padding rows (stale), rows
                    // never written this launch (the pool and act are zeroed when allocated), or zero fill past
                    // the tensor: columns the epilogues never read); its bytes raise the stage's transaction count
                    // before this lane's arrival below, so the phase cannot complete without them
                    if (lw == 0 && lane == 0) {
                        sm90::mbar_expect_tx(bar.full(s), static_cast<uint32_t>(kBN * kBK));
                        sm90::tma_load_2d(fc2 ? tm_act : tm_pool, dst, bar.full(s), kc * kBK, p0);
                    }
                } else {
                    for (int i = 4 * lw + (lane >> 3); i < cnt; i += 4 * kLoaderWarps) {
                        const uint8_t* src =
                            fc2 ? p.act + static_cast<int64_t>(p0 + i) * kI + kc * kBK + chunk * 16
                                : p.x + static_cast<int64_t>(code[i] >> 4) * kH + kc * kBK + chunk * 16;
                        ptx::cp_async_16(dst + i * kBK + ((chunk ^ (i & 7)) << 4), src, 16);
                    }
                }
                const uint32_t sdst = sbase + L::kSA + s * kBN * 4;
                if (fc2 || kPool) {  // 4 scales per 16-byte copy (p0 is a multiple of 8, pairs_cap of 4)
                    const float* sc = fc2 ? p.act_scale : p.pool_scale;
                    for (int q = 32 * lw + lane; q < (cnt + 3) / 4; q += 32 * kLoaderWarps)
                        ptx::cp_async_16(sdst + q * 16, sc + static_cast<int64_t>(kc) * p.pairs_cap + p0 + 4 * q, 16);
                } else {
                    for (int i = 32 * lw + lane; i < cnt; i += 32 * kLoaderWarps)
                        cp_async_4(sdst + i * 4, p.x_scale + static_cast<int64_t>(code[i] >> 4) * (kH / kBK) + kc);
                }
                sm90::cp_async_16_mbar_arrive(bar.full(s));
            }
            if constexpr (kTrace) {
                if (lw == 0 && lane == 0) tr.put(n, 12, empty_wait);
            }
            if (lane == 0) sm90::mbar_arrive(bar.tempty(slot));  // done with this slot's descriptor and column info
        }
    }

    // ---- math warpgroups ----------------------------------------------------------------------------
    // Per task the wgmma width follows the token block's live columns (mma_width: the smallest supported N >= cnt,
    // at most kBN): a 40-token block of a bn64 kernel runs m64n48 instead of m64n64. Columns [kN, kBN) of the
    // accumulators stay 0 and columns [cnt, kN) multiply whatever the stage rows past cnt hold; the epilogues read
    // columns < cnt only, and a column's dot products do not depend on the width, so the results are unchanged.
    static GLM5_DEVICE int mma_width(int cnt) {
        const int w = cnt <= 8 ? 8 : cnt <= 16 ? 16 : cnt <= 24 ? 24 : cnt <= 32 ? 32 : cnt <= 48 ? 48 : cnt <= 64 ? 64
                    : cnt <= 96 ? 96 : 128;
        return w < kBN ? w : kBN;
    }

    // The column scales of one stage that this thread folds with (columns 8 j + 2 t4 and + 1, j < kN / 8). The wide
    // builds read them right after the stage's full wait, before the wgmma issue, so their shared-memory latency hides
    // behind the wgmma (read after the wait, it was exposed: Nsight Compute source counters, session 13; 3-4 % at (a)
    // 1024-4096). The narrow builds read them after each half's wait (k_loop).
    template <int kN>
    static GLM5_DEVICE void load_col_scales(float2 (&sc)[kN / 8], const float* sa, int t4) {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) sc[j] = *reinterpret_cast<const float2*>(sa + 8 * j + 2 * t4);
    }

    // Fold one m64 half's temporary into its accumulator: acc += tmp * (x_scale[col] * w_scale[row]), columns < kN.
    // Rows g (d[4j+0..1]) use s_lo, rows g+8 (d[4j+2..3]) use s_hi (FC1: gate / up block scales).
    template <int kN>
    static GLM5_DEVICE void fold(float (&acc)[kNAcc], const float (&tmp)[kN / 2], const float2 (&sc)[kN / 8], float s_lo,
                                 float s_hi) {
        if constexpr (kNoFold) {  // diagnostic: the temporary consumed, no scaling
            acc[0] += tmp[0];
            return;
        }
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
            const float a0 = sc[j].x, a1 = sc[j].y;
            acc[4 * j + 0] = fmaf(tmp[4 * j + 0], a0 * s_lo, acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(tmp[4 * j + 1], a1 * s_lo, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(tmp[4 * j + 2], a0 * s_hi, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(tmp[4 * j + 3], a1 * s_hi, acc[4 * j + 3]);
        }
    }

    // Token-major fold: acc += tmp * (x_scale[row] * w_scale[column group]): rows g / g + 8 (this thread's two tokens)
    // with the gate (even 8-column groups) / up (odd) block scale: products p_lo0 / p_hi0 (token g), p_lo1 / p_hi1 (g + 8).
    static GLM5_DEVICE void fold_tm(float (&acc)[kNAcc], const float (&tmp)[kNAcc], float p_lo0, float p_hi0,
                                    float p_lo1, float p_hi1) {
        if constexpr (kNoFold) {
            acc[0] += tmp[0];
            return;
        }
#pragma unroll
        for (int j = 0; j < kNJ; ++j) {
            const float s0 = (j & 1) ? p_hi0 : p_lo0, s1 = (j & 1) ? p_hi1 : p_lo1;
            acc[4 * j + 0] = fmaf(tmp[4 * j + 0], s0, acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(tmp[4 * j + 1], s0, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(tmp[4 * j + 2], s1, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(tmp[4 * j + 3], s1, acc[4 * j + 3]);
        }
    }

    template <int kN>
    static GLM5_DEVICE void issue_half(float (&t)[kN / 2], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
        for (int k = 0; k < kBK / 32; ++k)
            sm90::wgmma_m64k32_e4m3<kN>(t, sm90::smem_desc_k128sw(a_addr + 32 * k), sm90::smem_desc_k128sw(b_addr + 32 * k),
                                        k > 0);
    }

    // Trace build: K-loop clocks of one task (columns 10 / 16 / 17); the other builds never touch them.
    struct KClocks {
        uint32_t stage_wait, mma_wait, fold;
    };
    // clock64 in the trace build, 0 (no instruction) in the others
    static GLM5_DEVICE uint32_t trace_clock() {
        if constexpr (kTrace)
            return static_cast<uint32_t>(clock_cycles());
        else
            return 0u;
    }

    // The K loop of one task (wide FC1: of one pass) at wgmma width kN: nk stages from ring position `it` (advanced),
    // folding into acc0 / acc1 (wide: acc0 only) with the block scales at s_lo_ptr / s_hi_ptr (one per stage).
    template <int kN>
    static GLM5_DEVICE void k_loop(uint8_t* sm, uint32_t sbase, const Bars& bar, int nk, uint32_t& it, int wg, int lane,
                                   int t4, const float* s_lo_ptr, const float* s_hi_ptr, float (&acc0)[kNAcc],
                                   float (&acc1)[kNAcc1], [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n,
                                   [[maybe_unused]] int mt, [[maybe_unused]] int pass,
                                   [[maybe_unused]] KClocks& clk, [[maybe_unused]] bool live = true) {
        // two temporaries: both halves' wgmma in flight (kN <= 64: 2 x 32 + 2 x 32 fragment floats); wide: one half,
        // one temporary (64 + 64), and the other math warpgroup's wgmma overlaps this one's fold
        float s_lo = __ldg(s_lo_ptr), s_hi = __ldg(s_hi_ptr);
        for (int kb = 0; kb < nk; ++kb, ++it) {
            const int s = it % kStages;
            const float cur_lo = s_lo, cur_hi = s_hi;
            if (kb + 1 < nk) s_lo = __ldg(s_lo_ptr + kb + 1), s_hi = __ldg(s_hi_ptr + kb + 1);
            if constexpr (kTrace) {
                const uint32_t c0 = static_cast<uint32_t>(clock_cycles());
                sm90::mbar_wait<kTrapOutOfLine>(bar.full(s), (it / kStages) & 1u);
                if (kb > 0 || pass > 0) clk.stage_wait += static_cast<uint32_t>(clock_cycles()) - c0;
                if (mt == 0 && kb == 0 && pass == 0) tr.put(n, 4, clock_cycles());
            } else {
                sm90::mbar_wait<kTrapOutOfLine>(bar.full(s), (it / kStages) & 1u);
            }
            // the activation half of the stage came through cp.async (generic proxy) and wgmma reads it through the async
            // proxy; the pool builds load both halves by TMA (async proxy already), so they skip the fence
            if constexpr (!kPool || kNoLoad) sm90::fence_proxy_async_smem();  // (kNoLoad: stages zeroed by generic stores)
            const uint32_t a_addr = sbase + L::kW + s * L::kWStage + wg * (kRows / 2 * kBK);
            const uint32_t b_addr = sbase + L::kA + s * L::kAStage;
            const float* sa = reinterpret_cast<const float*>(sm + L::kSA) + s * kBN;
            if constexpr (kTokenMajor) {
                if (!live) {  // (warp-uniform) nothing of this stage to compute: free it
                    __syncwarp();
                    if (lane == 0) sm90::mbar_arrive(bar.empty(s));
                    continue;
                }
                // this thread's tokens (rows g, g + 8 of its warp's 16) and their scales, read before the issue
                const int tok = (kWide ? 64 * wg : 0) + 16 * ((mt >> 5) & 3) + (lane >> 2);
                const float r0 = sa[tok], r1 = sa[tok + 8];
                float tmp0[kNAcc];
                sm90::wgmma_fence();
                // A: the warpgroup's 64 token rows; B: its 128 weight rows (wide: the whole stage; narrow: a_addr)
                issue_half<kTmN>(tmp0, kWide ? b_addr + wg * (64 * kBK) : b_addr,
                                 kWide ? sbase + L::kW + s * L::kWStage : a_addr);
                sm90::wgmma_commit();
                [[maybe_unused]] const uint32_t c0 = trace_clock();
                sm90::wgmma_wait<0>();
                sm90::fence_operands(tmp0);
                [[maybe_unused]] const uint32_t c1 = trace_clock();
                // (x_scale * w_scale in this order, as fold's: the same fp32 products)
                fold_tm(acc0, tmp0, r0 * cur_lo, r0 * cur_hi, r1 * cur_lo, r1 * cur_hi);
                if constexpr (kTrace) {
                    sm90::fence_operands(acc0);
                    clk.mma_wait += c1 - c0, clk.fold += trace_clock() - c1;
                }
                __syncwarp();
                if (lane == 0) sm90::mbar_arrive(bar.empty(s));
                continue;
            } else {  // swapAB: weights on M, tokens on N
                float2 sc[kN / 8];
                if constexpr (kWide) load_col_scales<kN>(sc, sa, t4);
                if constexpr (kWide) {
                    float tmp0[kN / 2];
                    sm90::wgmma_fence();
                    issue_half<kN>(tmp0, a_addr, b_addr);
                    sm90::wgmma_commit();
                    [[maybe_unused]] const uint32_t c0 = trace_clock();
                    sm90::wgmma_wait<0>();
                    sm90::fence_operands(tmp0);
                    [[maybe_unused]] const uint32_t c1 = trace_clock();
                    fold<kN>(acc0, tmp0, sc, cur_lo, cur_hi);
                    if constexpr (kTrace) {
                        sm90::fence_operands(acc0);
                        clk.mma_wait += c1 - c0, clk.fold += trace_clock() - c1;
                    }
                } else {
                    float tmp0[kN / 2], tmp1[kN / 2];
                    sm90::wgmma_fence();
                    issue_half<kN>(tmp0, a_addr, b_addr);
                    sm90::wgmma_commit();
                    issue_half<kN>(tmp1, a_addr + 64 * kBK, b_addr);
                    sm90::wgmma_commit();
                    [[maybe_unused]] const uint32_t c0 = trace_clock();
                    sm90::wgmma_wait<1>();
                    sm90::fence_operands(tmp0);
                    [[maybe_unused]] const uint32_t c1 = trace_clock();
                    // narrow builds: the scales after the wait, for each fold (read before the issue, they spilled bn64
                    // under the inline trap's register cap, or cost 3 % with the trap out of line; read once for both
                    // folds they spilled too: session 13)
                    load_col_scales<kN>(sc, sa, t4);
                    fold<kN>(acc0, tmp0, sc, cur_lo, cur_hi);
                    if constexpr (kTrace) sm90::fence_operands(acc0);
                    [[maybe_unused]] const uint32_t c2 = trace_clock();
                    sm90::wgmma_wait<0>();
                    sm90::fence_operands(tmp1);
                    [[maybe_unused]] const uint32_t c3 = trace_clock();
                    load_col_scales<kN>(sc, sa, t4);  // (wgmma_wait's memory clobber: read again)
                    fold<kN>(acc1, tmp1, sc, cur_lo, cur_hi);
                    if constexpr (kTrace) {
                        sm90::fence_operands(acc1);
                        clk.mma_wait += (c1 - c0) + (c3 - c2), clk.fold += (c2 - c1) + (trace_clock() - c3);
                    }
                }
                __syncwarp();
                if (lane == 0) sm90::mbar_arrive(bar.empty(s));
            }
        }
        if constexpr (kTrace) {
            if (mt == 0)  // (wide FC1: pass 1 rewrites them)
                tr.put(n, 5, clock_cycles()), tr.put(n, 10, clk.stage_wait), tr.put(n, 16, clk.mma_wait),
                    tr.put(n, 17, clk.fold);
        }
    }

    // A cannot-happen stop in the math warpgroups' code. The wide build traps out of line (and waits with
    // mbar_wait<true>): an inline trap there capped ptxas at the 168-register launch allocation and the build spilled
    // (arch.cuh trap_out_of_line); the narrow builds keep the inline trap (their register allocation, measured).
    static GLM5_DEVICE void math_trap() {
        if constexpr (kTrapOutOfLine)
            glm5::trap_out_of_line();
        else
            __trap();
    }

    // k_loop at the task's wgmma width (widths past kBN are discarded branches).
    static GLM5_DEVICE void k_loop_width(int width, uint8_t* sm, uint32_t sbase, const Bars& bar, int nk, uint32_t& it,
                                         int wg, int lane, int t4, const float* s_lo_ptr, const float* s_hi_ptr,
                                         float (&acc0)[kNAcc], float (&acc1)[kNAcc1], const TraceBuf& tr, int n, int mt,
                                         int pass, KClocks& clk) {
        if constexpr (kTokenMajor) {  // N = the stage's 128 weight rows, whatever the live tokens
            // warpgroup 1's 64 token rows are all padding when the block holds at most 64 tokens (width <= 64): it
            // then only consumes the stages (its accumulator stays zero; no row of it is stored)
            k_loop<kBN>(sm, sbase, bar, nk, it, wg, lane, t4, s_lo_ptr, s_hi_ptr, acc0, acc1, tr, n, mt, pass, clk,
                        !kWide || wg == 0 || width > 64);
            return;
        }
        switch (width) {
#define GLM5_MEGAMOE_K_LOOP(N)                                                                                       \
    case N:                                                                                                          \
        if constexpr (N <= kBN)                                                                                      \
            k_loop<N>(sm, sbase, bar, nk, it, wg, lane, t4, s_lo_ptr, s_hi_ptr, acc0, acc1, tr, n, mt, pass, clk);       \
        break;
            GLM5_MEGAMOE_K_LOOP(8)
            GLM5_MEGAMOE_K_LOOP(16)
            GLM5_MEGAMOE_K_LOOP(24)
            GLM5_MEGAMOE_K_LOOP(32)
            GLM5_MEGAMOE_K_LOOP(48)
            GLM5_MEGAMOE_K_LOOP(64)
            GLM5_MEGAMOE_K_LOOP(96)
            GLM5_MEGAMOE_K_LOOP(128)
#undef GLM5_MEGAMOE_K_LOOP
            default: math_trap();  // mma_width returns one of the cases
        }
    }

    static GLM5_DEVICE void math(const Params& p, uint8_t* sm, uint32_t sbase, const Bars& bar, const TraceBuf& tr) {
        const int mt = threadIdx.x - 128;  // 0..255
        const int wg = mt >> 7;            // math warpgroup: weight rows [128 wg, 128 wg + 128) of the tile (wide: 64 wg)
        const int w = (mt >> 5) & 3;       // warp inside the warpgroup
        const int lane = mt & 31;
        const int t4 = lane & 3;
        // (the narrow builds keep 4 loads in flight: their inline trap caps the registers, and 12 spilled bn64)
        if constexpr (kPool)
            pool_copy<kTrapOutOfLine>(p, static_cast<int>(blockIdx.x) * kPoolCopyWarps + kLoaderWarps + (mt >> 5), lane);
        const int32_t* desc_ring = reinterpret_cast<const int32_t*>(sm + L::kDesc);
        const int32_t* meta = reinterpret_cast<const int32_t*>(sm + L::kMeta);
        uint32_t it = 0;
        [[maybe_unused]] uint32_t xcnt = 0;  // kPair: paired split-K exchanges so far
        for (int n = 0;; ++n) {
            const int slot = n % kTaskSlots;
            const uint32_t tpar = (n / kTaskSlots) & 1u;
            sm90::mbar_wait<kTrapOutOfLine>(bar.tfull(slot), tpar);
            const int32_t desc = desc_ring[slot];
            [[maybe_unused]] const bool paired = kPair && reinterpret_cast<const int32_t*>(sm + L::kPairFlag)[slot] != 0;
            if (task_is_end(desc)) {
                if constexpr (kPool) {
                    if (kEP || (p.flags & kFlagEndCombine)) end_combine(p, mt, lane);
                }
                break;
            }
            if constexpr (kTrace) {
                if (mt == 0) tr.put(n, 3, clock_cycles()), tr.put(n, 8, globaltimer_ns());
            }
            const int e = task_expert(desc), rt = task_rt(desc);
            const bool fc2 = task_fc2(desc);
            const int nk = fc2 ? kKb2 : (task_split(desc) ? kKb1 / 2 : kKb1);  // per pass
            const int kb0 = task_half(desc) * (kKb1 / 2);
            // Weight block scales of this warpgroup's rows, one per K stage (prefetched one stage ahead). FC1: the gate /
            // up blocks of quant group rt (both passes); FC2: the 128-row block of this warpgroup's rows.
            const float* s_lo_ptr = fc2 ? p.w2_scale + static_cast<int64_t>(e * (kH / 128) + (kWide ? rt : 2 * rt + wg)) * kKb2
                                        : p.w13_scale + static_cast<int64_t>(e * (2 * kI / 128) + rt) * kKb1 + kb0;
            const float* s_hi_ptr = fc2 ? s_lo_ptr : s_lo_ptr + static_cast<int64_t>(kI / 128) * kKb1;
            float acc0[kNAcc], acc1[kNAcc1];
#pragma unroll
            for (int i = 0; i < kNAcc; ++i) acc0[i] = 0.f;
#pragma unroll
            for (int i = 0; i < kNAcc1; ++i) acc1[i] = 0.f;
            // The loader publishes the task's column info before it loads any stage, so this wait adds nothing
            // to the first stage's.
            sm90::mbar_wait<kTrapOutOfLine>(bar.tinfo(slot), tpar);
            const int p0 = meta[slot * 4 + 0], cnt = meta[slot * 4 + 1], blk = meta[slot * 4 + 2];
            const int width = mma_width(cnt);
            [[maybe_unused]] KClocks clk{};  // trace build: K-loop clocks (columns 10, 16, 17)
            // (a forced-inline member, not a lambda: a lambda called twice (wide FC1) was outlined, which put the
            // accumulators it takes by reference in local memory)
            k_loop_width(width, sm, sbase, bar, nk, it, wg, lane, t4, s_lo_ptr, s_hi_ptr, acc0, acc1, tr, n, mt, 0, clk);
            if constexpr (kNoEpilogue) {  // diagnostic: FC1 only releases what FC2 waits for
                if (!fc2) {
                    if constexpr (kWide)  // the second pass's stages are streamed anyway
                        k_loop_width(width, sm, sbase, bar, nk, it, wg, lane, t4, s_lo_ptr, s_hi_ptr, acc0, acc1, tr, n,
                                     mt, 1, clk);
                    if (!task_split(desc) || task_half(desc) == 1) {  // one release per FC1 tile
                        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
                        if (mt == 0) red_release_gpu_add(p.fc1_done + blk, 1);
                    }
                }
                float z = 0.f;  // every accumulator stays live (else the folds would be dead code)
#pragma unroll
                for (int i = 0; i < kNAcc; ++i) z += acc0[i];
#pragma unroll
                for (int i = 0; i < kNAcc1; ++i) z += acc1[i];
                if (z == 0x1p100f) p.ctrl[7] = 1;
            } else if (fc2) {
                epilogue_fc2(p, sm, slot, rt, cnt, wg, w, lane, acc0, acc1, tr, n);
            } else if constexpr (kWide) {
                // pass 0 (channels [64 q, 64 q + 64) of the group for q = 0) -> bf16 stash; pass 1 -> both quantised
                if constexpr (kTokenMajor) tm_pair_order(acc0);
                wide_stash(sbase, acc0);
#pragma unroll
                for (int i = 0; i < kNAcc; ++i) acc0[i] = 0.f;
                k_loop_width(width, sm, sbase, bar, nk, it, wg, lane, t4, s_lo_ptr, s_hi_ptr, acc0, acc1, tr, n, mt, 1,
                             clk);
                float prev[kNAcc];  // pass 0's activations (gate registers; the rest unused)
                wide_unstash(sbase, prev);
                if constexpr (kTokenMajor) {
                    tm_pair_order(acc0);
                    epilogue_fc1_tm(p, sbase, rt, p0, cnt, blk, wg, w, lane, prev, acc0, tr, n);
                } else {
                    epilogue_fc1(p, sm, sbase, rt, p0, cnt, blk, wg, w, lane, prev, acc0, tr, n);
                }
            } else if constexpr (kTokenMajor) {  // narrow token-major: one pass, the 256-row group over both warpgroups
                tm_pair_order(acc0);
                epilogue_fc1_tmn(p, sm, sbase, rt, p0, cnt, blk, wg, w, lane, acc0, tr, n);
            } else if (!task_split(desc) ||
                       (kPair && paired ? pair_exchange(sm, sbase, bar, xcnt++, acc0, acc1)
                                        : split_exchange(p, sm, rt, blk, task_half(desc), acc0, acc1))) {
                epilogue_fc1(p, sm, sbase, rt, p0, cnt, blk, wg, w, lane, acc0, acc1, tr, n);
            }
            __syncwarp();
            if constexpr (kTrace) {
                if (mt == 0) tr.put(n, 6, clock_cycles()), tr.put(n, 9, globaltimer_ns());
            }
            if (lane == 0) sm90::mbar_arrive(bar.tempty(slot));
            if (mt == 0) red_relaxed_gpu_add(p.ctrl + 2, 1);  // diagnostics: tasks finished
        }
    }

    // Split-K FC1 tile: publish this half's fp32 partial, count the halves; the second finisher adds the
    // first one's partial (a + b: commutative, so the sum does not depend on who finishes last) and
    // runs the epilogue (returns true); the first finisher is done (false).
    static GLM5_DEVICE bool split_exchange(const Params& p, uint8_t* sm, int rt, int blk, int half,
                                           float (&acc0)[kNAcc], float (&acc1)[kNAcc1]) {
        const int mt = threadIdx.x - 128;
        const int tile = blk * kT1 + rt;
        float* mine = p.split_partial + (static_cast<int64_t>(tile) * 2 + half) * kMathThreads * kBN + mt * kBN;
#pragma unroll
        for (int i = 0; i < kNAcc; i += 4) {
            ptx::st_cg_f32x4(mine + i, make_float4(acc0[i], acc0[i + 1], acc0[i + 2], acc0[i + 3]));
            ptx::st_cg_f32x4(mine + kNAcc + i, make_float4(acc1[i], acc1[i + 1], acc1[i + 2], acc1[i + 3]));
        }
        handoff_fence();
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        int32_t* flag = reinterpret_cast<int32_t*>(sm + L::kFlag);
        if (mt == 0) {
            const int old = atom_acq_rel_gpu_add(p.split_ctr + tile, 1);
            if (old == 1) p.split_ctr[tile] = 0;  // back to zero at rest
            flag[0] = old;
        }
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        const bool last = flag[0] == 1;
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();  // flag[0] is reused by later epilogues
        if (!last) return false;
        handoff_fence();
        const float* other = p.split_partial + (static_cast<int64_t>(tile) * 2 + (half ^ 1)) * kMathThreads * kBN + mt * kBN;
#pragma unroll
        for (int i = 0; i < kNAcc; i += 4) {
            const float4 a = ptx::ld_cg_f32x4(other + i), b = ptx::ld_cg_f32x4(other + kNAcc + i);
            acc0[i] += a.x, acc0[i + 1] += a.y, acc0[i + 2] += a.z, acc0[i + 3] += a.w;
            acc1[i] += b.x, acc1[i + 1] += b.y, acc1[i + 2] += b.z, acc1[i + 3] += b.w;
        }
        return true;
    }

    // a = bf16(silu(bf16(g)) * bf16(u)) = bf16(bf16(g) / (1 + exp(-bf16(g))) * bf16(u)) of the (gate, up) row pairs in
    // `second` (and in `first` if kBoth), kept in the gate registers (d[4j + q], q < 2). The divisions skip nvcc's range
    // check when every lane's operands are in range (div_rn_fast_ok; a gate g >= -41 keeps 1 + exp(-g) <= 2^60): the
    // same bits, without a branch around each division.
    template <bool kBoth>
    static GLM5_DEVICE void swiglu(float (&first)[kNAcc], float (&second)[kNAcc]) {
        const auto div_unchecked = [](float a, float b) { return div_rn_nocheck(a, b); };
        const auto div_ieee = [](float a, float b) { return __fdiv_rn(a, b); };
        bool fast = true;
#pragma unroll
        for (int i = 0; i < kNAcc; i += 4) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const float g0 = round_bf16(first[i + q]), g1 = round_bf16(second[i + q]);
                fast &= (!kBoth || (g0 >= -41.0f && div_rn_fast_ok(g0, 1.0f))) && g1 >= -41.0f && div_rn_fast_ok(g1, 1.0f);
            }
        }
        auto run = [&](auto div) {
#pragma unroll
            for (int i = 0; i < kNAcc; i += 4) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
#pragma unroll
                    for (int h = kBoth ? 0 : 1; h < 2; ++h) {
                        float (&acc)[kNAcc] = h ? second : first;
                        const float gv = round_bf16(acc[i + q]), uv = round_bf16(acc[i + 2 + q]);
                        acc[i + q] = round_bf16(div(gv, 1.0f + expf(-gv)) * uv);
                    }
                }
            }
        };
        if (__all_sync(0xffffffffu, fast))
            run(div_unchecked);
        else
            run(div_ieee);
    }

    // Wide FC1, between the passes: pass 0's SwiGLU output (exact bf16) into this thread's 64 bytes of the FC1 staging
    // area, as 4 chunks laid out [chunk][256 threads] (16-byte stores, no bank conflicts). The staging area is free: the
    // previous FC1 epilogue's last reads of it come before its final math barrier.
    static GLM5_DEVICE void wide_stash(uint32_t sbase, float (&acc)[kNAcc]) {
        swiglu<false>(acc, acc);
        const int mt = threadIdx.x - 128;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint32_t u[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int j = 4 * c + r;  // 8-column group j: gate registers acc[4 j], acc[4 j + 1]
                u[r] = ptx::f32x2_to_bf16x2_rn(acc[4 * j], acc[4 * j + 1]);
            }
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(sbase + L::kOut + (c * kMathThreads + mt) * 16),
                         "r"(u[0]), "r"(u[1]), "r"(u[2]), "r"(u[3])
                         : "memory");
        }
    }

    // Wide FC1, after pass 1's K loop: this thread's pass-0 activations back into the gate registers of `acc`.
    static GLM5_DEVICE void wide_unstash(uint32_t sbase, float (&acc)[kNAcc]) {
        const int mt = threadIdx.x - 128;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint32_t u[4];
            ptx::lds_v4(sbase + L::kOut + (c * kMathThreads + mt) * 16, u[0], u[1], u[2], u[3]);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int j = 4 * c + r;
                acc[4 * j] = ptx::bf16lo_to_f32(u[r]), acc[4 * j + 1] = ptx::bf16hi_to_f32(u[r]);
            }
        }
    }

    // The end of every FC1 epilogue, once this tile's FP8 rows are staged in shared memory ([token][128 channels]) and
    // their scales written: the cnt rows to act (16-byte copies), then fc1_done += 1 (release) for the FC2 loaders.
    static GLM5_DEVICE void fc1_store_rows(const Params& p, uint32_t out_s, int rt, int p0, int cnt, int blk, int mt,
                                           [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n) {
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 14, clock_cycles());
        }
        for (int i = mt; i < cnt * (kBK / 16); i += kMathThreads) {
            const int row = i >> 3, c = i & 7;
            uint32_t a, b, c2, d;
            ptx::lds_v4(out_s + row * kBK + c * 16, a, b, c2, d);
            ptx::st_global_v4(p.act + static_cast<int64_t>(p0 + row) * kI + rt * kBK + c * 16, ptx::u32x4{a, b, c2, d});
        }
        if constexpr (kPool) fence_proxy_async_global();  // FC2 reads these rows through TMA (async proxy)
        handoff_fence();
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 15, clock_cycles());
        }
        if (mt == 0) red_release_gpu_add(p.fc1_done + blk, 1);
    }

    // Token-major FC1: reorder one pass's accumulator (index 4 j + 2 r + q: token g + 8 r, weight column 8 j + 2 t4 + q;
    // even groups j gate, odd up) into the (gate, up) pair order of swiglu / wide_stash: index 4 m + q the gate and
    // 4 m + 2 + q the up value of channel 8 jj + 2 t4 + q of token g + 8 r, m = 2 jj + r. A register renaming.
    static GLM5_DEVICE void tm_pair_order(float (&acc)[kNAcc]) {
        float t[kNAcc];
#pragma unroll
        for (int jj = 0; jj < kNJ / 2; ++jj) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    t[4 * (2 * jj + r) + q] = acc[4 * (2 * jj) + 2 * r + q];
                    t[4 * (2 * jj + r) + 2 + q] = acc[4 * (2 * jj + 1) + 2 * r + q];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kNAcc; ++i) acc[i] = t[i];
    }

    // Token-major FC1 after pass 1: SwiGLU, then per token (a row: 4 lanes hold its 128 channels, 32 each) the 1x128
    // amax by two shuffles, FP8 quant, the staged rows to global, fc1_done += 1. prev: pass 0's activations, acc: pass
    // 1's accumulator in pair order (tm_pair_order); index 4 m + q, m = 2 jj + r: token g + 8 r, channel
    // 64 pass + 8 jj + 2 t4 + q. The same values as epilogue_fc1 (SwiGLU and quant are per element, amax a max).
    static GLM5_DEVICE void epilogue_fc1_tm(const Params& p, uint32_t sbase, int rt, int p0, int cnt, int blk, int wg,
                                            int w, int lane, float (&prev)[kNAcc], float (&acc)[kNAcc],
                                            [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n) {
        const int g8 = lane >> 2, t4 = lane & 3;
        const int mt = threadIdx.x - 128;
        const auto div_unchecked = [](float a, float b) { return div_rn_nocheck(a, b); };
        const auto div_ieee = [](float a, float b) { return __fdiv_rn(a, b); };
        swiglu<false>(acc, acc);
        float amaxs[2];
        bool qfast = true;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float m = 0.f;
#pragma unroll
            for (int jj = 0; jj < kNJ / 2; ++jj) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const int i = 4 * (2 * jj + r) + q;
                    m = fmaxf(m, fmaxf(fabsf(prev[i]), fabsf(acc[i])));
                    qfast &= div_rn_fast_ok(prev[i], 1.0f) && div_rn_fast_ok(acc[i], 1.0f);
                }
            }
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            amaxs[r] = fmaxf(m, 1e-10f);
            qfast &= amaxs[r] <= 0x1p60f;
        }
        uint32_t q2s[2][kNJ];  // [r][2 jj + pass]: the FP8 pair of channels 64 pass + 8 jj + 2 t4, + 1
        float scs[2];
        auto quant = [&](auto div) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float sc = div(amaxs[r], 448.0f);
                scs[r] = sc;
#pragma unroll
                for (int jj = 0; jj < kNJ / 2; ++jj) {
                    const int i = 4 * (2 * jj + r);
                    q2s[r][2 * jj] = ptx::f32x2_to_e4m3x2_satfinite(div(prev[i], sc), div(prev[i + 1], sc));
                    q2s[r][2 * jj + 1] = ptx::f32x2_to_e4m3x2_satfinite(div(acc[i], sc), div(acc[i + 1], sc));
                }
            }
        };
        if (__all_sync(0xffffffffu, qfast))
            quant(div_unchecked);
        else
            quant(div_ieee);
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 13, clock_cycles());
        }
        // every thread has read its pass-0 stash (wide_unstash) before any staging byte over it is written
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        const uint32_t out_s = sbase + L::kOut;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = 64 * wg + 16 * w + g8 + 8 * r;
#pragma unroll
            for (int jj = 0; jj < kNJ / 2; ++jj) {
#pragma unroll
                for (int ps = 0; ps < 2; ++ps)
                    st_shared_u16(out_s + row * kBK + 64 * ps + 8 * jj + 2 * t4, q2s[r][2 * jj + ps]);
            }
            if (t4 == 0 && row < cnt) p.act_scale[static_cast<int64_t>(rt) * p.pairs_cap + p0 + row] = scs[r];
        }
        fc1_store_rows(p, out_s, rt, p0, cnt, blk, mt, tr, n);
    }

    // Narrow token-major FC1 (bn64): SwiGLU; per token the warpgroup's 64 channels' amax (4 lanes, two shuffles), then
    // the two warpgroups' partials exchanged through shared memory; FP8 quant, the staged rows to global, fc1_done += 1.
    // acc in pair order (tm_pair_order): index 4 m + q, m = 2 jj + r: token 16 w + g + 8 r, channel 64 wg + 8 jj + 2 t4
    // + q. The same values as epilogue_fc1.
    static GLM5_DEVICE void epilogue_fc1_tmn(const Params& p, uint8_t* sm, uint32_t sbase, int rt, int p0, int cnt,
                                             int blk, int wg, int w, int lane, float (&acc)[kNAcc],
                                             [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n) {
        const int g8 = lane >> 2, t4 = lane & 3;
        const int mt = threadIdx.x - 128;
        float* red = reinterpret_cast<float*>(sm + L::kRed);  // [2 warpgroups][kBN tokens]
        const auto div_unchecked = [](float a, float b) { return div_rn_nocheck(a, b); };
        const auto div_ieee = [](float a, float b) { return __fdiv_rn(a, b); };
        swiglu<false>(acc, acc);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float m = 0.f;
#pragma unroll
            for (int jj = 0; jj < kNJ / 2; ++jj) {
#pragma unroll
                for (int q = 0; q < 2; ++q) m = fmaxf(m, fabsf(acc[4 * (2 * jj + r) + q]));
            }
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            if (t4 == 0) red[wg * kBN + 16 * w + g8 + 8 * r] = m;
        }
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 13, clock_cycles());
        }
        float amaxs[2];
        bool qfast = true;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int tok = 16 * w + g8 + 8 * r;
            amaxs[r] = fmaxf(fmaxf(red[tok], red[kBN + tok]), 1e-10f);
            qfast &= amaxs[r] <= 0x1p60f;
#pragma unroll
            for (int jj = 0; jj < kNJ / 2; ++jj) {
#pragma unroll
                for (int q = 0; q < 2; ++q) qfast &= div_rn_fast_ok(acc[4 * (2 * jj + r) + q], 1.0f);
            }
        }
        uint32_t q2s[2][kNJ / 2];
        float scs[2];
        auto quant = [&](auto div) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float sc = div(amaxs[r], 448.0f);
                scs[r] = sc;
#pragma unroll
                for (int jj = 0; jj < kNJ / 2; ++jj) {
                    const int i = 4 * (2 * jj + r);
                    q2s[r][jj] = ptx::f32x2_to_e4m3x2_satfinite(div(acc[i], sc), div(acc[i + 1], sc));
                }
            }
        };
        if (__all_sync(0xffffffffu, qfast))
            quant(div_unchecked);
        else
            quant(div_ieee);
        const uint32_t out_s = sbase + L::kOut;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = 16 * w + g8 + 8 * r;
#pragma unroll
            for (int jj = 0; jj < kNJ / 2; ++jj) st_shared_u16(out_s + row * kBK + 64 * wg + 8 * jj + 2 * t4, q2s[r][jj]);
            if (wg == 0 && t4 == 0 && row < cnt) p.act_scale[static_cast<int64_t>(rt) * p.pairs_cap + p0 + row] = scs[r];
        }
        fc1_store_rows(p, out_s, rt, p0, cnt, blk, mt, tr, n);
    }

    // FC1: SwiGLU of the (gate, up) row pairs each thread holds, 1x128 FP8 quant of the 128 channels of
    // this tile per token, a8 rows + scales to global, then fc1_done += 1.
    static GLM5_DEVICE void epilogue_fc1(const Params& p, uint8_t* sm, uint32_t sbase, int rt, int p0, int cnt, int blk,
                                         int wg, int w, int lane, float (&acc0)[kNAcc], float (&acc1)[kNAcc],
                                         [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n) {
        const int g8 = lane >> 2, t4 = lane & 3;
        const int mt = threadIdx.x - 128;
        float* red = reinterpret_cast<float*>(sm + L::kRed);
        const auto div_unchecked = [](float a, float b) { return div_rn_nocheck(a, b); };
        const auto div_ieee = [](float a, float b) { return __fdiv_rn(a, b); };
        swiglu<!kWide>(acc0, acc1);  // wide: acc0 holds pass 0's activations already (wide_unstash)
#pragma unroll
        for (int j = 0; j < kNJ; ++j) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float m = fmaxf(fabsf(acc0[4 * j + q]), fabsf(acc1[4 * j + q]));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
                if (g8 == 0) red[(wg * 4 + w) * kBN + 8 * j + 2 * t4 + q] = m;
            }
        }
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 13, clock_cycles());
        }
        // Channel of this thread's rows inside the group's 128: 64 wg + 32 half + 8 w + g (wide: 32 wg + 64 pass + 8 w + g;
        // acc0 = pass 0, acc1 = pass 1).
        const uint32_t out_s = sbase + L::kOut;
        constexpr int kCh1 = kWide ? 64 : 32;  // channel offset of acc1's rows
        const int c0 = (kWide ? 32 : 64) * wg + 8 * w + g8;
        // Column amax over the 8 warps first (also the fast-path test: the 8 warps' amax is not bounded by this warp's
        // values; an overflowed activation elsewhere gives inf, whose IEEE quotient the fast path would not give).
        // sc = max(amax, 1e-10) / 448 is in range for amax <= 2^60; a / sc then needs the warp's values in range.
        float amaxs[2 * kNJ];
        bool qfast = true;
#pragma unroll
        for (int j = 0; j < kNJ; ++j) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int col = 8 * j + 2 * t4 + q;
                float amax = red[col];
#pragma unroll
                for (int r = 1; r < 8; ++r) amax = fmaxf(amax, red[r * kBN + col]);
                amaxs[2 * j + q] = fmaxf(amax, 1e-10f);
                qfast &= amaxs[2 * j + q] <= 0x1p60f && div_rn_fast_ok(acc0[4 * j + q], 1.0f) &&
                         div_rn_fast_ok(acc1[4 * j + q], 1.0f);
            }
        }
        // All columns' scales and FP8 pairs first, then the stores: the byte stores are asm volatile (memory clobber),
        // so interleaved with the amax loads they serialised the 2 x kNJ columns (~3 us per task, session-10 trace).
        uint32_t q2s[2 * kNJ];
        float scs[2 * kNJ];
        auto quant = [&](auto div) {
#pragma unroll
            for (int j = 0; j < kNJ; ++j) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const float sc = div(amaxs[2 * j + q], 448.0f);
                    scs[2 * j + q] = sc;
                    q2s[2 * j + q] = ptx::f32x2_to_e4m3x2_satfinite(div(acc0[4 * j + q], sc), div(acc1[4 * j + q], sc));
                }
            }
        };
        if (__all_sync(0xffffffffu, qfast))
            quant(div_unchecked);
        else
            quant(div_ieee);
#pragma unroll
        for (int j = 0; j < kNJ; ++j) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int col = 8 * j + 2 * t4 + q;
                st_shared_u8(out_s + col * kBK + c0, q2s[2 * j + q] & 0xffu);
                st_shared_u8(out_s + col * kBK + c0 + kCh1, q2s[2 * j + q] >> 8);
                if (mt < 4 && col < cnt)  // wg 0, warp 0, g 0: one writer per column
                    p.act_scale[static_cast<int64_t>(rt) * p.pairs_cap + p0 + col] = scs[2 * j + q];
            }
        }
        fc1_store_rows(p, out_s, rt, p0, cnt, blk, mt, tr, n);
    }

    // FC2: y = bf16(acc * w) into the slot buffer (16-byte stores of 8 channels; 4-byte channel pairs at bn8), then
    // the last of the S contributors of (token, rt) sums the S slots in slot order into out.
    static GLM5_DEVICE void epilogue_fc2(const Params& p, uint8_t* sm, int slot, int rt, int cnt, int wg, int w,
                                         int lane, float (&acc0)[kNAcc], float (&acc1)[kNAcc1],
                                         [[maybe_unused]] const TraceBuf& tr, [[maybe_unused]] int n) {
        const int g8 = lane >> 2, t4 = lane & 3;
        const int mt = threadIdx.x - 128;
        const int32_t* code = reinterpret_cast<const int32_t*>(sm + L::kCode) + slot * kBN;
        const float* wgt = reinterpret_cast<const float*>(sm + L::kWgt) + slot * kBN;
        int32_t* flag = reinterpret_cast<int32_t*>(sm + L::kFlag);
        const int S = p.num_slots;
        const bool even = (g8 & 1) == 0;
        const int ch_base = kWide ? 64 * wg : 128 * wg;  // first channel of this warpgroup's rows in the tile
        // Row of the weighted value of column col (pair code c): its slot (t, j) (single GPU; EP mode A: at the source
        // rank), or EP mode B: this rank's out_pool row of the pair (p0 + col).
        [[maybe_unused]] const int p0 = kEP ? reinterpret_cast<const int32_t*>(sm + L::kMeta)[slot * 4 + 0] : 0;
        auto out_row = [&](int32_t c, [[maybe_unused]] int col) -> uint16_t* {
            if constexpr (kEP) {
                if (p.ep_mode) return sym_ptr<uint16_t>(p, p.rank, p.sym_opool) + static_cast<int64_t>(p0 + col) * kH;
            }
            return pair_slot(p, c, S);
        };
        // Routing weights and pair codes of this thread's columns, loaded before the first store: the stores are asm
        // volatile (memory clobber), so loads inside the store loop waited for the previous store's issue.
        float w0s[kNJ], w1s[kNJ];
        int32_t codes[kNJ];
#pragma unroll
        for (int j = 0; j < kNJ; ++j) {
            const int col0 = 8 * j + 2 * t4;
            w0s[j] = wgt[col0], w1s[j] = wgt[col0 + 1];
            codes[j] = code[even ? col0 : col0 + 1];  // -1 past cnt (the loader's fill)
        }
        // Slot values as 16-byte stores (8 channels of one token) where the block has an even number of 8-column
        // groups: per pair of groups the bf16 channel pairs (one shuffle, as below) go through a 4 x 4 transpose over
        // the lanes of equal (t4, g8 parity), so lane (g8, t4) ends with channels 0..7 of combination k = g8 / 2
        // (group j0 + k / 2, row half r = k % 2) of token column 8 (j0 + k / 2) + 2 t4 + g8 % 2. 4x fewer store
        // instructions and full 16-byte sectors instead of 4-byte pieces (the slot stores took 2.5-2.8 us per FC2
        // task at 64-token blocks, session 10 trace); the same values.
        auto store_half = [&](float (&acc)[kNAcc], int half) {
            if constexpr (kNJ % 2 == 0) {
                const int k = g8 >> 1;
#pragma unroll
                for (int j0 = 0; j0 < kNJ; j0 += 2) {
                    uint32_t u[4];  // u[2 jj + r]: this lane's channel pair of (group j0 + jj, row half r)
#pragma unroll
                    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int j = j0 + jj;
                            const float v0 = acc[4 * j + 2 * r] * w0s[j], v1 = acc[4 * j + 2 * r + 1] * w1s[j];
                            const float recv = __shfl_xor_sync(0xffffffffu, even ? v1 : v0, 4);
                            u[2 * jj + r] = even ? ptx::f32x2_to_bf16x2_rn(v0, recv) : ptx::f32x2_to_bf16x2_rn(recv, v1);
                        }
                    }
#pragma unroll
                    for (int b = 0; b < 2; ++b) {  // transpose over k (lane bits 3, 4)
                        const int m = 1 << b;
                        const bool up = (k & m) != 0;
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            if (c & m) continue;
                            const uint32_t got = __shfl_xor_sync(0xffffffffu, up ? u[c] : u[c | m], 8 << b);
                            if (up)
                                u[c] = got;
                            else
                                u[c | m] = got;
                        }
                    }
                    const int col = 8 * (j0 + (k >> 1)) + 2 * t4 + (g8 & 1);
                    if (col < cnt) {
                        const int32_t c = (k >> 1) ? codes[j0 + 1] : codes[j0];
                        const int ch = ch_base + 64 * half + 16 * w + 8 * (k & 1);
                        uint16_t* dst = out_row(c, col) + rt * kRows + ch;
                        ptx::st_global_v4(dst, ptx::u32x4{u[0], u[1], u[2], u[3]});
                    }
                }
            } else {  // bn8: one 8-column group, 4-byte channel pairs
#pragma unroll
                for (int j = 0; j < kNJ; ++j) {
                    const int col0 = 8 * j + 2 * t4;
                    const float w0 = w0s[j], w1 = w1s[j];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const float v0 = acc[4 * j + 2 * r] * w0, v1 = acc[4 * j + 2 * r + 1] * w1;
                        const float recv = __shfl_xor_sync(0xffffffffu, even ? v1 : v0, 4);
                        const int col = even ? col0 : col0 + 1;
                        const float lo = even ? v0 : recv, hi = even ? recv : v1;
                        const int ch = ch_base + 64 * half + 16 * w + 8 * r + (g8 & ~1);  // even channel of the pair
                        if (col < cnt) {
                            const int32_t c = codes[j];
                            uint16_t* dst = out_row(c, col) + rt * kRows + ch;
                            st_global_u32(dst, ptx::f32x2_to_bf16x2_rn(lo, hi));
                        }
                    }
                }
            }
        };
        // Token-major: this thread's tokens are rows g / g + 8, its channels 8 j + 2 t4 (+ 1); the 4 lanes of a row hold
        // 8 consecutive channels of each group j, so a 4 x 4 transpose over t4 (per 4 groups) gives each lane one group's
        // 8 channels: 16-byte stores, as above.
        auto store_tm = [&](float (&acc)[kNAcc]) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int tok = (kWide ? 64 * wg : 0) + 16 * w + g8 + 8 * r;
                const float wt = wgt[tok];
                const int32_t c = code[tok];  // -1 past cnt (the loader's fill)
#pragma unroll
                for (int j0 = 0; j0 < kNJ; j0 += 4) {
                    uint32_t u[4];  // u[jj]: this lane's channel pair of group j0 + jj
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj)
                        u[jj] = ptx::f32x2_to_bf16x2_rn(acc[4 * (j0 + jj) + 2 * r] * wt, acc[4 * (j0 + jj) + 2 * r + 1] * wt);
#pragma unroll
                    for (int b = 0; b < 2; ++b) {  // transpose over t4 (lane bits 0, 1)
                        const int m = 1 << b;
                        const bool up = (t4 & m) != 0;
#pragma unroll
                        for (int cc = 0; cc < 4; ++cc) {
                            if (cc & m) continue;
                            const uint32_t got = __shfl_xor_sync(0xffffffffu, up ? u[cc] : u[cc | m], m);
                            if (up)
                                u[cc] = got;
                            else
                                u[cc | m] = got;
                        }
                    }
                    if (tok < cnt) {
                        uint16_t* dst = out_row(c, tok) + rt * kRows + (kWide ? 0 : kTmN * wg) + 8 * (j0 + t4);
                        ptx::st_global_v4(dst, ptx::u32x4{u[0], u[1], u[2], u[3]});
                    }
                }
            }
        };
        if constexpr (kTokenMajor) {
            store_tm(acc0);
        } else {
            store_half(acc0, 0);
            if constexpr (!kWide) store_half(acc1, 1);
        }
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 13, clock_cycles());
        }
        // slot values only (uniform branch): diagnostics, or the end combine (end_combine; pool builds)
        if (kEP || (p.flags & (kPool ? kFlagNoCombine | kFlagEndCombine : kFlagNoCombine))) return;
        handoff_fence();
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        constexpr int kCtrPerToken = kH / kRows;
        if (mt < cnt) {
            const int t = code[mt] >> 4;
            const int old = atom_acq_rel_gpu_add(p.combine_ctr + static_cast<int64_t>(t) * kCtrPerToken + rt, 1);
            const bool last = old == S - 1;
            if (last) p.combine_ctr[static_cast<int64_t>(t) * kCtrPerToken + rt] = 0;  // back to zero at rest
            flag[mt] = last;
        }
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        if constexpr (kTrace) {
            if (mt == 0) tr.put(n, 14, clock_cycles());
        }
        // One warp per finished token (combine_tile).
        const int mw = mt >> 5;
        for (int col = mw; col < cnt; col += kMathThreads / 32) {
            if (!flag[col]) continue;
            handoff_fence();
            combine_tile(p, code[col] >> 4, rt, lane);
        }
    }

    // The combine of one (token, FC2 row tile): the sum of the token's S slot values in slot order (fp32) x rsf -> bf16
    // out. One warp; lane owns kLaneCh consecutive channels of the tile's kRows (8: 16-byte loads; wide: 4, 8-byte
    // loads). The caller has acquired every slot's values.
    static GLM5_DEVICE void combine_tile(const Params& p, int t, int rt, int lane) {
        constexpr int kLaneCh = kRows / 32, kLaneW = kLaneCh / 2;
        const int S = p.num_slots;
        const int64_t base = static_cast<int64_t>(t) * S * kH + rt * kRows + lane * kLaneCh;
        // Slot j's values: this rank's slot buffer (single GPU; EP mode A), or EP mode B: the owner's out_pool row
        // (pair_loc, written by the owner's plan kernel; NVLink loads when the owner is a peer).
        auto src_of = [&](int j) -> const uint16_t* {
            if constexpr (kEP) {
                if (p.ep_mode) {
                    const int32_t loc = sym_ptr<const int32_t>(p, p.rank, p.sym_loc)[static_cast<int64_t>(t) * S + j];
                    return sym_ptr<const uint16_t>(p, loc >> 24, p.sym_opool) + static_cast<int64_t>(loc & 0xffffff) * kH +
                           rt * kRows + lane * kLaneCh;
                }
            }
            return p.slots + base + static_cast<int64_t>(j) * kH;
        };
        // The slot loads go out 4 at a time (8 spill the bn64 build), then are summed in slot order. A loop over the
        // runtime S issued one L2 round trip per slot: ~9 in a row per combined token, most of FC2's epilogue at
        // 128+ tokens (session-10 trace).
        float sum[kLaneCh];
#pragma unroll
        for (int i = 0; i < kLaneCh; ++i) sum[i] = 0.f;
        if constexpr (kLaneW == 2) {
            // wide: every slot's 8 bytes in flight at once (2 x kMaxSlots registers), one L2 round trip per combined
            // token instead of one per 4 slots (session-13 trace at (a) 1024-4096: the combine phase went from
            // 3.4-3.9 to 2.6-3.1 us per FC2 task; timed end to end only together with the pool copy change);
            // summed in slot order as below
            uint32_t v[kMaxSlots][2];
#pragma unroll
            for (int j = 0; j < kMaxSlots; ++j)
                if (j < S) ptx::ld_cg_v2(src_of(j), v[j][0], v[j][1]);
#pragma unroll
            for (int j = 0; j < kMaxSlots; ++j) {
                if (j < S) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        sum[2 * i] += ptx::bf16lo_to_f32(v[j][i]);
                        sum[2 * i + 1] += ptx::bf16hi_to_f32(v[j][i]);
                    }
                }
            }
        } else {  // narrow (kLaneW 4): 4 slots per round trip
            for (int j0 = 0; j0 < S; j0 += 4) {
                uint32_t v[4][kLaneW];
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    if (j0 + jj < S) {
                        const uint16_t* src = src_of(j0 + jj);
                        ptx::ld_cg_v4(src, v[jj][0], v[jj][1], v[jj][2], v[jj][3]);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    if (j0 + jj < S) {
#pragma unroll
                        for (int i = 0; i < kLaneW; ++i) {
                            sum[2 * i] += ptx::bf16lo_to_f32(v[jj][i]);
                            sum[2 * i + 1] += ptx::bf16hi_to_f32(v[jj][i]);
                        }
                    }
                }
            }
        }
        uint32_t o[kLaneW];
#pragma unroll
        for (int i = 0; i < kLaneW; ++i)
            o[i] = ptx::f32x2_to_bf16x2_rn(sum[2 * i] * p.routed_scaling, sum[2 * i + 1] * p.routed_scaling);
        uint16_t* dst = p.out + static_cast<int64_t>(t) * kH + rt * kRows + lane * kLaneCh;
        if constexpr (kLaneW == 4)
            ptx::st_global_v4(dst, ptx::u32x4{o[0], o[1], o[2], o[3]});
        else
            ptx::st_global_v2(dst, o[0], o[1]);
        if (lane == 0) red_relaxed_gpu_add(p.ctrl + 3, 1);  // diagnostics: output tiles combined
    }

    // The end combine (kFlagEndCombine, pool builds: all CTAs are resident, see the header): after its last task each
    // CTA releases its slot stores and counts itself done (ctrl[6]); once every CTA has, the grid's math warps combine
    // the M x H / kRows (token, row tile) items: CTA b takes tokens b, b + grid, ..., its 8 math warps a token's row
    // tiles (a flat item index with / and % spilled 4 bytes in the bn64 swapAB pool build). Replaces the per-FC2-task
    // combine counters and last-contributor combine (their latency on the math warps' path: ~3.9 us per FC2 task at
    // (a) 4096 tokens, session-14 trace) by one bandwidth-bound pass; the same sums in the same order.
    static GLM5_DEVICE void end_combine(const Params& p, int mt, int lane) {
        if constexpr (kEP) {
            ep_exit_barrier(p, mt, lane);
        } else {
            handoff_fence();
            ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
            if (mt == 0) red_release_gpu_add(p.ctrl + 6, 1);
            const int32_t want = static_cast<int32_t>(gridDim.x);
            if (lane == 0) spin_acquire_geq(p.ctrl + 6, want, [] {});
            __syncwarp();
            while (ld_acquire_gpu(p.ctrl + 6) < want) {  // each lane's own acquire (as for fc1_done)
            }
        }
        constexpr int kRowTiles = kH / kRows, kMathWarps = kMathThreads / 32;  // FC2 row tiles per token
        for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
            if (token_masked(p, t)) continue;  // a padding row: no slot values; the plan kernel zeroed its output
            for (int rt = mt >> 5; rt < kRowTiles; rt += kMathWarps) combine_tile(p, t, rt, lane);
        }
    }

    // EP exit barrier (kEP): every rank's slot values for this rank's tokens have landed. Each math thread fences its
    // (remote) slot stores at system scope; the CTA counts itself done (ctrl[6]); the CTA that completes the count has
    // acquired every CTA's release and publishes done[me] = epoch at every rank (fence + st.release.sys); then every
    // lane acquires done[r] == epoch of all ranks (its own acquire, as for fc1_done). The peers' slot stores reach this
    // rank's memory before their done flag: release -> acquire chains are cumulative (PTX memory model).
    static GLM5_DEVICE void ep_exit_barrier(const Params& p, int mt, int lane) {
        __threadfence_system();
        ptx::named_barrier_sync<kMathBarrier, kMathThreads>();
        int32_t* sig = sym_ptr<int32_t>(p, p.rank, p.sym_sig);
        const int32_t epoch = sig[kSigEpoch];  // written by the plan kernel (a completed predecessor)
        if (mt == 0) {
            const int32_t old = atom_acq_rel_gpu_add(p.ctrl + 6, 1);
            if (old == static_cast<int32_t>(gridDim.x) - 1) {
                __threadfence_system();
                for (int r = 0; r < p.world; ++r) st_release_sys(sym_ptr<int32_t>(p, r, p.sym_sig) + kSigDone + p.rank, epoch);
            }
        }
        for (int r = 0; r < p.world; ++r) {
            const long long t0 = clock64();
            while (ld_acquire_sys(sig + kSigDone + r) != epoch) {
                __nanosleep(32);
                if (static_cast<unsigned long long>(clock64() - t0) > GLM5_MEGAMOE_SPIN_LIMIT_CYCLES) {
#ifdef GLM5_MEGAMOE_TIMEOUT_PRINTF  // opt-in: a call on the math path serializes every wgmma of the kernel (C7510)
                    ep_spin_timeout("exit", p.rank, r, epoch, ld_acquire_sys(sig + kSigDone + r));
#endif
                    math_trap();
                }
            }
        }
    }

    // ---- the persistent kernel body -------------------------------------------------------------------
    static GLM5_DEVICE void run(const CUtensorMap* tm_w13, const CUtensorMap* tm_w2, const CUtensorMap* tm_pool,
                                const CUtensorMap* tm_act, const Params& p, uint8_t* smem_raw,
                                const TraceBuf tr = TraceBuf{nullptr, 0}) {
        const uint32_t raw = ptx::smem_addr(smem_raw);
        const uint32_t sbase = (raw + 1023u) & ~1023u;
        uint8_t* sm = smem_raw + (sbase - raw);
        const Bars bar{sbase + L::kBar};
        const int warp = threadIdx.x >> 5;
        if constexpr (kNoLoad) {  // zero stages: the math then folds zeros (no NaN slow paths)
            for (int i = threadIdx.x; i < L::kBar / 16; i += kThreads)
                asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(sbase + 16u * i), "r"(0u) : "memory");
        }
        if (threadIdx.x == 0) {
            for (int s = 0; s < kStages; ++s) {
                sm90::mbar_init(bar.full(s), 1 + 32 * kLoaderWarps);
                sm90::mbar_init(bar.empty(s), 8);
            }
            for (int t = 0; t < kTaskSlots; ++t) {
                sm90::mbar_init(bar.tfull(t), 1);
                sm90::mbar_init(bar.tinfo(t), 32);
                sm90::mbar_init(bar.tempty(t), kLoaderWarps + 8);
            }
            if constexpr (kPair) {
                sm90::mbar_init(bar.xfull(), 1);
                sm90::mbar_init(bar.xempty(), 1);
                for (int t = 0; t < kTaskSlots; ++t) sm90::mbar_init(bar.cfull(t), 1), sm90::mbar_init(bar.cempty(t), 1);
            }
            sm90::fence_barrier_init();
            sm90::tma_prefetch_desc(tm_w13);
            sm90::tma_prefetch_desc(tm_w2);
            if constexpr (kPool) sm90::tma_prefetch_desc(tm_pool), sm90::tma_prefetch_desc(tm_act);
        }
        __syncthreads();
        if constexpr (kPair) {  // the peer's barriers are initialised before anything is sent to them
            ptx::require_cluster_size<2>();
            ptx::cluster_sync();
        }
        ptx::griddep_launch_dependents();
        ptx::griddep_wait();  // the plan kernel's task list / counters (and x, topk from earlier kernels)

        if (warp < 4) {
            sm90::setmaxnreg_dec<kProducerRegs>();
            if (warp == 0) {
                if (lane_id() == 0) weight_producer(tm_w13, tm_w2, p, sm, sbase, bar, tr);
            } else if (warp <= kLoaderWarps) {
                act_loader(tm_pool, tm_act, p, sm, sbase, bar, tr, warp - 1);
            }
        } else {
            sm90::setmaxnreg_inc<kMathRegs>();
            math(p, sm, sbase, bar, tr);
        }
        if constexpr (kPair) {  // neither CTA exits while its peer may still write into or arrive on its shared memory
            __syncwarp();
            ptx::cluster_sync();
        }
    }
};

}  // namespace megamoe
}  // namespace moe
}  // namespace glm5
