// Bindings for the Fun-ASR-Nano Model class and its loaders: load_gguf, check_gguf, load_tensors.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bind.h"
#include "bindings/common.h"
#include "model/loader.h"
#include "runtime/backend.h"
#include "runtime/model.h"

namespace fun_asr::bindings {

namespace {

using fun_asr::Model;

// Token ids from Python (int64) checked against the vocabulary and narrowed to int32; `what`
// names them in the error ("token id", "stop id").
std::vector<int32_t> vocab_ids(const Model & m, const std::vector<int64_t> & ids, const char * what) {
    std::vector<int32_t> out;
    out.reserve(ids.size());
    for (int64_t id : ids) {
        if (id < 0 || id >= m.hparams().dec.vocab) {
            throw py::index_error(std::string(what) + " " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(m.hparams().dec.vocab) + ")");
        }
        out.push_back(static_cast<int32_t>(id));
    }
    return out;
}

// ValueError naming why, for the calls that need the CTC head (info()['ctc']['reason']).
void require_ctc_head(const Model & m) {
    if (!m.has_ctc()) throw py::value_error("this model has no CTC head: " + m.hparams().ctc.unavailable);
}

std::unique_ptr<Model> load_gguf(const std::string & path, const std::string & device, int threads) {
    py::gil_scoped_release release;
    fun_asr::ModelSource src = fun_asr::read_gguf(path);
    return std::make_unique<Model>(src, device, threads);
}

std::unique_ptr<Model> load_tensors(const std::string & arch, const py::dict & meta, const py::list & tensors,
                                    const std::string & device, int threads, const std::string & origin) {
    std::vector<py::buffer_info> keep;
    fun_asr::ModelSource src = source_from_python(arch, meta, tensors, origin, keep);
    py::gil_scoped_release release;
    return std::make_unique<Model>(src, device, threads);
}

py::dict model_info(const Model & m) {
    const auto & hp = m.hparams();
    py::dict enc, adp, dec, d;
    enc["input_size"] = hp.enc.input_size;
    enc["d_model"] = hp.enc.d_model;
    enc["n_heads"] = hp.enc.n_heads;
    enc["ffn"] = hp.enc.ffn;
    enc["n_layers"] = hp.enc.n_layers;
    enc["n_tp_layers"] = hp.enc.n_tp_layers;
    enc["fsmn_kernel"] = hp.enc.fsmn_kernel;
    enc["max_frames"] = hp.enc.max_frames();
    enc["eps"] = hp.enc.eps;
    adp["d_model"] = hp.adp.d_model;
    adp["proj"] = hp.adp.proj;
    adp["n_heads"] = hp.adp.n_heads;
    adp["ffn"] = hp.adp.ffn;
    adp["n_layers"] = hp.adp.n_layers;
    adp["eps"] = hp.adp.eps;
    dec["d_model"] = hp.dec.d_model;
    dec["n_layers"] = hp.dec.n_layers;
    dec["n_heads"] = hp.dec.n_heads;
    dec["n_kv_heads"] = hp.dec.n_kv_heads;
    dec["head_dim"] = hp.dec.head_dim;
    dec["ffn"] = hp.dec.ffn;
    dec["vocab"] = hp.dec.vocab;
    dec["max_positions"] = hp.dec.max_positions;
    dec["rms_eps"] = hp.dec.rms_eps;
    dec["rope_theta"] = hp.dec.rope_theta;
    dec["tie_embeddings"] = hp.dec.tie_embeddings;
    dec["eos_token_ids"] = hp.dec.eos_ids;
    d["encoder"] = enc;
    d["adaptor"] = adp;
    d["decoder"] = dec;
    py::dict ctc;
    ctc["available"] = hp.ctc.present;
    if (hp.ctc.present) {
        ctc["reason"] = py::none();
        ctc["d_model"] = hp.ctc.d_model;
        ctc["proj"] = hp.ctc.proj;
        ctc["n_heads"] = hp.ctc.n_heads;
        ctc["ffn"] = hp.ctc.ffn;
        ctc["n_layers"] = hp.ctc.n_layers;
        ctc["vocab"] = hp.ctc.vocab;
        ctc["blank_id"] = hp.ctc.blank_id;
        ctc["eps"] = hp.ctc.eps;
        ctc["frame_ms"] = hp.ctc.frame_ms;
    } else {
        ctc["reason"] = hp.ctc.unavailable;
    }
    d["ctc"] = ctc;
    d["tensor_types"] = m.tensor_types();
    d["backend"] = m.backend_name();
    py::dict caps;
    for (const auto & [name, value] : fun_asr::caps_fields(m.caps())) caps[py::str(name)] = value;
    d["caps"] = caps;  // what the device offers (runtime/backend.cpp device_caps)
    d["device"] = m.device_description();
    d["weight_bytes"] = m.weight_bytes();
    d["weights_mmapped"] = m.weights_mmapped();
    d["repacked_tensors"] = m.repacked_tensors();
    d["q8_0_quads_tensors"] = m.q8_0_quads_tensors();  // Q8_0 in the int8 GEMM's quads layout
    d["host_weights"] = m.host_weights();  // a GPU: matrices too large for it, their products on the CPU
    d["host_token_lookup"] = m.host_token_lookup();  // a GPU: token lookups on the CPU (a type it cannot look up)
    d["kv_cache_bytes"] = m.kv_bytes();
    d["threads"] = m.threads();
    d["threads_auto"] = m.threads_auto();
    return d;
}

py::dict thread_choice(const Model & m) {
    py::dict d;
    const ThreadChooser & c = m.thread_chooser();
    d["auto"] = m.threads_auto();
    d["threads"] = m.threads_now();
    d["candidates"] = c.candidates();
    d["step_ms"] = c.estimates();
    d["probes"] = c.probes();
    return d;
}

// generate_batch's max_new_tokens: one number for every sequence, or a list with one each (into limits); returns
// the most.
int64_t most_new_tokens(const py::object & max_new_tokens, std::vector<int64_t> & limits) {
    // (anything with __index__ counts as an int, numpy's integers too, as an int64_t argument takes them)
    auto integer = [](const py::handle & v) { return PyIndex_Check(v.ptr()) != 0; };
    if (integer(max_new_tokens)) return max_new_tokens.cast<int64_t>();
    if (py::isinstance<py::sequence>(max_new_tokens) && !py::isinstance<py::str>(max_new_tokens)) {
        for (auto v : max_new_tokens) {
            if (!integer(v)) throw py::type_error("max_new_tokens must be an int or a list of ints");
            limits.push_back(v.cast<int64_t>());
        }
        if (limits.empty()) throw py::value_error("max_new_tokens is an empty list");
        return *std::max_element(limits.begin(), limits.end());
    }
    throw py::type_error("max_new_tokens must be an int or a list of ints (one per sequence)");
}

// generate_batch's prompts: each array's rows (the arrays kept alive in keep for the call).
std::vector<std::pair<const float *, int64_t>> prompt_rows(const Model & self, const py::list & embeddings,
                                                           std::vector<py::array> & keep) {
    std::vector<std::pair<const float *, int64_t>> prompts;
    for (auto item : embeddings) {
        if (!py::isinstance<py::array>(item)) throw py::type_error("embeddings must be a list of numpy arrays");
        keep.push_back(py::reinterpret_borrow<py::array>(item));
        require_rows(keep.back(), self.hparams().dec.d_model, "embeddings");
        prompts.emplace_back(static_cast<const float *>(keep.back().data()), keep.back().shape(0));
    }
    return prompts;
}

// join(free_slots, max_rows) -> a list of embeddings float32[n, d] (n <= max_rows), called with the GIL; an
// exception from it aborts the generation. None: no joining. (join and self outlive the generation.)
Model::JoinCallback join_callback(const Model & self, const py::object & join) {
    if (join.is_none()) return nullptr;
    return [&self, &join](int64_t free_slots, int64_t max_rows) {
        py::gil_scoped_acquire acquire;
        py::object got = join(free_slots, max_rows);
        std::vector<std::vector<float>> fresh;
        if (got.is_none()) return fresh;
        for (auto item : got) {
            if (!py::isinstance<py::array>(item)) throw py::type_error("join must return a list of numpy arrays");
            const auto a = py::reinterpret_borrow<py::array>(item);
            require_rows(a, self.hparams().dec.d_model, "a joining prompt's embeddings");
            const float * p = static_cast<const float *>(a.data());
            fresh.emplace_back(p, p + a.size());
        }
        return fresh;
    };
}

// on_done(index, tokens, stop_reason), called with the GIL as each sequence ends; an exception from it aborts the
// generation. None: no callback. (on_done outlives the generation.)
Model::DoneCallback done_callback(const py::object & on_done) {
    if (on_done.is_none()) return nullptr;
    return [&on_done](int64_t index, const Model::Generated & g) {
        py::gil_scoped_acquire acquire;
        on_done(index, std::vector<int64_t>(g.tokens.begin(), g.tokens.end()), g.stop_reason);
    };
}

// threads=0's policy object, for tests and tools.
void bind_thread_chooser(py::module_ & m) {
    py::class_<ThreadChooser>(m, "ThreadChooser",
                              "threads=0's policy (runtime/thread_chooser.h), exposed for tests and tools: "
                              "which thread count a decode step / an encoder pass gets, from timed steps.")
        .def(py::init<int>(), py::arg("max_threads"))
        .def("step_threads", &ThreadChooser::step_threads, "Threads for the next decode step (every 16th is a probe).")
        .def("record_step", &ThreadChooser::record_step, py::arg("threads"), py::arg("columns"), py::arg("ms"))
        .def("bulk_threads", &ThreadChooser::bulk_threads, "Threads for an encoder pass or a prefill.")
        .def_property_readonly("candidates", &ThreadChooser::candidates)
        .def_property_readonly("estimates", &ThreadChooser::estimates)
        .def_property_readonly("probes", &ThreadChooser::probes)
        .def_property_readonly_static("probe_every", [](py::object) { return ThreadChooser::kProbeEvery; })
        .def_property_readonly_static("switch_margin", [](py::object) { return ThreadChooser::kSwitchMargin; });
}

// fun_asr.Interrupted: what a computation stopped by Model.interrupt() raises.
void bind_interrupted(py::module_ & m) {
    // Interrupted is not a RuntimeError: callers' handling of failed computations leaves it alone.
    py::register_exception<Interrupted>(m, "Interrupted", PyExc_Exception);
    m.attr("Interrupted").attr("__doc__") = "A computation stopped by Model.interrupt() / Session.interrupt().";
}

// The model's description and its thread and attention settings.
void bind_model_settings(py::class_<Model> & c) {
    c
        .def("info", &model_info, "Hyperparameters, tensor types, backend, bytes of weights.")
        .def_property("threads", &Model::threads, &Model::set_threads,
                      "CPU threads; 0 (auto) = up to all cores, the count chosen by timing decode steps.")
        .def("thread_choice", &thread_choice,
             "threads=0: {'auto', 'threads' (now used for encoder/prefill), 'candidates', 'step_ms' "
             "(decode-step estimate per candidate, -1 = not measured), 'probes'}.")
        .def_property_readonly("n_past", &Model::n_past, "Positions currently in the KV cache.")
        .def_property("flash_attn", &Model::flash_attn, &Model::set_flash_attn,
                      "Decoder attention via ggml's fused flash-attention kernel (default: True on the CPU, False "
                      "on a GPU, whose flash attention rounds K and V to F16).");
}

// The encoder passes: the adaptor output, the CTC head's log-probabilities, both, the encoder output.
void bind_model_encoder(py::class_<Model> & c) {
    c
        .def(
            "encode",
            [](Model & self, const py::array & features) {
                require_rows(features, self.hparams().enc.input_size, "features");
                const int64_t T = features.shape(0);
                const float * p = static_cast<const float *>(features.data());
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.encode(p, T);
                }
                return to_numpy(std::move(out), {T, self.hparams().adp.d_model});
            },
            py::arg("features"), "features float32[T, input_size] (LFR fbank) -> adaptor output float32[T, d_llm].")
        .def(
            "ctc_logprobs",
            [](Model & self, const py::array & features) {
                require_rows(features, self.hparams().enc.input_size, "features");
                require_ctc_head(self);
                const int64_t T = features.shape(0);
                const float * p = static_cast<const float *>(features.data());
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.ctc_logprobs(p, T);
                }
                return to_numpy(std::move(out), {T, self.hparams().ctc.vocab});
            },
            py::arg("features"),
            "features float32[T, input_size] -> CTC log-probabilities float32[T, ctc_vocab] (one row per 60 ms "
            "encoder frame). ValueError when the model has no CTC head (info()['ctc']['reason'] says why).")
        .def(
            "encode_ctc",
            [](Model & self, const py::array & features) {
                require_rows(features, self.hparams().enc.input_size, "features");
                require_ctc_head(self);
                const int64_t T = features.shape(0);
                const float * p = static_cast<const float *>(features.data());
                std::pair<std::vector<float>, std::vector<float>> out;
                {
                    py::gil_scoped_release release;
                    out = self.encode_ctc(p, T);
                }
                return py::make_tuple(to_numpy(std::move(out.first), {T, self.hparams().adp.d_model}),
                                      to_numpy(std::move(out.second), {T, self.hparams().ctc.vocab}));
            },
            py::arg("features"),
            "encode() and ctc_logprobs() from one encoder pass: (adaptor output float32[T, d_llm], CTC "
            "log-probabilities float32[T, ctc_vocab]).")
        .def(
            "encode_keep_encoder",
            [](Model & self, const py::array & features) {
                require_rows(features, self.hparams().enc.input_size, "features");
                const int64_t T = features.shape(0);
                const float * p = static_cast<const float *>(features.data());
                std::pair<std::vector<float>, std::vector<float>> out;
                {
                    py::gil_scoped_release release;
                    out = self.encode_keep_encoder(p, T);
                }
                return py::make_tuple(to_numpy(std::move(out.first), {T, self.hparams().adp.d_model}),
                                      to_numpy(std::move(out.second), {T, self.hparams().enc.d_model}));
            },
            py::arg("features"),
            "encode() that also returns the encoder output: (adaptor output float32[T, d_llm], encoder output "
            "float32[T, d_enc]) -- the input of ctc_greedy().");
}

