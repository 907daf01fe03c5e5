// FSMN-VAD network graph (docs/model.md, FSMN-VAD): CMVN, affine 400->140, affine 140->250 + ReLU, n x [linear
// 250->128, causal FSMN memory of lorder taps over the cache + new frames, affine 128->250 + ReLU],
// affine 250->140, affine 140->248, softmax.
#include "graph/fsmn_vad.h"

#include <algorithm>

namespace fun_asr {

namespace {

ggml_tensor * affine(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b) {
    x = ggml_mul_mat(ctx, w, x);
    return b ? ggml_add(ctx, x, b) : x;
}

// FSMN memory, a CPU custom op: dst[:, t] = hist[:, t + L-1] + sum_j taps[j] * hist[:, t + j], with
// hist [P, L-1+T] (the cache, then the new frames) and taps [P, L]. Channels are contiguous, so the
// inner loop vectorizes; ggml_ssm_conv runs the same sum as a scalar loop over taps (~10x slower).
void fsmn_memory(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * hist = dst->src[0];
    const ggml_tensor * taps = dst->src[1];
    const int64_t P = dst->ne[0], T = dst->ne[1], L = taps->ne[1];
    const size_t hs = hist->nb[1] / sizeof(float), ts = taps->nb[1] / sizeof(float), ds = dst->nb[1] / sizeof(float);
    const float * h = static_cast<const float *>(hist->data);
    const float * w = static_cast<const float *>(taps->data);
    float * out = static_cast<float *>(dst->data);
    const int64_t per = (T + nth - 1) / nth, t0 = per * ith, t1 = std::min<int64_t>(T, t0 + per);
    for (int64_t t = t0; t < t1; ++t) {
        float * o = out + t * ds;
        const float * z = h + (t + L - 1) * hs;
        for (int64_t c = 0; c < P; ++c) o[c] = z[c];
        for (int64_t j = 0; j < L; ++j) {
            const float * hj = h + (t + j) * hs;
            const float * wj = w + j * ts;
            for (int64_t c = 0; c < P; ++c) o[c] += wj[c] * hj[c];
        }
    }
}

}  // namespace

ggml_tensor * build_fsmn_vad(ggml_context * ctx, const VadHParams & hp, const VadWeights & w, ggml_tensor * feats,
                             const std::vector<ggml_tensor *> & caches, std::vector<ggml_tensor *> & new_caches) {
    const int64_t T = feats->ne[1], L = hp.lorder, P = hp.proj_dim;
    ggml_tensor * x = ggml_mul(ctx, ggml_add(ctx, feats, w.shift), w.scale);
    x = affine(ctx, x, w.in1_w, w.in1_b);
    x = ggml_relu(ctx, affine(ctx, x, w.in2_w, w.in2_b));
    new_caches.clear();
    for (size_t i = 0; i < w.layers.size(); ++i) {
        const VadLayer & l = w.layers[i];
        ggml_tensor * z = ggml_mul_mat(ctx, l.linear, x);                       // [P, T]
        ggml_tensor * hist = ggml_concat(ctx, caches[i], z, 1);                 // [P, L-1+T]
        ggml_tensor * args[2] = {hist, l.taps};
        ggml_tensor * m = ggml_custom_4d(ctx, GGML_TYPE_F32, P, T, 1, 1, args, 2, fsmn_memory, GGML_N_TASKS_MAX,
                                         nullptr);
        new_caches.push_back(ggml_cont(ctx, ggml_view_2d(ctx, hist, P, L - 1, hist->nb[1], hist->nb[1] * T)));
        x = ggml_relu(ctx, affine(ctx, m, l.affine_w, l.affine_b));
    }
    x = affine(ctx, x, w.out1_w, w.out1_b);
    x = affine(ctx, x, w.out2_w, w.out2_b);
    return ggml_soft_max(ctx, x);
}

}  // namespace fun_asr
