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

// CTC head over the encoder output [enc.d_model, T] -> logits [ctc.vocab, T] (FunASR ctc_decoder + ctc_lo).
ggml_tensor * build_ctc(const GraphCtx & g, const HParams & hp, const Weights & w, ggml_tensor * enc,
                        ggml_tensor * mask);

// Qwen3 decoder over n new positions of each of B sequences (x [d, n*B], sequence-major). The K/V
// of the new positions are written into the cache rows `kv_rows` (row = slot * capacity + position
// in the cache viewed as [head_dim * n_kv_heads, capacity * n_seq]); each sequence then attends over
// the first n_kv positions of its slot (slots slot0 .. slot0+B-1) under `mask` [n_kv, n, 1, B]
// (0 or -inf, F16 as flash attention takes it). Returns logits [vocab, B] of each sequence's last position ([vocab, n*B] with all_logits).
struct DecoderInputs {
    ggml_tensor * x;          // [d, n*B]
    ggml_tensor * positions;  // I32 [n*B]
    ggml_tensor * kv_rows;    // I64 [n*B]
    ggml_tensor * mask;       // F16 [n_kv, n, 1, B]
    const std::vector<ggml_tensor *> * k_cache;
    const std::vector<ggml_tensor *> * v_cache;
    int64_t n, n_seqs, n_kv, slot0;
    bool all_logits;
    bool flash_attn;  // fused attention kernel (ggml_flash_attn_ext) instead of matmul/softmax/matmul
    const std::vector<int64_t> * kv_lens = nullptr;  // per sequence: its cached length + n (may be null)
    // n positions of one sequence computed as n decode steps would be (speculative verification): every
    // product with the decode-step arithmetic (mul_mat_step, per column), so each position's logits are
    // bit for bit those of a single step there.
    bool step_products = false;
};
ggml_tensor * build_decoder(const GraphCtx & g, ggml_cgraph * gf, const HParams & hp, const Weights & w,
                            const DecoderInputs & in);

}  // namespace fun_asr