// Several feature matrices in packed encoder passes.
void bind_model_packed_encoder(py::class_<Model> & c) {
    c
        .def(
            "encode_batch",
            [](Model & self, const py::list & features, bool keep_encoder) {
                std::vector<py::array> arrays;  // kept alive (and their data pointers valid) for the call
                std::vector<const float *> ptrs;
                std::vector<int64_t> lengths;
                for (size_t i = 0; i < features.size(); ++i) {
                    py::array a = py::array::ensure(features[i]);
                    const std::string what = "features[" + std::to_string(i) + "]";
                    if (!a) throw py::type_error(what + " is not an array");
                    require_rows(a, self.hparams().enc.input_size, what.c_str());
                    lengths.push_back(a.shape(0));
                    ptrs.push_back(static_cast<const float *>(a.data()));
                    arrays.push_back(std::move(a));
                }
                std::vector<std::pair<std::vector<float>, std::vector<float>>> out;
                if (!ptrs.empty()) {
                    py::gil_scoped_release release;
                    out = self.encode_batch(ptrs, lengths, keep_encoder);
                }
                py::list result;
                for (size_t i = 0; i < out.size(); ++i) {
                    py::array adp = to_numpy(std::move(out[i].first), {lengths[i], self.hparams().adp.d_model});
                    if (keep_encoder) {
                        result.append(py::make_tuple(
                            adp, to_numpy(std::move(out[i].second), {lengths[i], self.hparams().enc.d_model})));
                    } else {
                        result.append(adp);
                    }
                }
                return result;
            },
            py::arg("features"), py::kw_only(), py::arg("keep_encoder") = false,
            "encode() (keep_encoder=True: encode_keep_encoder()) of a list of feature matrices float32[T_i, "
            "input_size] in packed passes: every sequence's frames side by side in one graph, attention and the "
            "FSMN memory per sequence, so each result is the one it gets alone (bit for bit on the CPU). Returns "
            "one adaptor output (or (adaptor output, encoder output)) per matrix, in order. Up to "
            "max_packed_sequences go in one pass.")
        .def_property_readonly("max_packed_sequences", &Model::max_packed_sequences,
                               "How many sequences encode_batch packs into one encoder graph at most.");
}

