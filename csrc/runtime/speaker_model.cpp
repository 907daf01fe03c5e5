#include "runtime/speaker_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "ggml-cpu.h"
#include "model/tensors.h"
#include "runtime/architectures.h"

namespace fun_asr {

namespace {

const TableEntry kSpeakerTable[] = {
#include "campplus_tensor_table.inc"
};


std::string fill(const char * pattern, int64_t g, int64_t j) {
    std::string s = pattern;
    const std::pair<const char *, int64_t> subs[] = {{"{g}", g}, {"{j}", j}, {"{b}", g}, {"{i}", j}};
    for (const auto & [key, value] : subs) {
        for (auto pos = s.find(key); pos != std::string::npos; pos = s.find(key)) {
            s.replace(pos, 3, std::to_string(value));
        }
    }
    return s;
}

// Every tensor of the table for these hyperparameters, in the converter's order (speakers/files.py table()).
std::vector<ExpectedTensor> expected_speaker_tensors(const SpeakerHParams & hp) {
    std::vector<ExpectedTensor> out;
    auto expand = [&](const std::string & group, int64_t a, int64_t b) {
        bool any = false;
        for (const auto & e : kSpeakerTable) {
            if (group != e.group) continue;
            any = true;
            ExpectedTensor t;
            t.name = fill(e.name, a, b);
            t.kind = e.kind;
            for (int d = e.n_dims - 1; d >= 0; --d) {
                const std::string s = e.shape[d];
                const bool number =
                    !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
                t.ne.push_back(number ? std::stoll(s) : hp.symbol(s, a, b));
            }
            out.push_back(std::move(t));
        }
        if (!any) throw std::runtime_error("campplus tensor table: no group '" + group + "'");
    };
    expand("fcm_stem", -1, -1);
    for (size_t g = 0; g < hp.fcm_blocks.size(); ++g) {
        for (int64_t j = 0; j < hp.fcm_blocks[g]; ++j) {
            expand("fcm_block", static_cast<int64_t>(g), j);
            if (j == 0 && hp.fcm_stride != 1) expand("fcm_shortcut", static_cast<int64_t>(g), j);
        }
    }
    expand("fcm_out", -1, -1);
    expand("tdnn", -1, -1);
    for (size_t b = 0; b < hp.layers.size(); ++b) {
        for (int64_t i = 0; i < hp.layers[b]; ++i) expand("dense_layer", static_cast<int64_t>(b), i);
        expand(b + 1 == hp.layers.size() ? "transit_last" : "transit", static_cast<int64_t>(b), -1);
    }
    expand("embedding", -1, -1);
    return out;
}

bool speaker_type_allowed(const std::string & kind, ggml_type t) {
    if (kind == "bias" || kind == "kernel") return t == GGML_TYPE_F32;
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16;
}

std::string shape_str(const std::vector<int64_t> & ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// Nodes of one CAM++ graph: a fixed part, and per dense layer and per FCM block (src's architecture checked first).
size_t graph_size_for(const ModelSource & src) {
    require_architecture(src, Role::speaker);
    const SpeakerHParams hp = parse_speaker_hparams(src.meta);
    int64_t n_layers = 0, n_fcm = 0;
    for (int64_t n : hp.layers) n_layers += n;
    for (int64_t n : hp.fcm_blocks) n_fcm += n;
    return static_cast<size_t>(256 + 40 * n_layers + 32 * n_fcm);
}

}  // namespace

SpeakerModel::SpeakerModel(const ModelSource & src, int threads, const std::string & device)
    // A campplus file, or a package (a fun_asr_nano GGUF) that embeds one: "campplus.*" keys and "spk.*"
    // tensors beside its own, which are left alone here (the architecture checked before the device).
    : DeviceRuntime(device, graph_size_for(src)) {
    const Architecture & arch = require_architecture(src, Role::speaker);
    const bool embedded = embedded_in(src, arch);
    hp_ = parse_speaker_hparams(src.meta);
    const std::vector<ExpectedTensor> expected = expected_speaker_tensors(hp_);
    std::map<std::string, const SourceTensor *> by_name;
    for (const auto & t : src.tensors) {
        if (embedded && t.name.rfind(arch.tensor_prefix, 0) != 0) continue;
        if (!by_name.emplace(t.name, &t).second) {
            throw std::runtime_error(src.origin + ": duplicate tensor '" + t.name + "'");
        }
    }
    {
        std::map<std::string, bool> known;
        for (const auto & e : expected) known[e.name] = true;
        for (const auto & [name, t] : by_name) {
            if (!known.count(name)) {
                throw std::runtime_error(src.origin + ": unexpected tensor '" + name +
                                         "' (not in the CAM++ table for this file's campplus.* hyperparameters)");
            }
        }
    }
    load(src, expected, by_name);
    set_threads(threads);
}

void SpeakerModel::load(const ModelSource & src, const std::vector<ExpectedTensor> & expected,
                        const std::map<std::string, const SourceTensor *> & by_name) {
    ggml_init_params ip{ggml_tensor_overhead() * (expected.size() + 1), nullptr, true};
    wctx_ = ggml_init(ip);
    if (!wctx_) throw std::runtime_error("ggml_init failed");
    std::vector<std::pair<ggml_tensor *, const SourceTensor *>> pairs;
    std::map<std::string, ggml_tensor *> tensors;
    bool any_f16 = false, any_f32 = false;
    {
        for (const auto & e : expected) {
            auto it = by_name.find(e.name);
            if (it == by_name.end()) throw std::runtime_error(src.origin + ": missing tensor '" + e.name + "'");
            const SourceTensor & s = *it->second;
            if (s.ne != e.ne) {
                throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has shape " + shape_str(s.ne) +
                                         ", expected " + shape_str(e.ne) + " (ggml order) from the campplus.* metadata");
            }
            if (!speaker_type_allowed(e.kind, s.type)) {
                throw std::runtime_error(src.origin + ": tensor '" + e.name + "' has unsupported type " +
                                         ggml_type_name(s.type) + " for a " + e.kind + " (accepted: F32" +
                                         (e.kind == "bias" || e.kind == "kernel" ? "" : ", F16") + ")");
            }
            if (e.kind == "conv" || e.kind == "matrix") (s.type == GGML_TYPE_F16 ? any_f16 : any_f32) = true;
            ggml_tensor * t = ggml_new_tensor(wctx_, s.type, static_cast<int>(e.ne.size()), e.ne.data());
            ggml_set_name(t, e.name.c_str());
            if (s.nbytes != ggml_nbytes(t) || s.data == nullptr) {
                throw std::runtime_error(src.origin + ": tensor '" + e.name +
                                         "' data size does not match its shape and type");
            }
            pairs.emplace_back(t, &s);
            tensors[e.name] = t;
        }
    }
    weight_type_ = any_f16 && any_f32 ? "mixed" : (any_f16 ? "f16" : "f32");
    auto get = [&](const std::string & name) -> ggml_tensor * {
        auto it = tensors.find(name);
        return it == tensors.end() ? nullptr : it->second;
    };
    auto conv = [&](const std::string & p) { return SpkConv{get(p + ".weight"), get(p + ".bias")}; };
    w_.stem = conv("spk.fcm.conv1");
    for (size_t g = 0; g < hp_.fcm_blocks.size(); ++g) {
        for (int64_t j = 0; j < hp_.fcm_blocks[g]; ++j) {
            const std::string p = "spk.fcm." + std::to_string(g) + "." + std::to_string(j);
            SpkFcmBlock blk;
            blk.conv1 = conv(p + ".conv1");
            blk.conv2 = conv(p + ".conv2");
            blk.shortcut = conv(p + ".shortcut");
            blk.stride = j == 0 ? static_cast<int>(hp_.fcm_stride) : 1;
            w_.fcm.push_back(blk);
        }
    }
    w_.fcm_out = conv("spk.fcm.conv2");
    w_.tdnn = conv("spk.tdnn");
    for (size_t b = 0; b < hp_.layers.size(); ++b) {
        std::vector<SpkDenseLayer> block;
        for (int64_t i = 0; i < hp_.layers[b]; ++i) {
            const std::string p = "spk.blk." + std::to_string(b) + "." + std::to_string(i);
            SpkDenseLayer l;
            l.bn_scale = get(p + ".bn1.scale");
            l.bn_shift = get(p + ".bn1.shift");
            l.linear1 = conv(p + ".linear1");
            l.local = get(p + ".local.weight");
            l.ctx1 = conv(p + ".ctx1");
            l.ctx2 = conv(p + ".ctx2");
            l.dilation = hp_.dilations[b];
            block.push_back(l);
        }
        w_.blocks.push_back(std::move(block));
        const std::string p = "spk.transit." + std::to_string(b);
        w_.transit.push_back({get(p + ".bn.scale"), get(p + ".bn.shift"), conv(p)});
    }
    w_.dense = conv("spk.dense");

