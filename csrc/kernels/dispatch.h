// fun-asr's CPU kernels as graph nodes, in one place for the runtime: the name a profile lists a node under, whether
// it is a product (a matmul by another path), whether it holds several matrices, and whether the scheduler must
// place it on the CPU backend by hand (a product whose weight sits in ggml's CPU_REPACK buffer, whose buffer type
// knows only ggml's MUL_MAT, would otherwise be refused). A new kernel op is one line in each of these.
#pragma once

#include "ggml.h"

namespace fun_asr {

// The CPU features the kernels choose by, probed once for all of them (all false off x86; avxvnni only where the
// compiler builds the AVX-VNNI copies, kernels/avx_vnni.h).
struct CpuFeatures {
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512vl = false, avx512bw = false, avx512dq = false, avx512vnni = false;
    bool avxvnni = false;
};
const CpuFeatures & cpu_features();

// "GEMM_AMX", "GEMM_INT8", "MATVEC", "GEMM_AMX_PREPARE", "GEMM_INT8_PREPARE", "ATTN", the decoder's fused ops
// ("ADD_RMS_NORM", ..., "ARGMAX"); null for any other node.
const char * cpu_kernel_name(const ggml_tensor * node);

// One of fun-asr's products (MATVEC, GEMM_AMX, GEMM_INT8): a MUL_MAT by another path (src[0] its weight).
bool is_cpu_product(const ggml_tensor * node);

// A product node holding several matrices (src[0], src[2], ...: "attn_q+attn_k+attn_v").
bool is_cpu_product_many(const ggml_tensor * node);

// Whether the runtime must place the node on the CPU backend itself (the products and their prepared inputs).
bool pinned_to_cpu(const ggml_tensor * node);

}  // namespace fun_asr
