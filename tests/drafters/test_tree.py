"""Tree attention, tree cache compaction and the tree decoding loop on tiny random Qwen2 models (fp32):
exact logits, greedy equality with the target, the target's exact sequence law (chi-square), stops."""

from __future__ import annotations

import copy

import pytest
import torch

from verispec.backends.base import ScoreRequest
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig, history_counts, process
from verispec.core.verify.tree import TokenTree, ancestor_matrix, tree_depths, tree_path
from verispec.drafters.tree import TreeDrafter
from verispec.runtime.engine import Engine
from verispec.runtime.types import Request
from verispec.testing import chi_square_pvalue, tiny_qwen

GREEDY = SamplingConfig(temperature=0)


def fresh_logits(model, seq):
    with torch.no_grad():
        return model(torch.tensor([list(seq)])).logits[0, -1]


def reference_greedy(model, ids, n):
    seq = list(ids)
    for _ in range(n):
        seq.append(int(fresh_logits(model, seq).argmax()))
    return seq[len(ids) :]


def noisy_copy(model, scale, seed):
    """A draft that agrees with the target often but not always (exercises later siblings and rejections)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = out.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g))
    return out


def tree_engine(target, draft, tokenizer=None, eos_token_ids=(), **tree):
    """Target + tree drafter on tiny models; ``tree``: the drafter's options (depth, top_k, budget, ...)."""
    return Engine(HFBackend(target), TreeDrafter(HFBackend(draft), **tree), tokenizer, eos_token_ids)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen(1, vocab_size=64, logit_scale=4)


# -- tree attention ------------------------------------------------------------------------------------------
def test_tree_structure_helpers():
    parents = [-1, -1, 0, 2]
    assert tree_depths(parents) == [1, 1, 2, 3]
    assert tree_path(parents, 3) == [0, 2, 3] and tree_path(parents, -1) == []
    anc = ancestor_matrix(parents)
    assert anc[3].tolist() == [True, False, True, True]  # node 3: ancestors 0, 2 and itself
    assert anc[1].tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="parent"):
        tree_depths([-1, 1])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_logits_equal_path_logits_and_commit_is_exact(target, attn):
    """Every node's logits from one tree forward equal a plain forward over its root-to-node path, and after
    compacting the cache to an accepted path the next logits equal a fresh forward (max abs diff < 1e-4)."""
    target.config._attn_implementation = attn
    try:
        prefix = [3, 1, 4, 1, 5, 9, 2]
        tokens = [10, 11, 12, 13, 14, 15, 16, 17, 18]
        parents = [-1, -1, -1, 0, 0, 1, 3, 3, 6]
        for committed in ([], [0, 3, 6, 8], [1, 5], [2]):
            b = HFBackend(target)
            r = b.add_row()
            b.forward_ids(r, prefix[:4])
            logits = b.forward_ids(r, prefix, tokens, parents)  # feeds prefix[4:] then the tree, one forward
            assert logits.shape == (len(tokens) + 1, 64)
            assert (logits[0] - fresh_logits(target, prefix)).abs().max() < 1e-4
            tree = TokenTree(tokens, parents)
            for node in range(len(tokens)):
                ref = fresh_logits(target, prefix + tree.path_tokens(node))
                assert (logits[node + 1] - ref).abs().max() < 1e-4, node
            b.commit(r, committed)
            hist = prefix + [tokens[n] for n in committed]
            assert b.cached_tokens(r) == hist
            nxt = b.forward_ids(r, hist + [7])[0]
            assert (nxt - fresh_logits(target, hist + [7])).abs().max() < 1e-4
            assert b.cached_tokens(r) == hist + [7]  # the committed path is plain history now
    finally:
        target.config._attn_implementation = "sdpa"


def test_tree_forward_by_levels_equals_one_forward(target):
    """The draft scores a tree level by level (earlier levels cached): same logits as one forward."""
    prefix = [5, 6, 7, 8]
    tokens = [20, 21, 22, 23, 24, 25]
    parents = [-1, -1, 0, 0, 1, 3]
    one = HFBackend(target)
    r1 = one.add_row()
    one.forward_ids(r1, prefix[:-1])
    full = one.forward_ids(r1, prefix, tokens, parents)[1:]
    lv = HFBackend(target)
    r2 = lv.add_row()
    lv.forward_ids(r2, prefix)
    rows = [lv.score([ScoreRequest(r2, None, tokens[a:b], parents[a:b])])[0] for a, b in ((0, 2), (2, 5), (5, 6))]
    assert (torch.cat(rows) - full).abs().max() < 1e-4
    lv.commit(r2, [0, 3, 5])
    hist = prefix + [20, 23, 25, 9]
    assert (lv.forward_ids(r2, hist)[0] - fresh_logits(target, hist)).abs().max() < 1e-4
    with pytest.raises(ValueError):
        one.commit(r1, [1, 2])  # not a root-down path


