// Parameters of a ggml custom op (ggml_custom_4d's userdata): the graph keeps only the pointer, so the
// parameters must outlive every graph that uses them. Each distinct value is kept once, for the process.
#pragma once

#include <cstring>
#include <mutex>
#include <set>

#include "ggml.h"

namespace fun_asr {

// A pointer to the one stored copy of p (T: ordered by operator<), valid until the process ends.
template <class T>
const T * intern_op_params(const T & p) {
    static std::mutex mu;
    static std::set<T> all;
    std::lock_guard<std::mutex> lock(mu);
    return &*all.insert(p).first;
}

// The function of a custom op node (ggml's custom op parameters start with it), or null for any other node:
// how a node is recognised as one of fun-asr's ops whatever the graph builders named it.
inline ggml_custom_op_t custom_op_function(const ggml_tensor * t) {
    if (!t || t->op != GGML_OP_CUSTOM) return nullptr;
    ggml_custom_op_t fun;
    std::memcpy(&fun, t->op_params, sizeof(fun));
    return fun;
}

}  // namespace fun_asr
