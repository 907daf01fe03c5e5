// Bindings for system info, matmul benchmarks, kernel evaluation and the CPU kernel/ISA queries.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "bindings/common.h"
#include "kernels/decoder_fused.h"
#include "kernels/gemm_amx.h"
#include "kernels/gemm_avx2.h"
#include "kernels/matvec.h"
#include "runtime/backend.h"
#include "runtime/bench.h"
#include "runtime/quantize.h"

namespace fun_asr::bindings {

namespace {

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
        py::dict caps;  // what fun-asr's graphs use on it (graph/common.h DeviceCaps)
        for (const auto & [k, v] : dev.caps) caps[py::str(k)] = v;
        e["caps"] = caps;
        devices.append(e);
    }
    d["devices"] = devices;
    py::dict unavailable;  // GPU modules of a portable build that give no device here: {name: why}
    for (const auto & [k, v] : info.unavailable_backends) unavailable[py::str(k)] = v;
    d["unavailable_backends"] = unavailable;
    py::dict features;
    for (const auto & [k, v] : info.cpu_features) features[py::str(k)] = v;
    d["cpu_features"] = features;
    py::dict switches;  // FUN_ASR_* environment switches: {name: {"value": as set or None, "what": ...}}
    for (const auto & sw : info.switches) {
        py::dict e;
        e["value"] = sw.value.empty() ? py::object(py::none()) : py::object(py::str(sw.value));
        e["what"] = sw.what;
        switches[py::str(sw.name)] = e;
    }
    d["switches"] = switches;
    d["tensor_types"] = fun_asr::supported_tensor_types();
    return d;
}

// A benchmark's or kernel test's product path by name.
fun_asr::MatmulPath matmul_path(const std::string & p) {
    if (p == "ggml") return fun_asr::MatmulPath::ggml;
    if (p == "decode") return fun_asr::MatmulPath::decode;
    if (p == "frames") return fun_asr::MatmulPath::frames;
    if (p == "encoder") return fun_asr::MatmulPath::encoder;
    throw std::invalid_argument("path must be 'ggml', 'decode', 'frames' or 'encoder', got '" + p + "'");
}

// The build, its backends and devices, and which device a name selects.
void bind_system_queries(py::module_ & m) {
    m.def("system_info", &system_info,
          "ggml version and commit, compiled and registered backends, devices, CPU features, the FUN_ASR_* "
          "environment switches (value as read, or None, and what each does) and the tensor types "
          "quantize/dequantize accept.");

    m.def(
        "check_device",
        [](const std::string & device) { return std::string(ggml_backend_dev_name(fun_asr::pick_device(device))); },
        py::arg("device"),
        "The name of the ggml device that `device` (auto, cpu, cuda, cuda:N) selects in this build on this machine; "
        "ValueError naming what is accepted when there is none (checked before any model is read or converted).");

    m.def("device_fallback", &fun_asr::device_fallback, py::arg("device"),
          "Why `device` (vulkan, cuda:N, gpu) has no device here although this build ships its backend as a module "
          "(the module did not load, or found no device: a missing or broken driver); '' otherwise.");
}

// The choices of fun-asr's ops as tests check them: the argmax, the RoPE's rounding.
void bind_kernel_choices(py::module_ & m) {
    m.def(
        "first_argmax",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> x, bool nan_first_wins) {
            if (x.ndim() != 1 || x.size() == 0) {
                throw std::invalid_argument("first_argmax takes a non-empty 1-D float array");
            }
            return fun_asr::first_argmax(x.data(), static_cast<int64_t>(x.size()), nan_first_wins);
        },
        py::arg("x"), py::arg("nan_first_wins") = true,
        "The choice of the one argmax op (kernels/decoder_fused) on a row of logits: the index of the first "
        "maximum, as std::max_element (a NaN never wins unless it is element 0; nan_first_wins=False, as for the "
        "CTC head's frames: not even there).");

    m.def(
        "rope_rotation_forms", [](int64_t n, float base) { return fun_asr::rope_rotation_forms(n, base); },
        py::arg("n"), py::arg("base"),
        "How ggml's CPU RoPE (NeoX) rounds its rotation in this build, as the decoder's fused heads/RoPE/KV-store "
        "node found it for rows of n and this base: (first, second) for x0*c - x1*s and x0*s + x1*c, each 0 (two "
        "rounded products, then the sum), 1 (an FMA of the first product), 2 (of the second) or -1 (no match: "
        "the graph keeps ggml's RoPE node).");
}

// Matrix product benchmarks.
void bind_matmul_benchmarks(py::module_ & m) {
    m.def("bench_matmul",
          [](const std::string & type, int64_t n, int64_t k, int64_t m, const std::string & device,
                        int threads, int repeats, const std::string & path) {
              const auto mp = matmul_path(path);
              py::gil_scoped_release release;
              return fun_asr::bench_matmul(type, n, k, m, device, threads, repeats, mp);
          },
          py::arg("type"), py::arg("n"), py::arg("k"), py::arg("m"), py::kw_only(), py::arg("device") = "cpu",
          py::arg("threads") = 0, py::arg("repeats") = 5, py::arg("path") = "ggml",
          "Median ms of a mul_mat: weights [n, k] of `type` times float32 activations [m, k] (benchmarks). "
          "path: 'ggml' (ggml_mul_mat), 'decode' (the decode-step path: fun-asr's mat-vec kernels where they "
          "apply, else ggml's one-column arithmetic for every column), 'frames' (the prefill path: AMX or the "
          "int8 GEMM for Q8_0 where they apply), 'encoder' (the audio encoder's: the int8 GEMM also for Q4_K / Q6_K).");

    m.def("bench_matvec_chunks",
          [](const std::string & type, int64_t rows, int64_t k, int64_t chunk_rows, int threads, int repeats,
                        const std::string & path) {
              const auto mp = matmul_path(path);
              py::gil_scoped_release release;
              return fun_asr::bench_matvec_chunks(type, rows, k, chunk_rows, threads, repeats, mp);
          },
          py::arg("type"), py::arg("rows"), py::arg("k"), py::arg("chunk_rows"), py::kw_only(), py::arg("threads") = 0,
          py::arg("repeats") = 5, py::arg("path") = "decode",
          "Median ms of one column times a [rows, k] matrix computed as rows / chunk_rows separate products "
          "(a decode step's layer-by-layer weight stream); path 'ggml' or 'decode'.");
}

