// Decoder runs with the KV cache: prefill of an embedding sequence, single-token steps, the whole
// greedy loop in C++, and the same loop for a batch of sequences (one cache slot each) so that
// every decoding step reads the weights once for all of them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

#include "graph/stages.h"
#include "kernels/attention.h"
#include "kernels/decoder_fused.h"
#include "kernels/matvec.h"
#include "runtime/model.h"

namespace fun_asr {

namespace {

int32_t argmax(const float * logits, int64_t n) {
    return static_cast<int32_t>(first_argmax(logits, n));  // std::max_element's answer: the first maximum
}

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

// FNV-1a over the bytes of n floats: equal rows give equal digests, and any bit that differs almost
// surely changes it.
uint64_t digest(const float * x, int64_t n) {
    const auto * p = reinterpret_cast<const unsigned char *>(x);
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < static_cast<size_t>(n) * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// Appends tok to g and sets g.stop_reason when generation ends with it (the same rules everywhere).
void take_token(Model::Generated & g, int32_t tok, const std::vector<int32_t> & stop_ids, bool repetition_guard,
                int64_t max_new_tokens) {
    g.tokens.push_back(tok);
    if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
        g.stop_reason = "eos";
    } else if (repetition_guard && stuck_in_loop(g.tokens)) {
        g.stop_reason = "repetition";
    } else if (static_cast<int64_t>(g.tokens.size()) >= max_new_tokens) {
        g.stop_reason = "max_new_tokens";
    }
}

// Up to `most` draft tokens to follow `tokens`, both read without the ids in `skip` (sorted): where tokens is
// a prefix of the draft, the draft's next tokens; else those after the last occurrence in the draft of
// tokens' last two. Skipped ids that tokens ends with are stepped over where the draft has them too.
std::vector<int32_t> propose(const std::vector<int32_t> & tokens, const std::vector<int32_t> & draft, int64_t most,
                             const std::vector<int32_t> & skip) {
    auto skipped = [&](int32_t id) { return !skip.empty() && std::binary_search(skip.begin(), skip.end(), id); };
    std::vector<size_t> kept;  // the draft's positions that are not skipped
    kept.reserve(draft.size());
    for (size_t j = 0; j < draft.size(); ++j) {
        if (!skipped(draft[j])) kept.push_back(j);
    }
    std::vector<int32_t> said;  // tokens, not skipped
    said.reserve(tokens.size());
    for (int32_t id : tokens) {
        if (!skipped(id)) said.push_back(id);
    }
    const size_t t = said.size();
    size_t from = std::string::npos;
    bool prefix = t <= kept.size();
    for (size_t i = 0; prefix && i < t; ++i) prefix = draft[kept[i]] == said[i];
    if (prefix) {
        from = t == 0 ? 0 : kept[t - 1] + 1;
    } else if (t >= 2) {
        for (size_t j = kept.size(); j-- > 1;) {
            if (draft[kept[j - 1]] == said[t - 2] && draft[kept[j]] == said[t - 1]) {
                from = kept[j] + 1;
                break;
            }
        }
    }
    if (from == std::string::npos) return {};
    size_t tail = tokens.size();
    while (tail > 0 && skipped(tokens[tail - 1])) --tail;
    for (; tail < tokens.size() && from < draft.size() && draft[from] == tokens[tail]; ++tail) ++from;
    if (from >= draft.size() || most <= 0) return {};
    const size_t end = std::min(draft.size(), from + static_cast<size_t>(most));
    return std::vector<int32_t>(draft.begin() + static_cast<std::ptrdiff_t>(from),
                                draft.begin() + static_cast<std::ptrdiff_t>(end));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct Model::DecoderPass {
    int64_t n, B, slot0;
    int64_t n_kv;                  // the longest sequence's positions after the pass
    int64_t n_kv_graph;            // the keys the graph spans (a reusable step graph: the whole cache)
    bool verify;
    bool embeddings;               // from embeddings (else token ids)
    bool step_pass;                // a decode step
    bool reuse;                    // through the kept step graph (Model::StepGraph)
    bool want_logprob;             // the choices' log-probabilities from the graph
    bool logprobs_asked;           // the caller asked for them (from the graph or not)
    const std::vector<int64_t> * past;
    std::vector<int64_t> kv_lens;  // each sequence's positions after the pass
    ggml_tensor *emb_in = nullptr, *tok_in = nullptr, *pos = nullptr, *rows = nullptr, *mask = nullptr;
    ggml_tensor *logits = nullptr, *choice = nullptr, *chosen_prob = nullptr;
    ggml_cgraph * gf = nullptr;
};

void Model::check_decoder_pass(int64_t n_kv, int64_t slot0, int64_t B) const {
    if (n_kv > hp_.dec.max_positions) {
        throw std::invalid_argument("sequence of " + std::to_string(n_kv) + " positions exceeds the decoder's "
                                    "context of " + std::to_string(hp_.dec.max_positions));
    }
    if (n_kv > kv_.capacity() || slot0 + B > kv_.n_seq()) throw std::logic_error("KV cache too small");
}

// The pass's graph in g: its inputs, the decoder and the logits, and for a decode step the greedy choice.
void Model::build_decoder_pass(GraphScope & g, std::vector<uint8_t> * meta, DecoderPass & p) {
    const auto & d = hp_.dec;
    const int64_t n = p.n, B = p.B;
    new_graph(g, meta);
    passes_.graphs_built += 1;
    GraphCtx gc{g.ctx, {}, caps_};
    ggml_tensor * x;
    if (p.embeddings) {
        p.emb_in = x = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, d.d_model, n * B);
        ggml_set_input(p.emb_in);
    } else {
        p.tok_in = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n * B);
        ggml_set_input(p.tok_in);
        x = get_rows(g.ctx, weights_->w.tok_lookup, p.tok_in);
    }
    p.pos = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, n * B);
    p.rows = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I64, n * B);
    p.mask = ggml_new_tensor_4d(g.ctx, GGML_TYPE_F16, p.n_kv_graph, n, 1, B);
    ggml_set_input(p.pos);
    ggml_set_input(p.rows);
    ggml_set_input(p.mask);
    DecoderInputs in{x, p.pos, p.rows, p.mask, &kv_.k(), &kv_.v(), n, B, p.n_kv_graph, p.slot0, p.verify, flash_attn_,
                     &p.kv_lens};
    in.step_products = p.verify;
    p.logits = build_decoder(gc, g.gf, hp_, weights_->w, in);
    ggml_set_output(p.logits);
    ggml_build_forward_expand(g.gf, p.logits);
    p.choice = p.chosen_prob = nullptr;
    if (n == 1 && !p.verify && caps_.argmax_in_graph) add_greedy_choice(g, p);
}

