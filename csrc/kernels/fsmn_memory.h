// The SAN-M layer's FSMN memory block fused with its two residual additions, as one CPU custom op.
//
// ggml has no depthwise conv1d over time for channels-innermost [d, T] tensors: the plain graph
// transposes v, pads it, runs ggml_ssm_conv and adds v and the attention output (five nodes, ~10 % of
// the encoder's time for ~0.1 % of its arithmetic: each node is a pass over memory and a barrier).
// This op reads v in place and writes att + (conv(v) + v) in one pass (with att's bias and the layer's
// residual when given: x + ((att + b) + m), the plain graph's order). Each output element's conv is
// one FMA chain over the taps inside the sequence, from 0.0f in tap order, on every ISA, thread split
// and build, so every build gives the same bits (ggml_ssm_conv's steps depend on how the compiler
// vectorised it: products rounded for blocks of 8 or 16 taps, FMAs for the rest); it differs from
// the plain graph only by rounding (tests/test_kernels.py; the same tokens: tests/test_trained.py).
//
// FUN_ASR_FSMN=ggml builds the plain graph instead.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace fun_asr {

// Whether the fused op takes these tensors: F32 contiguous [d, T] att and v, the F32 kernel
// [K, 1, d] in CPU memory, and FUN_ASR_FSMN is not "ggml"; with a bias [d] or a residual [d, T] too
// (kernels/fused_add's conditions: FUN_ASR_FUSE is not 0).
bool fsmn_memory_supported(const ggml_tensor * att, const ggml_tensor * v, const ggml_tensor * kernel,
                           const ggml_tensor * bias = nullptr, const ggml_tensor * residual = nullptr);

// residual + ((att + bias) + (depthwise_conv1d(v, kernel) + v)), bias and residual optional (null): the
// conv with zero padding (K-1)/2 before and K-1-(K-1)/2 after, no bias of its own.
ggml_tensor * fsmn_memory_add(ggml_context * ctx, ggml_tensor * att, ggml_tensor * v, ggml_tensor * kernel,
                              ggml_tensor * bias = nullptr, ggml_tensor * residual = nullptr);

}  // namespace fun_asr
