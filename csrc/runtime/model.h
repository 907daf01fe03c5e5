// A loaded Fun-ASR-Nano model and its inference state on one backend.
//
// Thread safety: every public method locks the model's mutex, so one Model may be shared between
// threads, but calls run one at a time (the KV cache is part of the model).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "model/hparams.h"
#include "graph/common.h"
#include "model/loader.h"
#include "runtime/device_runtime.h"
#include "runtime/kv_cache.h"
#include "runtime/thread_chooser.h"

namespace fun_asr {

struct Stage {
    std::vector<int64_t> shape;  // row-major (numpy) shape
    std::vector<float> data;
};

class Model : public DeviceRuntime {
public:
    // Nodes of one compute graph (the scheduler's hash set is sized for it at load).
    static constexpr size_t kGraphSize = 16384;
    // device: "cpu", "cuda", "cuda:N", "gpu", or "auto" (a GPU when there is one). threads: 0 = all cores.
    Model(const ModelSource & src, const std::string & device, int threads);
    ~Model() override;
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    const HParams & hparams() const { return hp_; }
    size_t weight_bytes() const { return weights_->bytes; }
    bool weights_mmapped() const { return weights_->mmapped; }
    size_t repacked_tensors() const { return weights_->repacked; }
    size_t q8_0_quads_tensors() const { return weights_->quads; }
    // on a GPU: the matrices kept in host memory (their products run on the CPU), and whether the token ids'
    // lookups run on the CPU (model/loader.cpp)
    std::vector<std::string> host_weights() const {
        std::vector<std::string> names;
        for (const ggml_tensor * t : weights_->host_weights) names.emplace_back(t->name);
        return names;
    }
    bool host_token_lookup() const { return weights_->host_token_lookup; }
    std::map<std::string, std::string> tensor_types() const;
    // threads = 0 (auto): all cores until decode steps have been timed, then the fastest count
    // (runtime/thread_chooser.h); threads() is then the most it uses, threads_now() the current pick.
    void set_threads(int threads);
    bool threads_auto() const { return auto_threads_; }
    int threads_now() const { return auto_threads_ ? chooser_.bulk_threads() : threads_; }
    const ThreadChooser & thread_chooser() const { return chooser_; }
    int64_t n_past() const { return n_past_; }
    // Decoder attention through ggml's fused flash-attention kernel (default) or matmul/softmax/matmul.
    bool flash_attn() const { return flash_attn_; }
    void set_flash_attn(bool on) { flash_attn_ = on; }
    size_t kv_bytes() const { return kv_.bytes(); }

    // features: row-major [T, input_size] -> adaptor output row-major [T, adp.d_model]
    std::vector<float> encode(const float * features, int64_t T);
    // Every named stage output (enc.in, enc.blk.{i}.out, enc.out, adp.proj.out, adp.blk.{i}.out, adp.out;
    // with a CTC head also ctc.proj.out, ctc.blk.{i}.out, ctc.dec.out, ctc.logits).
    std::map<std::string, Stage> debug_stages(const float * features, int64_t T);

