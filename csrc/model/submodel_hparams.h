// Hyperparameters of the sub-models a package can carry beside the recognizer, read from their metadata:
// FunASR's FSMN-VAD ("fsmn_vad.*") and CAM++ ("campplus.*"). Every number of their graphs comes from here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"

namespace fun_asr {

struct VadHParams {
    int64_t in_dim = 0, in_affine = 0, linear_dim = 0, proj_dim = 0, lorder = 0, out_affine = 0, out_dim = 0;
    int64_t n_layers = 0;
    int64_t symbol(const std::string & name) const;
    int64_t cache_floats() const { return n_layers * (lorder - 1) * proj_dim; }
};

VadHParams parse_vad_hparams(const Metadata & meta);

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

}  // namespace fun_asr
