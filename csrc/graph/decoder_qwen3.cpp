// Qwen3 decoder (docs/model.md, Decoder): RMSNorm, per-head q/k RMSNorm before NeoX RoPE, GQA attention over
// the KV cache, SwiGLU FFN, final RMSNorm, (tied) output projection.
#include <cmath>
#include <vector>

#include "graph/stages.h"

namespace fun_asr {

namespace {

// build_decoder's graph, layer by layer; x_ is the residual stream.
class DecoderBuilder {
public:
    DecoderBuilder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w, const DecoderInputs & in)
        : g_(g), gf_(gf), ctx_(g.ctx), d_(hp.dec), w_(w), in_(in), n_(in.n), B_(in.n_seqs), hd_(d_.head_dim),
          kv_dim_(hd_ * d_.n_kv_heads), scale_(1.0f / std::sqrt(static_cast<float>(hd_))),
          frames_(in.n > 1 && !in.step_products), fuse_(!g.every_stage), x_(in.x) {}

    ggml_tensor * build();

private:
    ggml_tensor * proj(ggml_tensor * W, ggml_tensor * a, ggml_tensor * prepared = nullptr) {
        return frames_ ? mul_mat_frames(ctx_, W, a, prepared) : mul_mat_step(ctx_, W, a, prepared);
    }
    // The products that read the same input (q/k/v, gate/up) share its prepared activation (AMX tiles, the
    // int8 GEMM's quants) where their kernel takes one.
    ggml_tensor * prepare(ggml_tensor * W, ggml_tensor * a) {
        return frames_ ? prepare_frames(ctx_, W, a) : prepare_step(ctx_, W, a);
    }
    ggml_tensor * residual_norm(ggml_tensor * y, ggml_tensor * norm);
    std::vector<ggml_tensor *> normed_products(ggml_tensor * y, ggml_tensor * norm, const std::vector<ggml_tensor *> & ws);
    std::vector<ggml_tensor *> layer_qkv(int64_t il, const std::vector<ggml_tensor *> & qkv0, ggml_tensor * h,
                                         ggml_tensor * down);
    ggml_tensor * head_proj(ggml_tensor * product, int64_t n_heads, ggml_tensor * norm);
    // A cache as rows of one position's K/V heads.
    ggml_tensor * rows(ggml_tensor * cache) {
        return ggml_view_2d(ctx_, cache, kv_dim_, cache->ne[2] * cache->ne[3], cache->nb[2], 0);
    }
    // A cache's part that sequences [slot, slot + seqs) see: [hd, Hkv, n_kv, seqs].
    ggml_tensor * window(ggml_tensor * cache, int64_t n_kv, int64_t seqs, int64_t slot) {
        return ggml_view_4d(ctx_, cache, hd_, d_.n_kv_heads, n_kv, seqs, cache->nb[1], cache->nb[2], cache->nb[3],
                            static_cast<size_t>(slot) * cache->nb[3]);
    }
    ggml_tensor * attention(const Qwen3Layer & l, const std::vector<ggml_tensor *> & qkv, ggml_tensor * kc,
                            ggml_tensor * vc);
    ggml_tensor * plain_attention(const Qwen3Layer & l, const std::vector<ggml_tensor *> & qkv, ggml_tensor * kc,
                                  ggml_tensor * vc, const CachedAttention & cached);
    ggml_tensor * flash_attention(ggml_tensor * q, ggml_tensor * q4, ggml_tensor * kc, ggml_tensor * vc,
                                  const CachedAttention & cached);
    ggml_tensor * matmul_attention(ggml_tensor * q4, ggml_tensor * kc, ggml_tensor * vc);
    ggml_tensor * attend(ggml_tensor * Q, ggml_tensor * kc, ggml_tensor * vc, int64_t n_kv, int64_t seqs,
                         int64_t slot, ggml_tensor * mask);
    ggml_tensor * feed_forward(const Qwen3Layer & l, ggml_tensor * att);
    ggml_tensor * logits(ggml_tensor * down, ggml_tensor * h);

