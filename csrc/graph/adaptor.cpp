// Adaptor (docs/model.md, Adaptor): linear -> ReLU -> linear, then pre-LN transformer layers (no FSMN).
#include "graph/stages.h"

namespace fun_asr {

ggml_tensor * build_adaptor(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * enc,
                            ggml_tensor * mask) {
    const auto & a = hp.adp;
    ggml_tensor * x = linear(g.ctx, ggml_relu(g.ctx, linear(g.ctx, enc, w.proj1)), w.proj2);
    g.name(x, "adp.proj.out");
    for (int64_t i = 0; i < a.n_layers; ++i) {
        x = sanm_layer(g, x, w.adp[static_cast<size_t>(i)], a.n_heads, 0, a.eps, mask, "adp.blk." + std::to_string(i));
    }
    g.name(x, "adp.out");
    return x;
}

}  // namespace fun_asr
