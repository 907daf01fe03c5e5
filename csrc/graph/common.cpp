#include "graph/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <tuple>


#include "kernels/attention.h"
#include "kernels/decoder_fused.h"
#include "kernels/fsmn_memory.h"
#include "kernels/fused_add.h"
#include "kernels/gemm_amx.h"
#include "kernels/gemm_avx2.h"
#include "kernels/matvec.h"
#include "kernels/op_params.h"

namespace fun_asr {

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, const Norm & n, float eps) {
    if (n.b && layer_norm_fusion_available() && fused_add_supported(x, n.b) && fused_add_supported(x, n.w) &&
        eps >= 0.0f) {
        return layer_norm_scale_shift(ctx, x, n.w, n.b, eps);
    }
    x = ggml_norm(ctx, x, eps);
    if (n.b && fused_add_supported(x, n.b) && fused_add_supported(x, n.w)) return scale_shift(ctx, x, n.w, n.b);
    x = ggml_mul(ctx, x, n.w);
    return n.b ? ggml_add(ctx, x, n.b) : x;
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

namespace {

// A matrix kept in the int8 GEMM's quads layout (kernels/gemm_avx2.h) goes through that kernel whatever the
// column count: nothing else reads the layout.
ggml_tensor * quads_product(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared) {
    if (!int8_gemm_supported(w, x)) {
        throw std::invalid_argument(std::string("matrix '") + ggml_get_name(w) + "' is kept in the int8 GEMM's layout, "
                                    "which does not take this product");
    }
    return int8_gemm(ctx, w, x, is_int8_gemm_prepare(prepared) ? prepared : nullptr);
}

}  // namespace

ggml_tensor * get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids) {
    return is_q8_0_quads(w) ? q8_0_quads_get_rows(ctx, w, ids) : ggml_get_rows(ctx, w, ids);
}

ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    if (is_q8_0_quads(w)) return quads_product(ctx, w, x, nullptr);
    return matvec_supported(w, x) ? matvec(ctx, w, x) : ggml_mul_mat(ctx, w, x);
}

namespace {

// Whether a decode step's product of w and x takes the VNNI int8 GEMM (below).
bool step_takes_vnni_gemm(const ggml_tensor * w, const ggml_tensor * x) {
    constexpr int64_t kVnniStepCols = 3;
    static const bool vnni = !amx_available() && (std::strcmp(int8_gemm_isa(), "avx512vnni") == 0 ||
                                                  std::strcmp(int8_gemm_isa(), "avxvnni") == 0);
    return vnni && w->type == GGML_TYPE_Q8_0 && x->ne[1] >= kVnniStepCols && matvec_step_supported(w, x) &&
           int8_gemm_supported(w, x);
}

// Whether a decode step's product of w and x takes the AMX GEMM (Q8_0 from 8 columns; see mul_mat_step).
bool step_takes_amx(const ggml_tensor * w, const ggml_tensor * x) {
    constexpr int64_t kAmxStepCols = 8;
    return w->type == GGML_TYPE_Q8_0 && x->ne[1] >= kAmxStepCols && amx_gemm_supported(w, x);
}

// Whether mul_mat_step gives w x x to the mat-vec kernels (matvec).
bool step_takes_matvec(const ggml_tensor * w, const ggml_tensor * x) {
    return !is_q8_0_quads(w) && matvec_step_supported(w, x) && !step_takes_amx(w, x) && !step_takes_vnni_gemm(w, x);
}

}  // namespace

// A single sequence's decode step prepares its activation inside each product (in every thread, no node and
// no barrier of its own; as the mat-vec kernels do); more columns share one preparing node per input.
// Measured, full-size Q8_0, 2 threads, ms per token and sequence, shared node -> inside: quiet B=1 10.7 ->
// 10.7, B=2 6.1 -> 6.2, B=4 3.6 -> 4.0 (the redundant quantization outweighs the barriers); beside one busy
// process B=1 38.3 -> 28.4 (a barrier waits for a thread that shares its core).
constexpr int64_t kInlinePrepareCols = 1;

ggml_tensor * prepare_step(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    if (is_q8_0_quads(w)) return x->ne[1] > kInlinePrepareCols ? int8_gemm_prepare(ctx, x) : nullptr;
    return step_takes_vnni_gemm(w, x) ? int8_gemm_prepare(ctx, x) : nullptr;
}