// The greedy choice in the graph: B indices to copy out. fun-asr's op on the CPU (the first maximum, split over
// the threads), ggml's ARGMAX on other devices (the logits stay there).
void Model::add_greedy_choice(GraphScope & g, DecoderPass & p) {
    if (caps_.host) {
        if (argmax_columns_supported(p.logits)) {
            p.choice = p.want_logprob ? argmax_logprob_columns(g.ctx, p.logits) : argmax_columns(g.ctx, p.logits);
        }
    } else if (p.want_logprob || !p.logprobs_asked) {
        p.choice = ggml_argmax(g.ctx, p.logits);
        if (p.want_logprob) {  // softmax(logits)[choice] per sequence: [1, 1, B]
            p.chosen_prob = chosen_probability(g.ctx, p.logits, p.choice);
            ggml_set_output(p.chosen_prob);
            ggml_build_forward_expand(g.gf, p.chosen_prob);
        }
    }
    if (p.choice) {
        ggml_set_output(p.choice);
        ggml_build_forward_expand(g.gf, p.choice);
    }
}

// p.gf ready to compute: the kept step graph where it still fits the pass, else a graph built (and kept where
// the step may reuse it) and allocated.
void Model::prepare_decoder_graph(DecoderPass & p, GraphScope & local) {
    StepGraph & sg = step_graph_;
    const bool hit = p.reuse && sg.valid && sg.B == p.B && sg.slot0 == p.slot0 && sg.cache_epoch == kv_.epoch() &&
                     sg.with_logprob == p.want_logprob;
    if (hit) {
        p.tok_in = sg.tok, p.pos = sg.pos, p.rows = sg.rows, p.mask = sg.mask, p.logits = sg.logits;
        p.choice = sg.choice, p.chosen_prob = sg.chosen_prob;
        p.gf = sg.g.gf;
        return;
    }
    p.kv_lens.assign(p.past->begin(), p.past->end());
    for (auto & len : p.kv_lens) len += p.n;
    if (p.reuse) {
        sg.valid = false;
        build_decoder_pass(sg.g, &sg.meta, p);
        // On the CPU the graph is length-independent (and each row's bits its own) only with the cached-attention
        // op in it; other devices attend over the whole cache under the mask.
        bool op = !caps_.host;
        for (int i = 0; i < ggml_graph_n_nodes(sg.g.gf) && !op; ++i) op = is_attention(ggml_graph_node(sg.g.gf, i));
        if (!op) {
            step_graph_off_ = true;
            p.reuse = false;
            p.n_kv_graph = p.n_kv;
        }
    }
    if (p.reuse) {
        p.gf = sg.g.gf;
    } else {
        build_decoder_pass(local, nullptr, p);
        p.gf = local.gf;
    }
    alloc_graph(p.gf);
    if (p.reuse) {
        sg.tok = p.tok_in, sg.pos = p.pos, sg.rows = p.rows, sg.mask = p.mask, sg.logits = p.logits;
        sg.choice = p.choice, sg.chosen_prob = p.chosen_prob;
        sg.with_logprob = p.want_logprob;
        sg.B = p.B, sg.slot0 = p.slot0, sg.cache_epoch = kv_.epoch();
        sg.valid = true;
    }
}

// The pass's embeddings or token ids, each row's position and cache row, and the mask of the keys it sees.
void Model::set_decoder_inputs(const DecoderPass & p, const float * embeddings, const int32_t * tokens) {
    const int64_t n = p.n, B = p.B, n_kv_graph = p.n_kv_graph;
    if (p.emb_in) ggml_backend_tensor_set(p.emb_in, embeddings, 0, ggml_nbytes(p.emb_in));
    if (p.tok_in) ggml_backend_tensor_set(p.tok_in, tokens, 0, ggml_nbytes(p.tok_in));
    std::vector<int32_t> positions(static_cast<size_t>(n * B));
    std::vector<int64_t> row_ids(static_cast<size_t>(n * B));
    std::vector<ggml_fp16_t> m(static_cast<size_t>(n_kv_graph * n * B));
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t pp = (*p.past)[static_cast<size_t>(b)] + i;
            positions[static_cast<size_t>(b * n + i)] = static_cast<int32_t>(pp);
            row_ids[static_cast<size_t>(b * n + i)] = (p.slot0 + b) * kv_.capacity() + pp;
            ggml_fp16_t * row = m.data() + (b * n + i) * n_kv_graph;
            for (int64_t j = 0; j < n_kv_graph; ++j) row[j] = j <= pp ? zero : minus_inf;
        }
    }
    ggml_backend_tensor_set(p.pos, positions.data(), 0, ggml_nbytes(p.pos));
    // (a decode step whose attention stores the new K/V rows itself, at the positions, reads no row ids)
    if (p.rows->buffer) ggml_backend_tensor_set(p.rows, row_ids.data(), 0, ggml_nbytes(p.rows));
    ggml_backend_tensor_set(p.mask, m.data(), 0, ggml_nbytes(p.mask));
}

