// CAM++ graph (FunASR funasr/models/campplus/{model,components}.py; batch norms folded at conversion):
// FCM head (2-D conv + residual blocks, stride along frequency) -> reshape to (C * F', T) -> TDNN conv1d
// -> CAM dense blocks (BN-ReLU -> 1x1 conv -> ReLU -> CAM layer: dilated local conv times a sigmoid mask
// from the mean over time plus segment average pooling; each layer's output appended to its input) with
// transit layers (BN-ReLU -> 1x1 conv) -> ReLU -> statistics pooling (mean, unbiased std) -> dense layer.
//
// Layout: channels innermost throughout ([C, T, F, B] in the FCM, [C, T * B] after it): 1x1 convs are plain
// matrix products, the others im2col (graph/common's im2col_channels_last) and one matrix product in the
// weights' type (F32 or F16).
#include "graph/campplus.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace fun_asr {

namespace {

// relu(x * scale + shift) per channel, a CPU custom op over x [C, N] (rows may be strided; scale may be null):
// one pass instead of ggml's mul, add and relu.
void affine_relu_run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const float * shift = static_cast<const float *>(dst->src[1]->data);
    const float * scale = dst->src[2] ? static_cast<const float *>(dst->src[2]->data) : nullptr;
    const int64_t C = dst->ne[0], N = dst->ne[1];
    const int64_t per = (N + nth - 1) / nth, n0 = per * ith, n1 = std::min<int64_t>(N, n0 + per);
    for (int64_t n = n0; n < n1; ++n) {
        const float * in = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + n * x->nb[1]);
        float * out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + n * dst->nb[1]);
        if (scale) {
            for (int64_t c = 0; c < C; ++c) out[c] = std::max(0.0f, in[c] * scale[c] + shift[c]);
        } else {
            for (int64_t c = 0; c < C; ++c) out[c] = std::max(0.0f, in[c] + shift[c]);
        }
    }
}

// relu(x * scale + shift) of x [C, N] (2-D, channels contiguous) -> [C, N] contiguous.
ggml_tensor * affine_relu(ggml_context * ctx, ggml_tensor * x, ggml_tensor * scale, ggml_tensor * shift) {
    ggml_tensor * args[3] = {x, shift, scale};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], 1, 1, args, scale ? 3 : 2, affine_relu_run,
                          GGML_N_TASKS_MAX, nullptr);
}

// Conv of x [Cin, T, F, B] (channels innermost) with a kt x kf kernel (zero padding (k-1)/2 * dilation; stride
// `st` along time, `sf` along frequency) plus bias: im2col and one matrix product in the weights' type. The
// weight holds, per output channel, the taps in order (frequency, time) and the input channels innermost
// (torch's [Cout, Cin, kf, kt] with the input channels moved last). -> [Cout, T', F', B]
ggml_tensor * conv(ggml_context * ctx, ggml_tensor * x, const SpkConv & c, int kt, int kf, int st, int sf, int dt = 1,
                   bool relu = false) {
    const Im2colParams shape{kt, kf, st, sf, (kt - 1) / 2 * dt, (kf - 1) / 2, dt, 1};
    ggml_tensor * cols = im2col_channels_last(ctx, x, shape, c.w->type);
    const int64_t K = cols->ne[0], cout = ggml_nelements(c.w) / K;
    ggml_tensor * y = mul_mat(ctx, ggml_reshape_2d(ctx, c.w, K, cout),
                              ggml_reshape_2d(ctx, cols, K, cols->ne[1] * cols->ne[2] * cols->ne[3]));
    if (relu && c.b) {
        y = affine_relu(ctx, y, nullptr, c.b);
    } else {
        if (c.b) y = ggml_add(ctx, y, c.b);
        if (relu) y = ggml_relu(ctx, y);
    }
    return ggml_reshape_4d(ctx, y, cout, cols->ne[1], cols->ne[2], cols->ne[3]);
}

// A 2-D FCM conv: weight ggml [Cin, kt, kf, Cout].
ggml_tensor * conv2d(ggml_context * ctx, ggml_tensor * x, const SpkConv & c, int sf, bool relu = false) {
    return conv(ctx, x, c, static_cast<int>(c.w->ne[1]), static_cast<int>(c.w->ne[2]), 1, sf, 1, relu);
}

ggml_tensor * affine(ggml_context * ctx, ggml_tensor * x, const SpkConv & c) {
    ggml_tensor * y = mul_mat(ctx, c.w, x);
    return c.b ? ggml_add(ctx, y, c.b) : y;
}


