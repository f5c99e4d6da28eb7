// L2 prefetch of weight ranges (sm_90: cp.async.bulk.prefetch.L2), the device side of ops/prefetch.py.
//
// Why: at decode sizes many kernels of a layer are latency-bound (the attention core, top-k, the router, the
// MoE plan) and leave HBM idle, while the weight-bound kernel right after them streams tens of MB. Pulling
// (part of) that kernel's weights into L2 during the idle window takes those bytes off its HBM stream.
// The prefetch is a hint: it changes no memory, needs no completion wait, and a line evicted before its
// reader comes costs only the bandwidth already spent.
//
// A range is `rows` rows of `row_bytes` bytes, `row_stride` bytes apart (a K-prefix of a row-major weight:
// row_bytes < row_stride; a contiguous buffer: rows = 1). Rows are cut into kChunk-byte pieces (bulk form) or
// 128-byte lines (line form); the units of all ranges are numbered in one sequence and dealt out CTA-fastest,
// so even a few units spread over the SMs. Addresses and sizes must be multiples of 16 (the launcher checks).
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
    // Line slots per row: enough for a row that starts anywhere inside a 128-byte line.
    static GLM5_DEVICE int64_t lines_per_row(const L2Range& r) { return (r.row_bytes + kLine - 1) / kLine + 1; }
    static GLM5_DEVICE int64_t units(const L2Range& r, bool bulk) {
        if (r.base == nullptr || r.rows <= 0 || r.row_bytes <= 0) return 0;
        return (bulk ? pieces_per_row(r) : lines_per_row(r)) * r.rows;
    }

    // Work numbering: unit u of the flattened (range, row, piece or line) space, `offset` = the units of the
    // ranges before this one, goes to worker (offset + u) mod nworkers; callers number workers CTA-fastest
    // (worker = thread * gridDim.x + CTA), so even a few units land on different SMs.
    static GLM5_DEVICE void run(const L2Range& r, bool bulk, int64_t offset, int64_t worker, int64_t nworkers) {
        const int64_t total = units(r, bulk);
        if (total == 0) return;
        const int64_t per_row = bulk ? pieces_per_row(r) : lines_per_row(r);
        for (int64_t u = ((worker - offset) % nworkers + nworkers) % nworkers; u < total; u += nworkers) {
            const int64_t row = u / per_row, k = u - row * per_row;
            const uint8_t* start = r.base + row * r.row_stride;
            if (bulk) {
                const int64_t off = k * kChunk;
                const int64_t n = r.row_bytes - off < kChunk ? r.row_bytes - off : kChunk;
                ptx::bulk_prefetch_l2(start + off, static_cast<uint32_t>(n));
            } else {
                // lines from the one holding the row's first byte; the extra slot covers a row that straddles
                // one more line than row_bytes / 128 suggests
                const uintptr_t first = reinterpret_cast<uintptr_t>(start) & ~static_cast<uintptr_t>(kLine - 1);
                const uintptr_t line = first + static_cast<uintptr_t>(k * kLine);
                if (line < reinterpret_cast<uintptr_t>(start) + static_cast<uintptr_t>(r.row_bytes))
                    ptx::prefetch_line_l2(reinterpret_cast<const void*>(line));
            }
        }
    }
};

}  // namespace glm5
