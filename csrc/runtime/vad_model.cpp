#include "runtime/vad_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "ggml-cpu.h"
#include "model/tensors.h"
#include "runtime/architectures.h"

namespace fun_asr {

namespace {

const TableEntry kVadTable[] = {
#include "fsmn_vad_tensor_table.inc"
};

constexpr int kVadGraphSize = 256;

std::string with_layer(const char * pattern, int64_t layer) {
    std::string s = pattern;
    const auto pos = s.find("{i}");
    if (pos != std::string::npos) s.replace(pos, 3, std::to_string(layer));
    return s;
}

std::vector<ExpectedTensor> expected_vad_tensors(const VadHParams & hp) {
    std::vector<ExpectedTensor> out;
    auto expand = [&](const std::string & group, int64_t layer) {
        for (const auto & e : kVadTable) {
            if (group != e.group) continue;
            ExpectedTensor t;
            t.name = with_layer(e.name, layer);
            t.kind = e.kind;
            for (int d = e.n_dims - 1; d >= 0; --d) t.ne.push_back(hp.symbol(e.shape[d]));
            out.push_back(std::move(t));
        }
    };
    expand("vad_network", -1);
    expand("vad_cmvn", -1);
    for (int64_t i = 0; i < hp.n_layers; ++i) expand("vad_layer", i);
    return out;
}

// The source's VAD tensors by name (an embedding package's: those under the VAD's prefix), each name once and
// none unexpected.
std::map<std::string, const SourceTensor *> vad_tensors(const ModelSource & src, const Architecture & arch,
                                                        const std::vector<ExpectedTensor> & expected) {
    const bool embedded = embedded_in(src, arch);
    std::map<std::string, const SourceTensor *> by_name;
    for (const auto & t : src.tensors) {
        if (embedded && t.name.rfind(arch.tensor_prefix, 0) != 0) continue;
        if (!by_name.emplace(t.name, &t).second) throw std::runtime_error(src.origin + ": duplicate tensor '" + t.name + "'");
    }
    if (by_name.size() != expected.size()) {
        for (const auto & [name, t] : by_name) {
            bool known = false;
            for (const auto & e : expected) known |= e.name == name;
            if (!known) throw std::runtime_error(src.origin + ": unexpected tensor '" + name + "'");
        }
    }
    return by_name;
}

// Every expected tensor present, F32, of its shape and size.
void check_vad_tensors(const ModelSource & src, const std::vector<ExpectedTensor> & expected,
                       const std::map<std::string, const SourceTensor *> & by_name) {
    ggml_init_params ip{ggml_tensor_overhead() * (expected.size() + 1), nullptr, true};
    struct Ctx {
        ggml_context * c;
        ~Ctx() { if (c) ggml_free(c); }
    } ctx{ggml_init(ip)};  // shape checks only; the weights are placed padded
    if (!ctx.c) throw std::runtime_error("ggml_init failed");
    for (const auto & e : expected) {
        auto it = by_name.find(e.name);
        if (it == by_name.end()) throw std::runtime_error(src.origin + ": missing tensor '" + e.name + "'");
        const SourceTensor & s = *it->second;
        if (s.type != GGML_TYPE_F32) {
            throw std::runtime_error(src.origin + ": tensor '" + e.name + "' must be F32, got " + ggml_type_name(s.type));
        }
        if (s.ne != e.ne) throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has the wrong shape");
        ggml_tensor * t = ggml_new_tensor(ctx.c, GGML_TYPE_F32, static_cast<int>(e.ne.size()), e.ne.data());
        if (s.nbytes != ggml_nbytes(t)) throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has the wrong size");
    }
}

// A VAD weight and the padded tensor it goes into.
struct PaddedWeight {
    ggml_tensor * dst;
    const SourceTensor * src;
    int64_t rows, cols;  // the source's row-major shape; dst is [cols_pad, rows_pad] in ggml order
    bool transpose;      // FSMN taps: [P, L] -> [L, P] (each tap's channels run along ne0)
    bool matrix;
};

// The VAD's weight tensors in ctx at the padded widths dims (input affine, linear, proj, output affine), and
// where each one's values come from (placed).
VadWeights padded_vad_weights(ggml_context * ctx, const VadHParams & hp, const std::vector<int64_t> & dims,
                              const std::map<std::string, const SourceTensor *> & by_name,
                              std::vector<PaddedWeight> & placed) {
    const int64_t A = dims[0], D = dims[1], P = dims[2], O = dims[3];
    auto make = [&](const std::string & name, int64_t rows_pad, int64_t cols_pad, bool transpose = false) {
        const SourceTensor * s = by_name.at(name);
        ggml_tensor * t = cols_pad > 0 ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols_pad, rows_pad)
                                       : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, rows_pad);
        ggml_set_name(t, name.c_str());
        const int64_t rows = s->ne.size() > 1 ? s->ne[1] : s->ne[0], cols = s->ne.size() > 1 ? s->ne[0] : 1;
        placed.push_back({t, s, rows, cols, transpose, cols_pad > 0});
        return t;
    };
    VadWeights w;
    w.shift = make("vad.cmvn.shift", hp.in_dim, 0);
    w.scale = make("vad.cmvn.scale", hp.in_dim, 0);
    w.in1_w = make("vad.in1.weight", A, hp.in_dim);
    w.in1_b = make("vad.in1.bias", A, 0);
    w.in2_w = make("vad.in2.weight", D, A);
    w.in2_b = make("vad.in2.bias", D, 0);
    for (int64_t i = 0; i < hp.n_layers; ++i) {
        const std::string p = "vad.blk." + std::to_string(i);
        VadLayer l;
        l.linear = make(p + ".linear.weight", P, D);
        l.taps = make(p + ".fsmn.weight", hp.lorder, P, true);
        l.affine_w = make(p + ".affine.weight", D, P);
        l.affine_b = make(p + ".affine.bias", D, 0);
        w.layers.push_back(l);
    }
    w.out1_w = make("vad.out1.weight", O, D);
    w.out1_b = make("vad.out1.bias", O, 0);
    w.out2_w = make("vad.out2.weight", hp.out_dim, O);
    w.out2_b = make("vad.out2.bias", hp.out_dim, 0);
    return w;
}