// The graph's greedy choices into choices (and their log-probabilities where the graph made them).
void Model::read_choices(const DecoderPass & p, std::vector<int32_t> & choices, std::vector<float> * choice_logprobs) {
    const size_t B = static_cast<size_t>(p.B);
    choices.resize(B);
    if (p.want_logprob && p.chosen_prob) {  // the softmax's value at each choice: its log here
        ggml_backend_tensor_get(p.choice, choices.data(), 0, choices.size() * sizeof(int32_t));
        std::vector<float> probs(B);
        ggml_backend_tensor_get(p.chosen_prob, probs.data(), 0, probs.size() * sizeof(float));
        choice_logprobs->resize(B);
        for (size_t b = 0; b < B; ++b) (*choice_logprobs)[b] = static_cast<float>(std::log(static_cast<double>(probs[b])));
    } else if (p.want_logprob) {  // [index, logprob bits] per sequence (a reused graph was built the same way)
        std::vector<int32_t> pairs(2 * B);
        ggml_backend_tensor_get(p.choice, pairs.data(), 0, pairs.size() * sizeof(int32_t));
        choice_logprobs->resize(B);
        for (size_t b = 0; b < B; ++b) {
            choices[b] = pairs[2 * b];
            std::memcpy(&(*choice_logprobs)[b], &pairs[2 * b + 1], sizeof(float));
        }
    } else {
        ggml_backend_tensor_get(p.choice, choices.data(), 0, choices.size() * sizeof(int32_t));
    }
}

std::vector<float> Model::run_decoder(const float * embeddings, const int32_t * tokens, int64_t n, int64_t slot0,
                                      const std::vector<int64_t> & past, bool verify, std::vector<int32_t> * choices,
                                      std::vector<float> * choice_logprobs) {
    DecoderPass p;
    p.n = n, p.B = static_cast<int64_t>(past.size()), p.slot0 = slot0;
    p.n_kv = *std::max_element(past.begin(), past.end()) + n;
    check_decoder_pass(p.n_kv, slot0, p.B);
    stage_ = verify ? "verify" : n > 1 ? "prefill" : "decode";
    const auto t_start = std::chrono::steady_clock::now();
    // A decode step (one token per sequence) reuses the previous step's graph where it can (Model::StepGraph):
    // built for the cache's capacity, each row attending over the keys its mask leaves.
    p.verify = verify, p.embeddings = embeddings != nullptr, p.past = &past;
    p.step_pass = n == 1 && !verify && !embeddings;
    p.reuse = p.step_pass && step_graph_reusable();
    // (where the graph cannot: on the host, from the logits)
    p.logprobs_asked = choice_logprobs != nullptr;
    p.want_logprob = p.logprobs_asked && caps_.logprob_in_graph;
    p.n_kv_graph = p.reuse ? kv_.capacity() : p.n_kv;
    GraphScope local;
    prepare_decoder_graph(p, local);
    // (a decode step's share also apart: last_generation()'s step_* keys)
    auto account = [&](double PassTimes::*all, double PassTimes::*steps, double ms) {
        passes_.*all += ms;
        if (p.step_pass) passes_.*steps += ms;
    };
    account(&PassTimes::graph_ms, &PassTimes::step_graph_ms, ms_since(t_start));
    auto t_io = std::chrono::steady_clock::now();
    set_decoder_inputs(p, embeddings, tokens);
    account(&PassTimes::transfer_ms, &PassTimes::step_transfer_ms, ms_since(t_io));
    const auto t_compute = std::chrono::steady_clock::now();
    compute_graph(p.gf, n == 1 ? p.B : 0);
    account(&PassTimes::compute_ms, &PassTimes::step_compute_ms, ms_since(t_compute));
    t_io = std::chrono::steady_clock::now();
    if (choices) choices->clear();
    if (choice_logprobs) choice_logprobs->clear();
    if (choices && p.choice) {
        read_choices(p, *choices, choice_logprobs);
        if (!logit_digests_on_) {
            account(&PassTimes::transfer_ms, &PassTimes::step_transfer_ms, ms_since(t_io));
            return {};
        }
    }
    std::vector<float> out(static_cast<size_t>(hp_.dec.vocab * p.B * (verify ? n : 1)));
    ggml_backend_tensor_get(p.logits, out.data(), 0, out.size() * sizeof(float));
    account(&PassTimes::transfer_ms, &PassTimes::step_transfer_ms, ms_since(t_io));
    return out;
}

