#!/usr/bin/env bash
# Install everything the tests need and run them: ./scripts/test.sh [pytest args...]
# Works from a fresh clone and again and again: creates .venv if absent, installs the build tools into it,
# installs the project (editable, without build isolation: build/<wheel tag>/ keeps its compiled objects,
# so a second run recompiles only what changed), the FunASR reference stack and espeak-ng/sox, then runs
# `ruff check python tests tools` and `python -m pytest -q -rs --durations=25 "$@"` (the 25 slowest tests listed:
# the CI time budget). Any failure fails the script; pytest's
# exit code 5 (no tests collected) fails it too.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
[ -d .venv ] || python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate

# Build tools: pyproject.toml's [build-system] requires (keep in sync), plus CMake/ninja only where the
# machine lacks a suitable one (scikit-build-core's own answer, what pip's isolated build would add).
python -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" pip
mapfile -t extra < <(python -c 'from scikit_build_core.build import get_requires_for_build_wheel as r; [print(x) for x in r()]')
[ "${#extra[@]}" -eq 0 ] || python -m pip install -q "${extra[@]}"

# Debian's packages for ggml's Vulkan backend (shader compiler, headers) and Mesa's lavapipe (a Vulkan driver that
# runs on the CPU: the Vulkan tests' device), and qemu-user (the AVX2-only CPU of the portable wheel's test).
apt_get() {
  apt-get install -y -q "$@" >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null)
}
if ! command -v glslc >/dev/null || [ ! -f /usr/include/vulkan/vulkan.h ] || [ ! -d /usr/include/spirv ] \
   || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  apt_get glslc libvulkan-dev spirv-headers mesa-vulkan-drivers \
    || echo "test.sh: WARNING: could not install the Vulkan packages; the build has no Vulkan backend, its tests skip"
fi
# Debian 12's own lavapipe (Mesa 22.3.6) corrupts memory under ggml's Vulkan backend (docs/vulkan.md): fun-asr keeps
# it out (`--device vulkan` refuses it, the Vulkan cases skip naming it). Where FUN_ASR_TEST_REQUIRE names vulkan
# (CI), the Vulkan cases must run: Mesa 25's lavapipe comes from bookworm-backports for them.
if [[ ",${FUN_ASR_TEST_REQUIRE:-}," == *,vulkan,* ]] && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null \
   && ! dpkg --compare-versions "$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo 0)" ge 25; then
  echo "test.sh: FUN_ASR_TEST_REQUIRE names vulkan: installing Mesa 25's lavapipe from bookworm-backports"
  echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/fun-asr-backports.list
  (apt-get update -q >/dev/null && apt-get install -y -q -t bookworm-backports mesa-vulkan-drivers >/dev/null) \
    || echo "test.sh: WARNING: could not install Mesa 25's lavapipe from bookworm-backports"
fi
command -v qemu-x86_64 >/dev/null || apt_get qemu-user \
  || echo "test.sh: WARNING: could not install qemu-user; the AVX2-only test of the wheel will be skipped"

# The project with the test extra, built against the tools above (no isolated build environment, whose
# path changes each time and makes CMake recompile everything). Editable: python/ is imported in place,
# so Python edits need no reinstall; C++ edits do (rerun this script: it recompiles only what changed).
# The build is the portable one a wheel ships (FUN_ASR_PORTABLE: ggml's CPU variants and GPU backends as modules
# loaded at run time), with ggml's Vulkan backend where this machine can compile it. FUN_ASR_BUILD_DIR: where the
# build keeps its objects (default build/portable-<wheel tag>; .ci/run points it at a cache that outlives the clone).
default_build_dir='build/portable-{wheel_tag}'
build_dir="${FUN_ASR_BUILD_DIR:-$default_build_dir}"
build=(-C cmake.define.FUN_ASR_PORTABLE=ON -C "build-dir=$build_dir")
if command -v glslc >/dev/null && [ -f /usr/include/vulkan/vulkan.h ] && [ -d /usr/include/spirv ]; then
  build+=(-C cmake.define.GGML_VULKAN=ON)
fi
t=$(date +%s)
if ! python -m pip install -q --no-build-isolation -e ".[test]" "${build[@]}"; then
  [ -n "${FUN_ASR_BUILD_DIR:-}" ] && [ -d "$FUN_ASR_BUILD_DIR" ] || exit 1
  echo "test.sh: the build in $FUN_ASR_BUILD_DIR failed; building again from scratch"
  rm -rf "$FUN_ASR_BUILD_DIR"
  python -m pip install -q --no-build-isolation -e ".[test]" "${build[@]}"
fi
echo "test.sh: project install took $(( $(date +%s) - t )) s"
# The wheel of that build (the same objects: seconds), which tests/test_wheel.py installs into a fresh venv.
t=$(date +%s)
rm -rf build/dist
python -m pip wheel -q --no-build-isolation --no-deps -w build/dist . "${build[@]}"
FUN_ASR_TEST_WHEEL="$(ls "$PWD"/build/dist/fun_asr-*.whl)"
export FUN_ASR_TEST_WHEEL
echo "test.sh: wheel $(basename "$FUN_ASR_TEST_WHEEL") ($(du -m "$FUN_ASR_TEST_WHEEL" | cut -f1) MB) took $(( $(date +%s) - t )) s"

# The FunASR 1.4.16 reference stack (--no-deps: funasr's own requirements pull modelscope, hydra, umap, ...;
# the VAD/LLM reference paths need only these) and the tools that make speech clips for the tests.
python -m pip install -q --no-deps funasr==1.4.16 omegaconf==2.4.0 kaldiio==2.18.1 librosa==0.11.0 lazy_loader==0.6 tiktoken==0.14.0 six==1.17.0
if ! command -v espeak-ng >/dev/null || ! command -v sox >/dev/null; then
  (apt-get install -y -q espeak-ng sox >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q espeak-ng sox >/dev/null)) \
    || echo "test.sh: WARNING: could not install espeak-ng/sox; the speech-clip tests will be skipped"
fi
# Debian's chromium for the web page's browser tests (tests/test_web.py, driven by the playwright pip package
# with this browser as its executable; playwright's own browser download is never used).
if ! command -v chromium >/dev/null; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
    || echo "test.sh: WARNING: could not install chromium; the browser tests will be skipped"
fi
echo "test.sh: install took $(( $(date +%s) - start )) s"

ruff check python tests tools
# ggml lists a software Vulkan driver (lavapipe) only when this names it; fun-asr's "auto" device never takes
# one, the Vulkan tests' "vulkan" does. (Read when fun_asr is imported: it must be set before pytest starts.)
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES-0}"
python -m pytest -q -rs --durations=25 "$@"
echo "test.sh: total $(( $(date +%s) - start )) s"
