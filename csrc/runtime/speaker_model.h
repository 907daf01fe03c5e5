// FunASR's CAM++ speaker-embedding network (funasr/models/campplus, FunASR 1.4.16) on the CPU backend:
// mean-normalized fbank windows in, one embedding per window out. Batch norms are folded at conversion
// (fun_asr/speakers/files.py); every number of the architecture comes from the "campplus.*" metadata.
// A batch of equal-length windows runs in one graph, in chunks whose graph memory stays under a budget.
// The frontend (Kaldi fbank minus its mean) is fun_asr/speakers/frontend.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "graph/common.h"
#include "model/loader.h"
#include "model/tensors.h"

namespace fun_asr {

struct SpeakerHParams {
    int64_t feat_dim = 0, emb = 0, growth = 0, bn_size = 0;
    int64_t tdnn_ch = 0, tdnn_k = 0, tdnn_stride = 0;
    int64_t fcm_ch = 0, fcm_k = 0, fcm_stride = 0;
    int64_t reduction = 0, seg_len = 0;
    std::vector<int64_t> fcm_blocks;                 // residual blocks per FCM group
    std::vector<int64_t> layers, kernels, dilations;  // per CAM dense block
    int64_t fcm_freq = 0;                              // frequency rows left by the FCM head

    int64_t bn_ch() const { return bn_size * growth; }
    int64_t bn_half() const { return bn_ch() / reduction; }
    int64_t block_in(size_t b) const;
    int64_t block_out(size_t b) const { return block_in(b) + layers[b] * growth; }
    int64_t final_ch() const { return block_out(layers.size() - 1) / 2; }
    int64_t frames_after_tdnn(int64_t T) const;
    int64_t min_frames() const;  // fewest input frames that leave >= 2 frames for the (unbiased) std
    // Value of a shape symbol of the tensor table (model_specs/campplus.json) in dense block b, layer i.
    int64_t symbol(const std::string & name, int64_t b, int64_t i) const;
};

SpeakerHParams parse_speaker_hparams(const Metadata & meta);

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

// One SpeakerModel may be shared by threads: embed() calls are serialized (one graph at a time).
class SpeakerModel {
public:
    SpeakerModel(const ModelSource & src, int threads);
    ~SpeakerModel();
    SpeakerModel(const SpeakerModel &) = delete;
    SpeakerModel & operator=(const SpeakerModel &) = delete;

    const SpeakerHParams & hparams() const { return hp_; }
    int threads() const { return threads_; }
    void set_threads(int threads);
    size_t memory_budget() const { return budget_; }
    void set_memory_budget(size_t bytes);
    const std::string & weight_type() const { return weight_type_; }  // f32 | f16 | mixed (conv/matrix tensors)

    // Windows per graph for windows of T frames, so that the graph's memory stays under the budget.
    int64_t batch_for(int64_t T);
    // feats row-major [n, T, feat_dim] (each window mean-normalized); returns row-major [n, emb].
    std::vector<float> embed(const float * feats, int64_t n, int64_t T);

private:
    ggml_cgraph * build(ggml_context * ctx, int64_t T, int64_t B, ggml_tensor ** feats, ggml_tensor ** rows,
                        ggml_tensor ** out) const;
    size_t graph_bytes(int64_t T, int64_t B);
    int64_t batch_for_locked(int64_t T);
    void load(const ModelSource & src, const std::vector<ExpectedTensor> & expected);
    void release();

    SpeakerHParams hp_;
    SpeakerWeights w_;
    ggml_context * wctx_ = nullptr;
    ggml_backend_buffer_t wbuf_ = nullptr;
    ggml_backend_t backend_ = nullptr;
    ggml_gallocr_t allocr_ = nullptr;
    std::vector<uint8_t> meta_;
    size_t graph_size_ = 0;
    size_t budget_ = size_t(256) << 20;
    std::map<int64_t, int64_t> batch_cache_;
    std::string weight_type_;
    int threads_ = 1;
    std::mutex mutex_;
};

}  // namespace fun_asr
