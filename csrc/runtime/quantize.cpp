#include "runtime/quantize.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace fun_asr {

namespace {

struct TypeName {
    const char * name;
    ggml_type type;
};

constexpr TypeName kTypes[] = {
    {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
    {"q8_0", GGML_TYPE_Q8_0}, {"q4_k", GGML_TYPE_Q4_K}, {"q6_k", GGML_TYPE_Q6_K},
};

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

}  // namespace

const std::vector<std::string> & supported_tensor_types() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const auto & t : kTypes) v.emplace_back(t.name);
        return v;
    }();
    return names;
}

ggml_type parse_tensor_type(const std::string & name) {
    const std::string key = lower(name);
    for (const auto & t : kTypes) {
        if (key == t.name) return t.type;
    }
    std::string accepted;
    for (const auto & t : kTypes) accepted += (accepted.empty() ? "" : ", ") + std::string(t.name);
    throw std::invalid_argument("unknown tensor type '" + name + "': accepted types are " + accepted);
}

size_t quantized_size(ggml_type type, int64_t rows, int64_t cols) {
    if (rows < 0 || cols <= 0) {
        throw std::invalid_argument("invalid matrix shape (" + std::to_string(rows) + ", " +
                                    std::to_string(cols) + "): rows must be >= 0 and cols > 0");
    }
    const int64_t block = ggml_blck_size(type);
    if (cols % block != 0) {
        throw std::invalid_argument(std::string("row length ") + std::to_string(cols) +
                                    " is not a multiple of the " + ggml_type_name(type) +
                                    " block size " + std::to_string(block));
    }
    return static_cast<size_t>(rows) * ggml_row_size(type, cols);
}

void quantize_rows(ggml_type type, const float * src, void * dst, int64_t rows, int64_t cols,
                   int n_threads) {
    const size_t row_bytes = quantized_size(type, 1, cols);
    if (rows == 0) return;
    if (type == GGML_TYPE_F32) {
        std::memcpy(dst, src, static_cast<size_t>(rows) * row_bytes);
        return;
    }
    ggml_quantize_init(type);  // builds lookup tables once, before threads start
    if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // Small matrices are not worth a thread each.
    const int64_t min_rows_per_thread = std::max<int64_t>(1, (1 << 16) / cols);
    const int64_t n_chunks = std::clamp<int64_t>(rows / min_rows_per_thread, 1, n_threads);
    const int64_t per_chunk = (rows + n_chunks - 1) / n_chunks;
    auto work = [&](int64_t first, int64_t count) {
        // ggml_quantize_chunk offsets both src and dst by `first` rows itself.
        ggml_quantize_chunk(type, src, dst, first * cols, count, cols, nullptr);
    };
    std::vector<std::thread> pool;
    for (int64_t first = per_chunk; first < rows; first += per_chunk) {
        pool.emplace_back(work, first, std::min(per_chunk, rows - first));
    }
    work(0, std::min(per_chunk, rows));
    for (auto & t : pool) t.join();
}

void dequantize_rows(ggml_type type, const void * src, float * dst, int64_t rows, int64_t cols) {
    const size_t row_bytes = quantized_size(type, 1, cols);
    if (type == GGML_TYPE_F32) {
        std::memcpy(dst, src, static_cast<size_t>(rows) * row_bytes);
        return;
    }
    const auto * traits = ggml_get_type_traits(type);
    if (traits->to_float == nullptr) {
        throw std::invalid_argument(std::string("no dequantizer for type ") + ggml_type_name(type));
    }
    const auto * bytes = static_cast<const uint8_t *>(src);
    for (int64_t r = 0; r < rows; ++r) {
        traits->to_float(bytes + r * row_bytes, dst + r * cols, cols);
    }
}

}  // namespace fun_asr