// The CTC head on a kept encoder output, and every stage's output for debugging.
void bind_model_ctc_head(py::class_<Model> & c) {
    c
        .def(
            "ctc_greedy",
            [](Model & self, const py::array & encoder_output) {
                require_rows(encoder_output, self.hparams().enc.d_model, "encoder_output");
                require_ctc_head(self);
                const int64_t T = encoder_output.shape(0);
                const float * p = static_cast<const float *>(encoder_output.data());
                std::vector<int32_t> ids;
                {
                    py::gil_scoped_release release;
                    ids = self.ctc_greedy(p, T);
                }
                py::array_t<int32_t> labels(static_cast<py::ssize_t>(T));
                std::copy(ids.begin(), ids.end(), labels.mutable_data());
                return labels;
            },
            py::arg("encoder_output"),
            "The CTC head on an encoder output float32[T, d_enc] (encode_keep_encoder) -> int32[T]: each frame's "
            "most likely CTC label (argmax of its logits). Repeats merged and blanks dropped, that is the CTC greedy "
            "transcript. ValueError without a CTC head.")
        .def(
            "ctc_logprobs_encoded",
            [](Model & self, const py::array & encoder_output) {
                require_rows(encoder_output, self.hparams().enc.d_model, "encoder_output");
                require_ctc_head(self);
                const int64_t T = encoder_output.shape(0);
                const float * p = static_cast<const float *>(encoder_output.data());
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.ctc_logprobs_encoded(p, T);
                }
                return to_numpy(std::move(out), {T, self.hparams().ctc.vocab});
            },
            py::arg("encoder_output"),
            "The CTC head on an encoder output float32[T, d_enc] (encode_keep_encoder) -> log-probabilities "
            "float32[T, ctc_vocab]: ctc_logprobs() without running the encoder again. ValueError without a CTC head.")
        .def(
            "debug_stages",
            [](Model & self, const py::array & features) {
                require_rows(features, self.hparams().enc.input_size, "features");
                const int64_t T = features.shape(0);
                const float * p = static_cast<const float *>(features.data());
                std::map<std::string, fun_asr::Stage> stages;
                {
                    py::gil_scoped_release release;
                    stages = self.debug_stages(p, T);
                }
                py::dict d;
                for (auto & [name, st] : stages) {
                    d[py::str(name)] = to_numpy(std::move(st.data), {st.shape[0], st.shape[1]});
                }
                return d;
            },
            py::arg("features"), "Every named stage output for features float32[T, input_size]: name -> float32[T, width].");
}