ggml_tensor * mul_mat_step(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared) {
    // A matrix in the quads layout: one column per tile row as for many (the mat-vec kernel's arithmetic,
    // the same bits; no per-product unpack, so also a single sequence's step runs here).
    if (is_q8_0_quads(w)) {
        if (x->ne[1] <= kInlinePrepareCols && int8_gemm_supported(w, x)) return int8_gemm_inline(ctx, w, x);
        return quads_product(ctx, w, x, prepared);
    }
    if (matvec_step_supported(w, x)) {
        // Q8_0 from 8 columns (a batch, a verification pass) on AMX: the AMX GEMM, whose arithmetic per
        // element is the mat-vec kernel's (kernels/matvec_q8_0.inc), so the same bits at a fraction of the
        // vector instructions. Measured, full-size decoder, 2 threads (docs/performance.md): a batch of 8
        // 9.2 -> 7.2 ms per token and sequence; 2 and 4 columns are faster in the mat-vec kernel (B=2 18.8
        // vs 24.4, B=4 11.4 vs 12.2 ms), and the AVX2 int8 GEMM (which unpacks the weights per product)
        // loses to it at every count. Without AMX, the VNNI int8 GEMM (vpdpbusd on the weights' offset
        // form, the same bits again; AVX-512 or AVX-VNNI) from 3 columns: on Zen 4, 2 threads, in cache,
        // 3072 x 1024 x 2 / 3 / 4 / 8 0.071 / 0.067 / 0.074 / 0.107 vs 0.077 / 0.106 / 0.118 / 0.21 ms, the
        // 151936-row output matrix x 2 / 3 / 4 3.7 / 4.5 / 5.0 vs 3.5 / 5.1 / 5.6 ms. (A matrix the loader kept in
        // the quads layout took the branch above this one: no unpack, every column count.)
        if (step_takes_amx(w, x)) return amx_gemm(ctx, w, x);
        if (step_takes_vnni_gemm(w, x)) return int8_gemm(ctx, w, x, is_int8_gemm_prepare(prepared) ? prepared : nullptr);
        return matvec(ctx, w, x);
    }
    const int64_t n = x->ne[1];
    if (n == 1 || !weight_in_cpu_memory(w)) return ggml_mul_mat(ctx, w, x);
    if (!ggml_is_contiguous(x)) x = ggml_cont(ctx, x);
    if (weight_is_repacked(w)) {
        // ggml's repacked products run its GEMV for each of up to 3 columns and a GEMM from 4 on:
        // groups of at most 3 columns take exactly the one-column arithmetic.
        ggml_tensor * out = nullptr;
        for (int64_t c = 0; c < n; c += 3) {
            const int64_t m = std::min<int64_t>(3, n - c);
            ggml_tensor * part = ggml_mul_mat(ctx, w, ggml_view_2d(ctx, x, x->ne[0], m, x->nb[1], c * x->nb[1]));
            out = out ? ggml_concat(ctx, out, part, 1) : part;
        }
        return out;
    }
    // Every column its own [k, 1] plane: ggml multiplies each plane by the (broadcast) weights with the
    // one-column path (vec_dot; its tiled GEMM only takes two or more columns), row blocks shared by
    // the planes, so a column's numbers are a single sequence's.
    ggml_tensor * planes = ggml_mul_mat(ctx, w, ggml_reshape_3d(ctx, x, x->ne[0], 1, n));
    return ggml_reshape_2d(ctx, planes, w->ne[1], n);
}

namespace {

// A node of all the products of ws with m columns: each matrix's block of its output as a contiguous [rows, m]
// view, in order; `rest` (if given): the byte offset after the last block.
std::vector<ggml_tensor *> product_blocks(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * y,
                                          int64_t m, size_t * rest = nullptr) {
    std::vector<ggml_tensor *> out;
    size_t offset = 0;
    for (ggml_tensor * w : ws) {
        out.push_back(ggml_view_2d(ctx, y, w->ne[1], m, static_cast<size_t>(w->ne[1]) * sizeof(float), offset));
        offset += static_cast<size_t>(w->ne[1] * m) * sizeof(float);
    }
    if (rest) *rest = offset;
    return out;
}

}  // namespace

