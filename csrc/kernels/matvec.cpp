#include "kernels/matvec.h"

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

#include "kernels/decoder_fused.h"
#include "kernels/op_params.h"
#include "kernels/q4_k_x8_layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FUN_ASR_MATVEC_X86 1
#include <immintrin.h>
#else
#define FUN_ASR_MATVEC_X86 0
#endif
#include "kernels/avx_vnni.h"

namespace fun_asr {
namespace {

constexpr int64_t kQ8Block = 32;    // QK8_0
constexpr size_t kQ8Bytes = 34;     // block_q8_0: fp16 d + 32 int8
constexpr int64_t kSuperBlock = 256;  // QK_K
constexpr size_t kQ6KBytes = 210;   // block_q6_K: ql[128] qh[64] scales[16] fp16 d
constexpr size_t kQ8KBytes = 292;   // block_q8_K: float d, int8 qs[256], int16 bsums[16]
constexpr int64_t kMaxCols = 8;  // mul_mat()'s limit; decode steps take any count
constexpr int64_t kColumnSplit = 32;  // from this many columns per thread, threads split columns, not rows

// Rows [r0, r1) of a weight matrix (stride ws bytes) times n prepared activation columns.
using RowsFn = void (*)(const uint8_t * w, size_t ws, int64_t r0, int64_t r1, const void * act, const float * scales,
                        int64_t n, int64_t nb, float * y, int64_t ys);

struct Kernels {
    RowsFn q8_0 = nullptr;
    RowsFn q6_k = nullptr;
    RowsFn q4_k_x8 = nullptr;  // Q4_K in ggml's CPU_REPACK layout
    RowsFn f32 = nullptr;      // F32 / F16 weights in the lane width of ggml's tinyBLAS (fp_lanes())
    RowsFn f16 = nullptr;
    const char * name = "";
    bool q8_offset_sums = false;  // the Q8_0 kernel's VNNI form reads 128 * each block's quant sum
};

// The lane count of ggml's llamafile tinyBLAS for F32/F16 (16 when ggml's CPU backend was built
// for AVX-512, else 8): the F32/F16 kernels sum in as many lanes so that their results are ggml's.
int fp_lanes() { return cpu_backend::built_with("AVX512") ? 16 : 8; }

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own intrinsic headers: _mm256/_mm512_undefined_*() are written as a
// self-initialised value (`__m512i __Y = __Y;`), which -W(maybe-)uninitialized flags once the
// intrinsics are inlined into our kernels. Nothing here reads an undefined value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if FUN_ASR_MATVEC_X86
// Each ISA's copy of the kernels is compiled in its own target region; only these functions carry
// the wider instruction sets, and they run only after the CPU check in pick().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#define FUN_ASR_VNNI 0
#include "kernels/matvec_q8_0.inc"
#include "kernels/matvec_q6_k.inc"
#include "kernels/matvec_q4_k_x8.inc"
#include "kernels/matvec_fp.inc"
#undef FUN_ASR_VNNI
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#endif
namespace vnni {
#define FUN_ASR_VNNI 1
#define FUN_ASR_DPBUSD _mm256_dpbusd_epi32
#include "kernels/matvec_q8_0.inc"
#include "kernels/matvec_q6_k.inc"
#include "kernels/matvec_q4_k_x8.inc"
#include "kernels/matvec_fp.inc"
#undef FUN_ASR_DPBUSD
#undef FUN_ASR_VNNI
}  // namespace vnni
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
// AVX-VNNI without AVX-512 (Intel's client cores from Alder Lake on): the Q8_0 kernel's VNNI form in VEX
// encoding; the other types keep the AVX2 copies (their VNNI copies are 512-bit).
namespace avxvnni {
#define FUN_ASR_VNNI 1
#define FUN_ASR_DPBUSD _mm256_dpbusd_avx_epi32
#include "kernels/matvec_q8_0.inc"
#undef FUN_ASR_DPBUSD
#undef FUN_ASR_VNNI
}  // namespace avxvnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // FUN_ASR_AVX_VNNI

Kernels pick(const std::string & want) {
    const CpuFeatures & cpu = cpu_features();
    const bool has_avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
    const bool has_vnni = has_avx2 && cpu.avx512vnni && cpu.avx512vl && cpu.avx512bw && cpu.avx512f;
    const bool wide = fp_lanes() == 16;
    if (has_vnni && want != "avx2" && want != "avxvnni") {
        return {vnni::q8_0_rows_x_cols, vnni::q6_k_rows_x_cols, vnni::q4_k_x8_rows_x_cols,
                wide ? vnni::f32_rows_x_cols_16 : vnni::f32_rows_x_cols_8,
                wide ? vnni::f16_rows_x_cols_16 : vnni::f16_rows_x_cols_8, "avx512vnni", true};
    }
    if (has_avx2) {
        Kernels k{avx2::q8_0_rows_x_cols, avx2::q6_k_rows_x_cols, avx2::q4_k_x8_rows_x_cols,
                  wide ? avx2::f32_rows_x_cols_16 : avx2::f32_rows_x_cols_8,
                  wide ? avx2::f16_rows_x_cols_16 : avx2::f16_rows_x_cols_8, "avx2"};
#if FUN_ASR_AVX_VNNI
        if (cpu.avxvnni && want != "avx2") {  // its Q8_0 copy; the rest stay AVX2
            k.q8_0 = avxvnni::q8_0_rows_x_cols;
            k.name = "avxvnni";
            k.q8_offset_sums = true;
        }
#endif
        return k;
    }
    return {};
}
#else
Kernels pick(const std::string &) { return {}; }
#endif

const Kernels & kernels() {
    static const Kernels chosen = [] {
        const std::string & want = switches::value("FUN_ASR_MATVEC");
        if (want == "0") return Kernels{};
        return pick(want);
    }();
    return chosen;
}

// The buffer a weight lives in (a view's is its source's; views get theirs only at allocation).
ggml_backend_buffer_t buffer_of(const ggml_tensor * w) {
    return w->buffer ? w->buffer : w->view_src ? w->view_src->buffer : nullptr;
}

bool is_repacked(const ggml_tensor * w) {
    ggml_backend_buffer_t b = buffer_of(w);
    return b && std::strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(b)), "CPU_REPACK") == 0;
}

