// Decoder KV cache: per layer K and V of [head_dim, n_kv_heads, capacity, n_seq] F32 — one slot per
// sequence of a batch — grown on demand.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "model/hparams.h"

namespace fun_asr {

class KvCache {
public:
    KvCache() = default;
    ~KvCache();
    KvCache(const KvCache &) = delete;
    KvCache & operator=(const KvCache &) = delete;

    // Makes room for `n_tokens` positions in each of `n_seq` slots (at least: a cache with more slots or
    // positions is kept as it is). Reallocating keeps the first `n_keep` positions of slot 0 (copies them).
    void reserve(const DecoderHParams & d, ggml_backend_buffer_type_t buft, int64_t n_tokens, int64_t n_keep,
                 int64_t n_seq = 1);
    int64_t capacity() const { return capacity_; }
    int64_t n_seq() const { return n_seq_; }
    size_t bytes() const;
    // Changes whenever the cache's tensors are reallocated (graphs that view them must be rebuilt).
    uint64_t epoch() const { return epoch_; }
    const std::vector<ggml_tensor *> & k() const { return k_; }
    const std::vector<ggml_tensor *> & v() const { return v_; }

private:
    void release();
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    std::vector<ggml_tensor *> k_, v_;
    int64_t capacity_ = 0;
    int64_t n_seq_ = 0;
    uint64_t epoch_ = 0;
};

}  // namespace fun_asr
