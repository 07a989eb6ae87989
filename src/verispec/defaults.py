"""One source of truth for the names and defaults that the API, the CLI, sweeps and the server share."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from verispec.registry import Registry

__all__ = ["AUTO", "AUTO_DRAFTER", "CHAT_MAX_NEW_TOKENS", "DEFAULT_BATCH_SIZE", "DEFAULT_CONTEXT", "DEFAULT_DRAFT",
           "DEFAULT_DRAFTER", "DEFAULT_DTYPE", "DEFAULT_GAMMA", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_RULE",
           "DEFAULT_TARGET", "DEFAULT_TARGET_BACKEND", "DEFAULT_TEMPERATURE", "DEFAULT_VERIFIER", "DRAFTERS", "DTYPES",
           "LOGIT_BIAS_LIMIT", "LOGPROBS_MODES", "LOGPROB_FLOOR", "MAX_GAMMA", "MAX_SEED", "MAX_TOP_LOGPROBS",
           "N_BOOT", "DrafterSpec", "PAPER_SEEDS", "SERVING_GAMMA", "SWEEP_DETERMINISTIC",
           "SWEEP_MAX_NEW_TOKENS", "TARGET_BACKENDS", "TOY_ALPHABET", "TargetBackendSpec", "VERIFIERS", "VerifierSpec",
           "check_pairing", "check_verifier", "drafter_spec", "llamacpp_installed", "resolve_backends",
           "target_backend"]

#: the one sentinel meaning "choose automatically" (gamma: the adaptive schedule; drafter and target backend: see
#: AUTO_DRAFTER and resolve_backends)
AUTO = "auto"

#: the default real pair (registered names; :mod:`verispec.models` installs them)
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
#: sampling temperature when none is given (the paper's experiments use 0.7): SamplingConfig, Engine.generate, the
#: API, the CLI, the server and sweeps all read it from here
DEFAULT_TEMPERATURE = 0.7
#: chain draft length when none is given to the engine, a sweep or an evaluation (the paper's gamma): a constant
#: gamma keeps a seeded sampled run reproducible
DEFAULT_GAMMA = 5
#: gamma of ``verispec generate``, :func:`verispec.generate` and the server when a request names none: the
#: adaptive schedule (:mod:`verispec.core.schedule`), which drafts only while drafting pays on this machine and
#: falls back to plain decoding otherwise. Its rounds follow measured times, so at temperature > 0 a seed fixes
#: the text only with a constant gamma; greedy output is the target's whatever the rounds.
SERVING_GAMMA: int | str = AUTO
#: the largest draft length a request may ask for (every front door)
MAX_GAMMA = 32
#: the rule that verifies a request that names none
DEFAULT_RULE = "lossless"
#: context (tokens) of a llama.cpp model or a vLLM engine when none is given, and the server's largest max_tokens
DEFAULT_CONTEXT = 4096
#: request seeds lie in [0, MAX_SEED) (a signed 64-bit integer, as the OpenAI API and torch take them)
MAX_SEED = 2**63
#: the largest magnitude of a logit bias (the OpenAI API's range; +-100 bans or forces a token in practice)
LOGIT_BIAS_LIMIT = 100.0
#: the toy models' 64 symbols (verispec.toy's character tokenizer and the toy benchmark task)
TOY_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n"
#: bootstrap resamples of every confidence interval (verispec.eval.stats and the studies)
N_BOOT = 2000
#: new tokens of a request that names none (``generate --chat`` allows a complete answer; sweeps their own)
DEFAULT_MAX_NEW_TOKENS = 128
CHAT_MAX_NEW_TOKENS = 512
SWEEP_MAX_NEW_TOKENS = 256
#: the paper's three seeds (sweeps)
PAPER_SEEDS = (0, 1, 2)
#: precision of the transformers models
DTYPES = ("bfloat16", "float32", "float16")
DEFAULT_DTYPE = "bfloat16"
#: a sweep's or the engine's drafter and target backend when none is named (a config means the same on every
#: machine, whatever is installed there)
DEFAULT_DRAFTER = "model"
DEFAULT_TARGET_BACKEND = "hf"
#: ``verispec generate``, ``verispec serve`` and :func:`verispec.generate` default to "auto" for both: llama.cpp
#: runs the target and the draft when llama-cpp-python is installed (``install.sh`` builds it) and the models run on
#: the CPU, since there it is several times faster than transformers on every CPU kind measured (README
#: "Performance"); else transformers.
#: "auto" drafter per target backend: the draft model's chain on transformers (a block of a few tokens costs little
#: more than one step there, so the draft pays: 1.15-1.7x the target alone, docs/results/schedule.md); prompt
#: lookup on llama.cpp, whose block cost grows with its length on a CPU: there the draft model did not pay (the
#: schedule fell back in 99% of the rounds), prompt lookup costs nothing when it finds no match and pays on code
#: where the output restates the prompt. Both run under the adaptive schedule.
AUTO_DRAFTER = {"hf": "model", "llamacpp": "ngram"}
@dataclass(frozen=True)
class VerifierSpec:
    """How a round's chain of drafts is verified, as data: ``lossless_only`` (it verifies the lossless law, so a
    lossy rule is refused) and ``chains_only`` (token trees are refused)."""

    name: str
    help: str
    lossless_only: bool
    chains_only: bool


#: how a round's drafts are verified: "token" (the rule's acceptance and correction, token by token: every rule,
#: chains and trees), "block" (Sun et al. 2024's block verification) or "hsd" (hierarchical): both accept at least
#: as many drafts per round in expectation as "token", with the same law
VERIFIERS: Registry[VerifierSpec] = Registry("verifier", [(s.name, s) for s in (
    VerifierSpec("token", "token by token with the rule's acceptance h and correction r (every rule; chains and "
                 "trees)", False, False),
    VerifierSpec("block", "block verification (Sun et al. 2024): the longest prefix passing its block test; "
                 "lossless rules, chains only", True, True),
    VerifierSpec("hsd", "hierarchical verification (Zhou et al. 2026): the whole block by its capped joint ratio, "
                 "else a walk back through the prefixes; lossless rules, chains only", True, True),
)])
DEFAULT_VERIFIER = "token"


def check_verifier(verifier: str, lossless: bool, trees: bool) -> None:
    """ValueError naming the problem when ``verifier`` is unknown or cannot verify this rule or proposal (its
    capabilities: :class:`VerifierSpec`)."""
    spec = VERIFIERS[verifier]
    if spec.lossless_only and not lossless:
        raise ValueError(f"verifier {verifier!r} verifies the lossless law: use a lossless rule, or verifier 'token' "
                         "for a lossy one")
    if spec.chains_only and trees:
        raise ValueError(f"verifier {verifier!r} verifies a chain; token trees are verified token by token")


#: the most alternatives a token's logprobs may list (the OpenAI API's limit for top_logprobs)
MAX_TOP_LOGPROBS = 20
#: which distribution a token's logprobs come from: "emitted" (the law it was emitted from: the rule's target at a
#: bonus position or under a lossless rule, the rule's exact induced law at a drafted position under a lossy one)
#: or "target" (the processed target distribution p)
LOGPROBS_MODES = ("emitted", "target")
#: the log-probability reported for a token of probability 0 (JSON has no -inf; the OpenAI API's convention)
LOGPROB_FLOOR = -9999.0

#: units (or requests) decoded at once as rows of one batch by the harness (docs/results/batching.md)
DEFAULT_BATCH_SIZE = 8
#: whether a sweep decodes every row on model backends of its own (``deterministic``: a unit's tokens independent of
#: its batch, shard, worker and resume; docs/results/determinism.md gives the cost); run directories made before
#: the option existed ran batched (False)
SWEEP_DETERMINISTIC = False


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter choice, as data: ``draft_backend`` is what runs the draft model ("hf", "llamacpp" or None: no model);
    ``kind`` is what the drafter builds on it ("chain": the draft model's chain, "tree": a token tree, "ngram":
    prompt lookup, "hybrid": prompt lookup else the draft model's chain, "none": no drafter)."""

    name: str
    draft_backend: str | None
    kind: str
    help: str

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_backend is not None

    @property
    def proposes_trees(self) -> bool:
        """Proposals are token trees: the target needs tree attention, and only tree-safe rules apply."""
        return self.kind == "tree"


