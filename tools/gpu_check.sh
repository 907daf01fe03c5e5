#!/usr/bin/env bash
# The CUDA check, in one run on a GPU machine that has no network:
#   1. builds fun_asr._core (+ _spin) for the machine's Python against the CUDA ggml that
#      `tools/build_cuda.sh 90 --ggml-only` packed into build/gpu-carry/ (the long nvcc part is done
#      elsewhere; here only fun-asr's own C++ is compiled, with all cores);
#   2. installs the Python packages the machine lacks from build/gpu-carry/wheels (no index) and
#      Transformers 5.23 (pruned to the models used) from build/gpu-carry/transformers-*-slim.tar.xz;
#   3. runs the GPU cases of the test suite: parity against Transformers on CUDA within the CPU's
#      tolerances (tests/test_model_parity.py), batch invariance on CUDA (tests/test_batch_invariance.py),
#      CPU tokens = GPU tokens on the trained demo model (tests/test_gpu.py);
#   4. runs `tools/bench.py --device cuda` on the full-size random model (F16, Q8_0): one 10 s clip,
#      transcribe_batch over 64 clips of 5-29.5 s (RTFx), GPU memory; then `--batch-split`: continuous
#      batching at batch sizes 1, 8, 16, 64 with each clip's own token count, a decode step's split, packed
#      encoder passes against one per clip; then tools/arrivals_bench.py: the server's decoder with requests
#      joining a running batch against batch by batch.
# Everything it prints, and the benchmark's table, goes to $OUT (default /tmp/gpu-check).
#   tools/gpu_check.sh [--skip-build] [--skip-tests] [--skip-bench] [--types f16,q8_0]
# Before, on the machine with the network (the carry is build/gpu-carry, ~47 MB; with the working tree
# it must stay under the device tool's 64 MiB):
#   tools/build_cuda.sh 90 --ggml-only             # ~25 min on 2 cores
#   tools/gpu_check.sh --prepare [--python 3.12]   # the wheels + Transformers for the device's Python
# Uses the machine's python3 (PYTHON=...) with its numpy/torch/tokenizers; needs nvcc's toolkit
# (cuBLAS, the CUDA runtime) and cmake/ninja on PATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
py="${PYTHON:-python3}"
case "$py" in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac  # absolute, links kept
arch="${CUDA_ARCH:-90}"
carry=build/gpu-carry
skip_build="" skip_tests="" skip_bench="" types="f16,q8_0" prepare="" pyver="3.12"
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) skip_build=1 ;; --skip-tests) skip_tests=1 ;; --skip-bench) skip_bench=1 ;;
    --types) types="$2"; shift ;;
    --prepare) prepare=1 ;; --python) pyver="$2"; shift ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$prepare" ]; then
  # What the device lacks (its own Python has numpy, torch, tokenizers, huggingface_hub, tqdm, pyyaml):
  # binary wheels for its Python, and Transformers 5.23 without the ~400 model families the tests never
  # import (13 MB -> 1.5 MB).
  mkdir -p "$carry/wheels"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d "$carry/wheels" \
    kaldi-native-fbank soundfile cffi pycparser soxr gguf || exit 1
  tmp="$(mktemp -d)"
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "transformers==5.23.0" || exit 1
  (cd "$tmp" && "$py" -m zipfile -e transformers-*.whl x >/dev/null && cd x \
     && find transformers/models -mindepth 1 -maxdepth 1 -type d \
          ! -name auto ! -name fun_asr_nano ! -name qwen3 -exec rm -rf {} + \
     && tar -cJf transformers-5.23.0-slim.tar.xz transformers transformers-5.23.0.dist-info) || exit 1
  mv "$tmp/x/transformers-5.23.0-slim.tar.xz" "$carry/"
  rm -rf "$tmp"
  ls -la "$carry" "$carry/wheels"
  exit 0
fi

t0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - t0 )) s] $*"; }
status=0

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
"$py" -V; nproc; command -v nvcc cmake ninja

deps=/tmp/fun-asr-deps
if [ -z "$skip_build" ]; then
  step "Python packages from $carry/wheels"
  "$py" -m pip install -q --upgrade --no-index --no-deps --disable-pip-version-check --target "$deps" "$carry"/wheels/*.whl \
    || { echo "gpu_check: wheels failed"; exit 1; }
  # Transformers 5.23 (the parity reference), pruned to the model families the tests use
  "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    "$(ls "$carry"/transformers-*-slim.tar.xz | head -n1)" "$deps" || { echo "gpu_check: no Transformers"; exit 1; }

  step "ggml (CUDA sm_$arch, prebuilt) and fun-asr's own sources"
  ggml=build/gpu-ggml
  rm -rf "$ggml" && mkdir -p "$ggml"
  "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    "$carry/ggml-cuda-sm$arch.tar.xz" "$ggml" || { echo "gpu_check: no $carry/ggml-cuda-sm$arch.tar.xz"; exit 1; }
  cuda_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFUN_ASR_CUDA=ON -DFUN_ASR_NATIVE=OFF \
    -DFUN_ASR_GGML_PREBUILT_DIR="$PWD/$ggml" -DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON \
    -DPython_EXECUTABLE="$(command -v "$py")" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
    > "$OUT/cmake_configure.log" 2>&1 || { tail -40 "$OUT/cmake_configure.log"; exit 1; }
  cmake --build build/gpu --target _core _spin -j "$(nproc)" > "$OUT/cmake_build.log" 2>&1 \
    || { grep -E "error|Error" "$OUT/cmake_build.log" | head -40; tail -20 "$OUT/cmake_build.log"; exit 1; }
  # the package as pip would install it, beside the wheels (the working tree is left as it is)
  rm -rf "$deps/fun_asr" && cp -r python/fun_asr "$deps/"
  cmake --install build/gpu --prefix "$deps" > "$OUT/cmake_install.log" 2>&1 \
    || { tail -20 "$OUT/cmake_install.log"; exit 1; }
fi
export PYTHONPATH="$deps:$PWD/tools${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "import fun_asr, json; i = fun_asr.system_info(); print(json.dumps({k: i[k] for k in ('compiled_backends', 'registered_backends', 'devices')}, indent=1))" \
  || { echo "gpu_check: fun_asr does not import"; exit 1; }

if [ -z "$skip_tests" ]; then
  step "GPU test cases"
  "$py" -m pytest -q -p no:cacheprovider -rfEs --durations=10 -o tmp_path_retention_policy=none \
    --junitxml="$OUT/junit.xml" -k cuda \
    tests/test_model_parity.py tests/test_gpu.py tests/test_batch_invariance.py tests/test_packed_encoding.py \
    || status=1
fi

if [ -z "$skip_bench" ]; then
  step "benchmark (full-size random model: $types)"
  "$py" tools/bench.py --gpu --device cuda --types "$types" --tokens 40 --repeats 3 --work /tmp/fun-asr-bench \
    --out "$OUT/benchmarks_cuda.md" || status=1
  "$py" tools/bench.py --batch-split --device cuda --types "${types%%,*}" --work /tmp/fun-asr-bench \
    --out "$OUT/benchmarks_batch.md" || status=1
  # the server's decoder with and without requests joining a running batch
  timeout 300 "$py" tools/arrivals_bench.py --model "/tmp/fun-asr-bench/full-${types%%,*}.gguf" --device cuda \
    --requests 64 --interval-ms 20 --max-new-tokens 40 > "$OUT/arrivals.md" || status=1
  nvidia-smi --query-gpu=name,memory.used --format=csv
fi
step "done (status $status)"
exit $status
