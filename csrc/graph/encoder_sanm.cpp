// SenseVoice SAN-M encoder (docs/model.md, Encoder): feats * sqrt(d) + sinusoid positions from 1, then
// n_layers pre-LN SAN-M layers with the FSMN memory, final norms after layers L-n_tp-1 and L-1.
#include "graph/stages.h"

#include <cmath>

namespace fun_asr {

ggml_tensor * build_encoder(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * feats,
                            ggml_tensor * pos_emb, ggml_tensor * mask) {
    const auto & e = hp.enc;
    ggml_tensor * x = ggml_scale(g.ctx, feats, std::sqrt(static_cast<float>(e.d_model)));
    x = ggml_add(g.ctx, x, pos_emb);
    g.name(x, "enc.in");
    for (int64_t i = 0; i < e.n_layers; ++i) {
        x = sanm_layer(g, x, w.enc[static_cast<size_t>(i)], e.n_heads, e.fsmn_kernel, e.eps, mask,
                       "enc.blk." + std::to_string(i));
    }
    g.name(x, "enc.out");
    return x;
}

void sinusoid_positions(const HParams & hp, int64_t T, float * out) {
    // Same float32 recipe as FunASR / Transformers: inc = ln(10000) / (C/2 - 1), positions from 1,
    // [sin | cos] halves.
    const int64_t C = hp.enc.input_size, half = C / 2;
    const float inc = static_cast<float>(std::log(10000.0) / static_cast<double>(half - 1));
    for (int64_t t = 0; t < T; ++t) {
        const float pos = static_cast<float>(t + 1);
        for (int64_t j = 0; j < half; ++j) {
            const float arg = pos * std::exp(-inc * static_cast<float>(j));
            out[t * C + j] = std::sin(arg);
            out[t * C + half + j] = std::cos(arg);
        }
    }
}

}  // namespace fun_asr
