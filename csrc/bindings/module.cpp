// The fun_asr._core extension module: a thin pybind11 layer over the fun_asr native library.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "runtime/backend.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "fun-asr native core (ggml)";
    fun_asr::install_ggml_logger();

    fun_asr::bindings::bind_model(m);
    fun_asr::bindings::bind_vad(m);
    fun_asr::bindings::bind_speaker(m);
    fun_asr::bindings::bind_quantize(m);
    fun_asr::bindings::bind_bench(m);
}
