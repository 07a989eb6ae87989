#!/usr/bin/env bash
# Build llama-cpp-python (requirements-fast.txt) for the CPU this runs on, then check the build by decoding one
# token. Never fails the install: a failed build or check prints one line and leaves the transformers path.
#
#   bash scripts/build_llamacpp.sh            build if llama_cpp is missing (or its check fails)
#   bash scripts/build_llamacpp.sh --force    rebuild
#   bash scripts/build_llamacpp.sh --flags    print the CMake flags chosen for this CPU and exit
#
# The x86 extensions are read from /proc/cpuinfo and named one by one (GGML_NATIVE=OFF), so the build never uses an
# instruction the CPU lacks. AMX is always off: on this project's Intel VMs the CPU advertises AMX, ggml's AMX
# matmul compiles, and the first llama_decode dies with SIGILL at `tilezero` even with tile permission granted.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

cpu_flags() { grep -m1 '^flags' "${CPUINFO:-/proc/cpuinfo}" 2>/dev/null | cut -d: -f2; }  # CPUINFO: tests

cmake_args() {
  local have=" $(cpu_flags) " args="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF"
  args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  on() { case "$have" in *" $1 "*) echo "ON" ;; *) echo "OFF" ;; esac; }
  args+=" -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c)"
  args+=" -DGGML_BMI2=$(on bmi2) -DGGML_AVX_VNNI=$(on avx_vnni)"
  # AVX-512: the foundation, byte/word and vector-length subsets are all ggml's AVX512 path needs
  local avx512=OFF
  [ "$(on avx512f)$(on avx512bw)$(on avx512vl)$(on avx512dq)" = "ONONONON" ] && avx512=ON
  args+=" -DGGML_AVX512=$avx512"
  if [ "$avx512" = ON ]; then
    args+=" -DGGML_AVX512_VBMI=$(on avx512vbmi) -DGGML_AVX512_VNNI=$(on avx512_vnni)"
    args+=" -DGGML_AVX512_BF16=$(on avx512_bf16)"
  else
    args+=" -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
  fi
  echo "$args"
}

check() {
  # decode one token of the target GGUF (if installed) or just load the library
  $PY - <<'EOF'
import sys, time
import llama_cpp  # noqa: F401
from verispec.models import DEFAULT_TARGET, gguf_path
path = gguf_path(DEFAULT_TARGET)
if not path.exists():
    print("llama.cpp: library loads (no target GGUF to decode with yet)")
    sys.exit(0)
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, verbose=False)
out = llm("def add(a, b):", max_tokens=1, temperature=0.0)
print(f"llama.cpp: decoded {out['choices'][0]['text']!r} with the target in {time.perf_counter() - t0:.1f} s")
EOF
}

if [ "${1:-}" = "--flags" ]; then cmake_args; exit 0; fi
if [ "${1:-}" != "--force" ] && $PY -c "import llama_cpp" 2>/dev/null && check; then exit 0; fi
if ! command -v cmake >/dev/null 2>&1 && ! $PY -c "import cmake" 2>/dev/null; then
  : # pip brings cmake through the build requirements of llama-cpp-python
fi
start=$(date +%s)
echo "llama.cpp: building llama-cpp-python for this CPU (several minutes; flags: $(cmake_args))"
if CMAKE_ARGS="$(cmake_args)" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
   $PY -m pip install --disable-pip-version-check -q --no-cache-dir --force-reinstall --no-deps \
   -r requirements-fast.txt >/tmp/verispec-llamacpp-build.log 2>&1 \
   && $PY -m pip install --disable-pip-version-check -q -r requirements-fast.txt >>/tmp/verispec-llamacpp-build.log 2>&1; then
  echo "llama.cpp: built in $(( $(date +%s) - start )) s"
  if check; then exit 0; fi
  echo "llama.cpp: the build does not run here; uninstalling it (verispec uses the transformers backends)"
  $PY -m pip uninstall -y -q llama-cpp-python >/dev/null 2>&1
else
  echo "llama.cpp: build failed after $(( $(date +%s) - start )) s (log: /tmp/verispec-llamacpp-build.log);" \
       "verispec uses the transformers backends"
fi
exit 0
