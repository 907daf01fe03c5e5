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
#
#   tools/build_cuda.sh 90 --module [--install PYTHON] [--force]
#                                        # ggml's CUDA backend as one more module of the portable build (the
#                                        # wheel's layout: libggml-cuda.so beside the extension, ggml-base shared),
#                                        # built from the same pinned ggml: build/cuda-module-sm90/libggml-cuda.so.
#                                        # --install copies it into PYTHON's installed fun_asr (a portable wheel),
#                                        # which then lists the GPU (`--device cuda`); a module already there is
#                                        # replaced only with --force. The CUDA runtime and cuBLAS come from the
#                                        # system (or NVIDIA's nvidia-* wheels on LD_LIBRARY_PATH); where they do
#                                        # not load, fun-asr runs on the CPU and says why.
set -euo pipefail
arch="${1:?usage: tools/build_cuda.sh ARCH [--ggml-only | --module [--install PYTHON] [--force]]   (e.g. 90 for sm_90)}"
mode="${2:-}"
install_python=""
force=""
shift $(( $# < 2 ? $# : 2 ))
while [ $# -gt 0 ]; do
  case "$1" in
    --install) install_python="${2:?--install takes the python of the environment fun-asr is installed in}"; shift 2 ;;
    --force) force=1; shift ;;
    *) echo "build_cuda: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$install_python$force" ] && [ "$mode" != "--module" ]; then
  echo "build_cuda: --install and --force go with --module" >&2; exit 2
fi
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
if [ "$mode" != "--ggml-only" ] && [ -z "${FUN_ASR_CUDA_CONFIGURE_ONLY:-}" ] && ! ls "$cuda_root"/lib64/stubs/libcuda.so* "$cuda_root"/targets/*/lib/stubs/libcuda.so* \
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

if [ "$mode" = "--module" ]; then
  # fun-asr's own portable configuration (the wheel's: shared ggml-base without a version in its name, RPATH
  # $ORIGIN), of which only the CUDA module is compiled.
  mbuild="build/cuda-module-sm${arch}"
  cmake -S . -B "$mbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFUN_ASR_PORTABLE=ON -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPython_EXECUTABLE="$(command -v "$python")" \
    -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" "${extra[@]}"
  [ -z "${FUN_ASR_CUDA_CONFIGURE_ONLY:-}" ] || { echo "build_cuda: configured $mbuild"; exit 0; }
  cmake --build "$mbuild" --target ggml-cuda -j "$(nproc)"
  module="$(find "$mbuild" -name libggml-cuda.so -type f | head -n1)"
  cp "$module" "$mbuild/libggml-cuda.so"
  echo "build_cuda: CUDA module for sm_${arch} built in $(( $(date +%s) - start )) s -> $mbuild/libggml-cuda.so"
  if [ -n "$install_python" ]; then
    dest="$("$install_python" -c 'import os, fun_asr._core as c; print(os.path.dirname(c.__file__))')"
    [ -f "$dest/libggml-base.so" ] || { echo "build_cuda: $dest is not a portable fun-asr (no libggml-base.so): \
install the portable wheel there first" >&2; exit 1; }
    if [ -e "$dest/libggml-cuda.so" ] && [ -z "$force" ]; then
      echo "build_cuda: $dest/libggml-cuda.so exists; --force replaces it" >&2; exit 1
    fi
    cp "$mbuild/libggml-cuda.so" "$dest/libggml-cuda.so"
    echo "build_cuda: installed into $dest (fun_asr.system_info()['devices'] lists the GPU where it loads)"
  fi
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
