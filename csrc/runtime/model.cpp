#include "runtime/model.h"

#include "base/cpu_backend.h"
#include "base/switches.h"

#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include "ggml-cpu.h"
#include "graph/stages.h"
#include "kernels/attention.h"
#include "kernels/decoder_fused.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_amx.h"
#include "kernels/gemm_avx2.h"
#include "kernels/matvec.h"
#include "runtime/architectures.h"
#include "runtime/backend.h"

namespace fun_asr {

namespace {

}  // namespace

Model::GraphScope::~GraphScope() {
    if (ctx) ggml_free(ctx);
}

Model::Model(const ModelSource & src, const std::string & device, int threads)
        // (the architecture checked before the device is chosen)
    : DeviceRuntime((require_architecture(src, Role::recognizer), device), kGraphSize) {
    hp_ = parse_hparams(src.meta, src.arch);
    // the int8 GEMM's Q8_0 quads layout (FUN_ASR_Q8_QUADS): the loader re-lays those matrices out once
    WeightRelayout quads{q8_0_quads_fits, [](ggml_tensor * t, const void * data) {
                             q8_0_quads_relayout(t, data, t->data);
                             mark_q8_0_quads(t);
                         }};
    weights_ = load_weights(src, hp_, dev_, q8_0_quads_wanted() ? &quads : nullptr);
    set_threads(threads);
    flash_attn_ = caps_.exact_flash_attn;  // else the matmul / softmax / matmul attention (DeviceCaps)
    const std::string & prof = switches::value("FUN_ASR_PROFILE");
    if (!prof.empty() && prof != "0") set_profiling(true);
}

void Model::set_profiling(bool on) {
    profiling_ = on;
    ggml_backend_sched_set_eval_callback(sched_, on ? &Model::eval_callback : nullptr, on ? this : nullptr);
}

bool Model::eval_callback(ggml_tensor * t, bool ask, void * user) {
    auto * self = static_cast<Model *>(user);
    const auto now = std::chrono::steady_clock::now();
    if (ask) {  // the scheduler computes up to this node, then calls again with ask=false
        self->node_t0_ = now;
        return true;
    }
    // key: graph stage (encode / prefill / decode) / op [/ weight kind for matmuls, e.g. attn_q, ffn_up]
    // fun-asr's kernels show under their names (kernels/dispatch: MATVEC, GEMM_AMX, ...): products by another path.
    const bool matmul = t->op == GGML_OP_MUL_MAT || is_cpu_product(t);
    const char * kernel = cpu_kernel_name(t);
    std::string key = self->stage_ + "/" + (kernel ? kernel : ggml_op_desc(t));
    if (matmul && t->src[0] != nullptr) {
        auto kind = [](std::string w) {  // "blk.3.attn_q.weight" -> "attn_q"
            const auto blk = w.find("blk.");
            if (blk != std::string::npos) {
                const auto dot = w.find('.', blk + 4);
                w = w.substr(0, blk) + (dot == std::string::npos ? "" : w.substr(dot + 1));
            }
            if (w.size() > 7 && w.compare(w.size() - 7, 7, ".weight") == 0) w.resize(w.size() - 7);
            return w;
        };
        std::string w = kind(ggml_get_name(t->src[0]));
        if (is_cpu_product_many(t)) {  // several matrices in one node: "attn_q+attn_k+attn_v"
            for (int i = 2; i < GGML_MAX_SRC && t->src[i]; ++i) w += "+" + kind(ggml_get_name(t->src[i]));
        }
        if (!w.empty() && w.rfind("node_", 0) != 0 && w.rfind("leaf_", 0) != 0) key += "/" + w;
        if (const char * input = node_input_name(t)) key += std::string("/") + input;  // "GEMM_INT8/ffn_down/SWIGLU"
    }
    ProfileEntry & e = self->profile_[key];
    e.count += 1;
    e.ms += std::chrono::duration<double, std::milli>(now - self->node_t0_).count();
    if (matmul) {
        e.flops += 2.0 * static_cast<double>(t->src[0]->ne[0]) *
                   static_cast<double>(ggml_nelements(t) - node_input_extra(t));  // (not a sum block of the node's)
    }
    return true;
}

Model::~Model() = default;

void Model::set_threads(int threads) {
    if (threads < 0) throw std::invalid_argument("threads must be >= 0 (0 = all cores)");
    std::lock_guard<std::recursive_mutex> lock(mutex_);  // not while a graph computes
    apply_threads(threads);
    // Auto: the chooser times decode steps where the device lets it (DeviceCaps::timed_threads).
    auto_threads_ = threads == 0 && caps_.timed_threads;
    chooser_ = ThreadChooser(threads_);
}

std::map<std::string, std::string> Model::tensor_types() const {
    std::map<std::string, std::string> out;
    for (ggml_tensor * t = ggml_get_first_tensor(weights_->ctx); t; t = ggml_get_next_tensor(weights_->ctx, t)) {
        out[t->name] = ggml_type_name(t->type);
    }
    return out;
}

void Model::new_graph(GraphScope & g, std::vector<uint8_t> * meta) {
    if (g.ctx) ggml_free(g.ctx);
    if (meta) meta->resize(graph_meta_.size());
    std::vector<uint8_t> & m = meta ? *meta : graph_meta_;
    ggml_init_params ip{m.size(), m.data(), /*no_alloc=*/true};
    g.ctx = ggml_init(ip);
    g.gf = ggml_new_graph_custom(g.ctx, kGraphSize, false);
}

bool Model::step_graph_reusable() const {
    static const bool enabled = !switches::is("FUN_ASR_GRAPH_REUSE", "0");
    // (on the CPU with fun-asr's attention op, which flash_attn selects; elsewhere ggml's masked attention)
    return enabled && !step_graph_off_ && caps_.graph_reuse && (flash_attn_ || !caps_.host);
}

void Model::alloc_graph(ggml_cgraph * gf) {
    if (gf != step_graph_.g.gf) step_graph_.valid = false;  // the scheduler's buffers now hold another graph
    sched_alloc(gf, "the compute graph");
}

void Model::compute_graph(ggml_cgraph * gf, int64_t step_columns) {
    int n = threads_;
    if (auto_threads_) n = step_columns > 0 ? chooser_.step_threads() : chooser_.bulk_threads();
    cpu_backend::api().set_n_threads(cpu_backend_, n);
    const auto t0 = std::chrono::steady_clock::now();
    sched_compute(gf, "graph");
    if (auto_threads_ && step_columns > 0 && !profiling_) {
        chooser_.record_step(n, step_columns,
                             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
}

void Model::check_features(int64_t T) const {
    if (T <= 0) throw std::invalid_argument("features are empty: need at least one LFR frame");
    if (T > hp_.enc.max_frames()) {
        throw std::invalid_argument("features have " + std::to_string(T) + " LFR frames; the encoder's position "
                                    "table allows at most " + std::to_string(hp_.enc.max_frames()) +
                                    " (split the audio into shorter segments)");
    }
}

namespace {

std::vector<float> read_tensor(ggml_tensor * t) {
    std::vector<float> out(static_cast<size_t>(ggml_nelements(t)));
    ggml_backend_tensor_get(t, out.data(), 0, out.size() * sizeof(float));
    return out;
}

}  // namespace

Model::EncoderOutputs Model::run_encoder(GraphScope & g, const StageCallback & on_stage, const float * features,
                                         int64_t T, bool adaptor, bool ctc, const std::vector<int64_t> & segments,
                                         bool every_stage) {
    if (segments.size() <= 1) check_features(T);
    stage_ = "encode";
    new_graph(g);
    GraphCtx gc{g.ctx, on_stage, caps_, segments.size() > 1 ? segments : std::vector<int64_t>{}, every_stage};
    ggml_tensor * feats = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, hp_.enc.input_size, T);
    ggml_tensor * pe = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, hp_.enc.input_size, T);
    ggml_set_input(feats);
    ggml_set_input(pe);
    ggml_tensor * enc = build_encoder(gc, hp_, weights_->w, feats, pe, nullptr);
    // An output in every pass, read or not: passes that read it and passes that do not have the same nodes, and
    // ggml's allocator keeps its plan between graphs of the same node count (DeviceRuntime::sched_alloc).
    ggml_set_output(enc);
    ggml_tensor * adp = adaptor ? build_adaptor(gc, hp_, weights_->w, enc, nullptr) : nullptr;
    ggml_tensor * logits = ctc ? build_ctc(gc, hp_, weights_->w, enc, nullptr) : nullptr;
    for (ggml_tensor * out : {adp, logits}) {
        if (!out) continue;
        ggml_set_output(out);
        ggml_build_forward_expand(g.gf, out);
    }
    alloc_graph(g.gf);
    std::vector<float> pos(static_cast<size_t>(T * hp_.enc.input_size));
    int64_t t0 = 0;
    for (int64_t n : segments.empty() ? std::vector<int64_t>{T} : segments) {  // each sequence's positions from 1
        sinusoid_positions(hp_, n, pos.data() + t0 * hp_.enc.input_size);
        t0 += n;
    }
    ggml_backend_tensor_set(feats, features, 0, ggml_nbytes(feats));
    ggml_backend_tensor_set(pe, pos.data(), 0, ggml_nbytes(pe));
    compute_graph(g.gf);
    return {adp, logits, enc};
}

std::vector<float> Model::encode(const float * features, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    GraphScope g;
    return read_tensor(run_encoder(g, {}, features, T, true, false).adaptor);
}

std::map<std::string, Stage> Model::debug_stages(const float * features, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    GraphScope g;
    std::vector<std::pair<std::string, ggml_tensor *>> stages;
    run_encoder(g, [&](ggml_tensor * t, const std::string & name) {
        ggml_set_output(t);  // keep it: the allocator must not reuse its memory
        stages.emplace_back(name, t);
    }, features, T, true, hp_.ctc.present, {}, /*every_stage=*/true);
    std::map<std::string, Stage> result;
    for (auto & [name, t] : stages) {
        Stage s;
        s.shape = {t->ne[1], t->ne[0]};
        s.data = read_tensor(t);
        result[name] = std::move(s);
    }
    return result;
}

void Model::require_ctc() const {
    if (!hp_.ctc.present) throw std::logic_error("this model has no CTC head: " + hp_.ctc.unavailable);
}

void Model::log_softmax_rows(std::vector<float> & x, int64_t T) const {
    const int64_t V = hp_.ctc.vocab;
    auto work = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            float * row = x.data() + t * V;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
            double sum = 0.0;
            for (int64_t v = 0; v < V; ++v) sum += static_cast<double>(std::exp(row[v] - mx));
            const float lse = static_cast<float>(std::log(sum));
            for (int64_t v = 0; v < V; ++v) row[v] = (row[v] - mx) - lse;
        }
    };
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(threads_, T));
    std::vector<std::thread> pool;
    const int64_t per = (T + n - 1) / n;
    for (int64_t k = 1; k < n; ++k) {
        const int64_t a = k * per, b = std::min(T, a + per);
        if (a < b) pool.emplace_back(work, a, b);
    }
    work(0, std::min(T, per));
    for (auto & th : pool) th.join();
}

