// The last rows of a weight matrix that do not fill a whole row group of a GEMM kernel (the AMX GEMM's 16-row
// tiles, the int8 GEMM's 8-row groups; the CTC head's 60,515 labels): they run as one zero-padded group of their
// own. Zero Q8_0 / Q6_K blocks (scale 0) add 0, and each row's arithmetic is independent of the other rows of its
// group, so the tail rows get the bits they would get inside a whole group.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace fun_asr {

// Rows [row0, row0 + tail) of w (rb bytes per row, tail < group), bias rows alike (or null), into
// y (column j's rows at y + j * ys, m columns). run(w_group, bias_group, y_group, ys_group) computes one group
// of `group` rows from a group-sized copy, writing column j's rows at y_group + j * ys_group.
template <class Run>
void padded_tail_rows(const uint8_t * w, size_t rb, int64_t row0, int64_t tail, int64_t group, const float * bias,
                      int64_t m, float * y, int64_t ys, Run && run) {
    thread_local std::vector<uint8_t> wpad;
    thread_local std::vector<float> bpad, ypad;
    wpad.assign(static_cast<size_t>(group) * rb, 0);
    std::memcpy(wpad.data(), w + static_cast<size_t>(row0) * rb, static_cast<size_t>(tail) * rb);
    if (bias) {
        bpad.assign(static_cast<size_t>(group), 0.0f);
        std::memcpy(bpad.data(), bias + row0, static_cast<size_t>(tail) * sizeof(float));
    }
    ypad.resize(static_cast<size_t>(m * group));
    run(wpad.data(), bias ? bpad.data() : nullptr, ypad.data(), group);
    for (int64_t j = 0; j < m; ++j) {
        std::memcpy(y + j * ys + row0, ypad.data() + j * group, static_cast<size_t>(tail) * sizeof(float));
    }
}

}  // namespace fun_asr
