#include "kernels/fused_add.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/matvec.h"

namespace fun_asr {

namespace {

enum class Op { kScaleShift, kBiasRelu, kResidualBias };

// One kernel for the three ops, rows of y split among threads. src[0] = y, then
// kScaleShift: src[1] = w, src[2] = b; kBiasRelu: src[1] = b; kResidualBias: src[1] = b, src[2] = x.
template <Op kOp>
void run(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * y = dst->src[0];
    const float * s1 = static_cast<const float *>(dst->src[1]->data);
    const float * s2 = kOp == Op::kBiasRelu ? nullptr : static_cast<const float *>(dst->src[2]->data);
    const int64_t n = y->ne[0], T = y->ne[1];
    const float * yd = static_cast<const float *>(y->data);
    float * od = static_cast<float *>(dst->data);
    const int64_t per = (T + nth - 1) / nth, t0 = per * ith, t1 = std::min(T, t0 + per);
    for (int64_t t = t0; t < t1; ++t) {
        const float * yr = yd + t * n;
        float * o = od + t * n;
        if constexpr (kOp == Op::kScaleShift) {
            for (int64_t i = 0; i < n; ++i) {
                const float m = yr[i] * s1[i];  // rounded (no contraction in this file)
                o[i] = m + s2[i];
            }
        } else if constexpr (kOp == Op::kBiasRelu) {
            for (int64_t i = 0; i < n; ++i) {
                const float v = yr[i] + s1[i];
                o[i] = v > 0.0f ? v : 0.0f;  // ggml_vec_relu_f32
            }
        } else {
            const float * xr = s2 + t * n;
            for (int64_t i = 0; i < n; ++i) o[i] = xr[i] + (yr[i] + s1[i]);
        }
    }
}

template <Op kOp>
ggml_tensor * custom(ggml_context * ctx, ggml_tensor * y, ggml_tensor * a, ggml_tensor * b) {
    ggml_tensor * args[3] = {y, a, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, y->ne[0], y->ne[1], 1, 1, args, b ? 3 : 2, run<kOp>, GGML_N_TASKS_MAX,
                          nullptr);
}

}  // namespace

bool fusion_enabled() {
    static const bool on = [] {
        const char * env = std::getenv("FUN_ASR_FUSE");
        return !(env && std::strcmp(env, "0") == 0);
    }();
    return on;
}

bool plain_f32_matrix(const ggml_tensor * t) {
    return t && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[2] == 1 && t->ne[3] == 1;
}

bool fused_add_supported(const ggml_tensor * y, const ggml_tensor * b, const ggml_tensor * x) {
    if (!fusion_enabled() || !plain_f32_matrix(y) || !b || b->type != GGML_TYPE_F32 || !ggml_is_contiguous(b)) return false;
    if (ggml_nelements(b) != y->ne[0] || !weight_in_cpu_memory(b)) return false;
    return x == nullptr || (plain_f32_matrix(x) && ggml_are_same_shape(x, y));
}

ggml_tensor * scale_shift(ggml_context * ctx, ggml_tensor * y, ggml_tensor * w, ggml_tensor * b) {
    return custom<Op::kScaleShift>(ctx, y, w, b);
}

ggml_tensor * bias_relu(ggml_context * ctx, ggml_tensor * y, ggml_tensor * b) {
    return custom<Op::kBiasRelu>(ctx, y, b, nullptr);
}

ggml_tensor * residual_bias_add(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * b) {
    return custom<Op::kResidualBias>(ctx, y, b, x);
}

}  // namespace fun_asr
