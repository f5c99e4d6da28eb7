// Two dependent skinny FP8 GEMMs (A, then B whose activations A's completion gates) in ONE persistent launch
// through one continuous TMA ring: the experiment behind MegaRTP's weight loader (issue #5). Each standalone
// GEMM launch pays ~3 us that no bytes explain (launch, an empty DRAM queue at start, the tail; H200,
// 2026-11-30: loads-only time ~= 3.0 us + bytes / 4.4 TB/s). Here B's weights stream into the ring as soon as
// A's stages are consumed, while A's last units finish and while B waits for A: B's ramp hides behind A's tail.
//
// Units: A's (n tile, K split, token block) units 0..UA-1, then B's UA..UA+UB-1 (token block fastest, as the
// one-CTA-per-unit grid); CTA b takes units b, b + P, ... (P = gridDim.x <= the SM count, one CTA per SM: every
// CTA is resident, so a CTA waiting on A never blocks one that still holds A units).
// Dependency: every A unit adds 1 to chain[0] after its split-K finish (and epilogue, if it ran it) with
// release semantics; B's producer issues the weight boxes of a B unit's first stages, then waits for
// chain[0] >= UA (acquire) before that unit's activation boxes; B's math warps wait for it before reading
// activation scales. The CTA that completes the last B unit resets chain[0..1] (CUDA-graph replays).
// GLM5_CHAIN_TILE = 1 (tile dependencies): A's units run TILE-MAJOR (token block fastest, then K split, then n tile:
// with enough splits the grid finishes A's tiles in order, wave by wave), the CTA that finishes A's tile t (its
// split-K reduce + epilogue) adds 1 to chain[2 + t], and B's k block g waits only for chain[2 + g] >= A's token
// blocks (B's K / 128 <= A's n tiles: B reads A's output features 128 g .. 128 g + 127). B's producer waits per
// stage before that stage's activation box; B's math warps wait for every tile of their split before the
// activation scales. The question it answers: does a consumer that trails the producer tile by tile hide the
// per-hop latency that a grid-wide dependency exposes (session 17)?
// A wait past GLM5_CHAIN_SPIN_LIMIT cycles traps (an error, not a hang).
// GLM5_CHAIN_PHASES (diagnostic): %globaltimer per CTA into chain_phase_ns[cta * 8 + i]: 0 entry, 1 first A unit's
// mainloop done, 2 last A unit signalled, 3 math warps past the B wait, 4 first B unit's mainloop done, 5 last unit
// done, 6 producer past the B wait, 7 the SM id (ops.fp8_gemm_chain.read_phases).
//
// Compile-time: GLM5_SKINNY_TM (token block, shared by A and B), GLM5_SKINNY_STAGES (ring depth), GLM5_SKINNY_WKB
// (k-block-major weights, as fp8_gemm_wgmma.cu). Plain
// epilogue, global split-K reduce (as the persistent launch of fp8_gemm_wgmma.cu).
// Parameters: (SkinnyParams pa, CUtensorMap wa, CUtensorMap xa, SkinnyParams pb, CUtensorMap wb, CUtensorMap xb,
//              uint32_t* chain [2], zero before the first launch).
// Launch: grid (P, 1, 1), block 288, dynamic smem WgmmaSmem<TM, STAGES>::launch_bytes(max(gmax A, gmax B)).
#include <stdint.h>

#include "fp8_gemm_wgmma.cuh"

#ifndef GLM5_SKINNY_TM
#define GLM5_SKINNY_TM 16
#endif
#ifndef GLM5_SKINNY_STAGES
#define GLM5_SKINNY_STAGES 6
#endif
#ifndef GLM5_SKINNY_WKB
#define GLM5_SKINNY_WKB 0
#endif
#ifndef GLM5_CHAIN_PHASES
#define GLM5_CHAIN_PHASES 0
#endif
#ifndef GLM5_CHAIN_TILE
#define GLM5_CHAIN_TILE 0
#endif
#ifndef GLM5_CHAIN_SPIN_LIMIT
#define GLM5_CHAIN_SPIN_LIMIT (1ull << 34)
#endif

