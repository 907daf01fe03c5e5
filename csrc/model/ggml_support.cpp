#include "model/ggml_support.h"

#include "base/switches.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ggml.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fun_asr {

namespace {

thread_local std::string g_last_error;  // ggml's last error text on this thread (see take_ggml_error)

void quiet_log(enum ggml_log_level level, const char * text, void * /*user*/) {
    // FUN_ASR_GGML_LOG: unset = silent (errors are kept for our exceptions), "warn" = warnings and
    // errors on stderr, "debug" = everything ggml says.
    static const int verbosity =
        switches::is("FUN_ASR_GGML_LOG", "debug") ? 2 : switches::is("FUN_ASR_GGML_LOG", "warn") ? 1 : 0;
    static thread_local enum ggml_log_level last = GGML_LOG_LEVEL_NONE;
    if (level == GGML_LOG_LEVEL_CONT) level = last;  // continuation of the previous message
    last = level;
    if (level == GGML_LOG_LEVEL_ERROR) {
        if (g_last_error.size() < 4096) g_last_error += text;
    }
    if (verbosity == 2 || (verbosity == 1 && (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR))) {
        std::fputs(text, stderr);
    }
}

}  // namespace

void install_ggml_logger() { ggml_log_set(quiet_log, nullptr); }

std::string take_ggml_error() {
    std::string out;
    out.swap(g_last_error);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    for (char & c : out) {
        if (c == '\n') c = ';';
    }
    return out;
}

void advise_huge_pages(ggml_backend_buffer_t buffer) {
#if defined(__linux__)
    if (!buffer || !ggml_backend_buffer_is_host(buffer)) return;
    if (switches::is("FUN_ASR_THP", "0")) return;
    const uintptr_t huge = uintptr_t(2) << 20;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ggml_backend_buffer_get_base(buffer));
    const uintptr_t begin = (base + huge - 1) / huge * huge;
    const uintptr_t end = (base + ggml_backend_buffer_get_size(buffer)) / huge * huge;
    if (end > begin) madvise(reinterpret_cast<void *>(begin), end - begin, MADV_HUGEPAGE);  // failure changes nothing
#else
    (void)buffer;
#endif
}

bool device_supports(ggml_backend_dev_t dev, size_t n_tensors,
                     const std::function<std::vector<ggml_tensor *>(ggml_context *)> & build) {
    ggml_init_params ip{ggml_tensor_overhead() * n_tensors, nullptr, /*no_alloc=*/true};
    ggml_context * ctx = ggml_init(ip);
    if (!ctx) throw std::runtime_error("ggml_init failed");
    bool ok = true;
    for (ggml_tensor * op : build(ctx)) ok = ok && ggml_backend_dev_supports_op(dev, op);
    ggml_free(ctx);
    return ok;
}

}  // namespace fun_asr