// CAM context, a CPU custom op: dst[c, s, b] = mean over t of x[c, t, b] + mean over the frames of segment s
// (frames s*L .. min(T, (s+1)*L) - 1, L = seg_len: torch's avg_pool1d with ceil_mode, whose last partial
// window averages its valid frames only). x [C, T, B], dst [C, S, B].
void cam_context(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    const int64_t L = *static_cast<const int64_t *>(userdata);
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], S = dst->ne[1];
    const int64_t per = (C + nth - 1) / nth, c0 = per * ith, c1 = std::min<int64_t>(C, c0 + per);
    if (c0 >= c1) return;
    std::vector<double> total(static_cast<size_t>(c1 - c0)), part(total.size());
    for (int64_t b = 0; b < B; ++b) {
        std::fill(total.begin(), total.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
            const float * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1] +
                                                                b * x->nb[2]);
            for (int64_t c = c0; c < c1; ++c) total[static_cast<size_t>(c - c0)] += row[c];
        }
        for (int64_t s = 0; s < S; ++s) {
            std::fill(part.begin(), part.end(), 0.0);
            const int64_t t0 = s * L, t1 = std::min(T, t0 + L);
            for (int64_t t = t0; t < t1; ++t) {
                const float * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) +
                                                                    t * x->nb[1] + b * x->nb[2]);
                for (int64_t c = c0; c < c1; ++c) part[static_cast<size_t>(c - c0)] += row[c];
            }
            float * out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + s * dst->nb[1] + b * dst->nb[2]);
            const double n = static_cast<double>(std::max<int64_t>(t1 - t0, 1));
            for (int64_t c = c0; c < c1; ++c) {
                const size_t k = static_cast<size_t>(c - c0);
                out[c] = static_cast<float>(total[k] / static_cast<double>(T) + part[k] / n);
            }
        }
    }
}

// Statistics pooling, a CPU custom op: dst[:, b] = [mean over t of x[:, t, b]; unbiased std] (torch's
// x.mean(-1), x.std(-1, unbiased=True)). x [C, T, B], dst [2C, B].
void stats_pool(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2];
    const int64_t per = (C + nth - 1) / nth, c0 = per * ith, c1 = std::min<int64_t>(C, c0 + per);
    if (c0 >= c1) return;
    std::vector<double> mean(static_cast<size_t>(c1 - c0)), sq(mean.size());
    for (int64_t b = 0; b < B; ++b) {
        std::fill(mean.begin(), mean.end(), 0.0);
        std::fill(sq.begin(), sq.end(), 0.0);
        auto row = [&](int64_t t) {
            return reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1] + b * x->nb[2]);
        };
        for (int64_t t = 0; t < T; ++t) {
            const float * r = row(t);
            for (int64_t c = c0; c < c1; ++c) mean[static_cast<size_t>(c - c0)] += r[c];
        }
        for (double & m : mean) m /= static_cast<double>(T);
        for (int64_t t = 0; t < T; ++t) {
            const float * r = row(t);
            for (int64_t c = c0; c < c1; ++c) {
                const double d = r[c] - mean[static_cast<size_t>(c - c0)];
                sq[static_cast<size_t>(c - c0)] += d * d;
            }
        }
        float * out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + b * dst->nb[1]);
        const double dof = static_cast<double>(T > 1 ? T - 1 : 1);
        for (int64_t c = c0; c < c1; ++c) {
            const size_t k = static_cast<size_t>(c - c0);
            out[c] = static_cast<float>(mean[k]);
            out[C + c] = static_cast<float>(std::sqrt(sq[k] / dof));
        }
    }
}

// One CAM dense layer: x [C_i, T*B] (a view of the block's buffer) -> its new channels [growth, T*B].
ggml_tensor * dense_layer(const GraphCtx & g, const SpeakerHParams & hp, const SpkDenseLayer & l, ggml_tensor * x,
                          int64_t T, int64_t B, ggml_tensor * seg_rows, const std::string & name) {
    ggml_context * ctx = g.ctx;
    ggml_tensor * h = affine_relu(ctx, x, l.bn_scale, l.bn_shift);  // the batch norm before the ReLU
    h = affine_relu(ctx, mul_mat(ctx, l.linear1.w, h), nullptr, l.linear1.b);  // [bn, T*B]
    const int64_t bn = h->ne[0], growth = l.local->ne[2];  // local: ggml [bn, k, growth]
    ggml_tensor * h3 = ggml_reshape_3d(ctx, h, bn, T, B);

    // Local conv (dilated, zero padded): [growth, T, 1, B]
    ggml_tensor * y = conv(ctx, ggml_reshape_4d(ctx, h, bn, T, 1, B), SpkConv{l.local, nullptr},
                           static_cast<int>(l.local->ne[1]), 1, 1, 1, static_cast<int>(l.dilation));
    y = ggml_reshape_3d(ctx, y, growth, T, B);

    // Mask from the context (one column per segment of each window), expanded to the frames.
    const int64_t S = (T + hp.seg_len - 1) / hp.seg_len;
    ggml_tensor * args[1] = {h3};
    ggml_tensor * context = ggml_custom_4d(ctx, GGML_TYPE_F32, bn, S, B, 1, args, 1, cam_context, GGML_N_TASKS_MAX,
                                           const_cast<int64_t *>(&hp.seg_len));
    ggml_tensor * m = mul_mat(ctx, l.ctx1.w, ggml_reshape_2d(ctx, context, bn, S * B));
    m = affine_relu(ctx, m, nullptr, l.ctx1.b);
    m = ggml_sigmoid(ctx, affine(ctx, m, l.ctx2));  // [growth, S*B]
    if (seg_rows) {
        y = ggml_mul(ctx, ggml_reshape_2d(ctx, y, growth, T * B), ggml_get_rows(ctx, m, seg_rows));
    } else {
        y = ggml_reshape_2d(ctx, ggml_mul(ctx, y, ggml_reshape_3d(ctx, m, growth, 1, B)), growth, T * B);
    }
    g.name(y, name + ".out");
    return y;
}

}  // namespace

