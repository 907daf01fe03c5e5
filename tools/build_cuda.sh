#!/usr/bin/env bash
# Configure and compile the CUDA variant of fun_asr._core for one GPU architecture.
#   tools/build_cuda.sh 90          # H100/H200 (sm_90); 89 = Ada, 86 = Ampere, ...
# Needs nvcc (CUDA toolkit) but no GPU. Output: build/cuda-sm<ARCH>/_core*.so
# To install the CUDA build with pip instead:
#   CMAKE_ARGS="-DFUN_ASR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" pip install .
set -euo pipefail
arch="${1:?usage: tools/build_cuda.sh ARCH   (e.g. 90 for sm_90)}"
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
build="build/cuda-sm${arch}"
start=$(date +%s)
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DFUN_ASR_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DPython_EXECUTABLE="$(command -v "$python")" \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)"
cmake --build "$build" --target _core -j "$(nproc)"
echo "build_cuda: sm_${arch} built in $(( $(date +%s) - start )) s -> $(ls "$build"/_core*.so)"