    // The CTC head (FunASR/ModelScope checkpoints with every CTC tensor): present or why not.
    bool has_ctc() const { return hp_.ctc.present; }
    // features [T, input_size] -> CTC log-probabilities row-major [T, ctc.vocab] (one row per 60 ms
    // encoder frame; log-softmax over the CTC vocabulary). Throws std::logic_error without a CTC head.
    std::vector<float> ctc_logprobs(const float * features, int64_t T);
    // Both in one encoder pass: adaptor output [T, adp.d_model] and CTC log-probabilities [T, ctc.vocab].
    std::pair<std::vector<float>, std::vector<float>> encode_ctc(const float * features, int64_t T);
    // encode() that also returns the encoder's output row-major [T, enc.d_model] (kept so that the CTC head
    // can run on it later, only if needed: ctc_greedy).
    std::pair<std::vector<float>, std::vector<float>> encode_keep_encoder(const float * features, int64_t T);
    // encode() / encode_keep_encoder() of several feature matrices (features[i]: [lengths[i], input_size]) in
    // packed passes (GraphCtx::segments: every sequence's frames side by side, attention and FSMN per sequence):
    // each one's outputs are encode()'s of it alone wherever the products' columns are independent (every
    // fun-asr kernel; tests/test_packed_encoding.py). Encoder outputs are empty without keep_encoder. At most
    // max_packed_sequences() sequences go in one graph; more take several passes.
    std::vector<std::pair<std::vector<float>, std::vector<float>>> encode_batch(
        const std::vector<const float *> & features, const std::vector<int64_t> & lengths, bool keep_encoder);
    int64_t max_packed_sequences() const;
    // The CTC head on an encoder output [T, enc.d_model] -> each frame's most likely CTC label (the argmax of
    // its logits, taken in the graph: T ids, not T x ctc.vocab floats). Merged repeats without blanks are the
    // CTC greedy transcript: the draft of speculative decoding (Session). Throws without a CTC head.
    std::vector<int32_t> ctc_greedy(const float * encoder_out, int64_t T);
    // The CTC head on an encoder output -> log-probabilities [T, ctc.vocab]: ctc_logprobs() without the
    // encoder pass (word timestamps from the encoder output kept at encode time).
    std::vector<float> ctc_logprobs_encoded(const float * encoder_out, int64_t T);
    // token embeddings row-major [n, dec.d_model]
    std::vector<float> embed(const std::vector<int32_t> & ids);
    // Resets the cache, runs embeddings [n, d]; returns the last position's logits [vocab].
    std::vector<float> prefill(const float * embeddings, int64_t n);
    // One more token; returns its logits [vocab].
    std::vector<float> step(int32_t token);
    // Greedy decoding: prefill, then argmax steps until a stop id (included), max_new_tokens, or
    // (with repetition_guard) an n-gram loop. The reason and timings are kept in last_generation().
    std::vector<int32_t> generate(const float * embeddings, int64_t n, int64_t max_new_tokens,
                                  const std::vector<int32_t> & stop_ids, bool repetition_guard = false);

