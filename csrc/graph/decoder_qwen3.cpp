// Qwen3 decoder (DESIGN §2.4): RMSNorm, per-head q/k RMSNorm before NeoX RoPE, GQA attention over
// the KV cache, SwiGLU FFN, final RMSNorm, (tied) output projection.
#include <cmath>

#include "graph/stages.h"

namespace fun_asr {

ggml_tensor * build_decoder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w,
                            const DecoderInputs & in) {
    ggml_context * ctx = g.ctx;
    const auto & d = hp.dec;
    const int64_t n = in.n, B = in.n_seqs, hd = d.head_dim, kv_dim = hd * d.n_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ggml_tensor * x = in.x;
    // A prefill (several positions per sequence) takes the many-column path for every product, a
    // decode step the mat-vec path: each sequence's numbers then do not depend on the batch around it.
    auto proj = [&](ggml_tensor * W, ggml_tensor * a, ggml_tensor * prepared = nullptr) {
        return in.n > 1 ? mul_mat_frames(ctx, W, a, prepared) : mul_mat(ctx, W, a);
    };
    // On AMX the products that read the same input (q/k/v, gate/up) share its prepared tiles.
    auto prepare = [&](ggml_tensor * W, ggml_tensor * a) { return in.n > 1 ? prepare_frames(ctx, W, a) : nullptr; };
    for (int64_t il = 0; il < d.n_layers; ++il) {
        const Qwen3Layer & l = w.dec[static_cast<size_t>(il)];
        ggml_tensor * kc = (*in.k_cache)[static_cast<size_t>(il)];
        ggml_tensor * vc = (*in.v_cache)[static_cast<size_t>(il)];
        ggml_tensor * h = rms_norm(ctx, x, l.attn_norm, d.rms_eps);
        ggml_tensor * hp = prepare(l.q, h);

        auto head_proj = [&](ggml_tensor * W, int64_t n_heads, ggml_tensor * norm) {
            ggml_tensor * t = ggml_reshape_3d(ctx, proj(W, h, hp), hd, n_heads, n * B);
            if (norm) {
                t = rms_norm(ctx, t, norm, d.rms_eps);
                t = ggml_rope_ext(ctx, t, in.positions, nullptr, static_cast<int>(hd), GGML_ROPE_TYPE_NEOX, 0,
                                  d.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            }
            return t;
        };
        ggml_tensor * q = head_proj(l.q, d.n_heads, l.q_norm);     // [hd, Hq, n*B]
        ggml_tensor * k = head_proj(l.k, d.n_kv_heads, l.k_norm);  // [hd, Hkv, n*B]
        ggml_tensor * v = head_proj(l.v, d.n_kv_heads, nullptr);

        // Store the new K/V rows, then attend over each sequence's cached prefix.
        auto rows = [&](ggml_tensor * cache) {
            return ggml_view_2d(ctx, cache, kv_dim, cache->ne[2] * cache->ne[3], cache->nb[2], 0);
        };
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, rows(kc), ggml_reshape_2d(ctx, k, kv_dim, n * B), in.kv_rows));
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, rows(vc), ggml_reshape_2d(ctx, v, kv_dim, n * B), in.kv_rows));
        auto window = [&](ggml_tensor * cache) {  // [hd, Hkv, n_kv, B]
            return ggml_view_4d(ctx, cache, hd, d.n_kv_heads, in.n_kv, B, cache->nb[1], cache->nb[2], cache->nb[3],
                                static_cast<size_t>(in.slot0) * cache->nb[3]);
        };
        ggml_tensor * K = ggml_permute(ctx, window(kc), 0, 2, 1, 3);                                  // [hd, n_kv, Hkv, B]
        ggml_tensor * Q = ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, d.n_heads, n, B), 0, 2, 1, 3);  // [hd, n, Hq, B]
        ggml_tensor * att;
        if (in.flash_attn) {  // fused: F32 K/V, online softmax in F32, one node instead of six
            ggml_tensor * V = ggml_permute(ctx, window(vc), 0, 2, 1, 3);                              // [hd, n_kv, Hkv, B]
            att = ggml_flash_attn_ext(ctx, Q, K, V, in.mask, scale, 0.0f, 0.0f);                      // [hd, Hq, n, B]
            ggml_flash_attn_ext_set_prec(att, GGML_PREC_F32);
        } else {
            ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, K, Q), in.mask, scale, 0.0f); // [n_kv, n, Hq, B]
            ggml_tensor * V = ggml_cont(ctx, ggml_permute(ctx, window(vc), 1, 2, 0, 3));              // [n_kv, hd, Hkv, B]
            att = ggml_cont(ctx, ggml_permute(ctx, ggml_mul_mat(ctx, V, kq), 0, 2, 1, 3));            // [hd, Hq, n, B]
        }
        att = ggml_reshape_2d(ctx, att, hd * d.n_heads, n * B);
        x = ggml_add(ctx, x, proj(l.o, att));

        h = rms_norm(ctx, x, l.ffn_norm, d.rms_eps);
        ggml_tensor * fp = prepare(l.gate, h);
        ggml_tensor * ffn = ggml_mul(ctx, ggml_silu(ctx, proj(l.gate, h, fp)), proj(l.up, h, fp));
        x = ggml_add(ctx, x, proj(l.down, ffn));
        g.name(x, "dec.blk." + std::to_string(il) + ".out");
    }
    x = rms_norm(ctx, x, w.output_norm, d.rms_eps);
    if (!in.all_logits && n > 1) {  // each sequence's last position
        x = ggml_view_2d(ctx, x, x->ne[0], B, static_cast<size_t>(n) * x->nb[1], static_cast<size_t>(n - 1) * x->nb[1]);
        x = ggml_cont(ctx, x);
    }
    ggml_tensor * logits = proj(w.output, x);
    g.name(logits, "dec.logits");
    return logits;
}

}  // namespace fun_asr