// pl's values into its padded tensor, zeros around them.
void upload_padded(const PaddedWeight & pl) {
    std::vector<float> buf(static_cast<size_t>(ggml_nelements(pl.dst)), 0.0f);
    const float * src = static_cast<const float *>(pl.src->data);
    const int64_t ld = pl.dst->ne[0];  // padded row length
    for (int64_t r = 0; r < pl.rows; ++r) {
        for (int64_t c = 0; c < pl.cols; ++c) {
            const float v = src[r * pl.cols + c];
            const int64_t at = pl.transpose ? c * ld + r : (pl.matrix ? r * ld + c : r);
            buf[static_cast<size_t>(at)] = v;
        }
    }
    ggml_backend_tensor_set(pl.dst, buf.data(), 0, ggml_nbytes(pl.dst));
}

}  // namespace

VadModel::VadModel(const ModelSource & src, int threads, const std::string & device)
    // An fsmn_vad file, or another package (a fun_asr_nano GGUF) that embeds one: "fsmn_vad.*" keys and
    // "vad.*" tensors beside its own, which are left alone here (the architecture checked before the device).
    : DeviceRuntime((require_architecture(src, Role::vad), device), kVadGraphSize) {
    const Architecture & arch = require_architecture(src, Role::vad);
    hp_ = parse_vad_hparams(src.meta);
    const std::vector<ExpectedTensor> expected = expected_vad_tensors(hp_);
    const std::map<std::string, const SourceTensor *> by_name = vad_tensors(src, arch, expected);
    check_vad_tensors(src, expected, by_name);
    // Hidden widths (140, 250) are padded with zero rows/columns to multiples of 16: ggml's fast F32
    // GEMM (llamafile tinyBLAS) needs the inner dimension in whole vectors, and at 140/250 it falls back
    // to a dot-product loop 4-10x slower. Zero weights and biases add exact zeros (ReLU(0) = 0), so the
    // probabilities are unchanged.
    auto pad = [](int64_t n) { return (n + 15) / 16 * 16; };
    dims_ = {pad(hp_.in_affine), pad(hp_.linear_dim), hp_.proj_dim, pad(hp_.out_affine)};
    ggml_init_params ip{ggml_tensor_overhead() * (expected.size() + 1), nullptr, true};
    wctx_ = ggml_init(ip);
    if (!wctx_) throw std::runtime_error("ggml_init failed");
    std::vector<PaddedWeight> placed;
    w_ = padded_vad_weights(wctx_, hp_, dims_, by_name, placed);
    place_weights("the VAD weights");
    for (const PaddedWeight & pl : placed) upload_padded(pl);
    set_threads(threads);
}

VadModel::~VadModel() = default;

std::vector<float> VadModel::forward(const float * feats, int64_t T, float * cache, int64_t column) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (T <= 0) throw std::invalid_argument("features are empty: need at least one frame");
    if (column >= hp_.out_dim) {
        throw std::out_of_range("column " + std::to_string(column) + " is outside the " + std::to_string(hp_.out_dim) +
                                " output classes");
    }
    ggml_init_params ip{graph_meta_.size(), graph_meta_.data(), true};
    ggml_context * ctx = ggml_init(ip);
    struct Free {
        ggml_context * c;
        ~Free() { ggml_free(c); }
    } guard{ctx};
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, kVadGraphSize, false);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp_.in_dim, T);
    ggml_set_input(x);
    std::vector<ggml_tensor *> caches, new_caches;
    for (int64_t i = 0; i < hp_.n_layers; ++i) {
        caches.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp_.proj_dim, hp_.lorder - 1));
        ggml_set_input(caches.back());
    }
    ggml_tensor * probs = build_fsmn_vad(ctx, hp_, w_, x, caches, new_caches);
    ggml_tensor * out = column >= 0 ? ggml_cont(ctx, ggml_view_2d(ctx, probs, 1, T, probs->nb[1], column * sizeof(float)))
                                    : probs;
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);
    for (ggml_tensor * c : new_caches) {
        ggml_set_output(c);
        ggml_build_forward_expand(gf, c);
    }
    sched_alloc(gf, "the VAD graph");
    ggml_backend_tensor_set(x, feats, 0, ggml_nbytes(x));
    const size_t per_layer = static_cast<size_t>((hp_.lorder - 1) * hp_.proj_dim);
    for (size_t i = 0; i < caches.size(); ++i) {
        ggml_backend_tensor_set(caches[i], cache + i * per_layer, 0, per_layer * sizeof(float));
    }
    sched_compute(gf, "VAD graph");
    std::vector<float> result(static_cast<size_t>(ggml_nelements(out)));
    ggml_backend_tensor_get(out, result.data(), 0, result.size() * sizeof(float));
    for (size_t i = 0; i < new_caches.size(); ++i) {
        ggml_backend_tensor_get(new_caches[i], cache + i * per_layer, 0, per_layer * sizeof(float));
    }
    return result;
}

}  // namespace fun_asr