    place_weights("the speaker model's weights");
    for (const auto & [t, s] : pairs) ggml_backend_tensor_set(t, s->data, 0, ggml_nbytes(t));
}

SpeakerModel::~SpeakerModel() = default;

void SpeakerModel::set_memory_budget(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes < (size_t(1) << 20)) throw std::invalid_argument("memory budget must be at least 1 MiB");
    budget_ = bytes;
    batch_cache_.clear();
}

ggml_cgraph * SpeakerModel::build(ggml_context * ctx, int64_t T, int64_t B, ggml_tensor ** feats, ggml_tensor ** rows,
                                  ggml_tensor ** out) const {
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, graph_size_, false);
    *feats = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, T, hp_.feat_dim, B);
    ggml_set_input(*feats);
    const int64_t Tn = hp_.frames_after_tdnn(T);
    *rows = nullptr;
    if (Tn > hp_.seg_len) {
        *rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, Tn * B);
        ggml_set_input(*rows);
    }
    GraphCtx g{ctx, nullptr, caps_};
    *out = build_campplus(g, hp_, w_, *feats, *rows);
    ggml_set_output(*out);
    ggml_build_forward_expand(gf, *out);
    return gf;
}

size_t SpeakerModel::graph_bytes(int64_t T, int64_t B) {
    std::vector<uint8_t> meta(graph_meta_.size());
    ggml_init_params ip{meta.size(), meta.data(), true};
    ggml_context * ctx = ggml_init(ip);
    struct Free {
        ggml_context * c;
        ~Free() { ggml_free(c); }
    } guard{ctx};
    ggml_tensor * feats, * rows, * out;
    return DeviceRuntime::graph_bytes(build(ctx, T, B, &feats, &rows, &out));
}

