#include "runtime/backend.h"

#include "base/switches.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fun_asr {

namespace {

const char * device_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "unknown";
    }
}

}  // namespace


ggml_backend_dev_t pick_device(const std::string & device) {
    std::vector<ggml_backend_dev_t> gpus;
    ggml_backend_dev_t cpu = nullptr;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        const auto t = ggml_backend_dev_type(d);
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) gpus.push_back(d);
        if (t == GGML_BACKEND_DEVICE_TYPE_CPU && !cpu) cpu = d;
    }
    if (device == "cpu") return cpu;
    if (device == "auto") return gpus.empty() ? cpu : gpus[0];
    std::string kind = device;
    size_t index = 0;
    const auto colon = device.find(':');
    if (colon != std::string::npos) {
        kind = device.substr(0, colon);
        try {
            index = std::stoul(device.substr(colon + 1));
        } catch (const std::exception &) {
            kind = "?";
        }
    }
    if (kind == "cuda" || kind == "gpu") {
        if (gpus.empty()) {
            std::string backends;
            for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
                backends += (backends.empty() ? "" : ", ") + std::string(ggml_backend_reg_name(ggml_backend_reg_get(i)));
            }
            throw std::invalid_argument("device '" + device + "' requested but no GPU is available (this build's "
                                        "backends: " + backends + "); use the cpu or auto device");
        }
        if (index >= gpus.size()) {
            throw std::invalid_argument("device '" + device + "': only " + std::to_string(gpus.size()) + " GPU(s)");
        }
        return gpus[index];
    }
    throw std::invalid_argument("unknown device '" + device + "': accepted values are auto, cpu, cuda, cuda:N");
}

DeviceCaps device_caps(ggml_backend_dev_t dev) {
    DeviceCaps caps;
    caps.host = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    // a GPU: ggml's CUDA flash attention rounds K/V to F16, cuBLAS accumulates F16 weights in F16 (both unknown
    // to be exact elsewhere): the matmul attention and F32 products there
    caps.exact_flash_attn = caps.host;
    caps.f32_products = !caps.host;
    return caps;
}

SystemInfo system_info() {
    SystemInfo info;
    info.ggml_version = ggml_version();
    info.ggml_commit = ggml_commit();
    info.compiled_backends.emplace_back("CPU");
#ifdef FUN_ASR_WITH_CUDA
    info.compiled_backends.emplace_back("CUDA");
#endif
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        info.registered_backends.emplace_back(ggml_backend_reg_name(reg));
        if (std::string(ggml_backend_reg_name(reg)) == "CPU") {
            auto get_features = reinterpret_cast<ggml_backend_get_features_t>(
                ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
            if (get_features != nullptr) {
                for (const ggml_backend_feature * f = get_features(reg); f->name != nullptr; ++f) {
                    info.cpu_features.emplace_back(f->name, f->value);
                }
            }
        }
    }
    for (const switches::Switch & sw : switches::all()) info.switches.push_back({sw.name, switches::value(sw.name), sw.what});
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        DeviceInfo d;
        d.name = ggml_backend_dev_name(dev);
        d.description = ggml_backend_dev_description(dev);
        d.type = device_type_name(ggml_backend_dev_type(dev));
        ggml_backend_dev_memory(dev, &d.memory_free, &d.memory_total);
        info.devices.push_back(std::move(d));
    }
    return info;
}


}  // namespace fun_asr
