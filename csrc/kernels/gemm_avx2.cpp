#include "kernels/gemm_avx2.h"

#include "base/cpu_backend.h"
#include "kernels/dispatch.h"
#include "base/switches.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "kernels/decoder_fused.h"
#include "kernels/gemm_amx.h"
#include "kernels/row_tail.h"
#include "kernels/matvec.h"
#include "kernels/op_params.h"
#include "kernels/q4_k_x8_layout.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FUN_ASR_GEMM_X86 1
#include <immintrin.h>
#else
#define FUN_ASR_GEMM_X86 0
#endif
#include "kernels/avx_vnni.h"

namespace fun_asr {
namespace {

constexpr int64_t kBlock = 32;  // QK8_0
constexpr size_t kBlockBytes = 34;
constexpr int64_t kGroup = 8;  // weight rows per group (one ymm of int32 / float)
constexpr int64_t kScratchBytes = 512;  // one block of 32 of a group's 8 rows, as int16 at most
constexpr int64_t kQ8QuadBlockBytes = 272;  // VNNI Q8_0: a group's block as [quad][row] u8 + 8 fp16 scales
constexpr int64_t kQ6BlockBytes = 352;      // Q6_K: a group's block as [quad][row] u8 + 3 scale vectors

// How a weight type's blocks of 32 reach the kernel: int8 quants and a scale (Q8_0), plus an offset
// (Q4_K), or int16 scale * quant and a scale (Q6_K).
// q8_0_quads: a Q8_0 matrix kept in the quads layout (q8_0_quads_relayout), read in place.
enum class Weights { q8_0, q8_0_quads, q4_k, q6_k };

// What w->extra points at for a matrix kept in that layout (ggml's CPU backend reads a weight's extra only
// in its own repack / AMX buffers; fun-asr's kernels refuse a Q8_0 matrix with any other extra).
const int kQuadsTag = 0;

// The prepared activation: [column][k] int16 quants, then [column][block] float scales d_x, then
// [column][block] d_x * (sum of the block's quants) (for Q4_K's offsets), then [column][k] the quants
// as int8 (Q4_K's / Q6_K's u8 x s8 multiply-adds on AVX2), then [column][block] the quant sums of the
// block's two halves as an int16 pair (Q6_K's -32 offset on AVX2).
struct Layout {
    int64_t nb;
    size_t q_bytes, d_bytes, i8_bytes, bytes;
    Layout(int64_t k, int64_t m)
        : nb(k / kBlock), q_bytes(static_cast<size_t>(m * k) * sizeof(int16_t)),
          d_bytes(static_cast<size_t>(m * nb) * sizeof(float)), i8_bytes(static_cast<size_t>(m * k)),
          bytes(q_bytes + 3 * d_bytes + i8_bytes) {}
};

using RelayoutFn = void (*)(const uint8_t *, size_t, int64_t, int64_t, uint8_t *);
using RowsFn = void (*)(const uint8_t *, size_t, Weights, int64_t, int64_t, int64_t, const int16_t *, const int8_t *,
                        const int32_t *, const float *, const float *, int64_t, const float *, int8_t *, float *,
                        float *, float *, int64_t);

// From how many columns plain AVX2 unpacks a matrix kept in the quads layout into int16 pairs per product
// (gemm_avx2_rows.inc, interleave_q8_0_from_quads) instead of the quads tile's sign step. 3072 x 1024, one Zen 5
// core, ms quads tile / unpacked: 8 columns 0.321 / 0.340, 12 0.477 / 0.470, 16 0.638 / 0.612, 150 5.89 / 4.97.
constexpr int64_t kQuadsUnpackCols = 12;

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own intrinsic headers (see kernels/matvec.cpp); nothing here reads an undefined value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if FUN_ASR_GEMM_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
// One column's Q8_0 blocks (ggml's quantize_row_q8_0 output, nb blocks at q) into prepare_columns' parts: the
// quants as int16 (xq) and int8 (x8), each block's half sums (xh, an int16 pair), its scale (dx) and scale * quant
// sum (sx). The same integers and the same float product as the scalar loop below.
static void prepare_blocks(const uint8_t * q, int64_t nb, int16_t * xq, int8_t * x8, int16_t * xh, float * dx,
                           float * sx) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = q + static_cast<size_t>(b) * kBlockBytes;
        uint16_t h;
        std::memcpy(&h, blk, sizeof h);
        const float d = _cvtsh_ss(h);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(x8 + b * kBlock), v);
        const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
        const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(xq + b * kBlock), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(xq + b * kBlock + 16), hi);
        // the two halves' sums: pairs, then 8 int32 per half, then an add tree (integers: any order)
        const __m256i s = _mm256_hadd_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        // s = lo's pairs 0+1, 2+3, hi's 0+1, 2+3 | lo's 4+5, 6+7, hi's 4+5, 6+7 (of madd's int32 pair sums)
        const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        const __m128i u = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));  // lo, lo, hi, hi
        const int32_t h0 = _mm_cvtsi128_si32(u), h1 = _mm_extract_epi32(u, 2);
        xh[2 * b] = static_cast<int16_t>(h0);  // |.| <= 16 * 127
        xh[2 * b + 1] = static_cast<int16_t>(h1);
        dx[b] = d;
        sx[b] = d * static_cast<float>(h0 + h1);
    }
}

