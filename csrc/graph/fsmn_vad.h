// FunASR's FSMN-VAD network as a ggml graph (docs/model.md, FSMN-VAD): its weights and the builder.
#pragma once

#include <vector>

#include "ggml.h"
#include "model/submodel_hparams.h"

namespace fun_asr {

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

}  // namespace fun_asr