// Token embeddings, the decoder's prefill and steps, and greedy decoding of one sequence.
void bind_model_decoder(py::class_<Model> & c) {
    c
        .def(
            "embed",
            [](Model & self, const std::vector<int64_t> & ids) {
                const std::vector<int32_t> ids32 = vocab_ids(self, ids, "token id");
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.embed(ids32);
                }
                return to_numpy(std::move(out), {static_cast<py::ssize_t>(ids.size()), self.hparams().dec.d_model});
            },
            py::arg("token_ids"), "token ids -> token embeddings float32[n, d_llm].")
        .def(
            "prefill",
            [](Model & self, const py::array & emb) {
                require_rows(emb, self.hparams().dec.d_model, "embeddings");
                const float * p = static_cast<const float *>(emb.data());
                const int64_t n = emb.shape(0);
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.prefill(p, n);
                }
                return to_numpy(std::move(out), {self.hparams().dec.vocab});
            },
            py::arg("embeddings"), "Reset the KV cache and run embeddings float32[n, d_llm]; returns the last logits float32[vocab].")
        .def(
            "step",
            [](Model & self, int64_t token) {
                const int32_t tok = vocab_ids(self, {token}, "token id")[0];
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.step(tok);
                }
                return to_numpy(std::move(out), {self.hparams().dec.vocab});
            },
            py::arg("token_id"), "Append one token to the cached sequence; returns its logits float32[vocab].")
        .def(
            "generate",
            [](Model & self, const py::array & emb, int64_t max_new_tokens, const std::vector<int64_t> & stop_ids,
               bool repetition_guard) {
                require_rows(emb, self.hparams().dec.d_model, "embeddings");
                const std::vector<int32_t> stops = vocab_ids(self, stop_ids, "stop id");
                const float * p = static_cast<const float *>(emb.data());
                const int64_t n = emb.shape(0);
                std::vector<int32_t> out;
                {
                    py::gil_scoped_release release;
                    out = self.generate(p, n, max_new_tokens, stops, repetition_guard);
                }
                return std::vector<int64_t>(out.begin(), out.end());
            },
            py::arg("embeddings"), py::arg("max_new_tokens"), py::arg("stop_ids"), py::kw_only(),
            py::arg("repetition_guard") = false,
            "Greedy decoding: prefill, then argmax steps until a stop id (included in the result), max_new_tokens, "
            "or with repetition_guard an n-gram loop (a token x16, a 2-gram x8, 3-gram x6, 4..8-gram x4). "
            "last_generation() tells which, with timings.");
}