std::vector<ggml_tensor *> products(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                                    ggml_tensor * prepared, bool frames) {
    auto blocks = [&](ggml_tensor * y) { return product_blocks(ctx, ws, y, x->ne[1]); };
    // Matrices in the int8 GEMM's quads layout: one node. Without a prepared activation (prepare_step gives
    // none for a single column) the node prepares inside, as mul_mat_step does.
    if (int8_gemm_many_supported(ws, x)) return blocks(int8_gemm_many(ctx, ws, x, prepared));
    // A decode step's products in the mat-vec kernels (Q4_K_M's, AVX2's, F32 / F16): one node for all too.
    const bool all_matvec = !frames && std::all_of(ws.begin(), ws.end(), [&](ggml_tensor * w) { return step_takes_matvec(w, x); });
    if (all_matvec && fusion_enabled() && matvec_many_supported(ws, x)) return blocks(matvec_many(ctx, ws, x));
    std::vector<ggml_tensor *> out;
    for (ggml_tensor * w : ws) out.push_back(frames ? mul_mat_frames(ctx, w, x, prepared) : mul_mat_step(ctx, w, x, prepared));
    return out;
}

namespace {

std::vector<ggml_tensor *> products_computing_input(ggml_context * ctx, const std::vector<ggml_tensor *> & ws,
                                                    const ProductInput & input, ggml_tensor ** sum) {
    ggml_tensor * x = input.a;  // (the input's shape)
    if (ws.empty() || !node_input_supported(input) || (input.sum && !sum)) return {};
    const bool inline_quads = x->ne[1] <= kInlinePrepareCols;  // (more columns share a preparing node)
    const bool all_matvec = std::all_of(ws.begin(), ws.end(), [&](ggml_tensor * w) { return step_takes_matvec(w, x); });
    if (ws.size() == 1) {  // SwiGLU before the down projection, the last norm before the output projection
        ggml_tensor * w = ws[0];
        if (input.sum) return {};
        if (is_q8_0_quads(w) && inline_quads && int8_gemm_supported(w, x)) return {int8_gemm_inline(ctx, w, x, &input)};
        if (all_matvec && matvec_takes_input(w, x)) return {matvec(ctx, w, x, &input)};
        return {};
    }
    ggml_tensor * node = nullptr;
    if (int8_gemm_many_supported(ws, x) && inline_quads) {
        node = int8_gemm_many(ctx, ws, x, nullptr, &input);
    } else if (all_matvec && fusion_enabled() && matvec_many_supported(ws, x)) {
        node = matvec_many(ctx, ws, x, &input);
    } else {
        return {};
    }
    size_t offset = 0;
    std::vector<ggml_tensor *> out = product_blocks(ctx, ws, node, x->ne[1], &offset);
    if (input.sum) {
        *sum = ggml_view_2d(ctx, node, x->ne[0], x->ne[1], static_cast<size_t>(x->ne[0]) * sizeof(float), offset);
    }
    return out;
}

}  // namespace

std::vector<ggml_tensor *> products_after_add_norm(ggml_context * ctx, const std::vector<ggml_tensor *> & ws,
                                                   ggml_tensor * x, ggml_tensor * y, ggml_tensor * norm, float eps,
                                                   ggml_tensor ** sum) {
    const ProductInput input{NodeInput::add_rms_norm, x, y, norm, eps, sum != nullptr};
    return products_computing_input(ctx, ws, input, sum);
}

ggml_tensor * product_after_swiglu(ggml_context * ctx, ggml_tensor * w, ggml_tensor * gate, ggml_tensor * up) {
    const ProductInput input{NodeInput::swiglu, gate, up, nullptr, 0.0f, false};
    const auto p = products_computing_input(ctx, {w}, input, nullptr);
    return p.empty() ? nullptr : p[0];
}

ggml_tensor * add_rms_norm_node(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * norm, float eps,
                                ggml_tensor ** sum) {
    if (!add_rms_norm_supported(x, y, norm)) return nullptr;
    ggml_tensor * f = add_rms_norm(ctx, x, y, norm, eps);
    *sum = sum_of(ctx, f);
    return norm_of(ctx, f);
}

bool swiglu_fusable(const ggml_tensor * w) { return fusion_enabled() && weight_in_cpu_memory(w); }

