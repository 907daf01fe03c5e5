// Bindings for the CAM++ SpeakerModel class and its loaders: load_speaker_gguf, load_speaker_tensors.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "bindings/common.h"
#include "model/loader.h"
#include "runtime/speaker_model.h"

namespace fun_asr::bindings {

namespace {

std::unique_ptr<fun_asr::SpeakerModel> load_speaker_gguf(const std::string & path, int threads,
                                                         const std::string & device) {
    py::gil_scoped_release release;
    fun_asr::ModelSource src = fun_asr::read_gguf(path);
    return std::make_unique<fun_asr::SpeakerModel>(src, threads, device);
}

std::unique_ptr<fun_asr::SpeakerModel> load_speaker_tensors(const py::dict & meta, const py::list & tensors,
                                                            int threads, const std::string & origin,
        const std::string & device) {
    std::vector<py::buffer_info> keep;
    fun_asr::ModelSource src = source_from_python("campplus", meta, tensors, origin, keep);
    py::gil_scoped_release release;
    return std::make_unique<fun_asr::SpeakerModel>(src, threads, device);
}

py::list ints(const std::vector<int64_t> & v) {
    py::list out;
    for (int64_t x : v) out.append(x);
    return out;
}

}  // namespace

void bind_speaker(py::module_ & m) {
    py::class_<fun_asr::SpeakerModel>(m, "SpeakerModel",
                                      "FunASR's CAM++ speaker-embedding network on the CPU: mean-normalized fbank "
                                      "windows -> one embedding per window (equal-length windows batched in one graph).")
        .def(
            "embed",
            [](fun_asr::SpeakerModel & self, const py::array & features) {
                const auto & hp = self.hparams();
                require_float32_c(features, 3, "features");
                if (features.shape(2) != hp.feat_dim) {
                    throw py::value_error("features must have shape (windows, frames, " + std::to_string(hp.feat_dim) +
                                          "), got last dimension " + std::to_string(features.shape(2)));
                }
                const int64_t n = features.shape(0), T = features.shape(1);
                if (n == 0) throw py::value_error("features hold no windows (shape[0] is 0)");
                if (T < hp.min_frames()) {
                    throw py::value_error("windows of " + std::to_string(T) + " frames are too short: CAM++ needs at "
                                          "least " + std::to_string(hp.min_frames()) + " feature frames");
                }
                const float * p = static_cast<const float *>(features.data());
                for (py::ssize_t i = 0, size = features.size(); i < size; ++i) {
                    if (!std::isfinite(p[i])) throw py::value_error("features contain NaN or infinite values");
                }
                std::vector<float> out;
                {
                    py::gil_scoped_release release;
                    out = self.embed(p, n, T);
                }
                return to_numpy(std::move(out), {static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(hp.emb)});
            },
            py::arg("features"),
            "features float32 [windows, frames, feat_dim] (fbank minus its mean over time, per window). Returns the "
            "embeddings float32 [windows, embedding_length], each window computed as if alone.")
        .def("batch_for", &fun_asr::SpeakerModel::batch_for, py::arg("frames"),
             "Windows of this many frames run per graph under the memory budget.")
        .def_property("threads", &fun_asr::SpeakerModel::threads, &fun_asr::SpeakerModel::set_threads)
        .def_property("memory_budget", &fun_asr::SpeakerModel::memory_budget, &fun_asr::SpeakerModel::set_memory_budget,
                      "Bytes of graph memory one batch may take (windows per graph follow from it).")
        .def("info", [](const fun_asr::SpeakerModel & self) {
            const auto & hp = self.hparams();
            py::dict d;
            d["feat_dim"] = hp.feat_dim;
            d["embedding_length"] = hp.emb;
            d["growth_rate"] = hp.growth;
            d["bn_size"] = hp.bn_size;
            d["tdnn_channels"] = hp.tdnn_ch;
            d["tdnn_kernel_size"] = hp.tdnn_k;
            d["tdnn_stride"] = hp.tdnn_stride;
            d["fcm_channels"] = hp.fcm_ch;
            d["fcm_kernel_size"] = hp.fcm_k;
            d["fcm_stride"] = hp.fcm_stride;
            d["fcm_block_count"] = ints(hp.fcm_blocks);
            d["block_layer_count"] = ints(hp.layers);
            d["block_kernel_size"] = ints(hp.kernels);
            d["block_dilation"] = ints(hp.dilations);
            d["cam_reduction"] = hp.reduction;
            d["cam_seg_len"] = hp.seg_len;
            d["fcm_freq"] = hp.fcm_freq;
            d["min_frames"] = hp.min_frames();
            d["weight_type"] = self.weight_type();
            d["threads"] = self.threads();
            d["backend"] = self.backend_name();
            return d;
        });

    m.def("load_speaker_gguf", &load_speaker_gguf, py::arg("path"), py::kw_only(), py::arg("threads") = 1,
          py::arg("device") = "cpu",
          "Load a campplus GGUF file, or the CAM++ embedded in a package GGUF.");
    m.def("load_speaker_tensors", &load_speaker_tensors, py::arg("metadata"), py::arg("tensors"), py::kw_only(),
          py::arg("threads") = 1, py::arg("origin") = "<tensors>", py::arg("device") = "cpu",
          "Load a CAM++ from GGUF-style metadata and (name, type, ne, buffer) tensors (FunASR folders).");
}

}  // namespace fun_asr::bindings
