// Q8_0 / Q4_K / Q6_K x F32 matrix products on AVX2 (16-bit integer multiply-add), for the audio
// encoder and (Q8_0) the decoder's prefill on CPUs without AMX.
//
// ggml 0.15.3 multiplies a Q8_0 matrix by many columns with llamafile's tiles: for every (row,
// column, block) it widens the 32 products' partial sums to float and scales them (~100 GOPS on
// 2 AVX2 cores); Q6_K has no GEMM (one vec_dot per output). This kernel keeps the dot product of a
// block of 32 in int32 (exact) and does the float work once per block for 8 rows at a time: per
// product, each group of 8 rows is unpacked once (or, for the decoder's Q8_0 matrices on VNNI CPUs, was
// re-laid out at load: q8_0_quads_* below) into an interleaved layout (two weights of each row
// per 32-bit lane: Q8_0's quants, Q4_K's 0..15 with an offset per block, Q6_K's int16 scale * quant),
// each column's pair of int16 activation quants is broadcast, and vpmaddwd (VNNI's vpdpwssd where
// the CPU has it: the same integers) gives 8 rows x 1 column per instruction. (A Q8_0 matrix kept in the
// quads layout, below, takes vpdpbusd with VNNI, and on plain AVX2 vpsignb / vpmaddubsw up to 11 columns,
// the int16 pairs unpacked from it per product from 12.) Q4_K and Q6_K take
// vpmaddubsw instead (quants as u8 times the activation as s8: 8 rows x 4 weights per instruction, a
// block's sums exact in int16; with VNNI, vpdpbusd adds Q4_K's straight into int32 and vpdpwssd applies
// Q6_K's scales: the same integers again). Per block the scales
// are applied in float as acc += float(dot) * (d_w * d_x) (- offset * d_x * sum of the quants for
// Q4_K). For Q8_0 that is the AMX kernel's arithmetic (kernels/gemm_amx.h): ggml's terms summed in
// another order (rounding-level differences). For Q4_K / Q6_K the weights are ggml's, the activation
// scales finer than ggml's Q8_K (one per 32 values instead of 256). The activation is quantized by
// ggml's own Q8_0 routine.
//
// Each column's numbers depend only on that column (the tiling over columns does not change its
// arithmetic), so a prefill is the same alone or in a batch. graph/common.cpp decides per weight type,
// stage and CPU (never per column count): without AMX the decoder's prefill takes Q4_K / Q6_K here too.
// FUN_ASR_GEMM=0 turns the kernel off, FUN_ASR_GEMM=avx2 (or
// FUN_ASR_MATVEC=avx2) keeps the plain AVX2 instructions on a VNNI CPU.
#pragma once

#include <vector>

#include "ggml.h"

