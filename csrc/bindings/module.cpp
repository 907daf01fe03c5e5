// Thin pybind11 layer over the fun_asr native library. Arrays in: C-contiguous float32, checked
// here with clear errors; arrays out: numpy arrays that own their memory. C++ exceptions map to
// Python exceptions (std::invalid_argument -> ValueError, std::runtime_error -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/quantize.h"

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

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "fun-asr native core (ggml)";

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

    m.def("quantized_row_bytes",
          [](const std::string & t, int64_t cols) {
              return fun_asr::quantized_size(fun_asr::parse_tensor_type(t), 1, cols);
          },
          py::arg("type"), py::arg("cols"), "Bytes of one row of `cols` values of `type`.");

    m.def("block_size", [](const std::string & t) { return ggml_blck_size(fun_asr::parse_tensor_type(t)); },
          py::arg("type"), "Values per quantization block of `type`.");
}
