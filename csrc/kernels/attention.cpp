#include "kernels/attention.h"

#include "kernels/dispatch.h"
#include "base/switches.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "ggml-backend.h"

#include "kernels/decoder_fused.h"
#include "kernels/fused_add.h"
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

struct CachedParams {
    int64_t n_heads, n_kv_heads;
    float scale;
    // cached_attention_heads: the norms' epsilon, the RoPE's base and forms (else 0)
    float eps = 0.0f, base = 0.0f;
    int first = 0, second = 0;
    bool operator<(const CachedParams & o) const {
        return std::tie(n_heads, n_kv_heads, scale, eps, base, first, second) <
               std::tie(o.n_heads, o.n_kv_heads, o.scale, o.eps, o.base, o.first, o.second);
    }
};

constexpr uint16_t kF16MinusInf = 0xFC00;

// A mask entry as ggml reads it (0 and -inf, the decoder's only values, without a conversion call).
inline float mask_value(ggml_fp16_t h) {
    return h == 0 ? 0.0f : h == kF16MinusInf ? -INFINITY : ggml_fp16_to_fp32(h);
}

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

// R (1 to 3) query rows q[r] (hd floats each) of one head against every key (row j at k + j * ld):
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
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(-INFINITY);  // the row's maximum (exact in any order)
    int64_t j0 = 0;
    for (; j0 + 8 <= T; j0 += 8) mx = _mm256_max_ps(mx, _mm256_mul_ps(_mm256_loadu_ps(s + j0), sc));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float m = -INFINITY;
    for (float l : lanes) m = std::max(m, l);
    for (; j0 < T; ++j0) m = std::max(m, s[j0] * scale);
    const __m256 mv = _mm256_set1_ps(m);
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

// s <- exp(scale * s + mask - max) in place, 0 where the mask is -inf (the key is skipped); returns 1 / sum,
// or 0 when every key is masked (the row's output is then zeros, as in ggml's flash attention).
static float masked_softmax_row(float * s, const ggml_fp16_t * mrow, int64_t T, float scale) {
    float m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
        s[j] = s[j] * scale + mask_value(mrow[j]);
        m = std::max(m, s[j]);
    }
    if (m == -INFINITY) return 0.0f;
    const __m256 mv = _mm256_set1_ps(m), minf = _mm256_set1_ps(-INFINITY);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= T; j += 8) {
        const __m256 t = _mm256_loadu_ps(s + j);
        const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(t, mv)), _mm256_cmp_ps(t, minf, _CMP_NEQ_OQ));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < T) {  // the tail through the same vector code, padded with -inf (e = 0)
        alignas(32) float t[8];
        for (int u = 0; u < 8; ++u) t[u] = j + u < T ? s[j + u] : -INFINITY;
        const __m256 tv = _mm256_load_ps(t);
        const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(tv, mv)), _mm256_cmp_ps(tv, minf, _CMP_NEQ_OQ));
        _mm256_store_ps(t, e);
        for (int u = 0; j + u < T; ++u) s[j + u] = t[u];
        sum = _mm256_add_ps(sum, e);
    }
    return 1.0f / hsum(sum);
}

// 1 + the last key the row's mask leaves visible (0 if none): the masked keys after it are never read.
// 16 mask entries per compare, from the end (a reused step graph's rows span the cache's capacity).
static int64_t visible_length(const ggml_fp16_t * mrow, int64_t n) {
    const __m256i minf = _mm256_set1_epi16(static_cast<short>(kF16MinusInf));
    int64_t len = n;
    while (len >= 16) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(mrow + len - 16));
        const auto masked = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(v, minf)));
        if (masked != 0xFFFFFFFFu) return len - 16 + (31 - __builtin_clz(~masked)) / 2 + 1;
        len -= 16;
    }
    while (len > 0 && mrow[len - 1] == kF16MinusInf) --len;
    return len;
}

