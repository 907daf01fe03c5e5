#include "kernels/fsmn_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/matvec.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FUN_ASR_FSMN_X86 1
#else
#define FUN_ASR_FSMN_X86 0
#endif

namespace fun_asr {

namespace {

bool enabled() {
    static const bool on = [] {
        const char * env = std::getenv("FUN_ASR_FSMN");
        return !(env && std::strcmp(env, "ggml") == 0);
    }();
    return on;
}

bool plain_f32(const ggml_tensor * t) {
    return t && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[2] == 1 && t->ne[3] == 1;
}

// One output row t: o[c] = att[c] + (conv[c] + v[c]), conv[c] = an FMA chain over the taps that fall
// inside the sequence, from 0.0f in tap order. Every element's steps are these, whatever the ISA, the
// thread split or the channel blocking, so all builds give the same bits.
struct Row {
    const float * v;      // [T, d]
    const float * w;      // taps major [K, d]
    int64_t d, T, K, left;
};

void row_scalar(const Row & r, int64_t t, int64_t c0, const float * att, float * out) {
    for (int64_t c = c0; c < r.d; ++c) {
        float s = 0.0f;
        for (int64_t k = 0; k < r.K; ++k) {
            const int64_t src = t + k - r.left;
            if (src >= 0 && src < r.T) s = std::fma(r.v[src * r.d + c], r.w[k * r.d + c], s);
        }
        out[c] = att[c] + (s + r.v[t * r.d + c]);
    }
}

#if FUN_ASR_FSMN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
int64_t row_avx2(const Row & r, int64_t t, const float * att, float * out) {
    const int64_t k0 = std::max<int64_t>(0, r.left - t), k1 = std::min<int64_t>(r.K, r.T + r.left - t);
    int64_t c = 0;
    for (; c + 8 <= r.d; c += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int64_t k = k0; k < k1; ++k) {
            s = _mm256_fmadd_ps(_mm256_loadu_ps(r.v + (t + k - r.left) * r.d + c), _mm256_loadu_ps(r.w + k * r.d + c), s);
        }
        const __m256 m = _mm256_add_ps(s, _mm256_loadu_ps(r.v + t * r.d + c));
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_loadu_ps(att + c), m));
    }
    return c;
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

bool has_avx2_fma() {
#if FUN_ASR_FSMN_X86 && (defined(__GNUC__) || defined(__clang__))
    static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return ok;
#else
    return false;
#endif
}

void run(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * att = dst->src[0];
    const ggml_tensor * v = dst->src[1];
    const ggml_tensor * kernel = dst->src[2];
    const int64_t d = v->ne[0], T = v->ne[1], K = kernel->ne[0];
    const float * kd = static_cast<const float *>(kernel->data);  // [K, 1, d]: tap k of channel c at c*K + k
    std::vector<float> w(static_cast<size_t>(K * d));
    for (int64_t c = 0; c < d; ++c) {
        for (int64_t k = 0; k < K; ++k) w[static_cast<size_t>(k * d + c)] = kd[c * K + k];
    }
    const Row r{static_cast<const float *>(v->data), w.data(), d, T, K, (K - 1) / 2};
    const float * ad = static_cast<const float *>(att->data);
    float * od = static_cast<float *>(dst->data);
    const bool vec = has_avx2_fma();
    const int64_t per = (T + nth - 1) / nth, t0 = per * ith, t1 = std::min(T, t0 + per);
    for (int64_t t = t0; t < t1; ++t) {
        int64_t c0 = 0;
#if FUN_ASR_FSMN_X86
        if (vec) c0 = row_avx2(r, t, ad + t * d, od + t * d);
#endif
        row_scalar(r, t, c0, ad + t * d, od + t * d);
    }
    (void)vec;
}

}  // namespace

bool fsmn_memory_supported(const ggml_tensor * att, const ggml_tensor * v, const ggml_tensor * kernel) {
    if (!enabled() || !plain_f32(att) || !plain_f32(v) || !kernel || kernel->type != GGML_TYPE_F32) return false;
    if (!ggml_is_contiguous(kernel) || kernel->ne[1] != 1 || kernel->ne[2] != v->ne[0] || kernel->ne[3] != 1) return false;
    if (!ggml_are_same_shape(att, v) || kernel->ne[0] < 1) return false;
    return weight_in_cpu_memory(kernel);
}

ggml_tensor * fsmn_memory_add(ggml_context * ctx, ggml_tensor * att, ggml_tensor * v, ggml_tensor * kernel) {
    ggml_tensor * args[3] = {att, v, kernel};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[0], v->ne[1], 1, 1, args, 3, run, GGML_N_TASKS_MAX, nullptr);
}

}  // namespace fun_asr
