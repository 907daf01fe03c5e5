// FunASR's CTC head (docs/model.md, CTC head; FunASR 1.4.16 fun_asr_nano/model.py + llm_asr/adaptor.py Transformer):
// ctc_decoder = linear1 -> ReLU -> linear2 (downsample_rate 1), then pre-LN transformer blocks (no FSMN,
// FFN d -> d/4 -> d ReLU, LayerNorm eps 1e-12), over the *encoder* output; ctc.ctc_lo projects each
// frame to the CTC vocabulary. The log-softmax is taken on the CPU by the caller (Model::ctc_logprobs),
// stably in one pass per frame.
#include "graph/stages.h"

namespace fun_asr {

ggml_tensor * build_ctc(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * enc,
                        ggml_tensor * mask) {
    const auto & c = hp.ctc;
    ggml_tensor * x = linear(g.ctx, ggml_relu(g.ctx, linear(g.ctx, enc, w.ctc_proj1)), w.ctc_proj2);
    g.name(x, "ctc.proj.out");
    for (int64_t i = 0; i < c.n_layers; ++i) {
        x = sanm_layer(g, x, w.ctc[static_cast<size_t>(i)], c.n_heads, 0, c.eps, mask, "ctc.blk." + std::to_string(i));
    }
    g.name(x, "ctc.dec.out");
    x = linear(g.ctx, x, w.ctc_out);
    g.name(x, "ctc.logits");
    return x;
}

}  // namespace fun_asr
