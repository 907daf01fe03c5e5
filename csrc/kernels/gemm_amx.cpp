#include "kernels/gemm_amx.h"

#include "base/cpu_backend.h"
#include "kernels/dispatch.h"
#include "base/switches.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "kernels/matvec.h"
#include "kernels/q4_k_x8_layout.h"
#include "kernels/row_tail.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define FUN_ASR_AMX_BUILD 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define FUN_ASR_AMX_BUILD 0
#endif

namespace fun_asr {
namespace {

constexpr int64_t kBlock = 32;    // QK8_0
constexpr size_t kBlockBytes = 34;
constexpr int kTile = 16;         // rows and columns per tile
constexpr size_t kBTileBytes = 512;  // one block (32 k) x 16 columns, VNNI layout: 8 rows of 64 bytes

// The activation, prepared once per product by its own graph node (threads split the columns):
// [column tile][block] 512-byte B tiles (32 k x 16 columns; int32 (r, j) = quants 4r..4r+3 of
// column j), then [block][padded column] float scales d_x, then [block][padded column] d_x * (sum of
// the block's quants) for Q4_K's offsets (0 for padding columns), as the int8 GEMM computes them.
struct Layout {
    int64_t nb, mp, nct;
    size_t b_bytes, d_bytes, bytes;
    Layout(int64_t k, int64_t m)
        : nb(k / kBlock), mp((m + kTile - 1) / kTile * kTile), nct(mp / kTile),
          b_bytes(static_cast<size_t>(nct * nb) * kBTileBytes), d_bytes(static_cast<size_t>(nb * mp) * sizeof(float)),
          bytes(b_bytes + 2 * d_bytes) {}
};

void prepare_run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const int64_t k = x->ne[0], m = x->ne[1];
    const Layout L(k, m);
    uint8_t * base = static_cast<uint8_t *>(dst->data);
    float * dx = reinterpret_cast<float *>(base + L.b_bytes);
    float * sx = reinterpret_cast<float *>(base + L.b_bytes + L.d_bytes);
    const int64_t xs = static_cast<int64_t>(x->nb[1] / sizeof(float));
    const auto from_float = cpu_backend::api().type_traits(GGML_TYPE_Q8_0)->from_float;
    thread_local std::vector<uint8_t> q;
    q.resize(static_cast<size_t>(L.nb) * kBlockBytes);
    // Columns (padding included) split among the threads.
    const int64_t per = (L.mp + nth - 1) / nth;
    const int64_t c0 = std::min<int64_t>(L.mp, per * ith), c1 = std::min<int64_t>(L.mp, c0 + per);
    for (int64_t c = c0; c < c1; ++c) {
        const int64_t ct = c / kTile, j = c % kTile;
        if (c < m) from_float(static_cast<const float *>(x->data) + c * xs, q.data(), k);  // ggml's own Q8_0
        for (int64_t b = 0; b < L.nb; ++b) {
            const uint8_t * blk = q.data() + static_cast<size_t>(b) * kBlockBytes;
            float d = 0.0f;
            int32_t sum = 0;
            if (c < m) {
                uint16_t h;
                std::memcpy(&h, blk, sizeof h);
                d = ggml_fp16_to_fp32(h);
                for (int i = 0; i < kBlock; ++i) sum += static_cast<int8_t>(blk[2 + i]);
            }
            dx[b * L.mp + c] = d;
            sx[b * L.mp + c] = d * static_cast<float>(sum);
            uint8_t * t = base + static_cast<size_t>(ct * L.nb + b) * kBTileBytes;
            for (int r = 0; r < kBlock / 4; ++r) {
                uint32_t v = 0;
                if (c < m) std::memcpy(&v, blk + 2 + 4 * r, 4);
                std::memcpy(t + 64 * r + 4 * j, &v, 4);
            }
        }
    }
}

#if FUN_ASR_AMX_BUILD
struct TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed));