    // The same for several sequences at once (one KV cache slot each): per-step weights are read
    // once for the whole batch. prompts: (embeddings [n, d] row-major, n) per sequence.
    struct Generated {
        std::vector<int32_t> tokens;
        std::string stop_reason;  // "eos", "max_new_tokens", "repetition"
    };
    // on_step(tokens_so_far, active): called after the prefill (0, B) and after every decoding step
    // with the tokens produced so far over all sequences and how many are still running; it may throw
    // to abort (e.g. Ctrl-C), leaving the model usable.
    using StepCallback = std::function<void(int64_t, int64_t)>;
    //
    // draft (one sequence only; null = none): tokens the output probably contains (the previous partial
    // of a stream, a CTC transcript). Lossless speculative decoding: where the tokens so far end as in
    // the draft (its prefix, else the last two tokens found in it), up to draft_max() of the draft's
    // next tokens are verified in one pass of decode-step arithmetic (mul_mat_step per position, the
    // fused attention's per-row loop), and the longest prefix that greedy decoding itself takes is kept.
    // Tokens in draft_skip() (punctuation, say: a CTC transcript has none) are left out on both sides when
    // the tokens so far are matched with the draft. A pass that keeps none of its draft tokens ends drafting
    // for the rest of the generation (a wrong draft costs one pass), unless greedy's token there is one to
    // skip (the model put a comma where the draft has none). Tokens, stop reason and every logits row are plain greedy's, bit for bit (tests);
    // with flash_attn off (the matmul attention sums over the pass's longest row) the draft is not used.
    //
    // max_active (0 = all; not with a draft): continuous batching. At most that many sequences decode at once;
    // when one ends, the next prompt's prefill takes its place and joins the following steps. Tokens, stop
    // reasons and logits are each sequence's alone, bit for bit, on the CPU.
    // token_limits (null = max_new_tokens for all): each sequence's own most new tokens (each 1..max_new_tokens).
    //
    // Joining (with max_active > 0): join(free_slots, max_rows) is asked whenever a slot is free and no prompt
    // given waits; the prompts it returns (embeddings row-major, whole rows of d_model, each 1..max_rows rows:
    // the cache's room, at least join_rows) are admitted at once and decode like the given ones (up to
    // max_new_tokens each), their indices following the given ones' in the result. done(index, generated) is
    // called as each sequence ends. Inside both, the model takes only calls that leave the decoder's state
    // alone (encode*, embed, the CTC head): the decoder's own calls throw std::logic_error there.
    using JoinCallback = std::function<std::vector<std::vector<float>>(int64_t free_slots, int64_t max_rows)>;
    using DoneCallback = std::function<void(int64_t index, const Generated &)>;
    // generate_batch's options beyond the prompts, the most new tokens and the stop ids (all described above).
    struct GenerateOptions {
        bool repetition_guard = false;
        StepCallback on_step = nullptr;
        const std::vector<int32_t> * draft = nullptr;
        int64_t max_active = 0;
        const std::vector<int64_t> * token_limits = nullptr;
        JoinCallback join = nullptr;
        DoneCallback done = nullptr;
        int64_t join_rows = 0;
    };
    std::vector<Generated> generate_batch(const std::vector<std::pair<const float *, int64_t>> & prompts,
                                          int64_t max_new_tokens, const std::vector<int32_t> & stop_ids,
                                          const GenerateOptions & options);
    // Most draft tokens one verification pass takes (default 4; 0 turns drafts off).
    int64_t draft_max() const { return draft_max_; }
    // Token ids left out when the output so far is matched with a draft (default none).
    const std::vector<int32_t> & draft_skip() const { return draft_skip_; }
    void set_draft_skip(std::vector<int32_t> ids) {
        for (int32_t id : ids) check_token(id);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        draft_skip_ = std::move(ids);
    }
    void set_draft_max(int64_t n) {
        if (n < 0) throw std::invalid_argument("draft_max must be >= 0 (0 = drafts off)");
        draft_max_ = n;
    }

    // Prefix KV reuse: the prompt's first rows (system prompt + instruction) are the same for every
    // segment. set_prefix computes their K/V once (positions 0..n-1) and keeps them; generate_batch
    // then copies them into each slot for every prompt that starts with exactly these rows, and
    // prefills only the rest. Prompts that do not start with them are prefilled in full.
    void set_prefix(const float * embeddings, int64_t n);
    int64_t prefix_len() const {
        return hp_.dec.d_model > 0 ? static_cast<int64_t>(prefix_rows_.size()) / hp_.dec.d_model : 0;
    }
    void clear_prefix();

    struct GenerationStats {
        std::string stop_reason;  // "eos", "max_new_tokens", "repetition"
        double prefill_ms = 0, decode_ms = 0;
        int64_t prompt_tokens = 0, new_tokens = 0;
        int64_t prefix_reused = 0;  // prompt positions whose K/V came from the prefix cache
        int64_t prefill_passes = 0;  // passes over the prompts (neighbours with equal lengths share one on the CPU)
        int64_t decode_passes = 0;   // decoder graphs after the prefill (steps + verification passes)
        int64_t draft_proposed = 0, draft_accepted = 0;  // draft tokens verified / kept
        // Where the decoder passes' time went (all passes of the generation, prefills included): building
        // and allocating graphs, copying inputs and logits between host and backend, computing; and the
        // decode steps' token choice on the host (argmax over every sequence's logits).
        double graph_ms = 0, transfer_ms = 0, compute_ms = 0, select_ms = 0;
        double step_graph_ms = 0, step_transfer_ms = 0, step_compute_ms = 0;  // of those, the decode steps' alone
        int64_t graphs_built = 0;  // decoder graphs built (a decode step reusing the previous one builds none)
        int64_t slot_moves = 0;    // continuous batching: running sequences moved into a finished one's slot
    };
    GenerationStats last_generation() const { return last_; }