ggml_tensor * swiglu(ggml_context * ctx, ggml_tensor * gate, ggml_tensor * up, const ggml_tensor * w, bool fuse) {
    return fuse && swiglu_fusable(w) ? ggml_swiglu_split(ctx, gate, up)  // silu(gate) * up, one node
                                     : ggml_mul(ctx, ggml_silu(ctx, gate), up);
}

ggml_tensor * fused_cached_attention(ggml_context * ctx, ggml_cgraph * gf, const CachedAttention & a) {
    const int64_t hd = a.head_dim, n = a.q->ne[1];
    const CachedAttentionHeads heads{a.q, a.k, a.v, a.q_norm, a.k_norm, a.positions, a.k_window, a.v_window, a.mask,
                                     a.n_heads, a.n_kv_heads, a.scale, a.eps, a.rope_theta};
    if (a.step && cached_attention_heads_supported(heads)) {
        // A decode step: the heads' norms, RoPE and the K/V store inside the attention's node (each task makes
        // the heads it reads), one node fewer per layer.
        return cached_attention_heads(ctx, heads);
    }
    if (!heads_rms_norm_supported(a.q, a.k, a.q_norm, a.k_norm, hd)) return nullptr;
    // The query and key heads normed into one [hd, Hq + Hkv, n*B] tensor, one RoPE node for both (each head's row
    // the same arithmetic as alone), one node to store the K/V rows, then fun-asr's attention (and where ggml's
    // RoPE arithmetic is known, the norms, RoPE and store in one node).
    const HeadsNormRopeStore store{a.q, a.k, a.q_norm, a.k_norm, hd, a.eps, a.positions, a.rope_theta,
                                   a.v, a.k_rows, a.v_rows, a.kv_rows};
    const bool one = heads_norm_rope_store_supported(store);
    ggml_tensor * qk = nullptr;
    if (one) {
        qk = heads_norm_rope_store(ctx, store);
    } else {
        qk = ggml_rope_ext(ctx, heads_rms_norm(ctx, a.q, a.k, a.q_norm, a.k_norm, hd, a.eps), a.positions, nullptr,
                           static_cast<int>(hd), GGML_ROPE_TYPE_NEOX, 0, a.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    }
    ggml_tensor * q = ggml_view_3d(ctx, qk, hd, a.n_heads, n, qk->nb[1], qk->nb[2], 0);
    ggml_tensor * k = ggml_view_2d(ctx, qk, hd * a.n_kv_heads, n, qk->nb[2], static_cast<size_t>(a.n_heads) * qk->nb[1]);
    if (!(one || store_kv_supported(k, a.v, a.k_rows, a.v_rows, a.kv_rows)) ||
        !cached_attention_supported(q, a.k_window, a.v_window, a.mask, a.n_heads, a.n_kv_heads)) {
        return nullptr;
    }
    if (!one) ggml_build_forward_expand(gf, store_kv(ctx, k, a.v, a.k_rows, a.v_rows, a.kv_rows));
    return cached_attention(ctx, q, a.k_window, a.v_window, a.mask, a.n_heads, a.n_kv_heads, a.scale);
}

ggml_tensor * host_cached_attention(ggml_context * ctx, ggml_tensor * q, const CachedAttention & a) {
    if (!cached_attention_supported(q, a.k_window, a.v_window, a.mask, a.n_heads, a.n_kv_heads)) return nullptr;
    return cached_attention(ctx, q, a.k_window, a.v_window, a.mask, a.n_heads, a.n_kv_heads, a.scale);
}

namespace {

// The many-column product's kernel for w x x: Intel AMX (Q8_0, Q4_K), else the AVX2 int8 GEMM (Q8_0,
// Q4_K, Q6_K), else none. Both take K-quants where asked (the audio encoder's products, k_quants); the
// decoder's prefill takes them on the int8 GEMM wherever it runs without AMX. The GEMM unpacks each
// row group once per product: on AVX2 that pays for itself from ~12 columns (a transcription's prompt
// has 30+), where it is ~2x ggml's Q4_K / Q6_K; with VNNI (vpdpbusd) against ggml's AVX-512 paths from
// ~16 (Q4_K) / ~8 (Q6_K) columns, 1.3-1.4x / 2.3-2.4x at 40 (Zen 4, docs/performance.md). The choice
// depends on the weight type and the CPU, never on the column count.
enum class FramesGemm { none, amx, int8 };

bool int8_gemm_prefill_k_quants() {
    static const bool on = int8_gemm_isa()[0] != '\0' && !amx_available();
    return on;
}

FramesGemm frames_gemm(const ggml_tensor * w, const ggml_tensor * x, bool k_quants) {
    // AMX's Q4_K unpacks its 16-row tiles with scalar code: under 8 columns the int8 GEMM is faster
    // (2048 x 512: 0.06 vs 0.10 ms at 1 column, equal at 8). The two give the same bits for Q4_K.
    const bool amx_q4_k = k_quants && x->ne[1] >= 8;
    if ((w->type == GGML_TYPE_Q8_0 || amx_q4_k) && amx_gemm_supported(w, x)) return FramesGemm::amx;
    const bool int8_k_quants = k_quants || int8_gemm_prefill_k_quants();
    if ((int8_k_quants || w->type == GGML_TYPE_Q8_0) && int8_gemm_supported(w, x)) return FramesGemm::int8;
    return FramesGemm::none;
}

// A product from `prepared` when it was prepared for this kernel (q/k/v share one; a matrix of
// another type or shape takes its own path and ignores it).
ggml_tensor * frames_gemm_product(ggml_context * ctx, FramesGemm kind, ggml_tensor * w, ggml_tensor * x,
                                  ggml_tensor * prepared, ggml_tensor * bias) {
    if (kind == FramesGemm::amx) return amx_gemm(ctx, w, x, is_amx_prepare(prepared) ? prepared : nullptr, bias);
    return int8_gemm(ctx, w, x, is_int8_gemm_prepare(prepared) ? prepared : nullptr, bias);
}

}  // namespace

ggml_tensor * mul_mat_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared,
                             bool k_quants) {
    const FramesGemm kind = frames_gemm(w, x, k_quants);
    if (kind != FramesGemm::none) return frames_gemm_product(ctx, kind, w, x, prepared, nullptr);
    return matvec_frames_preferred(w, x) ? matvec(ctx, w, x) : mul_mat(ctx, w, x);
}