std::vector<float> Model::ctc_logprobs(const float * features, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    require_ctc();
    GraphScope g;
    std::vector<float> out = read_tensor(run_encoder(g, {}, features, T, false, true).ctc_logits);
    log_softmax_rows(out, T);
    return out;
}

std::pair<std::vector<float>, std::vector<float>> Model::encode_ctc(const float * features, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    require_ctc();
    GraphScope g;
    const EncoderOutputs outs = run_encoder(g, {}, features, T, true, true);
    std::pair<std::vector<float>, std::vector<float>> out{read_tensor(outs.adaptor), read_tensor(outs.ctc_logits)};
    log_softmax_rows(out.second, T);
    return out;
}

std::pair<std::vector<float>, std::vector<float>> Model::encode_keep_encoder(const float * features, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    GraphScope g;
    const EncoderOutputs outs = run_encoder(g, {}, features, T, true, false);
    return {read_tensor(outs.adaptor), read_tensor(outs.encoder)};
}

int64_t Model::max_packed_sequences() const {
    // Tensors of the graph's context (nodes, views and leaves alike): about 40 per layer for the pass itself, and
    // per layer for each packed sequence its views, attention, FSMN memory and joins: ggml's generic nodes (what a
    // GPU runs: the FSMN as one shifted product per tap) took ~50 (the demo model on Vulkan: 50 sequences fit, 60
    // overflowed the context), so 60 with a margin.
    const int64_t layers = hp_.enc.n_layers + hp_.adp.n_layers;
    const int64_t room = static_cast<int64_t>(kGraphSize) - 40 * layers - 64;
    return std::max<int64_t>(1, room / (60 * std::max<int64_t>(1, layers)));
}

