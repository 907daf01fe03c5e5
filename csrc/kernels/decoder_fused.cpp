#include "kernels/decoder_fused.h"

#include "base/cpu_backend.h"
#include "kernels/dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
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

struct RopeParams {
    int64_t hd;
    float eps, base;
    int first, second;  // the RoPE's forms (RopeForms)
    bool operator<(const RopeParams & o) const {
        return std::tie(hd, eps, base, first, second) < std::tie(o.hd, o.eps, o.base, o.first, o.second);
    }
};

// A product node's own input (node_input_args): which, and the norm's epsilon.
struct InputParams {
    NodeInput kind;
    float eps;
    bool sum;  // add_rms_norm: the node's output has x + y's block
    bool operator<(const InputParams & o) const { return std::tie(kind, eps, sum) < std::tie(o.kind, o.eps, o.sum); }
};

// ggml_rms_norm's steps (ggml-cpu ops.cpp) for R rows (row r: v[r], weight w[r], into out[r]): per row the float
// squares summed in order in double, a float mean, scale = 1 / sqrtf(mean + eps); then ggml_mul by the weight:
// (v * scale) * w. Several rows' sums are interleaved, so R chains of dependent additions run side by side where
// one row alone waits on every addition's latency (~4 cycles, 128 of them for a head); each row's numbers are the
// same for any R.
template <int R>
inline void rms_norm_rows(const float * const v[R], const float * const w[R], int64_t n, float eps, float * const out[R]) {
    double sum[R];
    for (int r = 0; r < R; ++r) sum[r] = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        for (int r = 0; r < R; ++r) sum[r] += static_cast<double>(v[r][i] * v[r][i]);
    }
    for (int r = 0; r < R; ++r) {
        const float mean = static_cast<float>(sum[r] / static_cast<double>(n));
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; ++i) out[r][i] = v[r][i] * scale * w[r][i];
    }
}

// One row of rms_norm_rows.
inline void rms_norm_row(const float * v, const float * w, int64_t n, float eps, float * out) {
    const float * const vs[1] = {v};
    const float * const ws[1] = {w};
    float * const os[1] = {out};
    rms_norm_rows<1>(vs, ws, n, eps, os);
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

// NeoX RoPE as ggml's CPU op computes it (ggml-cpu ops.cpp: ggml_rope_cache_init, rotate_pairs) with freq_scale 1,
// no YaRN (ext_factor 0) and attn_factor 1: per position a float theta = pos, cos/sin of it (glibc's cosf / sinf,
// times 1), theta *= base^(-2 / n) for the next pair; pair (i, i + n/2) rotated as x0 c - x1 s, x0 s + x1 c.
// Whether ggml's compiler fused a product and the difference into an FMA (its -march=native build contracts
// them, a build for another CPU may not) is read off ggml's own op once (rope_forms): each of the two outputs
// is one of three forms.
enum RopeForm : int { kPlain = 0, kFmaFirst = 1, kFmaSecond = 2 };
struct RopeForms {
    int first = -1, second = -1;  // x0 c - x1 s, x0 s + x1 c; -1: none matched ggml's
};

// x0 c - x1 s and x0 s + x1 c in the forms (fma: std::fma, or with hw the FMA instruction, inline).
template <bool hw>
inline float fused_mul_add(float a, float b, float c) {
    if constexpr (hw) return __builtin_fmaf(a, b, c);
    return std::fma(a, b, c);
}

template <bool hw>
inline float rot_first(int form, float x0, float x1, float c, float sn) {
    switch (form) {
        case kFmaFirst: return fused_mul_add<hw>(x0, c, -(x1 * sn));
        case kFmaSecond: return fused_mul_add<hw>(-x1, sn, x0 * c);
        default: return x0 * c - x1 * sn;
    }
}

template <bool hw>
inline float rot_second(int form, float x0, float x1, float c, float sn) {
    switch (form) {
        case kFmaFirst: return fused_mul_add<hw>(x0, sn, x1 * c);
        case kFmaSecond: return fused_mul_add<hw>(x1, c, x0 * sn);
        default: return x0 * sn + x1 * c;
    }
}

template <bool hw>
inline void rope_row_impl(const float * x, int64_t n, const float * cs, int first, int second, float * out) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < n; i += 2) {
        const int64_t ic = i / 2;
        const float c = cs[i], sn = cs[i + 1], x0 = x[ic], x1 = x[ic + half];
        out[ic] = rot_first<hw>(first, x0, x1, c, sn);
        out[ic + half] = rot_second<hw>(second, x0, x1, c, sn);
    }
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("fma"))) void rope_row_fma(const float * x, int64_t n, const float * cs, int first, int second,
                                                 float * out) {
    rope_row_impl<true>(x, n, cs, first, second, out);
}
bool cpu_has_fma() {
    static const bool has = cpu_features().fma;
    return has;
}
#else
void rope_row_fma(const float * x, int64_t n, const float * cs, int first, int second, float * out) {
    rope_row_impl<false>(x, n, cs, first, second, out);
}
bool cpu_has_fma() { return false; }
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
// rope_row_impl<true> for the two FMA forms, 8 pairs per step: each output is the same single-rounded FMA of the
// same rounded product (fmsub / fnmadd negate exactly), so the same bits. cs's (cos, sin) pairs are split by two
// in-lane shuffles and a cross-lane permute.
template <int First, int Second>
__attribute__((target("avx2,fma"))) void rope_row_fma8(const float * x, int64_t n, const float * cs, float * out) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; i += 8) {
        const __m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
        const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        const __m256 sn = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
        const __m256 o0 = First == kFmaFirst ? _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, sn))   // x0 c - (x1 s)
                                             : _mm256_fnmadd_ps(x1, sn, _mm256_mul_ps(x0, c));  // -(x1 s) + (x0 c)
        const __m256 o1 = Second == kFmaFirst ? _mm256_fmadd_ps(x0, sn, _mm256_mul_ps(x1, c))
                                              : _mm256_fmadd_ps(x1, c, _mm256_mul_ps(x0, sn));
        _mm256_storeu_ps(out + i, o0);
        _mm256_storeu_ps(out + i + half, o1);
    }
}
bool cpu_has_avx2_fma() {
    static const bool has = cpu_features().avx2 && cpu_features().fma;
    return has;
}
#endif