#define FUN_ASR_VNNI 0
#define FUN_ASR_ZMM 0
#include "kernels/gemm_avx2_rows.inc"
#undef FUN_ASR_ZMM
#undef FUN_ASR_VNNI
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#endif
namespace vnni {
#define FUN_ASR_VNNI 1
#define FUN_ASR_ZMM 0
#define FUN_ASR_DPBUSD _mm256_dpbusd_epi32
#define FUN_ASR_DPWSSD _mm256_dpwssd_epi32
#include "kernels/gemm_avx2_rows.inc"
#undef FUN_ASR_DPWSSD
#undef FUN_ASR_DPBUSD
#undef FUN_ASR_ZMM
#undef FUN_ASR_VNNI
}  // namespace vnni
// The same with Q8_0 16 rows to a 512-bit vector (tile_q8_0_quads16; the other types as above).
namespace vnni512 {
#define FUN_ASR_VNNI 1
#define FUN_ASR_ZMM 1
#define FUN_ASR_DPBUSD _mm256_dpbusd_epi32
#define FUN_ASR_DPWSSD _mm256_dpwssd_epi32
#include "kernels/gemm_avx2_rows.inc"
#undef FUN_ASR_DPWSSD
#undef FUN_ASR_DPBUSD
#undef FUN_ASR_ZMM
#undef FUN_ASR_VNNI
}  // namespace vnni512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#if FUN_ASR_AVX_VNNI
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
// AVX-VNNI (Intel's client cores from Alder Lake on: the VNNI dot products in 256-bit VEX form, no AVX-512):
// the VNNI kernels with those encodings (all of them 256-bit, 16 registers are enough for their tiles).
namespace avxvnni {
#define FUN_ASR_VNNI 1
#define FUN_ASR_ZMM 0
#define FUN_ASR_DPBUSD _mm256_dpbusd_avx_epi32
#define FUN_ASR_DPWSSD _mm256_dpwssd_avx_epi32
#include "kernels/gemm_avx2_rows.inc"
#undef FUN_ASR_DPWSSD
#undef FUN_ASR_DPBUSD
#undef FUN_ASR_ZMM
#undef FUN_ASR_VNNI
}  // namespace avxvnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // FUN_ASR_AVX_VNNI
#endif  // FUN_ASR_GEMM_X86
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

struct Choice {
    RowsFn rows = nullptr;
    const char * isa = "";
    RelayoutFn relayout = nullptr;  // Q8_0 into the quads layout (q8_0_quads_relayout)
    int64_t quad_rows = kGroup;     // rows per group of that layout (16 for the 512-bit copy)
    int vector_bits = 256;          // the Q8_0 tiles' vector width
};