    // Test aid for batch invariance: with logit digests on, generate_batch keeps, per sequence, one
    // 64-bit digest (FNV-1a over the float bits) of every logits row a token was taken from, so that
    // tests can compare whole logits rows of batched and one-by-one decoding bit for bit.
    void set_logit_digests(bool on) { logit_digests_on_ = on; }
    // At most this many sequences per decode-step graph (0: as many as the graph takes, step_chunk()).
    int64_t max_step_sequences() const { return max_step_seqs_; }
    void set_max_step_sequences(int64_t n) {
        if (n < 0) throw std::invalid_argument("max_step_sequences must be >= 0 (0 = automatic)");
        max_step_seqs_ = n;
    }
    bool logit_digests() const { return logit_digests_on_; }
    std::vector<std::vector<uint64_t>> last_logit_digests() const { return digests_; }
    // With token log-probabilities on, generate_batch keeps, per sequence, the log-probability of every token
    // it took (log softmax of its logits row at the token: kernels/decoder_fused chosen_logprob). A decode step
    // computes it in its graph beside the greedy choice (the CPU: fun-asr's op; a GPU: ggml's softmax read at the
    // argmax, DeviceCaps::logprob_in_graph); the host computes it from the logits after a prefill, in
    // verification passes and where the device cannot.
    void set_token_logprobs(bool on) { token_logprobs_on_ = on; }
    bool token_logprobs() const { return token_logprobs_on_; }
    std::vector<std::vector<float>> last_token_logprobs() const { return logprobs_; }
    // Sequence `index`'s so far (generate_batch's done callback: all of that sequence's); empty when off.
    std::vector<float> token_logprobs_of(int64_t index) const {
        return index >= 0 && index < static_cast<int64_t>(logprobs_.size()) ? logprobs_[static_cast<size_t>(index)]
                                                                            : std::vector<float>{};
    }