// Row x (n floats) rotated into out (not x), the forms first / second.
void rope_row(const float * x, int64_t n, const float * cs, int first, int second, float * out) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    if (first != kPlain && second != kPlain && n % 16 == 0 && cpu_has_avx2_fma()) {
        if (first == kFmaFirst && second == kFmaFirst) return rope_row_fma8<kFmaFirst, kFmaFirst>(x, n, cs, out);
        if (first == kFmaFirst) return rope_row_fma8<kFmaFirst, kFmaSecond>(x, n, cs, out);
        if (second == kFmaFirst) return rope_row_fma8<kFmaSecond, kFmaFirst>(x, n, cs, out);
        return rope_row_fma8<kFmaSecond, kFmaSecond>(x, n, cs, out);
    }
#endif
    if ((first != kPlain || second != kPlain) && cpu_has_fma()) {
        rope_row_fma(x, n, cs, first, second, out);
    } else {
        rope_row_impl<false>(x, n, cs, first, second, out);
    }
}

// ggml_rope_cache_init's cos/sin for position p (cs: n floats, cos and sin interleaved), with ggml's theta scale
// base^(-2 / n).
void rope_cache(int64_t p, int64_t n, float base, float * cs) {
    const float theta_scale = powf(base, -2.0f / static_cast<float>(n));
    float theta = static_cast<float>(p);
    for (int64_t i = 0; i < n; i += 2) {
        cs[i] = cosf(theta) * 1.0f;
        cs[i + 1] = sinf(theta) * 1.0f;
        theta *= theta_scale;
    }
}

// rope_cache's row for position p, kept per thread: a pass's positions are the same in every layer, so a decode
// step computes the cos / sin (n of them, ~30 ns each) once per sequence instead of once per layer.
const float * rope_cached(int64_t p, int64_t n, float base) {
    struct Slot {
        int64_t p = -1, n = 0;
        float base = 0.0f;
        std::vector<float> cs;
    };
    thread_local Slot slots[32];
    Slot & s = slots[static_cast<uint64_t>(p) % 32];
    if (s.p != p || s.n != n || s.base != base) {
        s.cs.resize(static_cast<size_t>(n));
        rope_cache(p, n, base, s.cs.data());
        s.p = p;
        s.n = n;
        s.base = base;
    }
    return s.cs.data();
}

