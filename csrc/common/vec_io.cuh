// 16-byte and 8-byte global loads/stores (one instruction each). Callers guarantee alignment.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

struct alignas(16) u32x4 {
    uint32_t x, y, z, w;
};

// Coherent 16-byte load: for activations another kernel (or this one, in place) writes.
GLM5_DEVICE u32x4 ld_global_v4(const void* p) {
    u32x4 v;
    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Read-only-path 16-byte load: only for data no kernel writes while this one runs (weights).
GLM5_DEVICE u32x4 ld_global_nc_v4(const void* p) {
    u32x4 v;
    asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

GLM5_DEVICE void st_global_v4(void* p, const u32x4& v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

GLM5_DEVICE void st_global_v2(void* p, uint32_t x, uint32_t y) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(x), "r"(y) : "memory");
}

GLM5_DEVICE void st_global_f32(float* p, float x) {
    asm volatile("st.global.f32 [%0], %1;" ::"l"(p), "f"(x) : "memory");
}

}  // namespace ptx
}  // namespace glm5
