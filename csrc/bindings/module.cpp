// Thin pybind11 layer over the fun_asr native library. Arrays in: C-contiguous float32, checked
// here with clear errors; arrays out: numpy arrays that own their memory. C++ exceptions map to
// Python exceptions (std::invalid_argument -> ValueError, std::runtime_error -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/loader.h"
#include "runtime/backend.h"
#include "kernels/gemm_amx.h"
#include "kernels/matvec.h"
#include "runtime/bench.h"
#include "runtime/model.h"
#include "runtime/quantize.h"
#include "runtime/vad_model.h"

namespace py = pybind11;

namespace {

// Validates that `a` is a C-contiguous float32 array of `ndim` dimensions; `what` names it.
void require_float32_c(const py::array & a, int ndim, const char * what) {
    if (!a.dtype().is(py::dtype::of<float>())) {
        throw py::type_error(std::string(what) + " must be a float32 array, got dtype " +
                             py::str(a.dtype()).cast<std::string>() +
                             " (convert with numpy.asarray(x, dtype=numpy.float32))");
    }
    if (a.ndim() != ndim) {
        throw py::value_error(std::string(what) + " must have " + std::to_string(ndim) +
                              " dimensions, got " + std::to_string(a.ndim()));
    }
    if (!(a.flags() & py::array::c_style)) {
        throw py::value_error(std::string(what) +
                              " must be C-contiguous (use numpy.ascontiguousarray(x))");
    }
}

py::dict system_info() {
    const fun_asr::SystemInfo info = fun_asr::system_info();
    py::dict d;
    d["ggml_version"] = info.ggml_version;
    d["ggml_commit"] = info.ggml_commit;
    d["compiled_backends"] = info.compiled_backends;
    d["registered_backends"] = info.registered_backends;
    py::list devices;
    for (const auto & dev : info.devices) {
        py::dict e;
        e["name"] = dev.name;
        e["description"] = dev.description;
        e["type"] = dev.type;
        e["memory_free"] = dev.memory_free;
        e["memory_total"] = dev.memory_total;
        devices.append(e);
    }
    d["devices"] = devices;
    py::dict features;
    for (const auto & [k, v] : info.cpu_features) features[py::str(k)] = v;
    d["cpu_features"] = features;
    d["tensor_types"] = fun_asr::supported_tensor_types();
    return d;
}

py::bytes quantize(const py::array & matrix, const std::string & type_name, int threads) {
    const ggml_type type = fun_asr::parse_tensor_type(type_name);
    require_float32_c(matrix, 2, "matrix");
    const int64_t rows = matrix.shape(0);
    const int64_t cols = matrix.shape(1);
    const size_t nbytes = fun_asr::quantized_size(type, rows, cols);
    std::string out(nbytes, '\0');
    const float * src = static_cast<const float *>(matrix.data());
    {
        py::gil_scoped_release release;
        fun_asr::quantize_rows(type, src, out.data(), rows, cols, threads);
    }
    return py::bytes(out);
}

py::array_t<float> dequantize(const py::buffer & data, const std::string & type_name,
                              const std::vector<int64_t> & shape) {
    const ggml_type type = fun_asr::parse_tensor_type(type_name);
    if (shape.empty()) throw py::value_error("shape must have at least one dimension");
    int64_t rows = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] <= 0) {
            throw py::value_error("shape dimensions must be positive, got " +
                                  std::to_string(shape[i]) + " at index " + std::to_string(i));
        }
        if (i + 1 < shape.size()) rows *= shape[i];
    }
    const int64_t cols = shape.back();
    const size_t expected = fun_asr::quantized_size(type, rows, cols);
    py::buffer_info buf = data.request();
    const size_t got = static_cast<size_t>(buf.size) * static_cast<size_t>(buf.itemsize);
    py::ssize_t stride = buf.itemsize;
    for (py::ssize_t i = buf.ndim - 1; i >= 0; --i) {
        if (buf.shape[i] > 1 && buf.strides[i] != stride) {
            throw py::value_error("data must be a C-contiguous buffer (bytes, bytearray or a "
                                  "contiguous numpy array)");
        }
        stride *= buf.shape[i];
    }
    if (got != expected) {
        throw py::value_error("data holds " + std::to_string(got) + " bytes but " + type_name +
                              " of this shape needs " + std::to_string(expected));
    }
    py::array_t<float> out(std::vector<py::ssize_t>(shape.begin(), shape.end()));
    float * dst = out.mutable_data();
    const void * src = buf.ptr;
    {
        py::gil_scoped_release release;
        fun_asr::dequantize_rows(type, src, dst, rows, cols);
    }
    return out;
}