int64_t SpeakerModel::batch_for(int64_t T) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (T < hp_.min_frames()) {
        throw std::invalid_argument("windows need at least " + std::to_string(hp_.min_frames()) + " frames");
    }
    return batch_for_locked(T);
}

int64_t SpeakerModel::batch_for_locked(int64_t T) {
    auto it = batch_cache_.find(T);
    if (it != batch_cache_.end()) return it->second;
    // Graph memory grows linearly with the windows per graph: size it at 1 and 2 windows.
    const size_t one = graph_bytes(T, 1), two = graph_bytes(T, 2);
    const size_t per = two > one ? two - one : one;
    const size_t fixed = one > per ? one - per : 0;
    const int64_t n = budget_ > fixed ? static_cast<int64_t>((budget_ - fixed) / per) : 1;
    const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(n, 1024));
    batch_cache_[T] = batch;
    return batch;
}

std::vector<float> SpeakerModel::embed(const float * feats, int64_t n, int64_t T) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n <= 0) throw std::invalid_argument("no windows to embed (need at least one)");
    if (T < hp_.min_frames()) {
        throw std::invalid_argument("windows of " + std::to_string(T) + " feature frames are too short: CAM++ needs at "
                                    "least " + std::to_string(hp_.min_frames()) + " frames");
    }
    if (T > (int64_t(1) << 22)) throw std::invalid_argument("windows of " + std::to_string(T) + " frames are too long");
    const int64_t F = hp_.feat_dim, Tn = hp_.frames_after_tdnn(T), S = (Tn + hp_.seg_len - 1) / hp_.seg_len;
    const int64_t batch = batch_for_locked(T);
    std::vector<float> result(static_cast<size_t>(n * hp_.emb));
    std::vector<float> staged;
    std::vector<int32_t> seg;
    for (int64_t first = 0; first < n; first += batch) {
        const int64_t B = std::min(batch, n - first);
        ggml_init_params ip{graph_meta_.size(), graph_meta_.data(), true};
        ggml_context * ctx = ggml_init(ip);
        struct Free {
            ggml_context * c;
            ~Free() { ggml_free(c); }
        } guard{ctx};
        ggml_tensor * x, * rows, * out;
        ggml_cgraph * gf = build(ctx, T, B, &x, &rows, &out);
        sched_alloc(gf, "the speaker model's graph");
        // [B][T][F] row-major -> ggml [1, T, F, B] (one input channel; time, then frequency)
        staged.resize(static_cast<size_t>(B * F * T));
        for (int64_t b = 0; b < B; ++b) {
            const float * src = feats + (first + b) * T * F;
            float * dst = staged.data() + b * T * F;
            for (int64_t t = 0; t < T; ++t) {
                for (int64_t f = 0; f < F; ++f) dst[f * T + t] = src[t * F + f];
            }
        }
        ggml_backend_tensor_set(x, staged.data(), 0, ggml_nbytes(x));
        if (rows) {
            seg.resize(static_cast<size_t>(Tn * B));
            for (int64_t b = 0; b < B; ++b) {
                for (int64_t t = 0; t < Tn; ++t) {
                    seg[static_cast<size_t>(b * Tn + t)] = static_cast<int32_t>(t / hp_.seg_len + S * b);
                }
            }
            ggml_backend_tensor_set(rows, seg.data(), 0, ggml_nbytes(rows));
        }
        sched_compute(gf, "speaker model graph");
        ggml_backend_tensor_get(out, result.data() + first * hp_.emb, 0, ggml_nbytes(out));
    }
    return result;
}

}  // namespace fun_asr