// Kernel tests: a product and a LayerNorm computed by the kernels.
void bind_kernel_evaluation(py::module_ & m) {
    m.def("eval_matmul",
          [](const std::string & type, py::array_t<float, py::array::c_style | py::array::forcecast> w,
                        py::array_t<float, py::array::c_style | py::array::forcecast> x, int threads,
                        const std::string & path) {
              if (w.ndim() != 2 || x.ndim() != 2 || w.shape(1) != x.shape(1)) {
                  throw std::invalid_argument("eval_matmul: w must be [n, k] and x [m, k] float32 arrays");
              }
              const auto mp = matmul_path(path);
              const int64_t n = w.shape(0), k = w.shape(1), m = x.shape(0);
              std::vector<float> y;
              {
                  py::gil_scoped_release release;
                  y = fun_asr::eval_matmul(type, w.data(), n, k, x.data(), m, threads, mp);
              }
              return to_numpy(std::move(y), {static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)});
          },
          py::arg("type"), py::arg("w"), py::arg("x"), py::kw_only(), py::arg("threads") = 1,
          py::arg("path") = "decode",
          "x [m, k] times w [n, k]^T with w quantized to `type`, on the CPU: y [m, n] (kernel tests); path as "
          "in bench_matmul.");

    m.def("eval_layer_norm",
          [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
             py::array_t<float, py::array::c_style | py::array::forcecast> w,
             py::array_t<float, py::array::c_style | py::array::forcecast> b, float eps, int threads, bool fused) {
              if (x.ndim() != 2 || w.ndim() != 1 || b.ndim() != 1 || w.shape(0) != x.shape(1) ||
                  b.shape(0) != x.shape(1)) {
                  throw std::invalid_argument("eval_layer_norm: x must be [T, n], w and b [n] float32 arrays");
              }
              const int64_t T = x.shape(0), n = x.shape(1);
              std::vector<float> y;
              {
                  py::gil_scoped_release release;
                  y = fun_asr::eval_layer_norm(x.data(), T, n, w.data(), b.data(), eps, threads, fused);
              }
              return to_numpy(std::move(y), {static_cast<py::ssize_t>(T), static_cast<py::ssize_t>(n)});
          },
          py::arg("x"), py::arg("w"), py::arg("b"), py::kw_only(), py::arg("eps") = 1e-5f, py::arg("threads") = 1,
          py::arg("fused") = true,
          "LayerNorm of x [T, n] times w plus b on the CPU: fun-asr's fused node, or (fused=False) ggml's "
          "ggml_norm, ggml_mul and ggml_add (kernel tests).");
}

// The memory read limit and the CPU kernels' instruction sets.
void bind_cpu_queries(py::module_ & m) {
    m.def("read_bandwidth",
          [](int64_t mb, int threads, int repeats) {
              py::gil_scoped_release release;
              return fun_asr::read_bandwidth(mb, threads, repeats);
          },
          py::arg("mb") = 512, py::kw_only(), py::arg("threads") = 1, py::arg("repeats") = 5,
          "Best bytes/s of reading `mb` MiB once with `threads` threads (benchmarks: the memory read limit).");

    m.def("amx_available", &fun_asr::amx_available,
          "Whether the encoder's Q8_0 products run on Intel AMX here (CPU + OS support; FUN_ASR_AMX=0 turns it off).");

    m.def("int8_gemm_isa", &fun_asr::int8_gemm_isa,
          "Instruction set of fun-asr's Q8_0 many-column GEMM (encoder, adaptor, prefill) where there is no AMX: "
          "'avx512vnni', 'avx2', or '' (none: ggml's GEMM; also with FUN_ASR_GEMM=0).");

    m.def("int8_gemm_vector_bits", &fun_asr::int8_gemm_vector_bits,
          "Vector width of that GEMM's Q8_0 tiles: 512 (AVX-512: 16 rows per instruction; FUN_ASR_ZMM=0 keeps "
          "256, the same bits), 256, or 0 (off).");

    m.def("matvec_isa", &fun_asr::matvec_isa,
          "Instruction set of fun-asr's decode mat-vec kernels (F32, F16, Q8_0, Q6_K, repacked Q4_K) on this CPU: "
          "'avx512vnni', 'avx2', or '' (none: ggml's mul_mat, one column at a time in decode steps; also with "
          "FUN_ASR_MATVEC=0).");
}

}  // namespace

void bind_bench(py::module_ & m) {
    bind_system_queries(m);
    bind_kernel_choices(m);
    bind_matmul_benchmarks(m);
    bind_kernel_evaluation(m);
    bind_cpu_queries(m);
}

}  // namespace fun_asr::bindings
