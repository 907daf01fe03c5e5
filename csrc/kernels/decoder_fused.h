// The Qwen3 decoder's element-wise work between its products, in fewer CPU nodes. Every ggml node of a
// decode step ends in a barrier of all threads (~480 per step of the full-size model, most of them
// around tiny element-wise ops): beside a busy process a thread that shares its core holds each one.
// These ops take exactly ggml's float steps, so the results are the plain graph's bits
// (tests/test_decoder_fused.py):
//
// - add_rms_norm: the residual x + y and the next RMSNorm of it, rms_norm(x + y) * w, in one node
//   (ggml_add, then ggml_rms_norm and ggml_mul: a double sum of the float squares, a float mean, scale =
//   1 / sqrtf(mean + eps), then (v * scale) * w);
// - heads_rms_norm: the per-head RMSNorm of the query and key heads (their own weights) into one
//   [hd, Hq + Hkv, T] tensor, so that one RoPE node rotates both;
// - store_kv: the new positions' K and V rows written into the caches (two set_rows nodes before);
// - argmax_columns: a decode step's greedy choice per sequence inside the graph, so a step copies out a
//   few indices instead of every sequence's logits (600 KB each) and picks on one thread.
//
// FUN_ASR_FUSE=0 builds the plain graph (as for the encoder's fused ops).
#pragma once

#include <cstdint>
#include <utility>

#include "ggml.h"

namespace fun_asr {

// Whether add_rms_norm takes x and y (F32 [n, T], contiguous, the same shape) and w (F32 [n] in CPU memory);
// y may be null (then the norm of x alone). False when FUN_ASR_FUSE=0.
bool add_rms_norm_supported(const ggml_tensor * x, const ggml_tensor * y, const ggml_tensor * w);

// F32 [n, T, 2]: plane 0 rms_norm(x + y) * w, plane 1 x + y (x alone where y is null); the planes as
// contiguous [n, T] views: norm_of(t), sum_of(t).
ggml_tensor * add_rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * y, ggml_tensor * w, float eps);
ggml_tensor * norm_of(ggml_context * ctx, ggml_tensor * fused);
ggml_tensor * sum_of(ggml_context * ctx, ggml_tensor * fused);

// Whether heads_rms_norm takes q [hd * Hq, T] and k [hd * Hkv, T] (F32, rows of contiguous floats) with the
// norms' weights qn, kn (F32 [hd] in CPU memory). False when FUN_ASR_FUSE=0.
bool heads_rms_norm_supported(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * qn,
                              const ggml_tensor * kn, int64_t hd);

// F32 [hd, Hq + Hkv, T]: for every position the Hq query heads normed with qn, then the Hkv key heads
// normed with kn (rms_norm(head) * weight).
ggml_tensor * heads_rms_norm(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * qn, ggml_tensor * kn,
                             int64_t hd, float eps);

// heads_rms_norm, then ggml_rope_ext's NeoX RoPE of every head (n_dims = hd, base `base`, no scaling) at
// positions (I32 [T]), and store_kv of the rotated key heads and v, in one node: F32 [hd, Hq + Hkv, T] as
// heads_rms_norm's, rotated. The RoPE is ggml's CPU op's arithmetic, including whether ggml's build fused its
// products into FMAs (read off ggml's own op once per head size and base; where no form of ours matches it, not
// supported). The graph
// reaches the caches' rows through this node's output (the attention's query is a view of it).
// q, k: the q / k products; qn, kn: their heads' norm weights; eps: the norms' epsilon; v, kc, vc, rows:
// store_kv's value rows, caches and row ids.
struct HeadsNormRopeStore {
    ggml_tensor *q, *k, *qn, *kn;
    int64_t hd;
    float eps;
    ggml_tensor * positions;
    float base;
    ggml_tensor *v, *kc, *vc, *rows;
};
bool heads_norm_rope_store_supported(const HeadsNormRopeStore & a);
// The forms of ggml's RoPE rotation in this build for rows of n and this base, as heads_norm_rope_store finds
// them: for x0 c - x1 s and for x0 s + x1 c each 0 (two products and a sum), 1 (an FMA of the first product),
// 2 (of the second), -1 (none of ours: heads_norm_rope_store is not supported).
std::pair<int, int> rope_rotation_forms(int64_t n, float base);
ggml_tensor * heads_norm_rope_store(ggml_context * ctx, const HeadsNormRopeStore & a);

// The heads input of a decode step's attention node (kernels/attention: cached_attention_heads), made inside it per
// sequence and run of K/V heads: heads_norm_rope_store's arithmetic, without its node. q: the q product as a
// [hd, Hq, B] view; k, v: the k/v products F32 [hd * Hkv, B] (rows of contiguous floats); kw, vw: the caches'
// windows [hd, Hkv, n_kv, B]; pos: I32 [B], each
// sequence's new position, which is its row in its window (stages.h: row = slot * capacity + position).
struct AttentionHeads {
    const ggml_tensor *q, *k, *v, *qn, *kn, *pos, *kw, *vw;
    int64_t hd, group;  // group: query heads per K/V head
    float eps, base;
    int first, second;  // the RoPE's forms (rope_rotation_forms)
};
// Sequence b's query heads of K/V heads [j0, j1) normed and rotated into q (its [hd, Hq] column; other heads left
// as they are), and those K/V heads' new rows (K normed and rotated) stored at its position in kw / vw.
void attention_heads_input(const AttentionHeads & a, int64_t b, int64_t j0, int64_t j1, float * q);