# -- greedy equality -----------------------------------------------------------------------------------------
def test_tree_greedy_equals_target_greedy(target):
    drafts = {"noisy": noisy_copy(target, 0.8, 0), "other": tiny_qwen(2, vocab_size=64, logit_scale=4)}
    settings = [
        dict(depth=1, top_k=1),
        dict(depth=2, top_k=2),
        dict(depth=4, top_k=2),
        dict(depth=3, top_k=3, sample=True),  # sampling is ignored at temperature 0 (token-only)
        dict(depth=5, top_k=3, budget=8),
        dict(depth=4, top_k=2, budget=5, width=1),
    ]
    gen = torch.Generator().manual_seed(0)
    accepted = 0
    for trial in range(4):
        prompt = torch.randint(0, 64, (5 + trial,), generator=gen).tolist()
        ref = reference_greedy(target, prompt, 20)
        for name, draft in drafts.items():
            for kw in settings:
                out = tree_engine(target, draft, **kw).generate(prompt, sampling=GREEDY, max_new_tokens=20)
                assert out.token_ids == ref, (trial, name, kw)
                assert out.finish_reason == "length" and out.metrics.new_tokens == 20
                m = out.metrics
                assert m.tokens_per_round == pytest.approx(1 + m.block_efficiency)
                accepted += m.accepted
    assert accepted > 0  # not a vacuous pass: drafted tokens were accepted


def test_self_draft_accepts_full_depth(target):
    out = tree_engine(target, target, depth=3, top_k=2).generate([1, 2, 3], sampling=GREEDY, gamma=3,
                                                                 max_new_tokens=17)
    m = out.metrics
    # 4 rounds of 3 accepted + bonus (16 tokens), then one target-only round for the 17th
    assert (m.rounds, m.accepted) == (5, 12)
    assert m.acceptance_per_position == [1.0, 1.0, 1.0]
    assert m.nodes_per_round == pytest.approx((4 * 14 + 0) / 5)
    assert (m.drafted, m.proposed_nodes) == (12, 56)  # drafted = tree depth per round; nodes reported apart
    assert out.token_ids == reference_greedy(target, [1, 2, 3], 17)


def test_noisy_draft_accepts_non_first_children(target):
    """With top-k 3 the walk accepts second/third candidates, which a chain draft could not. Depth 4 fixed: the
    automatic depth follows measured costs, which would make the comparison depend on the machine's load."""
    eng = tree_engine(target, noisy_copy(target, 1.5, 1), depth=4, top_k=3)
    greedy_first = tree_engine(target, noisy_copy(target, 1.5, 1), depth=4, top_k=1)
    prompt = [9, 8, 7, 6]
    a = eng.generate(prompt, sampling=GREEDY, max_new_tokens=40, gamma=4).metrics
    b = greedy_first.generate(prompt, sampling=GREEDY, max_new_tokens=40, gamma=4).metrics
    assert a.block_efficiency > b.block_efficiency


# -- exact sequence law --------------------------------------------------------------------------------------
V_SMALL = 5
N_SEQ = 1500
ALPHA = 1e-4


def exact_law(model, cfg, prompt, length, rule):
    """The law the target alone samples (p_Theta = rule.target(p) per position), by enumeration with plain
    forwards: the product of per-position probabilities over every continuation."""
    out = {}

    def walk(seq, prob):
        if len(seq) - len(prompt) == length:
            out[tuple(seq[len(prompt) :])] = prob
            return
        counts = history_counts(torch.zeros(V_SMALL, dtype=torch.long), torch.tensor(seq))[-1]
        p = rule.target(process(fresh_logits(model, seq), cfg, counts))
        for x in torch.nonzero(p > 0).flatten().tolist():
            walk(seq + [x], prob * float(p[x]))

    walk(list(prompt), 1.0)
    return out


