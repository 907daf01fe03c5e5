// FunASR's FSMN-VAD network (docs/model.md, FSMN-VAD) on a device (runtime/device_runtime; the CPU by
// default): CMVN'd LFR features in, per-frame class probabilities out, with the FSMN caches (the last
// lorder-1 projected frames of each layer) carried between calls so that a clip run in chunks gives the
// same probabilities as in one call. The decision logic (window detector, end-silence schedule) is
// python/fun_asr/vad/detector.py.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "graph/fsmn_vad.h"
#include "model/loader.h"
#include "runtime/device_runtime.h"

namespace fun_asr {

class VadModel : public DeviceRuntime {
public:
    VadModel(const ModelSource & src, int threads, const std::string & device = "cpu");
    ~VadModel() override;
    VadModel(const VadModel &) = delete;
    VadModel & operator=(const VadModel &) = delete;

    const VadHParams & hparams() const { return hp_; }
    void set_threads(int threads) { apply_threads(threads); }

    // feats row-major [T, in_dim]; cache row-major [n_layers, lorder-1, proj] (updated in place; zeros
    // = no history). Returns row-major [T, out_dim] probabilities, or only column `column` ([T]) when
    // column >= 0.
    std::vector<float> forward(const float * feats, int64_t T, float * cache, int64_t column);

private:
    VadHParams hp_;
    std::vector<int64_t> dims_;  // padded widths: input affine, linear, proj, output affine
    VadWeights w_;
    std::mutex mutex_;
};

}  // namespace fun_asr
