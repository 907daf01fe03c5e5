#include "runtime/backend.h"

#include "base/cpu_backend.h"
#include "base/switches.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cctype>
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


namespace {

std::string lower(std::string s) {
    for (char & c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

bool is_gpu(ggml_backend_dev_t d) {
    const auto t = ggml_backend_dev_type(d);
    return t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
}

// A GPU that is a CPU underneath: a software Vulkan driver (Mesa's llvmpipe, SwiftShader). ggml lists one only when
// GGML_VK_VISIBLE_DEVICES names it; "auto" never takes it (ggml's CPU backend is faster), a name does.
bool software_gpu(ggml_backend_dev_t d) {
    const std::string desc = lower(ggml_backend_dev_description(d));
    return desc.find("llvmpipe") != std::string::npos || desc.find("lavapipe") != std::string::npos ||
           desc.find("swiftshader") != std::string::npos;
}

// "vulkan:1" -> ("vulkan", 1); an index that is not one -> ("?", 0)
std::pair<std::string, size_t> split_device(const std::string & device) {
    const auto colon = device.find(':');
    if (colon == std::string::npos) return {device, 0};
    const std::string n = device.substr(colon + 1);
    const bool digits = !n.empty() && n.size() <= 6 &&
                        std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) return {"?", 0};
    return {device.substr(0, colon), std::stoul(n)};
}

std::string registered_backends() {
    std::string out;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        out += (out.empty() ? "" : ", ") + std::string(ggml_backend_reg_name(ggml_backend_reg_get(i)));
    }
    return out;
}

}  // namespace

ggml_backend_dev_t pick_device(const std::string & device) {
    cpu_backend::load_backends();
    // Every device ggml registered at run time, by kind: the CPU, the GPUs of any backend, and each backend's
    // own devices (by its registry's name, lower case: "cuda", "vulkan", "metal", ...).
    std::vector<ggml_backend_dev_t> gpus;
    ggml_backend_dev_t cpu = nullptr;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (is_gpu(d)) gpus.push_back(d);
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU && !cpu) cpu = d;
    }
    if (device == "cpu") return cpu;
    if (device == "auto") {
        for (ggml_backend_dev_t d : gpus) {
            if (!software_gpu(d)) return d;
        }
        return cpu;
    }
    const auto [kind, index] = split_device(device);
    std::vector<ggml_backend_dev_t> named;  // "gpu": every GPU; a backend's name: its GPUs
    bool known = kind == "gpu";
    for (ggml_backend_dev_t d : gpus) {
        const bool mine = lower(ggml_backend_reg_name(ggml_backend_dev_backend_reg(d))) == kind;
        if (kind == "gpu" || mine) named.push_back(d);
    }
    // ggml's GPU backends, registered in this build or not
    for (const char * b : {"cuda", "vulkan", "metal", "sycl", "opencl", "cann", "musa", "rocm", "hip"}) known |= kind == b;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        known |= kind != "cpu" && lower(ggml_backend_reg_name(ggml_backend_reg_get(i))) == kind;
    }
    if (!known) {
        throw std::invalid_argument("unknown device '" + device + "': accepted values are auto, cpu, gpu, gpu:N, and a "
                                    "GPU backend's name with an optional :N (cuda, cuda:N, vulkan, metal, ...; this "
                                    "build's backends: " + registered_backends() + ")");
    }
    if (named.empty()) {
        throw std::invalid_argument("device '" + device + "' requested but no GPU is available (this build's "
                                    "backends: " + registered_backends() + "); use the cpu or auto device");
    }
    if (index >= named.size()) {
        throw std::invalid_argument("device '" + device + "': only " + std::to_string(named.size()) + " GPU(s)" +
                                    (kind == "gpu" ? "" : " of that backend"));
    }
    return named[index];
}

std::string device_fallback(const std::string & device) {
    const auto & missing = cpu_backend::unavailable_backends();
    if (missing.empty() || device == "auto" || device == "cpu") return "";
    const std::string kind = split_device(device).first;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (is_gpu(d) && (kind == "gpu" || lower(ggml_backend_reg_name(ggml_backend_dev_backend_reg(d))) == kind)) {
            return "";  // a device of that kind exists: pick_device judges the index
        }
    }
    std::string why;
    for (const auto & [name, reason] : missing) {
        if (kind == "gpu" || name == kind) why += (why.empty() ? "" : "; ") + reason;
    }
    return why;
}

