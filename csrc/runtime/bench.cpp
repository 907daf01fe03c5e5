#include "runtime/bench.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "base/cpu_backend.h"
#include "graph/common.h"
#include "kernels/fused_add.h"
#include "kernels/gemm_avx2.h"
#include "model/loader.h"
#include "runtime/quantize.h"

namespace fun_asr {

namespace {

// One product W [k, n] (quantized to `type`, placed like the model loader places weights) times
// X [k, m] f32 on a backend, through ggml_mul_mat or one of the graph's helpers (see MatmulPath).
class MatmulRun {
public:
    MatmulRun(const std::string & type_name, int64_t n, int64_t k, int64_t m, const std::string & device, int threads,
              MatmulPath path, const float * wf, const float * xf) {
        const ggml_type type = parse_tensor_type(type_name);
        if (n <= 0 || k <= 0 || m <= 0) throw std::invalid_argument("matmul: sizes must be > 0");
        if (k % ggml_blck_size(type) != 0) {
            throw std::invalid_argument("matmul: k must be a multiple of " + std::to_string(ggml_blck_size(type)) +
                                        " for " + type_name);
        }
        backend_ = device == "cpu" ? ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr)
                                   : ggml_backend_init_best();
        if (!backend_) throw std::runtime_error("matmul: no backend");
        if (cpu_backend::is_cpu(backend_)) {
            cpu_backend::api().set_n_threads(backend_,
                                           threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
        }
        // A decode-path product of m columns may take a few nodes per column (mul_mat_step on ggml's paths).
        const size_t nodes = static_cast<size_t>(16 + 2 * m);
        ggml_init_params ip{ggml_tensor_overhead() * nodes + ggml_graph_overhead_custom(nodes, false), nullptr, true};
        ctx_ = ggml_init(ip);
        w_ = ggml_new_tensor_2d(ctx_, type, k, n);
        x_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, k, m);
        // Same placement as the model loader: repackable weights go to the CPU's repack buffer type.
        ggml_backend_buffer_type_t rb = cpu_backend::is_cpu(backend_)
                                            ? repack_buft_for(ggml_backend_get_device(backend_), w_) : nullptr;
        if (rb) {
            wbuf_ = ggml_backend_buft_alloc_buffer(rb, ggml_backend_buft_get_alloc_size(rb, w_));
            ggml_tallocr ta = ggml_tallocr_new(wbuf_);
            ggml_tallocr_alloc(&ta, w_);
        }
        buf_ = ggml_backend_alloc_ctx_tensors(ctx_, backend_);  // x_ (and w_ when not repacked)
        std::vector<float> wr, xr;
        if (!wf || !xf) {
            std::mt19937 rng(1);
            std::normal_distribution<float> dist(0.0f, 1.0f);
            wr.resize(static_cast<size_t>(n * k));
            xr.resize(static_cast<size_t>(k * m));
            for (auto & v : wr) v = dist(rng);
            for (auto & v : xr) v = dist(rng);
            wf = wr.data();
            xf = xr.data();
        }
        std::vector<uint8_t> wq(quantized_size(type, n, k));
        quantize_rows(type, wf, wq.data(), n, k);
        // Q8_0 matrices in the int8 GEMM's quads layout where the loader keeps them so (kernels/gemm_avx2.h) on
        // the decode and prefill paths; the encoder path keeps them plain (what a matrix whose rows do not fill
        // the layout's groups takes, e.g. the CTC head's output: unpacked per product).
        const bool quads = !rb && cpu_backend::is_cpu(backend_) && (path == MatmulPath::decode || path == MatmulPath::frames) &&
                           q8_0_quads_wanted() && q8_0_quads_fits(w_);
        if (quads) {
            q8_0_quads_relayout(w_, wq.data(), w_->data);
            mark_q8_0_quads(w_);
        } else {
            ggml_backend_tensor_set(w_, wq.data(), 0, wq.size());
        }
        ggml_backend_tensor_set(x_, xf, 0, static_cast<size_t>(k * m) * sizeof(float));
        // Built after the weights have their buffer: the kernel choice looks at where they live.
        y_ = path == MatmulPath::frames    ? mul_mat_frames(ctx_, w_, x_)
             : path == MatmulPath::encoder ? mul_mat_frames(ctx_, w_, x_, nullptr, true)
             : path == MatmulPath::decode ? mul_mat_step(ctx_, w_, x_)
                                          : ggml_mul_mat(ctx_, w_, x_);
        gf_ = ggml_new_graph_custom(ctx_, nodes, false);
        ggml_build_forward_expand(gf_, y_);
        ybuf_ = ggml_backend_alloc_ctx_tensors(ctx_, backend_);
    }
    ~MatmulRun() {
        if (ybuf_) ggml_backend_buffer_free(ybuf_);
        if (buf_) ggml_backend_buffer_free(buf_);
        if (wbuf_) ggml_backend_buffer_free(wbuf_);
        if (ctx_) ggml_free(ctx_);
        if (backend_) ggml_backend_free(backend_);
    }
    MatmulRun(const MatmulRun &) = delete;
    MatmulRun & operator=(const MatmulRun &) = delete;

