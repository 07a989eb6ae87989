"""Sweeps: a TOML config -> the grid of independent work units (task, method, parameters, seed, problem).

A config (see ``configs/*.toml``)::

    name = "smoke"
    seeds = [0]                 # default [0, 1, 2], the paper's three seeds
    temperature = 0.7           # default 0.7 (the paper's); 0 = greedy
    gamma = 5                   # draft length
    max_new_tokens = 256
    pair_baselines = true       # add each lossy method's matched baseline to the grid (default true)
    coupling = "common"         # "common" (default): all methods of a (problem, seed) share random numbers;
                                # "independent": each method draws its own (see below)
    verifier = "token"          # "token" (default) or "block": block verification of every chain (lossless
                                # methods only; compare with a second run of the same grid at "token")
    deterministic = true        # every unit's rows on model backends of their own: its tokens do not depend on
                                # its batch, shard, worker or resume (verispec.backends.isolated; slower)

    [sampling]                  # optional, other SamplingConfig fields applied to target and draft
    top_p = 0.95

    [models]
    target = "qwen2.5-coder-1.5b-instruct"   # registered name or HF directory; "toy": tiny random pair
    draft = "qwen2.5-coder-0.5b-instruct"
    drafter = "model"           # model | tree | llamacpp | ngram | ngram+model | ngram+llamacpp | none
    target_backend = "hf"       # hf (transformers, default) | llamacpp (the target's GGUF run by llama.cpp)
    dtype = "bfloat16"
    threads = 2                 # optional torch intra-op threads
    device = "cpu"              # where the transformers models run (cpu, cuda[:N]); results do not record it

    [[tasks]]
    name = "humaneval"
    limit = 20                  # first N problems (after subset)
    subset = ["HumanEval/0"]    # optional, task-specific (ids, languages, categories); each must select a problem
    max_new_tokens = 384        # optional, overrides the global value for this task
    options = { lenient = true }   # optional, passed to the task's constructor (bfcl: lenient, default false)

    [[methods]]
    rule = "spec-cascade"
    params = { p_base = [0.1, 0.3] }   # scalar or list per parameter: the grid is their product
    [[methods]]
    rule = "typical"
    params = "paper"                   # the paper's grid for this rule (PRESETS)

A method without ``params`` runs the rule with its defaults. Every lossy setting is paired with its matched
baseline (:func:`verispec.core.rules.matched_baseline`: spec-cascade -> minp-sampling with the same p_base,
typical -> eta-sampling with the same epsilon/delta, every other lossy rule -> lossless), added to the grid
when absent.

``baseline_draft_truncation = "none" | "same"`` (top level, default "none") is the ``draft_truncation`` of the
truncation baselines (minp-sampling, eta-sampling) of the sweep, paired or listed, unless a method sets it in
its own params: "none" leaves the draft untouched (the paper's protocol, App. C; Lemma 1), "same" truncates
it too. It is stored in every result line (``settings``); result files written before the option existed lack
it and were run with "same", which :meth:`SweepConfig.from_json` and :func:`record_rule` restore.

Paper presets (``params = "paper"``) follow Tables 1, 4, 5 and 6, with one mapping: Table 4's CoS rows degrade
as their parameter grows, so there the parameter weights the DRAFT, while Eq. 2 (kept by ``cos-we``) weights p
by lam. The ``cos-we`` preset therefore lists lam = 1 - t for Table 4's t = 0.2, 0.4, 0.6, 0.8, in that order
(``PAPER_PARAM_MAPS``; docs/paper_notes.md). Table 1's lam (adaptive-interpolation, overshoot-ceiling) already
has Eq. 2's direction and is used as printed.

A :class:`WorkUnit` carries everything that determines its result (generation settings, rule, parameters,
task, problem id, seed), so units can run in any order, on any machine.

``coupling = "common" | "independent"`` (top level, default "common") decides how the methods of one
(task, problem, seed) share randomness. "common": the generation seed of a unit is a hash of (seed, task,
problem id) and does NOT depend on the method, so all methods draw the same random numbers (common random
numbers; App. C: the baseline reuses the same draft trajectories). The engine consumes them identically under
every rule (the draft's samples, gamma uniforms and one for the final token per round), so a lossy setting and
its matched baseline share the draft trajectory and the uniforms until their first diverging decision, and
their paired differences have less noise. "independent": the method label is hashed into the seed as well,
so every method of a (problem, seed) draws its own random numbers (the variance of unpaired runs, for
comparison). The value is stored in every result line (``settings``); a run directory made with one value
refuses to resume with the other; result files written before the option existed were "common".
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from verispec.core import rules
from verispec.core.rules.budget import Budget, family_of
from verispec.core.sampling import SamplingConfig
from verispec.core.verify.tree import check_tree_rule
from verispec.defaults import (
    DEFAULT_DRAFT,
    DEFAULT_DRAFTER,
    DEFAULT_DTYPE,
    DEFAULT_GAMMA,
    DEFAULT_TARGET,
    DEFAULT_TARGET_BACKEND,
    DEFAULT_TEMPERATURE,
    DEFAULT_VERIFIER,
    DTYPES,
    PAPER_SEEDS,
    SWEEP_DETERMINISTIC,
    SWEEP_MAX_NEW_TOKENS,
    TARGET_BACKENDS,
    check_pairing,
    check_verifier,
    drafter_spec,
)
from verispec.defaults import DRAFTERS as _DRAFTER_SPECS
from verispec.eval.tasks import get_task

__all__ = [
    "PAPER_PARAM_MAPS",
    "PRESETS",
    "MethodSetting",
    "SweepConfig",
    "TaskSpec",
    "WorkUnit",
    "expand",
    "expand_methods",
    "COUPLINGS",
    "generation_seed",
    "load_config",
    "parse_config",
    "record_rule",
    "setting",
    "shard_units",
]

# The paper's grids (Tables 1, 4, 5, 6): min-p p_base 0.1..0.9 step 0.2, eta epsilon 0.05..0.25 step 0.05,
# lenience l and the CoS / ablation lambdas 0.2..0.8 step 0.2.
_P_BASE = [0.1, 0.3, 0.5, 0.7, 0.9]
_EPSILON = [0.05, 0.1, 0.15, 0.2, 0.25]
_LAMBDA = [0.2, 0.4, 0.6, 0.8]
#: how a paper table's printed parameter maps to verispec's: rule -> (parameter, table, mapping). Table 4's CoS
#: parameter t weights the draft (its rows degrade as t grows); Eq. 2's lam weights p, so lam = 1 - t.
PAPER_PARAM_MAPS: dict[str, tuple[str, str, str]] = {"cos-we": ("lam", "Table 4", "lam = 1 - t")}
PRESETS: dict[str, dict[str, list[float]]] = {
    "lossless": {},
    "minp-sampling": {"p_base": _P_BASE},
    "spec-cascade": {"p_base": _P_BASE},
    "eta-sampling": {"epsilon": _EPSILON},
    "typical": {"epsilon": _EPSILON},
    "lenience": {"l": _LAMBDA},
    "cos-we": {"lam": [0.8, 0.6, 0.4, 0.2]},  # Table 4's t = 0.2, 0.4, 0.6, 0.8 as lam = 1 - t (PAPER_PARAM_MAPS)
    "cos-cd": {"lam": _LAMBDA},
    "overshoot-ceiling": {"lam": _LAMBDA},
    "adaptive-interpolation": {"lam": _LAMBDA},
    "ceiling": {"l": _LAMBDA},
    "minp-cap": {"p_base": [0.5], "l": _LAMBDA},
}
#: draft_truncation of result files written before the option existed (q was always truncated then)
LEGACY_DRAFT_TRUNCATION = "same"
#: how the methods of one (task, problem, seed) share random numbers (module docstring); runs made before the
#: option existed used "common"
COUPLINGS = ("common", "independent")
LEGACY_COUPLING = "common"
# drafters a sweep may use (verispec.defaults.DRAFTERS); "tree": default tree of depth gamma, per_round
# (depth, accepted)
DRAFTERS = tuple(_DRAFTER_SPECS)
DRAFT_MODEL_DRAFTERS = tuple(name for name, spec in _DRAFTER_SPECS.items() if spec.uses_draft_model)

_TOP_KEYS = {"name", "seeds", "temperature", "gamma", "max_new_tokens", "pair_baselines", "sampling", "models",
             "tasks", "methods", "baseline_draft_truncation", "coupling", "verifier",
             "deterministic"}
_MODEL_KEYS = {"target", "draft", "drafter", "target_backend", "dtype", "threads", "device"}
_TASK_KEYS = {"name", "limit", "subset", "max_new_tokens", "options"}
_METHOD_KEYS = {"rule", "params", "budget"}


# ------------------------------------------------------------------------------------------------ methods


def _canon_value(v: object) -> object:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int | float):
        return float(v)
    raise ValueError(f"parameter value {v!r} is not a number or string")


def _fmt_value(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class MethodSetting:
    """One verification rule with its parameters, in canonical form (the rule's own parameter names)."""

    rule: str
    params: tuple[tuple[str, object], ...] = ()
    #: a divergence budget (:class:`verispec.core.rules.budget.Budget` fields); the engine then chooses the
    #: family's parameter per position, so ``params`` does not name it
    budget: tuple[tuple[str, float], ...] = ()

    def build(self) -> rules.Rule:
        return rules.get(self.rule, **dict(self.params))

    def budget_spec(self) -> Budget | None:
        return Budget(**dict(self.budget)) if self.budget else None  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """``spec-cascade(p_base=0.3)``: the rule and the parameters that differ from its defaults;
        ``lenience(budget tv=0.05)`` under a budget."""
        parts = [f"{k}={_fmt_value(v)}" for k, v in self.params]
        if self.budget:
            parts.append("budget " + " ".join(f"{k}={_fmt_value(v)}" for k, v in self.budget))
        return f"{self.rule}({', '.join(parts)})" if parts else self.rule

    @property
    def lossless(self) -> bool:
        return rules.REGISTRY[self.rule].lossless

    def baseline(self) -> MethodSetting:
        """The matched baseline (itself for lossless rules)."""
        return setting(rules.matched_baseline(self.build()))

    def param_dict(self) -> dict[str, object]:
        return dict(self.params)


def setting(rule: rules.Rule | str, **params: object) -> MethodSetting:
    """The canonical :class:`MethodSetting` of a rule: validated by building it, aliases resolved (``lambda``
    -> ``lam``, ``correction`` -> ``correction_source``). The swept parameters (those of the rule's preset)
    are always kept; the others only when they differ from the rule's defaults."""
    built = rules.get(rule, **params) if isinstance(rule, str) else rule
    defaults = {f.name: f.default for f in fields(built)}
    swept = PRESETS.get(built.name, {})
    kept = []
    for name in built.param_names:
        value = _canon_value(getattr(built, name))
        default = defaults.get(name)
        default = _canon_value(default) if isinstance(default, int | float | str | bool | None) else default
        if name in swept or value != default:
            kept.append((name, value))
    return MethodSetting(built.name, tuple(kept))


def _budget_grid(rule: str, budget: object) -> list[tuple[tuple[str, float], ...]]:
    """The budgets of a ``[[methods]]`` entry: ``budget = {tv = 0.05}`` or lists of values (a grid)."""
    if budget is None:
        return [()]
    if not isinstance(budget, Mapping):
        raise ValueError(f"budget of {rule!r} must be a table like {{tv = 0.05}}, got {budget!r}")
    try:
        family_of(rule)
    except ValueError as exc:
        raise ValueError(f"budget: {exc}") from None
    names = list(budget)
    axes = [list(v) if isinstance(v, list | tuple) else [v] for v in budget.values()]
    out = []
    for combo in itertools.product(*axes):
        spec = Budget.parse(dict(zip(names, combo, strict=True)))
        assert spec is not None
        out.append(tuple(sorted(spec.to_dict().items())))
    return out


def _grid(rule: str, params: object, budget: object = None) -> list[MethodSetting]:
    rules.REGISTRY.check(rule)
    if budget is not None:
        budgets = _budget_grid(rule, budget)
        fam = family_of(rule)
        if isinstance(params, Mapping) and fam.param in params:
            raise ValueError(f"{rule!r}: params.{fam.param} and a budget both set the parameter; the budget "
                             "chooses it per position")
        out = []
        for base in _grid(rule, params):
            kept = tuple((k, v) for k, v in base.params if k != fam.param)
            try:
                family_of(rules.get(rule, **dict(kept)))  # e.g. the realization a family needs
            except ValueError as exc:
                raise ValueError(f"budget: {exc}") from None
            out += [MethodSetting(base.rule, kept, b) for b in budgets]
        return out
    if params is None:
        return [setting(rule)]
    if params == "paper":
        if rule not in PRESETS:
            raise ValueError(f"no paper preset for rule {rule!r}; presets: {', '.join(PRESETS)}")
        params = PRESETS[rule]
    if not isinstance(params, Mapping):
        raise ValueError(f"params of {rule!r} must be a table of name = value or [values], or \"paper\"")
    names = list(params)
    axes = []
    for name in names:
        vals = params[name]
        vals = list(vals) if isinstance(vals, list | tuple) else [vals]
        if not vals:
            raise ValueError(f"parameter {name!r} of {rule!r} has an empty list of values")
        axes.append(vals)
    return [setting(rule, **dict(zip(names, combo, strict=True))) for combo in itertools.product(*axes)]


def _with_draft_truncation(s: MethodSetting, draft_truncation: str) -> MethodSetting:
    """``s`` with the sweep's baseline draft_truncation, unless the rule lacks the parameter or sets it."""
    if "draft_truncation" not in rules.REGISTRY[s.rule].param_names or "draft_truncation" in s.param_dict():
        return s
    return setting(s.rule, **s.param_dict(), draft_truncation=draft_truncation)


def expand_methods(methods: Iterable[tuple], pair_baselines: bool = True,
                   draft_truncation: str = "none") -> list[MethodSetting]:
    """Settings of ``(rule, params)`` or ``(rule, params, budget)`` entries in order, duplicates removed; with
    ``pair_baselines`` each lossy setting's matched baseline is appended (before the first lossy setting needing
    it) when absent. Truncation baselines get ``draft_truncation`` unless their params set it."""
    out: list[MethodSetting] = []
    for entry in methods:
        for s in _grid(*entry):
            s = _with_draft_truncation(s, draft_truncation)
            if pair_baselines and not s.lossless:
                base = _with_draft_truncation(s.baseline(), draft_truncation)
                if base not in out:
                    out.append(base)
            if s not in out:
                out.append(s)
    return out


# ------------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TaskSpec:
    name: str
    limit: int | None = None
    subset: tuple[str, ...] | None = None
    max_new_tokens: int | None = None  # None: the sweep's value
    options: tuple[tuple[str, object], ...] = ()  # keyword arguments of the task's constructor, sorted


@dataclass(frozen=True)
class SweepConfig:
    """A parsed sweep: generation settings, tasks, method settings (baselines included) and seeds."""

    name: str = "sweep"
    tasks: tuple[TaskSpec, ...] = ()
    methods: tuple[MethodSetting, ...] = ()
    seeds: tuple[int, ...] = tuple(PAPER_SEEDS)
    temperature: float = DEFAULT_TEMPERATURE
    sampling: tuple[tuple[str, object], ...] = ()
    gamma: int = DEFAULT_GAMMA
    max_new_tokens: int = SWEEP_MAX_NEW_TOKENS
    target: str = DEFAULT_TARGET
    draft: str | None = DEFAULT_DRAFT
    drafter: str = DEFAULT_DRAFTER
    target_backend: str = DEFAULT_TARGET_BACKEND
    dtype: str = DEFAULT_DTYPE
    threads: int | None = None
    device: str = "cpu"
    pair_baselines: bool = True
    baseline_draft_truncation: str = "none"
    coupling: str = "common"
    #: how every chain is verified (:data:`verispec.defaults.VERIFIERS`)
    verifier: str = DEFAULT_VERIFIER
    #: rows on backends of their own (:class:`verispec.backends.isolated.RowIsolated`): batch-invariant tokens
    deterministic: bool = SWEEP_DETERMINISTIC
    raw_methods: tuple[tuple[str, object, object], ...] = field(default=(), compare=False, repr=False)

    @property
    def uses_draft(self) -> bool:
        """Whether the drafter runs the draft model (``model``, ``llamacpp`` and the ``ngram+`` hybrids)."""
        return self.drafter in DRAFT_MODEL_DRAFTERS

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, **dict(self.sampling))

    def max_tokens(self, task: str) -> int:
        """max_new_tokens of ``task`` (its own value, else the sweep's)."""
        spec = next((t for t in self.tasks if t.name == task), None)
        return spec.max_new_tokens if spec is not None and spec.max_new_tokens else self.max_new_tokens

    def task_options(self, task: str) -> dict[str, object]:
        """The constructor options of ``task`` (``[[tasks]] options``; empty when it sets none)."""
        spec = next((t for t in self.tasks if t.name == task), None)
        return dict(spec.options) if spec is not None else {}

    def settings(self, task: str | None = None) -> dict[str, Any]:
        """What determines a unit's output besides (rule, params, task, problem, seed); stored in every result
        line (with ``task``: that task's max_new_tokens) and compared when a run directory is resumed."""
        out = {
            "temperature": self.temperature,
            "sampling": dict(self.sampling),
            "gamma": self.gamma,
            "max_new_tokens": self.max_new_tokens if task is None else self.max_tokens(task),
            "target": self.target,
            "draft": self.draft if self.uses_draft else None,
            "drafter": self.drafter,
            "target_backend": self.target_backend,
            "dtype": self.dtype,
            "baseline_draft_truncation": self.baseline_draft_truncation,
            "coupling": self.coupling,
        }
        # only where set, so result lines of runs without task options keep their former settings
        if task is not None and self.task_options(task):
            out["task_options"] = self.task_options(task)
        if self.verifier != DEFAULT_VERIFIER:
            out["verifier"] = self.verifier
        if self.deterministic:
            out["deterministic"] = True
        return out

    def baseline_of(self, method: MethodSetting) -> MethodSetting:
        """The matched baseline setting of ``method`` in this sweep (with its baseline draft_truncation)."""
        return _with_draft_truncation(method.baseline(), self.baseline_draft_truncation)

    def build(self, method: MethodSetting) -> rules.Rule:
        """The rule a setting of this sweep ran with: ``method.build()``, with the sweep's baseline
        draft_truncation where the setting does not name one (matters for configs read by :meth:`from_json`
        from runs made before the option existed, which ran with "same")."""
        rule = method.build()
        if "draft_truncation" in rule.param_names and "draft_truncation" not in method.param_dict():
            rule = rules.get(rule.name, **{**rule.params, "draft_truncation": self.baseline_draft_truncation})
        return rule

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw_methods")
        d["methods"] = [{"rule": m.rule, "params": dict(m.params), "label": m.label,
                         **({"budget": dict(m.budget)} if m.budget else {})} for m in self.methods]
        d["sampling"] = dict(self.sampling)
        d["tasks"] = [{"name": t.name, "limit": t.limit, "subset": list(t.subset) if t.subset else None,
                       "max_new_tokens": t.max_new_tokens, **({"options": dict(t.options)} if t.options else {})}
                      for t in self.tasks]
        d["seeds"] = list(self.seeds)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SweepConfig:
        """Inverse of :meth:`to_json` (the ``config.json`` a run directory holds)."""
        return cls(
            name=d["name"],
            tasks=tuple(TaskSpec(t["name"], t.get("limit"), tuple(t["subset"]) if t.get("subset") else None,
                                 t.get("max_new_tokens"), tuple(sorted((t.get("options") or {}).items())))
                        for t in d["tasks"]),
            methods=tuple(MethodSetting(m["rule"], tuple(m["params"].items()),
                                        tuple(sorted(m.get("budget", {}).items()))) for m in d["methods"]),
            seeds=tuple(d["seeds"]),
            temperature=d["temperature"],
            sampling=tuple(sorted(d.get("sampling", {}).items())),
            gamma=d["gamma"],
            max_new_tokens=d["max_new_tokens"],
            target=d["target"],
            draft=d.get("draft"),
            drafter=d["drafter"],
            target_backend=d.get("target_backend", "hf"),
            dtype=d["dtype"],
            threads=d.get("threads"),
            device=d.get("device", "cpu"),
            pair_baselines=d.get("pair_baselines", True),
            baseline_draft_truncation=d.get("baseline_draft_truncation", LEGACY_DRAFT_TRUNCATION),
            coupling=d.get("coupling", LEGACY_COUPLING),
            verifier=d.get("verifier", DEFAULT_VERIFIER),
            deterministic=bool(d.get("deterministic", False)),  # runs before the option ran batched
        )

    def restricted(self, limit: int | None = None, tasks: Sequence[str] | None = None,
                   seeds: Sequence[int] | None = None, methods: Sequence[str] | None = None) -> SweepConfig:
        """The same sweep with ``limit`` problems per task at most, only ``tasks``, only ``seeds``, only the
        settings labelled ``methods`` (with ``pair_baselines``, their matched baselines too)."""
        specs = list(self.tasks)
        if tasks:
            unknown = set(tasks) - {t.name for t in specs}
            if unknown:
                raise ValueError(f"task(s) {', '.join(sorted(unknown))} not in the config "
                                 f"({', '.join(t.name for t in specs)})")
            specs = [t for t in specs if t.name in tasks]
        if limit is not None:
            specs = [replace(t, limit=limit if t.limit is None else min(t.limit, limit)) for t in specs]
        new_seeds = self.seeds
        if seeds is not None:
            new_seeds = check_seeds("--seeds", list(seeds))
            unknown = [s for s in new_seeds if s not in self.seeds]
            if unknown:
                raise ValueError(f"--seeds: seed(s) {', '.join(map(str, unknown))} not in the config "
                                 f"(its seeds: {', '.join(map(str, self.seeds))})")
        settings = self.methods
        if methods:
            labels = {m.label: m for m in self.methods}
            unknown = [lab for lab in methods if lab not in labels]
            if unknown:
                raise ValueError(f"setting(s) {', '.join(map(repr, unknown))} not in the config; its settings: "
                                 f"{', '.join(labels)}")
            keep = {labels[lab] for lab in methods}
            if self.pair_baselines:
                keep |= {self.baseline_of(labels[lab]) for lab in methods}
            settings = tuple(m for m in self.methods if m in keep)  # grid order kept
        return _replace(self, tasks=tuple(specs), seeds=new_seeds, methods=settings)