    // Per-node profile (FUN_ASR_PROFILE=1 at load, or set_profiling(true)): every graph node is
    // computed on its own and timed; totals per "stage/op" key (stage = the node name's first part:
    // enc, adp, blk/dec, ...), with matmul FLOPs. Profiling itself slows the run (no fusion across nodes).
    struct ProfileEntry {
        int64_t count = 0;
        double ms = 0, flops = 0;
    };
    void set_profiling(bool on);
    bool profiling() const { return profiling_; }
    std::map<std::string, ProfileEntry> profile() const { return profile_; }
    void reset_profile() { profile_.clear(); }

private:
    void check_features(int64_t T) const;
    void check_token(int64_t id) const;
    // n new positions for each sequence in slots [slot0, slot0 + past.size()) with cached lengths
    // `past`; returns the logits of each sequence's last position, [past.size()][vocab].
    // verify: n positions of one sequence as decode steps, logits of every position [n][vocab].
    // choices (a decode step's caller that wants the greedy choice): where the step's graph picks it (CPU,
    // kernels/decoder_fused argmax_columns), filled with each sequence's first argmax, and the logits come
    // back only when the logit digests are on (else empty); elsewhere left empty, with the logits.
    // choice_logprobs (with choices): each choice's log-probability, where the graph computes it (else empty).
    std::vector<float> run_decoder(const float * embeddings, const int32_t * tokens, int64_t n, int64_t slot0,
                                   const std::vector<int64_t> & past, bool verify = false,
                                   std::vector<int32_t> * choices = nullptr,
                                   std::vector<float> * choice_logprobs = nullptr);
    // generate_batch's loop for one sequence with a draft (tokens already holds nothing; next = the
    // prefill's argmax, past = the prompt length).
    void decode_with_draft(Generated & g, int32_t next, float next_logprob, int64_t past, int64_t max_new_tokens,
                           const std::vector<int32_t> & stop_ids, bool repetition_guard,
                           const std::vector<int32_t> & draft, const StepCallback & on_step);
    // The most sequences one decode-step graph takes (see generate.cpp); larger batches step in chunks.
    int64_t step_chunk() const;
    std::vector<float> prefill_locked(const float * embeddings, int64_t n);
    std::vector<float> step_locked(int32_t token);
    // Graph plumbing: a context for one graph's metadata, allocation, compute.
    struct GraphScope {
        ggml_context * ctx = nullptr;
        ggml_cgraph * gf = nullptr;
        ~GraphScope();
    };
    void new_graph(GraphScope & g, std::vector<uint8_t> * meta = nullptr);  // meta: graph_meta_ if null
    // Builds, allocates and computes the encoder graph with the adaptor and/or the CTC head on top. With
    // `segments` (lengths summing to T) the features hold several sequences packed (GraphCtx::segments).
    struct EncoderOutputs {
        ggml_tensor * adaptor = nullptr;  // the adaptor output, or null
        ggml_tensor * ctc_logits = nullptr;  // the CTC logits, or null
        ggml_tensor * encoder = nullptr;  // the encoder output (an output of every pass)
    };
    EncoderOutputs run_encoder(GraphScope & g, const StageCallback & on_stage, const float * features, int64_t T,
                               bool adaptor, bool ctc, const std::vector<int64_t> & segments = {},
                               bool every_stage = false);
    // The CTC head graph on an encoder output [T, enc.d_model]: logits [vocab, T], or with argmax their
    // per-frame argmax (int32 [T]); computed.
    ggml_tensor * run_ctc_head(GraphScope & g, const float * encoder_out, int64_t T, bool argmax);
    void require_ctc() const;
    // Stable log-softmax of CTC logits [T, vocab] in place (torch's formula: x - max - log(sum(exp(x - max)))).
    void log_softmax_rows(std::vector<float> & logits, int64_t T) const;
    void alloc_graph(ggml_cgraph * gf);
    // step_columns > 0: a decode step for that many sequences (timed for the thread chooser).
    void compute_graph(ggml_cgraph * gf, int64_t step_columns = 0);
    // A decode step's graph, kept and computed again for the next steps of the same batch (the CPU with the
    // cached-attention op, other devices with ggml's attention under the mask: the graph does not depend on the
    // sequences' lengths, which only the inputs carry, so it is built once for the cache's capacity). Allocating any other graph on the scheduler
    // makes it stale, as does a reallocated KV cache. FUN_ASR_GRAPH_REUSE=0 builds every step's graph.
    struct StepGraph {
        std::vector<uint8_t> meta;  // (before g: g's context lives in it)
        GraphScope g;
        ggml_tensor *tok = nullptr, *pos = nullptr, *rows = nullptr, *mask = nullptr, *logits = nullptr;
        ggml_tensor * choice = nullptr;  // argmax_columns of the logits, or null
        bool with_logprob = false;       // with the choice's log-probability (CPU: choice is argmax_logprob_columns)
        ggml_tensor * chosen_prob = nullptr;  // elsewhere: the softmax at each choice, or null
        int64_t B = 0, slot0 = 0;
        uint64_t cache_epoch = 0;  // its K/V views span this allocation's capacity
        bool valid = false;
    } step_graph_;
    bool step_graph_off_ = false;  // a capacity-wide step graph came out without the op: never again
    bool step_graph_reusable() const;
    // A decoder pass's shape and the tensors of its graph that the host fills or reads (run_decoder).
    struct DecoderPass;
    void check_decoder_pass(int64_t n_kv, int64_t slot0, int64_t B) const;
    void build_decoder_pass(GraphScope & g, std::vector<uint8_t> * meta, DecoderPass & p);
    void add_greedy_choice(GraphScope & g, DecoderPass & p);
    void prepare_decoder_graph(DecoderPass & p, GraphScope & local);
    void set_decoder_inputs(const DecoderPass & p, const float * embeddings, const int32_t * tokens);
    void read_choices(const DecoderPass & p, std::vector<int32_t> & choices, std::vector<float> * choice_logprobs);
    // generate_batch's state and steps (generate.cpp).
    struct BatchRun;
    void check_generate_request(const std::vector<std::pair<const float *, int64_t>> & prompts,
                                int64_t max_new_tokens, const std::vector<int32_t> & stop_ids,
                                const GenerateOptions & o) const;
    int64_t longest_prompt(const std::vector<std::pair<const float *, int64_t>> & prompts, int64_t max_new_tokens,
                           const GenerateOptions & o) const;
    void admit(BatchRun & r, int64_t first, int64_t slot, int64_t count);
    void reuse_prefix(BatchRun & r, int64_t first, int64_t slot, int64_t count, std::vector<int64_t> & done);
    int64_t prefill_group(BatchRun & r, int64_t first, int64_t slot, int64_t b, int64_t count,
                          const std::vector<int64_t> & done);
    void take_tokens(BatchRun & r);
    void move_slot(BatchRun & r, int64_t from, int64_t to);
    void release_finished(BatchRun & r);
    void join_prompts(BatchRun & r);
    void decode_batch(BatchRun & r);
    void decode_step(BatchRun & r, int64_t chunk);
    void finish_generation(const BatchRun & r, double decode_ms);
    // Runs call() as generate_batch's join or done callback (the decoder's own methods refuse inside it).
    template <class Call>
    void in_callback(const Call & call);