// One head: rms_norm_row with weight w, then rotated (cos/sin cs, the forms first / second) into out.
void norm_rotate(const float * x, const float * w, int64_t hd, float eps, const float * cs, int first, int second,
                 float * out) {
    thread_local std::vector<float> normed;
    normed.resize(static_cast<size_t>(hd));
    rms_norm_row(x, w, hd, eps, normed.data());
    rope_row(normed.data(), hd, cs, first, second, out);
}

// The forms ggml's RoPE op takes in this build for rows of n and this base: its output for varied rows and
// positions against each form of ours (once per n and base: the model's head size and base).
RopeForms measure_rope_forms(int64_t n, float base) {
    RopeForms f;
    constexpr int64_t heads = 4, T = 24;
    ggml_init_params ip{};
    // (the tensors, a graph of ggml's default size and the compute plan's work buffer: a few hundred KB)
    ip.mem_size = static_cast<size_t>(3 * n * heads * T) * sizeof(float) + 8 * 1024 * 1024;
    ggml_context * ctx = ggml_init(ip);
    if (!ctx) return f;
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n, heads, T);
    ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    auto * xd = static_cast<float *>(x->data);
    uint32_t state = 12345u;
    for (int64_t i = 0; i < n * heads * T; ++i) {
        state = state * 1664525u + 1013904223u;
        xd[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 8.0f;
    }
    auto * pd = static_cast<int32_t *>(pos->data);
    for (int64_t t = 0; t < T; ++t) pd[t] = static_cast<int32_t>(t * t * 37 + t);
    ggml_tensor * r = ggml_rope_ext(ctx, x, pos, nullptr, static_cast<int>(n), GGML_ROPE_TYPE_NEOX, 0, base, 1.0f, 0.0f,
                                    1.0f, 0.0f, 0.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, r);
    ggml_backend_t cpu = cpu_backend::make(1);  // (ggml's CPU backend computes tensors of a plain context too)
    const bool computed = ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS;
    ggml_backend_free(cpu);
    if (computed) {
        bool first[3] = {true, true, true}, second[3] = {true, true, true};
        std::vector<float> cs(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        const size_t half = static_cast<size_t>(n / 2) * sizeof(float);
        for (int64_t t = 0; t < T; ++t) {
            rope_cache(pd[t], n, base, cs.data());
            for (int64_t h = 0; h < heads; ++h) {
                const float * row = xd + (t * heads + h) * n;
                const float * ref = static_cast<const float *>(r->data) + (t * heads + h) * n;
                for (int form = 0; form < 3; ++form) {
                    rope_row(row, n, cs.data(), form, form, out.data());
                    first[form] = first[form] && std::memcmp(out.data(), ref, half) == 0;
                    second[form] = second[form] && std::memcmp(out.data() + n / 2, ref + n / 2, half) == 0;
                }
            }
        }
        for (int form = 2; form >= 0; --form) {  // (the plain form last: where forms agree, any is ggml's)
            if (first[form]) f.first = form;
            if (second[form]) f.second = form;
        }
    }
    ggml_free(ctx);
    return f;
}

RopeForms rope_forms(int64_t n, float base) {
    static std::mutex mu;
    static std::map<std::pair<int64_t, float>, RopeForms> known;
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(n, base);
    auto it = known.find(key);
    if (it == known.end()) it = known.emplace(key, measure_rope_forms(n, base)).first;
    return it->second;
}

// src[0] = q [hd * Hq, T], src[1] = k [hd * Hkv, T], src[2] = qn, src[3] = kn, src[4] = positions I32 [T],
// src[5] = v [hd * Hkv, T], src[6] = kc, src[7] = vc (rows of the caches), src[8] = cache rows I64 [T].
// dst [hd, Hq + Hkv, T]: the normed and rotated heads, the key heads and v also into the caches' rows.
void run_heads_norm_rope_store(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto & p = *static_cast<const RopeParams *>(userdata);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[5], *kc = dst->src[6], *vc = dst->src[7];
    const auto * qn = static_cast<const float *>(dst->src[2]->data);
    const auto * kn = static_cast<const float *>(dst->src[3]->data);
    const auto * pos = static_cast<const int32_t *>(dst->src[4]->data);
    const auto * rows = static_cast<const char *>(dst->src[8]->data);
    const int64_t hd = p.hd, Hq = q->ne[0] / hd, H = dst->ne[1], T = dst->ne[2];
    const auto [r0, r1] = share(H * T, ith, nth);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / H, h = r % H;
        const float * cs = rope_cached(pos[t], hd, p.base);
        const bool is_q = h < Hq;
        const ggml_tensor * src = is_q ? q : k;
        const auto * x = reinterpret_cast<const float *>(static_cast<const char *>(src->data) + t * src->nb[1]) +
                         (is_q ? h : h - Hq) * hd;
        auto * o = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[2] + h * dst->nb[1]);
        norm_rotate(x, is_q ? qn : kn, hd, p.eps, cs, p.first, p.second, o);
        if (is_q) continue;
        const int64_t row = *reinterpret_cast<const int64_t *>(rows + t * dst->src[8]->nb[0]);
        if (row < 0 || row >= kc->ne[1]) continue;  // (the caller gives rows inside the cache)
        const size_t bytes = static_cast<size_t>(hd) * sizeof(float), off = static_cast<size_t>(h - Hq) * bytes;
        std::memcpy(static_cast<char *>(kc->data) + row * kc->nb[1] + off, o, bytes);
        std::memcpy(static_cast<char *>(vc->data) + row * vc->nb[1] + off,
                    static_cast<const char *>(v->data) + t * v->nb[1] + off, bytes);
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

// argmax_columns' userdata: a NaN in row 0 does not win (the CTC head's frames); any other: it does.
const bool kNanNeverWins = false;
// argmax_logprob_columns' userdata: each choice with its log-probability (dst I32 [2, n]).
const bool kWithLogprob = true;

// src[0] = logits [V, n]; dst I32 [n] (or [2, n] with each choice's log-probability): columns split among threads.
void run_argmax(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * l = dst->src[0];
    const bool nan_first_wins = userdata != &kNanNeverWins;
    const bool with_logprob = userdata == &kWithLogprob;
    const auto [c0, c1] = share(l->ne[1], ith, nth);
    for (int64_t c = c0; c < c1; ++c) {
        const auto * x = reinterpret_cast<const float *>(static_cast<const char *>(l->data) + c * l->nb[1]);
        const int64_t at = first_argmax(x, l->ne[0], nan_first_wins);
        // column c's slot: element c of [n], or column c of [2, n]
        auto * out = reinterpret_cast<int32_t *>(static_cast<char *>(dst->data) + c * (with_logprob ? dst->nb[1] : dst->nb[0]));
        out[0] = static_cast<int32_t>(at);
        if (with_logprob) {
            const float lp = chosen_logprob(x, l->ne[0], at);
            std::memcpy(out + 1, &lp, sizeof(float));
        }
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

bool heads_norm_rope_store_supported(const HeadsNormRopeStore & a) {
    const ggml_tensor * positions = a.positions;
    if (!heads_rms_norm_supported(a.q, a.k, a.qn, a.kn, a.hd)) return false;
    if (!store_kv_supported(a.k, a.v, a.kc, a.vc, a.rows) || !positions || positions->type != GGML_TYPE_I32) return false;
    if (ggml_nelements(positions) != a.q->ne[1] || !ggml_is_contiguous(positions)) return false;
    if (positions->buffer && !ggml_backend_buffer_is_host(positions->buffer)) return false;
    const auto forms = rope_rotation_forms(a.hd, a.base);
    return forms.first >= 0 && forms.second >= 0;
}

std::pair<int, int> rope_rotation_forms(int64_t n, float base) {
    if (n <= 0 || n % 2 != 0 || n > 4096) return {-1, -1};
    const RopeForms f = rope_forms(n, base);
    return {f.first, f.second};
}

ggml_tensor * heads_norm_rope_store(ggml_context * ctx, const HeadsNormRopeStore & a) {
    const int64_t hd = a.hd;
    const RopeForms f = rope_forms(hd, a.base);
    ggml_tensor * args[9] = {a.q, a.k, a.qn, a.kn, a.positions, a.v, a.kc, a.vc, a.rows};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd, (a.q->ne[0] + a.k->ne[0]) / hd, a.q->ne[1], 1, args, 9,
                          run_heads_norm_rope_store, GGML_N_TASKS_MAX,
                          const_cast<RopeParams *>(intern_op_params(RopeParams{hd, a.eps, a.base, f.first, f.second})));
}

void attention_heads_input(const AttentionHeads & a, int64_t b, int64_t j0, int64_t j1, float * q) {
    const int64_t hd = a.hd, p = static_cast<const int32_t *>(a.pos->data)[b];
    if (p < 0 || p >= a.kw->ne[2]) return;  // (the builder's positions are inside the windows)
    const float * cs = rope_cached(p, hd, a.base);
    auto column = [b](const ggml_tensor * t, size_t stride) {
        return reinterpret_cast<const float *>(static_cast<const char *>(t->data) + b * stride);
    };
    const float *qc = column(a.q, a.q->nb[2]), *kc = column(a.k, a.k->nb[1]), *vc = column(a.v, a.v->nb[1]);
    const auto *qn = static_cast<const float *>(a.qn->data), *kn = static_cast<const float *>(a.kn->data);
    const size_t bytes = static_cast<size_t>(hd) * sizeof(float);
    // The heads to norm and rotate (the query heads of K/V heads [j0, j1), then those K heads into their cache
    // rows), four at a time through rms_norm_rows: the same numbers as norm_rotate per head.
    thread_local std::vector<const float *> src, wt;
    thread_local std::vector<float *> dst;
    thread_local std::vector<float> normed;
    src.clear();
    wt.clear();
    dst.clear();
    for (int64_t j = j0; j < j1; ++j) {
        for (int64_t h = j * a.group; h < (j + 1) * a.group; ++h) {
            src.push_back(qc + h * hd);
            wt.push_back(qn);
            dst.push_back(q + h * hd);
        }
        src.push_back(kc + j * hd);
        wt.push_back(kn);
        dst.push_back(reinterpret_cast<float *>(static_cast<char *>(a.kw->data) + j * a.kw->nb[1] + p * a.kw->nb[2] +
                                                b * a.kw->nb[3]));
        std::memcpy(static_cast<char *>(a.vw->data) + j * a.vw->nb[1] + p * a.vw->nb[2] + b * a.vw->nb[3], vc + j * hd,
                    bytes);
    }
    const int64_t rows = static_cast<int64_t>(src.size());
    normed.resize(static_cast<size_t>(4 * hd));
    float * const nr[4] = {normed.data(), normed.data() + hd, normed.data() + 2 * hd, normed.data() + 3 * hd};
    for (int64_t r = 0; r < rows;) {
        const int64_t m = std::min<int64_t>(4, rows - r);
        switch (m) {
            case 4: rms_norm_rows<4>(&src[r], &wt[r], hd, a.eps, nr); break;
            case 3: rms_norm_rows<3>(&src[r], &wt[r], hd, a.eps, nr); break;
            case 2: rms_norm_rows<2>(&src[r], &wt[r], hd, a.eps, nr); break;
            default: rms_norm_rows<1>(&src[r], &wt[r], hd, a.eps, nr); break;
        }
        for (int64_t i = 0; i < m; ++i) rope_row(nr[i], hd, cs, a.first, a.second, dst[r + i]);
        r += m;
    }
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

bool node_input_supported(const ProductInput & in) {
    const ggml_tensor *a = in.a, *b = in.b;
    if (!fusion_enabled() || !f32_columns(a)) return false;
    if (b && (!f32_columns(b) || a->ne[0] != b->ne[0] || a->ne[1] != b->ne[1])) return false;
    if (in.kind == NodeInput::swiglu) return b && !in.w && !in.sum && a->ne[0] <= INT32_MAX;
    return in.kind == NodeInput::add_rms_norm && f32_vector(in.w, a->ne[0]) && (b || !in.sum);
}

void * node_input_args(const ProductInput & in, ggml_tensor ** args) {
    args[1] = in.a;
    args[kNodeInputSrc] = in.b;
    args[kNodeInputSrc + 1] = in.w;  // (add_rms_norm's only: what node_input_name looks for)
    const bool norm = in.kind == NodeInput::add_rms_norm;
    return const_cast<InputParams *>(intern_op_params(InputParams{in.kind, norm ? in.eps : 0.0f, norm && in.sum}));
}

const char * node_input_name(const ggml_tensor * dst) {
    if (!custom_op_function(dst) || !dst->src[1]) return nullptr;
    if (dst->src[kNodeInputSrc + 1]) return "ADD_RMS_NORM";  // (only add_rms_norm has a weight; its y may be null)
    return dst->src[kNodeInputSrc] ? "SWIGLU" : nullptr;
}

int64_t node_input_extra(const ggml_tensor * dst) {
    if (!node_input_name(dst)) return 0;
    int64_t rows = dst->src[0]->ne[1];  // (the matrices: src[0], src[2] ... up to the first null)
    for (int i = 2; i < kNodeInputSrc && dst->src[i]; ++i) rows += dst->src[i]->ne[1];
    return ggml_nelements(dst) - rows * dst->src[1]->ne[1];
}

const float * node_input(const ggml_tensor * dst, const void * userdata, float * sum, int ith, int nth) {
    if (!userdata) return nullptr;
    const auto & p = *static_cast<const InputParams *>(userdata);
    const ggml_tensor *a = dst->src[1], *b = dst->src[kNodeInputSrc];
    const int64_t n = a->ne[0], T = a->ne[1];
    thread_local std::vector<float> in, s;
    in.resize(static_cast<size_t>(n * T));
    auto column = [](const ggml_tensor * t, int64_t c) {
        return reinterpret_cast<const float *>(static_cast<const char *>(t->data) + c * t->nb[1]);
    };
    if (p.kind == NodeInput::swiglu) {
        for (int64_t t = 0; t < T; ++t) {
            cpu_backend::api().vec_swiglu_f32(static_cast<int>(n), in.data() + t * n, column(a, t), column(b, t));
        }
        return in.data();
    }
    // add_rms_norm: every thread the whole input (a few thousand floats), run_add_rms_norm's steps; the sums of
    // its share of the columns also into the node's output where it has their block
    const auto * w = static_cast<const float *>(dst->src[kNodeInputSrc + 1]->data);
    const auto [t0, t1] = share(T, ith, nth);
    s.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < T; ++t) {
        const float * xr = column(a, t);
        if (!b) {  // the norm of x alone (ggml_rms_norm's steps, then the weight: rms_norm_row)
            rms_norm_row(xr, w, n, p.eps, in.data() + t * n);
            continue;
        }
        const float * yr = column(b, t);
        float * sr = p.sum && sum && t >= t0 && t < t1 ? sum + t * n : s.data();
        for (int64_t i = 0; i < n; ++i) sr[i] = xr[i] + yr[i];
        rms_norm_row(sr, w, n, p.eps, in.data() + t * n);
    }
    return in.data();
}

int64_t first_argmax(const float * x, int64_t n, bool nan_first_wins) {
    // std::max_element keeps its first element while nothing compares greater: a NaN there stays; later
    // NaNs never compare greater. Otherwise its answer is the first element equal to the largest non-NaN
    // value (equal compares -0 and +0 alike, as the sequential scan keeps the first of such ties). Without
    // nan_first_wins a NaN at 0 is passed over like the others (the scan starts from -inf).
    if (n <= 0 || (nan_first_wins && std::isnan(x[0]))) return 0;
    float m = std::isnan(x[0]) ? -std::numeric_limits<float>::infinity() : x[0];
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

ggml_tensor * argmax_columns(ggml_context * ctx, ggml_tensor * logits, bool nan_first_wins) {
    ggml_tensor * args[1] = {logits};
    return ggml_custom_4d(ctx, GGML_TYPE_I32, logits->ne[1], 1, 1, 1, args, 1, run_argmax, GGML_N_TASKS_MAX,
                          nan_first_wins ? nullptr : const_cast<bool *>(&kNanNeverWins));
}

ggml_tensor * argmax_logprob_columns(ggml_context * ctx, ggml_tensor * logits) {
    ggml_tensor * args[1] = {logits};
    return ggml_custom_4d(ctx, GGML_TYPE_I32, 2, logits->ne[1], 1, 1, args, 1, run_argmax, GGML_N_TASKS_MAX,
                          const_cast<bool *>(&kWithLogprob));
}

namespace {

// exp(d) for d <= 0 in float, as chosen_logprob's terms: d clamped to [-87, 0] (e^-87 ~ 1.6e-38: a term that cannot
// move a sum >= 1; a NaN stays NaN), d = k ln2 + r with k = round(d / ln2) (to even) and |r| <= ln2 / 2 (ln2 in two
// parts, so that k ln2 is exact), e^r by its Taylor series to r^7 (the rest < 6e-9 of it: below float's rounding),
// times 2^k from the exponent bits. The SSE2 lanes below do the same operations in the same order.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f, kExpFloor = -87.0f;
constexpr float kTaylor[8] = {1.0f, 1.0f, 1.0f / 2, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

float exp_nonpositive(float d) {
    d = d < kExpFloor ? kExpFloor : d;  // (NaN compares false: stays)
    const float kf = std::nearbyint(d * kLog2e);
    const float r = (d - kf * kLn2Hi) - kf * kLn2Lo;
    float p = kTaylor[7];
    for (int j = 6; j >= 0; --j) p = p * r + kTaylor[j];
    if (std::isnan(p)) return p;
    const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

}  // namespace

float chosen_logprob(const float * x, int64_t n, int64_t at) {
    const float m = x[at];
    if (!std::isfinite(m)) return std::numeric_limits<float>::quiet_NaN();
    // sum of exp(x[i] - m) (each term in float, summed in double: four lanes of doubles, then the tail), in a fixed
    // order: the same bits wherever it runs
    double lane[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = 0;
#if defined(__SSE2__)
    const __m128 vm = _mm_set1_ps(m), floor = _mm_set1_ps(kExpFloor), log2e = _mm_set1_ps(kLog2e);
    const __m128 hi = _mm_set1_ps(kLn2Hi), lo = _mm_set1_ps(kLn2Lo);
    __m128d acc01 = _mm_setzero_pd(), acc23 = _mm_setzero_pd();
    for (; i + 4 <= n; i += 4) {
        const __m128 d = _mm_max_ps(floor, _mm_sub_ps(_mm_loadu_ps(x + i), vm));  // (a NaN lane: NaN)
        const __m128i k = _mm_cvtps_epi32(_mm_mul_ps(d, log2e));  // round to nearest even (MXCSR default)
        const __m128 kf = _mm_cvtepi32_ps(k);
        const __m128 r = _mm_sub_ps(_mm_sub_ps(d, _mm_mul_ps(kf, hi)), _mm_mul_ps(kf, lo));
        __m128 p = _mm_set1_ps(kTaylor[7]);
        for (int j = 6; j >= 0; --j) p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(kTaylor[j]));
        const __m128 e = _mm_mul_ps(p, _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(k, _mm_set1_epi32(127)), 23)));
        acc01 = _mm_add_pd(acc01, _mm_cvtps_pd(e));
        acc23 = _mm_add_pd(acc23, _mm_cvtps_pd(_mm_movehl_ps(e, e)));
    }
    _mm_storeu_pd(lane, acc01);
    _mm_storeu_pd(lane + 2, acc23);
#else
    for (; i + 4 <= n; i += 4) {
        for (int j = 0; j < 4; ++j) lane[j] += static_cast<double>(exp_nonpositive(x[i + j] - m));
    }
#endif
    double sum = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    for (; i < n; ++i) sum += static_cast<double>(exp_nonpositive(x[i] - m));
    return static_cast<float>(-std::log(sum));  // x[at] - m = 0
}

const char * decoder_fused_op(const ggml_tensor * t) {
    const ggml_custom_op_t fun = custom_op_function(t);
    if (!fun) return nullptr;
    if (fun == run_add_rms_norm) return "ADD_RMS_NORM";
    if (fun == run_heads_rms_norm) return "HEADS_RMS_NORM";
    if (fun == run_heads_norm_rope_store) return "HEADS_NORM_ROPE_STORE";
    if (fun == run_store_kv) return "STORE_KV";
    return fun == run_argmax ? "ARGMAX" : nullptr;
}

}  // namespace fun_asr