// acc[r][c] += p[r][u] * v_u[c] for the U keys u in order (v_u at v + u * ld; one FMA each, as weighted_values
// accumulates key by key) for R rows, hd channels: each accumulator loaded and stored once per U keys.
template <int R, int U>
static void accumulate_rows(const float * const p[R], const float * v, int64_t ld, int64_t hd, float * const acc[R]) {
    __m256 pv[R][U];
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < U; ++u) pv[r][u] = _mm256_set1_ps(p[r][u]);
    for (int64_t c = 0; c < hd; c += 8) {
        __m256 vv[U];
        for (int u = 0; u < U; ++u) vv[u] = _mm256_loadu_ps(v + u * ld + c);
        for (int r = 0; r < R; ++r) {
            __m256 a = _mm256_loadu_ps(acc[r] + c);
            for (int u = 0; u < U; ++u) a = _mm256_fmadd_ps(pv[r][u], vv[u], a);
            _mm256_storeu_ps(acc[r] + c, a);
        }
    }
}

// cached_heads' operands (see there).
struct CachedHeads {
    const float * q;           // the position's query heads, contiguous
    const float * k;           // the sequence's cached keys
    int64_t ldk, ldh;          // k's position and head strides (floats)
    const float * v;           // its cached values
    int64_t ldv, ldhv;         // v's position and head strides
    const ggml_fp16_t * mrow;  // the position's mask row
    int64_t T, hd, G;          // visible keys, head size, query heads per K/V head
    float scale;
};

