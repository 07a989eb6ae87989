"""Many rows at once (tiny random Qwen2 models, fp32): every row of a batch is exact on its own, whatever shares
its batch; rows join and leave between rounds; bad requests fail alone."""

from __future__ import annotations

import pytest
import torch

from verispec.analysis import sequence_distribution
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import History, SamplingConfig, process
from verispec.drafters import HybridDrafter, ModelDrafter, NgramDrafter, TreeDrafter
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import Request
from verispec.testing import chi_square_pvalue, reference_greedy, tiny_qwen

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair():
    return tiny_qwen(1, vocab_size=64, logit_scale=4), tiny_qwen(2, vocab_size=64, logit_scale=4)


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        base = torch.randint(0, 64, (2 + i % 5,), generator=g).tolist()
        out.append(base * 3 if i % 3 == 0 else torch.randint(0, 64, (3 + 7 * (i % 4),), generator=g).tolist())
    return out


@pytest.mark.parametrize("kind", ["model", "tree", "ngram", "hybrid", "none"])
def test_batch_greedy_rows_equal_target_greedy(pair, kind):
    """fp32 greedy: 7 rows of different prompt lengths, per-row gamma and max_new_tokens, 3 running at a time
    (so rows finish early and waiting rows join mid-way): every row equals the target's own greedy decode."""
    target, draft = pair
    drafter = {
        "model": lambda: ModelDrafter(HFBackend(draft)),
        "tree": lambda: TreeDrafter(HFBackend(draft), top_k=2),
        "ngram": NgramDrafter,
        "hybrid": lambda: HybridDrafter(ModelDrafter(HFBackend(draft)), min_ngram=1),
        "none": lambda: None,
    }[kind]()
    eng = Engine(HFBackend(target), drafter)
    prompts = _prompts(7)
    lengths = [20, 5, 13, 20, 1, 9, 16]
    gammas = [1, 3, 5, 2, 4, "auto", 3]
    outs = eng.generate(prompts, sampling=GREEDY, gamma=gammas, max_new_tokens=lengths, batch_size=3)
    for i, (p, n, out) in enumerate(zip(prompts, lengths, outs, strict=True)):
        assert out.token_ids == reference_greedy(target, p, n), (kind, i)
        assert out.finish_reason == "length"
    assert eng.target.num_rows == 0  # every row was released


