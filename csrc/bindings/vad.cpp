// Bindings for the FSMN-VAD VadModel class and its loaders: load_vad_gguf, load_vad_tensors.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "bindings/common.h"
#include "model/loader.h"
#include "runtime/vad_model.h"

namespace fun_asr::bindings {

namespace {

std::unique_ptr<fun_asr::VadModel> load_vad_gguf(const std::string & path, int threads,
                                                 const std::string & device) {
    py::gil_scoped_release release;
    fun_asr::ModelSource src = fun_asr::read_gguf(path);
    return std::make_unique<fun_asr::VadModel>(src, threads, device);
}

std::unique_ptr<fun_asr::VadModel> load_vad_tensors(const py::dict & meta, const py::list & tensors, int threads,
                                                    const std::string & origin, const std::string & device) {
    std::vector<py::buffer_info> keep;
    fun_asr::ModelSource src = source_from_python("fsmn_vad", meta, tensors, origin, keep);
    py::gil_scoped_release release;
    return std::make_unique<fun_asr::VadModel>(src, threads, device);
}

}  // namespace

void bind_vad(py::module_ & m) {
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
            d["backend"] = self.backend_name();
            return d;
        });

    m.def("load_vad_gguf", &load_vad_gguf, py::arg("path"), py::kw_only(), py::arg("threads") = 1,
          py::arg("device") = "cpu",
          "Load an fsmn_vad GGUF file.");
    m.def("load_vad_tensors", &load_vad_tensors, py::arg("metadata"), py::arg("tensors"), py::kw_only(),
          py::arg("threads") = 1, py::arg("origin") = "<tensors>", py::arg("device") = "cpu",
          "Load an FSMN-VAD from GGUF-style metadata and (name, type, ne, buffer) tensors (FunASR folders).");
}

}  // namespace fun_asr::bindings