// ---- Model -----------------------------------------------------------------------------------

using fun_asr::Model;

py::array_t<float> to_numpy(std::vector<float> && v, std::vector<py::ssize_t> shape) {
    auto * heap = new std::vector<float>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>(shape, heap->data(), owner);
}

// Checks a [rows, cols] C-contiguous float32 array with cols fixed.
void require_rows(const py::array & a, int64_t cols, const char * what) {
    require_float32_c(a, 2, what);
    if (a.shape(1) != cols) {
        throw py::value_error(std::string(what) + " must have " + std::to_string(cols) + " columns, got shape (" +
                              std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) + ")");
    }
    if (a.shape(0) == 0) throw py::value_error(std::string(what) + " is empty (0 rows)");
    const float * p = static_cast<const float *>(a.data());
    for (py::ssize_t i = 0, n = a.size(); i < n; ++i) {
        if (!std::isfinite(p[i])) throw py::value_error(std::string(what) + " contains NaN or infinite values");
    }
}

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

std::unique_ptr<Model> load_gguf(const std::string & path, const std::string & device, int threads) {
    py::gil_scoped_release release;
    fun_asr::ModelSource src = fun_asr::read_gguf(path);
    return std::make_unique<Model>(src, device, threads);
}

fun_asr::MetaValue to_meta(const py::handle & v, const std::string & key) {
    if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
    if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
    if (py::isinstance<py::float_>(v)) return v.cast<double>();
    if (py::isinstance<py::str>(v)) return v.cast<std::string>();
    if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
        std::vector<int64_t> out;
        for (auto item : v) {
            if (!py::isinstance<py::int_>(item)) return std::string("<list>");
            out.push_back(item.cast<int64_t>());
        }
        return out;
    }
    throw py::type_error("metadata value for '" + key + "' has unsupported type");
}

// A ModelSource over Python-owned buffers (the HF-directory and FunASR-folder paths); `keep` holds
// the buffer views alive while the model copies or wraps them.
fun_asr::ModelSource source_from_python(const std::string & arch, const py::dict & meta, const py::list & tensors,
                                        const std::string & origin, std::vector<py::buffer_info> & keep) {
    fun_asr::ModelSource src;
    src.arch = arch;
    src.origin = origin;
    for (auto item : meta) {
        const std::string key = item.first.cast<std::string>();
        src.meta[key] = to_meta(item.second, key);
    }
    keep.reserve(tensors.size());
    for (auto item : tensors) {
        auto tup = item.cast<py::tuple>();
        if (tup.size() != 4) throw py::value_error("tensors must be (name, type, ne, buffer) tuples");
        fun_asr::SourceTensor t;
        t.name = tup[0].cast<std::string>();
        t.type = fun_asr::parse_tensor_type(tup[1].cast<std::string>());
        t.ne = tup[2].cast<std::vector<int64_t>>();
        keep.push_back(tup[3].cast<py::buffer>().request());
        t.data = keep.back().ptr;
        t.nbytes = static_cast<size_t>(keep.back().size * keep.back().itemsize);
        src.tensors.push_back(std::move(t));
    }
    return src;
}

std::unique_ptr<Model> load_tensors(const std::string & arch, const py::dict & meta, const py::list & tensors,
                                    const std::string & device, int threads, const std::string & origin) {
    std::vector<py::buffer_info> keep;
    fun_asr::ModelSource src = source_from_python(arch, meta, tensors, origin, keep);
    py::gil_scoped_release release;
    return std::make_unique<Model>(src, device, threads);
}

std::unique_ptr<fun_asr::VadModel> load_vad_gguf(const std::string & path, int threads) {
    py::gil_scoped_release release;
    fun_asr::ModelSource src = fun_asr::read_gguf(path);
    return std::make_unique<fun_asr::VadModel>(src, threads);
}

