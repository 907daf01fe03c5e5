#include "kernels/decoder_fused.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "ggml-backend.h"
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include "kernels/fused_add.h"
#include "kernels/matvec.h"
#include "kernels/op_params.h"

namespace fun_asr {

namespace {

struct NormParams {
    int64_t hd;
    float eps;
    bool operator<(const NormParams & o) const { return std::tie(hd, eps) < std::tie(o.hd, o.eps); }
};

// ggml_rms_norm's steps for one row (ggml-cpu ops.cpp): the float squares summed in double, a float mean,
// scale = 1 / sqrtf(mean + eps); then ggml_mul by the weight: (v * scale) * w.
inline void rms_norm_row(const float * v, const float * w, int64_t n, float eps, float * out) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(v[i] * v[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = v[i] * scale * w[i];
}

// The [first, last) share of n items of thread ith of nth.
std::pair<int64_t, int64_t> share(int64_t n, int ith, int nth) {
    const int64_t per = (n + nth - 1) / nth, a = std::min(n, per * ith);
    return {a, std::min(n, a + per)};
}

// src[0] = x, src[1] = w, src[2] = y (optional). dst [n, T, 2].
void run_add_rms_norm(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto & p = *static_cast<const NormParams *>(userdata);
    const ggml_tensor *x = dst->src[0], *y = dst->src[2];
    const auto * w = static_cast<const float *>(dst->src[1]->data);
    const int64_t n = x->ne[0], T = x->ne[1];
    auto * out = static_cast<float *>(dst->data);
    const auto [t0, t1] = share(T, ith, nth);
    for (int64_t t = t0; t < t1; ++t) {
        const auto * xr = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1]);
        float * h = out + t * n;
        float * s = out + (T + t) * n;
        if (y) {
            const auto * yr = reinterpret_cast<const float *>(static_cast<const char *>(y->data) + t * y->nb[1]);
            for (int64_t i = 0; i < n; ++i) s[i] = xr[i] + yr[i];
        } else {
            std::memcpy(s, xr, static_cast<size_t>(n) * sizeof(float));
        }
        rms_norm_row(s, w, n, p.eps, h);
    }
}

// src[0] = q [hd * Hq, T], src[1] = k [hd * Hkv, T], src[2] = qn, src[3] = kn. dst [hd, Hq + Hkv, T].
void run_heads_rms_norm(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto & p = *static_cast<const NormParams *>(userdata);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1];
    const auto * qn = static_cast<const float *>(dst->src[2]->data);
    const auto * kn = static_cast<const float *>(dst->src[3]->data);
    const int64_t hd = p.hd, Hq = q->ne[0] / hd, H = dst->ne[1], T = dst->ne[2];
    const auto [r0, r1] = share(H * T, ith, nth);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / H, h = r % H;
        const bool is_q = h < Hq;
        const ggml_tensor * src = is_q ? q : k;
        const auto * v = reinterpret_cast<const float *>(static_cast<const char *>(src->data) + t * src->nb[1]) +
                         (is_q ? h : h - Hq) * hd;
        auto * o = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[2] + h * dst->nb[1]);
        rms_norm_row(v, is_q ? qn : kn, hd, p.eps, o);
    }
}

// src[0] = k, src[1] = v, src[2] = kc, src[3] = vc, src[4] = rows.
void run_store_kv(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * rows = dst->src[4];
    const int64_t T = dst->src[0]->ne[1], n = dst->src[0]->ne[0];
    const auto [r0, r1] = share(2 * T, ith, nth);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r % T;
        const ggml_tensor * src = dst->src[r / T];
        const ggml_tensor * cache = dst->src[2 + r / T];
        const int64_t row = *reinterpret_cast<const int64_t *>(static_cast<const char *>(rows->data) + t * rows->nb[0]);
        if (row < 0 || row >= cache->ne[1]) continue;  // store_kv's caller gives rows inside the cache
        std::memcpy(static_cast<char *>(cache->data) + row * cache->nb[1],
                    static_cast<const char *>(src->data) + t * src->nb[1], static_cast<size_t>(n) * sizeof(float));
    }
}

// src[0] = logits [V, n]; dst I32 [n]: columns split among threads.
void run_argmax(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * l = dst->src[0];
    const auto [c0, c1] = share(l->ne[1], ith, nth);
    for (int64_t c = c0; c < c1; ++c) {
        const auto * x = reinterpret_cast<const float *>(static_cast<const char *>(l->data) + c * l->nb[1]);
        static_cast<int32_t *>(dst->data)[c] = static_cast<int32_t>(first_argmax(x, l->ne[0]));
    }
}

bool host_f32(const ggml_tensor * t) {
    return t && t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float) && (!t->buffer || ggml_backend_buffer_is_host(t->buffer));
}

bool f32_vector(const ggml_tensor * w, int64_t n) {
    return w && w->type == GGML_TYPE_F32 && ggml_is_contiguous(w) && ggml_nelements(w) == n && weight_in_cpu_memory(w);
}

// Columns of contiguous floats (heads may be apart from each other only through nb[1] / nb[2] of a 2-D view).
bool f32_columns(const ggml_tensor * t) {
    return host_f32(t) && t->ne[2] == 1 && t->ne[3] == 1 && t->nb[1] >= static_cast<size_t>(t->ne[0]) * sizeof(float);
}

}  // namespace