// The kernel for a weight as it is stored (type and layout), or null.
RowsFn kernel_for(const ggml_tensor * w) {
    if (!buffer_of(w) || !w->data) return nullptr;
    const ggml_tensor * base = w->view_src ? w->view_src : w;
    if (is_repacked(w)) {  // CPU memory, but not reported as host memory (the layout is ggml's own)
        // ggml repacks Q4_K as 8 interleaved rows on AVX2 CPUs when the row count allows it (views into
        // those row groups are left to ggml).
        const bool ok = w->type == GGML_TYPE_Q4_K && w->ne[1] % 8 == 0 && w->extra != nullptr && !w->view_src;
        return ok ? kernels().q4_k_x8 : nullptr;
    }
    if (!ggml_backend_buffer_is_host(buffer_of(w)) || base->extra != nullptr) return nullptr;  // GPU, another extra type
    switch (w->type) {
        case GGML_TYPE_Q8_0: return kernels().q8_0;
        case GGML_TYPE_Q6_K: return kernels().q6_k;
        case GGML_TYPE_F32: return kernels().f32;
        case GGML_TYPE_F16: return kernels().f16;
        default: return nullptr;
    }
}

bool is_fp(ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16; }

// What a row's length must be a multiple of: the quant block, or for F32/F16 the lane width
// (ggml's tinyBLAS only takes such rows).
int64_t block_of(ggml_type t) {
    if (is_fp(t)) return fp_lanes();
    return t == GGML_TYPE_Q8_0 ? kQ8Block : kSuperBlock;
}

// The blocks per row the kernel is told (F32/F16: elements).
int64_t blocks_per_row(ggml_type t, int64_t k) { return is_fp(t) ? k : k / block_of(t); }

