// Builders shared by every stage: norms, linear layers, attention, feed-forward blocks, and the
// naming callback that lets a debug run read any stage's output (whisper.cpp / llama.cpp style).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "ggml.h"
#include "model/tensors.h"

namespace fun_asr {

// Called for every named stage output ("enc.blk.3.out"); a debug run marks them as outputs.
using StageCallback = std::function<void(ggml_tensor *, const std::string &)>;

// What the device a graph runs on offers, in one record that the runtime fills from the device
// (runtime/backend.cpp device_caps): the builders and the runtime read a field here instead of asking whether the
// device is the CPU, so a new backend is one entry there. The defaults are the CPU's.
struct DeviceCaps {
    // fun-asr's CPU ops (kernels/) may run on the device's tensors: the decoder's attention over its KV cache, the
    // fused element-wise nodes, the CTC argmax, the encoder's attention; and a batch keeps each sequence's numbers
    // its own (per-sequence attention chains, prefills of several sequences in one pass).
    bool host = true;
    // ggml's flash attention keeps K and V in F32 (CUDA's rounds them to F16: relative errors ~1e-3 where the CPU's
    // F32 attention meets the reference within 1e-4); without it, attention is matmul / softmax / matmul.
    bool exact_flash_attn = true;
    // Products must ask for F32 accumulation (ggml's CUDA backend would otherwise run F16 weights through cuBLAS
    // with F16 accumulation).
    bool f32_products = false;
    // ggml's SSM_CONV takes the FSMN memory's kernel at any width (CUDA's takes 3, 4, 5, 9 and 15 only, and aborts
    // the process on others: SAN-M's is 11); without it, the FSMN runs as one shifted product per tap.
    bool ssm_conv_any_width = true;
    // A decode step's graph is built once per batch shape and computed again with new inputs: it spans the whole
    // KV cache, and each sequence's length comes in as an input (the CPU's attention op reads it; elsewhere the
    // mask hides the keys past it), so the graph does not depend on it.
    bool graph_reuse = true;
    // The greedy choice (the maximum of each sequence's logits) is a node of the step's graph: only the token ids
    // come back from the device (the CPU: fun-asr's op, the first maximum; elsewhere ggml's ARGMAX).
    bool argmax_in_graph = true;
    // With the choice, its log-probability (log softmax at the chosen token) is computed in the step's graph too:
    // on the CPU by fun-asr's op, elsewhere as ggml's SOFT_MAX read at the ARGMAX (one float per sequence comes
    // back, the log taken on the host). Otherwise the logits come back and the host computes it.
    bool logprob_in_graph = true;
    // The thread count may be chosen by timing decode steps (the CPU computes every node).
    bool timed_threads = true;
    // Several segments' encoder passes run faster as one packed graph (Model::encode_batch): a device whose cost
    // per graph node is mostly its launch. Not the CPU, where a packed pass of the full-size encoder took 1.2-1.3x
    // the time of the passes one by one (the joins between per-sequence nodes and a larger working set).
    bool packed_encoding = false;
    // The decoder's per-head RMSNorm (times its weight) may feed RoPE directly. Not on ggml's Vulkan backend
    // (0.15.3), which fuses rms_norm, mul and rope into one shader that corrupted memory in decode steps of two or
    // more sequences (Mesa 22.3's lavapipe: the heap, at every batch's first step; not with
    // GGML_VK_DISABLE_FUSION=1): there a copy between the two keeps them apart.
    bool norm_rope_chain = true;
};

struct GraphCtx {
    ggml_context * ctx;
    StageCallback on_stage;  // may be empty
    DeviceCaps caps{};
    // Several sequences packed along the time axis ([d, T_0 + T_1 + ...], each sequence's columns together, in
    // this order): their lengths. Empty: one sequence. Everything that mixes frames (attention, the FSMN memory)
    // runs per sequence on views of its columns; everything per frame runs once over all of them.
    std::vector<int64_t> segments{};
    // A debug run that reads every stage: the plain graph's nodes, none fused (a fused tail has no ".attn_out").
    bool every_stage = false;
    void name(ggml_tensor * t, const std::string & n) const {
        ggml_set_name(t, n.c_str());
        if (on_stage) on_stage(t, n);
    }
};

// Each frame's most likely label: logits [vocab, T] -> int32 [T] (the first of equal maxima; NaN never wins).
// ggml's ARGMAX runs on one thread (15.7 ms over 60,515 x 167 logits); this splits the frames over all.
ggml_tensor * ctc_argmax(ggml_context * ctx, ggml_tensor * logits);

// Each column's softmax at its chosen row: logits [vocab, B] and choice int32 [B] (ggml's ARGMAX of them) ->
// [1, 1, B] (ggml's SOFT_MAX, then GET_ROWS): the probability of a GPU's greedy choice, read back with it.
ggml_tensor * chosen_probability(ggml_context * ctx, ggml_tensor * logits, ggml_tensor * choice);

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, const Norm & n, float eps);
ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps);
// ggml_mul_mat(w, x), or for a few columns (up to matvec_max_cols()) the bandwidth-bound kernels in
// kernels/matvec where they take w's type and layout.
ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// ggml_get_rows(w, ids) for a weight in any of its layouts (the token embedding).
ggml_tensor * get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids);
// A decode step's product, one column per sequence: each column's numbers do not depend on how many
// columns there are (batch invariance). The kernels in kernels/matvec for any column count where
// they take w; else, for weights in CPU memory, ggml's one-column arithmetic for every column
// (ggml_mul_mat itself rounds one column and several differently). Weights on a GPU: ggml_mul_mat.
// `prepared`: prepare_step(ctx, w, x) or null.
ggml_tensor * mul_mat_step(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared = nullptr);
// The prepared activation a decode step's product of w and x reads when it goes through the int8 GEMM
// (VNNI steps of several sequences), else null: products with the same input (q/k/v, gate/up) share it.
ggml_tensor * prepare_step(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);
// For many columns (encoder frames, a prefill's positions): a Q8_0 matrix on Intel AMX
// (kernels/gemm_amx) where the CPU has it; else the int8 GEMM (kernels/gemm_avx2) for Q8_0, and with
// k_quants (the audio encoder's products: linear(), product()) for Q4_K / Q6_K too; else the kernels in
// kernels/matvec where they are faster than ggml's GEMM on this build (matvec_frames_preferred: the
// same numbers), else mul_mat. The choice depends on w only, never on the column count, and each
// column's numbers on that column only, so a prefill is the same alone or in a batch. Decode steps use
// mul_mat_step (see kernels/gemm_amx.h). `prepared` (may be null) is prepare_frames(ctx, w, x,
// k_quants) shared by products with the same input x.
ggml_tensor * mul_mat_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * prepared = nullptr,
                             bool k_quants = false);
