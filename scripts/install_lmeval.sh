#!/usr/bin/env bash
# lm-evaluation-harness in a virtual environment of its own, .venv-lmeval: a client of `verispec serve` (it needs a
# newer huggingface_hub than the project's transformers pin allows, so it does not share the main environment).
# transformers there only tokenizes (lm-eval's huggingface tokenizer backend); no torch is installed.
#   bash scripts/install_lmeval.sh && python benchmarks/lm_eval_server.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LMEVAL_VENV:-.venv-lmeval}
source scripts/venv.sh
$V -m pip install --disable-pip-version-check -q "lm-eval[api]==0.4.13" "transformers>=4.57,<5.21"
$V -c "import lm_eval, transformers; print('lm-eval', lm_eval.__version__, 'transformers', transformers.__version__)"
