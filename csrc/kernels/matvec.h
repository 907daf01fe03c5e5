// Small-batch matrix x vector kernels for the decoder's per-token steps on x86 CPUs.
//
// A decode step multiplies every decoder weight by one (or a few) activation columns, so it should
// run at memory bandwidth. ggml 0.15.3's CPU paths for these products (llamafile's tiled GEMM for
// Q8_0, vec_dot for Q6_K) reach about half of a core's read bandwidth on the machines we measured:
// they leave the memory system idle while they compute. These kernels keep the arithmetic per
// element of ggml's path - activations quantized by ggml's own routines (Q8_0 / Q8_K / F16), exact
// integer dot products, the same per-block float steps - and stream the weights with software
// prefetch far ahead, several rows at a time, as a ggml custom op so that ggml's threads share the rows.
//
// Batch invariance: every kernel computes each column with the same operations in the same order
// whatever the number of columns and the thread split, so a sequence's decode step gives the same
// bits alone or in a batch (ggml's own paths do not: one column takes vec_dot or a GEMV, two or more
// llamafile's tiled GEMM or, for repacked Q4_K, a GEMM from 4 columns on, which round differently).
//
//   Q8_0: the AMX / int8 GEMMs' arithmetic (int32 block dot products, one FMA per block in order), bit
//   for bit, so decode steps of 8+ columns go through the AMX GEMM with the same bits (ggml's to rounding).
//   Q6_K: bit for bit ggml_mul_mat's result (same float operations in the same order).
//   F32 and F16: bit for bit ggml's many-column result (llamafile's tinyBLAS: one FMA chain per
//   element over 8 or 16 lanes, as wide as ggml was built for; F16 activations rounded to F16 as
//   ggml does); one column differs from ggml's vec_dot there.
//   Q4_K (ggml's repacked 8-row layout): ggml's integer sums, the float steps in our own order (equal
//   to ggml's GEMV to rounding); the AVX2 and AVX-512 copies give the same bits.
//   tests/test_kernels.py checks all of this on both code paths.
//
// FUN_ASR_MATVEC=0 turns them off (ggml_mul_mat everywhere); =avx2 forces the AVX2 code path.
#pragma once

#include <cstdint>

#include <vector>

#include "ggml.h"

namespace fun_asr {

// Which code path this CPU gets: "avx512vnni", "avxvnni" (AVX-VNNI without AVX-512: the Q8_0 kernel in
// that form, the others AVX2), "avx2" or "" (none: ggml_mul_mat everywhere). FUN_ASR_MATVEC=avx2 /
// avxvnni / 0 picks a narrower one (every copy gives the same bits).
const char * matvec_isa();

// The most activation columns mul_mat() gives a kernel (a short prefill); decode steps
// (matvec_step_supported) give it any number.
int64_t matvec_max_cols();

// Whether w x x goes through a kernel: x86 with AVX2 at run time; w F32, F16, Q8_0 or Q6_K in
// plain layout in host memory, or Q4_K in ggml's repacked 8-row layout; contiguous 2-D; x F32
// [w->ne[0], n], 1 <= n <= max cols (matvec_supported) or any n >= 1 (matvec_step_supported).
bool matvec_supported(const ggml_tensor * w, const ggml_tensor * x);
bool matvec_step_supported(const ggml_tensor * w, const ggml_tensor * x);
// Whether a product of many columns (encoder frames, a prefill: mul_mat_frames) is faster through
// these kernels than through ggml's GEMM on this build: with the AVX-512 VNNI kernels, Q8_0 when ggml
// has no VNNI dot products, and Q6_K; the numbers are the same either way.
bool matvec_frames_preferred(const ggml_tensor * w, const ggml_tensor * x);
// The weight's side of those checks: a decode step's product with w (F32 columns of its row length)
// goes through a kernel.
bool matvec_step_takes(const ggml_tensor * w);

// ggml_mul_mat(ctx, w, x) through the kernel (caller checked one of the above): F32 [w->ne[1], n]. With
// `input` (a decode step's SwiGLU, x = input->a: kernels/decoder_fused), the node computes x itself
// (node_input_supported(*input), matvec_takes_input(w, x)).
struct ProductInput;
ggml_tensor * matvec(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const ProductInput * input = nullptr);
bool matvec_takes_input(const ggml_tensor * w, const ggml_tensor * x);

// The products of several matrices with the same x (q/k/v, gate/up of a decode step) in one node: fewer nodes
// and thread barriers per step, each row's numbers as matvec's. Each matrix matvec_step_supported with x, the
// same row length, fewer than 32 columns, every matrix but the last a multiple of 16 rows, at most 6. F32 [sum of
// rows, n]: each matrix's output a contiguous [rows, n] block, in order. With `input` (x = input->a), the node
// computes x itself (kernels/decoder_fused); add_rms_norm's sum x + y is one more [x->ne[0], n] block at the end.
bool matvec_many_supported(const std::vector<ggml_tensor *> & ws, const ggml_tensor * x);
ggml_tensor * matvec_many(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                          const ProductInput * input = nullptr);

// Whether a graph node is one of these kernels' ops (profiles count it as a MUL_MAT); is_matvec_many: one of
// matvec_many's (its matrices src[0], src[2], ...).
bool is_matvec(const ggml_tensor * t);
bool is_matvec_many(const ggml_tensor * t);

// Where a weight lives: CPU memory (host buffers and ggml's CPU_REPACK buffer), and whether ggml
// repacked it into an interleaved layout (its products then run in ggml's repack GEMV/GEMM).
bool weight_in_cpu_memory(const ggml_tensor * w);
bool weight_is_repacked(const ggml_tensor * w);

}  // namespace fun_asr
