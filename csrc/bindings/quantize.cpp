// Bindings for ggml quantization: quantize, dequantize, quantized_row_bytes, block_size.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "bindings/common.h"
#include "runtime/quantize.h"

namespace fun_asr::bindings {

namespace {

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

void bind_quantize(py::module_ & m) {
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

}  // namespace fun_asr::bindings