DRAFTERS: Registry[DrafterSpec] = Registry("drafter", [
    (s.name, s)
    for s in (
        DrafterSpec("model", "hf", "chain", "chain from the draft model (transformers)"),
        DrafterSpec("llamacpp", "llamacpp", "chain",
                    "chain from the same draft run by llama.cpp (requirements-fast.txt)"),
        DrafterSpec("tree", "hf", "tree", "token tree from the draft model, verified in one target forward (App. H.1)"),
        DrafterSpec("ngram", None, "ngram", "prompt lookup, no draft model"),
        DrafterSpec("ngram+model", "hf", "hybrid", "prompt lookup when it matches, else the draft model"),
        DrafterSpec("ngram+llamacpp", "llamacpp", "hybrid", "prompt lookup when it matches, else the llama.cpp draft"),
        DrafterSpec("none", None, "none", "target only, through the same loop"),
    )
])


def drafter_spec(name: str) -> DrafterSpec:
    """The registered drafter ``name`` (:class:`~verispec.registry.UnknownName` otherwise)."""
    return DRAFTERS[name]


@dataclass(frozen=True)
class TargetBackendSpec:
    """What can run the target, as data: ``tree_attention`` says whether it scores token trees in one forward."""

    name: str
    help: str
    tree_attention: bool


