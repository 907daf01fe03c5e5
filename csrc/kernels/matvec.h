// Small-batch matrix x vector kernels for the decoder's per-token steps on x86 CPUs.
//
// A decode step multiplies every decoder weight by one (or a few) activation columns, so it should
// run at memory bandwidth. ggml 0.15.3's CPU paths for these products (llamafile's tiled GEMM for
// Q8_0, vec_dot for Q6_K) reach about half of a core's read bandwidth on the machines we measured:
// they leave the memory system idle while they compute. These kernels keep the arithmetic per
// element of ggml's path - activations quantized by ggml's own routines (Q8_0 / Q8_K), exact
// integer dot products, the same per-block float steps - and stream the weights with software
// prefetch far ahead, four (Q8_0) or two (Q6_K) rows at a time, as a ggml custom op so that ggml's
// threads share the rows.
//
//   Q8_0 and Q6_K: bit for bit ggml_mul_mat's result (same float operations in the same order;
//   tests/test_kernels.py checks it on both code paths).
//
// FUN_ASR_MATVEC=0 turns them off (ggml_mul_mat everywhere); =avx2 forces the AVX2 code path.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace fun_asr {

// Which code path this CPU gets: "avx512vnni", "avx2" or "" (none: ggml_mul_mat everywhere).
const char * matvec_isa();

// The most activation columns a kernel call takes (a decode step: one per sequence of a batch).
int64_t matvec_max_cols();

// Whether w x x goes through a kernel: x86 with AVX2 at run time; w Q8_0 or Q6_K, plain layout in
// host memory (not in a repacked/extra buffer), contiguous 2-D; x F32 [w->ne[0], n], n <= max cols.
bool matvec_supported(const ggml_tensor * w, const ggml_tensor * x);

// ggml_mul_mat(ctx, w, x) through the kernel (caller checked matvec_supported): F32 [w->ne[1], n].
ggml_tensor * matvec(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// Whether a graph node is one of these kernels' ops (profiles count it as a MUL_MAT).
bool is_matvec(const ggml_tensor * t);

}  // namespace fun_asr
