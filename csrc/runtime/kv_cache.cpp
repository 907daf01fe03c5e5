#include "runtime/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "runtime/backend.h"

namespace fun_asr {

KvCache::~KvCache() { release(); }

void KvCache::release() {
    if (buffer_) ggml_backend_buffer_free(buffer_);
    if (ctx_) ggml_free(ctx_);
    buffer_ = nullptr;
    ctx_ = nullptr;
    k_.clear();
    v_.clear();
    capacity_ = 0;
    n_seq_ = 0;
}

size_t KvCache::bytes() const { return buffer_ ? ggml_backend_buffer_get_size(buffer_) : 0; }

void KvCache::reserve(const DecoderHParams & d, ggml_backend_buffer_type_t buft, int64_t n_tokens, int64_t n_keep,
                      int64_t n_seq) {
    // Fewer sequences than slots use the first ones: a batch's cache serves the single transcriptions and
    // smaller batches after it without being reallocated and cleared again (a batch of 8 x 256 positions of
    // the full-size decoder is 470 MB: ~100 ms of page faults and zeroing on every alternation). Unless it is
    // large and mostly idle (over kKeepBytes and over twice what is asked for: a batch of 64 long segments
    // holds gigabytes), which goes back to the size asked for.
    constexpr size_t kKeepBytes = size_t{512} << 20;
    const size_t per_position = static_cast<size_t>(2 * d.n_layers * d.n_kv_heads * d.head_dim) * sizeof(float);
    const size_t asked = per_position * static_cast<size_t>(n_seq * n_tokens);
    const bool fits = n_seq <= n_seq_ && n_tokens <= capacity_;
    if (fits && (bytes() <= kKeepBytes || bytes() <= 2 * asked)) return;
    // Growing one sequence: double (amortized copies), in chunks of 256. A batch, or a cache that shrinks: what
    // is asked for, in chunks of 64 for a batch (its lengths are known up front).
    const int64_t chunk = n_seq > 1 ? 64 : 256;
    int64_t cap = n_seq == n_seq_ && !fits ? std::max(n_tokens, std::min<int64_t>(capacity_ * 2, d.max_positions))
                                           : n_tokens;
    cap = std::min<int64_t>((cap + chunk - 1) / chunk * chunk, std::max<int64_t>(d.max_positions, n_tokens));

    // Keep what is cached: the first n_keep positions are a contiguous prefix of each tensor.
    std::vector<std::vector<uint8_t>> saved;
    if (n_keep > 0) {  // slot 0's prefix (slot 0 is at the start of each tensor whatever n_seq is)
        for (size_t i = 0; i < k_.size(); ++i) {
            for (ggml_tensor * t : {k_[i], v_[i]}) {
                saved.emplace_back(static_cast<size_t>(n_keep) * t->nb[2]);
                ggml_backend_tensor_get(t, saved.back().data(), 0, saved.back().size());
            }
        }
    }
    release();
    const size_t n_tensors = static_cast<size_t>(2 * d.n_layers);
    ggml_init_params ip{ggml_tensor_overhead() * n_tensors, nullptr, true};
    ctx_ = ggml_init(ip);
    for (int64_t il = 0; il < d.n_layers; ++il) {
        k_.push_back(ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, d.head_dim, d.n_kv_heads, cap, n_seq));
        v_.push_back(ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, d.head_dim, d.n_kv_heads, cap, n_seq));
        ggml_format_name(k_.back(), "cache_k_l%d", static_cast<int>(il));
        ggml_format_name(v_.back(), "cache_v_l%d", static_cast<int>(il));
    }
    buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, buft);
    if (!buffer_) throw std::runtime_error("cannot allocate the KV cache for " + std::to_string(cap) + " positions");
    // Huge pages: a decode step reads every cached position's K and V rows of every layer (4 KiB each at the
    // released widths, a page each with 4 KiB pages); the attention of one sequence at 150 positions took 1.18
    // instead of 1.28 ms per step on Zen 5 (docs/performance.md).
    advise_huge_pages(buffer_);
    ggml_backend_buffer_clear(buffer_, 0);
    capacity_ = cap;
    n_seq_ = n_seq;
    static std::atomic<uint64_t> epochs{0};
    epoch_ = ++epochs;
    for (size_t i = 0, s = 0; i < saved.size() / 2; ++i) {
        ggml_backend_tensor_set(k_[i], saved[s].data(), 0, saved[s].size());
        ++s;
        ggml_backend_tensor_set(v_[i], saved[s].data(), 0, saved[s].size());
        ++s;
    }
}

}  // namespace fun_asr