int64_t Model::step_chunk() const {
    // A decode step's graph has a fixed number of nodes per layer, except where it runs per-sequence
    // ops: the matmul attention (one chain per sequence, ~16 nodes) and the products of repacked
    // weights that no kernel takes (ggml's GEMV in groups of 3 columns, ~1 node per column). Those
    // stay within half the graph; a larger batch steps in chunks of sequences, which gives the same
    // numbers (no sequence's numbers depend on the others) at the cost of reading the weights again.
    auto per_column = [](ggml_tensor * w) { return weight_is_repacked(w) && !matvec_step_takes(w) ? 1 : 0; };
    // (a KV cache on a GPU attends in one chain for the whole batch: decoder_qwen3.cpp)
    const bool per_sequence_attention = !flash_attn_ && caps_.host;
    int64_t per_seq = per_column(weights_->w.output);
    for (const Qwen3Layer & l : weights_->w.dec) {
        per_seq += per_sequence_attention ? 16 : 0;
        for (ggml_tensor * w : {l.q, l.k, l.v, l.o, l.gate, l.up, l.down}) per_seq += per_column(w);
    }
    if (per_seq == 0) return std::numeric_limits<int64_t>::max();
    return std::max<int64_t>(1, static_cast<int64_t>(kGraphSize / 2) / per_seq);
}

std::vector<float> Model::prefill_locked(const float * embeddings, int64_t n) {
    kv_.reserve(hp_.dec, ggml_backend_get_default_buffer_type(backend_), n, 0, 1);
    n_past_ = 0;
    std::vector<float> logits = run_decoder(embeddings, nullptr, n, 0, {0});
    n_past_ = n;
    return logits;
}

std::vector<float> Model::step_locked(int32_t token) {
    kv_.reserve(hp_.dec, ggml_backend_get_default_buffer_type(backend_), n_past_ + 1, n_past_, 1);
    std::vector<float> logits = run_decoder(nullptr, &token, 1, 0, {n_past_});
    n_past_ += 1;
    return logits;
}

std::vector<float> Model::prefill(const float * embeddings, int64_t n) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_in_callback("prefill");
    if (n <= 0) throw std::invalid_argument("embeddings are empty: need at least one row");
    return prefill_locked(embeddings, n);
}

std::vector<float> Model::step(int32_t token) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_in_callback("step");
    check_token(token);
    if (n_past_ == 0) throw std::logic_error("step() needs a prefill() first");
    return step_locked(token);
}

std::vector<int32_t> Model::generate(const float * embeddings, int64_t n, int64_t max_new_tokens,
                                     const std::vector<int32_t> & stop_ids, bool repetition_guard) {
    GenerateOptions options;
    options.repetition_guard = repetition_guard;
    auto all = generate_batch({{embeddings, n}}, max_new_tokens, stop_ids, options);
    return all[0].tokens;
}

bool Model::prefix_matches(const float * embeddings, int64_t n) const {
    const int64_t P = prefix_len();
    return P > 0 && n > P && std::equal(prefix_rows_.begin(), prefix_rows_.end(), embeddings);
}

void Model::clear_prefix() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_in_callback("clear_prefix");
    prefix_rows_.clear();
    prefix_k_.clear();
    prefix_v_.clear();
}

void Model::set_prefix(const float * embeddings, int64_t n) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_in_callback("set_prefix");
    if (n <= 0) throw std::invalid_argument("prefix embeddings are empty: need at least one row");
    const auto & d = hp_.dec;
    if (n >= d.max_positions) throw std::invalid_argument("prefix longer than the decoder's context");
    n_past_ = 0;
    kv_.reserve(d, ggml_backend_get_default_buffer_type(backend_), n, 0, 1);
    run_decoder(embeddings, nullptr, n, 0, {0});
    prefix_k_.assign(kv_.k().size(), {});
    prefix_v_.assign(kv_.v().size(), {});
    for (size_t l = 0; l < kv_.k().size(); ++l) {
        const size_t bytes = static_cast<size_t>(n) * kv_.k()[l]->nb[2];  // nb[2]: one position's K (all heads)
        prefix_k_[l].resize(bytes);
        prefix_v_[l].resize(bytes);
        ggml_backend_tensor_get(kv_.k()[l], prefix_k_[l].data(), 0, bytes);
        ggml_backend_tensor_get(kv_.v()[l], prefix_v_[l].data(), 0, bytes);
    }
    prefix_rows_.assign(embeddings, embeddings + n * d.d_model);
}

namespace {

// The most prompt positions one grouped prefill pass takes.
constexpr int64_t kGroupRows = 2048;

// token_limits (one per given sequence): each from 1 to max_new_tokens.
void check_token_limits(const std::vector<int64_t> & token_limits, int64_t B, int64_t max_new_tokens) {
    if (static_cast<int64_t>(token_limits.size()) != B) {
        throw std::invalid_argument("max_new_tokens has " + std::to_string(token_limits.size()) +
                                    " entries for " + std::to_string(B) + " sequences (one each, or one number)");
    }
    for (int64_t m : token_limits) {
        if (m < 1 || m > max_new_tokens) {
            throw std::invalid_argument("each max_new_tokens must be from 1 to " + std::to_string(max_new_tokens));
        }
    }
}

}  // namespace

