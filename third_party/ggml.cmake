# ggml, fetched from the package index at build time — never committed.
#
# The pinned sdist of ggml-python vendors ggml's source under vendor/ggml. We download that sdist
# with pip, check its sha256 against the pin below, and extract vendor/ggml into a per-user cache
# keyed by the hash, so later builds (and offline builds after the first) skip the download.
# A local ggml tree can be given instead: -DFUN_ASR_GGML_SOURCE_DIR=... or the environment
# variable FUN_ASR_GGML_SOURCE_DIR.

set(FUN_ASR_GGML_PYPI_PACKAGE "ggml-python")
set(FUN_ASR_GGML_PYPI_VERSION "0.0.45")
set(FUN_ASR_GGML_SDIST_SHA256 "10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05")
set(FUN_ASR_GGML_EXPECTED_VERSION "0.15.3")

set(FUN_ASR_GGML_SOURCE_DIR "$ENV{FUN_ASR_GGML_SOURCE_DIR}" CACHE PATH
    "Use this local ggml source tree instead of downloading the pinned sdist")

function(fun_asr_cache_root out)
  if(DEFINED ENV{FUN_ASR_CACHE_DIR} AND NOT "$ENV{FUN_ASR_CACHE_DIR}" STREQUAL "")
    set(root "$ENV{FUN_ASR_CACHE_DIR}")
  elseif(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    set(root "$ENV{XDG_CACHE_HOME}/fun-asr")
  elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "")
    set(root "$ENV{HOME}/.cache/fun-asr")
  elseif(DEFINED ENV{LOCALAPPDATA})
    set(root "$ENV{LOCALAPPDATA}/fun-asr/cache")
  else()
    set(root "${CMAKE_BINARY_DIR}/fun-asr-cache")
  endif()
  set(${out} "${root}" PARENT_SCOPE)
endfunction()

