// FunASR's CAM++ speaker-embedding network as a ggml graph: its weights and the builder.
#pragma once

#include <vector>

#include "ggml.h"
#include "graph/common.h"
#include "model/submodel_hparams.h"

namespace fun_asr {

struct SpkConv {
    ggml_tensor * w = nullptr;
    ggml_tensor * b = nullptr;  // may be null
};

struct SpkFcmBlock {
    SpkConv conv1, conv2, shortcut;  // shortcut.w null: identity
    int stride = 1;                  // along frequency, for conv1 and the shortcut
};

struct SpkDenseLayer {
    ggml_tensor * bn_scale = nullptr, * bn_shift = nullptr;  // BN before the ReLU and linear1
    SpkConv linear1;                                         // 1x1 conv, its BN folded (bias)
    ggml_tensor * local = nullptr;                           // ggml [bn_ch, growth, k]: one matrix per tap
    SpkConv ctx1, ctx2;                                      // the CAM mask's two 1x1 convs
    int64_t dilation = 1;
};

struct SpkTransit {
    ggml_tensor * bn_scale = nullptr, * bn_shift = nullptr;
    SpkConv linear;  // bias only in the last transit (out_nonlinear's BN folded in)
};

struct SpeakerWeights {
    SpkConv stem;
    std::vector<SpkFcmBlock> fcm;
    SpkConv fcm_out, tdnn;
    std::vector<std::vector<SpkDenseLayer>> blocks;
    std::vector<SpkTransit> transit;
    SpkConv dense;
};

// feats ggml [1, T, feat_dim, B] (one channel, then time, then frequency); seg_rows: I32 [T' * B] (frame t of
// window b -> row t / seg_len + S * b of the per-segment masks), null when every window has a single segment
// (T' <= seg_len). Returns the embeddings [emb, B].
ggml_tensor * build_campplus(const GraphCtx & g, const SpeakerHParams & hp, const SpeakerWeights & w,
                             ggml_tensor * feats, ggml_tensor * seg_rows);

}  // namespace fun_asr
