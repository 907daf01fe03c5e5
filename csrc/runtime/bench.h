// Micro-benchmark of ggml's matrix multiplication on a backend, for tools/bench.py's encoder bound.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fun_asr {

// Which code path a product takes: ggml's mul_mat; the decoder's decode-step helper (mul_mat_step: the
// mat-vec kernels where they apply, else ggml's one-column arithmetic per column); the many-column
// helper of a prefill (mul_mat_frames: AMX or the int8 GEMM for Q8_0 where they apply); the audio
// encoder's (mul_mat_frames with k_quants: the int8 GEMM also for Q4_K / Q6_K).
enum class MatmulPath { ggml, decode, frames, encoder };

// Best bytes/s of reading `mb` MiB once, split across `threads` threads (the decode's bandwidth limit).
double read_bandwidth(int64_t mb, int threads, int repeats);

// Median milliseconds of mul_mat(W[k, n] of `type`, X[k, m] f32) on `device` with `threads`.
double bench_matmul(const std::string & type, int64_t n, int64_t k, int64_t m, const std::string & device,
                    int threads, int repeats, MatmulPath path = MatmulPath::ggml);

// Median ms of one column times a [rows, k] matrix of `type`, computed as rows / chunk_rows separate
// products (a decode step's sequence of layer matrices, weights streamed from memory).
double bench_matvec_chunks(const std::string & type, int64_t rows, int64_t k, int64_t chunk_rows, int threads,
                           int repeats, MatmulPath path);

// Y [m, n] = X [m, k] times W [n, k]^T with W quantized to `type`, on the CPU backend (kernel tests).
std::vector<float> eval_matmul(const std::string & type, const float * w, int64_t n, int64_t k, const float * x,
                               int64_t m, int threads, MatmulPath path);

// LayerNorm of x [T, n] (row-major) with scale w [n] and shift b [n] on the CPU: the fused node
// (kernels/fused_add: layer_norm_scale_shift) or ggml's ggml_norm, ggml_mul, ggml_add (kernel tests).
std::vector<float> eval_layer_norm(const float * x, int64_t T, int64_t n, const float * w, const float * b, float eps,
                                   int threads, bool fused);

}  // namespace fun_asr
