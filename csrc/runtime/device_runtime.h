// What every model runner shares (the recognizer's Model, the FSMN-VAD's VadModel, CAM++'s SpeakerModel): the
// device and what it offers, its backend and the CPU's beside it for the ops the device lacks, one scheduler over
// the two, the graph metadata buffer, the thread count and the interrupt flag. A runner adds its weights and graphs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "graph/common.h"

namespace fun_asr {

// Thrown by a computation that interrupt() stopped (the runner stays usable).
struct Interrupted : std::exception {
    const char * what() const noexcept override { return "interrupted"; }
};

class DeviceRuntime {
public:
    // device: as pick_device (runtime/backend.h) takes it; graph_size: the most nodes of one graph (the
    // scheduler's hash set and the metadata buffer are sized for it).
    DeviceRuntime(const std::string & device, size_t graph_size);
    virtual ~DeviceRuntime();
    DeviceRuntime(const DeviceRuntime &) = delete;
    DeviceRuntime & operator=(const DeviceRuntime &) = delete;

    const DeviceCaps & caps() const { return caps_; }
    std::string backend_name() const;
    std::string device_description() const;
    int threads() const { return threads_; }

    // From any thread: the computation running on this runner stops at its next graph node (CPU; other backends:
    // at their next graph) or decoding step and throws Interrupted; the runner stays usable. The request holds
    // (later computations stop at once) until clear_interrupt().
    void interrupt() { interrupt_.store(true, std::memory_order_relaxed); }
    void clear_interrupt() { interrupt_.store(false, std::memory_order_relaxed); }
    bool interrupt_requested() const { return interrupt_.load(std::memory_order_relaxed); }

protected:
    // threads >= 0 (0 = all cores); sets the CPU backend's count and returns it. std::invalid_argument below 0.
    int apply_threads(int threads);
    // A fresh scheduler state for the next graph, that graph allocated on the device (and the CPU for the ops the
    // device lacks; fun-asr's CPU ops pinned there, kernels/dispatch pinned_to_cpu; products in F32 where the
    // device asks, DeviceCaps::f32_products); std::runtime_error naming `what` when it does not fit.
    // On the CPU alone, a graph whose shape (ops, flags, their inputs' ops) differs from the last one's is planned
    // afresh: ggml's allocator otherwise keeps the last plan whenever the node counts match and the sizes fit,
    // whatever the output flags. (Beside another backend the scheduler's split rewrites the graph's inputs in
    // place, so it cannot be planned and split twice: there the graphs themselves keep equal flags where their
    // node counts match, as the encoder's output, an output in every encoder pass.)
    void sched_alloc(ggml_cgraph * gf, const char * what);
    // Computes an allocated graph; Interrupted when interrupt() stopped it (or was requested before), else
    // std::runtime_error "<what> computation failed" when it failed.
    void sched_compute(ggml_cgraph * gf, const char * what);
    // The compute buffer bytes a graph needs on the device (sized apart from the scheduler, which keeps its state).
    size_t graph_bytes(ggml_cgraph * gf) const;
    // Allocates every tensor of wctx_ on the device into wbuf_; std::runtime_error naming `what` when it fails.
    void place_weights(const char * what);

    ggml_backend_dev_t dev_ = nullptr;
    DeviceCaps caps_;
    ggml_backend_t backend_ = nullptr;      // the device's backend (CPU or GPU)
    ggml_backend_t cpu_backend_ = nullptr;  // == backend_ on the CPU; beside a GPU, for the ops it lacks
    ggml_backend_sched_t sched_ = nullptr;
    std::vector<uint8_t> graph_meta_;
    size_t graph_size_ = 0;
    uint64_t last_plan_ = 0;  // sched_alloc: the shape fingerprint of the graph its allocator last planned
    // A runner's weights where it keeps them itself (the VAD's, CAM++'s; the recognizer's are LoadedWeights):
    // freed here, also when the runner's constructor throws.
    ggml_context * wctx_ = nullptr;
    ggml_backend_buffer_t wbuf_ = nullptr;
    int threads_ = 1;

private:
    static bool abort_callback(void * user);
    std::atomic<bool> interrupt_{false};
};

}  // namespace fun_asr