// One position's query heads of K/V heads [h0, h1) (G query heads each; head g of K/V head h is query
// head h * G + g) against the visible keys [0, T) of their sequence: keys in the cache are a position's
// Hkv heads side by side (key j of head h at k + j * ldk + h * ldh, its value at v + j * ldv + h * ldhv),
// so the heads are walked inside the keys and the op reads the sequence's K and V front to back (each head
// alone would read 512 bytes of every 4 KB position at the released widths: latency-bound, ~half the
// memory's bandwidth). Each query row's numbers are those of scores / masked_softmax_row / weighted_values
// over its head alone: its keys grouped by four from the first, its values accumulated key by key.
// scratch: (h1 - h0) * G * (T + hd + 1) floats.
static void cached_heads(const CachedHeads & in, int64_t h0, int64_t h1, float * scratch, float * o) {
    const float *q = in.q, *k = in.k, *v = in.v;
    const int64_t ldk = in.ldk, ldh = in.ldh, ldv = in.ldv, ldhv = in.ldhv, T = in.T, hd = in.hd, G = in.G;
    const int64_t rows = (h1 - h0) * G;
    float * s = scratch;                     // [rows][T]
    float * acc = scratch + rows * T;        // [rows][hd]
    float * inv = acc + rows * hd;           // [rows]
    auto srow = [&](int64_t h, int64_t g) { return s + ((h - h0) * G + g) * T; };
    auto qrow = [&](int64_t h, int64_t g) { return q + (h * G + g) * hd; };
    for (int64_t j = 0; j < T;) {
        const int64_t step = T - j >= 4 ? 4 : 1;  // a group of four, then the tail key by key
        for (int64_t h = h0; h < h1; ++h) {
            const float * kh = k + h * ldh + j * ldk;
            for (int64_t g = 0; g < G; g += 2) {
                const bool two = g + 1 < G;
                const float * qr[2] = {qrow(h, g), two ? qrow(h, g + 1) : nullptr};
                float * sr[2] = {srow(h, g) + j, two ? srow(h, g + 1) + j : nullptr};
                if (two) scores<2>(qr, kh, ldk, step, hd, sr);
                else scores<1>(qr, kh, ldk, step, hd, sr);
            }
        }
        j += step;
    }
    for (int64_t r = 0; r < rows; ++r) inv[r] = masked_softmax_row(s + r * T, in.mrow, T, in.scale);
    std::fill(acc, acc + rows * hd, 0.0f);
    for (int64_t j = 0; j < T;) {
        const bool four = T - j >= 4;
        for (int64_t h = h0; h < h1; ++h) {
            const float * vh = v + h * ldhv + j * ldv;
            for (int64_t g = 0; g < G; g += 2) {
                const bool two = g + 1 < G;
                const float * p[2] = {srow(h, g) + j, two ? srow(h, g + 1) + j : nullptr};
                float * ar[2] = {acc + ((h - h0) * G + g) * hd, two ? acc + ((h - h0) * G + g + 1) * hd : nullptr};
                if (four) {
                    if (two) accumulate_rows<2, 4>(p, vh, ldv, hd, ar);
                    else accumulate_rows<1, 4>(p, vh, ldv, hd, ar);
                } else {
                    if (two) accumulate_rows<2, 1>(p, vh, ldv, hd, ar);
                    else accumulate_rows<1, 1>(p, vh, ldv, hd, ar);
                }
            }
        }
        j += four ? 4 : 1;
    }
    for (int64_t h = h0; h < h1; ++h) {
        for (int64_t g = 0; g < G; ++g) {
            const float * a = acc + ((h - h0) * G + g) * hd;
            float * out = o + (h * G + g) * hd;
            const __m256 iv = _mm256_set1_ps(inv[(h - h0) * G + g]);
            for (int64_t c = 0; c < hd; c += 8) _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), iv));
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512dq")
#endif
// The scores and P.V with 512-bit vectors where the CPU has AVX-512 (FUN_ASR_ZMM=0 keeps the 256-bit code), lane for
// lane the 256-bit arithmetic, so the same bits: the scores take keys in pairs, key 2p in a vector's low half
// and key 2p + 1 in its high half against the query in both (each half is one of the 256-bit accumulators,
// summed by the same hsum4), and P.V takes 16 channels per vector (each lane one channel's sum over the keys,
// in key order, as before). The softmax between them is the 256-bit one.
namespace wide {

template <int R>
static void scores(const float * const q[R], const float * k, int64_t ld, int64_t T, int64_t hd, float * const s[R]) {
    int64_t j = 0;
    for (; j + 4 <= T; j += 4) {
        __m512 acc[R][2];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 2; ++u) acc[r][u] = _mm512_setzero_ps();
        for (int64_t c = 0; c < hd; c += 8) {
            __m512 qv[R];
            for (int r = 0; r < R; ++r) qv[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[r] + c));
            for (int u = 0; u < 2; ++u) {
                const __m512 kv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k + (j + 2 * u) * ld + c)),
                                                     _mm256_loadu_ps(k + (j + 2 * u + 1) * ld + c), 1);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm512_fmadd_ps(qv[r], kv, acc[r][u]);
            }
        }
        for (int r = 0; r < R; ++r) {
            const __m256 a[4] = {_mm512_castps512_ps256(acc[r][0]), _mm512_extractf32x8_ps(acc[r][0], 1),
                                 _mm512_castps512_ps256(acc[r][1]), _mm512_extractf32x8_ps(acc[r][1], 1)};
            _mm_storeu_ps(s[r] + j, hsum4(a));
        }
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

template <int R>
static void weighted_values(const float * const p[R], const float * inv, const float * v, int64_t ld, int64_t T,
                            int64_t hd, float * const o[R]) {
    int64_t c = 0;
    for (; c + 16 <= hd; c += 32) {
        const int nv = c + 32 <= hd ? 2 : 1;
        __m512 acc[R][2];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 2; ++u) acc[r][u] = _mm512_setzero_ps();
        for (int64_t j = 0; j < T; ++j) {
            __m512 pv[R];
            for (int r = 0; r < R; ++r) pv[r] = _mm512_set1_ps(p[r][j]);
            for (int u = 0; u < nv; ++u) {
                const __m512 vv = _mm512_loadu_ps(v + j * ld + c + 16 * u);
                for (int r = 0; r < R; ++r) acc[r][u] = _mm512_fmadd_ps(pv[r], vv, acc[r][u]);
            }
        }
        for (int r = 0; r < R; ++r) {
            for (int u = 0; u < nv; ++u) _mm512_storeu_ps(o[r] + c + 16 * u, _mm512_mul_ps(acc[r][u], _mm512_set1_ps(inv[r])));
        }
        if (nv == 1) c -= 16;
    }
    if (c < hd) {  // a last 8 channels (hd a multiple of 8, not of 16)
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < T; ++j) {
            const __m256 vv = _mm256_loadu_ps(v + j * ld + c);
            for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), vv, acc[r]);
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(o[r] + c, _mm256_mul_ps(acc[r], _mm256_set1_ps(inv[r])));
    }
}

}  // namespace wide
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// The encoder attention's operands: q, k, v, o [d, T] row-major, heads of hd channels.
struct FullAttention {
    const float *q, *k, *v;
    float * o;
    int64_t d, T, hd;
    float scale;
};

