#include "base/cpu_backend.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>

#ifdef FUN_ASR_BACKEND_MODULES
#include <dlfcn.h>
#endif

// ggml-cpu's row functions (vec.h; the CPU library and each CPU module export them)
extern "C" double ggml_vec_cvar_f32(int n, float * y, const float * x, float mean);
extern "C" void ggml_vec_swiglu_f32(int n, float * y, const float * x, const float * g);

namespace fun_asr::cpu_backend {

#ifndef FUN_ASR_BACKEND_MODULES

void load_backends() {}

const std::vector<std::pair<std::string, std::string>> & unavailable_backends() {
    static const std::vector<std::pair<std::string, std::string>> none;
    return none;
}

const Api & api() {
    static const Api table = [] {
        Api a;
        a.type_traits = ggml_get_type_traits_cpu;
        a.vec_cvar_f32 = ggml_vec_cvar_f32;
        a.vec_swiglu_f32 = ggml_vec_swiglu_f32;
        a.set_n_threads = ggml_backend_cpu_set_n_threads;
        a.set_abort_callback = ggml_backend_cpu_set_abort_callback;
        return a;
    }();
    return table;
}

#else

namespace {

// The folder of the library this code is in (the extension's): where the portable build puts ggml's modules.
std::string own_folder() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&own_folder), &info) == 0 || info.dli_fname == nullptr) return ".";
    const std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The file of the CPU module the registry holds: the one a function it hands out lives in (ggml tried every variant
// to score it; one it did not keep may still be mapped, so the process's loaded objects do not tell).
std::string cpu_module_path(ggml_backend_reg_t reg) {
    void * fn = ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    Dl_info info{};
    if (!fn || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
    return info.dli_fname;
}

}  // namespace

void load_backends() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_backend_load_all_from_path(own_folder().c_str()); });
}

const std::vector<std::pair<std::string, std::string>> & unavailable_backends() {
    static const std::vector<std::pair<std::string, std::string>> list = [] {
        load_backends();
        std::vector<std::pair<std::string, std::string>> out;
        std::error_code ec;
        std::vector<std::filesystem::path> modules;
        for (const auto & entry : std::filesystem::directory_iterator(own_folder(), ec)) modules.push_back(entry.path());
        std::sort(modules.begin(), modules.end());
        for (const auto & path : modules) {
            const std::string file = path.filename().string();
            const std::string prefix = "libggml-", suffix = ".so";
            if (file.size() <= prefix.size() + suffix.size() || file.rfind(prefix, 0) != 0 ||
                file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
                continue;
            }
            const std::string name = file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
            if (name == "base" || name.rfind("cpu", 0) == 0) continue;
            ggml_backend_reg_t reg = nullptr;
            for (size_t i = 0; i < ggml_backend_reg_count() && !reg; ++i) {
                std::string reg_name = ggml_backend_reg_name(ggml_backend_reg_get(i));
                for (char & c : reg_name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                if (reg_name == name) reg = ggml_backend_reg_get(i);
            }
            if (reg && ggml_backend_reg_dev_count(reg) > 0) continue;
            std::string why;
            if (!reg) {
                // ggml's loader says nothing on failure: dlopen it again for the loader's own words
                void * lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
                const char * err = lib ? nullptr : dlerror();
                why = err ? std::string(err) : file + " loaded but did not start (no driver, or its driver failed)";
                if (lib) dlclose(lib);
            } else {
                why = file + " loaded but found no device";
                if (name == "vulkan") {
                    why += " (no Vulkan driver for a GPU; ggml uses a software driver such as Mesa's llvmpipe only "
                           "when GGML_VK_VISIBLE_DEVICES names it)";
                }
            }
            out.emplace_back(name, why);
        }
        return out;
    }();
    return list;
}

const Api & api() {
    static const Api table = [] {
        load_backends();
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
        if (!reg) throw std::runtime_error("no CPU backend module could be loaded from " + own_folder());
        const std::string path = cpu_module_path(reg);
        void * lib = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
        auto symbol = [&](const char * name) {
            void * p = ggml_backend_reg_get_proc_address(reg, name);
            if (!p && lib) p = dlsym(lib, name);
            if (!p) throw std::runtime_error(std::string("the CPU backend module ") + path + " has no " + name);
            return p;
        };
        Api a;
        a.type_traits = reinterpret_cast<decltype(a.type_traits)>(symbol("ggml_get_type_traits_cpu"));
        a.vec_cvar_f32 = reinterpret_cast<decltype(a.vec_cvar_f32)>(symbol("ggml_vec_cvar_f32"));
        a.vec_swiglu_f32 = reinterpret_cast<decltype(a.vec_swiglu_f32)>(symbol("ggml_vec_swiglu_f32"));
        a.set_n_threads = reinterpret_cast<decltype(a.set_n_threads)>(symbol("ggml_backend_set_n_threads"));
        a.set_abort_callback = reinterpret_cast<decltype(a.set_abort_callback)>(symbol("ggml_backend_set_abort_callback"));
        return a;
    }();
    return table;
}

#endif

bool is_cpu(ggml_backend_t backend) {
    return backend && ggml_backend_dev_type(ggml_backend_get_device(backend)) == GGML_BACKEND_DEVICE_TYPE_CPU;
}

ggml_backend_t make(int threads) {
    load_backends();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_t b = dev ? ggml_backend_dev_init(dev, nullptr) : nullptr;
    if (!b) throw std::runtime_error("cannot start ggml's CPU backend");
    api().set_n_threads(b, threads);
    return b;
}

const std::vector<std::pair<std::string, std::string>> & features() {
    static const std::vector<std::pair<std::string, std::string>> list = [] {
        load_backends();
        std::vector<std::pair<std::string, std::string>> out;
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
        auto get = reg ? reinterpret_cast<ggml_backend_get_features_t>(
                             ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"))
                       : nullptr;
        if (get) {
            for (const ggml_backend_feature * f = get(reg); f->name != nullptr; ++f) out.emplace_back(f->name, f->value);
        }
        return out;
    }();
    return list;
}

bool built_with(const char * feature) {
    for (const auto & [name, value] : features()) {
        if (name == feature) return value != "0";
    }
    return false;
}

}  // namespace fun_asr::cpu_backend