ggml_tensor * prepare_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, bool k_quants) {
    switch (frames_gemm(w, x, k_quants)) {
        case FramesGemm::amx: return amx_prepare(ctx, x);
        case FramesGemm::int8: return int8_gemm_prepare(ctx, x);
        default: return nullptr;
    }
}

Product product(ggml_context * ctx, ggml_tensor * x, const Linear & l, ggml_tensor * prepared) {
    const FramesGemm kind = frames_gemm(l.w, x, true);
    // AMX adds the bias in the product; the int8 GEMM leaves it to the fused tails (bias + ReLU,
    // bias + residual: one pass fewer than a separate ReLU or add).
    if (kind == FramesGemm::amx && amx_bias_supported(l.w, l.b)) {
        return {frames_gemm_product(ctx, kind, l.w, x, prepared, l.b), nullptr};
    }
    if (kind != FramesGemm::none) return {frames_gemm_product(ctx, kind, l.w, x, prepared, nullptr), l.b};
    return {mul_mat_frames(ctx, l.w, x, nullptr, true), l.b};
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * x, const Linear & l, ggml_tensor * prepared) {
    if (frames_gemm(l.w, x, true) == FramesGemm::int8 && int8_gemm_bias_supported(l.w, l.b)) {
        return frames_gemm_product(ctx, FramesGemm::int8, l.w, x, prepared, l.b);  // + b in the product
    }
    const Product p = product(ctx, x, l, prepared);
    return p.bias ? ggml_add(ctx, p.y, p.bias) : p.y;
}

