#include "graph/common.h"

#include <algorithm>
#include <cmath>

#include "kernels/gemm_amx.h"
#include "kernels/matvec.h"

namespace fun_asr {

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, const Norm & n, float eps) {
    x = ggml_norm(ctx, x, eps);
    x = ggml_mul(ctx, x, n.w);
    return n.b ? ggml_add(ctx, x, n.b) : x;
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    return matvec_supported(w, x) ? matvec(ctx, w, x) : ggml_mul_mat(ctx, w, x);
}

ggml_tensor * mul_mat_step(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    if (matvec_step_supported(w, x)) return matvec(ctx, w, x);
    const int64_t n = x->ne[1];
    if (n == 1 || !weight_in_cpu_memory(w)) return ggml_mul_mat(ctx, w, x);
    if (!ggml_is_contiguous(x)) x = ggml_cont(ctx, x);
    if (weight_is_repacked(w)) {
        // ggml's repacked products run its GEMV for each of up to 3 columns and a GEMM from 4 on:
        // groups of at most 3 columns take exactly the one-column arithmetic.
        ggml_tensor * out = nullptr;
        for (int64_t c = 0; c < n; c += 3) {
            const int64_t m = std::min<int64_t>(3, n - c);
            ggml_tensor * part = ggml_mul_mat(ctx, w, ggml_view_2d(ctx, x, x->ne[0], m, x->nb[1], c * x->nb[1]));
            out = out ? ggml_concat(ctx, out, part, 1) : part;
        }
        return out;
    }
    // Every column its own [k, 1] plane: ggml multiplies each plane by the (broadcast) weights with the
    // one-column path (vec_dot; its tiled GEMM only takes two or more columns), row blocks shared by
    // the planes, so a column's numbers are a single sequence's.
    ggml_tensor * planes = ggml_mul_mat(ctx, w, ggml_reshape_3d(ctx, x, x->ne[0], 1, n));
    return ggml_reshape_2d(ctx, planes, w->ne[1], n);
}

ggml_tensor * mul_mat_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared) {
    return amx_gemm_supported(w, x) ? amx_gemm(ctx, w, x, prepared) : mul_mat(ctx, w, x);
}

ggml_tensor * prepare_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    return amx_gemm_supported(w, x) ? amx_prepare(ctx, x) : nullptr;
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * x, const Linear & l, ggml_tensor * prepared) {
    if (amx_gemm_supported(l.w, x) && amx_bias_supported(l.w, l.b)) return amx_gemm(ctx, l.w, x, prepared, l.b);
    x = mul_mat(ctx, l.w, x);
    return l.b ? ggml_add(ctx, x, l.b) : x;
}

ggml_tensor * attention_full(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                             int64_t n_heads, ggml_tensor * mask) {
    const int64_t d = q->ne[0], T = q->ne[1], hd = d / n_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (mask == nullptr) {
        // One fused node (F32 K/V, online softmax in F32): the matmul path's second product has the
        // sequence length as its inner dimension, which ggml's fast GEMM only takes in multiples of
        // 16, so it ran at ~13 GFLOP/s and took ~18% of the encoder's time.
        ggml_tensor * qh = ggml_permute(ctx, ggml_reshape_3d(ctx, q, hd, n_heads, T), 0, 2, 1, 3);  // [hd, T, H]
        ggml_tensor * kh = ggml_permute(ctx, ggml_reshape_3d(ctx, k, hd, n_heads, T), 0, 2, 1, 3);
        ggml_tensor * vh = ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, n_heads, T), 0, 2, 1, 3);
        ggml_tensor * out = ggml_flash_attn_ext(ctx, qh, kh, vh, nullptr, scale, 0.0f, 0.0f);  // [hd, H, T]
        ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
        return ggml_reshape_2d(ctx, out, d, T);
    }
    // [d, T] -> [hd, T, H], made contiguous so the matmuls take the fast (tinyBLAS) path
    ggml_tensor * qh = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, q, hd, n_heads, T), 0, 2, 1, 3));
    ggml_tensor * kh = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, k, hd, n_heads, T), 0, 2, 1, 3));
    ggml_tensor * kq = ggml_mul_mat(ctx, kh, qh);  // [T_k, T_q, H]
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
    // v: [d, T] -> [T, hd, H]
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, n_heads, T), 1, 2, 0, 3));
    ggml_tensor * out = ggml_mul_mat(ctx, vt, kq);  // [hd, T_q, H]
    out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));  // [hd, H, T_q]
    return ggml_reshape_2d(ctx, out, d, T);
}

namespace {

// Depthwise conv1d over time (zero padding (K-1)/2 | K-1-(K-1)/2, no bias) of v [d, T] with the
// FSMN kernel [K, 1, d], plus v itself: FunASR's FSMN memory block.
ggml_tensor * fsmn(ggml_context * ctx, ggml_tensor * v, ggml_tensor * kernel, int64_t K) {
    const int64_t d = v->ne[0], T = v->ne[1];
    const int left = static_cast<int>((K - 1) / 2), right = static_cast<int>(K - 1 - left);
    ggml_tensor * vt = ggml_cont(ctx, ggml_transpose(ctx, v));  // [T, d]
    vt = ggml_pad_ext(ctx, vt, left, right, 0, 0, 0, 0, 0, 0);   // [T + K - 1, d]
    vt = ggml_reshape_3d(ctx, vt, T + K - 1, d, 1);
    ggml_tensor * conv = ggml_ssm_conv(ctx, vt, ggml_reshape_2d(ctx, kernel, K, d));  // [d, T, 1]
    return ggml_add(ctx, ggml_reshape_2d(ctx, conv, d, T), v);
}

}  // namespace

ggml_tensor * sanm_layer(const GraphCtx & g, ggml_tensor * x, const SanmLayer & l, int64_t n_heads,
                         int64_t fsmn_kernel, float eps, ggml_tensor * mask, const std::string & name) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * h = layer_norm(ctx, x, l.attn_norm, eps);
    // q, k and v read the same input: on AMX it is quantized into tiles once for the three.
    ggml_tensor * hp = prepare_frames(ctx, l.q.w, h);
    ggml_tensor * q = linear(ctx, h, l.q, hp);
    ggml_tensor * k = linear(ctx, h, l.k, hp);
    ggml_tensor * v = linear(ctx, h, l.v, hp);
    ggml_tensor * att = linear(ctx, attention_full(ctx, q, k, v, n_heads, mask), l.o);
    if (l.fsmn) att = ggml_add(ctx, att, fsmn(ctx, v, l.fsmn, fsmn_kernel));
    g.name(att, name + ".attn_out");
    // Layer 0 of the encoder widens 560 -> d: no residual around its attention.
    x = x->ne[0] == att->ne[0] ? ggml_add(ctx, x, att) : att;
    h = layer_norm(ctx, x, l.ffn_norm, eps);
    h = linear(ctx, ggml_relu(ctx, linear(ctx, h, l.up)), l.down);
    x = ggml_add(ctx, x, h);
    if (l.out_norm.w) x = layer_norm(ctx, x, l.out_norm, eps);
    g.name(x, name + ".out");
    return x;
}

}  // namespace fun_asr
