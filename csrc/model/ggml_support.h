// What the loader and the runtime both need of ggml: its log routed and its errors kept for our exceptions,
// transparent huge pages for the host buffers read whole and often, and whether a device runs an op.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ggml-backend.h"

namespace fun_asr {

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

// Whether `dev` runs every op that `build` makes (ggml_backend_dev_supports_op), built in a metadata-only context
// of `n_tensors` tensors: `build` returns the ops to ask about. std::runtime_error when the context cannot be made.
bool device_supports(ggml_backend_dev_t dev, size_t n_tensors,
                     const std::function<std::vector<ggml_tensor *>(ggml_context *)> & build);

}  // namespace fun_asr
