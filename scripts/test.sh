#!/usr/bin/env bash
# Install everything the tests need and run them: ./scripts/test.sh [pytest args...]
# Works from a fresh clone and again and again: creates .venv if absent, installs the build tools into it,
# installs the project (editable, without build isolation: build/<wheel tag>/ keeps its compiled objects,
# so a second run recompiles only what changed), the FunASR reference stack and espeak-ng/sox, then runs
# `ruff check python tests tools` and `python -m pytest -q --durations=25 "$@"` (the 25 slowest tests listed:
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

# The project with the test extra, built against the tools above (no isolated build environment, whose
# path changes each time and makes CMake recompile everything). Editable: python/ is imported in place,
# so Python edits need no reinstall; C++ edits do (rerun this script: it recompiles only what changed).
t=$(date +%s)
python -m pip install -q --no-build-isolation -e ".[test]"
echo "test.sh: project install took $(( $(date +%s) - t )) s"

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
python -m pytest -q --durations=25 "$@"
echo "test.sh: total $(( $(date +%s) - start )) s"
