// What this build of ggml offers: version, compiled backends, devices, CPU features.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

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

// Routes ggml's log to stderr for warnings and errors only (ggml prints per-tensor debug lines,
// e.g. when repacking weights). FUN_ASR_GGML_LOG=debug keeps everything.
void install_ggml_logger();

}  // namespace fun_asr