def test_seeded_row_is_identical_at_batch_size_1_and_8(pair):
    """A row's output depends only on its own request: sampled rows (T = 1, with penalties on some) give the
    same tokens alone and inside a batch of 8 with other prompts, rules and seeds."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    prompts = _prompts(8, seed=1)
    cfgs = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, repetition_penalty=1.3,
                                                             frequency_penalty=0.4)] * 4
    rules = ["lossless", get("lenience", l=0.5), "lossless", get("cos-we", lam=0.5)] * 2
    seeds = [3, 7, 11, 13, 17, 19, 23, 29]
    batch = eng.generate(prompts, sampling=cfgs, rule=rules, seed=seeds, gamma=4, max_new_tokens=18)
    alone = [eng.generate(p, sampling=c, rule=r, seed=s, gamma=4, max_new_tokens=18)
             for p, c, r, s in zip(prompts, cfgs, rules, seeds, strict=True)]
    assert [b.token_ids for b in batch] == [a.token_ids for a in alone]
    assert len({tuple(b.token_ids) for b in batch}) > 1
    assert sum(b.metrics.drafted - b.metrics.accepted for b in batch) > 0  # rejections happened


V_SMALL = 5
N_SEQ = 2000


def _dist_fn(model, cfg):
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def fn(prefix):
        if prefix not in cache:
            with torch.no_grad():
                logits = model(torch.tensor([list(prefix)])).logits[0, -1]
            cache[prefix] = process(logits, cfg, History.of(list(prefix), [], V_SMALL) if cfg.uses_history else None)
        return cache[prefix]

    return fn


def test_mixed_batch_rows_follow_their_exact_laws():
    """Rows of one batch with different rules and prompts: row A lossless (the target's own law), row B
    lenience l = 0.3 (its exact composition, ``sequence_distribution``), row C lossless with a repetition
    penalty. Chi-square goodness of fit per row, N = 2000 continuations of 3 tokens (vocabulary 5), alpha = 1e-4,
    bins with expected < 5 pooled; any sampled continuation of exact probability zero fails at once."""
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    plain, penal = SamplingConfig(temperature=1.0), SamplingConfig(temperature=1.0, repetition_penalty=1.8)
    rows = [
        ("lossless", plain, (1, 3, 2)),
        (get("lenience", l=0.3), plain, (4, 0)),
        ("lossless", penal, (2, 2, 1, 0)),
    ]
    exact = [
        sequence_distribution(get(r) if isinstance(r, str) else r, _dist_fn(target, c), _dist_fn(draft, c), 2, 3, p)
        for r, c, p in rows
    ]
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    counts: list[dict] = [{} for _ in rows]
    # every sample a row of its own (its rule, processors and seed), the three kinds mixed in batches of 48
    outs = eng.generate([list(p) for _ in range(N_SEQ) for _, _, p in rows],
                        rule=[r for _ in range(N_SEQ) for r, _, _ in rows],
                        sampling=[c for _ in range(N_SEQ) for _, c, _ in rows], seed=list(range(3 * N_SEQ)),
                        gamma=2, max_new_tokens=3, batch_size=48)
    for j, out in enumerate(outs):
        k, key = j % len(rows), tuple(out.token_ids)
        counts[k][key] = counts[k].get(key, 0) + 1
    for k in range(len(rows)):
        pvalue = chi_square_pvalue(counts[k], exact[k])
        assert pvalue > 1e-4, (k, pvalue)


def test_bad_requests_fail_alone(pair):
    """An empty prompt, a prompt over the context and an out-of-vocabulary id in a list: those requests get
    finish_reason "error" with a message naming the problem; the others decode exactly."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    good = [5, 6, 7]
    outs = eng.generate([good, [], list(range(60)) * 9, [1, 64], good], sampling=GREEDY, max_new_tokens=6)
    ref = reference_greedy(target, good, 6)
    assert outs[0].token_ids == ref and outs[4].token_ids == ref
    assert [o.finish_reason for o in outs[1:4]] == ["error"] * 3
    assert "empty prompt" in outs[1].error
    assert "context" in outs[2].error
    assert "vocabulary" in outs[3].error
    with pytest.raises(ValueError, match="3 values for 2 prompts"):
        eng.generate([good, good], seed=[1, 2, 3])
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([], sampling=GREEDY)


def test_scheduler_streams_and_cancels(pair):
    """Tokens arrive round by round through the callback and add up to the result; a cancelled request leaves
    at the next step while the others finish."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    sched = Scheduler(eng, max_batch=2)
    seen: dict[int, list[int]] = {}
    hs = [sched.submit(Request(p, sampling=GREEDY, max_new_tokens=12, gamma=3),
                       on_tokens=lambda h, t: seen.setdefault(h.id, []).extend(t)) for p in _prompts(3, seed=4)]
    sched.step()
    sched.cancel(hs[1])
    sched.run()
    assert all(h.done for h in hs)
    assert hs[1].result.finish_reason == "cancelled" and len(hs[1].result.token_ids) < 12
    for h in (hs[0], hs[2]):
        assert seen[h.id] == h.result.token_ids == h.tokens
        assert h.result.token_ids == reference_greedy(target, h.request.prompt, 12)
    assert sched.idle and eng.target.num_rows == 0
    with pytest.raises(ValueError):
        sched.submit(Request([], max_new_tokens=3))


def test_backend_rows_join_leave_and_compact(pair):
    """Backend level: rows with holes (rejected proposals) and rows that leave; after compaction every row's
    next-token logits still equal a fresh forward (max abs diff < 1e-4, fp32)."""
    target, _ = pair
    b = HFBackend(target, slack=4)
    rows = [b.add_row() for _ in range(3)]
    hist = {r: _prompts(3, seed=9)[i] for i, r in enumerate(rows)}
    g = torch.Generator().manual_seed(0)
    from verispec.backends.base import ScoreRequest

    for step in range(6):
        reqs = []
        for r in rows:
            drafts = torch.randint(0, 64, (1 + (step + r) % 4,), generator=g).tolist()
            reqs.append(ScoreRequest(r, hist[r], drafts))
        b.score(reqs)
        for r, req in zip(rows, reqs, strict=True):
            keep = (step * 7 + r) % (len(req.tokens) + 1)
            b.commit(r, list(range(keep)))
            hist[r] = hist[r] + req.tokens[:keep] + [int(torch.randint(0, 64, (1,), generator=g))]
        if step == 2:
            b.remove_row(rows.pop(1))
            new = b.add_row()
            rows.append(new)
            hist[new] = _prompts(5, seed=2)[4]
    for r in rows:
        got = b.forward_ids(r, hist[r])[0]
        with torch.no_grad():
            fresh = target(torch.tensor([hist[r]])).logits[0, -1]
        assert (got - fresh).abs().max() < 1e-4


def test_waiting_requests_hold_no_cache_rows(pair):
    """Only admitted rows take part in the batched forwards: with 6 requests and max_batch 2 the target never
    holds more than 2 rows, and a request cancelled while waiting never runs."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    sched = Scheduler(eng, max_batch=2)
    hs = [sched.submit(Request(p, sampling=GREEDY, max_new_tokens=6, gamma=2)) for p in _prompts(6, seed=5)]
    assert eng.target.num_rows == 0
    sched.cancel(hs[5])
    peak = 0
    while not sched.idle:
        sched.step()
        peak = max(peak, eng.target.num_rows)
    assert peak == 2
    assert hs[5].result.finish_reason == "cancelled" and hs[5].result.token_ids == []
    assert all(h.result.finish_reason == "length" for h in hs[:5])


def test_engine_capacity_is_its_backends_row_limit(pair):
    """A backend that holds a fixed number of rows (a llama.cpp context's sequences) bounds the engine: a scheduler
    asking for more rows is refused with an error naming the limit, and generate's default batch stays within it
    (7 greedy rows through 2 slots, each equal to the target's greedy decode). Without a limit, none."""
    target, draft = pair
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    assert eng.max_rows is None
    eng.drafter.backend.max_rows = 2  # the capability a llama.cpp backend carries
    assert eng.max_rows == 2
    with pytest.raises(ValueError, match="max_batch 3 exceeds the 2 rows.*max_rows >= 3"):
        Scheduler(eng, max_batch=3)
    seen: list[int] = []
    step = eng.step
    eng.step = lambda rows: (seen.append(len(rows)), step(rows))[1]  # type: ignore[method-assign]
    prompts = _prompts(7)
    outs = eng.generate(prompts, sampling=GREEDY, gamma=2, max_new_tokens=6)
    assert max(seen) == 2
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_greedy(target, p, 6)


N_TRUNC = 1000


@pytest.mark.parametrize("verifier", ["block", "hsd"])
def test_chain_verifiers_emit_the_truncated_target_law(verifier):
    """Min-p sampling (p_base 0.3, lossless to p_Theta) under block and HSD verification, gamma 2: the engine's
    3-token continuations follow the exact law, which is p_Theta's own (the token-wise law with no draft). Chi-square
    goodness of fit, N = 1000 continuations (vocabulary 5), alpha = 1e-4, bins with expected < 5 pooled; a sampled
    continuation of exact probability zero fails at once. Verifying against the untruncated p instead puts the mass
    stated below on continuations p_Theta never emits, so such a sampler fails this N at once."""
    target = tiny_qwen(11, vocab_size=V_SMALL, logit_scale=8)
    draft = tiny_qwen(12, vocab_size=V_SMALL, logit_scale=8)
    cfg, rule, prompt = SamplingConfig(temperature=1.0), get("minp-sampling", p_base=0.3), (1, 3, 2)
    p_fn, q_fn = _dist_fn(target, cfg), _dist_fn(draft, cfg)
    exact = sequence_distribution(rule, p_fn, q_fn, 2, 3, prompt, verifier=verifier)
    truncated = sequence_distribution(rule, p_fn, None, 0, 3, prompt)
    assert max(abs(exact.get(k, 0) - v) for k, v in truncated.items()) < 1e-9 and exact.keys() <= truncated.keys()
    untruncated = sequence_distribution("lossless", p_fn, None, 0, 3, prompt)
    outside = sum(v for k, v in untruncated.items() if k not in truncated)
    assert outside > 0.05, outside  # the wrong law's mass on continuations of probability zero here
    eng = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    outs = eng.generate([list(prompt)] * N_TRUNC, rule=rule, sampling=cfg, seed=list(range(N_TRUNC)), gamma=2,
                        max_new_tokens=3, batch_size=50, verifier=verifier)
    counts: dict = {}
    for out in outs:
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    pvalue = chi_square_pvalue(counts, exact)
    assert pvalue > 1e-4, pvalue
    assert sum(o.metrics.accepted for o in outs) > 0  # drafts were verified, not only bonus tokens