std::vector<std::pair<std::vector<float>, std::vector<float>>> Model::encode_batch(
    const std::vector<const float *> & features, const std::vector<int64_t> & lengths, bool keep_encoder) {
    if (features.size() != lengths.size()) throw std::invalid_argument("encode_batch: one length per feature matrix");
    for (int64_t T : lengths) check_features(T);
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const int64_t C = hp_.enc.input_size, D = hp_.adp.d_model, E = hp_.enc.d_model;
    const size_t per_pass = static_cast<size_t>(max_packed_sequences());
    std::vector<std::pair<std::vector<float>, std::vector<float>>> out;
    out.reserve(features.size());
    for (size_t a = 0; a < features.size(); a += per_pass) {
        const size_t b = std::min(features.size(), a + per_pass);
        std::vector<int64_t> lens(lengths.begin() + static_cast<std::ptrdiff_t>(a),
                                  lengths.begin() + static_cast<std::ptrdiff_t>(b));
        int64_t T = 0;
        for (int64_t n : lens) T += n;
        std::vector<float> packed(static_cast<size_t>(T * C));
        int64_t t0 = 0;
        for (size_t i = a; i < b; ++i) {
            std::copy(features[i], features[i] + lengths[i] * C, packed.begin() + t0 * C);
            t0 += lengths[i];
        }
        GraphScope g;
        const EncoderOutputs outs = run_encoder(g, {}, packed.data(), T, true, false, lens);
        const std::vector<float> rows = read_tensor(outs.adaptor);
        const std::vector<float> enc_rows = keep_encoder ? read_tensor(outs.encoder) : std::vector<float>{};
        t0 = 0;
        for (int64_t n : lens) {
            out.emplace_back(std::vector<float>(rows.begin() + t0 * D, rows.begin() + (t0 + n) * D),
                             keep_encoder ? std::vector<float>(enc_rows.begin() + t0 * E, enc_rows.begin() + (t0 + n) * E)
                                          : std::vector<float>{});
            t0 += n;
        }
    }
    return out;
}