// x quantized once for several products (q/k/v, gate/up) when w takes the AMX or int8 GEMM, else null.
ggml_tensor * prepare_frames(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, bool k_quants = false);
// The products of several matrices with the same x (q/k/v, gate/up): mul_mat_frames (frames) or mul_mat_step of
// each, or, for matrices kept in the int8 GEMM's quads layout, one node for all (fewer nodes and thread barriers
// per decode step; the same numbers). `prepared`: prepare_frames / prepare_step of ws[0] and x, or null.
std::vector<ggml_tensor *> products(ggml_context * ctx, const std::vector<ggml_tensor *> & ws, ggml_tensor * x,
                                    ggml_tensor * prepared, bool frames);
// A decode step's products whose node computes their input itself (kernels/decoder_fused: one node and one
// thread barrier fewer), the same numbers as the input's own node followed by products(); empty where these
// products take no such input (then build those two).
// rms_norm(x + y) * norm (y may be null: the norm of x), for one matrix or several; with `sum`, *sum is set to
// the view of x + y in the node's output (several matrices only).
std::vector<ggml_tensor *> products_after_add_norm(ggml_context * ctx, const std::vector<ggml_tensor *> & ws,
                                                   ggml_tensor * x, ggml_tensor * y, ggml_tensor * norm, float eps,
                                                   ggml_tensor ** sum);
// SwiGLU (silu(gate) * up) inside w's product; null where it does not take it.
ggml_tensor * product_after_swiglu(ggml_context * ctx, ggml_tensor * w, ggml_tensor * gate, ggml_tensor * up);
// rms_norm(x + y) * norm in one node (kernels/decoder_fused), the same bits as ggml's add, norm and mul: the norm,
// with *sum set to x + y; null where that node does not take these tensors.
ggml_tensor * add_rms_norm_node(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * norm, float eps,
                                ggml_tensor ** sum);
// silu(gate) * up: ggml's one SwiGLU node where w (the product after it) is in CPU memory and fusion is on, else
// ggml's silu and mul (the bits a GPU backend and FUN_ASR_FUSE=0 have).
ggml_tensor * swiglu(ggml_context * ctx, ggml_tensor * gate, ggml_tensor * up, const ggml_tensor * w, bool fuse);
// Whether SwiGLU may run inside the next product (as swiglu()'s one node: fusion on, w in CPU memory).
bool swiglu_fusable(const ggml_tensor * w);