@pytest.mark.parametrize(
    "rule, cfg, kw",
    [
        ("lossless", SamplingConfig(temperature=1.0), dict(depth=2, top_k=2)),
        ("lossless", SamplingConfig(temperature=1.0, repetition_penalty=1.8), dict(depth=2, top_k=2, sample=True)),
        (get("minp-sampling", p_base=0.1), SamplingConfig(temperature=1.0), dict(depth=3, top_k=2, budget=4)),
    ],
)
def test_tree_sampled_output_matches_target_law(rule, cfg, kw):
    """Chi-square goodness of fit, N = 1500 continuations of 3 tokens (vocabulary 5), alpha = 1e-4, bins with
    expected count < 5 pooled; a sampled continuation of exact probability zero fails at once."""
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    rule = get(rule) if isinstance(rule, str) else rule
    prompt, length = [1, 3, 2], 3
    exact = exact_law(target, cfg, prompt, length, rule)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    eng = tree_engine(target, draft, **kw)
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    outs = eng.generate([list(prompt)] * N_SEQ, rule=rule, sampling=cfg, max_new_tokens=length,
                        seed=list(range(N_SEQ)), batch_size=64)  # one seeded row per continuation, 64 at a time
    for out in outs:
        key = tuple(out.token_ids)
        assert exact.get(key, 0.0) > 0, f"sampled a zero-probability continuation {key}"
        counts[key] = counts.get(key, 0) + 1
        accepted += out.metrics.accepted
    assert accepted > N_SEQ // 4  # the tree path was really exercised
    pvalue = chi_square_pvalue(counts, exact)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


# -- caches and stops ----------------------------------------------------------------------------------------
def test_caches_after_rounds_match_fresh_forward(target):
    draft = noisy_copy(target, 1.0, 2)
    prompt = [3, 1, 4, 1, 5]
    for seed, kw in enumerate([dict(depth=4, top_k=2), dict(depth=4, top_k=3, budget=7), dict(sample=True)]):
        eng = tree_engine(target, draft, **kw)
        # three rows in one batch (different prompts and seeds), caches checked after every round
        rows = [eng.start(Request(prompt[: 5 - i], sampling=SamplingConfig(temperature=1.0), max_new_tokens=15,
                                  seed=10 * seed + i)) for i in range(3)]
        while not all(r.done for r in rows):
            eng.step(rows)
            for r in rows:
                if r.done:
                    continue
                for backend, model, brow in ((eng.target, target, r.target_row),
                                             (eng.drafter.backend, draft, eng.drafter._brow[r.key])):
                    got = backend.forward_ids(brow, r.ids)[0]
                    assert (got - fresh_logits(model, r.ids)).abs().max() < 1e-4


class _ToyTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_stops_and_limits(target):
    prompt = [1, 2, 3]
    ref = reference_greedy(target, prompt, 30)
    eng = tree_engine(target, target, depth=5, top_k=2)
    for n in (1, 2, 5, 7):  # never exceeds max_new_tokens even with a fully accepted deep tree
        out = eng.generate(prompt, sampling=GREEDY, max_new_tokens=n)
        assert out.token_ids == ref[:n] and out.finish_reason == "length"
    eos = ref[5]
    k = ref.index(eos)
    eng_eos = tree_engine(target, target, eos_token_ids=[eos], depth=4, top_k=2)
    out = eng_eos.generate(prompt, sampling=GREEDY, max_new_tokens=30)
    assert out.token_ids == ref[: k + 1] and out.finish_reason == "stop"
    eng_txt = tree_engine(target, target, tokenizer=_ToyTokenizer(), depth=4, top_k=2)
    stop = _ToyTokenizer().decode(ref[6:8])
    out = eng_txt.generate(prompt, sampling=GREEDY, max_new_tokens=30, stop=[stop])
    full = _ToyTokenizer().decode(ref)
    assert out.finish_reason == "stop" and out.text == full[: full.find(stop)]
    small = tiny_qwen(1, vocab_size=64, logit_scale=4, max_context=12)
    eng_ctx = tree_engine(small, small, depth=4, top_k=2)
    out = eng_ctx.generate(prompt, sampling=GREEDY, max_new_tokens=30)
    assert len(prompt) + len(out.token_ids) == 12 and out.finish_reason == "length"
    assert out.token_ids == reference_greedy(small, prompt, 9)
    with pytest.raises(ValueError):
        eng.generate(prompt, rule="lenience")  # not a tree rule
