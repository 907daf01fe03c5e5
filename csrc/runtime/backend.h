// What this build of ggml offers: version, compiled backends, devices, CPU features.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "graph/common.h"
#include "model/ggml_support.h"

namespace fun_asr {

struct DeviceInfo {
    std::string name;
    std::string description;
    std::string type;  // "cpu", "gpu", "igpu", "accel"
    size_t memory_free = 0;
    size_t memory_total = 0;
    std::vector<std::pair<std::string, bool>> caps;  // device_caps(dev), field by field
};

struct SystemInfo {
    std::string ggml_version;
    std::string ggml_commit;
    std::vector<std::string> compiled_backends;  // the backends linked into this build ("CPU", "CUDA", ...):
                                                 // each registers itself when ggml starts
    std::vector<std::string> registered_backends;  // what ggml registered at run time
    // the GPU modules shipped with a portable build that give no device here, each with why (cpu_backend.h)
    std::vector<std::pair<std::string, std::string>> unavailable_backends;
    std::vector<DeviceInfo> devices;
    std::vector<std::pair<std::string, std::string>> cpu_features;
    // every FUN_ASR_* environment switch (base/switches.h): name, value as read ("" unset), what it does
    struct Switch { std::string name, value, what; };
    std::vector<Switch> switches;
};

SystemInfo system_info();

// The ggml device a device string names, over every device ggml registered at run time: "cpu", "auto" (the
// first GPU that is not a software driver, else the CPU), "gpu" / "gpu:N" (the Nth GPU of any backend), a GPU
// backend's registry name in lower case with an optional index ("cuda", "cuda:1", "vulkan", "metal": that backend's Nth GPU).
// std::invalid_argument naming what is accepted for an unknown name, a GPU that this build or machine lacks,
// or an index past the GPUs.
ggml_backend_dev_t pick_device(const std::string & device);

// Why `device` ("vulkan", "cuda:1", "gpu") has no device here although this build ships its backend as a module:
// the module did not load (the loader's message) or found no device; "" when it has one, or when the build does
// not ship that backend at all (pick_device's error says so). The Python layer runs on the CPU then, saying why.
std::string device_fallback(const std::string & device);

// What `dev` offers the graphs that run on it (graph/common.h DeviceCaps): the one place that says how a backend
// differs from the CPU.
DeviceCaps device_caps(ggml_backend_dev_t dev);
// Each field of a DeviceCaps by name, in declaration order (system_info()'s devices list them).
std::vector<std::pair<std::string, bool>> caps_fields(const DeviceCaps & caps);

}  // namespace fun_asr