// The activation, quantized the way ggml's own path quantizes it for this weight type.
struct Activation {
    std::vector<uint8_t> blocks;  // Q8_0: scratch for one column; Q6_K, Q4_K: the Q8_K blocks of every column
    std::vector<int8_t> quants;   // Q8_0: k int8 per column, contiguous
    std::vector<float> scales;    // Q8_0: k / 32 floats per column, then per column and block 128 * the quant sum
                                  // (int32 bits; the VNNI kernel's offset form, left unset for the AVX2 one)
    std::vector<float> floats;    // F32 / F16: k floats per column, contiguous (F16: rounded to F16)
    std::vector<ggml_fp16_t> halves;  // F16: scratch for one column
    const void * data() const {
        if (!floats.empty()) return floats.data();
        return quants.empty() ? static_cast<const void *>(blocks.data()) : quants.data();
    }
};

// n columns of k floats (column c at x + c * xs floats).
void quantize_cols(ggml_type wtype, const float * x, int64_t xs, int64_t n, int64_t k, Activation & a) {
    a.floats.clear();
    if (is_fp(wtype)) {
        // ggml's tinyBLAS multiplies F16 weights by F16 activations (ggml's own conversion), F32 by F32.
        a.quants.clear();
        a.floats.resize(static_cast<size_t>(n * k));
        for (int64_t c = 0; c < n; ++c) {
            float * dst = a.floats.data() + c * k;
            if (wtype == GGML_TYPE_F32) {
                std::memcpy(dst, x + c * xs, static_cast<size_t>(k) * sizeof(float));
            } else {
                a.halves.resize(static_cast<size_t>(k));
                cpu_backend::api().type_traits(GGML_TYPE_F16)->from_float(x + c * xs, a.halves.data(), k);
                ggml_fp16_to_fp32_row(a.halves.data(), dst, k);
            }
        }
    } else if (wtype == GGML_TYPE_Q8_0) {
        // ggml's Q8_0 routine (so the integer dot products are exactly ggml's), then the blocks split
        // into contiguous int8 quants and float scales.
        const int64_t nb = k / kQ8Block;
        a.blocks.resize(static_cast<size_t>(nb) * kQ8Bytes);
        a.quants.resize(static_cast<size_t>(n * k));
        a.scales.resize(static_cast<size_t>(2 * n * nb));
        const auto from_float = cpu_backend::api().type_traits(GGML_TYPE_Q8_0)->from_float;
        const bool sums = kernels().q8_offset_sums;  // only the VNNI kernels read them
        for (int64_t c = 0; c < n; ++c) {
            from_float(x + c * xs, a.blocks.data(), k);
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t * blk = a.blocks.data() + static_cast<size_t>(b) * kQ8Bytes;
                uint16_t h;
                std::memcpy(&h, blk, sizeof h);
                a.scales[static_cast<size_t>(c * nb + b)] = ggml_fp16_to_fp32(h);
                std::memcpy(a.quants.data() + c * k + b * kQ8Block, blk + 2, kQ8Block);
                if (!sums) continue;
                int32_t sum = 0;
                for (int64_t i = 0; i < kQ8Block; ++i) sum += static_cast<int8_t>(blk[2 + i]);
                sum *= 128;
                std::memcpy(&a.scales[static_cast<size_t>(n * nb + c * nb + b)], &sum, sizeof sum);
            }
        }
    } else {  // Q6_K, Q4_K: ggml's Q8_K activation blocks as they are
        const int64_t nb = k / kSuperBlock;
        a.quants.clear();
        a.blocks.resize(static_cast<size_t>(n * nb) * kQ8KBytes);
        const auto from_float = cpu_backend::api().type_traits(GGML_TYPE_Q8_K)->from_float;
        for (int64_t c = 0; c < n; ++c) from_float(x + c * xs, a.blocks.data() + static_cast<size_t>(c * nb) * kQ8KBytes, k);
    }
}