namespace fun_asr {

// "avx2", "avxvnni" (AVX-VNNI's VEX dot products, no AVX-512) or "avx512vnni" (the instructions this CPU
// runs the kernel with), or "" (off: no AVX2 / FMA / F16C, or FUN_ASR_GEMM=0). FUN_ASR_GEMM=avx2 / avxvnni
// (or FUN_ASR_MATVEC=...) picks a narrower copy; every copy gives the same bits.
const char * int8_gemm_isa();
// The width of the Q8_0 tiles' vectors: 512 (the AVX-512 copy: 16 rows per vpdpbusd, the quads layout in 16-row
// groups; FUN_ASR_ZMM=0 keeps 256 there, the same bits), 256, or 0 (off).
int int8_gemm_vector_bits();

// Whether w x x can go through this kernel: w Q8_0 or Q6_K in host memory or Q4_K in ggml's repacked
// 8-row layout, contiguous 2-D, not a view; Q4_K rows a multiple of 8, Q8_0 / Q6_K any row count (a last
// partial group is zero-padded); x F32 [w->ne[0], m], any m >= 1.
bool int8_gemm_supported(const ggml_tensor * w, const ggml_tensor * x);

// x (F32 [k, m]) quantized (Q8_0) and widened to int16 in its own graph node (I16), with each block's
// scale and scaled quant sum, an int8 copy of the quants and each half-block's quant sum (the plain-AVX2
// K-quant tiles); one prepared activation feeds several products with the same input.
ggml_tensor * int8_gemm_prepare(ggml_context * ctx, ggml_tensor * x);

// Whether `bias` (may be null) can be added inside the product: F32 [w->ne[1]] in host memory.
bool int8_gemm_bias_supported(const ggml_tensor * w, const ggml_tensor * bias);

// ggml_mul_mat(ctx, w, x) (+ bias, as its own rounding step) -> F32 [w->ne[1], m] (caller checked
// int8_gemm_supported and int8_gemm_bias_supported). `prepared` is int8_gemm_prepare(ctx, x) or null.
ggml_tensor * int8_gemm(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared = nullptr,
                        ggml_tensor * bias = nullptr);

// Q8_0 matrices kept in the quads layout (per 8-row group and block of 32: the weights + 128 as
// [quad][row] bytes, then the 8 rows' fp16 scales; the same bytes as the plain blocks): the model's
// matrices are re-laid out once at load where the int8 GEMM runs (VNNI or plain AVX2) and there is no AMX,
// and every product with them (decode steps of any batch, prefill) reads them in place instead of
// unpacking each row group per product. The same integers and float steps, so the same bits as the
// plain layout through this kernel or the mat-vec kernel. FUN_ASR_Q8_QUADS=0 (or FUN_ASR_MATVEC=0) keeps the
// plain layout.
// Only this kernel reads such a matrix: graph/common.cpp routes every product with one here, and the
// other kernels (mat-vec, AMX) refuse it; ggml's own ops must never see it.
bool q8_0_quads_wanted();
// w can take the layout: Q8_0, 2-D, rows a multiple of 8.
bool q8_0_quads_fits(const ggml_tensor * w);
// w's plain Q8_0 bytes (src, ggml_nbytes(w)) into the layout at dst (as many bytes); q8_0_quads_wanted().
void q8_0_quads_relayout(const ggml_tensor * w, const void * src, void * dst);
// Marks w (its data in the layout) / whether it is so marked.
void mark_q8_0_quads(ggml_tensor * w);
bool is_q8_0_quads(const ggml_tensor * w);
// ggml_get_rows(w, ids) for such a matrix (ids I32 [n] -> F32 [w->ne[0], n]; the tied token embedding).
ggml_tensor * q8_0_quads_get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids);

// The product of a matrix in the quads layout (is_q8_0_quads) with a few columns, without a preparing node:
// every thread quantizes the whole activation itself (as the mat-vec kernels do), so a decode step has one
// node (and one barrier) per product instead of two. The same numbers as int8_gemm. With `input` (a decode
// step's SwiGLU, x = input->a: kernels/decoder_fused) the node computes x itself.
struct ProductInput;
ggml_tensor * int8_gemm_inline(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x,
                               const ProductInput * input = nullptr);

// Several matrices in the quads layout times the same x in one node (q / k / v, gate / up: fewer nodes and thread
// barriers per decode step): F32 [sum of their rows * m], matrix i's [rows_i, m] block after the ones before it
// (views of it are contiguous). `prepared`: int8_gemm_prepare(ctx, x), or null to prepare in every thread (few
// columns). The same numbers as one product per matrix. At most 6 matrices. With `input` and no `prepared`
// (x = input->a), the node computes x itself (kernels/decoder_fused); add_rms_norm's sum x + y is one more
// [x->ne[0], m] block at the end.
bool int8_gemm_many_supported(const std::vector<ggml_tensor *> & ws, const ggml_tensor * x);
ggml_tensor * int8_gemm_many(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                             ggml_tensor * prepared, const ProductInput * input = nullptr);
bool is_int8_gemm_many(const ggml_tensor * t);

// Whether a graph node is this kernel's product / its activation-preparing op.
bool is_int8_gemm(const ggml_tensor * t);
bool is_int8_gemm_prepare(const ggml_tensor * t);

}  // namespace fun_asr
