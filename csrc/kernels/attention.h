// Unmasked multi-head attention over F32 [d, T] q / k / v for the audio encoder, on CPUs with AVX2.
//
// ggml 0.15.3's flash attention walks one query row at a time (a dot product and an axpy per key, with
// the online softmax's rescaling): ~50 GFLOP/s on 2 AVX2 cores for the encoder's 4 heads x 128 x 167
// frames, ~15 % of an encoder pass once its products ran on the int8 GEMM. This op computes, per head
// and three query rows, the scores against 4 keys at a time (register-tiled FMAs), a two-pass
// softmax (max, then exp and sum; exp by range reduction and a degree-6 polynomial, ~1 ulp), and P V
// with 3 rows x 32 channels per tile, then scales by 1 / sum. The same terms as ggml's, rounded
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

// The decoder's attention over its KV cache, on the same AVX2 building blocks: ggml 0.15.3's flash
// attention takes one query row at a time through a dot product and an axpy per key (~15 GFLOP/s, ~8 % of
// a Q4_K_M decode step on 2 AVX2 cores). Per (sequence, position) this op computes, key by key and inside
// each key its K/V heads (so it reads the cache front to back), the scores of the query heads that share
// each head (GQA: up to 2 per pass, sharing each key load) over the keys the mask leaves visible, a
// two-pass softmax, and P V. Each query row's numbers depend on its own keys only: the same bits alone, in
// a batch of any size, or as a position of a speculative verification pass.
// Whether cached_attention(...) can run: AVX2 + FMA CPU (FUN_ASR_ATTN not "ggml"); q F32 [hd, n_heads, n * B]
// with its heads contiguous (its columns may be apart); k, v F32 views [hd, n_kv_heads, n_kv, B] of host caches (contiguous rows);
// mask F16 [n_kv, n, 1, B]; hd a multiple of 8; n_heads a multiple of n_kv_heads.
bool cached_attention_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                                const ggml_tensor * mask, int64_t n_heads, int64_t n_kv_heads);

// softmax(scale * q k^T + mask) v per sequence, position and query head (query head g reads K/V head
// g / (n_heads / n_kv_heads)): F32 [hd * n_heads, n * B]. A row whose keys are all masked gives zeros.
ggml_tensor * cached_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * mask, int64_t n_heads, int64_t n_kv_heads, float scale);

// The same op for a decode step (one position per sequence) making its own input: per sequence and run of K/V
// heads, the q/k heads' RMSNorm and RoPE and the K/V rows' store (kernels/decoder_fused: attention_heads_input,
// heads_norm_rope_store's arithmetic), then the attention over them; one node and one thread barrier fewer per
// layer. q, k, v: the q/k/v products F32 [hd * n_heads | hd * n_kv_heads, B]; qn, kn their heads' norm weights
// (F32 [hd]); positions I32 [B]: each sequence's new position, its row in the windows kw, vw (views
// [hd, n_kv_heads, n_kv, B] of host caches). rope_base, eps: the RoPE's base, the norms' epsilon.
struct CachedAttentionHeads {
    ggml_tensor *q, *k, *v;
    ggml_tensor *qn, *kn;
    ggml_tensor * positions;
    ggml_tensor *kw, *vw;
    ggml_tensor * mask;
    int64_t n_heads, n_kv_heads;
    float scale, eps, rope_base;
};
bool cached_attention_heads_supported(const CachedAttentionHeads & a);
ggml_tensor * cached_attention_heads(ggml_context * ctx, const CachedAttentionHeads & a);

// Whether t is one of these ops (the profile shows them as ATTN).
bool is_attention(const ggml_tensor * t);

}  // namespace fun_asr