bool add_rms_norm_supported(const ggml_tensor * x, const ggml_tensor * y, const ggml_tensor * w) {
    if (!fusion_enabled() || !plain_f32_matrix(x) || !host_f32(x) || !f32_vector(w, x->ne[0])) return false;
    return !y || (f32_columns(y) && y->ne[0] == x->ne[0] && y->ne[1] == x->ne[1]);
}

ggml_tensor * add_rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * w, float eps) {
    ggml_tensor * args[3] = {x, w, y};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], 2, 1, args, y ? 3 : 2, run_add_rms_norm,
                          GGML_N_TASKS_MAX, const_cast<NormParams *>(intern_op_params(NormParams{x->ne[0], eps})));
}

ggml_tensor * norm_of(ggml_context * ctx, ggml_tensor * fused) {
    return ggml_view_2d(ctx, fused, fused->ne[0], fused->ne[1], fused->nb[1], 0);
}

ggml_tensor * sum_of(ggml_context * ctx, ggml_tensor * fused) {
    return ggml_view_2d(ctx, fused, fused->ne[0], fused->ne[1], fused->nb[1], fused->nb[2]);
}

bool heads_rms_norm_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * qn,
                              const ggml_tensor * kn, int64_t hd) {
    if (!fusion_enabled() || hd <= 0 || !f32_columns(q) || !f32_columns(k) || q->ne[1] != k->ne[1]) return false;
    return q->ne[0] % hd == 0 && k->ne[0] % hd == 0 && f32_vector(qn, hd) && f32_vector(kn, hd);
}

ggml_tensor * heads_rms_norm(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * qn, ggml_tensor * kn,
                             int64_t hd, float eps) {
    ggml_tensor * args[4] = {q, k, qn, kn};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd, (q->ne[0] + k->ne[0]) / hd, q->ne[1], 1, args, 4, run_heads_rms_norm,
                          GGML_N_TASKS_MAX, const_cast<NormParams *>(intern_op_params(NormParams{hd, eps})));
}

bool store_kv_supported(const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * kc, const ggml_tensor * vc,
                        const ggml_tensor * rows) {
    if (!fusion_enabled() || !f32_columns(k) || !f32_columns(v) || !f32_columns(kc) || !f32_columns(vc)) return false;
    if (k->ne[0] != v->ne[0] || k->ne[1] != v->ne[1] || kc->ne[0] != k->ne[0] || vc->ne[0] != k->ne[0]) return false;
    return rows && rows->type == GGML_TYPE_I64 && rows->ne[0] == k->ne[1] && ggml_nelements(rows) == k->ne[1] &&
           (!rows->buffer || ggml_backend_buffer_is_host(rows->buffer));
}

ggml_tensor * store_kv(ggml_context * ctx, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kc, ggml_tensor * vc,
                       ggml_tensor * rows) {
    ggml_tensor * args[5] = {k, v, kc, vc, rows};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, 1, 1, 1, 1, args, 5, run_store_kv, GGML_N_TASKS_MAX, nullptr);
}

int64_t first_argmax(const float * x, int64_t n) {
    // std::max_element keeps its first element while nothing compares greater: a NaN there stays; later
    // NaNs never compare greater. Otherwise its answer is the first element equal to the largest non-NaN
    // value (equal compares -0 and +0 alike, as the sequential scan keeps the first of such ties).
    if (n <= 0 || std::isnan(x[0])) return 0;
    float m = x[0];
    int64_t i = 0;
#if defined(__SSE2__)
    __m128 vm = _mm_set1_ps(m);
    for (; i + 4 <= n; i += 4) vm = _mm_max_ps(_mm_loadu_ps(x + i), vm);  // a NaN lane keeps vm (2nd operand)
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, vm);
    for (float v : lanes) m = v > m ? v : m;
#endif
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    i = 0;
#if defined(__SSE2__)
    const __m128 target = _mm_set1_ps(m);
    for (; i + 4 <= n; i += 4) {
        const int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), target));
        if (mask != 0) return i + __builtin_ctz(static_cast<unsigned>(mask));
    }
#endif
    for (; i < n; ++i) {
        if (x[i] == m) return i;
    }
    return 0;  // not reached: m is one of the elements
}

bool argmax_columns_supported(const ggml_tensor * logits) {
    return fusion_enabled() && host_f32(logits) && logits->ne[2] == 1 && logits->ne[3] == 1 && logits->ne[0] > 0;
}

ggml_tensor * argmax_columns(ggml_context * ctx, ggml_tensor * logits) {
    ggml_tensor * args[1] = {logits};
    return ggml_custom_4d(ctx, GGML_TYPE_I32, logits->ne[1], 1, 1, 1, args, 1, run_argmax, GGML_N_TASKS_MAX, nullptr);
}

const char * decoder_fused_op(const ggml_tensor * t) {
    const ggml_custom_op_t fun = custom_op_function(t);
    if (!fun) return nullptr;
    if (fun == run_add_rms_norm) return "ADD_RMS_NORM";
    if (fun == run_heads_rms_norm) return "HEADS_RMS_NORM";
    if (fun == run_store_kv) return "STORE_KV";
    return fun == run_argmax ? "ARGMAX" : nullptr;
}

}  // namespace fun_asr
