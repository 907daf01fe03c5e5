#!/usr/bin/env bash
# Configure and compile the CUDA variant of fun_asr._core for one GPU architecture.
#   tools/build_cuda.sh 90          # H100/H200 (sm_90); 89 = Ada, 86 = Ampere, ...
# Needs nvcc but no GPU. Output: build/cuda-sm<ARCH>/_core*.so
# ggml's CUDA backend links cuBLAS. If the CUDA toolkit has none, set FUN_ASR_CUBLAS_ROOT to a
# folder with include/cublas_v2.h and lib/libcublas.so*, or let this script fetch NVIDIA's
# `nvidia-cublas` wheel matching nvcc's version from the package index into build/.
# To install the CUDA build with pip instead:
#   CMAKE_ARGS="-DFUN_ASR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" pip install .
#
#   tools/build_cuda.sh 90 --ggml-only   # only ggml (static, portable CPU code, CUDA for sm_90), installed
#                                        # under build/ggml-cuda-sm90/install and packed as
#                                        # build/gpu-carry/ggml-cuda-sm90.tar.xz: the long CUDA compile done
#                                        # here, so that a GPU machine without a network (and with another
#                                        # Python) builds only fun-asr's own sources against it
#                                        # (FUN_ASR_GGML_PREBUILT_DIR; tools/gpu_check.sh does).
set -euo pipefail
arch="${1:?usage: tools/build_cuda.sh ARCH [--ggml-only]   (e.g. 90 for sm_90)}"
mode="${2:-}"
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
build="build/cuda-sm${arch}"
start=$(date +%s)

extra=()
nvcc_bin="$(command -v nvcc)" || { echo "build_cuda: nvcc not found" >&2; exit 1; }
cuda_root="$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")"
for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$cuda_root" /usr/local/cuda-*; do
  [ -n "$root" ] || continue
  if ls "$root"/lib64/libcublas.so* "$root"/targets/*/lib/libcublas.so* >/dev/null 2>&1; then
    have_cublas=1
  fi
done
if [ -z "${have_cublas:-}" ] && [ -z "${FUN_ASR_CUBLAS_ROOT:-}" ]; then
  ver="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')"
  major="${ver%%.*}"
  pkg="nvidia-cublas"; [ "$major" -lt 13 ] && pkg="nvidia-cublas-cu${major}"
  dest="build/cublas-${ver}"
  if [ ! -d "$dest/nvidia" ]; then
    echo "build_cuda: no cuBLAS in the CUDA toolkit; fetching ${pkg}==${ver}.* into ${dest}"
    "$python" -m pip install --quiet --no-deps --target "$dest" "${pkg}==${ver}.*"
  fi
  FUN_ASR_CUBLAS_ROOT="$(readlink -f "$(dirname "$(find "$dest" -name cublas_v2.h | head -n1)")/..")"
fi
if [ -n "${FUN_ASR_CUBLAS_ROOT:-}" ]; then
  lib="$FUN_ASR_CUBLAS_ROOT/lib"
  cublas="$(ls "$lib"/libcublas.so* | head -n1)"
  cublaslt="$(ls "$lib"/libcublasLt.so* | head -n1)"
  extra+=(-DCUDA_cublas_LIBRARY="$cublas" -DCUDA_cublasLt_LIBRARY="$cublaslt"
          -DCMAKE_CUDA_FLAGS="-I$FUN_ASR_CUBLAS_ROOT/include"
          -DCMAKE_CXX_FLAGS="-I$FUN_ASR_CUBLAS_ROOT/include"
          -DCMAKE_BUILD_RPATH="$lib")
  echo "build_cuda: cuBLAS from $FUN_ASR_CUBLAS_ROOT"
fi

# ggml's virtual-memory pool needs the driver library (libcuda.so, or the toolkit's stub) at link
# time; without one, build with GGML_CUDA_NO_VMM (ggml's legacy memory pool) and say so.
if [ "$mode" != "--ggml-only" ] && ! ls "$cuda_root"/lib64/stubs/libcuda.so* "$cuda_root"/targets/*/lib/stubs/libcuda.so* \
        /usr/lib/x86_64-linux-gnu/libcuda.so* /usr/lib64/libcuda.so* >/dev/null 2>&1; then
  echo "build_cuda: no libcuda.so (driver or stub) to link; building with GGML_CUDA_NO_VMM=ON"
  extra+=(-DGGML_CUDA_NO_VMM=ON)
fi

if [ "$mode" = "--ggml-only" ]; then
  # The ggml that third_party/ggml.cmake would fetch (same pin, same cache), configured as fun-asr
  # configures it, but with portable CPU code: the GPU machine's CPU is not this one. Only the static
  # libraries are made, so nothing is linked here: the driver library's location is a placeholder.
  src="$(ls -d "${FUN_ASR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fun-asr}"/ggml/*/ggml 2>/dev/null | head -n1)"
  [ -n "$src" ] || { echo "build_cuda: no cached ggml source; run a normal build once first" >&2; exit 1; }
  gbuild="build/ggml-cuda-sm${arch}"
  cmake -S "$src" -B "$gbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU=ON -DGGML_NATIVE=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_LLAMAFILE=ON -DGGML_ALL_WARNINGS=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$PWD/$gbuild/install" \
    -DCUDA_cuda_driver_LIBRARY=/not-linked-here/libcuda.so "${extra[@]}"
  cmake --build "$gbuild" -j "$(nproc)"
  cmake --install "$gbuild" >/dev/null
  mkdir -p build/gpu-carry
  tar -C "$gbuild/install" -cJf "build/gpu-carry/ggml-cuda-sm${arch}.tar.xz" .
  echo "build_cuda: ggml for sm_${arch} built in $(( $(date +%s) - start )) s -> build/gpu-carry/ggml-cuda-sm${arch}.tar.xz"
  exit 0
fi

cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DFUN_ASR_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DPython_EXECUTABLE="$(command -v "$python")" \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
  "${extra[@]}"
cmake --build "$build" --target _core -j "$(nproc)"
echo "build_cuda: sm_${arch} built in $(( $(date +%s) - start )) s -> $(ls "$build"/_core*.so)"