// Query rows [i, i + R) of head h: scores, softmax, P.V, with the 256-bit or (Wide) the 512-bit kernels above.
// (Outside the target regions: each stage is a call into its own instruction set's code.)
template <int R, bool Wide>
static void rows(const FullAttention & a, int64_t h, int64_t i, float * scratch) {
    const float *q = a.q, *k = a.k, *v = a.v;
    float * o = a.o;
    const int64_t d = a.d, T = a.T, hd = a.hd;
    const float * qr[R];
    float * s[R];
    float * orow[R];
    float inv[R];
    for (int r = 0; r < R; ++r) {
        qr[r] = q + (i + r) * d + h * hd;
        s[r] = scratch + r * T;
        orow[r] = o + (i + r) * d + h * hd;
    }
    if constexpr (Wide) {
        wide::scores<R>(qr, k + h * hd, d, T, hd, s);
    } else {
        scores<R>(qr, k + h * hd, d, T, hd, s);
    }
    for (int r = 0; r < R; ++r) inv[r] = softmax_row(s[r], T, a.scale);
    const float * p[R];
    for (int r = 0; r < R; ++r) p[r] = s[r];
    if constexpr (Wide) {
        wide::weighted_values<R>(p, inv, v + h * hd, d, T, hd, orow);
    } else {
        weighted_values<R>(p, inv, v + h * hd, d, T, hd, orow);
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // FUN_ASR_ATTN_X86

// Whether the encoder's attention takes the 512-bit rows (AVX-512 F and DQ; FUN_ASR_ZMM=0: the 256-bit ones).
bool wide_ok() {
#if FUN_ASR_ATTN_X86
    static const bool ok = [] {
        if (switches::is("FUN_ASR_ZMM", "0")) return false;
        // FUN_ASR_MATVEC=avx2 / avxvnni stands in for a CPU without AVX-512: the 256-bit code then, as there
        if (switches::is("FUN_ASR_MATVEC", "avx2") || switches::is("FUN_ASR_MATVEC", "avxvnni")) return false;
        return cpu_features().avx512f && cpu_features().avx512dq;
    }();
    return ok;
#else
    return false;
#endif
}

// Query rows sharing each key and value load. Measured, full-size encoder at T = 167, 2 threads, Zen 4 (AVX2
// code): 2 rows 36.9-37.8 ms of attention per pass, 3 rows 28.6-28.8, 4 rows 31.5 (its 16 score accumulators
// and 4 query vectors do not fit 16 registers). Each row's arithmetic is the same for any count: the same bits.
constexpr int64_t kRowsPerTask = 3;
// The 512-bit rows hold half as many accumulators per query row (two keys, or 16 channels, per vector): 6 rows
// keep as many independent multiply-add chains in flight, in 32 registers.
constexpr int64_t kWideRowsPerTask = 8;

void run(ggml_tensor * dst, int ith, int nth, void * userdata) {
#if FUN_ASR_ATTN_X86
    const Params & prm = *static_cast<const Params *>(userdata);
    const ggml_tensor * qt = dst->src[0];
    const int64_t d = qt->ne[0], T = qt->ne[1], hd = d / prm.n_heads;
    const auto * q = static_cast<const float *>(qt->data);
    const auto * k = static_cast<const float *>(dst->src[1]->data);
    const auto * v = static_cast<const float *>(dst->src[2]->data);
    auto * o = static_cast<float *>(dst->data);
    const FullAttention a{q, k, v, o, d, T, hd, prm.scale};
    const bool wide = wide_ok();
    const int64_t per = wide ? kWideRowsPerTask : kRowsPerTask;
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(per * T));
    // Tasks: (head, `per` query rows), interleaved over the threads.
    const int64_t groups = (T + per - 1) / per, tasks = prm.n_heads * groups;
    for (int64_t t = ith; t < tasks; t += nth) {
        const int64_t h = t / groups, i = per * (t % groups);
        const int64_t n = std::min<int64_t>(per, T - i);
        if (wide) {
            switch (n) {
                case 8: rows<8, true>(a, h, i, scratch.data()); break;
                case 7: rows<7, true>(a, h, i, scratch.data()); break;
                case 6: rows<6, true>(a, h, i, scratch.data()); break;
                case 5: rows<5, true>(a, h, i, scratch.data()); break;
                case 4: rows<4, true>(a, h, i, scratch.data()); break;
                case 3: rows<3, true>(a, h, i, scratch.data()); break;
                case 2: rows<2, true>(a, h, i, scratch.data()); break;
                default: rows<1, true>(a, h, i, scratch.data()); break;
            }
            continue;
        }
        switch (n) {
            case 3: rows<3, false>(a, h, i, scratch.data()); break;
            case 2: rows<2, false>(a, h, i, scratch.data()); break;
            default: rows<1, false>(a, h, i, scratch.data()); break;
        }
    }
#else
    (void)dst; (void)ith; (void)nth; (void)userdata;
#endif
}

void run_cached(ggml_tensor * dst, int ith, int nth, void * userdata) {
#if FUN_ASR_ATTN_X86
    const CachedParams & prm = *static_cast<const CachedParams *>(userdata);
    const ggml_tensor *qt = dst->src[0], *kt = dst->src[1], *vt = dst->src[2], *mt = dst->src[3];
    const int64_t hd = kt->ne[0], Hkv = prm.n_kv_heads, n_kv = kt->ne[2], B = kt->ne[3];
    const int64_t n = qt->ne[2] / B, G = prm.n_heads / Hkv;
    const int64_t ldk = static_cast<int64_t>(kt->nb[2] / sizeof(float)), ldv = static_cast<int64_t>(vt->nb[2] / sizeof(float));
    const int64_t ldh = static_cast<int64_t>(kt->nb[1] / sizeof(float)), ldhv = static_cast<int64_t>(vt->nb[1] / sizeof(float));
    // Tasks: (sequence, position, a run of its K/V heads), interleaved over the threads. The heads of a
    // position are split into parts only until every thread has a task and the tasks share evenly.
    int64_t parts = 1;
    while (parts < Hkv && Hkv % (2 * parts) == 0 &&
           (B * n * parts < nth || ((B * n * parts) % nth != 0 && B * n * parts < 4 * nth))) {
        parts *= 2;
    }
    const int64_t per_part = Hkv / parts, tasks = B * n * parts;
    thread_local std::vector<float> scratch, own_q;
    scratch.resize(static_cast<size_t>(per_part * G * (n_kv + hd + 1)));
    // cached_attention_heads (n = 1): sources 4-8 the raw k, v products, the norms' weights and the positions; each
    // task first makes its query heads and its K/V heads' new rows (only it reads those rows in this node)
    const bool heads = dst->src[8] != nullptr;
    AttentionHeads in{};
    if (heads) {
        in = AttentionHeads{qt, dst->src[4], dst->src[5], dst->src[6], dst->src[7], dst->src[8], kt, vt, hd, G,
                            prm.eps, prm.base, prm.first, prm.second};
        own_q.resize(static_cast<size_t>(hd * prm.n_heads));
    }
    for (int64_t t = ith; t < tasks; t += nth) {
        const int64_t part = t % parts, i = (t / parts) % n, b = t / (parts * n);
        const auto * mrow = reinterpret_cast<const ggml_fp16_t *>(static_cast<const char *>(mt->data) + i * mt->nb[1] +
                                                                  b * mt->nb[3]);
        const int64_t len = visible_length(mrow, n_kv);  // masked keys at the end are not read at all
        const auto * k = reinterpret_cast<const float *>(static_cast<const char *>(kt->data) + b * kt->nb[3]);
        const auto * v = reinterpret_cast<const float *>(static_cast<const char *>(vt->data) + b * vt->nb[3]);
        const int64_t col = b * n + i;
        const float * q = reinterpret_cast<const float *>(static_cast<const char *>(qt->data) + col * qt->nb[2]);
        if (heads) {
            attention_heads_input(in, b, part * per_part, (part + 1) * per_part, own_q.data());
            q = own_q.data();
        }
        auto * o = reinterpret_cast<float *>(static_cast<char *>(dst->data) + col * dst->nb[1]);
        const CachedHeads task{q, k, ldk, ldh, v, ldv, ldhv, mrow, len, hd, G, prm.scale};
        cached_heads(task, part * per_part, (part + 1) * per_part, scratch.data(), o);
    }
#else
    (void)dst; (void)ith; (void)nth; (void)userdata;
#endif
}

bool cpu_ok() {
#if FUN_ASR_ATTN_X86
    static const bool ok = [] {
        if (switches::is("FUN_ASR_ATTN", "ggml")) return false;
        return cpu_features().avx2 && cpu_features().fma;
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

static bool host_view(const ggml_tensor * t) {
    const ggml_tensor * base = t->view_src ? t->view_src : t;
    return base->buffer && ggml_backend_buffer_is_host(base->buffer);
}

static bool in_host_memory(const ggml_tensor * t) { return !t->buffer || ggml_backend_buffer_is_host(t->buffer); }

// q F32 [hd, n_heads, n * B] in host memory with its heads contiguous; its columns may be apart (a view of the q/k
// heads' RoPE output).
static bool query_heads_ok(const ggml_tensor * q, int64_t n_heads, int64_t B) {
    const int64_t hd = q->ne[0];
    if (hd % 8 != 0 || q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float) || q->nb[1] != hd * sizeof(float)) {
        return false;
    }
    return q->nb[2] >= static_cast<size_t>(hd * n_heads) * sizeof(float) && q->ne[1] == n_heads && q->ne[3] == 1 &&
           B > 0 && q->ne[2] % B == 0 && in_host_memory(q);
}

// t (k or v) F32 [hd, n_kv_heads, k's n_kv, B], a view of a host cache with contiguous rows.
static bool cache_window_ok(const ggml_tensor * t, const ggml_tensor * k, int64_t hd, int64_t n_kv_heads, int64_t B) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == hd && t->ne[1] == n_kv_heads && t->ne[2] == k->ne[2] &&
           t->ne[3] == B && t->nb[0] == sizeof(float) && host_view(t);
}

bool cached_attention_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                                const ggml_tensor * mask, int64_t n_heads, int64_t n_kv_heads) {
    if (!cpu_ok() || !q || !k || !v || !mask || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return false;
    const int64_t hd = q->ne[0], B = k->ne[3];
    if (!query_heads_ok(q, n_heads, B)) return false;
    if (!cache_window_ok(k, k, hd, n_kv_heads, B) || !cache_window_ok(v, k, hd, n_kv_heads, B)) return false;
    return mask->type == GGML_TYPE_F16 && mask->ne[0] == k->ne[2] && mask->ne[1] * B == q->ne[2] && mask->ne[2] == 1 &&
           mask->ne[3] == B && mask->nb[0] == sizeof(ggml_fp16_t) && in_host_memory(mask);
}

ggml_tensor * cached_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                               ggml_tensor * mask, int64_t n_heads, int64_t n_kv_heads, float scale) {
    ggml_tensor * args[4] = {q, k, v, mask};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0] * n_heads, q->ne[2], 1, 1, args, 4, run_cached,
                          GGML_N_TASKS_MAX, const_cast<CachedParams *>(intern_op_params(CachedParams{n_heads, n_kv_heads, scale})));
}

