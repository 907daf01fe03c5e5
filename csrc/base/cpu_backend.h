// The few functions of ggml's CPU backend that fun-asr calls itself, in one table.
//
// The CPU backend is either linked into the extension (the default build) or a module that ggml loads at run time
// (the portable build: ggml's CPU variants, GGML_BACKEND_DL, one chosen for the running CPU). In the second case
// its functions are not the extension's to link: they are looked up once, in the module ggml loaded (the
// registry's proc addresses, else the module's own symbols), so that fun-asr's kernels call exactly the code
// ggml's own ops run (the same bits: ggml's Q8_0 quantizer, its norm's variance, its SwiGLU row).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace fun_asr::cpu_backend {

struct Api {
    const ggml_type_traits_cpu * (*type_traits)(ggml_type) = nullptr;  // ggml_get_type_traits_cpu
    // y = x - mean; returns the mean of y * y (ggml_float), in the ISA the backend was built for (ggml_norm's)
    double (*vec_cvar_f32)(int n, float * y, const float * x, float mean) = nullptr;
    // y = silu(x) * g, as ggml_swiglu_split computes it
    void (*vec_swiglu_f32)(int n, float * y, const float * x, const float * g) = nullptr;
    void (*set_n_threads)(ggml_backend_t backend, int n) = nullptr;
    void (*set_abort_callback)(ggml_backend_t backend, ggml_abort_callback cb, void * data) = nullptr;
};

// The table, resolved at the first call (std::runtime_error naming what is missing when a loaded CPU module
// lacks one: a ggml of another version).
const Api & api();

// ggml's CPU backend's feature list (the variant loaded, in the portable build): (name, value) pairs as it gives
// them ("AVX512", "1"), read once; system_info()'s cpu_features.
const std::vector<std::pair<std::string, std::string>> & features();

// Whether that list says the backend was compiled with `feature` ("AVX512", "AVX512_VNNI", "AVX_VNNI", ...): what
// its own kernels use, which fun-asr's kernels match where they must give ggml's bits.
bool built_with(const char * feature);

// Whether `backend` is ggml's CPU backend (ggml_backend_is_cpu, which a loaded module does not export).
bool is_cpu(ggml_backend_t backend);

// A new CPU backend (ggml_backend_free it) with `threads` threads.
ggml_backend_t make(int threads);

// The portable build: ggml's backend modules (CPU variants, GPU backends) loaded from the extension's own
// folder, once; a no-op in the default build. Every use of ggml's device registry comes after it.
void load_backends();

// The GPU backend modules shipped beside the extension (the portable build) that give no device here, each with
// why, in ggml's registry name's lower case: ("vulkan", "libvulkan.so.1: cannot open shared object file ...") when
// the module did not load, or a sentence saying it loaded but found no device. Empty in the default build.
const std::vector<std::pair<std::string, std::string>> & unavailable_backends();

}  // namespace fun_asr::cpu_backend
