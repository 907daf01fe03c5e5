// FunASR's CAM++ speaker-embedding network (funasr/models/campplus, FunASR 1.4.16) on a device
// (runtime/device_runtime; the CPU by default): mean-normalized fbank windows in, one embedding per window out. Batch norms are folded at conversion
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

#include "ggml-backend.h"
#include "ggml.h"
#include "graph/campplus.h"
#include "model/loader.h"
#include "model/tensors.h"
#include "runtime/device_runtime.h"

namespace fun_asr {

// One SpeakerModel may be shared by threads: embed() calls are serialized (one graph at a time).
class SpeakerModel : public DeviceRuntime {
public:
    SpeakerModel(const ModelSource & src, int threads, const std::string & device = "cpu");
    ~SpeakerModel() override;
    SpeakerModel(const SpeakerModel &) = delete;
    SpeakerModel & operator=(const SpeakerModel &) = delete;

    const SpeakerHParams & hparams() const { return hp_; }
    void set_threads(int threads) { apply_threads(threads); }
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
    // The weights from the source tensors the constructor checked (by name: the file's, or the package's "spk.*").
    void load(const ModelSource & src, const std::vector<ExpectedTensor> & expected,
              const std::map<std::string, const SourceTensor *> & by_name);

    SpeakerHParams hp_;
    SpeakerWeights w_;
    size_t budget_ = size_t(256) << 20;
    std::map<int64_t, int64_t> batch_cache_;
    std::string weight_type_;
    std::mutex mutex_;
};

}  // namespace fun_asr