    double compute_ms() {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend_, gf_);
        ggml_backend_synchronize(backend_);
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    std::vector<float> result() const {
        std::vector<float> y(static_cast<size_t>(ggml_nelements(y_)));
        ggml_backend_tensor_get(y_, y.data(), 0, y.size() * sizeof(float));
        return y;
    }

private:
    ggml_backend_t backend_ = nullptr;
    ggml_context * ctx_ = nullptr;
    ggml_tensor * w_ = nullptr;
    ggml_tensor * x_ = nullptr;
    ggml_tensor * y_ = nullptr;
    ggml_cgraph * gf_ = nullptr;
    ggml_backend_buffer_t buf_ = nullptr, wbuf_ = nullptr, ybuf_ = nullptr;
};

}  // namespace

double read_bandwidth(int64_t mb, int threads, int repeats) {
    if (mb <= 0 || threads <= 0 || repeats <= 0) throw std::invalid_argument("read_bandwidth: arguments must be > 0");
    const size_t n = static_cast<size_t>(mb) * 1024 * 1024 / sizeof(uint64_t);
    std::vector<uint64_t> data(n, 1);
    std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8, 0);  // one cache line per thread
    double best = 0.0;
    for (int r = 0; r < repeats; ++r) {
        std::vector<std::thread> pool;
        const auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                const size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
                const size_t hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
                uint64_t a = 0, b = 0, c = 0, d = 0;
                size_t i = lo;
                for (; i + 4 <= hi; i += 4) {
                    // software prefetch 8 KiB ahead, as the decode kernels do (kernels/matvec_q8_0.inc)
#if defined(__GNUC__) || defined(__clang__)
                    if ((i & 7) == 0) __builtin_prefetch(data.data() + i + 1024, 0, 2);
#endif
                    a += data[i];
                    b += data[i + 1];
                    c += data[i + 2];
                    d += data[i + 3];
                }
                for (; i < hi; ++i) a += data[i];
                sums[static_cast<size_t>(t) * 8] = a + b + c + d;
            });
        }
        for (auto & th : pool) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s);
    }
    uint64_t total = 0;
    for (uint64_t v : sums) total += v;
    if (total != n) throw std::runtime_error("read_bandwidth: wrong sum");  // keeps the loads alive
    return best;
}