namespace {

// Whether ggml's ARGMAX over F32 rows runs on dev, and with it the chosen probability (chosen_probability:
// SOFT_MAX, then GET_ROWS at the ARGMAX). The backends answer by type; the probe's width is no model's.
constexpr int64_t kProbeWidth = 4096, kProbeRows = 8;

bool runs_argmax(ggml_backend_dev_t dev, bool with_probability) {
    return device_supports(dev, 8, [&](ggml_context * ctx) {
        ggml_tensor * logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kProbeWidth, kProbeRows);
        ggml_tensor * choice = ggml_argmax(ctx, logits);
        if (!with_probability) return std::vector<ggml_tensor *>{choice};
        ggml_tensor * chosen = chosen_probability(ctx, logits, choice);
        ggml_tensor * softmax = chosen->src[0]->src[0];  // (GET_ROWS reads the softmax through a reshape)
        return std::vector<ggml_tensor *>{choice, softmax, chosen};
    });
}

}  // namespace

DeviceCaps device_caps(ggml_backend_dev_t dev) {
    DeviceCaps caps;
    caps.host = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    // a GPU: ggml's CUDA flash attention rounds K/V to F16, cuBLAS accumulates F16 weights in F16 (both unknown
    // to be exact elsewhere): the matmul attention and F32 products there
    caps.exact_flash_attn = caps.host;
    caps.f32_products = !caps.host;
    // ggml can not say this one (CUDA's supports_op answers yes for every width, then aborts on most)
    caps.ssm_conv_any_width = caps.host;
    // A decode step's graph built once per batch shape: on the CPU with fun-asr's attention op (it reads the
    // sequences' lengths from an input); on other devices with ggml's attention over the whole cache under the
    // mask (the keys past a sequence's length at -inf), so that nothing in the graph depends on the lengths.
    caps.graph_reuse = true;
    // The greedy choice: fun-asr's argmax op on the CPU, ggml's ARGMAX where the device runs it (ggml says).
    caps.argmax_in_graph = caps.host || runs_argmax(dev, false);
    // The chosen token's log-probability beside it (token_logprobs): fun-asr's op on the CPU; elsewhere the
    // softmax's value at the argmax, read back with the choice (the logits stay on the device).
    caps.logprob_in_graph = caps.host || (caps.argmax_in_graph && runs_argmax(dev, true));
    caps.timed_threads = caps.host;  // a GPU's CPU fallback keeps every thread
    caps.packed_encoding = !caps.host;
    caps.norm_rope_chain = lower(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev))) != "vulkan";
    return caps;
}

std::vector<std::pair<std::string, bool>> caps_fields(const DeviceCaps & c) {
    return {{"host", c.host},
            {"exact_flash_attn", c.exact_flash_attn},
            {"f32_products", c.f32_products},
            {"ssm_conv_any_width", c.ssm_conv_any_width},
            {"graph_reuse", c.graph_reuse},
            {"argmax_in_graph", c.argmax_in_graph},
            {"logprob_in_graph", c.logprob_in_graph},
            {"timed_threads", c.timed_threads},
            {"packed_encoding", c.packed_encoding},
            {"norm_rope_chain", c.norm_rope_chain}};
}

SystemInfo system_info() {
    cpu_backend::load_backends();
    SystemInfo info;
    info.ggml_version = ggml_version();
    info.ggml_commit = ggml_commit();
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        info.registered_backends.emplace_back(ggml_backend_reg_name(reg));
        info.compiled_backends.emplace_back(ggml_backend_reg_name(reg));  // linked in: each registers itself
    }
    info.unavailable_backends = cpu_backend::unavailable_backends();
    info.cpu_features = cpu_backend::features();
    for (const switches::Switch & sw : switches::all()) info.switches.push_back({sw.name, switches::value(sw.name), sw.what});
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        DeviceInfo d;
        d.name = ggml_backend_dev_name(dev);
        d.description = ggml_backend_dev_description(dev);
        d.type = device_type_name(ggml_backend_dev_type(dev));
        ggml_backend_dev_memory(dev, &d.memory_free, &d.memory_total);
        d.caps = caps_fields(device_caps(dev));
        info.devices.push_back(std::move(d));
    }
    return info;
}


}  // namespace fun_asr
