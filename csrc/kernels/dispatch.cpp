#include "kernels/dispatch.h"

#include "kernels/attention.h"
#include "kernels/decoder_fused.h"
#include "kernels/gemm_amx.h"
#include "kernels/gemm_avx2.h"
#include "kernels/matvec.h"

namespace fun_asr {

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
