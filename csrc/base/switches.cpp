#include "base/switches.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

namespace fun_asr::switches {

const std::vector<Switch> & all() {
    static const std::vector<Switch> list = {
        {"FUN_ASR_MATVEC", "decode-step matrix-vector kernels: unset = the best this CPU runs, 0 = ggml's products, "
                           "avx2 / avxvnni = that path on a CPU that has more (both also stand in for a CPU without "
                           "AVX-512 in the int8 GEMM and the encoder's attention)"},
        {"FUN_ASR_GEMM", "the int8 GEMM of the encoder, adaptor and prefill products: 0 = ggml's, avx2 / avxvnni = "
                         "that path"},
        {"FUN_ASR_ZMM", "0 = the 256-bit tiles of the int8 GEMM and the encoder's attention on AVX-512 CPUs (same bits)"},
        {"FUN_ASR_AMX", "0 = no AMX tiles on CPUs that have them"},
        {"FUN_ASR_Q8_QUADS", "0 = Q8_0 matrices keep ggml's layout (not re-laid out for the int8 GEMM at load)"},
        {"FUN_ASR_ATTN", "ggml = ggml's attention for the encoder and the decoder's cache"},
        {"FUN_ASR_FSMN", "ggml = ggml's ops for the encoder's FSMN memory block"},
        {"FUN_ASR_FUSE", "0 = no fused element-wise ops (bias + ReLU, residual + RMSNorm, the in-graph greedy choice)"},
        {"FUN_ASR_GRAPH_REUSE", "0 = build every decode step's graph anew (no reuse of the last one)"},
        {"FUN_ASR_PROFILE", "set (not 0) = time every graph node (Model.profile())"},
        {"FUN_ASR_GGML_LOG", "warn = ggml's warnings and errors on stderr, debug = everything ggml says (default: "
                             "silent, errors kept for the exceptions)"},
        {"FUN_ASR_THP", "0 = no transparent-huge-page advice for the weights and the KV cache"},
    };
    return list;
}

const std::string & value(const char * name) {
    static const std::map<std::string, std::string> values = [] {
        std::map<std::string, std::string> m;
        for (const Switch & s : all()) {
            const char * v = std::getenv(s.name);
            m[s.name] = v ? v : "";
        }
        return m;
    }();
    auto it = values.find(name);
    if (it == values.end()) throw std::logic_error(std::string("unlisted environment switch ") + name);
    return it->second;
}

bool is(const char * name, const char * v) { return value(name) == v; }

}  // namespace fun_asr::switches