// Each K/V head's row of w is written whole: rows of hd contiguous floats.
static bool whole_head_rows(const ggml_tensor * w, int64_t hd) {
    return w->nb[0] == sizeof(float) && w->nb[1] == static_cast<size_t>(hd) * sizeof(float);
}

bool cached_attention_heads_supported(const CachedAttentionHeads & a) {
    const ggml_tensor *q = a.q, *k = a.k, *v = a.v, *qn = a.qn, *kn = a.kn, *positions = a.positions;
    const ggml_tensor *kw = a.kw, *vw = a.vw;
    const int64_t n_heads = a.n_heads, n_kv_heads = a.n_kv_heads;
    if (!q || !k || !v || !kw || !positions || n_heads <= 0 || n_kv_heads <= 0 || !fusion_enabled()) return false;
    const int64_t hd = kw->ne[0], B = kw->ne[3];
    // one position per sequence: q's columns are the sequences
    if (q->ne[1] != B || q->ne[0] != hd * n_heads || k->ne[0] != hd * n_kv_heads || v->ne[0] != k->ne[0]) return false;
    // q and k as the heads' norms take them, and v's columns as k's (the same check with v for q)
    if (!heads_rms_norm_supported(q, k, qn, kn, hd) || !heads_rms_norm_supported(v, k, qn, kn, hd)) return false;
    const auto forms = rope_rotation_forms(hd, a.rope_base);
    if (forms.first < 0 || forms.second < 0) return false;
    if (positions->type != GGML_TYPE_I32 || ggml_nelements(positions) != B || !ggml_is_contiguous(positions) ||
        !in_host_memory(positions)) {
        return false;
    }
    if (!whole_head_rows(kw, hd) || !whole_head_rows(vw, hd)) return false;
    // the plain op's checks, with q as its [hd, n_heads, B] view
    ggml_tensor q3 = *q;
    q3.ne[0] = hd;
    q3.ne[1] = n_heads;
    q3.ne[2] = B;
    q3.nb[1] = static_cast<size_t>(hd) * sizeof(float);
    q3.nb[2] = q->nb[1];
    return cached_attention_supported(&q3, kw, vw, a.mask, n_heads, n_kv_heads);
}

