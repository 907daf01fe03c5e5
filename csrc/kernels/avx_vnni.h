// Whether this compiler can build the AVX-VNNI copies of the kernels (kernels/matvec.cpp,
// kernels/gemm_avx2.cpp): AVX-VNNI's VEX intrinsics (_mm256_dpbusd_avx_epi32, _mm256_dpwssd_avx_epi32)
// arrived in GCC 11 and clang 12. Older compilers build without those copies (AVX-VNNI CPUs then run
// the AVX2 ones).
#pragma once

#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define FUN_ASR_AVX_VNNI 1
#else
#define FUN_ASR_AVX_VNNI 0
#endif
