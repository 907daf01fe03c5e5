#include "kernels/fused_add.h"

#include "base/cpu_backend.h"
#include "kernels/dispatch.h"
#include "base/switches.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/matvec.h"
#include "kernels/op_params.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FUN_ASR_NORM_X86 1
#else
#define FUN_ASR_NORM_X86 0
#endif

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

// LayerNorm as ggml_norm computes it, then the scale and shift of kScaleShift: per row, the mean is
// ggml_vec_sum_f32's (a double sum in element order from 0.0, rounded to float) divided by n, the variance
// ggml_vec_cvar_f32's (called here, so its bits whatever the ISA it was built for), y = (x - mean) *
// (1 / sqrt(variance + eps)) (ggml_vec_scale_f32), then y * w + b. ggml's double sum is one dependent add
// per element (~4 cycles each: ~2,000 cycles for a 512-wide row); here 8 rows go at once, a row per double lane,
// each lane's adds in its row's element order: the same sums.
void row_sums_scalar(const float * x, int64_t stride, int64_t rows, int64_t n, float * out) {
    for (int64_t r = 0; r < rows; ++r) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[r * stride + i]);
        out[r] = static_cast<float>(sum);
    }
}

#if FUN_ASR_NORM_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
// rows 0-3 and 4-7 at x, stride floats apart: two chains of four double lanes
void row_sums8_avx2(const float * x, int64_t stride, int64_t n, float * out) {
    __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 c[2][4];
        for (int h = 0; h < 2; ++h) {
            for (int r = 0; r < 4; ++r) c[h][r] = _mm_loadu_ps(x + (4 * h + r) * stride + i);
            _MM_TRANSPOSE4_PS(c[h][0], c[h][1], c[h][2], c[h][3]);  // c[h][j]: element i + j of the four rows
        }
        for (int j = 0; j < 4; ++j) {
            for (int h = 0; h < 2; ++h) acc[h] = _mm256_add_pd(acc[h], _mm256_cvtps_pd(c[h][j]));
        }
    }
    double s[8];
    _mm256_storeu_pd(s, acc[0]);
    _mm256_storeu_pd(s + 4, acc[1]);
    for (int r = 0; r < 8; ++r) {
        for (int64_t k = i; k < n; ++k) s[r] += static_cast<double>(x[r * stride + k]);
        out[r] = static_cast<float>(s[r]);
    }
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool has_avx2() {
    static const bool on = cpu_features().avx2;
    return on;
}
#endif

// src[0] = x [n, T], src[1] = w, src[2] = b; userdata: eps
void layer_norm_run(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    const float * w = static_cast<const float *>(dst->src[1]->data);
    const float * b = static_cast<const float *>(dst->src[2]->data);
    const float eps = *static_cast<const float *>(userdata);
    const int64_t n = x->ne[0], T = x->ne[1];
    const float * xd = static_cast<const float *>(x->data);
    float * od = static_cast<float *>(dst->data);
    const int64_t per = (T + nth - 1) / nth, t0 = std::min(T, per * ith), t1 = std::min(T, t0 + per);
    for (int64_t t = t0; t < t1; t += 8) {
        const int64_t rows = std::min<int64_t>(8, t1 - t);
        float sums[8];
#if FUN_ASR_NORM_X86
        if (rows == 8 && has_avx2()) {
            row_sums8_avx2(xd + t * n, n, n, sums);
        } else
#endif
        {
            row_sums_scalar(xd + t * n, n, rows, n, sums);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const float * xr = xd + (t + r) * n;
            float * o = od + (t + r) * n;
            const float mean = sums[r] / static_cast<float>(n);
            const float variance = static_cast<float>(cpu_backend::api().vec_cvar_f32(static_cast<int>(n), o, xr, mean));
            const float scale = 1.0f / std::sqrt(variance + eps);
            for (int64_t i = 0; i < n; ++i) {
                const float y = o[i] * scale;  // ggml_vec_scale_f32
                const float m = y * w[i];      // then kScaleShift's steps
                o[i] = m + b[i];
            }
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
    static const bool on = !switches::is("FUN_ASR_FUSE", "0");
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

bool layer_norm_fusion_available() {
#if defined(__APPLE__)
    return false;
#else
    return fusion_enabled();
#endif
}

ggml_tensor * layer_norm_scale_shift(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, float eps) {
    ggml_tensor * args[3] = {x, w, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], 1, 1, args, 3, layer_norm_run, GGML_N_TASKS_MAX,
                          const_cast<float *>(intern_op_params(eps)));
}

}  // namespace fun_asr
