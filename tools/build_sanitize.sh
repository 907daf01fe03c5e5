#!/usr/bin/env bash
# Builds fun_asr._core (our C++ and the whole of ggml) with AddressSanitizer + UndefinedBehaviorSanitizer into
# a separate build folder and runs tests against it, without touching the installed package: a
# sitecustomize.py in the build folder makes `import fun_asr._core` load the sanitized library (every other
# module comes from the normal install), and libasan is preloaded (python itself is not instrumented).
#
#   tools/build_sanitize.sh                      # build, then the native-heavy tests (list below)
#   tools/build_sanitize.sh --all                # build, then the whole test suite
#   tools/build_sanitize.sh --build-only         # build only; prints the environment to use it by hand
#   tools/build_sanitize.sh --fuzz 120           # build, then every fuzz harness for 120 s each on it
#   tools/build_sanitize.sh tests/test_core.py   # build, then these pytest arguments
#
# Reports go to $FUN_ASR_SANITIZE_BUILD/reports/{asan,ubsan}.<pid>; the script prints how many and exits 1
# when there is any report or a test failed. Options: ASan halt_on_error=0 (built with
# -fsanitize-recover=address, so one run collects every report), detect_leaks=0 (CPython and numpy keep
# allocations to exit by design: leak reports would be theirs), UBSan print_stacktrace=1, halt_on_error=0.
# Environment: FUN_ASR_SANITIZE_BUILD (default build/sanitize), PYTHON (default: python on PATH), JOBS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUN_ASR_SANITIZE_BUILD:-$ROOT/build/sanitize}"
PY="${PYTHON:-python}"
JOBS="${JOBS:-2}"
NATIVE_TESTS=(tests/test_core.py tests/test_fuzz_regressions.py tests/test_model_parity.py tests/test_batch.py
              tests/test_convert.py tests/test_vad_reference.py tests/test_vad_session.py tests/test_stream.py
              tests/test_limits.py tests/test_session.py tests/test_ctc.py tests/test_torch_pickle.py
              tests/test_user_trial.py)

mode=tests
fuzz_seconds=0
args=()
while (($#)); do
  case "$1" in
    --build-only) mode=build ;;
    --all) mode=all ;;
    --fuzz) mode=fuzz; fuzz_seconds="$2"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

SAN="-fsanitize=address,undefined -fsanitize-recover=address -fno-omit-frame-pointer -g"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
  > "$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" --target _core -j "$JOBS"
CORE="$(ls "$BUILD"/_core.*.so | head -1)"

mkdir -p "$BUILD/overlay" "$BUILD/reports"
cat > "$BUILD/overlay/sitecustomize.py" <<EOF
# Written by tools/build_sanitize.sh: fun_asr._core comes from the sanitizer build.
import importlib.machinery
import importlib.util
import sys

_CORE = "$CORE"


class _SanitizedCore:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "fun_asr._core":
            return None
        return importlib.util.spec_from_file_location(name, _CORE,
                                                      loader=importlib.machinery.ExtensionFileLoader(name, _CORE))


sys.meta_path.insert(0, _SanitizedCore)
EOF

# Other programs the tests start (espeak-ng and sox make speech clips) run without the ASan runtime: espeak-ng
# hangs with libasan preloaded. Shims first on PATH drop LD_PRELOAD for them.
mkdir -p "$BUILD/overlay/bin"
for tool in espeak-ng sox; do
  real="$(command -v "$tool" || true)"
  [[ -n "$real" ]] || continue
  printf '#!/bin/sh\nunset LD_PRELOAD\nexec %q "$@"\n' "$real" > "$BUILD/overlay/bin/$tool"
  chmod +x "$BUILD/overlay/bin/$tool"
done
export PATH="$BUILD/overlay/bin:$PATH"

REPORTS="$BUILD/reports"
# libstdc++ right after libasan: ASan's __cxa_throw interceptor must find the real one at start-up (python does
# not link libstdc++, so otherwise every C++ exception ends in "CHECK failed: real___cxa_throw")
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=0:abort_on_error=0:allocator_may_return_null=1:detect_odr_violation=0:log_path=$REPORTS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:log_path=$REPORTS/ubsan"
export PYTHONPATH="$BUILD/overlay${PYTHONPATH:+:$PYTHONPATH}"
export FUN_ASR_SANITIZED=1

got="$("$PY" -c 'import fun_asr._core as c; print(c.__file__)')"
if [[ "$got" != "$CORE" ]]; then
  echo "build_sanitize.sh: fun_asr._core loads from $got, not the sanitizer build $CORE" >&2
  exit 1
fi
if [[ "$mode" == build ]]; then
  echo "sanitizer build: $CORE"
  echo "use it with:"
  echo "  LD_PRELOAD='$LD_PRELOAD' ASAN_OPTIONS='$ASAN_OPTIONS' UBSAN_OPTIONS='$UBSAN_OPTIONS' PYTHONPATH='$PYTHONPATH' $PY ..."
  exit 0
fi

rm -f "$REPORTS"/asan.* "$REPORTS"/ubsan.*
cd "$ROOT"
status=0
if [[ "$mode" == fuzz ]]; then
  for h in tools/fuzz/fuzz_*.py; do
    name="$(basename "$h" .py)"
    echo "== $name (${fuzz_seconds} s, sanitized core)"
    nice -n 5 "$PY" "$h" -max_total_time="$fuzz_seconds" -rss_limit_mb=8192 -timeout=120 \
      --corpus "$BUILD/fuzz-corpus/${name#fuzz_}" > "$REPORTS/$name.log" 2>&1 || status=$?
    grep -E "^(stat::number_of_executed_units|stat::average_exec_per_sec)|ERROR: libFuzzer|Uncaught" \
      "$REPORTS/$name.log" || true
  done
else
  if [[ "$mode" == all ]]; then tests=(tests); elif ((${#args[@]})); then tests=("${args[@]}"); else tests=("${NATIVE_TESTS[@]}"); fi
  nice -n 5 "$PY" -m pytest -q -p no:cacheprovider "${tests[@]}" || status=$?
fi

asan=$(cat "$REPORTS"/asan.* 2>/dev/null | grep -c "ERROR: AddressSanitizer" || true)
ubsan=$(cat "$REPORTS"/ubsan.* 2>/dev/null | grep -c "runtime error:" || true)
echo "sanitizer reports: AddressSanitizer $asan, UndefinedBehaviorSanitizer $ubsan (in $REPORTS)"
if ((asan + ubsan)); then
  cat "$REPORTS"/asan.* "$REPORTS"/ubsan.* 2>/dev/null | grep -E "ERROR: AddressSanitizer|runtime error:" | sort | uniq -c | head -40
  exit 1
fi
exit "$status"