    HParams hp_;
    std::unique_ptr<LoadedWeights> weights_;
    KvCache kv_;
    int64_t n_past_ = 0;
    GenerationStats last_;
    // The decoder passes' graph / copy / compute time (run_decoder) since the current generation began,
    // copied into last_ at its end (prefill(), step() and set_prefix() outside a generation leave last_ alone).
    struct PassTimes {
        double graph_ms = 0, transfer_ms = 0, compute_ms = 0;
        double step_graph_ms = 0, step_transfer_ms = 0, step_compute_ms = 0;  // of those, the decode steps'
        int64_t graphs_built = 0;
    } passes_;
    std::vector<float> prefix_rows_;                 // the prefix embeddings [n, d]
    std::vector<std::vector<uint8_t>> prefix_k_, prefix_v_;  // per layer: K/V rows of positions 0..n-1
    bool prefix_matches(const float * embeddings, int64_t n) const;
    bool auto_threads_ = false;
    ThreadChooser chooser_;
    bool flash_attn_ = true;
    bool logit_digests_on_ = false;
    int64_t max_step_seqs_ = 0;
    int64_t draft_max_ = 4;
    std::vector<int32_t> draft_skip_;  // sorted
    std::vector<std::vector<uint64_t>> digests_;
    bool token_logprobs_on_ = false;
    std::vector<std::vector<float>> logprobs_;
    bool profiling_ = false;
    std::map<std::string, ProfileEntry> profile_;
    std::string stage_ = "other";  // the graph being computed, for the profile
    std::chrono::steady_clock::time_point node_t0_;
    static bool eval_callback(ggml_tensor * t, bool ask, void * user);
    // Recursive: generate_batch's join/done callbacks may call the model's stateless methods (encode, embed, the
    // CTC head) on the generating thread; in_callback_ makes the decoder's own methods refuse there.
    std::recursive_mutex mutex_;
    bool in_callback_ = false;
    void refuse_in_callback(const char * what) const;
};

}  // namespace fun_asr
