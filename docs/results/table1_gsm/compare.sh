#!/usr/bin/env bash
# Regenerates gaps.md / gaps.csv (every paired gap of this run, 95% paired cluster bootstrap over problems) from the
# committed results: each setting vs lossless, the two realizations of adaptive interpolation against each other,
# each against the overshoot ceiling at equal lam, CoS-WE's trend (residual lam 0.2 - lam 0.6 and - lam 0.8), and the
# ceiling at lam 0.2 against adaptive interpolation at lam 0.6 (the nearest block efficiencies across settings).
set -euo pipefail
R=docs/results/table1_gsm
P=()
for lam in 0.2 0.4 0.6 0.8; do
  AI="adaptive-interpolation(lam=$lam)"; RS="adaptive-interpolation(lam=$lam, realization=residual)"
  OC="overshoot-ceiling(lam=$lam)"
  P+=(--pair "$AI=lossless" --pair "$RS=lossless" --pair "$OC=lossless"
      --pair "$RS=$AI" --pair "$AI=$OC" --pair "$RS=$OC")
done
for lam in 0.6 0.8; do
  P+=(--pair "adaptive-interpolation(lam=0.2, realization=residual)=adaptive-interpolation(lam=$lam, realization=residual)")
done
# the nearest block efficiencies across settings: the ceiling at lam 0.2 against adaptive interpolation at lam 0.6
P+=(--pair "overshoot-ceiling(lam=0.2)=adaptive-interpolation(lam=0.6)"
    --pair "overshoot-ceiling(lam=0.2)=adaptive-interpolation(lam=0.6, realization=residual)")
verispec bench compare "$R" "${P[@]}" --out "$R/gaps.md"