ggml_tensor * Model::run_ctc_head(GraphScope & g, const float * encoder_out, int64_t T, bool argmax) {
    require_ctc();
    check_features(T);  // one encoder frame per LFR frame: the same bounds
    stage_ = "ctc";
    new_graph(g);
    GraphCtx gc{g.ctx, {}, caps_};
    ggml_tensor * enc = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, hp_.enc.d_model, T);
    ggml_set_input(enc);
    ggml_tensor * out = build_ctc(gc, hp_, weights_->w, enc, nullptr);
    // [T] int32: our multithreaded argmax on the CPU, ggml's where another backend computes (CUDA has it)
    if (argmax) out = caps_.host ? ctc_argmax(g.ctx, out) : ggml_argmax(g.ctx, out);
    ggml_set_output(out);
    ggml_build_forward_expand(g.gf, out);
    alloc_graph(g.gf);
    ggml_backend_tensor_set(enc, encoder_out, 0, ggml_nbytes(enc));
    compute_graph(g.gf);
    return out;
}

std::vector<int32_t> Model::ctc_greedy(const float * encoder_out, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    GraphScope g;
    ggml_tensor * labels = run_ctc_head(g, encoder_out, T, true);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    ggml_backend_tensor_get(labels, ids.data(), 0, ids.size() * sizeof(int32_t));
    return ids;
}

std::vector<float> Model::ctc_logprobs_encoded(const float * encoder_out, int64_t T) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    GraphScope g;
    std::vector<float> out = read_tensor(run_ctc_head(g, encoder_out, T, false));
    log_softmax_rows(out, T);
    return out;
}

void Model::check_token(int64_t id) const {
    if (id < 0 || id >= hp_.dec.vocab) {
        throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(hp_.dec.vocab) + ")");
    }
}

std::vector<float> Model::embed(const std::vector<int32_t> & ids) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (ids.empty()) throw std::invalid_argument("token_ids is empty");
    for (int32_t id : ids) check_token(id);
    GraphScope g;
    new_graph(g);
    ggml_tensor * idx = ggml_new_tensor_1d(g.ctx, GGML_TYPE_I32, static_cast<int64_t>(ids.size()));
    ggml_set_input(idx);
    ggml_tensor * out = get_rows(g.ctx, weights_->w.tok_lookup, idx);
    ggml_set_output(out);
    ggml_build_forward_expand(g.gf, out);
    alloc_graph(g.gf);
    ggml_backend_tensor_set(idx, ids.data(), 0, ggml_nbytes(idx));
    compute_graph(g.gf);
    return read_tensor(out);
}

}  // namespace fun_asr
