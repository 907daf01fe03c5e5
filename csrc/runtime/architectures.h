// The model families this build runs, one row each: the GGUF's general.architecture, which runner reads it, and
// how a package embeds it (the FSMN-VAD and CAM++ inside a fun_asr_nano file). A new family is a row here, its
// hyperparameters (model/), its graph (graph/) and its runner (runtime/, on DeviceRuntime).
#pragma once

#include <string>
#include <vector>

#include "model/loader.h"

namespace fun_asr {

enum class Role { recognizer, vad, speaker };

struct Architecture {
    const char * id;             // general.architecture
    Role role;                   // the runner: Model, VadModel, SpeakerModel
    const char * what;           // for messages: "a VAD model"
    const char * embedded_key;   // the metadata key a package that embeds one carries; null: never embedded
    const char * tensor_prefix;  // its tensors' names in such a package (and in its own file)
};

const std::vector<Architecture> & architectures();

// The row a runner of `role` reads from src: src's own architecture, or one that src embeds. std::runtime_error
// naming the file, its architecture and what is accepted otherwise.
const Architecture & require_architecture(const ModelSource & src, Role role);

// Whether src embeds the model (a package of another architecture) rather than being its file.
inline bool embedded_in(const ModelSource & src, const Architecture & a) { return src.arch != a.id; }

}  // namespace fun_asr