// A decoder layer's attention over its KV cache in fun-asr's CPU op (kernels/attention): each query row over its
// own visible keys, the same bits alone and in any batch.
struct CachedAttention {
    ggml_tensor *q, *k, *v;           // the q / k / v products [hd * heads, n * B]
    ggml_tensor *q_norm, *k_norm;     // the heads' RMSNorm weights [hd]
    ggml_tensor * positions;          // I32 [n * B]
    ggml_tensor * kv_rows;            // I64 [n * B]: where the new K/V rows go in k_rows / v_rows
    ggml_tensor *k_rows, *v_rows;     // each cache as [hd * kv_heads, rows]
    ggml_tensor *k_window, *v_window; // each sequence's visible part [hd, kv_heads, n_kv, B]
    ggml_tensor * mask;               // F16 [n_kv, n, 1, B]
    int64_t head_dim, n_heads, n_kv_heads;
    float scale, eps, rope_theta;
    bool step;                        // one position of each sequence (a decode step)
};
// The heads' norms, NeoX RoPE, the K/V store and the attention in as few nodes as the kernels take (one for a
// decode step, else a norm node, a RoPE node, a store node and the attention); null where they take none of it
// (then the caller builds the plain graph). Nodes that only store rows are added to gf.
ggml_tensor * fused_cached_attention(ggml_context * ctx, ggml_cgraph * gf, const CachedAttention & a);
// fun-asr's attention op over q [hd, Hq, n*B] (already normed, rotated and stored), null where it does not apply.
ggml_tensor * host_cached_attention(ggml_context * ctx, ggml_tensor * q, const CachedAttention & a);

// x W^T without its bias where a later fused op can add it: y, and the bias still to add (null when the
// product added it, on AMX, or l has none).
struct Product {
    ggml_tensor * y;
    ggml_tensor * bias;
};
Product product(ggml_context * ctx, ggml_tensor * x, const Linear & l, ggml_tensor * prepared = nullptr);
// x W^T + b (an encoder-side product: k_quants); on AMX / the int8 GEMM with the bias added in the
// product, from `prepared` when given (prepare_frames of x, shared by products with the same input).
ggml_tensor * linear(ggml_context * ctx, ggml_tensor * x, const Linear & l, ggml_tensor * prepared = nullptr);

// im2col for channels-innermost tensors (every conv of CAM++): x F32 [C, W, H, N] -> [C*kh*kw, OW, OH, N] of
// `type` (F32 or F16), row (i*kw + j)*C + c = channel c at kernel tap (i along H, j along W), zero outside x;
// OW = (W + 2*pw - dw*(kw-1) - 1) / sw + 1 (OH likewise). A weight [Cout, kh, kw, C] (torch's conv weight
// with the input channels moved last) times these columns is the convolution, channels innermost again.
// ggml_im2col wants the spatial axes innermost; this copies C contiguous values per tap (a CPU custom op).
// The kernel's size (kw along W, kh along H), strides, zero padding and dilations.
struct Im2colParams {
    int kw, kh, sw, sh, pw, ph, dw, dh;
    bool operator<(const Im2colParams & o) const {
        return std::tie(kw, kh, sw, sh, pw, ph, dw, dh) < std::tie(o.kw, o.kh, o.sw, o.sh, o.pw, o.ph, o.dw, o.dh);
    }
};
ggml_tensor * im2col_channels_last(ggml_context * ctx, ggml_tensor * x, const Im2colParams & p, ggml_type type);

// Bidirectional multi-head attention over [d, T] q/k/v (heads of head_dim); mask may be null. Unmasked:
// kernels/attention where the device takes host kernels and it applies, else ggml's flash attention where it is
// exact on the device; else (and masked) matmul / softmax / matmul.
ggml_tensor * attention_full(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                             int64_t n_heads, ggml_tensor * mask, const DeviceCaps & caps);

// Pre-LN SAN-M / transformer layer: attention (+ FSMN memory when l.fsmn is set), ReLU FFN,
// residuals (none around attention when the input width differs), optional final LayerNorm. With packed
// sequences (g.segments) each one's attention and FSMN memory read only its own frames: every sequence's
// columns are those it gets alone wherever the products' columns do not depend on the others (kernels/).
ggml_tensor * sanm_layer(const GraphCtx & g, ggml_tensor * x, const SanmLayer & l, int64_t n_heads,
                         int64_t fsmn_kernel, float eps, ggml_tensor * mask, const std::string & name);

}  // namespace fun_asr