#: what can run the target: "hf" (transformers; exact fp32 equality with transformers) or "llamacpp" (the
#: target's GGUF run by llama.cpp via llama-cpp-python, requirements-fast.txt; raw logits, verispec samples)
TARGET_BACKENDS: Registry[TargetBackendSpec] = Registry("target backend", [
    (s.name, s)
    for s in (
        TargetBackendSpec("hf", "transformers (exact fp32 equality with transformers)", True),
        TargetBackendSpec("llamacpp", "the target's GGUF run by llama.cpp (requirements-fast.txt); fastest on a CPU",
                          False),
    )
])


def target_backend(name: str) -> str:
    """Validate a target backend name (see :data:`TARGET_BACKENDS`)."""
    return TARGET_BACKENDS.check(name)


def llamacpp_installed() -> bool:
    """llama-cpp-python importable here (found without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def resolve_backends(target_backend_name: str, drafter: str, device: str = "cpu") -> tuple[str, str]:
    """(target backend, drafter) with "auto" resolved (see :data:`AUTO`): an explicit transformers drafter or a
    tree (which needs tree attention) or a device other than the CPU keeps the target on transformers."""
    if target_backend_name == AUTO:
        hf_only = drafter != AUTO and (drafter_spec(drafter).draft_backend == "hf"
                                       or drafter_spec(drafter).proposes_trees)
        fast = device == "cpu" and not hf_only and llamacpp_installed()
        target_backend_name = "llamacpp" if fast else "hf"
    target_backend(target_backend_name)
    if drafter == AUTO:
        drafter = AUTO_DRAFTER[target_backend_name]
    drafter_spec(drafter)
    return target_backend_name, drafter


def check_pairing(drafter: str, target_backend_name: str) -> None:
    """ValueError for an unknown drafter or target backend, or when the drafter's proposals need a capability the
    target backend lacks (trees on llama.cpp)."""
    spec, backend = drafter_spec(drafter), TARGET_BACKENDS[target_backend(target_backend_name)]
    if spec.proposes_trees and not backend.tree_attention:
        raise ValueError(f"drafter {drafter!r} needs a target with tree attention; target_backend "
                         f"{target_backend_name!r} has none")