const Choice & choice() {
    static const Choice chosen = [] {
        Choice c;
#if FUN_ASR_GEMM_X86
        const std::string & want = switches::value("FUN_ASR_GEMM");
        if (want == "0") return c;
        const bool plain = want == "avx2" || switches::is("FUN_ASR_MATVEC", "avx2");
        const bool vex_vnni = want == "avxvnni" || switches::is("FUN_ASR_MATVEC", "avxvnni");
        const CpuFeatures & cpu = cpu_features();
        const bool has_avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
        const bool has_vnni = has_avx2 && cpu.avx512f && cpu.avx512vl && cpu.avx512bw && cpu.avx512vnni;
        if (has_vnni && !plain && !vex_vnni) {
            // FUN_ASR_ZMM=0: the 256-bit tiles (same bits; for comparisons)
            if (switches::is("FUN_ASR_ZMM", "0")) return Choice{vnni::rows, "avx512vnni", vnni::relayout_q8_0_quads};
            return Choice{vnni512::rows, "avx512vnni", vnni512::relayout_q8_0_quads, 2 * kGroup, 512};
        }
#if FUN_ASR_AVX_VNNI
        if (has_avx2 && cpu.avxvnni && !plain) return Choice{avxvnni::rows, "avxvnni", avxvnni::relayout_q8_0_quads};
#endif
        if (has_avx2) c = {avx2::rows, "avx2", avx2::relayout_q8_0_quads};
#endif
        return c;
    }();
    return chosen;
}

// Columns [c0, c1) of x (F32 [k, m]) into the prepared layout at `out` (Layout(k, m).bytes for all m columns).
// Columns [c0, c1) of the F32 [k, m] activation x (columns xs floats apart) into the prepared layout at out.
void prepare_columns(const float * x, int64_t xs, int64_t k, int64_t m, uint8_t * out, int64_t c0, int64_t c1) {
    const Layout L(k, m);
    auto * xq = reinterpret_cast<int16_t *>(out);
    auto * dx = reinterpret_cast<float *>(out + L.q_bytes);
    auto * sx = reinterpret_cast<float *>(out + L.q_bytes + L.d_bytes);
    auto * x8 = reinterpret_cast<int8_t *>(out + L.q_bytes + 2 * L.d_bytes);
    auto * xh = reinterpret_cast<int16_t *>(out + L.q_bytes + 2 * L.d_bytes + L.i8_bytes);
    const auto from_float = cpu_backend::api().type_traits(GGML_TYPE_Q8_0)->from_float;
    thread_local std::vector<uint8_t> q;
    q.resize(static_cast<size_t>(L.nb) * kBlockBytes);
#if FUN_ASR_GEMM_X86
    static const bool vector = cpu_features().avx2 && cpu_features().f16c;
#else
    constexpr bool vector = false;
#endif
    for (int64_t c = c0; c < c1; ++c) {
        from_float(x + c * xs, q.data(), k);  // ggml's own Q8_0
#if FUN_ASR_GEMM_X86
        if (vector) {
            avx2::prepare_blocks(q.data(), L.nb, xq + c * k, x8 + c * k, xh + 2 * c * L.nb, dx + c * L.nb, sx + c * L.nb);
            continue;
        }
#endif
        for (int64_t b = 0; b < L.nb; ++b) {
            const uint8_t * blk = q.data() + static_cast<size_t>(b) * kBlockBytes;
            uint16_t h;
            std::memcpy(&h, blk, sizeof h);
            const float d = ggml_fp16_to_fp32(h);
            int16_t * out = xq + c * k + b * kBlock;
            std::memcpy(x8 + c * k + b * kBlock, blk + 2, kBlock);
            int32_t half[2];
            for (int h = 0; h < 2; ++h) {
                int32_t s = 0;
                for (int64_t i = 16 * h; i < 16 * h + 16; ++i) {
                    out[i] = static_cast<int8_t>(blk[2 + i]);
                    s += out[i];
                }
                half[h] = s;
            }
            const int32_t sum = half[0] + half[1];
            xh[2 * (c * L.nb + b)] = static_cast<int16_t>(half[0]);  // |.| <= 16 * 127
            xh[2 * (c * L.nb + b) + 1] = static_cast<int16_t>(half[1]);
            dx[c * L.nb + b] = d;
            sx[c * L.nb + b] = d * static_cast<float>(sum);
        }
    }
}

void prepare_columns(const ggml_tensor * x, uint8_t * out, int64_t c0, int64_t c1) {
    const auto xs = static_cast<int64_t>(x->nb[1] / sizeof(float));
    prepare_columns(static_cast<const float *>(x->data), xs, x->ne[0], x->ne[1], out, c0, c1);
}

