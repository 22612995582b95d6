#!/usr/bin/env bash
# Builds llama.cpp's libraries with AVX2 and no AVX-512 from the llama-cpp-python 0.3.36
# sdist, so that our AVX2 path (`--kernel avx2`) is compared with llama.cpp's AVX2 kernels
# on a machine whose native build would use AVX-512. About 5 minutes on 2 cores.
#
#   bench/build_llamacpp_avx2.sh SDIST_DIR OUT_DIR     # SDIST_DIR: the unpacked sdist
#   LLAMA_CPP_LIB_PATH=OUT_DIR/bin python3 bench/bench_vs_llamacpp.py --kernel avx2 ...
set -euo pipefail
sdist=${1:?usage: build_llamacpp_avx2.sh SDIST_DIR OUT_DIR}
out=${2:?usage: build_llamacpp_avx2.sh SDIST_DIR OUT_DIR}
command -v cmake >/dev/null || { echo "cmake is missing (pip install cmake ninja)" >&2; exit 1; }
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake "${gen[@]}" -S "$sdist/vendor/llama.cpp" -B "$out" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF
cmake --build "$out" --target llama -j "$(nproc)"
LLAMA_CPP_LIB_PATH="$out/bin" python3 -c \
  'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())'
