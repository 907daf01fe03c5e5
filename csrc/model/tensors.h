// The tensor table (generated from model_specs/<family>.json) expanded for a set of hyperparameters,
// and the weight structs the graph builders use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"
#include "model/hparams.h"

namespace fun_asr {

// One row of a generated tensor table (cmake/tensor_table.cmake): shape in torch order, symbols or numbers.
struct TableEntry {
    const char * group;
    const char * name;
    const char * kind;
    int n_dims;
    const char * shape[4];
};

struct ExpectedTensor {
    std::string name;         // GGUF name
    std::string kind;         // matrix | embedding | output | norm | bias | fsmn
    std::vector<int64_t> ne;  // ggml order (innermost first)
};

// Every tensor a model with these hyperparameters holds, in table order.
std::vector<ExpectedTensor> expected_tensors(const HParams & hp);

struct Linear {
    ggml_tensor * w = nullptr;
    ggml_tensor * b = nullptr;  // may be null (Qwen3 has no biases)
};

struct Norm {
    ggml_tensor * w = nullptr;
    ggml_tensor * b = nullptr;  // null for RMSNorm
};

// SAN-M encoder layer; the adaptor layers use the same struct without fsmn/out_norm.
struct SanmLayer {
    Norm attn_norm;                            // model.audio_tower.layers.{i}.input_layernorm
    Linear q, k, v, o;                         // self_attn.{q,k,v,o}_proj
    ggml_tensor * fsmn = nullptr;              // self_attn.fsmn.conv.weight [d, 1, K]
    Norm ffn_norm;                             // post_attention_layernorm
    Linear up, down;                           // mlp.fc1, mlp.fc2
    Norm out_norm;                             // final_layernorm (layers L-n_tp-1, L-1)
};

struct Qwen3Layer {
    ggml_tensor * attn_norm = nullptr;         // input_layernorm
    ggml_tensor * q = nullptr, * k = nullptr, * v = nullptr, * o = nullptr;
    ggml_tensor * q_norm = nullptr, * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;          // post_attention_layernorm
    ggml_tensor * gate = nullptr, * up = nullptr, * down = nullptr;
};

struct Weights {
    std::vector<SanmLayer> enc;
    Linear proj1, proj2;                       // model.multi_modal_projector.linear_{1,2}
    std::vector<SanmLayer> adp;
    ggml_tensor * tok_embd = nullptr;          // model.language_model.embed_tokens
    // where token ids are looked up (get_rows): tok_embd, or its host copy where the device cannot look rows of
    // its type up (load_weights)
    ggml_tensor * tok_lookup = nullptr;
    ggml_tensor * output = nullptr;            // lm_head (== tok_embd when tied)
    ggml_tensor * output_norm = nullptr;       // model.language_model.norm
    std::vector<Qwen3Layer> dec;
    // FunASR CTC head (only when hp.ctc.present): ctc_decoder.linear{1,2}, its blocks, ctc.ctc_lo.
    Linear ctc_proj1, ctc_proj2;
    std::vector<SanmLayer> ctc;
    Linear ctc_out;
};

// Binds the struct fields to the tensors of `ctx` by GGUF name; throws if one is missing.
Weights bind_weights(ggml_context * ctx, const HParams & hp);

}  // namespace fun_asr
