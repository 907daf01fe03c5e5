// Small-batch Q8_0 matrix x vector kernel for the decoder's per-token steps on x86 CPUs.
//
// A decode step multiplies every decoder weight by one (or a few) activation columns, so it should
// run at memory bandwidth. ggml 0.15.3 sends Q8_0 x F32 with one column through llamafile's tiled
// GEMM, which on AVX-512 CPUs reaches about half the read bandwidth (compute-bound on per-block
// scale shuffling). This kernel does the same arithmetic per element - activations quantized by
// ggml's own Q8_0 routine, integer dot products per 32-block, one float FMA per block with
// fp32(d_w) * fp32(d_x), an 8-lane accumulator summed the way ggml sums it - over four weight rows
// at a time, as a ggml custom op so ggml's threads share the rows.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace fun_asr {

// Which code path this CPU gets: "avx512vnni", "avx2" or "" (none: callers use ggml_mul_mat).
const char * q8_0_matvec_isa();

// Whether w x x can go through the kernel: x86 with AVX2 at run time, w plain Q8_0 in host memory
// (not in a repacked/extra buffer), contiguous, x F32 [w->ne[0], n] with n <= q8_0_matvec_max_cols().
bool q8_0_matvec_supported(const ggml_tensor * w, const ggml_tensor * x);
int64_t q8_0_matvec_max_cols();

// ggml_mul_mat(ctx, w, x) through the kernel (caller checked q8_0_matvec_supported): F32 [w->ne[1], n].
ggml_tensor * q8_0_matvec(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// Whether a graph node is this kernel's op (profiles count it as a MUL_MAT).
bool is_q8_0_matvec(const ggml_tensor * t);

// For benchmarks and tests: the kernel's result for a raw Q8_0 matrix (rows x k, ggml block layout)
// times F32 columns x [n][k], into y [n][rows], on the calling thread only.
void q8_0_matvec_ref_call(const void * w, int64_t rows, int64_t k, const float * x, int64_t n, float * y);

}  // namespace fun_asr