namespace {
using namespace glm5::attn_pre::skinny;
namespace sm90 = glm5::sm90;
using Tile = WgmmaGemmTile<GLM5_SKINNY_TM, GLM5_SKINNY_STAGES, kEpiPlain, kDiagOff, 0, 0, GLM5_SKINNY_WKB>;

GLM5_DEVICE uint32_t ld_acquire_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Spin with backoff: a tight acquire-load loop from two threads of every CTA hammers the counter's L2 slice, and
// every weight stream hashed to that slice slows with it (session 17, call 5: the chain took 2-8 us more than
// the two launches it replaces).
GLM5_DEVICE void wait_at_least(const uint32_t* p, uint32_t target) {
    const long long t0 = clock64();
    unsigned ns = 32;
    while (ld_acquire_gpu(p) < target) {
        __nanosleep(ns);
        ns = ns < 256 ? 2 * ns : 256;
        if (static_cast<unsigned long long>(clock64() - t0) > (GLM5_CHAIN_SPIN_LIMIT)) asm volatile("trap;");
    }
}

GLM5_DEVICE void add_release_gpu(uint32_t* p, uint32_t v) {
    asm volatile("fence.acq_rel.gpu;\n\tred.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE uint32_t add_acq_rel_gpu(uint32_t* p, uint32_t v) {
    uint32_t old;
    asm volatile("fence.acq_rel.gpu;\n\tatom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

#if GLM5_CHAIN_PHASES
}  // namespace
// at global scope: cuModuleGetGlobal finds it by this plain name (in the anonymous namespace it was not found)
__device__ unsigned long long chain_phase_ns[2048 * 8];
namespace {
GLM5_DEVICE void mark(int i) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (blockIdx.x < 2048) chain_phase_ns[blockIdx.x * 8 + i] = t;
}
#else
GLM5_DEVICE void mark(int) {}
#endif

GLM5_DEVICE int units_of(const SkinnyParams& p) { return p.tiles_n * p.splits * p.tiles_m; }

// A's unit u: split-major as every persistent launch (Tile::unit_coord), or tile-major (GLM5_CHAIN_TILE).
GLM5_DEVICE Coord a_coord(const SkinnyParams& p, int u) {
    if constexpr (GLM5_CHAIN_TILE) {
        const int rest = u / p.tiles_m;
        return make_coord(p, rest / p.splits, rest % p.splits, u % p.tiles_m);
    } else {
        return Tile::unit_coord(p, u);
    }
}

// Tile mode: wait until A's tiles g0 .. g0 + n - 1 are complete (every token block finished).
GLM5_DEVICE void wait_tiles(const uint32_t* chain, int g0, int n, uint32_t blocks) {
    for (int g = g0; g < g0 + n; ++g) wait_at_least(chain + 2 + g, blocks);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kWgThreads, 1)
glm5_fp8_gemm_chain(const __grid_constant__ SkinnyParams pa, const __grid_constant__ CUtensorMap wa,
                    const __grid_constant__ CUtensorMap xa, const __grid_constant__ SkinnyParams pb,
                    const __grid_constant__ CUtensorMap wb, const __grid_constant__ CUtensorMap xb, uint32_t* chain) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* smem = Tile::align_smem(smem_raw);
    const int tid = threadIdx.x;
    const int ua = units_of(pa), units = ua + units_of(pb);
    if (static_cast<int>(blockIdx.x) >= units) return;  // the host never launches more
    if (tid == 0) mark(0);
#if GLM5_CHAIN_PHASES
    if (tid == 0) {
        uint32_t smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        chain_phase_ns[blockIdx.x * 8 + 7] = smid;
    }
#endif
    if (tid == kThreads) Tile::init_barriers(smem);
    __syncthreads();
    const uint32_t base = glm5::ptx::smem_addr(smem);

    if (tid >= kThreads) {  // the producer warp: lane 0 issues every TMA
        if (tid != kThreads) return;
        Tile::prefetch_descriptors(&wa, &xa);
        Tile::prefetch_descriptors(&wb, &xb);
        uint32_t q = 0;  // stages issued so far (ring slot q % S, round q / S)
        bool ready = false;
        auto slot_free = [&](uint32_t qq) {
            if (qq >= static_cast<uint32_t>(GLM5_SKINNY_STAGES))
                sm90::mbar_wait(Tile::empty_bar(base, static_cast<int>(qq % GLM5_SKINNY_STAGES)),
                                ((qq / GLM5_SKINNY_STAGES) - 1) & 1u);
        };
        auto load_x = [&](const CUtensorMap* xm, const Coord& c, uint32_t qq, int it) {
            const int slot = static_cast<int>(qq % GLM5_SKINNY_STAGES);
            sm90::tma_load_2d(xm, base + Tile::Smem::kOffX + slot * Tile::Smem::kXStageBytes, Tile::full_bar(base, slot),
                              (c.g_begin + it) * kBlockK, c.tile_m * GLM5_SKINNY_TM);
        };
        auto arm_w = [&](const CUtensorMap* wm, const Coord& c, uint32_t qq, int it) {
            const int slot = static_cast<int>(qq % GLM5_SKINNY_STAGES);
            sm90::mbar_arrive_expect_tx(Tile::full_bar(base, slot), Tile::kStageTx);
            Tile::load_w(wm, base + Tile::Smem::kOffW + slot * kWStageBytes, Tile::full_bar(base, slot), c.g_begin + it,
                         c.tile_n * kBlockN);
        };
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const bool second = u >= ua;
            const SkinnyParams& p = second ? pb : pa;
            const CUtensorMap* wm = second ? &wb : &wa;
            const CUtensorMap* xm = second ? &xb : &xa;
            const Coord c = second ? Tile::unit_coord(p, u - ua) : a_coord(p, u);
            int it = 0;
            if (GLM5_CHAIN_TILE && second) {
                // weights of the prefill stages first, then each stage's activations once its A tile is complete
                const int n = Tile::prefill(c);
                for (int s = 0; s < n; ++s) {
                    slot_free(q + s);
                    arm_w(wm, c, q + s, s);
                }
                for (int s = 0; s < n; ++s) {
                    wait_tiles(chain, c.g_begin + s, 1, static_cast<uint32_t>(pa.tiles_m));
                    if (!ready) mark(6);
                    ready = true;
                    load_x(xm, c, q + s, s);
                }
                for (it = n; it < c.nk; ++it) {
                    slot_free(q + it);
                    arm_w(wm, c, q + it, it);
                    wait_tiles(chain, c.g_begin + it, 1, static_cast<uint32_t>(pa.tiles_m));
                    load_x(xm, c, q + it, it);
                }
                q += static_cast<uint32_t>(c.nk);
                continue;
            }
            if (second && !ready) {
                // B's weights first (slots free as A's stages are consumed), then the wait, then its activations.
                const int n = Tile::prefill(c);
                for (int s = 0; s < n; ++s) {
                    slot_free(q + s);
                    arm_w(wm, c, q + s, s);
                }
                wait_at_least(chain, static_cast<uint32_t>(ua));
                mark(6);
                ready = true;
                for (int s = 0; s < n; ++s) load_x(xm, c, q + s, s);
                it = n;
            }
            for (; it < c.nk; ++it) {
                slot_free(q + it);
                arm_w(wm, c, q + it, it);
                load_x(xm, c, q + it, it);
            }
            q += static_cast<uint32_t>(c.nk);
        }
        return;
    }

    // math warps (threads 0..255)
    uint32_t q = 0;
    bool ready = false, marked[2] = {false, false};
    const int ub = units - ua;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const bool second = u >= ua;
        const SkinnyParams& p = second ? pb : pa;
        const Coord c = second ? Tile::unit_coord(p, u - ua) : a_coord(p, u);
        if (u != static_cast<int>(blockIdx.x)) consumer_sync();  // done with the previous unit's scales / scratch
        Tile::consumer_prologue(p, c, smem, tid);
        if (GLM5_CHAIN_TILE && second) {
            if (tid == 0) wait_tiles(chain, c.g_begin, c.nk, static_cast<uint32_t>(pa.tiles_m));
            consumer_sync();
            if (tid == 0 && !ready) mark(3);
            ready = true;
        } else if (second && !ready) {
            if (tid == 0) wait_at_least(chain, static_cast<uint32_t>(ua));
            consumer_sync();
            if (tid == 0) mark(3);
            ready = true;
        }
        float acc[Tile::kNT][4];
        const bool fin = Tile::mainloop(p, c, smem, tid, acc, q);
        if (tid == 0 && !marked[second]) mark(second ? 4 : 1);  // this CTA's first A / B unit's K loop is done
        marked[second] = true;
        if (fin) Tile::epilogue(p, c, smem, tid, acc);
        q += static_cast<uint32_t>(c.nk);
        consumer_sync();  // every math thread's stores of this unit are issued
        if (tid == 0) {
            mark(5);
            if (!second) {
                if (GLM5_CHAIN_TILE && fin) add_release_gpu(chain + 2 + c.tile_n, 1u);  // this CTA finished the tile
                add_release_gpu(chain, 1u);
                mark(2);
            } else if (add_acq_rel_gpu(chain + 1, 1u) + 1u == static_cast<uint32_t>(ub)) {
                // the last B unit: every A unit is counted and every B wait has passed; reset for the next launch
                chain[0] = 0u;
                chain[1] = 0u;
                if (GLM5_CHAIN_TILE)
                    for (int t = 0; t < pa.tiles_n; ++t) chain[2 + t] = 0u;
                __threadfence();
            }
        }
    }
}
