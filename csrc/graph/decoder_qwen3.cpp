// Qwen3 decoder (docs/model.md, Decoder): RMSNorm, per-head q/k RMSNorm before NeoX RoPE, GQA attention over
// the KV cache, SwiGLU FFN, final RMSNorm, (tied) output projection.
#include <cmath>
#include <vector>

#include "graph/stages.h"

namespace fun_asr {

ggml_tensor * build_decoder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w,
                            const DecoderInputs & in) {
    ggml_context * ctx = g.ctx;
    const auto & d = hp.dec;
    const int64_t n = in.n, B = in.n_seqs, hd = d.head_dim, kv_dim = hd * d.n_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ggml_tensor * x = in.x;
    // A prefill (several positions of one sequence) takes the many-column path for every product, a
    // decode step (one column per sequence) mul_mat_step: each sequence's numbers then do not depend
    // on the batch around it.
    // (A speculative verification, step_products, runs its positions as decode steps.)
    const bool frames = in.n > 1 && !in.step_products;
    auto proj = [&](ggml_tensor * W, ggml_tensor * a, ggml_tensor * prepared = nullptr) {
        return frames ? mul_mat_frames(ctx, W, a, prepared) : mul_mat_step(ctx, W, a, prepared);
    };
    // The products that read the same input (q/k/v, gate/up) share its prepared activation (AMX tiles, the
    // int8 GEMM's quants) where their kernel takes one.
    auto prepare = [&](ggml_tensor * W, ggml_tensor * a) { return frames ? prepare_frames(ctx, W, a) : prepare_step(ctx, W, a); };
    // The element-wise work between the products in fewer nodes (kernels/decoder_fused: the same bits, fewer
    // thread barriers): each residual sum with the RMSNorm after it, the q/k heads' norms in one node and their
    // RoPE in one, the K/V rows stored in one, SwiGLU in one. A debug run that reads every layer's output
    // builds the plain graph, as FUN_ASR_FUSE=0 does.
    const bool fuse = !g.every_stage;
    // x + y and the RMSNorm of it with weight `norm`: sets x, returns the norm.
    auto residual_norm = [&](ggml_tensor * y, ggml_tensor * norm) {
        ggml_tensor * sum = nullptr;
        if (ggml_tensor * normed = fuse ? add_rms_norm_node(ctx, x, y, norm, d.rms_eps, &sum) : nullptr) {
            x = sum;
            return normed;
        }
        x = ggml_add(ctx, x, y);
        return rms_norm(ctx, x, norm, d.rms_eps);
    };
    // The products after a residual sum: in a decode step their node computes x + y and its norm itself where it
    // takes that (kernels/decoder_fused: node_input; one node and one barrier fewer), else residual_norm's node.
    auto normed_products = [&](ggml_tensor * y, ggml_tensor * norm, const std::vector<ggml_tensor *> & ws) {
        if (fuse && !frames) {
            ggml_tensor * sum = nullptr;
            auto out = products_after_add_norm(ctx, ws, x, y, norm, d.rms_eps, &sum);
            if (!out.empty()) {
                x = sum;
                return out;
            }
        }
        ggml_tensor * h = residual_norm(y, norm);
        return products(ctx, ws, h, prepare(ws[0], h), frames);
    };
    // The first layer's norm: inside its q/k/v node where that takes it (as the residual norms below), else ggml's.
    std::vector<ggml_tensor *> qkv0;
    if (fuse && !frames) {
        const Qwen3Layer & l = w.dec.front();
        qkv0 = products_after_add_norm(ctx, {l.q, l.k, l.v}, x, nullptr, l.attn_norm, d.rms_eps, nullptr);
    }
    // each later one: the previous layer's end
    ggml_tensor * h = qkv0.empty() ? rms_norm(ctx, x, w.dec.front().attn_norm, d.rms_eps) : nullptr;
    ggml_tensor * down = nullptr;  // (fused: the previous layer's last product, its residual sum not formed yet)
    for (int64_t il = 0; il < d.n_layers; ++il) {
        const Qwen3Layer & l = w.dec[static_cast<size_t>(il)];
        ggml_tensor * kc = (*in.k_cache)[static_cast<size_t>(il)];
        ggml_tensor * vc = (*in.v_cache)[static_cast<size_t>(il)];

        // q / k / v in one node where the kernel takes them together (the same numbers as three)
        std::vector<ggml_tensor *> qkv;
        if (down) {
            qkv = normed_products(down, l.attn_norm, {l.q, l.k, l.v});
        } else if (il == 0 && !qkv0.empty()) {
            qkv = qkv0;
        } else {
            qkv = products(ctx, {l.q, l.k, l.v}, h, prepare(l.q, h), frames);
        }
        auto rope = [&](ggml_tensor * t) {
            return ggml_rope_ext(ctx, t, in.positions, nullptr, static_cast<int>(hd), GGML_ROPE_TYPE_NEOX, 0,
                                 d.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        };
        auto head_proj = [&](ggml_tensor * product, int64_t n_heads, ggml_tensor * norm) {
            ggml_tensor * t = ggml_reshape_3d(ctx, product, hd, n_heads, n * B);
            if (!norm) return t;
            ggml_tensor * normed = rms_norm(ctx, t, norm, d.rms_eps);
            return rope(g.caps.norm_rope_chain ? normed : ggml_cont(ctx, normed));  // (DeviceCaps)
        };
        auto rows = [&](ggml_tensor * cache) {
            return ggml_view_2d(ctx, cache, kv_dim, cache->ne[2] * cache->ne[3], cache->nb[2], 0);
        };
        auto window = [&](ggml_tensor * cache, int64_t n_kv, int64_t seqs, int64_t slot) {  // [hd, Hkv, n_kv, seqs]
            return ggml_view_4d(ctx, cache, hd, d.n_kv_heads, n_kv, seqs, cache->nb[1], cache->nb[2], cache->nb[3],
                                static_cast<size_t>(slot) * cache->nb[3]);
        };
        const bool cpu_cache = g.caps.host && kc->buffer;  // fun-asr's attention op reads it
        ggml_tensor * kw = window(kc, in.n_kv, B, in.slot0), * vw = window(vc, in.n_kv, B, in.slot0);
        const CachedAttention cached{qkv[0], qkv[1], qkv[2], l.q_norm, l.k_norm, in.positions, in.kv_rows, rows(kc),
                                     rows(vc), kw, vw, in.mask, hd, d.n_heads, d.n_kv_heads, scale, d.rms_eps,
                                     d.rope_theta, n == 1 && !frames};
        // fun-asr's CPU attention with the heads' norms, RoPE and K/V store in its nodes (graph/common)
        ggml_tensor * att = fuse && in.flash_attn && cpu_cache && l.q_norm && l.k_norm
                                ? fused_cached_attention(ctx, gf, cached) : nullptr;
        if (!att) {  // the plain graph (also for GPU caches, ggml's attention, FUN_ASR_FUSE=0 and debug runs)
            ggml_tensor * q = head_proj(qkv[0], d.n_heads, l.q_norm);     // [hd, Hq, n*B]
            ggml_tensor * k = head_proj(qkv[1], d.n_kv_heads, l.k_norm);  // [hd, Hkv, n*B]
            ggml_tensor * v = head_proj(qkv[2], d.n_kv_heads, nullptr);
            // Store the new K/V rows, then attend over each sequence's cached prefix.
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, rows(kc), ggml_reshape_2d(ctx, k, kv_dim, n * B), in.kv_rows));
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, rows(vc), ggml_reshape_2d(ctx, v, kv_dim, n * B), in.kv_rows));
            ggml_tensor * q4 = ggml_reshape_4d(ctx, q, hd, d.n_heads, n, B);
            // fun-asr's CPU op (kernels/attention): each query row over its own visible keys, so the same bits
            // alone, in any batch and in a verification pass; ~4x ggml's flash attention per step.
            if (in.flash_attn && cpu_cache) att = host_cached_attention(ctx, q, cached);
            if (att) {
                // (fun-asr's attention)
            } else if (in.flash_attn) {  // fused: F32 K/V, online softmax in F32, one node instead of six
                // Keys past a sequence's own length are masked (-inf) and skipped, so every (sequence, head)
                // row is the same loop over its own keys in any batch. One exception: for a query of one
                // position in dimension 1 and one sequence in dimension 3, ggml splits the keys over its
                // threads from 512 keys on and merges the parts, which rounds differently. A lone decode
                // step therefore puts the K/V heads in dimension 3 (the query heads of each as dimension 2;
                // with a single K/V head, every query head in dimension 3 reading it with stride 0): the
                // same per-row loop as in a batch (CPU caches only: other backends have their own kernels).
                // (A view may not reach past its source's bytes, so the single head is copied per query
                // head rather than read with stride 0: only tiny test configs have one K/V head.)
                ggml_tensor *Q, *K, *V;
                if (n == 1 && B == 1 && cpu_cache) {
                    const int64_t Hkv = d.n_kv_heads, G = d.n_heads / Hkv, h3 = Hkv > 1 ? Hkv : d.n_heads;
                    Q = ggml_reshape_4d(ctx, q, hd, 1, Hkv > 1 ? G : 1, h3);  // head g + G * kv_head
                    auto kv = [&](ggml_tensor * cache) {  // [hd, n_kv, 1, h3]
                        ggml_tensor * t = ggml_view_4d(ctx, cache, hd, in.n_kv, 1, Hkv, cache->nb[2], cache->nb[2],
                                                       cache->nb[1], static_cast<size_t>(in.slot0) * cache->nb[3]);
                        return Hkv > 1 ? t : ggml_repeat_4d(ctx, t, hd, in.n_kv, 1, h3);
                    };
                    K = kv(kc);
                    V = kv(vc);
                } else {
                    Q = ggml_permute(ctx, q4, 0, 2, 1, 3);                                    // [hd, n, Hq, B]
                    K = ggml_permute(ctx, kw, 0, 2, 1, 3);  // [hd, n_kv, Hkv, B]
                    V = ggml_permute(ctx, vw, 0, 2, 1, 3);
                }
                att = ggml_flash_attn_ext(ctx, Q, K, V, in.mask, scale, 0.0f, 0.0f);  // [hd, Hq, n, B] (same layout)
                ggml_flash_attn_ext_set_prec(att, GGML_PREC_F32);
            } else {
                // matmul / softmax / matmul. Their sums run over the cached positions, so in a decode step
                // each sequence attends over exactly its own (a batch's longest length would change the
                // sums' grouping): one small chain per sequence, the ops a lone step runs.
                auto attend = [&](ggml_tensor * Q, int64_t n_kv, int64_t seqs, int64_t slot, ggml_tensor * mask) {
                    ggml_tensor * K = ggml_permute(ctx, window(kc, n_kv, seqs, slot), 0, 2, 1, 3);             // [hd, n_kv, Hkv, s]
                    ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, K, Q), mask, scale, 0.0f);     // [n_kv, n, Hq, s]
                    ggml_tensor * V = ggml_cont(ctx, ggml_permute(ctx, window(vc, n_kv, seqs, slot), 1, 2, 0, 3));  // [n_kv, hd, Hkv, s]
                    return ggml_cont(ctx, ggml_permute(ctx, ggml_mul_mat(ctx, V, kq), 0, 2, 1, 3));            // [hd, Hq, n, s]
                };
                // (On a GPU the whole batch in one chain: its kernels round batches differently anyway.)
                if (n == 1 && B > 1 && in.kv_lens && cpu_cache) {
                    att = nullptr;
                    for (int64_t b = 0; b < B; ++b) {
                        const int64_t len = (*in.kv_lens)[static_cast<size_t>(b)];
                        ggml_tensor * Qb = ggml_view_4d(ctx, q4, hd, d.n_heads, 1, 1, q4->nb[1], q4->nb[2], q4->nb[3],
                                                        static_cast<size_t>(b) * q4->nb[3]);
                        ggml_tensor * mb = ggml_cont(ctx, ggml_view_4d(ctx, in.mask, len, 1, 1, 1, in.mask->nb[1], in.mask->nb[2],
                                                                       in.mask->nb[3], static_cast<size_t>(b) * in.mask->nb[3]));
                        ggml_tensor * ab = attend(ggml_permute(ctx, Qb, 0, 2, 1, 3), len, 1, in.slot0 + b, mb);
                        att = att ? ggml_concat(ctx, att, ab, 3) : ab;
                    }
                } else {
                    att = attend(ggml_permute(ctx, q4, 0, 2, 1, 3), in.n_kv, B, in.slot0, in.mask);
                }
            }
        }
        att = ggml_reshape_2d(ctx, att, hd * d.n_heads, n * B);
        const std::vector<ggml_tensor *> gate_up = normed_products(proj(l.o, att), l.ffn_norm, {l.gate, l.up});
        // SwiGLU inside the down projection's node where it takes it, else its own node(s)
        down = fuse && !frames && swiglu_fusable(l.gate) ? product_after_swiglu(ctx, l.down, gate_up[0], gate_up[1])
                                                         : nullptr;
        if (!down) down = proj(l.down, swiglu(ctx, gate_up[0], gate_up[1], l.gate, fuse));
        if (!fuse) {  // (a debug run reads each layer's output)
            h = residual_norm(down, il + 1 < d.n_layers ? w.dec[static_cast<size_t>(il + 1)].attn_norm : w.output_norm);
            down = nullptr;
            g.name(x, "dec.blk." + std::to_string(il) + ".out");
        }
    }
    // A decode step: the last norm inside the output projection, where it takes it.
    if (down && n == 1 && !in.all_logits) {
        const auto p = products_after_add_norm(ctx, {w.output}, x, down, w.output_norm, d.rms_eps, nullptr);
        if (!p.empty()) {
            g.name(p[0], "dec.logits");
            return p[0];
        }
    }
    x = down ? residual_norm(down, w.output_norm) : h;
    if (!in.all_logits && n > 1) {  // each sequence's last position
        x = ggml_view_2d(ctx, x, x->ne[0], B, static_cast<size_t>(n) * x->nb[1], static_cast<size_t>(n - 1) * x->nb[1]);
        x = ggml_cont(ctx, x);
    }
    // The output projection of a prefill's last positions (one column per sequence) takes the decode
    // step's path too: a huge matrix times a few columns runs at read bandwidth in the mat-vec kernels
    // (measured, 151936 x 1024 Q8_0 x 1 column: 18 ms through the AMX GEMM, 15 ms through the int8 GEMM,
    // ~6 ms as a step), and each sequence's numbers stay its own.
    ggml_tensor * logits = in.all_logits ? proj(w.output, x) : mul_mat_step(ctx, w.output, x);
    g.name(logits, "dec.logits");
    return logits;
}

}  // namespace fun_asr