bool request_amx() {
    const CpuFeatures & cpu = cpu_features();
    if (!cpu.avx512f || !cpu.avx512bw || !cpu.avx512vl || !cpu.f16c || !cpu.fma) {
        return false;
    }
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    if (!amx_tile || !amx_int8) return false;
    // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own intrinsic headers: _mm256/_mm512_undefined_*() are written as a
// self-initialised value (`__m512i __Y = __Y;`), which -W(maybe-)uninitialized flags once the
// intrinsics are inlined into our kernels. Nothing here reads an undefined value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,amx-tile,amx-int8"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,amx-tile,amx-int8")
#endif

// One block's 16 x 16 int32 products into cbuf: tiles C, A (16 weight rows x one block of quants, read
// with the row stride `as`) and B (the prepared activation tile); DOT is dpbssd (Q8_0: int8 x int8) or
// dpbusd (Q4_K: quants 0..15 as uint8 x int8). A macro: the tile intrinsics take the register numbers
// as literal text.
#define FUN_ASR_AMX_BLOCK(DOT, C, A, B, a, as, b, cbuf) \
    do {                                                 \
        _tile_zero(C);                                   \
        _tile_loadd(A, (a), static_cast<long>(as));      \
        _tile_loadd(B, (b), 64);                         \
        _tile_##DOT(C, A, B);                            \
        _tile_stored(C, (cbuf), 64);                     \
    } while (0)

// The prepared columns (nb blocks each; prepare_frames' layout) and the product's output: m columns, column j
// of y at y + j * ys; bias: one float per weight row, or null.
struct AmxColumns {
    const uint8_t * prepared;
    int64_t m, nb;
    const float * bias;
    float * y;
    int64_t ys;
};

// One row tile's weights as amx_row_tile reads them (see there).
struct AmxRowTile {
    const uint8_t * a;  // the quants
    size_t as, ab;      // row and block strides of a
    const float * dw;   // scales
    int64_t dsi, dsb;   // row and block strides of dw (and wo)
    const float * wo;   // Q4_K offsets, or null
    const uint8_t * pf; // the next row tile's bytes to prefetch, or null
    size_t pf_share;
};

// 16 weight rows (one row tile) times every prepared column -> y (rows r0..r0+15 of each column).
// a: the rows' quants (block b of row i at a + i * as + b * ab); dw / wo: [row][block] scale and
// (Q4_K) offset as floats. Per element, as the int8 GEMM (kernels/gemm_avx2.h) computes it:
// acc += float(dot) * (d_w * d_x), then for Q4_K acc -= offset * (d_x * sum of the quants), blocks in
// order, + bias last. Software-pipelined: the tile unit computes block b + 1 (tiles 3-5) while the
// vector unit scales block b's integers (tiles 0-2 wrote them), so neither waits for the other.
// dw's element (row i, block b) is dw[i * dsi + b * dsb]. pf / pf_share: while the first column tile
// runs, pf_share bytes from pf + b * pf_share are prefetched into L2 per block (the next row tile, for a
// decode step's few columns, where the weights stream from memory once); pf null: none.
template <bool kQ4K>
static inline void amx_row_tile(const AmxRowTile & tile, const AmxColumns & cols_in, int64_t r0) {
    const uint8_t * a = tile.a;
    const size_t as = tile.as, ab = tile.ab;
    const float *dw = tile.dw, *wo = tile.wo;
    const int64_t dsi = tile.dsi, dsb = tile.dsb;
    const uint8_t * pf = tile.pf;
    const size_t pf_share = tile.pf_share;
    const uint8_t * prepared = cols_in.prepared;
    const int64_t m = cols_in.m, nb = cols_in.nb, ys = cols_in.ys;
    const float * bias = cols_in.bias;
    float * y = cols_in.y;
    const int64_t mp = (m + kTile - 1) / kTile * kTile, nct = mp / kTile;
    const float * pdx = reinterpret_cast<const float *>(prepared + static_cast<size_t>(nct * nb) * kBTileBytes);
    const float * psx = pdx + nb * mp;
    alignas(64) int32_t cbuf[2][kTile * kTile];
    alignas(64) float out[kTile][kTile];
    for (int64_t ct = 0; ct < nct; ++ct) {
        const uint8_t * bt = prepared + static_cast<size_t>(ct * nb) * kBTileBytes;
        __m512 acc[kTile];
        for (int i = 0; i < kTile; ++i) acc[i] = _mm512_setzero_ps();
        if constexpr (kQ4K) {
            FUN_ASR_AMX_BLOCK(dpbusd, 0, 1, 2, a, as, bt, cbuf[0]);
        } else {
            FUN_ASR_AMX_BLOCK(dpbssd, 0, 1, 2, a, as, bt, cbuf[0]);
        }
        for (int64_t b = 0; b < nb; ++b) {
            if (pf && ct == 0) {
                for (size_t p = static_cast<size_t>(b) * pf_share; p < static_cast<size_t>(b + 1) * pf_share; p += 64) {
                    _mm_prefetch(reinterpret_cast<const char *>(pf + p), _MM_HINT_T1);
                }
            }
            if (b + 1 < nb) {
                const uint8_t * an = a + static_cast<size_t>(b + 1) * ab;
                const uint8_t * bn = bt + static_cast<size_t>(b + 1) * kBTileBytes;
                if constexpr (kQ4K) {
                    if ((b + 1) & 1) FUN_ASR_AMX_BLOCK(dpbusd, 3, 4, 5, an, as, bn, cbuf[1]);
                    else FUN_ASR_AMX_BLOCK(dpbusd, 0, 1, 2, an, as, bn, cbuf[0]);
                } else {
                    if ((b + 1) & 1) FUN_ASR_AMX_BLOCK(dpbssd, 3, 4, 5, an, as, bn, cbuf[1]);
                    else FUN_ASR_AMX_BLOCK(dpbssd, 0, 1, 2, an, as, bn, cbuf[0]);
                }
            }
            const int32_t * cb = cbuf[b & 1];
            const __m512 dxv = _mm512_loadu_ps(pdx + b * mp + ct * kTile);
            for (int i = 0; i < kTile; ++i) {
                const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dw[i * dsi + b * dsb]), dxv);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + i * kTile)), s, acc[i]);
            }
            if constexpr (kQ4K) {
                const __m512 sxv = _mm512_loadu_ps(psx + b * mp + ct * kTile);
                for (int i = 0; i < kTile; ++i) acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(wo[i * dsi + b * dsb]), sxv, acc[i]);
            }
        }
        for (int i = 0; i < kTile; ++i) {
            // + bias as its own rounding step, the same float add as a separate ggml_add
            _mm512_store_ps(out[i], bias ? _mm512_add_ps(acc[i], _mm512_set1_ps(bias[r0 + i])) : acc[i]);
        }
        const int64_t cols = m - ct * kTile < kTile ? m - ct * kTile : kTile;
        for (int64_t j = 0; j < cols; ++j) {
            float * dst = y + (ct * kTile + j) * ys + r0;
            for (int i = 0; i < kTile; ++i) dst[i] = out[i][j];
        }
    }
}

