// Model sources (a GGUF file, or tensors handed over from Python for an HF directory) and the
// loader that validates them against the tensor table and places them in a backend buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "model/hparams.h"
#include "model/tensors.h"

namespace fun_asr {

struct SourceTensor {
    std::string name;
    ggml_type type = GGML_TYPE_F32;
    std::vector<int64_t> ne;  // ggml order
    const void * data = nullptr;
    size_t nbytes = 0;
};

// A read-only memory map of a file (POSIX mmap; a plain read on other systems).
class MappedFile {
public:
    explicit MappedFile(const std::string & path);
    ~MappedFile();
    MappedFile(const MappedFile &) = delete;
    MappedFile & operator=(const MappedFile &) = delete;
    const uint8_t * data() const { return data_; }
    size_t size() const { return size_; }
    // Drops the whole pages inside [p, p + n) from memory (they are read again from the file if
    // touched); used for weights that were copied elsewhere (repacked).
    void release(const void * p, size_t n) const;

private:
    uint8_t * data_ = nullptr;
    size_t size_ = 0;
    std::vector<uint8_t> fallback_;
};

struct ModelSource {
    std::string arch;
    Metadata meta;
    std::vector<SourceTensor> tensors;
    std::shared_ptr<MappedFile> file;  // set for GGUF sources; tensors point into it
    std::string origin;                // path, for messages
};

// Parses a GGUF file (metadata + tensor index) and maps its data. Throws std::runtime_error on a
// missing, corrupt or truncated file.
ModelSource read_gguf(const std::string & path);

// The loaded weights: a ggml context with one tensor per table entry, and the buffer holding them.
struct LoadedWeights {
    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t buffer = nullptr;        // the mapped file, or the device buffer
    ggml_backend_buffer_t repack_buffer = nullptr;  // CPU: weights re-laid out for faster GEMM (Q4_K ...)
    size_t repacked = 0;                            // how many tensors live in repack_buffer
    ggml_backend_buffer_t quads_buffer = nullptr;   // CPU: matrices in a CPU kernel's own layout (WeightRelayout)
    size_t quads = 0;                               // how many tensors live in quads_buffer
    ggml_backend_buffer_t lookup_buffer = nullptr;  // a GPU that cannot get_rows the token embedding: its host copy
    ggml_backend_buffer_t host_buffer = nullptr;    // a GPU: the matrices it cannot multiply (too large to bind)
    std::vector<ggml_tensor *> host_weights;        // those matrices (their products run on the CPU)
    bool host_token_lookup = false;                 // a GPU: token lookups read host memory (either of the above)
    std::shared_ptr<MappedFile> file;  // kept alive when the buffer maps it
    Weights w;
    size_t bytes = 0;
    bool mmapped = false;
    LoadedWeights() = default;
    LoadedWeights(const LoadedWeights &) = delete;
    LoadedWeights & operator=(const LoadedWeights &) = delete;
    ~LoadedWeights();
};

// The CPU's extra buffer type (ggml "repack") that accelerates matmuls with weight `w`, or null.
ggml_backend_buffer_type_t repack_buft_for(ggml_backend_dev_t dev, const ggml_tensor * w);

// A CPU kernel's own layout for some of the recognizer's matrices, applied once at load instead of once per
// product (the runtime gives it: the int8 GEMM's Q8_0 quads, kernels/gemm_avx2.h). `fits`: whether a matrix
// takes it; `apply`: the tensor's data (allocated) from the checkpoint's bytes, the tensor marked as laid out.
struct WeightRelayout {
    std::function<bool(const ggml_tensor *)> fits;
    std::function<void(ggml_tensor *, const void *)> apply;
};

// Checks every table entry (present, shape, allowed type), rejects unknown tensors, and places the
// data in `dev`'s memory (mapped without a copy on the CPU when possible). On the CPU, the recognizer's
// matrices that `relayout` (may be null) fits are copied into its layout.
std::unique_ptr<LoadedWeights> load_weights(const ModelSource & src, const HParams & hp, ggml_backend_dev_t dev,
                                            const WeightRelayout * relayout = nullptr);

}  // namespace fun_asr
