#include "model/hparams.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace fun_asr {

namespace {

const MetaValue & get(const Metadata & m, const std::string & key) {
    auto it = m.find(key);
    if (it == m.end()) throw std::runtime_error("model metadata has no key '" + key + "'");
    return it->second;
}

}  // namespace

int64_t get_int(const Metadata & m, const std::string & key, int64_t minimum) {
    const MetaValue & v = get(m, key);
    if (!std::holds_alternative<int64_t>(v)) {
        throw std::runtime_error("model metadata key '" + key + "' must be an integer");
    }
    const int64_t x = std::get<int64_t>(v);
    if (x > kMaxHParam) {
        throw std::runtime_error("model metadata key '" + key + "' = " + std::to_string(x) +
                                 " is implausibly large (at most " + std::to_string(kMaxHParam) + ")");
    }
    if (x < minimum) {
        throw std::runtime_error("model metadata key '" + key + "' = " + std::to_string(x) +
                                 " must be >= " + std::to_string(minimum));
    }
    return x;
}

namespace {

float get_float(const Metadata & m, const std::string & key) {
    const MetaValue & v = get(m, key);
    double x;
    if (std::holds_alternative<double>(v)) {
        x = std::get<double>(v);
    } else if (std::holds_alternative<int64_t>(v)) {
        x = static_cast<double>(std::get<int64_t>(v));
    } else {
        throw std::runtime_error("model metadata key '" + key + "' must be a number");
    }
    if (!(x > 0) || !(x <= std::numeric_limits<float>::max())) {  // also NaN and infinities
        throw std::runtime_error("model metadata key '" + key + "' must be a finite number > 0");
    }
    return static_cast<float>(x);
}

}  // namespace

int64_t HParams::symbol(const std::string & name, int64_t layer) const {
    if (name == "enc_in") return layer == 0 ? enc.input_size : enc.d_model;
    if (name == "enc_d") return enc.d_model;
    if (name == "enc_ffn") return enc.ffn;
    if (name == "enc_fsmn_k") return enc.fsmn_kernel;
    if (name == "adp_d") return adp.d_model;
    if (name == "adp_proj") return adp.proj;
    if (name == "adp_ffn") return adp.ffn;
    if (name == "dec_d") return dec.d_model;
    if (name == "dec_q") return dec.n_heads * dec.head_dim;
    if (name == "dec_kv") return dec.n_kv_heads * dec.head_dim;
    if (name == "dec_head") return dec.head_dim;
    if (name == "dec_ffn") return dec.ffn;
    if (name == "dec_vocab") return dec.vocab;
    if (name == "ctc_d") return ctc.d_model;
    if (name == "ctc_proj") return ctc.proj;
    if (name == "ctc_ffn") return ctc.ffn;
    if (name == "ctc_vocab") return ctc.vocab;
    // plain numbers in the table
    size_t pos = 0;
    const long long v = std::stoll(name, &pos);
    if (pos != name.size()) throw std::runtime_error("tensor table: unknown shape symbol '" + name + "'");
    return v;
}

