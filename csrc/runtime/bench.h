// Micro-benchmark of ggml's matrix multiplication on a backend, for tools/bench.py's encoder bound.
#pragma once

#include <cstdint>
#include <string>

namespace fun_asr {

// Median milliseconds of mul_mat(W[k, n] of `type`, X[k, m] f32) on `device` with `threads`.
double bench_matmul(const std::string & type, int64_t n, int64_t k, int64_t m, const std::string & device,
                    int threads, int repeats);

}  // namespace fun_asr
