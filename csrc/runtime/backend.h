// What this build of ggml offers: version, compiled backends, devices, CPU features.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"

namespace fun_asr {

struct DeviceInfo {
    std::string name;
    std::string description;
    std::string type;  // "cpu", "gpu", "igpu", "accel"
    size_t memory_free = 0;
    size_t memory_total = 0;
};

struct SystemInfo {
    std::string ggml_version;
    std::string ggml_commit;
    std::vector<std::string> compiled_backends;  // fixed at build time: "CPU", "CUDA"
    std::vector<std::string> registered_backends;  // what ggml registered at run time
    std::vector<DeviceInfo> devices;
    std::vector<std::pair<std::string, std::string>> cpu_features;
};

SystemInfo system_info();

// The ggml device a device string names: "cpu", "auto" (the first GPU, else the CPU), "cuda" / "gpu" (the
// first GPU), "cuda:N" / "gpu:N". std::invalid_argument naming what is accepted for an unknown name, a GPU
// that this build or machine lacks, or an index past the GPUs.
ggml_backend_dev_t pick_device(const std::string & device);

// Routes ggml's log: silent by default (ggml's own error lines, e.g. "gguf_init_from_reader: failed
// to read magic", must not leak next to our exceptions; they are kept for take_ggml_error()).
// FUN_ASR_GGML_LOG=warn prints warnings and errors, =debug everything.
void install_ggml_logger();

// Asks the kernel for transparent huge pages (2 MiB) on the whole 2 MiB pages of a buffer of this process's
// memory, before its first write, so that its faults take them where the kernel's setting is "madvise" (the
// default of most distributions). Buffers read whole and often: the weights, the KV cache. A hint: a failure, a
// device buffer or FUN_ASR_THP=0 changes nothing.
void advise_huge_pages(ggml_backend_buffer_t buffer);

// ggml's error lines logged on this thread since the last call, joined with "; " (empty if none).
std::string take_ggml_error();

}  // namespace fun_asr