ggml_tensor * cached_attention_heads(ggml_context * ctx, const CachedAttentionHeads & a) {
    const int64_t hd = a.kw->ne[0], n_heads = a.n_heads;
    ggml_tensor * q = a.q;
    ggml_tensor * q3 =
        ggml_view_3d(ctx, q, hd, n_heads, q->ne[1], static_cast<size_t>(hd) * sizeof(float), q->nb[1], 0);
    ggml_tensor * args[9] = {q3, a.kw, a.vw, a.mask, a.k, a.v, a.qn, a.kn, a.positions};
    const auto forms = rope_rotation_forms(hd, a.rope_base);
    CachedParams p{n_heads, a.n_kv_heads, a.scale};
    p.eps = a.eps;
    p.base = a.rope_base;
    p.first = forms.first;
    p.second = forms.second;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd * n_heads, q->ne[1], 1, 1, args, 9, run_cached, GGML_N_TASKS_MAX,
                          const_cast<CachedParams *>(intern_op_params(p)));
}

bool is_attention(const ggml_tensor * t) {
    const ggml_custom_op_t fun = custom_op_function(t);
    return fun && (fun == run || fun == run_cached);
}

ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int64_t n_heads,
                        float scale) {
    ggml_tensor * args[3] = {q, k, v};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, q->ne[0], q->ne[1], 1, 1, args, 3, run, GGML_N_TASKS_MAX,
                          const_cast<Params *>(intern_op_params(Params{n_heads, scale})));
}

}  // namespace fun_asr