// generate_batch's state: the prompts (those that join: their rows owned here), the results and, per cache slot,
// the prompt it decodes, its next token (and that token's log-probability where asked), its cached positions, and
// whether `next` is still to take.
struct Model::BatchRun {
    BatchRun(const GenerateOptions & o, const std::vector<int32_t> & stops, int64_t most_new,
             const std::vector<std::pair<const float *, int64_t>> & prompts, int64_t slots, bool cont)
        : opt(o), stop_ids(stops), max_new_tokens(most_new), given(static_cast<int64_t>(prompts.size())), B(given),
          S(slots), continuous(cont), all(prompts), out(static_cast<size_t>(B)), seq(static_cast<size_t>(S), -1),
          next(static_cast<size_t>(S)), next_lp(static_cast<size_t>(S), 0.0f), past(static_cast<size_t>(S)),
          to_take(static_cast<size_t>(S), 0) {}
    const GenerateOptions & opt;
    const std::vector<int32_t> & stop_ids;
    int64_t max_new_tokens;
    int64_t given;  // the prompts given
    int64_t B;      // sequences so far (the given ones, then those that join)
    int64_t S;      // cache slots
    bool continuous;
    std::vector<std::pair<const float *, int64_t>> all;
    std::deque<std::vector<float>> joined_rows;
    std::vector<Generated> out;
    std::vector<int64_t> seq;
    std::vector<int32_t> next;
    std::vector<float> next_lp;
    std::vector<int64_t> past;
    std::vector<char> to_take;
    int64_t most_grouped = 1;      // sequences one prefill pass takes
    std::vector<float> joined;     // a prefill group's rows side by side
    std::vector<uint8_t> moving;   // a slot's K/V rows on their way to another slot
    int64_t active = 0, waiting = 0;  // slots in use; prompts not yet admitted
    int64_t running = 0;   // sequences not finished
    int64_t produced = 0;  // tokens taken over all sequences
    // sequence q's most new tokens
    int64_t limit(int64_t q) const {
        return opt.token_limits && q < given ? (*opt.token_limits)[static_cast<size_t>(q)] : max_new_tokens;
    }
};

template <class Call>
void Model::in_callback(const Call & call) {
    struct Flag {
        bool & on;
        explicit Flag(bool & f) : on(f) { on = true; }
        ~Flag() { on = false; }
    } flag(in_callback_);
    call();
}

void Model::check_generate_request(const std::vector<std::pair<const float *, int64_t>> & prompts,
                                   int64_t max_new_tokens, const std::vector<int32_t> & stop_ids,
                                   const GenerateOptions & o) const {
    if (o.join && o.max_active <= 0) throw std::invalid_argument("joining prompts needs max_active > 0 (continuous batching)");
    if (o.join && o.draft) throw std::invalid_argument("joining prompts is not for a draft's single sequence");
    if (o.join_rows < 0) throw std::invalid_argument("join_rows must be >= 0");
    if (prompts.empty()) throw std::invalid_argument("no sequences to generate");
    if (o.draft && prompts.size() != 1) {
        throw std::invalid_argument("a draft is for one sequence; got " + std::to_string(prompts.size()));
    }
    if (o.draft) {
        for (int32_t id : *o.draft) check_token(id);
    }
    if (o.max_active < 0) throw std::invalid_argument("max_active must be >= 0 (0 = every sequence at once)");
    for (const auto & p : prompts) {
        if (p.second <= 0) throw std::invalid_argument("embeddings are empty: need at least one row");
    }
    if (max_new_tokens < 1) throw std::invalid_argument("max_new_tokens must be >= 1");
    for (int32_t id : stop_ids) check_token(id);
    if (o.token_limits) check_token_limits(*o.token_limits, static_cast<int64_t>(prompts.size()), max_new_tokens);
}

// The most prompt positions a slot holds (a joining prompt's: join_rows), checked against the decoder's context.
int64_t Model::longest_prompt(const std::vector<std::pair<const float *, int64_t>> & prompts, int64_t max_new_tokens,
                              const GenerateOptions & o) const {
    const auto & d = hp_.dec;
    int64_t longest = o.join ? std::min(o.join_rows, d.max_positions - max_new_tokens + 1) : 0;
    for (const auto & p : prompts) longest = std::max(longest, p.second);
    if (longest + max_new_tokens - 1 > d.max_positions) {
        throw std::invalid_argument("prompt of " + std::to_string(longest) + " positions + max_new_tokens " +
                                    std::to_string(max_new_tokens) + " exceeds the decoder's context of " +
                                    std::to_string(d.max_positions));
    }
    return longest;
}

std::vector<Model::Generated> Model::generate_batch(const std::vector<std::pair<const float *, int64_t>> & prompts,
                                                    int64_t max_new_tokens, const std::vector<int32_t> & stop_ids,
                                                    const GenerateOptions & options) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_in_callback("generate_batch");
    check_generate_request(prompts, max_new_tokens, stop_ids, options);
    const auto & d = hp_.dec;
    const int64_t longest = longest_prompt(prompts, max_new_tokens, options);
    // Continuous batching: at most max_active sequences hold a cache slot at once; when one ends, the last
    // running slot moves into its place (its K/V rows copied, the same bits) and the next prompt's prefill takes
    // the free slot at the end. Every sequence's numbers are its own in any batch (batch invariance), so the
    // tokens and logits are those of the sequence decoded alone.
    const int64_t given = static_cast<int64_t>(prompts.size());
    const bool continuous = options.max_active > 0 && (options.max_active < given || options.join) && !options.draft;
    const int64_t S = continuous ? options.max_active : given;  // cache slots
    BatchRun r(options, stop_ids, max_new_tokens, prompts, S, continuous);
    last_ = GenerationStats{};
    passes_ = PassTimes{};
    auto t0 = std::chrono::steady_clock::now();
    n_past_ = 0;  // the single-sequence state does not survive a batch
    kv_.reserve(d, ggml_backend_get_default_buffer_type(backend_), longest + max_new_tokens, 0, S);
    digests_.assign(logit_digests_on_ ? static_cast<size_t>(given) : 0, {});
    logprobs_.assign(token_logprobs_on_ ? static_cast<size_t>(given) : 0, {});
    // On the CPU, neighbouring sequences with the same cached prefix and the same number of new positions go
    // through one prefill pass (Model::prefill_group).
    r.most_grouped = caps_.host && flash_attn_ ? step_chunk() : 1;
    r.active = std::min(S, given), r.waiting = given - r.active;
    admit(r, 0, 0, r.active);
    if (options.on_step) options.on_step(0, given);
    t0 = std::chrono::steady_clock::now();
    const double prefill_before_decode = last_.prefill_ms;
    if (options.draft && !options.draft->empty() && draft_max_ > 0 && flash_attn_) {
        decode_with_draft(r.out[0], r.next[0], r.next_lp[0], r.past[0], r.limit(0), stop_ids, options.repetition_guard,
                          *options.draft, options.on_step);
    } else {
        decode_batch(r);
    }
    finish_generation(r, ms_since(t0) - (last_.prefill_ms - prefill_before_decode));
    return std::move(r.out);
}