HParams parse_hparams(const Metadata & m, const std::string & arch) {
    const std::string k = arch + ".";
    HParams hp;
    auto & e = hp.enc;
    e.input_size = get_int(m, k + "encoder.input_size");
    e.d_model = get_int(m, k + "encoder.embedding_length");
    e.n_heads = get_int(m, k + "encoder.attention.head_count");
    e.ffn = get_int(m, k + "encoder.feed_forward_length");
    e.n_layers = get_int(m, k + "encoder.block_count");
    e.n_tp_layers = get_int(m, k + "encoder.tp_block_count", 0);
    e.fsmn_kernel = get_int(m, k + "encoder.fsmn_kernel_size");
    e.max_positions = get_int(m, k + "encoder.context_length", 2);
    e.eps = get_float(m, k + "encoder.attention.layer_norm_epsilon");
    auto & a = hp.adp;
    a.d_model = get_int(m, k + "adaptor.embedding_length");
    a.proj = get_int(m, k + "adaptor.projector_length");
    a.n_heads = get_int(m, k + "adaptor.attention.head_count");
    a.ffn = get_int(m, k + "adaptor.feed_forward_length");
    a.n_layers = get_int(m, k + "adaptor.block_count", 0);
    a.eps = get_float(m, k + "adaptor.attention.layer_norm_epsilon");
    auto & d = hp.dec;
    d.d_model = get_int(m, k + "decoder.embedding_length");
    d.n_layers = get_int(m, k + "decoder.block_count");
    d.n_heads = get_int(m, k + "decoder.attention.head_count");
    d.n_kv_heads = get_int(m, k + "decoder.attention.head_count_kv");
    d.head_dim = get_int(m, k + "decoder.attention.key_length");
    d.ffn = get_int(m, k + "decoder.feed_forward_length");
    d.vocab = get_int(m, k + "decoder.vocab_size");
    d.max_positions = get_int(m, k + "decoder.context_length");
    d.rms_eps = get_float(m, k + "decoder.attention.layer_norm_rms_epsilon");
    d.rope_theta = get_float(m, k + "decoder.rope.freq_base");
    const MetaValue & tie = get(m, k + "decoder.tie_word_embeddings");
    if (!std::holds_alternative<bool>(tie)) throw std::runtime_error("decoder.tie_word_embeddings must be a bool");
    d.tie_embeddings = std::get<bool>(tie);
    const MetaValue & eos = get(m, k + "decoder.eos_token_ids");
    if (!std::holds_alternative<std::vector<int64_t>>(eos)) {
        throw std::runtime_error("decoder.eos_token_ids must be an integer array");
    }
    d.eos_ids = std::get<std::vector<int64_t>>(eos);

    // The CTC head is optional: present when the metadata describes it (the converter stores it only
    // when every CTC tensor is there), otherwise `unavailable` says why.
    auto & c = hp.ctc;
    if (m.count(k + "ctc.block_count")) {
        c.present = true;
        c.d_model = get_int(m, k + "ctc.embedding_length");
        c.proj = get_int(m, k + "ctc.projector_length");
        c.n_heads = get_int(m, k + "ctc.attention.head_count");
        c.ffn = get_int(m, k + "ctc.feed_forward_length");
        c.n_layers = get_int(m, k + "ctc.block_count", 0);
        c.vocab = get_int(m, k + "ctc.vocab_size");
        c.blank_id = get_int(m, k + "ctc.blank_id", 0);
        c.eps = get_float(m, k + "ctc.attention.layer_norm_epsilon");
        if (m.count(k + "ctc.frame_ms")) c.frame_ms = get_int(m, k + "ctc.frame_ms");
    } else {
        auto it = m.find(k + "ctc.unavailable");
        c.unavailable = it != m.end() && std::holds_alternative<std::string>(it->second)
                            ? std::get<std::string>(it->second)
                            : "the model has no CTC head (converted without one)";
    }

    std::string problem;
    // layer counts bound the tensor table that is built before any tensor is checked
    const int64_t most_layers = std::max({e.n_layers, a.n_layers, d.n_layers, c.n_layers});
    if (most_layers > kMaxLayers) {
        problem = "a block_count of " + std::to_string(most_layers) + " is implausible (at most " +
                  std::to_string(kMaxLayers) + ")";
    } else if (c.present && c.d_model % c.n_heads) problem = "ctc embedding_length not divisible by head_count";
    else if (c.present && c.blank_id >= c.vocab) problem = "ctc blank_id outside the CTC vocabulary";
    else if (e.d_model % e.n_heads) problem = "encoder embedding_length not divisible by head_count";
    else if (e.n_tp_layers >= e.n_layers) problem = "encoder tp_block_count must be < block_count";
    else if (e.fsmn_kernel % 2 == 0) problem = "encoder fsmn_kernel_size must be odd";
    else if (e.input_size % 2) problem = "encoder input_size must be even";
    else if (a.d_model % a.n_heads) problem = "adaptor embedding_length not divisible by head_count";
    else if (a.d_model != d.d_model) problem = "adaptor embedding_length != decoder embedding_length";
    else if (d.n_heads % d.n_kv_heads) problem = "decoder head_count not a multiple of head_count_kv";
    else if (d.head_dim % 2) problem = "decoder key_length must be even";
    for (int64_t id : d.eos_ids) {
        if (id < 0 || id >= d.vocab) problem = "decoder eos_token_ids outside the vocabulary";
    }
    if (!problem.empty()) throw std::runtime_error("invalid model hyperparameters: " + problem);
    return hp;
}

}  // namespace fun_asr