static void configure_tiles() {
    TileConfig cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int s = 0; s < 2; ++s) {
        cfg.rows[3 * s + 0] = kTile; cfg.colsb[3 * s + 0] = 64;  // C: 16 x 16 int32
        cfg.rows[3 * s + 1] = kTile; cfg.colsb[3 * s + 1] = 32;  // A: 16 rows x one block of quants
        cfg.rows[3 * s + 2] = 8;     cfg.colsb[3 * s + 2] = 64;  // B: 32 k x 16 columns, 4 k per int32
    }
    _tile_loadconfig(&cfg);
}

// Rows [t0 * 16, t1 * 16) of W (Q8_0, rb bytes per row, read in place) times every prepared column -> y.
// dw: scratch for 16 x nb floats (allocated by the caller: no std:: containers in this region).
static void amx_rows_q8_0(const uint8_t * w, size_t rb, int64_t t0, int64_t t1, const AmxColumns & c, float * dw) {
    configure_tiles();
    const int64_t m = c.m, nb = c.nb;
    // a block's 16 row scales in one gather (fp16 at row i * rb of the block): dw is [block][row]
    const __m512i off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(static_cast<int>(rb)));
    // Few columns (a decode step): the weights stream from memory once, so the next row tile is prefetched.
    const bool stream = m <= kTile;
    const size_t share = (kTile * rb + static_cast<size_t>(nb) - 1) / static_cast<size_t>(nb);
    for (int64_t t = t0; t < t1; ++t) {
        const uint8_t * wt = w + static_cast<size_t>(t * kTile) * rb;
        for (int64_t b = 0; b < nb; ++b) {
            const __m512i d32 = _mm512_i32gather_epi32(off, wt + static_cast<size_t>(b) * kBlockBytes, 1);
            _mm512_storeu_ps(dw + b * kTile, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32)));
        }
        const AmxRowTile tile{wt + 2, rb, kBlockBytes, dw, 1, kTile, nullptr, stream ? wt + kTile * rb : nullptr, share};
        amx_row_tile<false>(tile, c, t * kTile);
    }
    _tile_release();
}

