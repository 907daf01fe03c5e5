// Helpers shared by the pybind11 binding files: array checks, numpy output, ModelSource from Python.
//
// Arrays in: C-contiguous float32, checked here with clear errors; arrays out: numpy arrays that own
// their memory. C++ exceptions map to Python exceptions (std::invalid_argument -> ValueError,
// std::runtime_error -> RuntimeError).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/loader.h"

namespace fun_asr::bindings {

namespace py = pybind11;

// Validates that `a` is a C-contiguous float32 array of `ndim` dimensions; `what` names it.
void require_float32_c(const py::array & a, int ndim, const char * what);

// Checks a [rows, cols] C-contiguous float32 array with cols fixed.
void require_rows(const py::array & a, int64_t cols, const char * what);

// A float32 numpy array of `shape` that takes ownership of `v` (no copy).
py::array_t<float> to_numpy(std::vector<float> && v, std::vector<py::ssize_t> shape);

// A ModelSource over Python-owned buffers (the HF-directory and FunASR-folder paths); `keep` holds
// the buffer views alive while the model copies or wraps them.
fun_asr::ModelSource source_from_python(const std::string & arch, const py::dict & meta, const py::list & tensors,
                                        const std::string & origin, std::vector<py::buffer_info> & keep);

}  // namespace fun_asr::bindings