double bench_matvec_chunks(const std::string & type_name, int64_t rows, int64_t k, int64_t chunk_rows, int threads,
                           int repeats, MatmulPath path) {
    // One big matrix in plain layout (no repack), multiplied by one column chunk by chunk: a graph of
    // rows / chunk_rows products, like a decode step's sequence of layer matrices (weights from DRAM).
    const ggml_type type = parse_tensor_type(type_name);
    if (rows <= 0 || k <= 0 || chunk_rows <= 0 || rows % chunk_rows != 0 || repeats <= 0) {
        throw std::invalid_argument("bench_matvec_chunks: rows must be a positive multiple of chunk_rows");
    }
    ggml_backend_t backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    cpu_backend::api().set_n_threads(backend, threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
    const int64_t n_chunks = rows / chunk_rows;
    ggml_init_params ip{ggml_tensor_overhead() * static_cast<size_t>(4 * n_chunks + 8) + ggml_graph_overhead_custom(
                            static_cast<size_t>(4 * n_chunks + 8), false), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, type, k, rows);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    std::vector<float> row(static_cast<size_t>(k));
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const size_t rb = ggml_row_size(type, k);
    std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {  // row by row: no full float copy of a large matrix
        for (auto & v : row) v = dist(rng);
        quantize_rows(type, row.data(), q.data() + static_cast<size_t>(r) * rb, 1, k);
    }
    ggml_backend_tensor_set(w, q.data(), 0, q.size());
    for (auto & v : row) v = dist(rng);
    ggml_backend_tensor_set(x, row.data(), 0, row.size() * sizeof(float));
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, static_cast<size_t>(4 * n_chunks + 8), false);
    for (int64_t c = 0; c < n_chunks; ++c) {
        ggml_tensor * wc = ggml_view_2d(ctx, w, k, chunk_rows, rb, static_cast<size_t>(c * chunk_rows) * rb);
        ggml_build_forward_expand(gf, path == MatmulPath::ggml ? ggml_mul_mat(ctx, wc, x) : mul_mat_step(ctx, wc, x));
    }
    ggml_backend_buffer_t ybuf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    std::vector<double> ms;
    for (int r = 0; r <= repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(backend, gf);
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) ms.push_back(t);  // the first run is the warm-up
    }
    ggml_backend_buffer_free(ybuf);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

double bench_matmul(const std::string & type_name, int64_t n, int64_t k, int64_t m, const std::string & device,
                    int threads, int repeats, MatmulPath path) {
    if (repeats <= 0) throw std::invalid_argument("bench_matmul: repeats must be > 0");
    MatmulRun run(type_name, n, k, m, device, threads, path, nullptr, nullptr);
    run.compute_ms();  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) ms.push_back(run.compute_ms());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

std::vector<float> eval_matmul(const std::string & type, const float * w, int64_t n, int64_t k, const float * x,
                               int64_t m, int threads, MatmulPath path) {
    MatmulRun run(type, n, k, m, "cpu", threads, path, w, x);
    run.compute_ms();
    return run.result();
}

std::vector<float> eval_layer_norm(const float * x, int64_t T, int64_t n, const float * w, const float * b, float eps,
                                   int threads, bool fused) {
    if (T <= 0 || n <= 0) throw std::invalid_argument("layer_norm: sizes must be > 0");
    if (!(eps >= 0.0f)) throw std::invalid_argument("layer_norm: eps must be >= 0");
    ggml_init_params ip{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!ctx || !cpu) {
        if (cpu) ggml_backend_free(cpu);
        if (ctx) ggml_free(ctx);
        throw std::runtime_error("layer_norm: no CPU backend");
    }
    cpu_backend::api().set_n_threads(cpu, threads > 0 ? threads : 1);
    ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, T);
    ggml_tensor * wt = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    ggml_tensor * bt = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    ggml_tensor * y = fused ? layer_norm_scale_shift(ctx, xt, wt, bt, eps)
                            : ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, xt, eps), wt), bt);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    if (!buf) {
        ggml_backend_free(cpu);
        ggml_free(ctx);
        throw std::runtime_error("layer_norm: cannot allocate the tensors");
    }
    ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt));
    ggml_backend_tensor_set(wt, w, 0, ggml_nbytes(wt));
    ggml_backend_tensor_set(bt, b, 0, ggml_nbytes(bt));
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    const ggml_status st = ggml_backend_graph_compute(cpu, gf);
    std::vector<float> out(static_cast<size_t>(T * n));
    if (st == GGML_STATUS_SUCCESS) ggml_backend_tensor_get(y, out.data(), 0, ggml_nbytes(y));
    ggml_backend_buffer_free(buf);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    if (st != GGML_STATUS_SUCCESS) throw std::runtime_error("layer_norm: graph compute failed");
    return out;
}

}  // namespace fun_asr