void prepare_run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const int64_t m = dst->src[0]->ne[1];
    const int64_t per = (m + nth - 1) / nth;
    const int64_t c0 = std::min<int64_t>(m, per * ith), c1 = std::min<int64_t>(m, c0 + per);
    prepare_columns(dst->src[0], static_cast<uint8_t *>(dst->data), c0, c1);
}

// The prepared activation as the tiles read it (every part of Layout(k, m)): an int8_gemm_prepare node's
// output, or, for an F32 activation (int8_gemm_inline / int8_gemm_many with few columns), this thread's own
// preparation of every column: of the node's own input where it computes one (`input`: node_input's, columns k
// floats apart), else of the activation source.
struct Prepared {
    const int16_t * xq;
    const float *xd, *xs;
    const int8_t * x8;
    const int32_t * xh;
    Prepared(const ggml_tensor * act, const Layout & L, int64_t m, const float * input = nullptr) {
        const uint8_t * base = static_cast<const uint8_t *>(act->data);
        if (act->type == GGML_TYPE_F32) {
            thread_local std::vector<uint8_t> own;
            own.resize(L.bytes);
            if (input) {
                prepare_columns(input, act->ne[0], act->ne[0], m, own.data(), 0, m);
            } else {
                prepare_columns(act, own.data(), 0, m);
            }
            base = own.data();
        }
        xq = reinterpret_cast<const int16_t *>(base);
        xd = reinterpret_cast<const float *>(base + L.q_bytes);
        xs = reinterpret_cast<const float *>(base + L.q_bytes + L.d_bytes);
        x8 = reinterpret_cast<const int8_t *>(base + L.q_bytes + 2 * L.d_bytes);
        xh = reinterpret_cast<const int32_t *>(base + L.q_bytes + 2 * L.d_bytes + L.i8_bytes);
    }
};

// Each thread's count of 8-row groups: whole groups of the quads layout (16 rows for the 512-bit copy: a
// matrix in it is read in whole 16-row groups, a plain one is unpacked into them).
int64_t group_share(int64_t groups, int nth) {
    const int64_t unit = choice().quad_rows / kGroup, units = (groups + unit - 1) / unit;
    return (units + nth - 1) / nth * unit;
}

void run(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * prepared = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], m = dst->ne[1];
    // Q8_0 / Q6_K rows past the last whole group (a CTC vocabulary of 60,515) form one more, zero-padded group
    const int64_t full = rows / kGroup, tail = rows - full * kGroup, groups = full + (tail ? 1 : 0);
    const int64_t per = group_share(groups, nth);
    const int64_t g0 = std::min<int64_t>(groups, per * ith), g1 = std::min<int64_t>(groups, g0 + per);
    if (g0 >= g1) return;
    const Layout L(k, m);
    // (a node that computes its own input, kernels/decoder_fused: SwiGLU's, no output of its own)
    const Prepared x(prepared, L, m, node_input(dst, userdata, nullptr, ith, nth));
    const float * bias = dst->src[2] ? static_cast<const float *>(dst->src[2]->data) : nullptr;
    thread_local std::vector<int8_t> wq;
    thread_local std::vector<float> wd, wo;
    // (the 512-bit copy unpacks 32 rows at a time: Q6_K's 4 * kQ6BlockBytes per block is the most)
    wq.resize(static_cast<size_t>(L.nb * std::max({2 * kScratchBytes, 4 * kQ8QuadBlockBytes, 4 * kQ6BlockBytes})));
    wd.resize(static_cast<size_t>(4 * L.nb) * kGroup);  // (the 512-bit copy: 4 groups of Q4_K at a time)
    wo.resize(static_cast<size_t>(4 * L.nb) * kGroup);
    const Weights kind = w->type == GGML_TYPE_Q4_K   ? Weights::q4_k
                         : w->type == GGML_TYPE_Q6_K ? Weights::q6_k
                         : is_q8_0_quads(w)          ? Weights::q8_0_quads
                                                     : Weights::q8_0;
    const auto * wdata = static_cast<const uint8_t *>(w->data);
    auto * y = static_cast<float *>(dst->data);
    const auto ys = static_cast<int64_t>(dst->nb[1] / sizeof(float));
    const size_t rb = w->nb[1];
    const int64_t g1_full = std::min(g1, full);
    if (g0 < g1_full) {
        choice().rows(wdata, rb, kind, g0, g1_full, L.nb, x.xq, x.x8, x.xh, x.xd, x.xs, m, bias, wq.data(), wd.data(),
                      wo.data(), y, ys);
    }
    if (g1 > full) {  // the partial group: its own zero-padded 8-row group (kernels/row_tail.h)
        padded_tail_rows(wdata, rb, full * kGroup, tail, kGroup, bias, m, y, ys,
                         [&](const uint8_t * wg, const float * bg, float * yg, int64_t ygs) {
                             choice().rows(wg, rb, kind, 0, 1, L.nb, x.xq, x.x8, x.xh, x.xd, x.xs, m, bg, wq.data(),
                                           wd.data(), wo.data(), yg, ygs);
                         });
    }
}

