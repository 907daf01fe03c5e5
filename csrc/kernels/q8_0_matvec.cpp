#include "kernels/q8_0_matvec.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FUN_ASR_Q8_X86 1
#include <immintrin.h>
#else
#define FUN_ASR_Q8_X86 0
#endif

namespace fun_asr {
namespace {

constexpr int64_t kBlock = 32;       // QK8_0
constexpr size_t kBlockBytes = 34;   // fp16 scale + 32 int8
constexpr int64_t kMaxCols = 8;      // decode steps: one column per sequence of a batch
constexpr const char * kNodeName = "q8_0_matvec";

using RowsFn = void (*)(const uint8_t *, size_t, int64_t, int64_t, const int8_t *, const float *, int64_t, int64_t,
                        float *, int64_t);

#if FUN_ASR_Q8_X86
// Each ISA's copy of the kernel is compiled in its own target region; only these functions carry
// the wider instruction sets, and they run only after the CPU check in pick().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#define FUN_ASR_Q8_VNNI 0
#include "kernels/q8_0_matvec.inc"
#undef FUN_ASR_Q8_VNNI
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
#define FUN_ASR_Q8_VNNI 1
#include "kernels/q8_0_matvec.inc"
#undef FUN_ASR_Q8_VNNI
}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

struct Isa {
    RowsFn fn = nullptr;
    const char * name = "";
};

Isa pick(const std::string & want) {
    __builtin_cpu_init();
    const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
    const bool has_vnni = has_avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f");
    if (has_vnni && want != "avx2") return {vnni::rows_x_cols, "avx512vnni"};
    if (has_avx2) return {avx2::rows_x_cols, "avx2"};
    return {};
}
#else
struct Isa {
    RowsFn fn = nullptr;
    const char * name = "";
};
Isa pick(const std::string &) { return {}; }
#endif

const Isa & isa() {
    static const Isa chosen = [] {
        // FUN_ASR_Q8_MATVEC=0 turns the kernel off (A/B runs against ggml's own mul_mat);
        // =avx2 takes the AVX2 code path even on an AVX-512 CPU (tests).
        const char * env = std::getenv("FUN_ASR_Q8_MATVEC");
        const std::string want = env ? env : "";
        if (want == "0") return Isa{};
        return pick(want);
    }();
    return chosen;
}

// Quantize n columns of k floats (column c at x + c * xs floats) with ggml's own Q8_0 routine (so the
// integer dot products are exactly ggml's), then split the blocks into contiguous int8 quants
// (xq, k per column) and float scales (dx, k / 32 per column).
void quantize_cols(const float * x, int64_t xs, int64_t n, int64_t k, std::vector<uint8_t> & blocks,
                   std::vector<int8_t> & xq, std::vector<float> & dx) {
    const int64_t nb = k / kBlock;
    blocks.resize(static_cast<size_t>(nb) * kBlockBytes);
    xq.resize(static_cast<size_t>(n * k));
    dx.resize(static_cast<size_t>(n * nb));
    const auto from_float = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    for (int64_t c = 0; c < n; ++c) {
        from_float(x + c * xs, blocks.data(), k);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t * blk = blocks.data() + static_cast<size_t>(b) * kBlockBytes;
            uint16_t h;
            std::memcpy(&h, blk, sizeof h);
            dx[static_cast<size_t>(c * nb + b)] = ggml_fp16_to_fp32(h);
            std::memcpy(xq.data() + c * k + b * kBlock, blk + 2, kBlock);
        }
    }
}

void run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const int64_t k = w->ne[0], rows = w->ne[1], n = x->ne[1];
    thread_local std::vector<uint8_t> blocks;
    thread_local std::vector<int8_t> xq;
    thread_local std::vector<float> dx;
    // Every thread quantizes the (small) activation itself: no barrier needed inside the op.
    quantize_cols(static_cast<const float *>(x->data), static_cast<int64_t>(x->nb[1] / sizeof(float)), n, k, blocks,
                  xq, dx);
    // Contiguous row ranges, multiples of 16 rows (whole cache lines of output).
    const int64_t per = ((rows + nth - 1) / nth + 15) / 16 * 16;
    const int64_t r0 = std::min<int64_t>(rows, per * ith), r1 = std::min<int64_t>(rows, r0 + per);
    if (r0 >= r1) return;
    isa().fn(static_cast<const uint8_t *>(w->data), w->nb[1], r0, r1, xq.data(), dx.data(), n, k / kBlock,
             static_cast<float *>(dst->data), static_cast<int64_t>(dst->nb[1] / sizeof(float)));
}

}  // namespace

const char * q8_0_matvec_isa() { return isa().name; }

int64_t q8_0_matvec_max_cols() { return kMaxCols; }

bool q8_0_matvec_supported(const ggml_tensor * w, const ggml_tensor * x) {
    if (!isa().fn || !w || !x) return false;
    if (w->type != GGML_TYPE_Q8_0 || x->type != GGML_TYPE_F32) return false;
    if (!w->buffer || !ggml_backend_buffer_is_host(w->buffer) || w->extra != nullptr) return false;  // repacked: ggml's
    if (!ggml_is_contiguous(w) || w->ne[2] != 1 || w->ne[3] != 1) return false;
    if (x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float)) return false;
    if (x->ne[1] < 1 || x->ne[1] > kMaxCols || w->ne[0] % kBlock != 0) return false;
    return true;
}

ggml_tensor * q8_0_matvec(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    ggml_tensor * args[2] = {w, x};
    ggml_tensor * y = ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, run, GGML_N_TASKS_MAX,
                                     nullptr);
    ggml_set_name(y, kNodeName);
    return y;
}

bool is_q8_0_matvec(const ggml_tensor * t) {
    // The graph builders may rename the node (the logits are "dec.logits"), so it is recognised by
    // shape: the only custom op with a Q8_0 matrix as its first source and one output per row.
    return t && t->op == GGML_OP_CUSTOM && t->src[0] && t->src[1] && t->src[0]->type == GGML_TYPE_Q8_0 &&
           t->ne[0] == t->src[0]->ne[1] && t->ne[1] == t->src[1]->ne[1];
}

void q8_0_matvec_ref_call(const void * w, int64_t rows, int64_t k, const float * x, int64_t n, float * y) {
    if (!isa().fn) throw std::runtime_error("q8_0_matvec: no kernel for this CPU");
    std::vector<uint8_t> blocks;
    std::vector<int8_t> xq;
    std::vector<float> dx;
    quantize_cols(x, k, n, k, blocks, xq, dx);
    isa().fn(static_cast<const uint8_t *>(w), static_cast<size_t>(k / kBlock) * kBlockBytes, 0, rows, xq.data(),
             dx.data(), n, k / kBlock, y, rows);
}

}  // namespace fun_asr