ggml_tensor * build_campplus(const GraphCtx & g, const SpeakerHParams & hp, const SpeakerWeights & w,
                             ggml_tensor * feats, ggml_tensor * seg_rows) {
    ggml_context * ctx = g.ctx;
    const int64_t B = feats->ne[3];  // feats [1, T, F, B]
    // FCM head on [C, T, F, B]
    ggml_tensor * x = conv2d(ctx, feats, w.stem, 1, true);
    for (size_t k = 0; k < w.fcm.size(); ++k) {
        const SpkFcmBlock & blk = w.fcm[k];
        ggml_tensor * h = conv2d(ctx, x, blk.conv1, blk.stride, true);
        h = conv2d(ctx, h, blk.conv2, 1);
        ggml_tensor * sc = blk.shortcut.w ? conv2d(ctx, x, blk.shortcut, blk.stride) : x;
        x = ggml_relu(ctx, ggml_add(ctx, h, sc));
        g.name(x, "spk.fcm.blk." + std::to_string(k) + ".out");
    }
    x = conv2d(ctx, x, w.fcm_out, static_cast<int>(hp.fcm_stride), true);  // [C, T, F', B]
    g.name(x, "spk.fcm.out");
    const int64_t T = x->ne[1];
    // (B, C, F', T) -> (B, C*F', T): per frame the C*F' values, here ordered c + C*f (the TDNN weight's input
    // axis is stored in that order)
    x = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3));  // [C, F', T, B]
    x = ggml_reshape_4d(ctx, x, x->ne[0] * x->ne[1], T, 1, B);
    x = conv(ctx, x, w.tdnn, static_cast<int>(hp.tdnn_k), 1, static_cast<int>(hp.tdnn_stride), 1, 1, true);
    x = ggml_reshape_2d(ctx, x, x->ne[0], x->ne[1] * x->ne[3]);  // [tdnn_ch, T'*B]; the weight is [C, F', k, out]
    g.name(x, "spk.tdnn.out");
    const int64_t Tn = hp.frames_after_tdnn(T);
    for (size_t b = 0; b < w.blocks.size(); ++b) {
        // The block's output buffer [C_out, T'*B]: the input's channels, then each layer's new ones,
        // written in place (ggml_set), each layer reading the channels written so far.
        const int64_t c_out = hp.block_out(b);
        int64_t c = x->ne[0];
        ggml_tensor * cur = ggml_pad_ext(ctx, x, 0, static_cast<int>(c_out - c), 0, 0, 0, 0, 0, 0);
        for (size_t i = 0; i < w.blocks[b].size(); ++i) {
            ggml_tensor * in = ggml_view_2d(ctx, cur, c, cur->ne[1], cur->nb[1], 0);
            const std::string name = "spk.blk." + std::to_string(b) + "." + std::to_string(i);
            ggml_tensor * y = dense_layer(g, hp, w.blocks[b][i], in, Tn, B, seg_rows, name);
            cur = ggml_set_2d_inplace(ctx, cur, y, cur->nb[1], static_cast<size_t>(c) * sizeof(float));
            c += y->ne[0];
        }
        const SpkTransit & tr = w.transit[b];
        x = mul_mat(ctx, tr.linear.w, affine_relu(ctx, cur, tr.bn_scale, tr.bn_shift));
        if (b + 1 == w.blocks.size()) {
            // out_nonlinear: BN (folded into the last transit's weight and bias) and ReLU
            x = tr.linear.b ? affine_relu(ctx, x, nullptr, tr.linear.b) : ggml_relu(ctx, x);
        } else if (tr.linear.b) {
            x = ggml_add(ctx, x, tr.linear.b);
        }
        g.name(x, "spk.transit." + std::to_string(b) + ".out");
    }
    ggml_tensor * args[1] = {ggml_reshape_3d(ctx, x, x->ne[0], Tn, B)};
    ggml_tensor * stats = ggml_custom_4d(ctx, GGML_TYPE_F32, 2 * x->ne[0], B, 1, 1, args, 1, stats_pool,
                                         GGML_N_TASKS_MAX, nullptr);
    g.name(stats, "spk.stats");
    ggml_tensor * emb = affine(ctx, stats, w.dense);
    g.name(emb, "spk.embedding");
    return emb;
}

}  // namespace fun_asr