// int8_gemm_many: sources w0, the activation (I16 prepared, or F32: prepared here by every thread), w1, w2 ...
// (matrices in the quads layout, the same k). The threads split the matrices' row groups taken together.
void run_many(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * act = dst->src[1];
    const ggml_tensor * ws[GGML_MAX_SRC] = {dst->src[0]};  // (no allocation: this runs per node and thread)
    int n = 1;
    for (int i = 2; i < GGML_MAX_SRC && dst->src[i]; ++i) ws[n++] = dst->src[i];
    int64_t groups = 0, rows = 0;
    for (int i = 0; i < n; ++i) {
        groups += ws[i]->ne[1] / kGroup;
        rows += ws[i]->ne[1];
    }
    // (a prepared activation is a flat I16 buffer; the output is flat too, a node's own input's sum block last)
    const int64_t k = ws[0]->ne[0], m = act->type == GGML_TYPE_F32 ? act->ne[1] : dst->ne[0] / rows;
    auto * y = static_cast<float *>(dst->data);
    // A node that computes its own input (kernels/decoder_fused): every thread, also one without rows here (the
    // residual sum's block after the products' is written by the threads' shares of its columns).
    const float * input = node_input(dst, userdata, y + rows * m, ith, nth);
    const int64_t per = group_share(groups, nth);
    const int64_t t0 = std::min<int64_t>(groups, per * ith), t1 = std::min<int64_t>(groups, t0 + per);
    if (t0 >= t1) return;
    const Layout L(k, m);
    const Prepared x(act, L, m, input);
    // scratch for the copy that unpacks the groups per product (plain AVX2 from kQuadsUnpackCols columns: int16
    // pairs); the others read the layout in place (kept sized, no allocation after a thread's first node)
    thread_local std::vector<int8_t> wq;
    thread_local std::vector<float> wd;
    wq.resize(static_cast<size_t>(L.nb * 2 * kScratchBytes));
    wd.resize(static_cast<size_t>(2 * L.nb) * kGroup);
    int64_t first = 0;  // the current matrix's first group in the joint numbering
    for (int i = 0; i < n; ++i) {
        const ggml_tensor * w = ws[i];
        const int64_t g = w->ne[1] / kGroup, a = std::max(t0, first), b = std::min(t1, first + g);
        if (a < b) {  // its groups [a - first, b - first), its output block [rows, m] at y
            choice().rows(static_cast<const uint8_t *>(w->data), w->nb[1], Weights::q8_0_quads, a - first, b - first, L.nb,
                          x.xq, x.x8, x.xh, x.xd, x.xs, m, nullptr, wq.data(), wd.data(), nullptr, y, w->ne[1]);
        }
        y += w->ne[1] * m;
        first += g;
    }
}

}  // namespace

const char * int8_gemm_isa() { return choice().isa; }

int int8_gemm_vector_bits() { return choice().rows ? choice().vector_bits : 0; }