// Rows [t0 * 16, t1 * 16) of W (Q4_K in ggml's repacked 8-row layout, kernels/q4_k_x8_layout.h: row
// tile t = groups 2t, 2t + 1) times every prepared column -> y. Each row tile is unpacked once into
// the scratch (q: 16 rows x k quants 0..15; dw / wo: 16 x nb floats d * scale, dmin * min, the float
// products of ggml's dequantization and of the int8 GEMM) and then multiplied by every column tile.
static void amx_rows_q4_k(const uint8_t * w, int64_t t0, int64_t t1, const AmxColumns & c, uint8_t * q, float * dw,
                          float * wo) {
    configure_tiles();
    const int64_t nb = c.nb;
    const int64_t nsb = nb / 8, k = nb * kBlock;
    for (int64_t t = t0; t < t1; ++t) {
        for (int gi = 0; gi < 2; ++gi) {
            const uint8_t * grp = w + static_cast<size_t>((2 * t + gi) * nsb) * kQ4KX8Bytes;
            for (int64_t sb = 0; sb < nsb; ++sb) {
                const uint8_t * blk = grp + static_cast<size_t>(sb) * kQ4KX8Bytes;
                alignas(16) uint8_t sc[8][8], mn[8][8];
                q4_k_x8_scales(blk, sc, mn);
                for (int r = 0; r < 8; ++r) {
                    const int64_t row = 8 * gi + r;
                    uint16_t hd, hm;
                    std::memcpy(&hd, blk + 2 * r, sizeof hd);
                    std::memcpy(&hm, blk + 16 + 2 * r, sizeof hm);
                    const float d = _cvtsh_ss(hd), dmin = _cvtsh_ss(hm);
                    for (int sub = 0; sub < 8; ++sub) {
                        dw[row * nb + sb * 8 + sub] = d * static_cast<float>(sc[sub][r]);
                        wo[row * nb + sb * 8 + sub] = dmin * static_cast<float>(mn[sub][r]);
                    }
                    // chunk ch = 4j + q4: 8 bytes of each row; low nibbles weights 64j + 8q4.., high 64j + 32 + 8q4..
                    uint8_t * qr = q + row * k + sb * 256;
                    for (int ch = 0; ch < 16; ++ch) {
                        const int j = ch / 4, q4 = ch % 4;
                        uint64_t v;
                        std::memcpy(&v, blk + 128 + 64 * ch + 8 * r, sizeof v);
                        const uint64_t lo = v & 0x0F0F0F0F0F0F0F0Full, hi = (v >> 4) & 0x0F0F0F0F0F0F0F0Full;
                        std::memcpy(qr + 64 * j + 8 * q4, &lo, sizeof lo);
                        std::memcpy(qr + 64 * j + 32 + 8 * q4, &hi, sizeof hi);
                    }
                }
            }
        }
        const AmxRowTile tile{q, static_cast<size_t>(k), kBlock, dw, nb, 1, wo, nullptr, 0};
        amx_row_tile<true>(tile, c, t * kTile);
    }
    _tile_release();
}
#undef FUN_ASR_AMX_BLOCK

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // FUN_ASR_AMX_BUILD

void run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
#if FUN_ASR_AMX_BUILD
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * prepared = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], m = dst->ne[1];
    // Q8_0 rows past the last whole tile (a CTC vocabulary of 60,515) form one more, zero-padded tile
    const int64_t full = rows / kTile, tail = rows - full * kTile;
    const int64_t tiles = full + (tail ? 1 : 0), per = (tiles + nth - 1) / nth;
    const int64_t t0 = std::min<int64_t>(tiles, per * ith), t1 = std::min<int64_t>(tiles, t0 + per);
    if (t0 >= t1) return;
    const float * bias = dst->src[2] ? static_cast<const float *>(dst->src[2]->data) : nullptr;
    const int64_t nb = k / kBlock;
    thread_local std::vector<float> dw, wo;
    thread_local std::vector<uint8_t> q;
    dw.resize(static_cast<size_t>(kTile * nb));
    const auto * wdata = static_cast<const uint8_t *>(w->data);
    const auto * pdata = static_cast<const uint8_t *>(prepared->data);
    auto * y = static_cast<float *>(dst->data);
    const auto ys = static_cast<int64_t>(dst->nb[1] / sizeof(float));
    if (w->type == GGML_TYPE_Q4_K) {
        wo.resize(static_cast<size_t>(kTile * nb));
        q.resize(static_cast<size_t>(kTile * k));
        amx_rows_q4_k(wdata, t0, t1, AmxColumns{pdata, m, nb, bias, y, ys}, q.data(), dw.data(), wo.data());
    } else {
        const size_t rb = w->nb[1];
        const int64_t t1_full = std::min(t1, full);
        if (t0 < t1_full) amx_rows_q8_0(wdata, rb, t0, t1_full, AmxColumns{pdata, m, nb, bias, y, ys}, dw.data());
        if (t1 > full) {  // the partial tile: its own zero-padded 16-row tile (kernels/row_tail.h)
            padded_tail_rows(wdata, rb, full * kTile, tail, kTile, bias, m, y, ys,
                             [&](const uint8_t * wt, const float * bt, float * yt, int64_t yts) {
                                 amx_rows_q8_0(wt, rb, 0, 1, AmxColumns{pdata, m, nb, bt, yt, yts}, dw.data());
                             });
        }
    }
