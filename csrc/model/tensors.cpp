#include "model/tensors.h"

#include <cstdio>
#include <stdexcept>

namespace fun_asr {

namespace {

const TableEntry kTable[] = {
#include "fun_asr_tensor_table.inc"
};

std::string with_layer(const char * pattern, int64_t layer) {
    std::string s = pattern;
    const auto pos = s.find("{i}");
    if (pos != std::string::npos) s.replace(pos, 3, std::to_string(layer));
    return s;
}

void expand(std::vector<ExpectedTensor> & out, const HParams & hp, const std::string & group, int64_t layer) {
    for (const auto & e : kTable) {
        if (group != e.group) continue;
        ExpectedTensor t;
        t.name = with_layer(e.name, layer);
        t.kind = e.kind;
        for (int d = e.n_dims - 1; d >= 0; --d) t.ne.push_back(hp.symbol(e.shape[d], layer));
        out.push_back(std::move(t));
    }
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const HParams & hp) {
    std::vector<ExpectedTensor> out;
    for (int64_t i = 0; i < hp.enc.n_layers; ++i) {
        expand(out, hp, "encoder_layer", i);
        if (hp.enc.has_out_norm(i)) expand(out, hp, "encoder_norm_layer", i);
    }
    expand(out, hp, "adaptor", -1);
    for (int64_t i = 0; i < hp.adp.n_layers; ++i) expand(out, hp, "adaptor_layer", i);
    expand(out, hp, "decoder", -1);
    if (!hp.dec.tie_embeddings) expand(out, hp, "decoder_untied", -1);
    for (int64_t i = 0; i < hp.dec.n_layers; ++i) expand(out, hp, "decoder_layer", i);
    if (hp.ctc.present) {
        expand(out, hp, "ctc", -1);
        for (int64_t i = 0; i < hp.ctc.n_layers; ++i) expand(out, hp, "ctc_layer", i);
        expand(out, hp, "ctc_output", -1);
    }
    return out;
}

namespace {

ggml_tensor * need(ggml_context * ctx, const std::string & name) {
    ggml_tensor * t = ggml_get_tensor(ctx, name.c_str());
    if (t == nullptr) throw std::runtime_error("model has no tensor '" + name + "'");
    return t;
}


SanmLayer bind_sanm(ggml_context * ctx, const std::string & p, bool fsmn, bool out_norm) {
    SanmLayer l;
    l.attn_norm = {need(ctx, p + ".attn_norm.weight"), need(ctx, p + ".attn_norm.bias")};
    l.q = {need(ctx, p + ".attn_q.weight"), need(ctx, p + ".attn_q.bias")};
    l.k = {need(ctx, p + ".attn_k.weight"), need(ctx, p + ".attn_k.bias")};
    l.v = {need(ctx, p + ".attn_v.weight"), need(ctx, p + ".attn_v.bias")};
    l.o = {need(ctx, p + ".attn_output.weight"), need(ctx, p + ".attn_output.bias")};
    if (fsmn) l.fsmn = need(ctx, p + ".fsmn.weight");
    l.ffn_norm = {need(ctx, p + ".ffn_norm.weight"), need(ctx, p + ".ffn_norm.bias")};
    l.up = {need(ctx, p + ".ffn_up.weight"), need(ctx, p + ".ffn_up.bias")};
    l.down = {need(ctx, p + ".ffn_down.weight"), need(ctx, p + ".ffn_down.bias")};
    if (out_norm) l.out_norm = {need(ctx, p + ".out_norm.weight"), need(ctx, p + ".out_norm.bias")};
    return l;
}

}  // namespace

Weights bind_weights(ggml_context * ctx, const HParams & hp) {
    Weights w;
    for (int64_t i = 0; i < hp.enc.n_layers; ++i) {
        w.enc.push_back(bind_sanm(ctx, "enc.blk." + std::to_string(i), true, hp.enc.has_out_norm(i)));
    }
    w.proj1 = {need(ctx, "adp.proj1.weight"), need(ctx, "adp.proj1.bias")};
    w.proj2 = {need(ctx, "adp.proj2.weight"), need(ctx, "adp.proj2.bias")};
    for (int64_t i = 0; i < hp.adp.n_layers; ++i) {
        w.adp.push_back(bind_sanm(ctx, "adp.blk." + std::to_string(i), false, false));
    }
    w.tok_embd = need(ctx, "token_embd.weight");
    w.tok_lookup = w.tok_embd;
    w.output = hp.dec.tie_embeddings ? w.tok_embd : need(ctx, "output.weight");
    w.output_norm = need(ctx, "output_norm.weight");
    for (int64_t i = 0; i < hp.dec.n_layers; ++i) {
        const std::string p = "blk." + std::to_string(i);
        Qwen3Layer l;
        l.attn_norm = need(ctx, p + ".attn_norm.weight");
        l.q = need(ctx, p + ".attn_q.weight");
        l.k = need(ctx, p + ".attn_k.weight");
        l.v = need(ctx, p + ".attn_v.weight");
        l.o = need(ctx, p + ".attn_output.weight");
        l.q_norm = need(ctx, p + ".attn_q_norm.weight");
        l.k_norm = need(ctx, p + ".attn_k_norm.weight");
        l.ffn_norm = need(ctx, p + ".ffn_norm.weight");
        l.gate = need(ctx, p + ".ffn_gate.weight");
        l.up = need(ctx, p + ".ffn_up.weight");
        l.down = need(ctx, p + ".ffn_down.weight");
        w.dec.push_back(l);
    }
    if (hp.ctc.present) {
        w.ctc_proj1 = {need(ctx, "ctc.proj1.weight"), need(ctx, "ctc.proj1.bias")};
        w.ctc_proj2 = {need(ctx, "ctc.proj2.weight"), need(ctx, "ctc.proj2.bias")};
        for (int64_t i = 0; i < hp.ctc.n_layers; ++i) {
            w.ctc.push_back(bind_sanm(ctx, "ctc.blk." + std::to_string(i), false, false));
        }
        w.ctc_out = {need(ctx, "ctc.output.weight"), need(ctx, "ctc.output.bias")};
    }
    return w;
}

}  // namespace fun_asr
