// Helpers shared by the pybind11 binding files (see common.h).
#include "bindings/common.h"

#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/quantize.h"

namespace fun_asr::bindings {

namespace {

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

}  // namespace

void require_float32_c(const py::array & a, int ndim, const char * what) {
    // float32 in this machine's byte order, whichever dtype object says so (an unpickled array's is not numpy's
    // canonical one)
    const uint16_t one = 1;
    const bool little = *reinterpret_cast<const uint8_t *>(&one) == 1;
    const char order = a.dtype().byteorder();
    const bool native = order == '=' || order == '|' || order == (little ? '<' : '>');
    if (a.dtype().num() != py::dtype::of<float>().num() || !native) {
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

py::array_t<float> to_numpy(std::vector<float> && v, std::vector<py::ssize_t> shape) {
    auto * heap = new std::vector<float>(std::move(v));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>(shape, heap->data(), owner);
}

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

}  // namespace fun_asr::bindings