function(fun_asr_fetch_ggml out_dir)
  fun_asr_cache_root(cache_root)
  set(dest "${cache_root}/ggml/${FUN_ASR_GGML_SDIST_SHA256}")
  if(EXISTS "${dest}/ggml/CMakeLists.txt")
    message(STATUS "fun-asr: ggml from cache ${dest}/ggml")
    set(${out_dir} "${dest}/ggml" PARENT_SCOPE)
    return()
  endif()

  if(NOT Python_EXECUTABLE)
    message(FATAL_ERROR "fun-asr: a Python interpreter is needed to download ggml (find_package(Python) first)")
  endif()
  set(work "${CMAKE_BINARY_DIR}/_ggml_download")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${work}")
  message(STATUS "fun-asr: downloading ${FUN_ASR_GGML_PYPI_PACKAGE}==${FUN_ASR_GGML_PYPI_VERSION} (sdist) from the package index")
  # --no-build-isolation: pip still prepares the sdist's metadata; in isolation it would build its
  # build requirements (cmake!) from source because of --no-binary :all:. Our own build environment
  # already holds scikit-build-core, which is all the sdist's metadata step needs.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -m pip download --no-deps --no-binary :all: --no-build-isolation
            --disable-pip-version-check -d "${work}"
            "${FUN_ASR_GGML_PYPI_PACKAGE}==${FUN_ASR_GGML_PYPI_VERSION}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(GLOB sdist "${work}/*.tar.gz")
  list(LENGTH sdist n)
  if(NOT rc EQUAL 0 OR NOT n EQUAL 1)
    message(FATAL_ERROR
      "fun-asr: could not download ${FUN_ASR_GGML_PYPI_PACKAGE}==${FUN_ASR_GGML_PYPI_VERSION} with "
      "`${Python_EXECUTABLE} -m pip download` (exit ${rc}).\n${err}\n"
      "Offline? Point the build at a local ggml ${FUN_ASR_GGML_EXPECTED_VERSION} source tree with "
      "-DFUN_ASR_GGML_SOURCE_DIR=/path/to/ggml or the environment variable FUN_ASR_GGML_SOURCE_DIR.")
  endif()
  file(SHA256 "${sdist}" got)
  if(NOT got STREQUAL FUN_ASR_GGML_SDIST_SHA256)
    message(FATAL_ERROR
      "fun-asr: sha256 mismatch for ${sdist}\n  expected ${FUN_ASR_GGML_SDIST_SHA256}\n  got      ${got}\n"
      "Refusing to build with an unverified ggml.")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${sdist}" DESTINATION "${work}/x")
  set(vendored "${work}/x/ggml_python-${FUN_ASR_GGML_PYPI_VERSION}/vendor/ggml")
  if(NOT EXISTS "${vendored}/CMakeLists.txt")
    message(FATAL_ERROR "fun-asr: ${sdist} has no vendor/ggml/CMakeLists.txt")
  endif()
  # Move into place through a unique temporary name so concurrent builds never see half a tree.
  string(RANDOM LENGTH 8 tag)
  file(MAKE_DIRECTORY "${dest}")
  file(RENAME "${vendored}" "${dest}/ggml.tmp-${tag}")
  file(RENAME "${dest}/ggml.tmp-${tag}" "${dest}/ggml" RESULT mv_rc)
  if(NOT mv_rc EQUAL 0)  # another build got there first
    file(REMOVE_RECURSE "${dest}/ggml.tmp-${tag}")
  endif()
  file(REMOVE_RECURSE "${work}")
  message(STATUS "fun-asr: ggml cached at ${dest}/ggml")
  set(${out_dir} "${dest}/ggml" PARENT_SCOPE)
endfunction()

# ggml's backend options pass through as given (-DGGML_CUDA=ON, -DGGML_VULKAN=ON, -DGGML_METAL=ON): every backend
# ggml builds registers itself and is a device at run time. FUN_ASR_CUDA=ON is the older spelling of GGML_CUDA=ON.
if(FUN_ASR_CUDA)
  set(GGML_CUDA ON CACHE BOOL "" FORCE)
endif()

# A ggml already built and installed (`cmake --install`, static libraries) can be linked instead of
# building one: -DFUN_ASR_GGML_PREBUILT_DIR=PREFIX or the environment variable of that name. Its
# options are its own (CUDA architectures, CPU flags); tools/build_cuda.sh --ggml-only makes one, so
# the long CUDA compile can happen on another machine than the one that builds the extension.
set(FUN_ASR_GGML_PREBUILT_DIR "$ENV{FUN_ASR_GGML_PREBUILT_DIR}" CACHE PATH
    "Link the ggml installed under this prefix (static libraries) instead of building it")
if(FUN_ASR_GGML_PREBUILT_DIR)
  find_package(ggml CONFIG REQUIRED PATHS "${FUN_ASR_GGML_PREBUILT_DIR}" NO_DEFAULT_PATH)
  if(NOT GGML_VERSION VERSION_EQUAL FUN_ASR_GGML_EXPECTED_VERSION)
    message(WARNING "fun-asr: prebuilt ggml ${GGML_VERSION}; fun-asr is tested with ${FUN_ASR_GGML_EXPECTED_VERSION}")
  endif()
  set(_prebuilt ggml ggml-base ggml-cpu)
  if(GGML_CUDA)
    list(APPEND _prebuilt ggml-cuda)
  endif()
  foreach(_t IN LISTS _prebuilt)
    if(NOT TARGET ggml::${_t})
      message(FATAL_ERROR "fun-asr: the ggml under ${FUN_ASR_GGML_PREBUILT_DIR} has no ${_t} library")
    endif()
    add_library(${_t} INTERFACE)
    target_link_libraries(${_t} INTERFACE ggml::${_t})
  endforeach()
  if(GGML_CUDA)
    # ggml's package config adds the CUDA runtime and cuBLAS only to a GGML_STATIC build; ours links
    # them as shared libraries (ggml-cuda's own choice when GGML_STATIC is off).
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(ggml-cuda INTERFACE CUDA::cudart CUDA::cublas CUDA::cublasLt)
  endif()
  message(STATUS "fun-asr: prebuilt ggml ${GGML_VERSION} from ${FUN_ASR_GGML_PREBUILT_DIR}")
  return()
endif()

if(FUN_ASR_GGML_SOURCE_DIR)
  if(NOT EXISTS "${FUN_ASR_GGML_SOURCE_DIR}/CMakeLists.txt")
    message(FATAL_ERROR "fun-asr: FUN_ASR_GGML_SOURCE_DIR=${FUN_ASR_GGML_SOURCE_DIR} is not a ggml source tree (no CMakeLists.txt)")
  endif()
  set(FUN_ASR_GGML_DIR "${FUN_ASR_GGML_SOURCE_DIR}")
  message(STATUS "fun-asr: ggml from local tree ${FUN_ASR_GGML_DIR}")
else()
  fun_asr_fetch_ggml(FUN_ASR_GGML_DIR)
endif()

# ggml build configuration: static, position independent (linked into a Python extension),
# no tests/examples, CPU always, CUDA on request.
set(GGML_STATIC OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
set(GGML_CPU ON CACHE BOOL "" FORCE)
if(FUN_ASR_PORTABLE)
  # Shared ggml and ggml-base, and every backend a module (the CPU in each x86 variant: ggml loads the best one
  # the running CPU takes), installed beside the extension, which finds them through $ORIGIN.
  set(BUILD_SHARED_LIBS ON CACHE BOOL "" FORCE)
  set(GGML_BACKEND_DL ON CACHE BOOL "" FORCE)
  set(GGML_CPU_ALL_VARIANTS ON CACHE BOOL "" FORCE)
  set(GGML_NATIVE OFF CACHE BOOL "" FORCE)
  set(CMAKE_INSTALL_RPATH "$ORIGIN")
  set(CMAKE_BUILD_RPATH "$ORIGIN")
else()
  set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
  set(GGML_BACKEND_DL OFF CACHE BOOL "" FORCE)
  set(GGML_CPU_ALL_VARIANTS OFF CACHE BOOL "" FORCE)
  set(GGML_NATIVE ${FUN_ASR_NATIVE} CACHE BOOL "" FORCE)
endif()
set(GGML_ALL_WARNINGS OFF CACHE BOOL "" FORCE)
# llamafile's tinyBLAS kernels: much faster F32/F16/Q8_0 GEMM on x86 (off by default in standalone ggml)
set(GGML_LLAMAFILE ON CACHE BOOL "" FORCE)
set(GGML_CCACHE ON CACHE BOOL "")
set(CMAKE_POSITION_INDEPENDENT_CODE ON)

add_subdirectory("${FUN_ASR_GGML_DIR}" "${CMAKE_BINARY_DIR}/ggml" EXCLUDE_FROM_ALL)
file(STRINGS "${FUN_ASR_GGML_DIR}/CMakeLists.txt" _ggml_ver REGEX "^set\\(GGML_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE "[^0-9;]" "" _ggml_ver "${_ggml_ver}")
string(REPLACE ";" "." _ggml_ver "${_ggml_ver}")
if(NOT _ggml_ver STREQUAL FUN_ASR_GGML_EXPECTED_VERSION)
  message(WARNING "fun-asr: building against ggml ${_ggml_ver}; fun-asr is tested with ${FUN_ASR_GGML_EXPECTED_VERSION}")
endif()

# ggml 0.15.3's Vulkan backend uses VK_EXT_layer_settings' C++ types unconditionally; Vulkan headers older than
# 1.3.272 (Debian 12's 1.3.239) lack them: cmake/vulkan_compat adds them to that one source file.
if(TARGET ggml-vulkan)
  set_source_files_properties("${FUN_ASR_GGML_DIR}/src/ggml-vulkan/ggml-vulkan.cpp" TARGET_DIRECTORY ggml-vulkan
    PROPERTIES COMPILE_OPTIONS "-include;${CMAKE_CURRENT_LIST_DIR}/../cmake/vulkan_compat/ggml_vulkan_compat.h")
endif()

# With -march=native on a CPU that has AVX512-FP16 (Sapphire Rapids and later), ggml 0.15.3's F16
# dot products accumulate in half precision (simd-mappings.h, __AVX512FP16__): F16 logits come out
# rounded to F16 and miss the reference by 2.6e-3 where F32 accumulation gives < 2e-3. Keep F32
# accumulation everywhere: the CPU backend is compiled without that extension.
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-mno-avx512fp16 FUN_ASR_HAS_NO_AVX512FP16)
if(FUN_ASR_HAS_NO_AVX512FP16)
  foreach(_cpu IN ITEMS ggml-cpu LISTS GGML_AVAILABLE_BACKENDS)  # (the portable build's CPU variants too)
    if(TARGET ${_cpu} AND _cpu MATCHES "^ggml-cpu")
      target_compile_options(${_cpu} PRIVATE -mno-avx512fp16)
    endif()
  endforeach()
endif()
