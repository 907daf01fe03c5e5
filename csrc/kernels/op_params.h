// Parameters of a ggml custom op (ggml_custom_4d's userdata): the graph keeps only the pointer, so the
// parameters must outlive every graph that uses them. Each distinct value is kept once, for the process.
#pragma once

#include <mutex>
#include <set>

namespace fun_asr {

// A pointer to the one stored copy of p (T: ordered by operator<), valid until the process ends.
template <class T>
const T * intern_op_params(const T & p) {
    static std::mutex mu;
    static std::set<T> all;
    std::lock_guard<std::mutex> lock(mu);
    return &*all.insert(p).first;
}

}  // namespace fun_asr
