#include "kernels/fsmn_memory.h"

#include "kernels/dispatch.h"
#include "base/switches.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/fused_add.h"
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
    static const bool on = !switches::is("FUN_ASR_FSMN", "ggml");
    return on;
}

// One row t of the memory, m[c] = conv[c] + v[c], conv[c] = an FMA chain over the taps that fall inside
// the sequence, from 0.0f in tap order. Every element's steps are these, whatever the ISA, the thread
// split or the channel blocking, so all builds give the same bits.
struct Row {
    const float * v;      // [T, d]
    const float * w;      // taps major [K, d]
    int64_t d, T, K, left;
};

void memory_scalar(const Row & r, int64_t t, int64_t c0, float * m) {
    for (int64_t c = c0; c < r.d; ++c) {
        float s = 0.0f;
        for (int64_t k = 0; k < r.K; ++k) {
            const int64_t src = t + k - r.left;
            if (src >= 0 && src < r.T) s = std::fma(r.v[src * r.d + c], r.w[k * r.d + c], s);
        }
        m[c] = s + r.v[t * r.d + c];
    }
}

#if FUN_ASR_FSMN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
int64_t memory_avx2(const Row & r, int64_t t, float * m) {
    const int64_t k0 = std::max<int64_t>(0, r.left - t), k1 = std::min<int64_t>(r.K, r.T + r.left - t);
    int64_t c = 0;
    for (; c + 8 <= r.d; c += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int64_t k = k0; k < k1; ++k) {
            s = _mm256_fmadd_ps(_mm256_loadu_ps(r.v + (t + k - r.left) * r.d + c), _mm256_loadu_ps(r.w + k * r.d + c), s);
        }
        _mm256_storeu_ps(m + c, _mm256_add_ps(s, _mm256_loadu_ps(r.v + t * r.d + c)));
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
    static const bool ok = cpu_features().avx2 && cpu_features().fma;
    return ok;
#else
    return false;
#endif
}

// Which optional inputs follow src[0..2] (att, v, kernel): att's bias, then the residual.
struct Extras {
    bool bias, residual;
};
const Extras kExtras[4] = {{false, false}, {true, false}, {false, true}, {true, true}};

void run(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const Extras & ex = *static_cast<const Extras *>(userdata);
    const ggml_tensor * att = dst->src[0];
    const ggml_tensor * v = dst->src[1];
    const ggml_tensor * kernel = dst->src[2];
    const float * bias = ex.bias ? static_cast<const float *>(dst->src[3]->data) : nullptr;
    const float * res = ex.residual ? static_cast<const float *>(dst->src[ex.bias ? 4 : 3]->data) : nullptr;
    const int64_t d = v->ne[0], T = v->ne[1], K = kernel->ne[0];
    const float * kd = static_cast<const float *>(kernel->data);  // [K, 1, d]: tap k of channel c at c*K + k
    std::vector<float> w(static_cast<size_t>(K * d)), m(static_cast<size_t>(d));
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
        if (vec) c0 = memory_avx2(r, t, m.data());
#endif
        memory_scalar(r, t, c0, m.data());
        const float * a = ad + t * d;
        float * o = od + t * d;
        const float * x = res ? res + t * d : nullptr;
        for (int64_t c = 0; c < d; ++c) {  // the plain graph's steps: (att + b) + m, then x + that
            float e = bias ? a[c] + bias[c] : a[c];
            e += m[c];
            o[c] = x ? x[c] + e : e;
        }
    }
    (void)vec;
}

}  // namespace

bool fsmn_memory_supported(const ggml_tensor * att, const ggml_tensor * v, const ggml_tensor * kernel,
                           const ggml_tensor * bias, const ggml_tensor * residual) {
    if (!enabled() || !plain_f32_matrix(att) || !plain_f32_matrix(v) || !kernel || kernel->type != GGML_TYPE_F32) return false;
    if (!ggml_is_contiguous(kernel) || kernel->ne[1] != 1 || kernel->ne[2] != v->ne[0] || kernel->ne[3] != 1) return false;
    if (!ggml_are_same_shape(att, v) || kernel->ne[0] < 1 || !weight_in_cpu_memory(kernel)) return false;
    if (bias == nullptr && residual == nullptr) return true;
    // the bias and the residual on fused_add's terms (FUN_ASR_FUSE=0: as their own nodes)
    if (bias) return fused_add_supported(att, bias, residual);
    return fusion_enabled() && plain_f32_matrix(residual) && ggml_are_same_shape(residual, att);
}

ggml_tensor * fsmn_memory_add(ggml_context * ctx, ggml_tensor * att, ggml_tensor * v, ggml_tensor * kernel,
                              ggml_tensor * bias, ggml_tensor * residual) {
    ggml_tensor * args[5] = {att, v, kernel, nullptr, nullptr};
    int n = 3;
    if (bias) args[n++] = bias;
    if (residual) args[n++] = residual;
    const Extras * ex = &kExtras[(bias ? 1 : 0) + (residual ? 2 : 0)];
    return ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[0], v->ne[1], 1, 1, args, n, run, GGML_N_TASKS_MAX,
                          const_cast<Extras *>(ex));
}

}  // namespace fun_asr
