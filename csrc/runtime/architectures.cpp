#include "runtime/architectures.h"

#include <stdexcept>

namespace fun_asr {

const std::vector<Architecture> & architectures() {
    static const std::vector<Architecture> table = {
        {"fun_asr_nano", Role::recognizer, "a recognizer", nullptr, ""},
        {"fsmn_vad", Role::vad, "a VAD model", "fsmn_vad.block_count", "vad."},
        {"campplus", Role::speaker, "a speaker model", "campplus.embedding_length", "spk."},
    };
    return table;
}

const Architecture & require_architecture(const ModelSource & src, Role role) {
    for (const Architecture & a : architectures()) {
        if (a.role != role) continue;
        if (src.arch == a.id || (a.embedded_key && src.meta.count(a.embedded_key))) return a;
        const std::string id = a.id;
        if (!a.embedded_key) {
            throw std::runtime_error(src.origin + ": architecture '" + src.arch + "' is not supported (expected " + id +
                                     ")");
        }
        throw std::runtime_error(src.origin + ": architecture '" + src.arch + "' is not " + a.what +
                                 " and embeds none (expected " + id + ", or " + id + ".* metadata)");
    }
    throw std::logic_error("no architecture for this role");
}

}  // namespace fun_asr