void run(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], n = x->ne[1];
    thread_local Activation act;
    int64_t xs = static_cast<int64_t>(x->nb[1] / sizeof(float));
    const int64_t ys = static_cast<int64_t>(dst->nb[1] / sizeof(float));
    int64_t r0 = 0, r1 = rows, c0 = 0, c1 = n;
    if (n >= kColumnSplit * nth) {
        // Many columns (encoder frames, a prefill): each thread takes a range of columns (multiples of the
        // 4-column tiles) over every row and quantizes only those. A column's arithmetic is the same
        // whichever tile computes it, so the split changes no number.
        const int64_t per = ((n + nth - 1) / nth + 3) / 4 * 4;
        c0 = std::min<int64_t>(n, per * ith);
        c1 = std::min<int64_t>(n, c0 + per);
    } else {
        // Contiguous row ranges, multiples of 16 rows (whole cache lines of output; also whole 8-row groups
        // of repacked Q4_K). Every thread quantizes the (small) activation itself: no barrier in the op.
        const int64_t per = ((rows + nth - 1) / nth + 15) / 16 * 16;
        r0 = std::min<int64_t>(rows, per * ith);
        r1 = std::min<int64_t>(rows, r0 + per);
    }
    if (r0 >= r1 || c0 >= c1) return;
    // (a node that computes its own input, kernels/decoder_fused: SwiGLU's, no output of its own)
    const float * xd = node_input(dst, userdata, nullptr, ith, nth);
    if (xd) {
        xs = k;
    } else {
        xd = static_cast<const float *>(x->data);
    }
    quantize_cols(w->type, xd + c0 * xs, xs, c1 - c0, k, act);
    kernel_for(w)(static_cast<const uint8_t *>(w->data), w->nb[1], r0, r1, act.data(), act.scales.data(), c1 - c0,
                  blocks_per_row(w->type, k), static_cast<float *>(dst->data) + c0 * ys, ys);
}

// Several matrices with the same x in one node (matvec_many): src[1] = x, src[0], src[2], ... the matrices;
// each one's output a contiguous [rows, n] block, one after the other. The threads split the matrices' rows
// taken together (16-row multiples, as run's row split), each row the kernel's arithmetic as alone; every
// thread quantizes x once per weight type it meets.
void run_many(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[1];
    const int64_t n = x->ne[1];
    std::vector<const ggml_tensor *> ws{dst->src[0]};
    for (int i = 2; i < GGML_MAX_SRC && dst->src[i]; ++i) ws.push_back(dst->src[i]);
    int64_t total = 0;
    for (const ggml_tensor * w : ws) total += w->ne[1];
    const int64_t per = ((total + nth - 1) / nth + 15) / 16 * 16;
    const int64_t t0 = std::min<int64_t>(total, per * ith), t1 = std::min<int64_t>(total, t0 + per);
    auto * out = static_cast<float *>(dst->data);
    // A node that computes its own input (kernels/decoder_fused): every thread, also one without rows here (the
    // residual sum's block after the products' is written by the threads' shares of its columns).
    const float * xd = node_input(dst, userdata, out + total * n, ith, nth);
    const int64_t xs = xd ? x->ne[0] : static_cast<int64_t>(x->nb[1] / sizeof(float));
    if (!xd) xd = static_cast<const float *>(x->data);
    thread_local Activation act;
    ggml_type quantized = GGML_TYPE_COUNT;
    int64_t offset = 0;
    for (const ggml_tensor * w : ws) {
        const int64_t rows = w->ne[1], r0 = std::max<int64_t>(t0 - offset, 0), r1 = std::min<int64_t>(t1 - offset, rows);
        if (r0 < r1) {
            const ggml_type qt = w->type == GGML_TYPE_Q4_K ? GGML_TYPE_Q6_K : w->type;  // the K-quants share Q8_K
            if (qt != quantized) {
                quantize_cols(w->type, xd, xs, n, w->ne[0], act);
                quantized = qt;
            }
            kernel_for(w)(static_cast<const uint8_t *>(w->data), w->nb[1], r0, r1, act.data(), act.scales.data(), n,
                          blocks_per_row(w->type, w->ne[0]), out, rows);
        }
        out += rows * n;
        offset += rows;
    }
}

}  // namespace

bool matvec_many_supported(const std::vector<ggml_tensor *> & ws, const ggml_tensor * x) {
    // (the matrices in src[0], src[2] ... before the sources of a node's own input, kernels/decoder_fused)
    if (ws.size() < 2 || ws.size() + 1 > kNodeInputSrc || !x || x->ne[1] >= kColumnSplit) return false;
    for (size_t i = 0; i < ws.size(); ++i) {
        const ggml_tensor * w = ws[i];
        if (!matvec_step_supported(w, x) || w->ne[0] != ws[0]->ne[0]) return false;
        if (i + 1 < ws.size() && w->ne[1] % 16 != 0) return false;  // a thread's rows start on 16-row multiples
    }
    return true;
}