// Whether store_kv takes k, v (F32 [kv_dim, T] views whose columns are contiguous floats, nb[1] apart) and
// caches kc, vc (F32 [kv_dim, rows] views of host memory) with rows (I64 [T]). False when FUN_ASR_FUSE=0.
bool store_kv_supported(const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * kc, const ggml_tensor * vc,
                        const ggml_tensor * rows);

// kc row rows[t] = k column t, vc row rows[t] = v column t. Returns a small node of its own: the graph
// must expand it before the nodes that read the caches.
ggml_tensor * store_kv(ggml_context * ctx, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kc, ggml_tensor * vc,
                       ggml_tensor * rows);

// A decode step's product node that computes its own input: one node and one thread barrier fewer per
// product. The products' kernels (kernels/matvec's and kernels/gemm_avx2's nodes for a few columns) then read,
// instead of their activation source, what node_input computes in every thread from the node's sources
// src[1], src[kNodeInputSrc] and src[kNodeInputSrc + 1], with the arithmetic of the node it replaces:
//   add_rms_norm: src[1] = x, then y (or null) and w: rms_norm(x + y) * w, as add_rms_norm; where asked, the
//     node's output has one more contiguous [n, T] block after the products' blocks: x + y (node_input writes it);
//   swiglu: src[1] = gate, then up: silu(gate) * up, ggml_swiglu_split's row function itself.
enum class NodeInput : int32_t { add_rms_norm = 1, swiglu = 2 };
constexpr int kNodeInputSrc = 7;

// One such input: a = x or gate, b = y (null: the norm of x alone) or up, w = the norm's weight (add_rms_norm) or
// null, the norm's epsilon, and whether the node's output has x + y's block (add_rms_norm with a y).
struct ProductInput {
    NodeInput kind;
    ggml_tensor *a, *b, *w;
    float eps;
    bool sum;
};

// Whether a node can compute that input from a (x or gate: F32 [n, T], rows of contiguous floats), b (y or up,
// the same shape; add_rms_norm: may be null without a sum) and, for add_rms_norm, w (F32 [n] in CPU memory).
// False when FUN_ASR_FUSE=0.
bool node_input_supported(const ProductInput & in);

// Puts the input's tensors into a product node's sources (args[1], args[kNodeInputSrc], args[kNodeInputSrc + 1];
// args has room for kNodeInputSrc + 2) and returns the node's userdata.
void * node_input_args(const ProductInput & in, ggml_tensor ** args);

// The elements of product node dst's output past its products (add_rms_norm's sum block), else 0; the name of
// its own input ("ADD_RMS_NORM", "SWIGLU"), else null.
int64_t node_input_extra(const ggml_tensor * dst);
const char * node_input_name(const ggml_tensor * dst);

// The input of product node dst whose userdata is node_input_args's, this thread's own copy: F32 [n, T],
// columns n floats apart (n = src[1]->ne[0]). add_rms_norm: writes this thread's share of the columns of x + y
// at `sum` (columns n floats apart). Null for a node without one (userdata null).
const float * node_input(const ggml_tensor * dst, const void * userdata, float * sum, int ith, int nth);

// Whether argmax_columns takes logits: F32 [V, n] in host memory, rows of contiguous floats (and FUN_ASR_FUSE
// is not 0).
bool argmax_columns_supported(const ggml_tensor * logits);

// I32 [n]: per column the index of its first maximum, as std::max_element: a NaN never wins, except in
// row 0, which then stays the choice (the host's argmax before this op, the same answers). The one argmax op:
// a decode step's greedy choice and the CTC head's frame labels (`nan_first_wins` false: a NaN in row 0 does not
// win either, the first maximum of the other values does; all NaN: 0). Columns split among the threads.
ggml_tensor * argmax_columns(ggml_context * ctx, ggml_tensor * logits, bool nan_first_wins = true);
// argmax_columns with each choice's log-probability: I32 [2, n], per column the index (row 0) and the bits of the
// F32 chosen_logprob of that column at it (row 1: read them as floats). nan_first_wins as argmax_columns'.
ggml_tensor * argmax_logprob_columns(ggml_context * ctx, ggml_tensor * logits);

// log softmax(x)[at] over x[0..n): x[at] - m - log(sum_i exp(x[i] - m)), m = x[at] (the first maximum where `at`
// is first_argmax's answer): each term in float (a range-reduced Taylor series, within float's rounding of exp),
// summed in double in four lanes in a fixed order: the same bits wherever it runs (the graph's op, the host after a
// prefill). NaN where x[at] is NaN or infinite.
float chosen_logprob(const float * x, int64_t n, int64_t at);

// The index of the first maximum of x[0..n) (std::max_element's answer; `nan_first_wins` as above), vectorized.
int64_t first_argmax(const float * x, int64_t n, bool nan_first_wins = true);

// The profile's name of one of these ops ("ADD_RMS_NORM", "HEADS_RMS_NORM", "HEADS_NORM_ROPE_STORE", "STORE_KV",
// "ARGMAX"), else null.
const char * decoder_fused_op(const ggml_tensor * t);

}  // namespace fun_asr
