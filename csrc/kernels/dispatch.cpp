#include "kernels/dispatch.h"

#include "kernels/attention.h"
#include "kernels/avx_vnni.h"
#include "kernels/decoder_fused.h"
#include "kernels/gemm_amx.h"
#include "kernels/gemm_avx2.h"
#include "kernels/matvec.h"

namespace fun_asr {

const CpuFeatures & cpu_features() {
    static const CpuFeatures f = [] {
        CpuFeatures c;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        c.avx2 = __builtin_cpu_supports("avx2");
        c.fma = __builtin_cpu_supports("fma");
        c.f16c = __builtin_cpu_supports("f16c");
        c.avx512f = __builtin_cpu_supports("avx512f");
        c.avx512vl = __builtin_cpu_supports("avx512vl");
        c.avx512bw = __builtin_cpu_supports("avx512bw");
        c.avx512dq = __builtin_cpu_supports("avx512dq");
        c.avx512vnni = __builtin_cpu_supports("avx512vnni");
#if FUN_ASR_AVX_VNNI
        c.avxvnni = __builtin_cpu_supports("avxvnni");
#endif
#endif
        return c;
    }();
    return f;
}

const char * cpu_kernel_name(const ggml_tensor * t) {
    if (is_amx_gemm(t)) return "GEMM_AMX";
    if (is_int8_gemm(t)) return "GEMM_INT8";
    if (is_matvec(t)) return "MATVEC";
    if (is_amx_prepare(t)) return "GEMM_AMX_PREPARE";
    if (is_int8_gemm_prepare(t)) return "GEMM_INT8_PREPARE";
    if (is_attention(t)) return "ATTN";
    return decoder_fused_op(t);
}

bool is_cpu_product(const ggml_tensor * t) { return is_matvec(t) || is_amx_gemm(t) || is_int8_gemm(t); }

bool is_cpu_product_many(const ggml_tensor * t) { return is_int8_gemm_many(t) || is_matvec_many(t); }

bool pinned_to_cpu(const ggml_tensor * t) {
    return is_cpu_product(t) || is_amx_prepare(t) || is_int8_gemm_prepare(t);
}

}  // namespace fun_asr
