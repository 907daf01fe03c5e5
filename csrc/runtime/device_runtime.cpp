#include "runtime/device_runtime.h"

#include <algorithm>
#include <thread>

#include "ggml-alloc.h"
#include "ggml-cpu.h"
#include "base/cpu_backend.h"
#include "kernels/dispatch.h"
#include "runtime/backend.h"

namespace fun_asr {

DeviceRuntime::DeviceRuntime(const std::string & device, size_t graph_size) : graph_size_(graph_size) {
    dev_ = pick_device(device);
    caps_ = device_caps(dev_);
    backend_ = ggml_backend_dev_init(dev_, nullptr);
    if (!backend_) throw std::runtime_error(std::string("cannot initialise backend ") + ggml_backend_dev_name(dev_));
    std::vector<ggml_backend_t> backends{backend_};
    if (ggml_backend_dev_type(dev_) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        cpu_backend_ = backend_;
    } else {
        cpu_backend_ = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
        if (!cpu_backend_) {
            ggml_backend_free(backend_);
            throw std::runtime_error("cannot initialise the CPU backend");
        }
        backends.push_back(cpu_backend_);
    }
    cpu_backend::api().set_abort_callback(cpu_backend_, &DeviceRuntime::abort_callback, this);  // interrupt()
    sched_ = ggml_backend_sched_new(backends.data(), nullptr, static_cast<int>(backends.size()), graph_size_, false, true);
    if (!sched_) {
        if (cpu_backend_ != backend_) ggml_backend_free(cpu_backend_);
        ggml_backend_free(backend_);
        throw std::runtime_error("cannot create the ggml scheduler");
    }
    graph_meta_.resize(ggml_tensor_overhead() * graph_size_ + ggml_graph_overhead_custom(graph_size_, false));
}

DeviceRuntime::~DeviceRuntime() {
    if (wbuf_) ggml_backend_buffer_free(wbuf_);
    if (wctx_) ggml_free(wctx_);
    if (sched_) ggml_backend_sched_free(sched_);
    if (cpu_backend_ && cpu_backend_ != backend_) ggml_backend_free(cpu_backend_);
    if (backend_) ggml_backend_free(backend_);
}

bool DeviceRuntime::abort_callback(void * user) { return static_cast<DeviceRuntime *>(user)->interrupt_requested(); }

std::string DeviceRuntime::backend_name() const { return ggml_backend_name(backend_); }

std::string DeviceRuntime::device_description() const { return ggml_backend_dev_description(dev_); }

int DeviceRuntime::apply_threads(int threads) {
    if (threads < 0) throw std::invalid_argument("threads must be >= 0 (0 = all cores)");
    threads_ = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cpu_backend::api().set_n_threads(cpu_backend_, threads_);
    return threads_;
}

namespace {

// The graph's shape without its sizes: every node's op and flags and its inputs' (FNV-1a).
uint64_t graph_shape(ggml_cgraph * gf) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    mix(static_cast<uint64_t>(ggml_graph_n_nodes(gf)));
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        const ggml_tensor * node = ggml_graph_node(gf, i);
        mix(static_cast<uint64_t>(node->op) << 32 | static_cast<uint32_t>(node->flags));
        for (const ggml_tensor * src : node->src) {
            if (src) mix(static_cast<uint64_t>(src->op) << 32 | static_cast<uint32_t>(src->flags));
        }
    }
    return h;
}

}  // namespace

void DeviceRuntime::sched_alloc(ggml_cgraph * gf, const char * what) {
    ggml_backend_sched_reset(sched_);
    // fun-asr's CPU ops are custom ops; when their weight lives in ggml's CPU_REPACK buffer the scheduler asks
    // that buffer type, which only knows MUL_MAT, so the node is placed by hand.
    auto pin = [&] {
        for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
            ggml_tensor * node = ggml_graph_node(gf, i);
            if (pinned_to_cpu(node)) ggml_backend_sched_set_tensor_backend(sched_, node, cpu_backend_);
        }
    };
    if (caps_.f32_products) {  // products accumulate in F32 as on the CPU
        for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
            ggml_tensor * node = ggml_graph_node(gf, i);
            if (node->op == GGML_OP_MUL_MAT) ggml_mul_mat_set_prec(node, GGML_PREC_F32);
        }
    }
    pin();
    const uint64_t shape = graph_shape(gf);
    // (Only with one backend: splitting a graph over several points its nodes' inputs at copies in place, and
    // reserving would split it a second time.)
    if (shape != last_plan_ && backend_ == cpu_backend_) {
        last_plan_ = 0;  // until planned
        if (!ggml_backend_sched_reserve(sched_, gf)) throw std::runtime_error(std::string("cannot allocate ") + what);
        last_plan_ = shape;
        pin();  // (reserving reset the scheduler)
    }
    if (!ggml_backend_sched_alloc_graph(sched_, gf)) throw std::runtime_error(std::string("cannot allocate ") + what);
}

void DeviceRuntime::sched_compute(ggml_cgraph * gf, const char * what) {
    if (interrupt_requested()) throw Interrupted();
    const ggml_status status = ggml_backend_sched_graph_compute(sched_, gf);
    if (status == GGML_STATUS_ABORTED && interrupt_requested()) throw Interrupted();
    if (status != GGML_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + " computation failed");
}

size_t DeviceRuntime::graph_bytes(ggml_cgraph * gf) const {
    ggml_gallocr_t a = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
    if (!a) throw std::runtime_error("cannot create a graph allocator");
    const bool ok = ggml_gallocr_reserve(a, gf);
    const size_t bytes = ok ? ggml_gallocr_get_buffer_size(a, 0) : 0;
    ggml_gallocr_free(a);
    if (!ok) throw std::runtime_error("cannot size a graph");
    return bytes;
}

void DeviceRuntime::place_weights(const char * what) {
    wbuf_ = ggml_backend_alloc_ctx_tensors(wctx_, backend_);
    if (!wbuf_) throw std::runtime_error(std::string("cannot allocate ") + what + " on " + backend_name());
}

}  // namespace fun_asr
