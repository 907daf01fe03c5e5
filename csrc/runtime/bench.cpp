#include "runtime/bench.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "model/loader.h"
#include "runtime/quantize.h"

namespace fun_asr {

double bench_matmul(const std::string & type_name, int64_t n, int64_t k, int64_t m, const std::string & device,
                    int threads, int repeats) {
    const ggml_type type = parse_tensor_type(type_name);
    if (n <= 0 || k <= 0 || m <= 0 || repeats <= 0) throw std::invalid_argument("bench_matmul: sizes must be > 0");
    ggml_backend_t backend = device == "cpu" ? ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr)
                                             : ggml_backend_init_best();
    if (!backend) throw std::runtime_error("bench_matmul: no backend");
    if (ggml_backend_is_cpu(backend)) {
        ggml_backend_cpu_set_n_threads(backend, threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
    }
    ggml_init_params ip{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type, k, n);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    // Same placement as the model loader: repackable weights go to the CPU's repack buffer type.
    ggml_backend_buffer_t wbuf = nullptr;
    ggml_backend_buffer_type_t rb = ggml_backend_is_cpu(backend) ? repack_buft_for(ggml_backend_get_device(backend), w)
                                                                  : nullptr;
    if (rb) {
        wbuf = ggml_backend_buft_alloc_buffer(rb, ggml_backend_buft_get_alloc_size(rb, w));
        ggml_tallocr ta = ggml_tallocr_new(wbuf);
        ggml_tallocr_alloc(&ta, w);
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);

    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(n * k)), xf(static_cast<size_t>(k * m));
    for (auto & v : wf) v = dist(rng);
    for (auto & v : xf) v = dist(rng);
    std::vector<uint8_t> wq(quantized_size(type, n, k));
    quantize_rows(type, wf.data(), wq.data(), n, k);
    ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
    ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));

    ggml_backend_graph_compute(backend, gf);  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, gf);
        ggml_backend_synchronize(backend);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ggml_backend_buffer_free(buf);
    if (wbuf) ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace fun_asr
