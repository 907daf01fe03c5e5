// Unmasked multi-head attention over F32 [d, T] q / k / v for the audio encoder, on CPUs with AVX2.
//
// ggml 0.15.3's flash attention walks one query row at a time (a dot product and an axpy per key, with
// the online softmax's rescaling): ~50 GFLOP/s on 2 AVX2 cores for the encoder's 4 heads x 128 x 167
// frames, ~15 % of an encoder pass once its products ran on the int8 GEMM. This op computes, per head
// and pair of query rows, the scores against 4 keys at a time (register-tiled FMAs), a two-pass
// softmax (max, then exp and sum; exp by range reduction and a degree-6 polynomial, ~1 ulp), and P V
// with 2 rows x 32 channels per tile, then scales by 1 / sum. The same terms as ggml's, rounded
// in another order (rounding-level differences); each query row's numbers do not depend on the other
// rows. FUN_ASR_ATTN=ggml keeps ggml's flash attention.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace fun_asr {

// Whether attention(ctx, q, k, v, n_heads, scale) can run: AVX2 + FMA CPU (and FUN_ASR_ATTN is not
// "ggml"); q, k, v F32, contiguous, 2-D [d, T], the same shape, in host memory; d / n_heads a multiple of 8.
bool attention_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v, int64_t n_heads);

// softmax(scale * q_h k_h^T) v_h for every head h (channels h * hd .. (h + 1) * hd - 1): F32 [d, T].
ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_heads,
                        float scale);

}  // namespace fun_asr
