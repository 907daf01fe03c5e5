// Micro-benchmark of ggml's matrix multiplication on a backend, for tools/bench.py's encoder bound.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fun_asr {

// Median milliseconds of mul_mat(W[k, n] of `type`, X[k, m] f32) on `device` with `threads`;
// with_kernels: through the graph's mul_mat helper (our small-batch kernels where they apply).
double bench_matmul(const std::string & type, int64_t n, int64_t k, int64_t m, const std::string & device,
                    int threads, int repeats, bool with_kernels = false);

// Y [m, n] = X [m, k] times W [n, k]^T with W quantized to `type`, on the CPU backend (kernel tests).
std::vector<float> eval_matmul(const std::string & type, const float * w, int64_t n, int64_t k, const float * x,
                               int64_t m, int threads, bool with_kernels);

}  // namespace fun_asr