    const GraphCtx & g_;
    ggml_cgraph * gf_;
    ggml_context * ctx_;
    const DecoderHParams & d_;
    const Weights & w_;
    const DecoderInputs & in_;
    const int64_t n_, B_, hd_, kv_dim_;
    const float scale_;
    // A prefill (several positions of one sequence) takes the many-column path for every product, a
    // decode step (one column per sequence) mul_mat_step: each sequence's numbers then do not depend
    // on the batch around it.
    // (A speculative verification, step_products, runs its positions as decode steps.)
    const bool frames_;
    // The element-wise work between the products in fewer nodes (kernels/decoder_fused: the same bits, fewer
    // thread barriers): each residual sum with the RMSNorm after it, the q/k heads' norms in one node and their
    // RoPE in one, the K/V rows stored in one, SwiGLU in one. A debug run that reads every layer's output
    // builds the plain graph, as FUN_ASR_FUSE=0 does.
    const bool fuse_;
    ggml_tensor * x_;
};

// x + y and the RMSNorm of it with weight `norm`: sets x, returns the norm.
ggml_tensor * DecoderBuilder::residual_norm(ggml_tensor * y, ggml_tensor * norm) {
    ggml_tensor * sum = nullptr;
    if (ggml_tensor * normed = fuse_ ? add_rms_norm_node(ctx_, x_, y, norm, d_.rms_eps, &sum) : nullptr) {
        x_ = sum;
        return normed;
    }
    x_ = ggml_add(ctx_, x_, y);
    return rms_norm(ctx_, x_, norm, d_.rms_eps);
}

// The products after a residual sum: in a decode step their node computes x + y and its norm itself where it
// takes that (kernels/decoder_fused: node_input; one node and one barrier fewer), else residual_norm's node.
std::vector<ggml_tensor *> DecoderBuilder::normed_products(ggml_tensor * y, ggml_tensor * norm,
                                                           const std::vector<ggml_tensor *> & ws) {
    if (fuse_ && !frames_) {
        ggml_tensor * sum = nullptr;
        auto out = products_after_add_norm(ctx_, ws, x_, y, norm, d_.rms_eps, &sum);
        if (!out.empty()) {
            x_ = sum;
            return out;
        }
    }
    ggml_tensor * h = residual_norm(y, norm);
    return products(ctx_, ws, h, prepare(ws[0], h), frames_);
}

// Layer il's q / k / v in one node where the kernel takes them together (the same numbers as three): after the
// previous layer's residual sum (down), the first layer's fused products (qkv0), or from the normed input h.
std::vector<ggml_tensor *> DecoderBuilder::layer_qkv(int64_t il, const std::vector<ggml_tensor *> & qkv0,
                                                     ggml_tensor * h, ggml_tensor * down) {
    const Qwen3Layer & l = w_.dec[static_cast<size_t>(il)];
    if (down) return normed_products(down, l.attn_norm, {l.q, l.k, l.v});
    if (il == 0 && !qkv0.empty()) return qkv0;
    return products(ctx_, {l.q, l.k, l.v}, h, prepare(l.q, h), frames_);
}

// A product as heads [hd, n_heads, n*B]; with a norm, normed and rotated (NeoX RoPE at the positions).
ggml_tensor * DecoderBuilder::head_proj(ggml_tensor * product, int64_t n_heads, ggml_tensor * norm) {
    ggml_tensor * t = ggml_reshape_3d(ctx_, product, hd_, n_heads, n_ * B_);
    if (!norm) return t;
    ggml_tensor * normed = rms_norm(ctx_, t, norm, d_.rms_eps);
    ggml_tensor * r = g_.caps.norm_rope_chain ? normed : ggml_cont(ctx_, normed);  // (DeviceCaps)
    return ggml_rope_ext(ctx_, r, in_.positions, nullptr, static_cast<int>(hd_), GGML_ROPE_TYPE_NEOX, 0,
                         d_.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
}

// The layer's attention over its KV cache (the new K/V rows stored), [hd, Hq, n, B] or [hd * Hq, n * B].
ggml_tensor * DecoderBuilder::attention(const Qwen3Layer & l, const std::vector<ggml_tensor *> & qkv, ggml_tensor * kc,
                                        ggml_tensor * vc) {
    const bool cpu_cache = g_.caps.host && kc->buffer;  // fun-asr's attention op reads it
    ggml_tensor * kw = window(kc, in_.n_kv, B_, in_.slot0), * vw = window(vc, in_.n_kv, B_, in_.slot0);
    const CachedAttention cached{qkv[0], qkv[1], qkv[2], l.q_norm, l.k_norm, in_.positions, in_.kv_rows, rows(kc),
                                 rows(vc), kw, vw, in_.mask, hd_, d_.n_heads, d_.n_kv_heads, scale_, d_.rms_eps,
                                 d_.rope_theta, n_ == 1 && !frames_};
    // fun-asr's CPU attention with the heads' norms, RoPE and K/V store in its nodes (graph/common)
    ggml_tensor * att = fuse_ && in_.flash_attn && cpu_cache && l.q_norm && l.k_norm
                            ? fused_cached_attention(ctx_, gf_, cached) : nullptr;
    // else the plain graph (also for GPU caches, ggml's attention, FUN_ASR_FUSE=0 and debug runs)
    return att ? att : plain_attention(l, qkv, kc, vc, cached);
}

ggml_tensor * DecoderBuilder::plain_attention(const Qwen3Layer & l, const std::vector<ggml_tensor *> & qkv,
                                              ggml_tensor * kc, ggml_tensor * vc, const CachedAttention & cached) {
    const bool cpu_cache = g_.caps.host && kc->buffer;
    ggml_tensor * q = head_proj(qkv[0], d_.n_heads, l.q_norm);     // [hd, Hq, n*B]
    ggml_tensor * k = head_proj(qkv[1], d_.n_kv_heads, l.k_norm);  // [hd, Hkv, n*B]
    ggml_tensor * v = head_proj(qkv[2], d_.n_kv_heads, nullptr);
    // Store the new K/V rows, then attend over each sequence's cached prefix.
    ggml_build_forward_expand(gf_, ggml_set_rows(ctx_, rows(kc), ggml_reshape_2d(ctx_, k, kv_dim_, n_ * B_), in_.kv_rows));
    ggml_build_forward_expand(gf_, ggml_set_rows(ctx_, rows(vc), ggml_reshape_2d(ctx_, v, kv_dim_, n_ * B_), in_.kv_rows));
    ggml_tensor * q4 = ggml_reshape_4d(ctx_, q, hd_, d_.n_heads, n_, B_);
    // fun-asr's CPU op (kernels/attention): each query row over its own visible keys, so the same bits
    // alone, in any batch and in a verification pass; ~4x ggml's flash attention per step.
    if (in_.flash_attn && cpu_cache) {
        if (ggml_tensor * att = host_cached_attention(ctx_, q, cached)) return att;
    }
    return in_.flash_attn ? flash_attention(q, q4, kc, vc, cached) : matmul_attention(q4, kc, vc);
}

// ggml's fused attention: F32 K/V, online softmax in F32, one node instead of six.
// Keys past a sequence's own length are masked (-inf) and skipped, so every (sequence, head) row is the same loop
// over its own keys in any batch. One exception: for a query of one position in dimension 1 and one sequence in
// dimension 3, ggml splits the keys over its threads from 512 keys on and merges the parts, which rounds
// differently. A lone decode step therefore puts the K/V heads in dimension 3 (the query heads of each as
// dimension 2; with a single K/V head, every query head in dimension 3 reading it with stride 0): the same
// per-row loop as in a batch (CPU caches only: other backends have their own kernels). (A view may not reach past
// its source's bytes, so the single head is copied per query head rather than read with stride 0: only tiny test
// configs have one K/V head.)
ggml_tensor * DecoderBuilder::flash_attention(ggml_tensor * q, ggml_tensor * q4, ggml_tensor * kc, ggml_tensor * vc,
                                              const CachedAttention & cached) {
    const bool cpu_cache = g_.caps.host && kc->buffer;
    ggml_tensor *Q, *K, *V;
    if (n_ == 1 && B_ == 1 && cpu_cache) {
        const int64_t Hkv = d_.n_kv_heads, G = d_.n_heads / Hkv, h3 = Hkv > 1 ? Hkv : d_.n_heads;
        Q = ggml_reshape_4d(ctx_, q, hd_, 1, Hkv > 1 ? G : 1, h3);  // head g + G * kv_head
        auto kv = [&](ggml_tensor * cache) {  // [hd, n_kv, 1, h3]
            ggml_tensor * t = ggml_view_4d(ctx_, cache, hd_, in_.n_kv, 1, Hkv, cache->nb[2], cache->nb[2],
                                           cache->nb[1], static_cast<size_t>(in_.slot0) * cache->nb[3]);
            return Hkv > 1 ? t : ggml_repeat_4d(ctx_, t, hd_, in_.n_kv, 1, h3);
        };
        K = kv(kc);
        V = kv(vc);
    } else {
        Q = ggml_permute(ctx_, q4, 0, 2, 1, 3);              // [hd, n, Hq, B]
        K = ggml_permute(ctx_, cached.k_window, 0, 2, 1, 3);  // [hd, n_kv, Hkv, B]
        V = ggml_permute(ctx_, cached.v_window, 0, 2, 1, 3);
    }
    ggml_tensor * att = ggml_flash_attn_ext(ctx_, Q, K, V, in_.mask, scale_, 0.0f, 0.0f);  // [hd, Hq, n, B] (same layout)
    ggml_flash_attn_ext_set_prec(att, GGML_PREC_F32);
    return att;
}

// matmul / softmax / matmul. Their sums run over the cached positions, so in a decode step each sequence attends
// over exactly its own (a batch's longest length would change the sums' grouping): one small chain per sequence,
// the ops a lone step runs. (On a GPU the whole batch in one chain: its kernels round batches differently anyway.)
ggml_tensor * DecoderBuilder::matmul_attention(ggml_tensor * q4, ggml_tensor * kc, ggml_tensor * vc) {
    const bool cpu_cache = g_.caps.host && kc->buffer;
    if (!(n_ == 1 && B_ > 1 && in_.kv_lens && cpu_cache)) {
        return attend(ggml_permute(ctx_, q4, 0, 2, 1, 3), kc, vc, in_.n_kv, B_, in_.slot0, in_.mask);
    }
    ggml_tensor * att = nullptr;
    ggml_tensor * mask = in_.mask;
    for (int64_t b = 0; b < B_; ++b) {
        const int64_t len = (*in_.kv_lens)[static_cast<size_t>(b)];
        ggml_tensor * Qb = ggml_view_4d(ctx_, q4, hd_, d_.n_heads, 1, 1, q4->nb[1], q4->nb[2], q4->nb[3],
                                        static_cast<size_t>(b) * q4->nb[3]);
        ggml_tensor * mb = ggml_cont(ctx_, ggml_view_4d(ctx_, mask, len, 1, 1, 1, mask->nb[1], mask->nb[2], mask->nb[3],
                                                        static_cast<size_t>(b) * mask->nb[3]));
        ggml_tensor * ab = attend(ggml_permute(ctx_, Qb, 0, 2, 1, 3), kc, vc, len, 1, in_.slot0 + b, mb);
        att = att ? ggml_concat(ctx_, att, ab, 3) : ab;
    }
    return att;
}

// One matmul / softmax / matmul chain: queries Q [hd, n, Hq, seqs] over sequences [slot, slot + seqs)'s first n_kv
// keys -> [hd, Hq, n, seqs].
ggml_tensor * DecoderBuilder::attend(ggml_tensor * Q, ggml_tensor * kc, ggml_tensor * vc, int64_t n_kv, int64_t seqs,
                                     int64_t slot, ggml_tensor * mask) {
    ggml_tensor * K = ggml_permute(ctx_, window(kc, n_kv, seqs, slot), 0, 2, 1, 3);              // [hd, n_kv, Hkv, s]
    ggml_tensor * kq = ggml_soft_max_ext(ctx_, ggml_mul_mat(ctx_, K, Q), mask, scale_, 0.0f);     // [n_kv, n, Hq, s]
    ggml_tensor * V = ggml_cont(ctx_, ggml_permute(ctx_, window(vc, n_kv, seqs, slot), 1, 2, 0, 3));  // [n_kv, hd, Hkv, s]
    return ggml_cont(ctx_, ggml_permute(ctx_, ggml_mul_mat(ctx_, V, kq), 0, 2, 1, 3));            // [hd, Hq, n, s]
}

// The attention's output projection, its residual sum and norm, and the SwiGLU FFN up to the down projection
// (whose residual sum the next layer's products or the output make).
ggml_tensor * DecoderBuilder::feed_forward(const Qwen3Layer & l, ggml_tensor * att) {
    const std::vector<ggml_tensor *> gate_up = normed_products(proj(l.o, att), l.ffn_norm, {l.gate, l.up});
    // SwiGLU inside the down projection's node where it takes it, else its own node(s)
    ggml_tensor * down = fuse_ && !frames_ && swiglu_fusable(l.gate)
                             ? product_after_swiglu(ctx_, l.down, gate_up[0], gate_up[1])
                             : nullptr;
    if (!down) down = proj(l.down, swiglu(ctx_, gate_up[0], gate_up[1], l.gate, fuse_));
    return down;
}

// The final norm (after the last residual sum, down, where not formed yet) and the output projection.
ggml_tensor * DecoderBuilder::logits(ggml_tensor * down, ggml_tensor * h) {
    // A decode step: the last norm inside the output projection, where it takes it.
    if (down && n_ == 1 && !in_.all_logits) {
        const auto p = products_after_add_norm(ctx_, {w_.output}, x_, down, w_.output_norm, d_.rms_eps, nullptr);
        if (!p.empty()) {
            g_.name(p[0], "dec.logits");
            return p[0];
        }
    }
    ggml_tensor * x = down ? residual_norm(down, w_.output_norm) : h;
    if (!in_.all_logits && n_ > 1) {  // each sequence's last position
        x = ggml_view_2d(ctx_, x, x->ne[0], B_, static_cast<size_t>(n_) * x->nb[1], static_cast<size_t>(n_ - 1) * x->nb[1]);
        x = ggml_cont(ctx_, x);
    }
    // The output projection of a prefill's last positions (one column per sequence) takes the decode
    // step's path too: a huge matrix times a few columns runs at read bandwidth in the mat-vec kernels
    // (measured, 151936 x 1024 Q8_0 x 1 column: 18 ms through the AMX GEMM, 15 ms through the int8 GEMM,
    // ~6 ms as a step), and each sequence's numbers stay its own.
    ggml_tensor * out = in_.all_logits ? proj(w_.output, x) : mul_mat_step(ctx_, w_.output, x);
    g_.name(out, "dec.logits");
    return out;
}

ggml_tensor * DecoderBuilder::build() {
    // The first layer's norm: inside its q/k/v node where that takes it (as the residual norms below), else ggml's.
    std::vector<ggml_tensor *> qkv0;
    if (fuse_ && !frames_) {
        const Qwen3Layer & l = w_.dec.front();
        qkv0 = products_after_add_norm(ctx_, {l.q, l.k, l.v}, x_, nullptr, l.attn_norm, d_.rms_eps, nullptr);
    }
    // each later one: the previous layer's end
    ggml_tensor * h = qkv0.empty() ? rms_norm(ctx_, x_, w_.dec.front().attn_norm, d_.rms_eps) : nullptr;
    ggml_tensor * down = nullptr;  // (fused: the previous layer's last product, its residual sum not formed yet)
    for (int64_t il = 0; il < d_.n_layers; ++il) {
        const Qwen3Layer & l = w_.dec[static_cast<size_t>(il)];
        ggml_tensor * kc = (*in_.k_cache)[static_cast<size_t>(il)];
        ggml_tensor * vc = (*in_.v_cache)[static_cast<size_t>(il)];
        const std::vector<ggml_tensor *> qkv = layer_qkv(il, qkv0, h, down);
        ggml_tensor * att = attention(l, qkv, kc, vc);
        att = ggml_reshape_2d(ctx_, att, hd_ * d_.n_heads, n_ * B_);
        down = feed_forward(l, att);
        if (!fuse_) {  // (a debug run reads each layer's output)
            h = residual_norm(down, il + 1 < d_.n_layers ? w_.dec[static_cast<size_t>(il + 1)].attn_norm : w_.output_norm);
            down = nullptr;
            g_.name(x_, "dec.blk." + std::to_string(il) + ".out");
        }
    }
    return logits(down, h);
}

}  // namespace

ggml_tensor * build_decoder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w,
                            const DecoderInputs & in) {
    return DecoderBuilder(g, gf, hp, w, in).build();
}

}  // namespace fun_asr