ggml_tensor * int8_gemm_many(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                             ggml_tensor * prepared, const ProductInput * input) {
    ggml_tensor * args[GGML_MAX_SRC] = {};
    args[0] = ws[0];
    args[1] = is_int8_gemm_prepare(prepared) ? prepared : x;
    int64_t rows = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        rows += ws[i]->ne[1];
        if (i > 0) args[i + 1] = ws[i];
    }
    int n_args = static_cast<int>(ws.size()) + 1;
    void * userdata = nullptr;
    if (input && args[1] == x) {  // (the caller asks for no prepared activation with an input of the node's own)
        userdata = node_input_args(*input, args);
        n_args = kNodeInputSrc + 2;
        if (input->kind == NodeInput::add_rms_norm && input->sum) rows += x->ne[0];  // the sum's block
    }
    return ggml_custom_4d(ctx, GGML_TYPE_F32, rows * x->ne[1], 1, 1, 1, args, n_args, run_many, GGML_N_TASKS_MAX,
                          userdata);
}

bool int8_gemm_many_supported(const std::vector<ggml_tensor *> & ws, const ggml_tensor * x) {
    // (the matrices in src[0], src[2] ... before the sources of a node's own input, kernels/decoder_fused)
    if (ws.size() < 2 || ws.size() + 1 > kNodeInputSrc) return false;
    for (const ggml_tensor * w : ws) {
        if (!is_q8_0_quads(w) || w->ne[0] != ws[0]->ne[0] || !int8_gemm_supported(w, x)) return false;
    }
    return true;
}

bool q8_0_quads_wanted() {
    static const bool on = [] {
        // (FUN_ASR_MATVEC=0, ggml's products for the decode steps, keeps the plain layout too)
        return choice().relayout != nullptr && !amx_available() && matvec_isa()[0] != '\0' &&
               !switches::is("FUN_ASR_Q8_QUADS", "0");
    }();
    return on;
}

bool q8_0_quads_fits(const ggml_tensor * w) {
    return w && w->type == GGML_TYPE_Q8_0 && ggml_n_dims(w) == 2 && w->ne[0] % kBlock == 0 && w->ne[1] % choice().quad_rows == 0;
}

void q8_0_quads_relayout(const ggml_tensor * w, const void * src, void * dst) {
    choice().relayout(static_cast<const uint8_t *>(src), w->nb[1], w->ne[1], w->ne[0] / kBlock, static_cast<uint8_t *>(dst));
}

namespace {

// Rows ids[i] of a matrix in the layout, dequantized as ggml's get_rows does (q * d, d fp16 -> fp32).
void quads_get_rows_run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * ids = dst->src[1];
    const int64_t k = w->ne[0], nb = k / kBlock, n = ids->ne[0];
    const auto * base = static_cast<const uint8_t *>(w->data);
    for (int64_t i = ith; i < n; i += nth) {
        int32_t r;
        std::memcpy(&r, static_cast<const uint8_t *>(ids->data) + i * ids->nb[0], sizeof r);
        float * y = reinterpret_cast<float *>(static_cast<uint8_t *>(dst->data) + i * dst->nb[1]);
        if (r < 0 || r >= w->ne[1]) {  // callers check token ids first; never read outside the matrix
            std::fill(y, y + k, 0.0f);
            continue;
        }
        // the layout's groups of R rows: per block R rows' quads [quad][row] (4 bytes each), then their scales
        const int64_t R = choice().quad_rows, block_bytes = R * kQ8QuadBlockBytes / kGroup;
        const uint8_t * group = base + static_cast<size_t>(r / R) * static_cast<size_t>(nb * block_bytes);
        const int64_t lane = r % R;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t * blk = group + b * block_bytes;
            uint16_t h;
            std::memcpy(&h, blk + 32 * R + 2 * lane, sizeof h);
            const float d = ggml_fp16_to_fp32(h);
            for (int64_t q = 0; q < 8; ++q) {
                for (int64_t j = 0; j < 4; ++j) {
                    const auto v = static_cast<int8_t>(blk[4 * R * q + 4 * lane + j] ^ 0x80);
                    y[b * kBlock + 4 * q + j] = static_cast<float>(v) * d;
                }
            }
        }
    }
}

}  // namespace

ggml_tensor * q8_0_quads_get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids) {
    ggml_tensor * args[2] = {w, ids};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[0], ids->ne[0], 1, 1, args, 2, quads_get_rows_run, GGML_N_TASKS_MAX,
                          nullptr);
}

