// A value the compiler cannot see through: the warm-up builds' pass loops (GLM5_WARM_CODE, csrc/moe) run the same call
// site twice, once dry; passing the pass number / dry flag through this move keeps the compiler from peeling the loop or
// unswitching an inner loop on the flag (which would make the dry pass fetch a specialised copy, not the real code).
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

GLM5_DEVICE int opaque(int v) {
    int r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
    return r;
}

}  // namespace ptx
}  // namespace glm5
