# Sourced by the install scripts of the side environments (vLLM, lm-eval), after `cd` to the repository: makes or
# reuses the virtual environment $VENV with $PYTHON (default python3), brings its pip up to date, and sets V to its
# python.
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
V="$VENV/bin/python"
$V -m pip install --disable-pip-version-check -q --upgrade pip
