// Quantization through ggml's own routines (the same code llama.cpp's quantizer runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace fun_asr {

// Parses a type name (f32, f16, bf16, q8_0, q4_k, q6_k; case-insensitive).
// Throws std::invalid_argument naming the accepted values.
ggml_type parse_tensor_type(const std::string & name);

// The names parse_tensor_type accepts, in a stable order.
const std::vector<std::string> & supported_tensor_types();

// Bytes for `rows` rows of `cols` values of `type`. Throws std::invalid_argument if `cols` is not a
// multiple of the type's block size.
size_t quantized_size(ggml_type type, int64_t rows, int64_t cols);

// Quantizes a row-major float32 matrix; `dst` must hold quantized_size(type, rows, cols) bytes.
// Rows are split across `n_threads` threads (0 = hardware concurrency).
void quantize_rows(ggml_type type, const float * src, void * dst, int64_t rows, int64_t cols,
                   int n_threads = 0);

// Inverse of quantize_rows.
void dequantize_rows(ggml_type type, const void * src, float * dst, int64_t rows, int64_t cols);

}  // namespace fun_asr