#else
    (void)dst; (void)ith; (void)nth;
#endif
}

}  // namespace

bool amx_available() {
#if FUN_ASR_AMX_BUILD
    static const bool ok = [] {
        if (switches::is("FUN_ASR_AMX", "0")) return false;
        return request_amx();
    }();
    return ok;
#else
    return false;
#endif
}

bool amx_gemm_supported(const ggml_tensor * w, const ggml_tensor * x) {
    if (!w || !x || x->type != GGML_TYPE_F32 || !w->buffer || !amx_available()) return false;
    if (w->type == GGML_TYPE_Q8_0) {
        if (!ggml_backend_buffer_is_host(w->buffer) || w->extra != nullptr) return false;
    } else if (w->type == GGML_TYPE_Q4_K) {
        // ggml's repacked 8-row layout only (what its CPU backend makes of Q4_K on x86)
        if (w->view_src || !weight_is_repacked(w) || w->extra == nullptr || w->ne[0] % 256 != 0) return false;
    } else {
        return false;
    }
    if (!ggml_is_contiguous(w) || w->ne[2] != 1 || w->ne[3] != 1) return false;
    // Q8_0 takes any row count (a last partial tile is zero-padded); Q4_K's repacked groups come in whole tiles
    if ((w->type != GGML_TYPE_Q8_0 && w->ne[1] % kTile != 0) || w->ne[0] % kBlock != 0) return false;
    if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
    return x->ne[1] >= 1;
}

ggml_tensor * amx_prepare(ggml_context * ctx, ggml_tensor * x) {
    // Its own node: the threads split the columns; the node boundary is the barrier before the
    // products, which split the weight rows. One prepared activation can feed several products.
    const Layout L(x->ne[0], x->ne[1]);
    ggml_tensor * xa[1] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_I8, static_cast<int64_t>(L.bytes), 1, 1, 1, xa, 1, prepare_run,
                          GGML_N_TASKS_MAX, nullptr);
}

bool amx_bias_supported(const ggml_tensor * w, const ggml_tensor * b) {
    return b == nullptr || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w->ne[1] &&
                            b->buffer && ggml_backend_buffer_is_host(b->buffer));
}

ggml_tensor * amx_gemm(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared, ggml_tensor * bias) {
    if (!prepared) prepared = amx_prepare(ctx, x);
    ggml_tensor * args[3] = {w, prepared, bias};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, bias ? 3 : 2, run, GGML_N_TASKS_MAX,
                          nullptr);
}

bool is_amx_gemm(const ggml_tensor * t) {
    // The product node: a custom op on a Q8_0 or Q4_K matrix and an I8 prepared activation.
    return t && t->op == GGML_OP_CUSTOM && t->src[0] && t->src[1] &&
           (t->src[0]->type == GGML_TYPE_Q8_0 || t->src[0]->type == GGML_TYPE_Q4_K) &&
           t->src[1]->type == GGML_TYPE_I8 && t->ne[0] == t->src[0]->ne[1] && amx_available();
}

bool is_amx_prepare(const ggml_tensor * t) {
    return t && t->op == GGML_OP_CUSTOM && t->type == GGML_TYPE_I8 && t->src[0] && t->src[0]->type == GGML_TYPE_F32 &&
           !t->src[1] && amx_available();
}

}  // namespace fun_asr

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
