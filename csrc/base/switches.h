// Every FUN_ASR_* environment switch the native core reads, in one place: each read once, at the first use of
// any (the values a process starts with), and listed with what it does for system_info()["switches"].
// Unset reads as "". The kernels' choices (MATVEC, GEMM, ZMM, AMX, Q8_QUADS, ATTN, FSMN, FUSE: their measured
// defaults, switched off or forced for comparisons), the runtime's (GRAPH_REUSE, PROFILE) and ggml's log and the
// huge pages (GGML_LOG, THP). docs: README "CPU kernels and their switches".
#pragma once

#include <string>
#include <vector>

namespace fun_asr::switches {

struct Switch {
    const char * name;  // the environment variable
    const char * what;  // its values and what they do
};

// Every switch, in the order listed.
const std::vector<Switch> & all();

// The variable's value when first read ("" unset). `name` must be one of all() (std::logic_error otherwise:
// a switch read here is a switch listed here).
const std::string & value(const char * name);

// value(name) == v
bool is(const char * name, const char * v);

}  // namespace fun_asr::switches
