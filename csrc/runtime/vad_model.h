// FunASR's FSMN-VAD network (DESIGN §6) on the CPU backend: CMVN'd LFR features in, per-frame
// class probabilities out, with the FSMN caches (the last lorder-1 projected frames of each layer)
// carried between calls so that a clip run in chunks gives the same probabilities as in one call.
// The decision logic (window detector, end-silence schedule) is fun_asr/vad.py.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "model/loader.h"

namespace fun_asr {

struct VadHParams {
    int64_t in_dim = 0, in_affine = 0, linear_dim = 0, proj_dim = 0, lorder = 0, out_affine = 0, out_dim = 0;
    int64_t n_layers = 0;
    int64_t symbol(const std::string & name) const;
    int64_t cache_floats() const { return n_layers * (lorder - 1) * proj_dim; }
};

VadHParams parse_vad_hparams(const Metadata & meta);

struct VadLayer {
    ggml_tensor * linear = nullptr;  // [proj, linear_dim] (ggml [linear_dim, proj])
    ggml_tensor * taps = nullptr;    // ggml [proj, lorder]: tap j's weights for every channel at row j
    ggml_tensor * affine_w = nullptr, * affine_b = nullptr;
};

struct VadWeights {
    ggml_tensor * shift = nullptr, * scale = nullptr;  // CMVN: (x + shift) * scale
    ggml_tensor * in1_w = nullptr, * in1_b = nullptr, * in2_w = nullptr, * in2_b = nullptr;
    std::vector<VadLayer> layers;
    ggml_tensor * out1_w = nullptr, * out1_b = nullptr, * out2_w = nullptr, * out2_b = nullptr;
};

// feats [in_dim, T] (LFR, before CMVN), caches: one [proj, lorder-1] per layer. Returns the softmax
// output [out_dim, T]; new_caches receives each layer's updated cache.
ggml_tensor * build_fsmn_vad(ggml_context * ctx, const VadHParams & hp, const VadWeights & w, ggml_tensor * feats,
                             const std::vector<ggml_tensor *> & caches, std::vector<ggml_tensor *> & new_caches);

class VadModel {
public:
    VadModel(const ModelSource & src, int threads);
    ~VadModel();
    VadModel(const VadModel &) = delete;
    VadModel & operator=(const VadModel &) = delete;

    const VadHParams & hparams() const { return hp_; }
    int threads() const { return threads_; }
    void set_threads(int threads);

    // feats row-major [T, in_dim]; cache row-major [n_layers, lorder-1, proj] (updated in place; zeros
    // = no history). Returns row-major [T, out_dim] probabilities, or only column `column` ([T]) when
    // column >= 0.
    std::vector<float> forward(const float * feats, int64_t T, float * cache, int64_t column);

private:
    VadHParams hp_;
    std::vector<int64_t> dims_;  // padded widths: input affine, linear, proj, output affine
    VadWeights w_;
    ggml_context * wctx_ = nullptr;
    ggml_backend_buffer_t wbuf_ = nullptr;
    ggml_backend_t backend_ = nullptr;
    ggml_gallocr_t allocr_ = nullptr;
    std::vector<uint8_t> meta_;
    int threads_ = 1;
    std::mutex mutex_;
};

}  // namespace fun_asr
