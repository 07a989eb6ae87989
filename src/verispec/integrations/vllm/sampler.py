"""verispec's rules on vLLM's tensors: the flattened layout of vLLM's rejection sampler in, its output layout out.

vLLM (``vllm/v1/sample/rejection_sampler.py``) verifies a batch of requests with ragged draft lengths: drafted ids
flattened to ``[num_tokens]``, ``num_draft_tokens`` per request, draft probabilities ``[num_tokens, V]`` (None for
token-only drafts such as n-gram or EAGLE-style proposers: q is then one-hot), the target's processed
distributions at the drafted positions ``[num_tokens, V]`` and at each request's bonus position ``[B, V]``. The
output is ``[B, max_spec_len + 1]`` int32: the accepted prefix, then one correction or bonus token, then -1
(vLLM's placeholder).

Each request's block goes through :func:`verispec.core.verify.verify_block` (sampled) or
:func:`~verispec.core.verify.verify_greedy_rule` (temperature 0), the same routines verispec's own engine uses;
requests with the same rule and draft length are verified in one batched call (row by row on a CPU with a large
vocabulary, where that is faster). A seeded request uses its own generator; the others draw from torch's default
generator, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from verispec.core.rules import Rule
from verispec.core.verify.chain import verify_block, verify_greedy_rule

__all__ = ["PLACEHOLDER", "verify_requests"]

#: vLLM's placeholder for the positions after a request's last output token
PLACEHOLDER = -1
#: from this vocabulary size on, a CPU verifies requests row by row (see verify_requests)
ROW_BY_ROW_VOCAB = 32768


def _rule_key(rule: Rule) -> object:
    """Equal rules share a batched call: rules are frozen dataclasses, so equal parameters hash alike."""
    try:
        return hash(rule), rule
    except TypeError:  # a rule holding a tensor parameter
        return id(rule)


def verify_requests(
    rules: Sequence[Rule | None],
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_probs: torch.Tensor,
    greedy: Sequence[bool],
    generators: Mapping[int, torch.Generator] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify every request whose rule is not None; return (or fill) the ``[B, max_spec_len + 1]`` output.

    ``greedy[i]``: request i runs at temperature 0; its ``target_probs`` / ``bonus_probs`` are then the untempered
    distributions and the rule's deterministic reading applies (accept iff the draft is the argmax of the rule's
    reference distribution). Rows whose rule is None are left as they are in ``out`` (vLLM's own result).
    All or nothing: where a group of rows fails to verify, ``out`` is left as it was (the caller keeps vLLM's own
    result for every row, so none holds the plug-in's tokens).
    """
    b = len(num_draft_tokens)
    if len(rules) != b or len(greedy) != b:
        raise ValueError(f"{len(rules)} rules and {len(greedy)} greedy flags for {b} requests")
    if bonus_probs.shape[0] != b:
        raise ValueError(f"bonus_probs has {bonus_probs.shape[0]} rows for {b} requests")
    width = max(num_draft_tokens, default=0) + 1
    staged = (torch.full((b, width), PLACEHOLDER, dtype=torch.int32, device=target_probs.device) if out is None
              else out.clone())  # written back only once every group verified
    starts = [0]
    for n in num_draft_tokens:
        starts.append(starts[-1] + int(n))
    if draft_token_ids.shape[0] != starts[-1] or target_probs.shape[0] != starts[-1]:
        raise ValueError(f"{draft_token_ids.shape[0]} drafted ids and {target_probs.shape[0]} target rows for "
                         f"{starts[-1]} drafted tokens")
    generators = generators or {}
    # On a CPU with a large vocabulary, rows one at a time: float64 blocks of several rows outgrow the cache (8 rows
    # of gamma 4 over 151,936 tokens: 205 ms in one call, 81 ms row by row, 2-core Zen 4); small ones batch.
    alone = target_probs.device.type == "cpu" and target_probs.shape[-1] >= ROW_BY_ROW_VOCAB
    groups: dict[tuple, list[int]] = {}
    for i, rule in enumerate(rules):
        if rule is not None:
            # a seeded request draws from its own generator, so it is verified on its own
            key = (_rule_key(rule), int(num_draft_tokens[i]), bool(greedy[i]), i if i in generators or alone else -1)
            groups.setdefault(key, []).append(i)
    for (_, gamma, is_greedy, _), rows in groups.items():
        rule = rules[rows[0]]
        idx = torch.cat([torch.arange(starts[i], starts[i] + gamma) for i in rows]) if gamma else None
        drafts = (draft_token_ids[idx].view(len(rows), gamma) if gamma
                  else torch.zeros(len(rows), 0, dtype=torch.long, device=draft_token_ids.device))
        p_draft = target_probs[idx].view(len(rows), gamma, -1) if gamma else target_probs.new_zeros(len(rows), 0,
                                                                                                   target_probs.shape[-1])
        p = torch.cat([p_draft, bonus_probs[rows].unsqueeze(1)], 1)
        q = draft_probs[idx].view(len(rows), gamma, -1) if (draft_probs is not None and gamma) else None
        if is_greedy:
            res = verify_greedy_rule(rule, drafts, p, q)  # type: ignore[arg-type]
        else:
            res = verify_block(rule, drafts, q, p, generators.get(rows[0]))  # type: ignore[arg-type]
        toks = res.tokens.to(staged.dtype).to(staged.device)
        staged[rows, : gamma + 1] = toks
        staged[rows, gamma + 1 :] = PLACEHOLDER
    if out is None:
        return staged
    out.copy_(staged)
    return out
