// Q8_0 / Q4_K x F32 matrix products on Intel AMX (tile int8 multiply-add), for the audio encoder.
//
// The encoder multiplies every weight by all ~17 frames per second of audio: a GEMM that ggml 0.15.3
// runs through llamafile's AVX-512 tiles (~90 GFLOP/s per core here), while ggml's own AMX path
// crashed on our shapes (see model/loader.cpp). AMX does a 16 x 16 x 32 int8 block in one
// instruction, so this kernel reads the Q8_0 weights in place (a tile row is 32 quants of one
// block; the tile stride is the row size), multiplies them with the activations quantized by
// ggml's own Q8_0 routine (16 columns per tile, VNNI layout), and applies the per-block scales
// d_w * d_x in float with AVX-512 - per element the same terms as ggml's path, summed in another
// order (rounding-level differences, not bit for bit).
//
// Q4_K (ggml's repacked 8-row layout, the encoder's products only): each 16-row tile is unpacked once per
// product into its quants 0..15 (uint8 A tiles, tdpbusd against the same int8 activation tiles) and the
// float products d * scale, dmin * min; per element the arithmetic of the AVX2 int8 GEMM
// (kernels/gemm_avx2.h), bit for bit: acc += float(dot) * (d_w * d_x), acc -= offset * (d_x * quant sum).
//
// Used by the encoder / adaptor / CTC linear layers (graph/common.cpp linear()) and (Q8_0) by the decoder's
// prefill for every column count (so a sequence's prefill is the same alone or in a batch; its output
// projection of the last positions takes the decode step's path), and by Q8_0 decode steps of 8 or more
// columns (a batch, a verification pass): the Q8_0 mat-vec kernel computes exactly this arithmetic
// (kernels/matvec_q8_0.inc), so batched and one-by-one decoding give the same bits. Few-column products
// prefetch the next row tile (the weights stream from memory once). FUN_ASR_AMX=0 turns it off.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace fun_asr {

// Whether this CPU and OS run AMX int8 (and FUN_ASR_AMX is not 0).
bool amx_available();

// Whether w x x can go through the AMX kernel: w plain Q8_0 in host memory or Q4_K in ggml's repacked
// 8-row layout (graph/common.cpp takes it for the encoder's products only), contiguous 2-D; Q4_K rows a
// multiple of 16, Q8_0 any row count (a last partial tile is zero-padded: the CTC head's 60,515 labels);
// x F32 [w->ne[0], m], any m (columns are padded to tiles of 16).
bool amx_gemm_supported(const ggml_tensor * w, const ggml_tensor * x);

// The activation x (F32 [k, m]) quantized and laid out as AMX tiles, in its own graph node; one
// prepared activation can feed several products with the same input (q, k and v).
ggml_tensor * amx_prepare(ggml_context * ctx, ggml_tensor * x);

// Whether `bias` (may be null) can be added inside the product: F32 [w->ne[1]] in host memory.
bool amx_bias_supported(const ggml_tensor * w, const ggml_tensor * bias);

// ggml_mul_mat(ctx, w, x) (+ bias) on AMX (caller checked amx_gemm_supported and
// amx_bias_supported): F32 [w->ne[1], m]. `prepared` is amx_prepare(ctx, x) or null.
ggml_tensor * amx_gemm(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared = nullptr,
                       ggml_tensor * bias = nullptr);

// Whether a graph node is this kernel's product op / its activation-preparing op.
bool is_amx_gemm(const ggml_tensor * t);
bool is_amx_prepare(const ggml_tensor * t);

}  // namespace fun_asr