ggml_tensor * matvec_many(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                          const ProductInput * input) {
    ggml_tensor * args[GGML_MAX_SRC] = {ws[0], x};
    int64_t rows = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        if (i > 0) args[i + 1] = ws[i];
        rows += ws[i]->ne[1];
    }
    int n_args = static_cast<int>(ws.size()) + 1;
    void * userdata = nullptr;
    if (input) {
        userdata = node_input_args(*input, args);
        n_args = kNodeInputSrc + 2;
        if (input->kind == NodeInput::add_rms_norm && input->sum) rows += x->ne[0];  // the sum's block
    }
    return ggml_custom_4d(ctx, GGML_TYPE_F32, rows, x->ne[1], 1, 1, args, n_args, run_many, GGML_N_TASKS_MAX, userdata);
}

bool is_matvec_many(const ggml_tensor * t) {
    const ggml_custom_op_t fun = custom_op_function(t);
    return fun && fun == run_many;
}

const char * matvec_isa() { return kernels().name; }

int64_t matvec_max_cols() { return kMaxCols; }

bool matvec_step_takes(const ggml_tensor * w) {
    return w && kernel_for(w) && ggml_is_contiguous(w) && w->ne[2] == 1 && w->ne[3] == 1 &&
           w->ne[0] % block_of(w->type) == 0;
}

bool matvec_step_supported(const ggml_tensor * w, const ggml_tensor * x) {
    if (!matvec_step_takes(w) || !x || x->type != GGML_TYPE_F32) return false;
    if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
    return x->ne[1] >= 1;
}

bool matvec_supported(const ggml_tensor * w, const ggml_tensor * x) {
    return matvec_step_supported(w, x) && x->ne[1] <= kMaxCols;
}

bool matvec_frames_preferred(const ggml_tensor * w, const ggml_tensor * x) {
    if (!matvec_step_supported(w, x)) return false;
    if (x->ne[1] <= kMaxCols) return true;
    // Measured, encoder shapes (2048 x 512 and 512 x 2048 x 167 frames, 1024 x 1024 x 40), 2 threads,
    // GOPS (docs/performance.md): the AVX-512 VNNI kernels beat ggml's Q8_0 GEMM when ggml was built
    // without VNNI (the portable x86-64-v3 build on an AVX-512 CPU: 111-124 vs 90-106), and ggml's Q6_K
    // (no GEMM: vec_dot per element) on either build (91-99 vs 63-86). The AVX2 kernels do not beat
    // ggml's AVX2 GEMMs (Q8_0 ~89 vs ~105), so AVX2-only CPUs keep ggml. Same numbers either way.
    if (std::strcmp(kernels().name, "avx512vnni") != 0) return false;
    switch (w->type) {
        case GGML_TYPE_Q8_0: return !(cpu_backend::built_with("AVX512_VNNI") || cpu_backend::built_with("AVX_VNNI"));
        case GGML_TYPE_Q6_K: return true;
        default: return false;
    }
}

bool weight_in_cpu_memory(const ggml_tensor * w) {
    ggml_backend_buffer_t b = w ? buffer_of(w) : nullptr;
    return b && (ggml_backend_buffer_is_host(b) || is_repacked(w));
}

bool weight_is_repacked(const ggml_tensor * w) { return w && is_repacked(w); }

ggml_tensor * matvec(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, const ProductInput * input) {
    ggml_tensor * args[GGML_MAX_SRC] = {w, x};
    void * userdata = input ? node_input_args(*input, args) : nullptr;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, input ? kNodeInputSrc + 2 : 2, run,
                          GGML_N_TASKS_MAX, userdata);
}

bool matvec_takes_input(const ggml_tensor * w, const ggml_tensor * x) {
    return matvec_step_supported(w, x) && x->ne[1] < kColumnSplit;  // (rows split among the threads)
}

bool is_matvec(const ggml_tensor * t) {
    // The graph builders may rename the node (the logits are "dec.logits"), so it is recognised by its
    // function.
    const ggml_custom_op_t fun = custom_op_function(t);
    return fun && (fun == run || fun == run_many);
}

}  // namespace fun_asr

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