std::unique_ptr<fun_asr::VadModel> load_vad_tensors(const py::dict & meta, const py::list & tensors, int threads,
                                                    const std::string & origin) {
    std::vector<py::buffer_info> keep;
    fun_asr::ModelSource src = source_from_python("fsmn_vad", meta, tensors, origin, keep);
    py::gil_scoped_release release;
    return std::make_unique<fun_asr::VadModel>(src, threads);
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
    d["device"] = m.device_description();
    d["weight_bytes"] = m.weight_bytes();
    d["weights_mmapped"] = m.weights_mmapped();
    d["repacked_tensors"] = m.repacked_tensors();
    d["kv_cache_bytes"] = m.kv_bytes();
    d["threads"] = m.threads();
    return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "fun-asr native core (ggml)";
    fun_asr::install_ggml_logger();

    m.def("system_info", &system_info,
          "ggml version and commit, compiled and registered backends, devices, CPU features and "
          "the tensor types quantize/dequantize accept.");

    m.def("quantize", &quantize, py::arg("matrix"), py::arg("type"), py::kw_only(),
          py::arg("threads") = 0,
          "Quantize a C-contiguous float32 matrix [rows, cols] to `type` (f32, f16, bf16, q8_0, "
          "q4_k, q6_k) with ggml's own routines; returns the packed bytes. cols must be a "
          "multiple of the type's block size (32 for q8_0, 256 for the k-quants).");

    m.def("dequantize", &dequantize, py::arg("data"), py::arg("type"), py::arg("shape"),
          "Unpack bytes of `type` into a float32 array of `shape` (the last dimension is the row).");

    py::class_<Model>(m, "Model", "A loaded Fun-ASR-Nano model (weights + KV cache) on one backend. Calls on "
                                  "one Model run one at a time (internally locked).")
        .def("info", &model_info, "Hyperparameters, tensor types, backend, bytes of weights.")
        .def_property("threads", &Model::threads, &Model::set_threads)
        .def_property_readonly("n_past", &Model::n_past, "Positions currently in the KV cache.")
        .def_property("flash_attn", &Model::flash_attn, &Model::set_flash_attn,
                      "Decoder attention via ggml's fused flash-attention kernel (default True).")
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
                if (!self.has_ctc()) throw py::value_error("this model has no CTC head: " + self.hparams().ctc.unavailable);
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
                if (!self.has_ctc()) throw py::value_error("this model has no CTC head: " + self.hparams().ctc.unavailable);
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
            py::arg("features"), "Every named stage output for features float32[T, input_size]: name -> float32[T, width].")
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
            "last_generation() tells which, with timings.")
        .def(
            "generate_batch",
            [](Model & self, const py::list & embeddings, int64_t max_new_tokens, const std::vector<int64_t> & stop_ids,
               bool repetition_guard, const py::object & on_step) {
                std::vector<py::array> keep;
                std::vector<std::pair<const float *, int64_t>> prompts;
                for (auto item : embeddings) {
                    if (!py::isinstance<py::array>(item)) throw py::type_error("embeddings must be a list of numpy arrays");
                    keep.push_back(py::reinterpret_borrow<py::array>(item));
                    require_rows(keep.back(), self.hparams().dec.d_model, "embeddings");
                    prompts.emplace_back(static_cast<const float *>(keep.back().data()), keep.back().shape(0));
                }
                const std::vector<int32_t> stops = vocab_ids(self, stop_ids, "stop id");
                // Every step takes the GIL briefly: pending signals (Ctrl-C) are checked and on_step is
                // called; a Python exception from either aborts generation and propagates.
                const bool has_callback = !on_step.is_none();
                Model::StepCallback step = [&](int64_t produced, int64_t active) {
                    py::gil_scoped_acquire acquire;
                    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                    if (has_callback) on_step(produced, active);
                };
                std::vector<Model::Generated> out;
                {
                    py::gil_scoped_release release;
                    out = self.generate_batch(prompts, max_new_tokens, stops, repetition_guard, step);
                }
                py::list result;
                for (const auto & g : out) {
                    result.append(py::make_tuple(std::vector<int64_t>(g.tokens.begin(), g.tokens.end()), g.stop_reason));
                }
                return result;
            },
            py::arg("embeddings"), py::arg("max_new_tokens"), py::arg("stop_ids"), py::kw_only(),
            py::arg("repetition_guard") = false, py::arg("on_step") = py::none(),
            "generate() for several sequences at once (one KV cache slot each; every step reads the weights once "
            "for all). Returns [(tokens, stop_reason)] in input order; tokens equal one-by-one generate(). "
            "on_step(tokens_so_far, active) is called after the prefill and after every step; an exception it "
            "raises (or Ctrl-C) aborts the generation.")
        .def_property("logit_digests", &Model::logit_digests, &Model::set_logit_digests,
                      "Test aid (default False): generate_batch/generate keep a 64-bit digest of every logits row a "
                      "token was taken from; last_logit_digests() returns them.")
        .def("last_logit_digests", &Model::last_logit_digests,
             "Per sequence of the last generate_batch/generate (with logit_digests on): one digest (FNV-1a of "
             "the float32 bits) per produced token's logits row, [] when off.")
        .def_property("max_step_sequences", &Model::max_step_sequences, &Model::set_max_step_sequences,
                      "At most this many sequences per decoding step graph (0, the default: as many as one graph "
                      "takes); larger batches step in chunks, with the same tokens.")
        .def_property("profiling", &Model::profiling, &Model::set_profiling,
                      "Per-node timing (also FUN_ASR_PROFILE=1): every node computed alone and timed.")
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
                return d;
            },
            "Stop reason (eos, max_new_tokens, repetition) and timings of the last generate().")
        .def("__repr__", [](const Model & self) {
            const auto & hp = self.hparams();
            return "<fun_asr._core.Model enc=" + std::to_string(hp.enc.n_layers) + "x" + std::to_string(hp.enc.d_model) +
                   " dec=" + std::to_string(hp.dec.n_layers) + "x" + std::to_string(hp.dec.d_model) +
                   " backend=" + self.backend_name() + ">";
        });

    py::class_<fun_asr::VadModel>(m, "VadModel",
                                  "FunASR's FSMN-VAD network on the CPU: LFR features -> per-frame class probabilities, "
                                  "with the FSMN caches carried between calls (chunks give the same result as one call).")
        .def(
            "forward",
            [](fun_asr::VadModel & self, const py::array & features, py::array & cache, int64_t column) {
                const auto & hp = self.hparams();
                require_rows(features, hp.in_dim, "features");
                require_float32_c(cache, 3, "cache");
                if (cache.shape(0) != hp.n_layers || cache.shape(1) != hp.lorder - 1 || cache.shape(2) != hp.proj_dim) {
                    throw py::value_error("cache must have shape (" + std::to_string(hp.n_layers) + ", " +
                                          std::to_string(hp.lorder - 1) + ", " + std::to_string(hp.proj_dim) + ")");
                }
                if (!cache.writeable()) throw py::value_error("cache must be writeable (it is updated in place)");
                const int64_t T = features.shape(0);
                const float * f = static_cast<const float *>(features.data());
                float * c = static_cast<float *>(cache.mutable_data());
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.forward(f, T, c, column);
                }
                std::vector<py::ssize_t> shape{T};
                if (column < 0) shape.push_back(hp.out_dim);
                py::array_t<float> result(shape);
                std::memcpy(result.mutable_data(), out.data(), out.size() * sizeof(float));
                return result;
            },
            py::arg("features"), py::arg("cache"), py::arg("column") = 0,
            "features float32 [T, input_dim] (LFR, before CMVN); cache float32 [n_layers, lorder-1, proj_dim], "
            "updated in place (zeros = no history). Returns the probabilities of class `column` [T], or of "
            "every class [T, output_dim] with column=-1.")
        .def_property("threads", &fun_asr::VadModel::threads, &fun_asr::VadModel::set_threads)
        .def("info", [](const fun_asr::VadModel & self) {
            const auto & hp = self.hparams();
            py::dict d;
            d["input_dim"] = hp.in_dim;
            d["input_affine_dim"] = hp.in_affine;
            d["linear_dim"] = hp.linear_dim;
            d["proj_dim"] = hp.proj_dim;
            d["lorder"] = hp.lorder;
            d["output_affine_dim"] = hp.out_affine;
            d["output_dim"] = hp.out_dim;
            d["n_layers"] = hp.n_layers;
            d["threads"] = self.threads();
            return d;
        });

    m.def("load_vad_gguf", &load_vad_gguf, py::arg("path"), py::kw_only(), py::arg("threads") = 1,
          "Load an fsmn_vad GGUF file.");
    m.def("load_vad_tensors", &load_vad_tensors, py::arg("metadata"), py::arg("tensors"), py::kw_only(),
          py::arg("threads") = 1, py::arg("origin") = "<tensors>",
          "Load an FSMN-VAD from GGUF-style metadata and (name, type, ne, buffer) tensors (FunASR folders).");
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

    auto matmul_path = [](const std::string & p) {
        if (p == "ggml") return fun_asr::MatmulPath::ggml;
        if (p == "decode") return fun_asr::MatmulPath::decode;
        if (p == "frames") return fun_asr::MatmulPath::frames;
        throw std::invalid_argument("path must be 'ggml', 'decode' or 'frames', got '" + p + "'");
    };
    m.def("bench_matmul",
          [matmul_path](const std::string & type, int64_t n, int64_t k, int64_t m, const std::string & device,
                        int threads, int repeats, const std::string & path) {
              const auto mp = matmul_path(path);
              py::gil_scoped_release release;
              return fun_asr::bench_matmul(type, n, k, m, device, threads, repeats, mp);
          },
          py::arg("type"), py::arg("n"), py::arg("k"), py::arg("m"), py::kw_only(), py::arg("device") = "cpu",
          py::arg("threads") = 0, py::arg("repeats") = 5, py::arg("path") = "ggml",
          "Median ms of a mul_mat: weights [n, k] of `type` times float32 activations [m, k] (benchmarks). "
          "path: 'ggml' (ggml_mul_mat), 'decode' (the decode-step path: fun-asr's mat-vec kernels where they "
          "apply, else ggml's one-column arithmetic for every column), 'frames' (the encoder/prefill path: AMX "
          "where it applies).");

    m.def("bench_matvec_chunks",
          [matmul_path](const std::string & type, int64_t rows, int64_t k, int64_t chunk_rows, int threads, int repeats,
                        const std::string & path) {
              const auto mp = matmul_path(path);
              py::gil_scoped_release release;
              return fun_asr::bench_matvec_chunks(type, rows, k, chunk_rows, threads, repeats, mp);
          },
          py::arg("type"), py::arg("rows"), py::arg("k"), py::arg("chunk_rows"), py::kw_only(), py::arg("threads") = 0,
          py::arg("repeats") = 5, py::arg("path") = "decode",
          "Median ms of one column times a [rows, k] matrix computed as rows / chunk_rows separate products "
          "(a decode step's layer-by-layer weight stream); path 'ggml' or 'decode'.");

    m.def("eval_matmul",
          [matmul_path](const std::string & type, py::array_t<float, py::array::c_style | py::array::forcecast> w,
                        py::array_t<float, py::array::c_style | py::array::forcecast> x, int threads,
                        const std::string & path) {
              if (w.ndim() != 2 || x.ndim() != 2 || w.shape(1) != x.shape(1)) {
                  throw std::invalid_argument("eval_matmul: w must be [n, k] and x [m, k] float32 arrays");
              }
              const auto mp = matmul_path(path);
              const int64_t n = w.shape(0), k = w.shape(1), m = x.shape(0);
              std::vector<float> y;
              {
                  py::gil_scoped_release release;
                  y = fun_asr::eval_matmul(type, w.data(), n, k, x.data(), m, threads, mp);
              }
              return to_numpy(std::move(y), {static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)});
          },
          py::arg("type"), py::arg("w"), py::arg("x"), py::kw_only(), py::arg("threads") = 1,
          py::arg("path") = "decode",
          "x [m, k] times w [n, k]^T with w quantized to `type`, on the CPU: y [m, n] (kernel tests); path as "
          "in bench_matmul.");

    m.def("read_bandwidth",
          [](int64_t mb, int threads, int repeats) {
              py::gil_scoped_release release;
              return fun_asr::read_bandwidth(mb, threads, repeats);
          },
          py::arg("mb") = 512, py::kw_only(), py::arg("threads") = 1, py::arg("repeats") = 5,
          "Best bytes/s of reading `mb` MiB once with `threads` threads (benchmarks: the memory read limit).");

    m.def("amx_available", &fun_asr::amx_available,
          "Whether the encoder's Q8_0 products run on Intel AMX here (CPU + OS support; FUN_ASR_AMX=0 turns it off).");

    m.def("matvec_isa", &fun_asr::matvec_isa,
          "Instruction set of fun-asr's decode mat-vec kernels (F32, F16, Q8_0, Q6_K, repacked Q4_K) on this CPU: "
          "'avx512vnni', 'avx2', or '' (none: ggml's mul_mat, one column at a time in decode steps; also with "
          "FUN_ASR_MATVEC=0).");

    m.def("quantized_row_bytes",
          [](const std::string & t, int64_t cols) {
              return fun_asr::quantized_size(fun_asr::parse_tensor_type(t), 1, cols);
          },
          py::arg("type"), py::arg("cols"), "Bytes of one row of `cols` values of `type`.");

    m.def("block_size", [](const std::string & t) { return ggml_blck_size(fun_asr::parse_tensor_type(t)); },
          py::arg("type"), "Values per quantization block of `type`.");
}
