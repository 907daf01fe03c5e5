// Decoder runs with the KV cache: prefill of an embedding sequence, single-token steps, and the
// whole greedy loop in C++.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "graph/stages.h"
#include "runtime/model.h"

namespace fun_asr {

std::vector<float> Model::decode_locked(const float * embeddings, const int32_t * token, int64_t n) {
    const auto & d = hp_.dec;
    const int64_t n_kv = n_past_ + n;
    if (n_kv > d.max_positions) {
        throw std::invalid_argument("sequence of " + std::to_string(n_kv) + " positions exceeds the decoder's "
                                    "context of " + std::to_string(d.max_positions));
    }
    kv_.reserve(d, ggml_backend_get_default_buffer_type(backend_), n_kv, n_past_);

    GraphScope g;
    new_graph(g);
    GraphCtx gc{g.ctx, {}};
    ggml_tensor * x;
    ggml_tensor * emb_in = nullptr;
    ggml_tensor * tok_in = nullptr;
    if (embeddings) {
        emb_in = x = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, d.d_model, n);
        ggml_set_input(emb_in);
    } else {
        tok_in = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n);
        ggml_set_input(tok_in);
        x = ggml_get_rows(g.ctx, weights_->w.tok_embd, tok_in);
    }
    ggml_tensor * pos = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n);
    ggml_tensor * mask = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, n_kv, n);
    ggml_set_input(pos);
    ggml_set_input(mask);
    DecoderInputs in{x, pos, mask, &kv_.k(), &kv_.v(), n_past_, false};
    ggml_tensor * logits = build_decoder(gc, g.gf, hp_, weights_->w, in);
    ggml_set_output(logits);
    ggml_build_forward_expand(g.gf, logits);
    alloc_graph(g.gf);

    if (emb_in) ggml_backend_tensor_set(emb_in, embeddings, 0, ggml_nbytes(emb_in));
    if (tok_in) ggml_backend_tensor_set(tok_in, token, 0, ggml_nbytes(tok_in));
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(n_past_ + i);
    ggml_backend_tensor_set(pos, positions.data(), 0, ggml_nbytes(pos));
    std::vector<float> m(static_cast<size_t>(n_kv * n));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n_kv; ++j) m[static_cast<size_t>(i * n_kv + j)] = j <= n_past_ + i ? 0.0f : -INFINITY;
    }
    ggml_backend_tensor_set(mask, m.data(), 0, ggml_nbytes(mask));
    compute_graph(g.gf);
    n_past_ = n_kv;
    std::vector<float> out(static_cast<size_t>(d.vocab));
    ggml_backend_tensor_get(logits, out.data(), 0, out.size() * sizeof(float));
    return out;
}

std::vector<float> Model::prefill(const float * embeddings, int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n <= 0) throw std::invalid_argument("embeddings are empty: need at least one row");
    n_past_ = 0;
    return decode_locked(embeddings, nullptr, n);
}

std::vector<float> Model::step(int32_t token) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_token(token);
    if (n_past_ == 0) throw std::logic_error("step() needs a prefill() first");
    return decode_locked(nullptr, &token, 1);
}

namespace {

// True when the tail of `t` is one n-gram repeated: a single token 16 times, a 2-gram 8 times, a
// 3-gram 6 times, or a 4..8-gram 4 times. Ordinary speech text does not do that; a decoder stuck
// in a loop does.
bool stuck_in_loop(const std::vector<int32_t> & t) {
    for (size_t n = 1; n <= 8; ++n) {
        const size_t reps = std::max<size_t>(4, (16 + n - 1) / n);
        if (t.size() < n * reps) continue;
        const size_t start = t.size() - n * reps;
        bool loop = true;
        for (size_t i = start + n; i < t.size() && loop; ++i) loop = t[i] == t[i - n];
        if (loop) return true;
    }
    return false;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<int32_t> Model::generate(const float * embeddings, int64_t n, int64_t max_new_tokens,
                                     const std::vector<int32_t> & stop_ids, bool repetition_guard) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n <= 0) throw std::invalid_argument("embeddings are empty: need at least one row");
    if (max_new_tokens < 1) throw std::invalid_argument("max_new_tokens must be >= 1");
    for (int32_t id : stop_ids) check_token(id);
    last_ = GenerationStats{};
    last_.prompt_tokens = n;
    auto t0 = std::chrono::steady_clock::now();
    n_past_ = 0;
    std::vector<float> logits = decode_locked(embeddings, nullptr, n);
    last_.prefill_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    for (;;) {
        const auto best = std::max_element(logits.begin(), logits.end());  // first maximum, like torch.argmax
        const int32_t tok = static_cast<int32_t>(best - logits.begin());
        out.push_back(tok);
        if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
            last_.stop_reason = "eos";
            break;
        }
        if (repetition_guard && stuck_in_loop(out)) {
            last_.stop_reason = "repetition";
            break;
        }
        if (static_cast<int64_t>(out.size()) >= max_new_tokens) {
            last_.stop_reason = "max_new_tokens";
            break;
        }
        logits = decode_locked(nullptr, &tok, 1);
    }
    last_.decode_ms = ms_since(t0);
    last_.new_tokens = static_cast<int64_t>(out.size());
    return out;
}

}  // namespace fun_asr