// Greedy decoding of several sequences at once (drafts, continuous batching, joining).
void bind_model_generate_batch(py::class_<Model> & c) {
    c
        .def(
            "generate_batch",
            [](Model & self, const py::list & embeddings, const py::object & max_new_tokens,
               const std::vector<int64_t> & stop_ids, bool repetition_guard, const py::object & on_step,
               const std::optional<std::vector<int64_t>> & draft, int64_t max_active, const py::object & join,
               const py::object & on_done, int64_t join_rows) {
                std::vector<int64_t> limits;
                const int64_t most = most_new_tokens(max_new_tokens, limits);
                std::vector<py::array> keep;
                const std::vector<std::pair<const float *, int64_t>> prompts = prompt_rows(self, embeddings, keep);
                const std::vector<int32_t> stops = vocab_ids(self, stop_ids, "stop id");
                // (generate_batch refuses a draft for several sequences: std::invalid_argument -> ValueError)
                const std::vector<int32_t> draft_ids = draft ? vocab_ids(self, *draft, "draft token")
                                                             : std::vector<int32_t>{};
                // Every step takes the GIL briefly: pending signals (Ctrl-C) are checked and on_step is
                // called; a Python exception from either aborts generation and propagates.
                const bool has_callback = !on_step.is_none();
                Model::StepCallback step = [&](int64_t produced, int64_t active) {
                    py::gil_scoped_acquire acquire;
                    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                    if (has_callback) on_step(produced, active);
                };
                Model::GenerateOptions options;
                options.repetition_guard = repetition_guard;
                options.on_step = step;
                options.draft = draft ? &draft_ids : nullptr;
                options.max_active = max_active;
                options.token_limits = limits.empty() ? nullptr : &limits;
                options.join = join_callback(self, join);
                options.done = done_callback(on_done);
                options.join_rows = join_rows;
                std::vector<Model::Generated> out;
                {
                    py::gil_scoped_release release;
                    out = self.generate_batch(prompts, most, stops, options);
                }
                py::list result;
                for (const auto & g : out) {
                    result.append(py::make_tuple(std::vector<int64_t>(g.tokens.begin(), g.tokens.end()), g.stop_reason));
                }
                return result;
            },
            py::arg("embeddings"), py::arg("max_new_tokens"), py::arg("stop_ids"), py::kw_only(),
            py::arg("repetition_guard") = false, py::arg("on_step") = py::none(), py::arg("draft") = py::none(),
            py::arg("max_active") = 0, py::arg("join") = py::none(), py::arg("on_done") = py::none(),
            py::arg("join_rows") = 0,
            "generate() for several sequences at once (one KV cache slot each; every step reads the weights once "
            "for all). Returns [(tokens, stop_reason)] in input order; tokens equal one-by-one generate(). "
            "on_step(tokens_so_far, active) is called after the prefill and after every step; an exception it "
            "raises (or Ctrl-C) aborts the generation. draft (one sequence only): token ids the output probably "
            "contains (a previous partial, a CTC transcript): lossless speculative decoding, up to draft_max "
            "draft tokens verified per decoder pass; the result is plain greedy's, bit for bit "
            "(last_generation(): decode_passes, draft_proposed, draft_accepted). max_active > 0 (not with a draft): "
            "continuous batching, at most that many sequences at once, the next prompt's prefill joining the steps "
            "as soon as one ends (the same tokens; last_generation()['slot_moves']). max_new_tokens: one number, or "
            "a list with each sequence's own. join(free_slots, max_rows) (with max_active): asked whenever a slot "
            "is free and no given prompt waits, it returns more prompts (a list of embeddings, each of at most "
            "max_rows rows: the cache's room, at least join_rows) that join the running steps at once, their "
            "results following the given ones'. on_done(index, tokens, stop_reason) is called as each sequence "
            "ends. Inside both, only encode*, embed and the CTC head may be called on this model.");
}

