// FunASR's CTC head (DESIGN §7; FunASR 1.4.16 fun_asr_nano/model.py + llm_asr/adaptor.py Transformer):
// ctc_decoder = linear1 -> ReLU -> linear2 (downsample_rate 1), then pre-LN transformer blocks (no FSMN,
// FFN d -> d/4 -> d ReLU, LayerNorm eps 1e-12), over the *encoder* output; ctc.ctc_lo projects each
// frame to the CTC vocabulary. The log-softmax is taken on the CPU by the caller (Model::ctc_logprobs),
// stably in one pass per frame.
#include "graph/stages.h"

#include <algorithm>
#include <limits>

namespace fun_asr {

namespace {

void argmax_run(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const ggml_tensor * x = dst->src[0];
    const int64_t V = x->ne[0], T = x->ne[1], per = (T + nth - 1) / nth;
    const int64_t t0 = std::min(T, per * ith), t1 = std::min(T, t0 + per);
    for (int64_t t = t0; t < t1; ++t) {
        const float * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1]);
        float mx = row[0] == row[0] ? row[0] : -std::numeric_limits<float>::infinity();
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);  // NaN compares false: never taken
        int32_t best = 0;
        for (int64_t v = 0; v < V; ++v) {
            if (row[v] == mx) {
                best = static_cast<int32_t>(v);
                break;
            }
        }
        static_cast<int32_t *>(dst->data)[t] = best;
    }
}

}  // namespace

ggml_tensor * ctc_argmax(ggml_context * ctx, ggml_tensor * logits) {
    ggml_tensor * args[1] = {logits};
    return ggml_custom_4d(ctx, GGML_TYPE_I32, logits->ne[1], 1, 1, 1, args, 1, argmax_run, GGML_N_TASKS_MAX, nullptr);
}

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
