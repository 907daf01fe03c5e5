// The fun_asr._core extension module: a thin pybind11 layer over the fun_asr native library.
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "base/cpu_backend.h"
#include "bindings/bind.h"
#include "runtime/backend.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "fun-asr native core (ggml)";
    fun_asr::install_ggml_logger();
    // the portable build: ggml's backend modules from the package folder (the CPU's variant for this CPU)
    fun_asr::cpu_backend::load_backends();
    if (ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) == nullptr) {
        throw std::runtime_error("fun_asr._core: ggml's CPU backend could not be loaded (no libggml-cpu-*.so that "
                                 "runs on this CPU beside the extension); reinstall fun-asr");
    }

    fun_asr::bindings::bind_model(m);
    fun_asr::bindings::bind_vad(m);
    fun_asr::bindings::bind_speaker(m);
    fun_asr::bindings::bind_quantize(m);
    fun_asr::bindings::bind_bench(m);
}