def _replace(cfg: SweepConfig, **changes: object) -> SweepConfig:
    return replace(cfg, **changes)  # type: ignore[arg-type]


def check_seeds(name: str, seeds: object) -> tuple[int, ...]:
    """``seeds`` as a tuple if it is a non-empty list of distinct integers >= 0, else ValueError naming ``name``
    (the config's ``seeds`` or the CLI's ``--seeds``)."""
    if not isinstance(seeds, list | tuple):
        raise ValueError(f"{name} must be a non-empty list of distinct integers >= 0, got {seeds!r}")
    out = tuple(_int(f"{name}: a seed", s, 0) for s in seeds)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty list of distinct integers >= 0, got {list(out)}")
    return out


def _check_keys(where: str, got: Mapping, allowed: set[str]) -> None:
    unknown = set(got) - allowed
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}; allowed: "
                         f"{', '.join(sorted(allowed))}")


def _check_task_options(name: str, options: Mapping[str, object]) -> None:
    """ValueError unless the task's constructor takes ``options`` (built once here, so a typo fails at parse)."""
    try:
        get_task(name, **options)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _int(name: str, v: object, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return v


def _table(name: str, v: object) -> Mapping[str, Any]:
    """``v`` if it is a TOML table, else ValueError naming ``name``."""
    if not isinstance(v, Mapping):
        raise ValueError(f"{name} must be a table ([{name}] with key = value lines), got {v!r}")
    return v


def _tables(name: str, v: object) -> list[Mapping[str, Any]]:
    """``v`` if it is an array of tables (``[[name]]`` sections), else ValueError naming ``name``."""
    if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
        hint = " (write [[" + name + "]], not [" + name + "])" if isinstance(v, Mapping) else ""
        raise ValueError(f"{name} must be an array of tables, one [[{name}]] section each{hint}, got {v!r}")
    return v


def _text(name: str, v: object) -> str:
    """``v`` if it is a string, else ValueError naming ``name`` (a table or number is never turned into text)."""
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a string, got {v!r}")
    return v


def _number(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{name} must be a number, got {v!r}")
    return float(v)


def parse_config(data: Mapping[str, Any]) -> SweepConfig:
    """Validate a config mapping (the parsed TOML) into a :class:`SweepConfig` (ValueError on any problem)."""
    _check_keys("the config", data, _TOP_KEYS)
    models = _table("models", data.get("models", {}))
    _check_keys("[models]", models, _MODEL_KEYS)
    tasks = []
    for i, t in enumerate(_tables("tasks", data.get("tasks", []))):
        _check_keys(f"[[tasks]] #{i + 1}", t, _TASK_KEYS)
        if "name" not in t:
            raise ValueError(f"[[tasks]] #{i + 1} has no name")
        _text(f"name of [[tasks]] #{i + 1}", t["name"])
        limit = t.get("limit")
        if limit is not None:
            limit = _int(f"limit of task {t['name']!r}", limit, 0)
        subset = t.get("subset")
        if subset is not None:
            items = [subset] if isinstance(subset, str) else subset
            if not isinstance(items, list) or not all(isinstance(s, str | int) and not isinstance(s, bool)
                                                      for s in items):
                raise ValueError(f"subset of task {t['name']!r} must be a problem id or a list of problem ids, "
                                 f"got {subset!r}")
            subset = (subset,) if isinstance(subset, str) else tuple(str(s) for s in subset)
        mnt = t.get("max_new_tokens")
        if mnt is not None:
            mnt = _int(f"max_new_tokens of task {t['name']!r}", mnt, 1)
        options = t.get("options") or {}
        if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
            raise ValueError(f"options of task {t['name']!r} must be a table of named values, got {options!r}")
        if options:
            _check_task_options(str(t["name"]), options)
        tasks.append(TaskSpec(str(t["name"]), limit, subset, mnt, tuple(sorted(options.items()))))
    if not tasks:
        raise ValueError("the config has no [[tasks]]")
    raw = []
    for i, m in enumerate(_tables("methods", data.get("methods", []))):
        _check_keys(f"[[methods]] #{i + 1}", m, _METHOD_KEYS)
        if "rule" not in m:
            raise ValueError(f"[[methods]] #{i + 1} has no rule")
        raw.append((_text(f"rule of [[methods]] #{i + 1}", m["rule"]), m.get("params"), m.get("budget")))
    if not raw:
        raise ValueError("the config has no [[methods]]")
    pair = data.get("pair_baselines", True)
    if not isinstance(pair, bool):
        raise ValueError(f"pair_baselines must be true or false, got {pair!r}")
    draft_truncation = data.get("baseline_draft_truncation", "none")
    if draft_truncation not in ("none", "same"):
        raise ValueError(f"baseline_draft_truncation must be 'none' or 'same', got {draft_truncation!r}")
    coupling = data.get("coupling", "common")
    if coupling not in COUPLINGS:
        raise ValueError(f"coupling must be one of {', '.join(COUPLINGS)}, got {coupling!r}")
    methods = tuple(expand_methods(raw, pair, draft_truncation))

    seeds = data.get("seeds", PAPER_SEEDS)
    seeds = check_seeds("seeds", [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds)
    temperature = _number("temperature", data.get("temperature", DEFAULT_TEMPERATURE))
    sampling = dict(_table("sampling", data.get("sampling", {})))
    _check_keys("[sampling]", sampling, {f.name for f in fields(SamplingConfig)})
    if "temperature" in sampling:
        temperature = _number("temperature of [sampling]", sampling.pop("temperature"))
    drafter = _text("drafter", models.get("drafter", SweepConfig.drafter))
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
    target_backend = _text("target_backend", models.get("target_backend", SweepConfig.target_backend))
    if target_backend not in TARGET_BACKENDS:
        raise ValueError(f"target_backend must be one of {', '.join(TARGET_BACKENDS)}, got {target_backend!r}")
    check_pairing(drafter, target_backend)
    verifier = _text("verifier", data.get("verifier", DEFAULT_VERIFIER))
    for m in methods:
        try:
            check_verifier(verifier, m.lossless, drafter_spec(drafter).proposes_trees)
        except ValueError as exc:
            raise ValueError(f"verifier: {exc} (method {m.label})") from None
    deterministic = data.get("deterministic", SWEEP_DETERMINISTIC)
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be true or false, got {deterministic!r}")
    dtype = _text("dtype", models.get("dtype", SweepConfig.dtype))
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be bfloat16, float32 or float16, got {dtype!r}")
    threads = models.get("threads")
    draft = models.get("draft", SweepConfig.draft)
    cfg = SweepConfig(
        name=_text("name", data.get("name", "sweep")),
        tasks=tuple(tasks),
        methods=methods,
        seeds=seeds,
        temperature=temperature,
        sampling=tuple(sorted(sampling.items())),
        gamma=_int("gamma", data.get("gamma", SweepConfig.gamma), 0),
        max_new_tokens=_int("max_new_tokens", data.get("max_new_tokens", SweepConfig.max_new_tokens), 1),
        target=_text("target", models.get("target", SweepConfig.target)),
        draft=None if draft is None else _text("draft", draft),
        drafter=drafter,
        target_backend=target_backend,
        dtype=dtype,
        threads=None if threads is None else _int("threads", threads, 1),
        device=_text("device", models.get("device", "cpu")),
        pair_baselines=pair,
        baseline_draft_truncation=draft_truncation,
        coupling=coupling,
        verifier=verifier,
        deterministic=deterministic,
        raw_methods=tuple(raw),
    )
    cfg.sampling_config()  # validates temperature and the [sampling] table
    if drafter_spec(drafter).proposes_trees:  # refuse now rather than fail every unit of an unsupported rule

        for m in methods:
            check_tree_rule(m.build())
    return cfg


def record_rule(record: Mapping[str, Any]) -> rules.Rule:
    """The rule a result line ran with, from its ``method``, ``params`` and ``settings``: a truncation baseline
    without ``draft_truncation`` in its params used the sweep's ``baseline_draft_truncation``, or "same" in
    result files written before that option existed."""
    rule = rules.get(record["method"], **record.get("params", {}))
    if "draft_truncation" in rule.param_names and "draft_truncation" not in record.get("params", {}):
        used = record.get("settings", {}).get("baseline_draft_truncation", LEGACY_DRAFT_TRUNCATION)
        rule = rules.get(rule.name, **{**rule.params, "draft_truncation": used})
    return rule


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a TOML sweep config."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return parse_config(data)


# ---------------------------------------------------------------------------------------------- work units


def generation_seed(seed: int, task: str, problem_id: str, method: str | None = None) -> int:
    """The engine seed of a unit: a hash of (seed, task, problem id), the same for every method (common random
    numbers); with ``method`` (a setting's label: ``coupling = "independent"``) the label is hashed in too."""
    text = f"{seed}\x00{task}\x00{problem_id}" + ("" if method is None else f"\x00{method}")
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class WorkUnit:
    """One generation + grade: a pure function of its fields (and the models named in ``settings``)."""

    task: str
    problem_id: str
    method: MethodSetting
    seed: int
    settings_json: str = "{}"
    coupling: str = "common"

    @property
    def key(self) -> str:
        """Unique within a run directory: ``task|problem|method label|seed``."""
        return f"{self.task}|{self.problem_id}|{self.method.label}|s{self.seed}"

    @property
    def gen_seed(self) -> int:
        """:func:`generation_seed` of the unit: shared by all methods with ``coupling = "common"``, one per
        method label with ``"independent"``."""
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {', '.join(COUPLINGS)}, got {self.coupling!r}")
        method = self.method.label if self.coupling == "independent" else None
        return generation_seed(self.seed, self.task, self.problem_id, method)

    @property
    def settings(self) -> dict[str, Any]:
        return json.loads(self.settings_json)


def expand(cfg: SweepConfig, problem_ids: Mapping[str, Sequence[str]]) -> list[WorkUnit]:
    """The grid: for each seed, problem index, task and method setting, one unit.

    ``problem_ids[task]`` lists the problems of each task (after limit/subset). The order is seed-major and
    interleaves the tasks problem by problem, with all methods of one (seed, problem) next to each other: a
    run cut short holds whole seeds, both tasks in equal measure, and matched pairs complete together.
    """
    units = []
    settings_json = {spec.name: json.dumps(cfg.settings(spec.name), sort_keys=True) for spec in cfg.tasks}
    longest = max((len(problem_ids[spec.name]) for spec in cfg.tasks), default=0)
    for seed in cfg.seeds:
        for i in range(longest):
            for spec in cfg.tasks:
                if i >= len(problem_ids[spec.name]):
                    continue
                pid = problem_ids[spec.name][i]
                for m in cfg.methods:
                    units.append(WorkUnit(spec.name, str(pid), m, seed, settings_json[spec.name], cfg.coupling))
    keys = [u.key for u in units]
    if len(set(keys)) != len(keys):
        raise ValueError("the grid has duplicate unit keys (a task listed twice, or duplicate problem ids)")
    return units


def grid_size(cfg: SweepConfig, problem_ids: Mapping[str, Sequence[str]]) -> int:
    return len(cfg.seeds) * len(cfg.methods) * sum(len(problem_ids[t.name]) for t in cfg.tasks)


def is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def shard_units(units: Sequence[WorkUnit], shard: tuple[int, int]) -> list[WorkUnit]:
    """Shard I of N's share of the grid ``units`` (in grid order): the methods of each (seed, problem, task) block
    are dealt round-robin over the N shards, starting at shard ``block index mod N``. Every block's methods and
    every method's blocks are spread evenly, so a method added to a finished grid is split over the shards too
    (dealing every N-th unit of the grid gave all of a new method's units to one shard whenever the number of
    methods was a multiple of N). The split depends only on the grid, so concurrent shards never overlap, and shard
    I of N is exactly shards I and I+N of 2N (a lagging shard can be finished by two processes)."""
    i, n = shard
    out: list[WorkUnit] = []
    block, pos, prev = -1, 0, None
    for u in units:
        here = (u.seed, u.problem_id, u.task)
        if here != prev:
            block, pos, prev = block + 1, 0, here
        if (block + pos) % n == i:
            out.append(u)
        pos += 1
    return out