namespace {

void im2col_channels_last_run(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const Im2colParams & p = *static_cast<const Im2colParams *>(userdata);
    const ggml_tensor * x = dst->src[0];
    const int64_t C = x->ne[0], W = x->ne[1], H = x->ne[2];
    const int64_t OW = dst->ne[1], OH = dst->ne[2], N = dst->ne[3];
    const bool f16 = dst->type == GGML_TYPE_F16;
    const size_t esize = f16 ? sizeof(ggml_fp16_t) : sizeof(float);
    const int64_t cols = OW * OH * N, per = (cols + nth - 1) / nth;
    const int64_t c0 = per * ith, c1 = std::min(cols, c0 + per);
    for (int64_t col = c0; col < c1; ++col) {
        const int64_t ow = col % OW, oh = (col / OW) % OH, n = col / (OW * OH);
        char * out = static_cast<char *>(dst->data) + ow * dst->nb[1] + oh * dst->nb[2] + n * dst->nb[3];
        for (int i = 0; i < p.kh; ++i) {
            const int64_t ih = oh * p.sh - p.ph + static_cast<int64_t>(i) * p.dh;
            for (int j = 0; j < p.kw; ++j) {
                const int64_t iw = ow * p.sw - p.pw + static_cast<int64_t>(j) * p.dw;
                char * slot = out + static_cast<size_t>((i * p.kw + j) * C) * esize;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) {
                    std::memset(slot, 0, static_cast<size_t>(C) * esize);
                    continue;
                }
                const float * src = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + iw * x->nb[1] +
                                                                    ih * x->nb[2] + n * x->nb[3]);
                if (f16) {
                    ggml_fp32_to_fp16_row(src, reinterpret_cast<ggml_fp16_t *>(slot), C);  // (ggml-base's: IEEE rounding)
                } else {
                    std::memcpy(slot, src, static_cast<size_t>(C) * sizeof(float));
                }
            }
        }
    }
}

}  // namespace

ggml_tensor * im2col_channels_last(ggml_context * ctx, ggml_tensor * x, const Im2colParams & p, ggml_type type) {
    if (x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float)) {
        throw std::invalid_argument("im2col_channels_last: x must be F32 with contiguous channels");
    }
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16) throw std::invalid_argument("im2col_channels_last: F32 or F16 out");
    const int64_t OW = (x->ne[1] + 2 * p.pw - static_cast<int64_t>(p.dw) * (p.kw - 1) - 1) / p.sw + 1;
    const int64_t OH = (x->ne[2] + 2 * p.ph - static_cast<int64_t>(p.dh) * (p.kh - 1) - 1) / p.sh + 1;
    if (OW < 1 || OH < 1) throw std::invalid_argument("im2col_channels_last: the input is smaller than the kernel");
    ggml_tensor * args[1] = {x};
    const Im2colParams * kept = intern_op_params(p);
    return ggml_custom_4d(ctx, type, x->ne[0] * p.kw * p.kh, OW, OH, x->ne[3], args, 1, im2col_channels_last_run,
                          GGML_N_TASKS_MAX, const_cast<Im2colParams *>(kept));
}

ggml_tensor * attention_full(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                             int64_t n_heads, ggml_tensor * mask, const DeviceCaps & caps) {
    const int64_t d = q->ne[0], T = q->ne[1], hd = d / n_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (mask == nullptr && caps.host && attention_supported(q, k, v, n_heads)) return attention(ctx, q, k, v, n_heads, scale);
    if (mask == nullptr && caps.exact_flash_attn) {
        // One fused node (F32 K/V, online softmax in F32): the matmul path's second product has the
        // sequence length as its inner dimension, which ggml's fast GEMM only takes in multiples of
        // 16, so it ran at ~13 GFLOP/s and took ~18% of the encoder's time.
        ggml_tensor * qh = ggml_permute(ctx, ggml_reshape_3d(ctx, q, hd, n_heads, T), 0, 2, 1, 3);  // [hd, T, H]
        ggml_tensor * kh = ggml_permute(ctx, ggml_reshape_3d(ctx, k, hd, n_heads, T), 0, 2, 1, 3);
        ggml_tensor * vh = ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, n_heads, T), 0, 2, 1, 3);
        ggml_tensor * out = ggml_flash_attn_ext(ctx, qh, kh, vh, nullptr, scale, 0.0f, 0.0f);  // [hd, H, T]
        ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
        return ggml_reshape_2d(ctx, out, d, T);
    }
    // [d, T] -> [hd, T, H], made contiguous so the matmuls take the fast (tinyBLAS) path
    ggml_tensor * qh = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, q, hd, n_heads, T), 0, 2, 1, 3));
    ggml_tensor * kh = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, k, hd, n_heads, T), 0, 2, 1, 3));
    ggml_tensor * kq = ggml_mul_mat(ctx, kh, qh);  // [T_k, T_q, H]
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
    // v: [d, T] -> [T, hd, H]
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, v, hd, n_heads, T), 1, 2, 0, 3));
    ggml_tensor * out = ggml_mul_mat(ctx, vt, kq);  // [hd, T_q, H]
    out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3));  // [hd, H, T_q]
    return ggml_reshape_2d(ctx, out, d, T);
}

