#include "model/submodel_hparams.h"

#include <algorithm>
#include <stdexcept>
#include <variant>

namespace fun_asr {

namespace {

const std::string kKey = "campplus.";

std::vector<int64_t> get_ints(const Metadata & m, const std::string & key) {
    auto it = m.find(key);
    if (it == m.end()) throw std::runtime_error("model metadata has no key '" + key + "'");
    if (!std::holds_alternative<std::vector<int64_t>>(it->second)) {
        throw std::runtime_error("model metadata key '" + key + "' must be an integer array");
    }
    const auto & v = std::get<std::vector<int64_t>>(it->second);
    if (v.empty() || v.size() > 64) {
        throw std::runtime_error("model metadata key '" + key + "' must list 1 to 64 values, got " +
                                 std::to_string(v.size()));
    }
    for (int64_t x : v) {
        if (x < 1 || x > kMaxHParam) {
            throw std::runtime_error("model metadata key '" + key + "' has the value " + std::to_string(x) +
                                     " (each must be in [1, " + std::to_string(kMaxHParam) + "])");
        }
    }
    return v;
}

int64_t conv_out(int64_t n, int64_t k, int64_t stride) { return (n + 2 * ((k - 1) / 2) - k) / stride + 1; }

}  // namespace

int64_t VadHParams::symbol(const std::string & name) const {
    if (name == "in_dim") return in_dim;
    if (name == "in_affine") return in_affine;
    if (name == "linear_dim") return linear_dim;
    if (name == "proj_dim") return proj_dim;
    if (name == "lorder") return lorder;
    if (name == "out_affine") return out_affine;
    if (name == "out_dim") return out_dim;
    throw std::runtime_error("fsmn_vad tensor table: unknown shape symbol '" + name + "'");
}

VadHParams parse_vad_hparams(const Metadata & m) {
    const std::string k = "fsmn_vad.";
    VadHParams hp;
    hp.in_dim = get_int(m, k + "input_dim");
    hp.in_affine = get_int(m, k + "input_affine_dim");
    hp.linear_dim = get_int(m, k + "linear_dim");
    hp.proj_dim = get_int(m, k + "proj_dim");
    hp.lorder = get_int(m, k + "lorder", 2);
    hp.out_affine = get_int(m, k + "output_affine_dim");
    hp.out_dim = get_int(m, k + "output_dim", 2);
    hp.n_layers = get_int(m, k + "block_count");
    if (get_int(m, k + "rorder", 0) != 0) {
        throw std::runtime_error("fsmn_vad: FSMN blocks with a right context (rorder > 0) are not supported");
    }
    const int64_t limit = 1 << 20;
    for (int64_t v : {hp.in_dim, hp.in_affine, hp.linear_dim, hp.proj_dim, hp.lorder, hp.out_affine, hp.out_dim}) {
        if (v > limit) throw std::runtime_error("fsmn_vad: a dimension of " + std::to_string(v) + " is implausible");
    }
    if (hp.n_layers > 64) throw std::runtime_error("fsmn_vad: " + std::to_string(hp.n_layers) + " layers is implausible");
    return hp;
}

int64_t SpeakerHParams::block_in(size_t b) const {
    int64_t c = tdnn_ch;
    for (size_t i = 0; i < b; ++i) c = (c + layers[i] * growth) / 2;
    return c;
}

int64_t SpeakerHParams::frames_after_tdnn(int64_t T) const { return conv_out(T, tdnn_k, tdnn_stride); }

int64_t SpeakerHParams::min_frames() const {
    int64_t T = 1;
    while (frames_after_tdnn(T) < 2) ++T;
    return T;
}

int64_t SpeakerHParams::symbol(const std::string & name, int64_t b, int64_t i) const {
    if (name == "fcm_ch") return fcm_ch;
    if (name == "fcm_k") return fcm_k;
    if (name == "tdnn_ch") return tdnn_ch;
    if (name == "tdnn_in") return fcm_ch * fcm_freq;
    if (name == "tdnn_k") return tdnn_k;
    if (name == "fcm_freq") return fcm_freq;
    if (name == "growth") return growth;
    if (name == "bn_ch") return bn_ch();
    if (name == "bn_half") return bn_half();
    if (name == "emb") return emb;
    if (name == "stats_dim") return 2 * final_ch();
    if (b >= 0 && static_cast<size_t>(b) < layers.size()) {
        const size_t bb = static_cast<size_t>(b);
        if (name == "layer_k") return kernels[bb];
        if (name == "block_out") return block_out(bb);
        if (name == "transit_out") return block_out(bb) / 2;
        if (name == "layer_in" && i >= 0) return block_in(bb) + i * growth;
    }
    throw std::runtime_error("campplus tensor table: unknown shape symbol '" + name + "'");
}

SpeakerHParams parse_speaker_hparams(const Metadata & m) {
    SpeakerHParams hp;
    hp.feat_dim = get_int(m, kKey + "feat_dim");
    hp.emb = get_int(m, kKey + "embedding_length");
    hp.growth = get_int(m, kKey + "growth_rate");
    hp.bn_size = get_int(m, kKey + "bn_size");
    hp.tdnn_ch = get_int(m, kKey + "tdnn.channels");
    hp.tdnn_k = get_int(m, kKey + "tdnn.kernel_size");
    hp.tdnn_stride = get_int(m, kKey + "tdnn.stride");
    hp.fcm_ch = get_int(m, kKey + "fcm.channels");
    hp.fcm_k = get_int(m, kKey + "fcm.kernel_size");
    hp.fcm_stride = get_int(m, kKey + "fcm.stride");
    hp.reduction = get_int(m, kKey + "cam.reduction");
    hp.seg_len = get_int(m, kKey + "cam.seg_len");
    hp.fcm_blocks = get_ints(m, kKey + "fcm.block_count");
    hp.layers = get_ints(m, kKey + "block.layer_count");
    hp.kernels = get_ints(m, kKey + "block.kernel_size");
    hp.dilations = get_ints(m, kKey + "block.dilation");
    if (hp.kernels.size() != hp.layers.size() || hp.dilations.size() != hp.layers.size()) {
        throw std::runtime_error("campplus: block.layer_count, block.kernel_size and block.dilation must have the same "
                                 "length (one value per dense block)");
    }
    auto odd = [](int64_t k) { return k % 2 == 1; };
    if (!odd(hp.fcm_k) || !odd(hp.tdnn_k) || !std::all_of(hp.kernels.begin(), hp.kernels.end(), odd)) {
        throw std::runtime_error("campplus: kernel sizes must be odd (FunASR pads (k-1)/2 on each side)");
    }
    int64_t total = 0;
    for (int64_t n : hp.layers) total += n;
    for (int64_t n : hp.fcm_blocks) total += n;
    if (total > kMaxLayers) throw std::runtime_error("campplus: " + std::to_string(total) + " layers is implausible");
    if (hp.bn_half() < 1) throw std::runtime_error("campplus: bn_size * growth_rate / cam.reduction must be >= 1");
    int64_t f = hp.feat_dim;
    for (size_t g = 0; g <= hp.fcm_blocks.size(); ++g) f = conv_out(f, hp.fcm_k, hp.fcm_stride);
    if (f < 1) {
        throw std::runtime_error("campplus: feat_dim " + std::to_string(hp.feat_dim) + " leaves no frequency rows");
    }
    hp.fcm_freq = f;
    for (size_t b = 0; b < hp.layers.size(); ++b) {
        if (hp.block_out(b) > kMaxHParam || hp.block_out(b) / 2 < 1) {
            throw std::runtime_error("campplus: dense block " + std::to_string(b) + " has an implausible width");
        }
    }
    const int64_t widest = std::max({hp.fcm_ch * hp.fcm_freq, hp.tdnn_ch * hp.tdnn_k, hp.emb, 2 * hp.final_ch()});
    if (widest > kMaxHParam) {
        throw std::runtime_error("campplus: a dimension of " + std::to_string(widest) + " is implausible");
    }
    return hp;
}

}  // namespace fun_asr