// Interrupting a computation, and the settings and test aids of generation.
void bind_model_generation_controls(py::class_<Model> & c) {
    c
        .def("interrupt", &Model::interrupt,
             "From any thread: the computation running on this model stops at its next graph node (CPU; other "
             "backends: its next graph) or decoding step and raises fun_asr.Interrupted; the model stays usable. "
             "The request holds (later calls raise at once) until clear_interrupt().")
        .def("clear_interrupt", &Model::clear_interrupt, "Withdraw interrupt(): computations run again.")
        .def_property_readonly("interrupt_requested", &Model::interrupt_requested,
                               "True between interrupt() and clear_interrupt().")
        .def_property("draft_max", &Model::draft_max, &Model::set_draft_max,
                      "Most draft tokens one verification pass takes (default 4; 0 = drafts unused).")
        .def_property(
            "draft_skip", [](const Model & self) { return self.draft_skip(); },
            [](Model & self, const std::vector<int64_t> & ids) { self.set_draft_skip(vocab_ids(self, ids, "draft_skip token")); },
            "Token ids left out when the output so far is matched with a draft (default none; the Session sets the "
            "punctuation-only tokens where it drafts with the CTC transcript, which has none): a comma the draft "
            "lacks neither misaligns it nor ends drafting.")
        .def_property("logit_digests", &Model::logit_digests, &Model::set_logit_digests,
                      "Test aid (default False): generate_batch/generate keep a 64-bit digest of every logits row a "
                      "token was taken from; last_logit_digests() returns them.")
        .def_property("token_logprobs", &Model::token_logprobs, &Model::set_token_logprobs,
                      "When True, generate/generate_batch keep the log-probability of every token they take (log "
                      "softmax of its logits row at the token, computed beside the greedy choice); "
                      "last_token_logprobs() returns them.")
        .def("last_token_logprobs", &Model::last_token_logprobs,
             "Per sequence of the last generate_batch/generate (with token_logprobs on): the log-probability of "
             "each token it returned, in order.")
        .def("token_logprobs_of", &Model::token_logprobs_of, py::arg("index"),
             "Sequence `index`'s token log-probabilities of the running or last generate_batch (with "
             "token_logprobs on; inside on_done: all of that sequence's), [] when off.")
        .def("last_logit_digests", &Model::last_logit_digests,
             "Per sequence of the last generate_batch/generate (with logit_digests on): one digest (FNV-1a of "
             "the float32 bits) per produced token's logits row, [] when off.")
        .def_property("max_step_sequences", &Model::max_step_sequences, &Model::set_max_step_sequences,
                      "At most this many sequences per decoding step graph (0, the default: as many as one graph "
                      "takes); larger batches step in chunks, with the same tokens.")
        .def_property("profiling", &Model::profiling, &Model::set_profiling,
                      "Per-node timing (also FUN_ASR_PROFILE=1): every node computed alone and timed.");
}

