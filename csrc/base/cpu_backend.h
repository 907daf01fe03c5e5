// The few functions of ggml's CPU backend that fun-asr calls itself, in one table.
//
// The CPU backend is either linked into the extension (the default build) or a module that ggml loads at run time
// (the portable build: ggml's CPU variants, GGML_BACKEND_DL, one chosen for the running CPU). In the second case
// its functions are not the extension's to link: they are looked up once, in the module ggml loaded (the
// registry's proc addresses, else the module's own symbols), so that fun-asr's kernels call exactly the code
// ggml's own ops run (the same bits: ggml's Q8_0 quantizer, its norm's variance, its SwiGLU row).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace fun_asr::cpu_backend {

struct Api {
    const ggml_type_traits_cpu * (*type_traits)(ggml_type) = nullptr;  // ggml_get_type_traits_cpu
    double (*vec_cvar_f32)(int n, float * y, const float * x, float mean) = nullptr;
    void (*vec_swiglu_f32)(int n, float * y, const float * x, const float * g) = nullptr;
    void (*set_n_threads)(ggml_backend_t backend, int n) = nullptr;
    void (*set_abort_callback)(ggml_backend_t backend, ggml_abort_callback cb, void * data) = nullptr;
};

// The table, resolved at the first call (std::runtime_error naming what is missing when a loaded CPU module
// lacks one: a ggml of another version).
const Api & api();

// Whether ggml's CPU backend (the variant loaded, in the portable build) was compiled with this feature, by the
// name its feature list gives ("AVX512", "AVX512_VNNI", "AVX_VNNI", ...): what its own kernels use, which
// fun-asr's kernels match where they must give ggml's bits.
bool built_with(const char * feature);

// Whether `backend` is ggml's CPU backend (ggml_backend_is_cpu, which a loaded module does not export).
bool is_cpu(ggml_backend_t backend);

// A new CPU backend (ggml_backend_free it) with `threads` threads.
ggml_backend_t make(int threads);

// Whether the CPU backend is a module loaded at run time (the portable build).
bool loaded_at_run_time();

// The portable build: ggml's backend modules (CPU variants, GPU backends) loaded from the extension's own
// folder, once; a no-op in the default build. Every use of ggml's device registry comes after it.
void load_backends();

}  // namespace fun_asr::cpu_backend