namespace {

// Depthwise conv1d over time (zero padding (K-1)/2 | K-1-(K-1)/2, no bias) of v [d, T] with the
// FSMN kernel [K, 1, d], plus v itself: FunASR's FSMN memory block. ggml's SSM_CONV where the device takes any
// kernel width (DeviceCaps::ssm_conv_any_width), else as K shifted products.
ggml_tensor * fsmn(ggml_context * ctx, ggml_tensor * v, ggml_tensor * kernel, int64_t K, const DeviceCaps & caps) {
    const int64_t d = v->ne[0], T = v->ne[1];
    const int left = static_cast<int>((K - 1) / 2), right = static_cast<int>(K - 1 - left);
    if (!caps.ssm_conv_any_width) {
        ggml_tensor * vp = ggml_pad_ext(ctx, v, 0, 0, left, right, 0, 0, 0, 0);         // [d, T + K - 1]
        ggml_tensor * taps = ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_2d(ctx, kernel, K, d)));  // [d, K]
        ggml_tensor * conv = nullptr;
        for (int64_t j = 0; j < K; ++j) {
            ggml_tensor * shifted = ggml_view_2d(ctx, vp, d, T, vp->nb[1], static_cast<size_t>(j) * vp->nb[1]);
            ggml_tensor * tap = ggml_view_2d(ctx, taps, d, 1, taps->nb[1], static_cast<size_t>(j) * taps->nb[1]);
            ggml_tensor * term = ggml_mul(ctx, shifted, tap);
            conv = conv ? ggml_add(ctx, conv, term) : term;
        }
        return ggml_add(ctx, conv, v);
    }
    ggml_tensor * vt = ggml_cont(ctx, ggml_transpose(ctx, v));  // [T, d]
    vt = ggml_pad_ext(ctx, vt, left, right, 0, 0, 0, 0, 0, 0);   // [T + K - 1, d]
    vt = ggml_reshape_3d(ctx, vt, T + K - 1, d, 1);
    ggml_tensor * conv = ggml_ssm_conv(ctx, vt, ggml_reshape_2d(ctx, kernel, K, d));  // [d, T, 1]
    return ggml_add(ctx, ggml_reshape_2d(ctx, conv, d, T), v);
}

}  // namespace

namespace {

// [rows, T_i] views of x's columns, one per packed sequence (all of x for one sequence).
std::vector<ggml_tensor *> sequence_views(ggml_context * ctx, ggml_tensor * x, const std::vector<int64_t> & lens) {
    if (lens.size() <= 1) return {x};
    std::vector<ggml_tensor *> out;
    int64_t t0 = 0;
    for (int64_t T : lens) {
        out.push_back(ggml_view_2d(ctx, x, x->ne[0], T, x->nb[1], static_cast<size_t>(t0) * x->nb[1]));
        t0 += T;
    }
    return out;
}

// The sequences' results [rows, T_i] side by side again: [rows, sum T_i] (pairwise, so that each column is
// copied about log2(n) times rather than up to n).
ggml_tensor * join_sequences(ggml_context * ctx, std::vector<ggml_tensor *> parts) {
    while (parts.size() > 1) {
        std::vector<ggml_tensor *> next;
        for (size_t i = 0; i + 1 < parts.size(); i += 2) next.push_back(ggml_concat(ctx, parts[i], parts[i + 1], 1));
        if (parts.size() % 2) next.push_back(parts.back());
        parts = std::move(next);
    }
    return parts[0];
}

}  // namespace