// The per-node profile, the cached prompt prefix, the last generation's statistics.
void bind_model_profile_prefix(py::class_<Model> & c) {
    c
        .def(
            "profile",
            [](const Model & self) {
                py::dict d;
                for (const auto & [key, e] : self.profile()) {
                    py::dict v;
                    v["count"] = e.count;
                    v["ms"] = e.ms;
                    v["flops"] = e.flops;
                    d[py::str(key)] = v;
                }
                return d;
            },
            "{'stage/op': {'count', 'ms', 'flops'}} accumulated while profiling (matmul FLOPs; ms per node).")
        .def("reset_profile", &Model::reset_profile, "Clear the accumulated profile.")
        .def(
            "set_prefix",
            [](Model & self, const py::array & embeddings) {
                require_rows(embeddings, self.hparams().dec.d_model, "embeddings");
                const float * p = static_cast<const float *>(embeddings.data());
                const int64_t n = embeddings.shape(0);
                py::gil_scoped_release release;
                self.set_prefix(p, n);
            },
            py::arg("embeddings"),
            "Computes the K/V of these prompt rows once; generate_batch reuses them for every prompt that starts "
            "with exactly these rows (the same logits, less prefill).")
        .def("clear_prefix", &Model::clear_prefix, "Forget the prefix set by set_prefix().")
        .def_property_readonly("prefix_len", &Model::prefix_len, "Rows of the cached prefix (0 = none).")
        .def(
            "last_generation",
            [](const Model & self) {
                const auto s = self.last_generation();
                py::dict d;
                d["stop_reason"] = s.stop_reason;
                d["prefill_ms"] = s.prefill_ms;
                d["decode_ms"] = s.decode_ms;
                d["prompt_tokens"] = s.prompt_tokens;
                d["new_tokens"] = s.new_tokens;
                d["prefix_reused"] = s.prefix_reused;
                d["prefill_passes"] = s.prefill_passes;
                d["decode_passes"] = s.decode_passes;
                d["draft_proposed"] = s.draft_proposed;
                d["draft_accepted"] = s.draft_accepted;
                d["graph_ms"] = s.graph_ms;
                d["transfer_ms"] = s.transfer_ms;
                d["compute_ms"] = s.compute_ms;
                d["select_ms"] = s.select_ms;
                d["step_graph_ms"] = s.step_graph_ms;
                d["step_transfer_ms"] = s.step_transfer_ms;
                d["step_compute_ms"] = s.step_compute_ms;
                d["graphs_built"] = s.graphs_built;
                d["slot_moves"] = s.slot_moves;
                return d;
            },
            "Stop reason (eos, max_new_tokens, repetition) and timings of the last generate(); graph_ms, "
            "transfer_ms, compute_ms: its decoder passes' graph building, host<->backend copies and compute; "
            "select_ms: choosing the tokens of its decode steps on the host; step_graph_ms, step_transfer_ms, "
            "step_compute_ms: the decode steps' share of those three; graphs_built: decoder graphs it built "
            "(CPU decode steps reuse the previous step's graph: FUN_ASR_GRAPH_REUSE=0 builds one per pass).")
        .def("__repr__", [](const Model & self) {
            const auto & hp = self.hparams();
            return "<fun_asr._core.Model enc=" + std::to_string(hp.enc.n_layers) + "x" + std::to_string(hp.enc.d_model) +
                   " dec=" + std::to_string(hp.dec.n_layers) + "x" + std::to_string(hp.dec.d_model) +
                   " backend=" + self.backend_name() + ">";
        });
}