// Prompts first .. first+count-1 into slots slot .. slot+count-1: the cached prefix where they start with it, then
// the prefill of the rest.
void Model::admit(BatchRun & r, int64_t first, int64_t slot, int64_t count) {
    const auto t_admit = std::chrono::steady_clock::now();
    std::vector<int64_t> done(static_cast<size_t>(count), 0);  // each prompt's positions already cached
    reuse_prefix(r, first, slot, count, done);
    for (int64_t b = 0; b < count;) b = prefill_group(r, first, slot, b, count, done);
    last_.prefill_ms += ms_since(t_admit);
}

// The cached prefix K/V instead of recomputing them, for the prompts that start with the prefix: positions
// 0..P-1 of their slots (done[j] = P).
void Model::reuse_prefix(BatchRun & r, int64_t first, int64_t slot, int64_t count, std::vector<int64_t> & done) {
    const int64_t P = prefix_len();
    for (int64_t j = 0; j < count; ++j) {
        const auto & p = r.all[static_cast<size_t>(first + j)];
        r.seq[static_cast<size_t>(slot + j)] = first + j;
        if (P > 0 && prefix_matches(p.first, p.second)) {
            for (size_t l = 0; l < kv_.k().size(); ++l) {  // (nb[3]: the slot stride)
                const size_t at = static_cast<size_t>(slot + j) * kv_.k()[l]->nb[3];
                ggml_backend_tensor_set(kv_.k()[l], prefix_k_[l].data(), at, prefix_k_[l].size());
                ggml_backend_tensor_set(kv_.v()[l], prefix_v_[l].data(), at, prefix_v_[l].size());
            }
            done[static_cast<size_t>(j)] = P;
            last_.prefix_reused += P;
        }
    }
}

// The prefill of admitted prompt b and the neighbours that go with it through one pass; returns the first prompt
// after them. On the CPU, neighbouring sequences with the same cached prefix and the same number of new positions
// share a pass (every weight read once for the group; the products' and the attention op's numbers per column /
// row are the same alone or in a group, so each sequence's bits are its own); above the mat-vec kernels' column
// count only, where a lone prefill takes the many-column products too; at most kGroupRows positions per pass.
int64_t Model::prefill_group(BatchRun & r, int64_t first, int64_t slot, int64_t b, int64_t count,
                             const std::vector<int64_t> & done) {
    const auto & d = hp_.dec;
    const auto & p = r.all[static_cast<size_t>(first + b)];
    const int64_t from = done[static_cast<size_t>(b)], n = p.second - from;
    int64_t e = b + 1;
    auto joins = [&](int64_t j) {
        const auto & q = r.all[static_cast<size_t>(first + j)];
        return n > matvec_max_cols() && done[static_cast<size_t>(j)] == from && q.second - from == n &&
               j - b < r.most_grouped && (j - b + 1) * n <= kGroupRows;
    };
    while (e < count && joins(e)) ++e;
    const int64_t m = e - b;
    const float * emb = p.first + from * d.d_model;
    if (m > 1) {
        const size_t rows = static_cast<size_t>(n * d.d_model);
        r.joined.resize(static_cast<size_t>(m) * rows);
        for (int64_t j = 0; j < m; ++j) {
            std::memcpy(r.joined.data() + static_cast<size_t>(j) * rows,
                        r.all[static_cast<size_t>(first + b + j)].first + from * d.d_model, rows * sizeof(float));
        }
        emb = r.joined.data();
    }
    const std::vector<float> logits =
        run_decoder(emb, nullptr, n, slot + b, std::vector<int64_t>(static_cast<size_t>(m), from));
    for (int64_t j = 0; j < m; ++j) {
        const float * row = logits.data() + j * d.vocab;
        const size_t s = static_cast<size_t>(slot + b + j), q = static_cast<size_t>(first + b + j);
        r.next[s] = argmax(row, d.vocab);
        if (token_logprobs_on_) r.next_lp[s] = chosen_logprob(row, d.vocab, r.next[s]);
        if (logit_digests_on_) digests_[q].push_back(digest(row, d.vocab));
        r.past[s] = r.all[q].second;
        r.to_take[s] = 1;
        last_.prompt_tokens += r.all[q].second;
    }
    last_.prefill_passes += 1;
    return e;
}