ggml_tensor * sanm_layer(const GraphCtx & g, ggml_tensor * x, const SanmLayer & l, int64_t n_heads,
                         int64_t fsmn_kernel, float eps, ggml_tensor * mask, const std::string & name) {
    ggml_context * ctx = g.ctx;
    const std::vector<int64_t> & seqs = g.segments;
    ggml_tensor * h = layer_norm(ctx, x, l.attn_norm, eps);
    // q, k and v read the same input: on AMX it is quantized into tiles once for the three.
    ggml_tensor * hp = prepare_frames(ctx, l.q.w, h, true);
    ggml_tensor * q = linear(ctx, h, l.q, hp);
    ggml_tensor * k = linear(ctx, h, l.k, hp);
    ggml_tensor * v = linear(ctx, h, l.v, hp);
    std::vector<ggml_tensor *> heads;
    {
        const auto qs = sequence_views(ctx, q, seqs), ks = sequence_views(ctx, k, seqs), vs = sequence_views(ctx, v, seqs);
        for (size_t i = 0; i < qs.size(); ++i) heads.push_back(attention_full(ctx, qs[i], ks[i], vs[i], n_heads, mask, g.caps));
    }
    const Product o = product(ctx, join_sequences(ctx, heads), l.o);
    // Layer 0 of the encoder widens 560 -> d: no residual around its attention.
    ggml_tensor * residual = x->ne[0] == o.y->ne[0] ? x : nullptr;
    // Fused tails (kernels/fsmn_memory, kernels/fused_add): the plain graph's float steps in one node each,
    // except when a debug run wants every stage's output.
    const bool fuse = !g.every_stage;
    const auto vs = sequence_views(ctx, v, seqs);
    if (fuse && l.fsmn && fsmn_memory_supported(o.y, v, l.fsmn, o.bias, residual)) {
        // x + ((o + b) + (conv(v) + v)), per sequence
        const auto os = sequence_views(ctx, o.y, seqs);
        const auto rs = residual ? sequence_views(ctx, residual, seqs) : std::vector<ggml_tensor *>(os.size(), nullptr);
        std::vector<ggml_tensor *> parts;
        for (size_t i = 0; i < os.size(); ++i) parts.push_back(fsmn_memory_add(ctx, os[i], vs[i], l.fsmn, o.bias, rs[i]));
        x = join_sequences(ctx, parts);
    } else {
        ggml_tensor * att = o.bias ? ggml_add(ctx, o.y, o.bias) : o.y;
        if (l.fsmn && fsmn_memory_supported(att, v, l.fsmn)) {
            const auto as = sequence_views(ctx, att, seqs);
            std::vector<ggml_tensor *> parts;
            for (size_t i = 0; i < as.size(); ++i) parts.push_back(fsmn_memory_add(ctx, as[i], vs[i], l.fsmn));
            att = join_sequences(ctx, parts);
        } else if (l.fsmn) {
            std::vector<ggml_tensor *> parts;
            for (ggml_tensor * vi : vs) parts.push_back(fsmn(ctx, vi, l.fsmn, fsmn_kernel, g.caps));
            att = ggml_add(ctx, att, join_sequences(ctx, parts));
        }
        g.name(att, name + ".attn_out");
        x = residual ? ggml_add(ctx, residual, att) : att;
    }
    h = layer_norm(ctx, x, l.ffn_norm, eps);
    const Product up = product(ctx, h, l.up);
    h = fuse && up.bias && fused_add_supported(up.y, up.bias) ? bias_relu(ctx, up.y, up.bias)
                                                               : ggml_relu(ctx, up.bias ? ggml_add(ctx, up.y, up.bias) : up.y);
    const Product down = product(ctx, h, l.down);
    if (fuse && down.bias && fused_add_supported(down.y, down.bias, x)) {
        x = residual_bias_add(ctx, x, down.y, down.bias);  // x + (h W^T + b)
    } else {
        x = ggml_add(ctx, x, down.bias ? ggml_add(ctx, down.y, down.bias) : down.y);
    }
    if (l.out_norm.w) x = layer_norm(ctx, x, l.out_norm, eps);
    g.name(x, name + ".out");
    return x;
}

ggml_tensor * ctc_argmax(ggml_context * ctx, ggml_tensor * logits) {
    return argmax_columns(ctx, logits, /*nan_first_wins=*/false);  // the one argmax op; no NaN wins, in row 0 neither
}

ggml_tensor * chosen_probability(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * choice) {
    const int64_t V = logits->ne[0], B = logits->ne[1];
    ggml_tensor * probs = ggml_reshape_3d(ctx, ggml_soft_max(ctx, logits), 1, V, B);  // one row per element
    return ggml_get_rows(ctx, probs, ggml_reshape_2d(ctx, choice, 1, B));
}

}  // namespace fun_asr
