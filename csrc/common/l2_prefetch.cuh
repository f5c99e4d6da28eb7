// L2 prefetch of weight ranges (sm_90: cp.async.bulk.prefetch.L2), the device side of ops/prefetch.py.
//
// Why: at decode sizes many kernels of a layer are latency-bound (the attention core, top-k, the router, the
// MoE plan) and leave HBM idle, while the weight-bound kernel right after them streams tens of MB. Pulling
// (part of) that kernel's weights into L2 during the idle window takes those bytes off its HBM stream.
// The prefetch is a hint: it changes no memory, needs no completion wait, and a line evicted before its
// reader comes costs only the bandwidth already spent.
//
// A range is `rows` rows of `row_bytes` bytes, `row_stride` bytes apart (a K-prefix of a row-major weight:
// row_bytes < row_stride; a contiguous buffer: rows = 1). Rows are cut into kChunk-byte pieces; piece u
// of the flattened (range, row, piece) space goes to thread u mod (all threads of the grid), so a range
// of any shape spreads evenly over the CTAs. Addresses and sizes must be multiples of 16 (the launcher
// checks).
#pragma once

#include <stdint.h>

#include "arch.cuh"

namespace glm5 {
namespace ptx {

// Hint the memory system to bring [p, p + bytes) into L2; bytes a multiple of 16, p 16-byte aligned. Issued
// through the SM's bulk-copy (TMA) unit.
GLM5_DEVICE void bulk_prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Hint: bring the 128-byte line holding p into L2 (one per-thread instruction through the load/store unit).
GLM5_DEVICE void prefetch_line_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

}  // namespace ptx

struct L2Range {
    const uint8_t* base;
    int64_t row_stride;  // bytes
    int64_t row_bytes;   // bytes per row to prefetch, a multiple of 16
    int64_t rows;
};

struct L2PrefetchTile {
    static constexpr int64_t kChunk = 16384;  // bytes per bulk prefetch instruction
    static constexpr int64_t kLine = 128;     // bytes per line prefetch

    static GLM5_DEVICE int64_t pieces_per_row(const L2Range& r) { return (r.row_bytes + kChunk - 1) / kChunk; }

    // Thread `gtid` of `nthreads`: one line prefetch per 128-byte line of `r` (rows start 16-byte aligned, so a
    // row's last line is the one holding its last byte).
    static GLM5_DEVICE void run_lines(const L2Range& r, int64_t gtid, int64_t nthreads) {
        if (r.base == nullptr || r.rows <= 0 || r.row_bytes <= 0) return;
        const int64_t lpr = (r.row_bytes + kLine - 1) / kLine;
        const int64_t total = lpr * r.rows;
        for (int64_t u = gtid; u < total; u += nthreads) {
            const int64_t row = u / lpr, line = u - row * lpr;
            ptx::prefetch_line_l2(r.base + row * r.row_stride + line * kLine);
        }
    }

    // Thread `gtid` of `nthreads`: issue its share of the bulk pieces of `r`.
    static GLM5_DEVICE void run(const L2Range& r, int64_t gtid, int64_t nthreads) {
        if (r.base == nullptr || r.rows <= 0 || r.row_bytes <= 0) return;
        const int64_t ppr = pieces_per_row(r);
        const int64_t total = ppr * r.rows;
        for (int64_t u = gtid; u < total; u += nthreads) {
            const int64_t row = u / ppr, piece = u - row * ppr;
            const int64_t off = piece * kChunk;
            const int64_t n = r.row_bytes - off < kChunk ? r.row_bytes - off : kChunk;
            ptx::bulk_prefetch_l2(r.base + row * r.row_stride + off, static_cast<uint32_t>(n));
        }
    }
};

}  // namespace glm5