// Every slot's pending token into its sequence; done() for each sequence that ends with it.
void Model::take_tokens(BatchRun & r) {
    for (int64_t s = 0; s < r.active; ++s) {
        const size_t si = static_cast<size_t>(s);
        if (!r.to_take[si]) continue;
        r.to_take[si] = 0;
        const int64_t q = r.seq[si];
        Generated & g = r.out[static_cast<size_t>(q)];
        if (!g.stop_reason.empty()) continue;
        take_token(g, r.next[si], r.stop_ids, r.opt.repetition_guard, r.limit(q));
        if (token_logprobs_on_) logprobs_[static_cast<size_t>(q)].push_back(r.next_lp[si]);
        ++r.produced;
        if (!g.stop_reason.empty()) {
            --r.running;
            if (r.opt.done) in_callback([&] { r.opt.done(q, g); });
        }
    }
}

// Slot `from`'s cached positions into slot `to` (continuous batching: the last running slot fills a gap).
void Model::move_slot(BatchRun & r, int64_t from, int64_t to) {
    const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to);
    for (const auto * caches : {&kv_.k(), &kv_.v()}) {
        for (ggml_tensor * c : *caches) {
            const size_t bytes = static_cast<size_t>(r.past[f]) * c->nb[2];
            r.moving.resize(bytes);
            ggml_backend_tensor_get(c, r.moving.data(), f * c->nb[3], bytes);
            ggml_backend_tensor_set(c, r.moving.data(), t * c->nb[3], bytes);
        }
    }
    r.seq[t] = r.seq[f];
    r.next[t] = r.next[f];
    r.next_lp[t] = r.next_lp[f];
    r.past[t] = r.past[f];
    r.to_take[t] = r.to_take[f];
    last_.slot_moves += 1;
}

// Finished slots leave; the last running one takes each place.
void Model::release_finished(BatchRun & r) {
    for (int64_t s = r.active; s-- > 0;) {
        if (r.out[static_cast<size_t>(r.seq[static_cast<size_t>(s)])].stop_reason.empty()) continue;
        if (s != r.active - 1) move_slot(r, r.active - 1, s);
        --r.active;
    }
}

// Prompts that arrived since (join's): they wait for admission like the given ones, their results after those.
void Model::join_prompts(BatchRun & r) {
    const auto & d = hp_.dec;
    const int64_t free_slots = r.S - r.active;
    const int64_t room = std::min(kv_.capacity(), d.max_positions) - r.max_new_tokens + 1;
    std::vector<std::vector<float>> fresh;
    in_callback([&] { fresh = r.opt.join(free_slots, room); });
    for (auto & rows : fresh) {
        const int64_t n = static_cast<int64_t>(rows.size()) / d.d_model;
        if (rows.empty() || n * d.d_model != static_cast<int64_t>(rows.size()) || n > room) {
            throw std::invalid_argument("a joining prompt must have 1 to " + std::to_string(room) +
                                        " whole rows of " + std::to_string(d.d_model) + " values");
        }
    }
    if (static_cast<int64_t>(fresh.size()) > free_slots) {
        throw std::invalid_argument("join returned " + std::to_string(fresh.size()) + " prompts for " +
                                    std::to_string(free_slots) + " free slots");
    }
    for (auto & rows : fresh) {
        r.joined_rows.push_back(std::move(rows));
        r.all.emplace_back(r.joined_rows.back().data(), static_cast<int64_t>(r.joined_rows.back().size()) / d.d_model);
        r.out.emplace_back();
        if (logit_digests_on_) digests_.emplace_back();
        if (token_logprobs_on_) logprobs_.emplace_back();
        ++r.B;
        ++r.waiting;
        ++r.running;
    }
}

// The decode steps of the batch until every sequence has ended.
void Model::decode_batch(BatchRun & r) {
    r.running = r.B;
    r.produced = 0;
    const int64_t chunk = max_step_seqs_ > 0 ? std::min(max_step_seqs_, step_chunk()) : step_chunk();
    for (;;) {
        bool admitted = true;
        while (admitted) {  // (a sequence admitted here may end at its first token: take again)
            admitted = false;
            take_tokens(r);
            if (!r.continuous) break;  // (finished slots keep stepping: the batch's shape stays)
            release_finished(r);
            if (r.opt.join && r.waiting == 0 && r.active < r.S) join_prompts(r);
            if (r.waiting > 0 && r.active < r.S) {
                const int64_t k = std::min(r.waiting, r.S - r.active);
                admit(r, r.B - r.waiting, r.active, k);
                r.active += k;
                r.waiting -= k;
                admitted = true;
            }
        }
        if (r.opt.on_step) r.opt.on_step(r.produced, r.running);
        if (r.running == 0) break;
        decode_step(r, chunk);
    }
}

