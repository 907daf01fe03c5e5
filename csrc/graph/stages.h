// One graph builder per stage (encoder_sanm.cpp, adaptor.cpp, decoder_qwen3.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/common.h"
#include "model/hparams.h"
#include "model/tensors.h"

namespace fun_asr {

// feats [input_size, T], pos_emb [input_size, T] -> encoder output [enc.d_model, T]
ggml_tensor * build_encoder(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * feats,
                            ggml_tensor * pos_emb, ggml_tensor * mask);

// Positions 1..T of the encoder's sinusoid table, row-major [T, input_size].
void sinusoid_positions(const HParams & hp, int64_t T, float * out);

// encoder output [enc.d_model, T] -> [adp.d_model, T]
ggml_tensor * build_adaptor(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * enc,
                            ggml_tensor * mask);

// Qwen3 decoder over n new positions x [d, n] starting at n_past; writes their K/V into the cache
// (k_cache/v_cache per layer, [head_dim, n_kv_heads, capacity]) and attends over n_past + n.
// Returns logits [vocab, 1] for the last position (or [vocab, n] when all_logits).
struct DecoderInputs {
    ggml_tensor * x;          // [d, n]
    ggml_tensor * positions;  // I32 [n]
    ggml_tensor * mask;       // F32 [n_past + n, n], 0 or -inf
    const std::vector<ggml_tensor *> * k_cache;
    const std::vector<ggml_tensor *> * v_cache;
    int64_t n_past;
    bool all_logits;
};
ggml_tensor * build_decoder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w,
                            const DecoderInputs & in);

}  // namespace fun_asr
