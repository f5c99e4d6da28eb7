// Hopper (sm_90a) warpgroup MMA on bf16 operands: the forms the split-KV sparse MLA decode tile uses
// (csrc/attn_core/sparse_mla_decode.cuh, SparseMlaSplitWgmmaTile). One PTX instruction per function;
// fences, commit / wait and the accumulator fragment layout are those of sm90_wgmma.cuh (same header
// comment applies: d[4j + 0/1] = D[16w + g][8j + 2t, +1], d[4j + 2/3] = D[16w + g + 8][...]).
//
//   wgmma_m64n32k16_bf16_ss(d, desc_a, desc_b, scale_d):  D[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T, A and B
//       K-major in shared memory (smem_desc_k128sw: a 16-element bf16 K step is 32 bytes of the 128-byte row).
//   wgmma_m64n256k16_bf16_rs_tb(d, a, desc_b, scale_d):   D[64 x 256] (+)= A[64 x 16] * B[16 x 256], A from
//       registers (the m16n8k16 A fragment per warp: a[0] = A[16w + g][2t, +1], a[1] = A[16w + g + 8][2t, +1],
//       a[2] = A[16w + g][2t + 8, +9], a[3] = A[16w + g + 8][2t + 8, +9], bf16 pairs, low half first), B
//       MN-major ("transposed", imm-trans-b = 1) in shared memory: smem_desc_mn128sw.
//
// MN-major 128B-swizzled layout (CuTe: Swizzle<3,4,3> o ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) in bf16
// elements): K row r of a 64-element N block is 128 bytes at byte 128*r, its 16-byte chunk c stored at
// c ^ (r % 8); 8-row K groups SBO bytes apart; the next 64 N elements LBO bytes further. A row of the
// gathered KV tile (one slot, K of the P V product) stored K-major for Q K^T in 64-column chunks is exactly
// this layout for V: the same bytes serve both products.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace sm90 {

// MN-major, 128B-swizzled operand descriptor: start address, LBO = bytes between 64-element N blocks,
// SBO = bytes between 8-row K groups (1024 for densely stacked 128-byte rows). Tile base 1024-byte aligned.
__host__ __device__ __forceinline__ constexpr uint64_t smem_desc_mn128sw(uint32_t smem_addr, uint32_t lbo_bytes,
                                                                         uint32_t sbo_bytes) {
    return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4)
           | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16)
           | (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32)
           | (1ull << 62);
}

GLM5_DEVICE void wgmma_m64n32k16_bf16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

GLM5_DEVICE void wgmma_m64n256k16_bf16_rs_tb(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

}  // namespace sm90
}  // namespace glm5
