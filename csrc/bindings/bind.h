// Entry points that register each group of bindings on the fun_asr._core module.
#pragma once

#include <pybind11/pybind11.h>

namespace fun_asr::bindings {

void bind_model(pybind11::module_ & m);     // Model, load_gguf, check_gguf, load_tensors
void bind_vad(pybind11::module_ & m);       // VadModel, load_vad_gguf, load_vad_tensors
void bind_speaker(pybind11::module_ & m);   // SpeakerModel, load_speaker_gguf, load_speaker_tensors
void bind_quantize(pybind11::module_ & m);  // quantize, dequantize, quantized_row_bytes, block_size
void bind_bench(pybind11::module_ & m);     // system_info, bench_*, eval_matmul, read_bandwidth, ISA queries

}  // namespace fun_asr::bindings
