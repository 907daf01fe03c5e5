// Hyperparameters of a Fun-ASR-Nano model, read from GGUF-style metadata (keys fun_asr_nano.*).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace fun_asr {

// Metadata as read from a GGUF file or handed over from Python for an HF directory.
using MetaValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;
using Metadata = std::map<std::string, MetaValue>;

struct EncoderHParams {
    int64_t input_size = 0, d_model = 0, n_heads = 0, ffn = 0, n_layers = 0, n_tp_layers = 0;
    int64_t fsmn_kernel = 0, max_positions = 0;
    float eps = 1e-5f;
    int64_t head_dim() const { return d_model / n_heads; }
    int64_t max_frames() const { return max_positions - 1; }  // positions start at 1
    bool has_out_norm(int64_t layer) const {
        return layer == n_layers - n_tp_layers - 1 || layer == n_layers - 1;
    }
};

struct AdaptorHParams {
    int64_t d_model = 0, proj = 0, n_heads = 0, ffn = 0, n_layers = 0;
    float eps = 1e-5f;
    int64_t head_dim() const { return d_model / n_heads; }
};

struct DecoderHParams {
    int64_t d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0;
    int64_t vocab = 0, max_positions = 0;
    float rms_eps = 1e-6f, rope_theta = 1e6f;
    bool tie_embeddings = true;
    std::vector<int64_t> eos_ids;
};

// FunASR's CTC head (ModelScope checkpoints only): linear -> ReLU -> linear, pre-LN transformer
// blocks over the encoder output, then the CTC output layer (log-softmax over vocab).
struct CtcHParams {
    bool present = false;
    std::string unavailable;  // why there is no CTC head (when !present)
    int64_t d_model = 0, proj = 0, n_heads = 0, ffn = 0, n_layers = 0, vocab = 0, blank_id = 0;
    float eps = 1e-12f;
    int64_t frame_ms = 60;
};

struct HParams {
    EncoderHParams enc;
    AdaptorHParams adp;
    DecoderHParams dec;
    CtcHParams ctc;

    // Value of a shape symbol of the tensor table (model_specs) for `layer` (-1: not in a layer).
    int64_t symbol(const std::string & name, int64_t layer) const;
};

// Plausibility bounds on what a model file declares (every dimension, every layer count): far above any real
// model, low enough that nothing sized from them can overflow or exhaust memory before the tensors are checked.
constexpr int64_t kMaxHParam = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;

// An integer metadata value in [minimum, kMaxHParam]; std::runtime_error naming the key otherwise.
int64_t get_int(const Metadata & m, const std::string & key, int64_t minimum = 1);

// Reads and validates; throws std::runtime_error naming the missing/invalid key.
HParams parse_hparams(const Metadata & meta, const std::string & arch);

}  // namespace fun_asr
