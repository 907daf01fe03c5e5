// Element-wise tails of the encoder's products fused into one CPU custom op each: a bias and a ReLU, a bias
// and the residual, a LayerNorm's scale and shift, and a whole LayerNorm with its scale and shift (ggml_norm's
// own arithmetic: the same bits). The plain graph makes a node of every ggml_add / ggml_mul /
// ggml_relu (a pass over the activations and a barrier of all threads each: ~1080 of the 2730 nodes of a
// full-size encoder pass). Each element takes exactly the plain graph's float steps (y + b, then the ReLU or
// x + that; y * w, then + b), so the results are the same bits (tests/test_kernels.py; the file is compiled
// without FMA contraction, so that y * w + b stays a rounded product and a rounded sum, as ggml_mul then
// ggml_add).
//
// FUN_ASR_FUSE=0 builds the plain graph instead (also for the FSMN memory op's bias and residual).
#pragma once

#include "ggml.h"

namespace fun_asr {

// FUN_ASR_FUSE is not 0.
bool fusion_enabled();

// An F32 contiguous 2-D tensor (the [n, T] activations these ops and kernels/fsmn_memory take).
bool plain_f32_matrix(const ggml_tensor * t);

// Whether the fused ops take y [n, T] (F32, contiguous) with a vector b [n] (F32, in CPU memory: a bias or a
// LayerNorm's scale) and, when given, x of y's shape; and FUN_ASR_FUSE is not 0.
bool fused_add_supported(const ggml_tensor * y, const ggml_tensor * b, const ggml_tensor * x = nullptr);

// y * w + b (a LayerNorm's scale and shift: the product rounded, then the sum; w, b [n])
ggml_tensor * scale_shift(ggml_context * ctx, ggml_tensor * y, ggml_tensor * w, ggml_tensor * b);
// Whether layer_norm_scale_shift gives ggml_norm's bits in this build: not on Apple, where ggml's CPU backend
// may sum and center the rows with Accelerate's vDSP instead of its own loops.
bool layer_norm_fusion_available();
// ggml_norm(x, eps) * w + b in one node, the same bits (x [n, T] as fused_add_supported takes y)
ggml_tensor * layer_norm_scale_shift(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, float eps);
// relu(y + b)
ggml_tensor * bias_relu(ggml_context * ctx, ggml_tensor * y, ggml_tensor * b);
// x + (y + b)
ggml_tensor * residual_bias_add(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * b);

}  // namespace fun_asr