// The loaders: a GGUF file, its header check, GGUF-style tensors from Python.
void bind_loaders(py::module_ & m) {
    m.def("load_gguf", &load_gguf, py::arg("path"), py::kw_only(), py::arg("device") = "cpu", py::arg("threads") = 0,
          "Load a fun_asr_nano GGUF file.");
    m.def(
        "check_gguf",
        [](const std::string & path) {
            std::string arch;
            size_t n = 0;
            {
                py::gil_scoped_release release;
                const fun_asr::ModelSource src = fun_asr::read_gguf(path);
                arch = src.arch;
                n = src.tensors.size();
            }
            return py::make_tuple(arch, n);
        },
        py::arg("path"),
        "Reads a GGUF's header and checks every tensor lies inside the file (no weights loaded): returns "
        "(architecture, tensor count); RuntimeError naming the problem (bad magic, truncation) otherwise.");
    m.def("load_tensors", &load_tensors, py::arg("arch"), py::arg("metadata"), py::arg("tensors"), py::kw_only(),
          py::arg("device") = "cpu", py::arg("threads") = 0, py::arg("origin") = "<tensors>",
          "Load a model from GGUF-style metadata and (name, type, ne, buffer) tensors (used for HF directories).");
}

}  // namespace

void bind_model(py::module_ & m) {
    bind_thread_chooser(m);
    bind_interrupted(m);
    py::class_<Model> model(m, "Model",
                            "A loaded Fun-ASR-Nano model (weights + KV cache) on one backend. Calls on "
                            "one Model run one at a time (internally locked).");
    bind_model_settings(model);
    bind_model_encoder(model);
    bind_model_packed_encoder(model);
    bind_model_ctc_head(model);
    bind_model_decoder(model);
    bind_model_generate_batch(model);
    bind_model_generation_controls(model);
    bind_model_profile_prefix(model);
    bind_loaders(m);
}

}  // namespace fun_asr::bindings