void mark_q8_0_quads(ggml_tensor * w) { w->extra = const_cast<int *>(&kQuadsTag); }

bool is_q8_0_quads(const ggml_tensor * w) {
    const ggml_tensor * base = w && w->view_src ? w->view_src : w;
    return base && base->type == GGML_TYPE_Q8_0 && base->extra == &kQuadsTag;
}

bool int8_gemm_supported(const ggml_tensor * w, const ggml_tensor * x) {
    if (!w || !x || x->type != GGML_TYPE_F32 || !choice().rows || !w->buffer || w->view_src) return false;
    if (w->type == GGML_TYPE_Q8_0 || w->type == GGML_TYPE_Q6_K) {
        if (!ggml_backend_buffer_is_host(w->buffer) || (w->extra != nullptr && !is_q8_0_quads(w))) return false;
    } else if (w->type == GGML_TYPE_Q4_K) {
        // ggml's repacked 8-row layout only (what its CPU backend makes of Q4_K on AVX2 CPUs)
        if (!weight_is_repacked(w) || w->extra == nullptr) return false;
    } else {
        return false;
    }
    if (!ggml_is_contiguous(w) || w->ne[2] != 1 || w->ne[3] != 1) return false;
    // Q8_0 / Q6_K take any row count (a last partial group is zero-padded); Q4_K's repacked groups are whole
    if ((w->type == GGML_TYPE_Q4_K && w->ne[1] % kGroup != 0) || w->ne[0] % kBlock != 0) return false;
    if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
    return x->ne[1] >= 1;
}

ggml_tensor * int8_gemm_prepare(ggml_context * ctx, ggml_tensor * x) {
    // Its own node: the threads split the columns; the node boundary is the barrier before the
    // products, which split the weight rows.
    const Layout L(x->ne[0], x->ne[1]);
    ggml_tensor * xa[1] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_I16, static_cast<int64_t>(L.bytes / sizeof(int16_t)), 1, 1, 1, xa, 1,
                          prepare_run, GGML_N_TASKS_MAX, nullptr);
}

bool int8_gemm_bias_supported(const ggml_tensor * w, const ggml_tensor * b) {
    return amx_bias_supported(w, b);  // the same bias the AMX kernel adds in its product
}

ggml_tensor * int8_gemm(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared, ggml_tensor * bias) {
    if (!prepared) prepared = int8_gemm_prepare(ctx, x);
    ggml_tensor * args[3] = {w, prepared, bias};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, bias ? 3 : 2, run, GGML_N_TASKS_MAX,
                          nullptr);
}

ggml_tensor * int8_gemm_inline(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const ProductInput * input) {
    ggml_tensor * args[GGML_MAX_SRC] = {w, x};
    void * userdata = input ? node_input_args(*input, args) : nullptr;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, input ? kNodeInputSrc + 2 : 2, run,
                          GGML_N_TASKS_MAX, userdata);
}

bool is_int8_gemm(const ggml_tensor * t) {
    // The product node: a custom op on a Q8_0 / Q4_K / Q6_K matrix and an I16 prepared activation, or on a
    // matrix in the quads layout and the F32 activation itself (int8_gemm_inline).
    return t && t->op == GGML_OP_CUSTOM && t->src[0] && t->src[1] &&
           (t->src[0]->type == GGML_TYPE_Q8_0 || t->src[0]->type == GGML_TYPE_Q4_K ||
            t->src[0]->type == GGML_TYPE_Q6_K) &&
           (t->src[1]->type == GGML_TYPE_I16 || (t->src[1]->type == GGML_TYPE_F32 && is_q8_0_quads(t->src[0]))) &&
           (t->ne[0] == t->src[0]->ne[1] || is_int8_gemm_many(t));
}

bool is_int8_gemm_many(const ggml_tensor * t) {
    const ggml_custom_op_t fun = custom_op_function(t);
    return fun && fun == run_many;
}

bool is_int8_gemm_prepare(const ggml_tensor * t) {
    return t && t->op == GGML_OP_CUSTOM && t->type == GGML_TYPE_I16 && t->src[0] && t->src[0]->type == GGML_TYPE_F32 &&
           !t->src[1];
}

}  // namespace fun_asr