// One step for every slot in use (the weights are read once for all, or once per chunk of step_chunk()
// sequences), and each slot's next token.
void Model::decode_step(BatchRun & r, int64_t chunk) {
    const auto & d = hp_.dec;
    const int64_t active = r.active;
    std::vector<float> logits;
    std::vector<int32_t> chosen, part_chosen;  // the graph's greedy choices, where it makes them
    std::vector<float> chosen_lp, part_lp;     // and their log-probabilities, where asked and made there
    ++last_.decode_passes;
    for (int64_t b0 = 0; b0 < active; b0 += chunk) {
        const int64_t m = std::min(chunk, active - b0);
        const std::vector<int64_t> part(r.past.begin() + b0, r.past.begin() + b0 + m);
        std::vector<float> l = run_decoder(nullptr, r.next.data() + b0, 1, b0, part, false, &part_chosen,
                                           token_logprobs_on_ ? &part_lp : nullptr);
        if (b0 == 0 && m == active) {
            logits.swap(l);
            chosen.swap(part_chosen);
            chosen_lp.swap(part_lp);
        } else {
            logits.insert(logits.end(), l.begin(), l.end());
            chosen.insert(chosen.end(), part_chosen.begin(), part_chosen.end());
            chosen_lp.insert(chosen_lp.end(), part_lp.begin(), part_lp.end());
        }
    }
    const bool picked = static_cast<int64_t>(chosen.size()) == active;  // every chunk's graph chose
    if (!picked && static_cast<int64_t>(logits.size()) != active * d.vocab) {
        throw std::logic_error("a decode step's chunks came back with neither choices nor logits for all");
    }
    const auto t_select = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < active; ++s) {
        const size_t si = static_cast<size_t>(s);
        const float * row = logits.empty() ? nullptr : logits.data() + s * d.vocab;
        r.next[si] = picked ? chosen[si] : argmax(row, d.vocab);
        if (token_logprobs_on_) {
            r.next_lp[si] = static_cast<int64_t>(chosen_lp.size()) == active ? chosen_lp[si]
                                                                             : chosen_logprob(row, d.vocab, r.next[si]);
        }
        r.past[si] += 1;
        r.to_take[si] = 1;
        // a running sequence takes this token before the next step: keep the digest of its row
        const size_t q = static_cast<size_t>(r.seq[si]);
        if (logit_digests_on_ && r.out[q].stop_reason.empty()) digests_[q].push_back(digest(row, d.vocab));
    }
    last_.select_ms += ms_since(t_select);
}

// The generation's totals into last_generation().
void Model::finish_generation(const BatchRun & r, double decode_ms) {
    last_.decode_ms = decode_ms;
    for (const auto & g : r.out) last_.new_tokens += static_cast<int64_t>(g.tokens.size());
    last_.stop_reason = r.B == 1 ? r.out[0].stop_reason : "batch";
    last_.graph_ms = passes_.graph_ms;
    last_.transfer_ms = passes_.transfer_ms;
    last_.compute_ms = passes_.compute_ms;
    last_.step_graph_ms = passes_.step_graph_ms;
    last_.step_transfer_ms = passes_.step_transfer_ms;
    last_.step_compute_ms = passes_.step_compute_ms;
    last_.graphs_built = passes_.graphs_built;
}

void Model::refuse_in_callback(const char * what) const {
    if (in_callback_) {
        throw std::logic_error(std::string(what) + " cannot run inside generate_batch's join or done callback (the "
                               "batch holds the decoder); only encode, embed and the CTC head can");
    }
}

void Model::decode_with_draft(Generated & g, int32_t next, float next_logprob, int64_t past, int64_t max_new_tokens,
                              const std::vector<int32_t> & stop_ids, bool repetition_guard,
                              const std::vector<int32_t> & draft, const StepCallback & on_step) {
    const int64_t V = hp_.dec.vocab;
    bool drafting = true;  // a pass that keeps none of its draft tokens ends drafting for this generation
    for (;;) {
        take_token(g, next, stop_ids, repetition_guard, max_new_tokens);
        if (token_logprobs_on_) logprobs_[0].push_back(next_logprob);
        if (on_step) on_step(static_cast<int64_t>(g.tokens.size()), g.stop_reason.empty() ? 1 : 0);
        if (!g.stop_reason.empty()) return;
        // Draft tokens to verify after `next`: at most as many as may still be generated, less one, so that
        // no position past the prompt + max_new_tokens - 1 the cache was sized for is written.
        const int64_t room = max_new_tokens - static_cast<int64_t>(g.tokens.size()) - 1;
        const std::vector<int32_t> cand =
            drafting ? propose(g.tokens, draft, std::min(draft_max_, room), draft_skip_) : std::vector<int32_t>{};
        std::vector<int32_t> in(1, next);
        in.insert(in.end(), cand.begin(), cand.end());
        const int64_t n = static_cast<int64_t>(in.size());
        ++last_.decode_passes;
        // Position i's logits choose the token after in[i]; a draft token is kept while it is that choice.
        const std::vector<float> logits = run_decoder(nullptr, in.data(), n, 0, {past}, n > 1);
        last_.draft_proposed += n - 1;
        const int64_t kept_before = last_.draft_accepted;
        int64_t i = 0;
        for (;; ++i) {
            const float * row = logits.data() + i * V;
            const int32_t choice = argmax(row, V);
            const float choice_lp = token_logprobs_on_ ? chosen_logprob(row, V, choice) : 0.0f;
            if (logit_digests_on_) digests_[0].push_back(digest(row, V));
            past += 1;  // in[i] is now in the cache for good
            if (i + 1 < n && choice == in[static_cast<size_t>(i + 1)]) {
                ++last_.draft_accepted;
                take_token(g, choice, stop_ids, repetition_guard, max_new_tokens);
                if (token_logprobs_on_) logprobs_[0].push_back(choice_lp);
                if (!g.stop_reason.empty()) {
                    if (on_step) on_step(static_cast<int64_t>(g.tokens.size()), 0);
                    return;
                }
                continue;
            }
            next = choice;  // the first token the draft did not have (or the one after the whole draft)
            next_logprob = choice_lp;
            break;
        }
        // the draft has stopped helping -- unless greedy put a token to skip where the draft went on
        if (n > 1 && last_.draft_accepted == kept_before &&
            !std::binary_search(draft_skip_.begin(), draft_skip_.end(), next)) {
            drafting = false;
        }
    }
}

}  // namespace fun_asr
