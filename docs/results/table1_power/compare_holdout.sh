#!/usr/bin/env bash
# Regenerates table1_holdout.md / table6_holdout.md (problems 64.. only) and table1_all.md / table6_all.md
# (every pair), lam02_holdout.md / lam02_all.md (Table 1's lam 0.2 row) and residual_all.md / residual_holdout.md (the
# residual realization, = CoS-WE), from the committed results of this run;
# see README.md, "All 164 problems x 3 seeds" and "lam 0.2 on all 164 problems".
set -euo pipefail
R=docs/results/table1_power
T1=(--pair "adaptive-interpolation(lam=0.4)=lossless" --pair "adaptive-interpolation(lam=0.6)=lossless"
    --pair "adaptive-interpolation(lam=0.8)=lossless" --pair "overshoot-ceiling(lam=0.4)=lossless"
    --pair "overshoot-ceiling(lam=0.6)=lossless" --pair "overshoot-ceiling(lam=0.8)=lossless"
    --pair "adaptive-interpolation(lam=0.4, realization=residual)=lossless"
    --pair "adaptive-interpolation(lam=0.4)=overshoot-ceiling(lam=0.4)"
    --pair "adaptive-interpolation(lam=0.6)=overshoot-ceiling(lam=0.6)"
    --pair "adaptive-interpolation(lam=0.8)=overshoot-ceiling(lam=0.8)"
    --pair "adaptive-interpolation(lam=0.4)=overshoot-ceiling(lam=0.2)")
T6=(--pair "spec-cascade(p_base=0.5)=lossless" --pair "lenience(l=0.4)=lossless" --pair "ceiling(l=0.4)=lossless"
    --pair "minp-cap(p_base=0.5, l=0.4)=lossless" --pair "lenience(l=0.4)=spec-cascade(p_base=0.5)"
    --pair "ceiling(l=0.4)=lenience(l=0.4)" --pair "minp-cap(p_base=0.5, l=0.4)=ceiling(l=0.4)"
    --pair "minp-cap(p_base=0.5, l=0.4)=lenience(l=0.4)" --pair "minp-cap(p_base=0.5, l=0.4)=spec-cascade(p_base=0.5)")
L2=(--pair "adaptive-interpolation(lam=0.2)=lossless" --pair "overshoot-ceiling(lam=0.2)=lossless"
    --pair "adaptive-interpolation(lam=0.2)=overshoot-ceiling(lam=0.2)")
RS=(--pair "adaptive-interpolation(lam=0.2, realization=residual)=lossless"
    --pair "adaptive-interpolation(lam=0.4, realization=residual)=lossless"
    --pair "adaptive-interpolation(lam=0.6, realization=residual)=lossless"
    --pair "adaptive-interpolation(lam=0.8, realization=residual)=lossless"
    --pair "adaptive-interpolation(lam=0.2, realization=residual)=adaptive-interpolation(lam=0.2)"
    --pair "adaptive-interpolation(lam=0.2, realization=residual)=overshoot-ceiling(lam=0.2)"
    --pair "adaptive-interpolation(lam=0.4, realization=residual)=overshoot-ceiling(lam=0.2)"
    --pair "adaptive-interpolation(lam=0.6, realization=residual)=overshoot-ceiling(lam=0.4)"
    --pair "adaptive-interpolation(lam=0.2, realization=residual)=adaptive-interpolation(lam=0.8, realization=residual)")
verispec bench compare "$R" "${T1[@]}" --problems 64: --out "$R/table1_holdout.md"
verispec bench compare "$R" "${T6[@]}" --problems 64: --out "$R/table6_holdout.md"
verispec bench compare "$R" "${T1[@]}" --out "$R/table1_all.md"
verispec bench compare "$R" "${T6[@]}" --out "$R/table6_all.md"
verispec bench compare "$R" "${L2[@]}" --problems 64: --out "$R/lam02_holdout.md"
verispec bench compare "$R" "${L2[@]}" --out "$R/lam02_all.md"
verispec bench compare "$R" "${RS[@]}" --out "$R/residual_all.md"
verispec bench compare "$R" "${RS[@]}" --problems 64: --out "$R/residual_holdout.md"
