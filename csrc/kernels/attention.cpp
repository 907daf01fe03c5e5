#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml-backend.h"

#include "kernels/op_params.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FUN_ASR_ATTN_X86 1
#else
#define FUN_ASR_ATTN_X86 0
#endif

namespace fun_asr {
namespace {

struct Params {
    int64_t n_heads;
    float scale;
    bool operator<(const Params & o) const { return n_heads != o.n_heads ? n_heads < o.n_heads : scale < o.scale; }
};

#if FUN_ASR_ATTN_X86
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

// e^x for x <= 0 (a score minus its row's maximum): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its
// degree-6 Taylor polynomial (error < 2e-7 relative), times 2^n through the exponent bits. Below
// -87 the result is taken as e^-87 (~1.6e-38: nothing next to the maximum's 1).
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // ln 2, high bits
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);     // ln 2, the rest
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The four sums of a[0..3] in one vector (lanes 0-3).
static inline __m128 hsum4(const __m256 a[4]) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// R (1 or 2) query rows q[r] (hd floats each) of one head against every key (row j at k + j * ld):
// s[r][j] = q_r . k_j, four keys at a time.
template <int R>
static void scores(const float * const q[R], const float * k, int64_t ld, int64_t T, int64_t hd, float * const s[R]) {
    int64_t j = 0;
    for (; j + 4 <= T; j += 4) {
        __m256 acc[R][4];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_setzero_ps();
        for (int64_t c = 0; c < hd; c += 8) {
            __m256 qv[R];
            for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + c);
            for (int u = 0; u < 4; ++u) {
                const __m256 kv = _mm256_loadu_ps(k + (j + u) * ld + c);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm256_fmadd_ps(qv[r], kv, acc[r][u]);
            }
        }
        for (int r = 0; r < R; ++r) _mm_storeu_ps(s[r] + j, hsum4(acc[r]));
    }
    for (; j < T; ++j) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t c = 0; c < hd; c += 8) {
            const __m256 kv = _mm256_loadu_ps(k + j * ld + c);
            for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + c), kv, acc[r]);
        }
        for (int r = 0; r < R; ++r) s[r][j] = hsum(acc[r]);
    }
}

// s <- exp(scale * s - max) in place; returns 1 / sum.
static float softmax_row(float * s, int64_t T, float scale) {
    float m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) m = std::max(m, s[j] * scale);
    const __m256 sc = _mm256_set1_ps(scale), mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= T; j += 8) {
        const __m256 e = exp_nonpositive(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), sc, mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < T) {  // the tail through the same vector code, padded with -inf scores (e = 0)
        alignas(32) float t[8];
        for (int u = 0; u < 8; ++u) t[u] = j + u < T ? std::fma(s[j + u], scale, -m) : -INFINITY;  // as fmsub
        const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_load_ps(t)),
                                       _mm256_cmp_ps(_mm256_load_ps(t), _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
        _mm256_store_ps(t, e);
        for (int u = 0; j + u < T; ++u) s[j + u] = t[u];
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum(sum);
}

// o[r][c] = inv[r] * sum_j p[r][j] v_j[c] for R rows, 32 channels at a time.
template <int R>
static void weighted_values(const float * const p[R], const float * inv, const float * v, int64_t ld, int64_t T,
                            int64_t hd, float * const o[R]) {
    for (int64_t c = 0; c < hd; c += 8) {
        const int nv = static_cast<int>(std::min<int64_t>(4, (hd - c) / 8));
        __m256 acc[R][4];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_setzero_ps();
        for (int64_t j = 0; j < T; ++j) {
            __m256 pv[R];
            for (int r = 0; r < R; ++r) pv[r] = _mm256_set1_ps(p[r][j]);
            for (int u = 0; u < nv; ++u) {
                const __m256 vv = _mm256_loadu_ps(v + j * ld + c + 8 * u);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm256_fmadd_ps(pv[r], vv, acc[r][u]);
            }
        }
        for (int r = 0; r < R; ++r) {
            for (int u = 0; u < nv; ++u) _mm256_storeu_ps(o[r] + c + 8 * u, _mm256_mul_ps(acc[r][u], _mm256_set1_ps(inv[r])));
        }
        c += 8 * (nv - 1);
    }
}

// Query rows [i, i + R) of head h.
template <int R>
static void rows(const float * q, const float * k, const float * v, float * o, int64_t d, int64_t T, int64_t hd,
                 int64_t h, int64_t i, float scale, float * scratch) {
    const float * qr[R];
    float * s[R];
    float * orow[R];
    float inv[R];
    for (int r = 0; r < R; ++r) {
        qr[r] = q + (i + r) * d + h * hd;
        s[r] = scratch + r * T;
        orow[r] = o + (i + r) * d + h * hd;
    }
    scores<R>(qr, k + h * hd, d, T, hd, s);
    for (int r = 0; r < R; ++r) inv[r] = softmax_row(s[r], T, scale);
    const float * p[R];
    for (int r = 0; r < R; ++r) p[r] = s[r];
    weighted_values<R>(p, inv, v + h * hd, d, T, hd, orow);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // FUN_ASR_ATTN_X86

void run(ggml_tensor * dst, int ith, int nth, void * userdata) {
#if FUN_ASR_ATTN_X86
    const Params & prm = *static_cast<const Params *>(userdata);
    const ggml_tensor * qt = dst->src[0];
    const int64_t d = qt->ne[0], T = qt->ne[1], hd = d / prm.n_heads;
    const auto * q = static_cast<const float *>(qt->data);
    const auto * k = static_cast<const float *>(dst->src[1]->data);
    const auto * v = static_cast<const float *>(dst->src[2]->data);
    auto * o = static_cast<float *>(dst->data);
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(2 * T));
    // Tasks: (head, pair of query rows), interleaved over the threads.
    const int64_t pairs = (T + 1) / 2, tasks = prm.n_heads * pairs;
    for (int64_t t = ith; t < tasks; t += nth) {
        const int64_t h = t / pairs, i = 2 * (t % pairs);
        if (i + 2 <= T) rows<2>(q, k, v, o, d, T, hd, h, i, prm.scale, scratch.data());
        else rows<1>(q, k, v, o, d, T, hd, h, i, prm.scale, scratch.data());
    }
#else
    (void)dst; (void)ith; (void)nth; (void)userdata;
#endif
}

bool cpu_ok() {
#if FUN_ASR_ATTN_X86
    static const bool ok = [] {
        const char * env = std::getenv("FUN_ASR_ATTN");
        if (env && std::strcmp(env, "ggml") == 0) return false;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return ok;
#else
    return false;
#endif
}

bool plain(const ggml_tensor * t, const ggml_tensor * like) {
    return t && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->ne[0] == like->ne[0] && t->ne[1] == like->ne[1] &&
           (!t->buffer || ggml_backend_buffer_is_host(t->buffer));
}

}  // namespace

bool attention_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v, int64_t n_heads) {
    if (!cpu_ok() || !q || n_heads <= 0 || q->ne[0] % n_heads != 0 || (q->ne[0] / n_heads) % 8 != 0) return false;
    return plain(q, q) && plain(k, q) && plain(v, q) && q->ne[1] >= 1;
}

ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_heads,
                        float scale) {
    ggml_tensor * args[3] = {q, k, v};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], 1, 1, args, 3, run, GGML_N_TASKS_MAX,
                          const_cast<Params *>(intern_op_params(Params{n_heads, scale})));
}

}  // namespace fun_asr
