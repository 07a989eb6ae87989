"""Adaptive draft length: pick gamma each round to maximize expected tokens per second.

Model (the standard i.i.d. one of Leviathan et al.): each drafted token is accepted with probability alpha
given the previous ones were, so a round with gamma drafts yields E[tokens] = sum_{i=0}^{gamma} alpha^i
(bonus/correction included), and costs gamma * c_draft + C_target(gamma). alpha, c_draft and the target's cost
are running averages of what the engine measures.

The target's cost. A round scores a block of k = gamma + 1 tokens (the last committed token and the drafts) in
one call. On a GPU that costs about one decode step whatever k; on a CPU it grows with k (llama.cpp on this
project's 2-core CPU: k=2: 1.6 steps, k=4: 2.6, k=8: 4.5, k=12: 5.7). With a *block-cost curve*
``target_cost(k)`` (relative, ``target_cost(1) = 1``; a backend that measured it, e.g. llama.cpp's) the schedule
uses C_target(gamma) = c_unit * target_cost(gamma + 1), with c_unit (seconds per single step) measured online as
target_s / target_cost(k). Without one it LEARNS the curve: a running average of the seconds of every block length
it has run, interpolated linearly between them (extrapolated past both ends); with a single length measured the
cost is taken as flat (the GPU picture), and the first decision after that runs one plain round (k = 1) so that
the curve has its anchor. On a CPU where a 6-token block costs five single steps this is what keeps the schedule
from drafting when drafting does not pay.

Never slower than target-only. gamma = 0 (target alone: E = 1 token for c_unit) is always a candidate, so when
drafting does not pay the choice falls back to it. A row stuck at 0 would never measure alpha again, so every
``probe_every`` rounds at 0 it probes once with the best gamma >= 1; each probe that does not change the decision
doubles the interval (up to ``probe_max``), so the probes' cost vanishes when drafting keeps not paying. A probe
can cost far more than its drafted token: a draft model that sat out must first catch up on every token committed
since (the whole prompt, the first time). So probes also live within a budget: every plain round adds ``overhead``
(3%) of its seconds, and a probe runs only when the budget covers what it is expected to cost beyond a plain round:
the last probe's cost per token it had to take in (``catch_up``, which the drafter sets each round, plus the one
it drafted) times this round's; the probes' share of the time stays within ``overhead`` whatever a probe costs.
Before any probe has run, the price per token is the one the draft showed taking in a prompt: a round that ran a
prefill and drafted reports its draft seconds and the tokens the draft took in (:meth:`AdaptiveGamma.observe_ingest`),
so that a later request's first probe, which must take in that request's whole prompt, is priced too. Only a
schedule that has neither seen a draft take in a prompt nor probed runs its first probe unpriced.

A backend's block-cost curve (llama.cpp's, measured once on some machine) is a prior for the shape only: block
lengths this schedule has run are priced at what they cost here.

Rows that find nothing to draft. A token-only drafter (prompt lookup) asked for gamma tokens may find no match and
draft none: that round yields the one target token whatever gamma was asked, and says nothing about alpha. So each
row also keeps ``hit``, the running share of its rounds asked to draft in which it drafted anything, and a row's
expected tokens are 1 + hit * sum_{i=1}^{gamma} alpha^i; without it a row that rarely matches would count as a row
accepting at its last (or prior) alpha and pull a batch's decision towards drafting.

The first update of a schedule is taken to be the row's first round, whose target and draft times include the
prompt's prefill: its times are not folded into the costs (its acceptance is).

Batches and trees. One decision can serve several rows: ``choose(alphas)`` maximises the batch's expected tokens,
sum_r E[tokens](alpha_r, gamma), per second of the batch's round, whose costs the caller folds in with
:meth:`AdaptiveGamma.observe_costs` (the drafters keep one schedule per batch size, since a round's cost grows with
its rows, and each row's own acceptance). A token tree of depth gamma makes the target score more than gamma + 1
tokens: ``block_len(gamma)`` says how many (the tree drafter's node count plus one), and the learned curve is then
indexed by the tokens actually scored; alpha is the per-depth acceptance, so sum_i alpha^i still counts the
expected accepted depth. A static tree's width is chosen with its depth: the caller (the tree drafter) asks for
each width's best rate with that width's ``block_len`` (:meth:`AdaptiveGamma.rate`) and each width's acceptance,
then lets :meth:`AdaptiveGamma.choose` decide the depth (or 0) at the fastest width.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

__all__ = ["PRIOR_ALPHA", "AdaptiveGamma", "best_gamma", "break_even_alpha", "expected_tokens", "interpolate_costs",
           "speedup"]

CostCurve = Callable[[int], float]
#: tokens the target scores in a round of a given depth
BlockLen = Callable[[int], int]
#: draft length of the first rounds when no block-cost curve is known yet (see :meth:`AdaptiveGamma.initial`)
FIRST_GAMMA = 2
#: acceptance assumed for a row nothing has measured yet
PRIOR_ALPHA = 0.7


def expected_tokens(alpha: float, gamma: int, hit: float = 1.0) -> float:
    """Expected tokens per round, sum_{i=0}^{gamma} alpha^i (Leviathan et al., Eq. 1 form); with ``hit`` < 1 (a
    token-only drafter that finds no draft in a fraction 1 - hit of its rounds, which then yield the one target
    token): 1 + hit * sum_{i=1}^{gamma} alpha^i."""
    return 1.0 + hit * sum(alpha**i for i in range(1, gamma + 1))


def interpolate_costs(points: dict[int, float], k: int) -> float:
    """Piecewise-linear cost curve through ``points`` (k -> cost), extrapolated linearly past both ends."""
    if k < 1:
        raise ValueError(f"a block has at least one token, got k={k}")
    ks = sorted(points)
    if len(ks) == 1:
        return points[ks[0]] * k / ks[0]
    if k in points:
        return float(points[k])
    i = bisect.bisect_left(ks, k)
    i = min(max(i, 1), len(ks) - 1)
    k0, k1 = ks[i - 1], ks[i]
    c0, c1 = points[k0], points[k1]
    return float(c0 + (c1 - c0) * (k - k0) / (k1 - k0))


def _check_curve(target_cost: CostCurve, k: int) -> float:
    c = float(target_cost(k))
    if not c > 0:
        raise ValueError(f"target_cost({k}) must be > 0, got {c}")
    return c


def speedup(alpha: float, gamma: int, target_cost: CostCurve | None = None, draft_cost: float = 0.0) -> float:
    """Expected tokens per unit time of gamma drafts per round, relative to target-only decoding.

    ``target_cost(k)``: cost of scoring a k-token block, in single-step units (None: 1 for every k, the GPU
    picture); ``draft_cost``: cost of one drafted token in the same units. Target-only (gamma = 0) is 1.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    cost = (1.0 if target_cost is None else _check_curve(target_cost, gamma + 1)) + gamma * draft_cost
    base = 1.0 if target_cost is None else _check_curve(target_cost, 1)
    return expected_tokens(alpha, gamma) / cost * base


def best_gamma(alpha: float, gamma_max: int, target_cost: CostCurve | None = None, draft_cost: float = 0.0) -> int:
    """The gamma in [0, gamma_max] with the highest :func:`speedup` (the smallest one on ties)."""
    best, best_s = 0, speedup(alpha, 0, target_cost, draft_cost)
    for g in range(1, gamma_max + 1):
        s = speedup(alpha, g, target_cost, draft_cost)
        if s > best_s + 1e-12:
            best, best_s = g, s
    return best


def break_even_alpha(gamma: int, target_cost: CostCurve | None = None, draft_cost: float = 0.0,
                     tol: float = 1e-9) -> float | None:
    """The smallest per-token acceptance alpha at which gamma drafts per round are as fast as target-only.

    :func:`speedup` increases with alpha, so this is a bisection; None when even alpha = 1 does not pay.
    """
    if gamma < 1:
        raise ValueError(f"break-even needs gamma >= 1, got {gamma}")
    if speedup(1.0, gamma, target_cost, draft_cost) < 1.0:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if speedup(mid, gamma, target_cost, draft_cost) >= 1.0:
            hi = mid
        else:
            lo = mid
    return hi


class AdaptiveGamma:
    """Running estimates + argmax over gamma in [0, gamma_max] of E[tokens](gamma) / cost(gamma).

    ``target_cost``: the target's block-cost curve k -> cost in single steps (e.g. a backend's ``block_cost``);
    None keeps a constant target cost per round. See the module docstring for probing and the first round.
    """

    def __init__(self, gamma_max: int = 8, alpha: float = PRIOR_ALPHA, decay: float = 0.1,
                 target_cost: CostCurve | None = None, probe_every: int = 16, probe_max: int = 256,
                 block_len: BlockLen | None = None, overhead: float = 0.03) -> None:
        if gamma_max < 0:
            raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 1 <= probe_every <= probe_max:
            raise ValueError(f"need 1 <= probe_every <= probe_max, got {probe_every}, {probe_max}")
        if target_cost is not None:
            _check_curve(target_cost, 1)
        self.gamma_max, self.alpha, self.decay = gamma_max, alpha, decay
        self.target_cost = target_cost
        #: tokens the target scores in a round of depth gamma (chains: gamma + 1; trees: nodes + 1)
        self.block_len: BlockLen = block_len or (lambda g: g + 1)
        self.c_draft: float | None = None  # seconds per drafted token
        self.c_target: float | None = None  # seconds per target forward (with a curve: per single step)
        self.block_s: dict[int, float] = {}  # no curve given: running seconds per block length k = gamma + 1
        self.anchors = 0  # plain rounds run to measure k = 1
        self.probe_every, self.probe_max = probe_every, probe_max
        self._interval = probe_every
        self._zeros = 0  # consecutive rounds that chose gamma 0
        if not 0 < overhead < 1:
            raise ValueError(f"overhead must be in (0, 1), got {overhead}")
        self.overhead = overhead
        self.budget_s = 0.0  # seconds of probing earned by plain rounds (overhead x their seconds), not yet spent
        self.probe_cost_s: float | None = None  # what the last probe cost beyond a plain round
        self.probe_spent_s = 0.0  # what every probe so far cost beyond a plain round (its draft + longer block)
        self.probe_s_per_token: float | None = None  # the last probe's cost per token it took in (catch-up + 1)
        self.ingest_s_per_token: float | None = None  # draft seconds per token of a prompt it took in (a prefill)
        #: tokens the draft must take in before it drafts in the coming round (set by the drafter; 0: none), or a
        #: function giving them, called only when a probe is due (counting them walks the rows' histories)
        self.catch_up: int | Callable[[], int] = 0
        self._probe_tokens = 1
        self._probing = False
        self.updates = 0
        self.probes = 0
        #: of the rounds this row was asked to draft, the share in which it drafted anything (prompt lookup finds
        #: no match in the others); a running average like alpha, 1 for drafters that always draft
        self.hit = 1.0
        self.drafted_rounds = 0  # rounds that measured alpha
        self.asked_rounds = 0  # rounds that measured hit

    def target_seconds(self, k: int) -> float:
        """Estimated seconds of scoring a k-token block: the given curve times the unit cost, or the learned one."""
        if self.target_cost is not None:
            if self.c_target is None:
                raise ValueError("costs not measured yet")
            if k in self.block_s:  # run here: its own cost, not the curve's
                return self.block_s[k]
            return self.c_target * float(self.target_cost(k))
        if not self.block_s:
            raise ValueError("costs not measured yet")
        if len(self.block_s) == 1:  # one length measured: flat until the anchor round measures k = 1
            return next(iter(self.block_s.values()))
        return max(interpolate_costs(self.block_s, k), 1e-12)

    def round_cost(self, gamma: int, block_len: BlockLen | None = None) -> float:
        """Estimated seconds of a round with ``gamma`` drafts (needs both costs measured); ``block_len``: the
        tokens such a round scores, if not this schedule's own (a tree of another width)."""
        if self.c_draft is None or self.c_target is None:
            raise ValueError("costs not measured yet")
        return gamma * self.c_draft + self.target_seconds((block_len or self.block_len)(gamma))

    def summary(self) -> dict[str, object]:
        """What the schedule believes now: acceptance, costs, the learned block costs, probes and anchors."""
        return {"alpha": self.alpha, "hit": self.hit, "c_draft_s": self.c_draft, "c_target_s": self.c_target,
                "block_s": dict(sorted(self.block_s.items())), "best": self.best(), "probes": self.probes,
                "anchors": self.anchors, "curve": "given" if self.target_cost is not None else "learned",
                "probe_cost_s": self.probe_cost_s, "probe_spent_s": self.probe_spent_s,
                "probe_budget_s": self.budget_s, "ingest_s_per_token": self.ingest_s_per_token}

    def best(self, alphas: Sequence[float] | None = None, block_len: BlockLen | None = None,
             hits: Sequence[float] | None = None) -> int:
        """The gamma maximising expected tokens per second under the current estimates (no probing); ``alphas``:
        the acceptances of the rows one decision serves (default: this schedule's own), ``hits`` their shares of
        rounds that draft anything (default 1 each); ``block_len`` as in :meth:`round_cost`."""
        if self.c_draft is None or self.c_target is None:
            return self.initial(alphas, block_len)
        best, best_rate = 0, 0.0
        for g in range(self.gamma_max + 1):
            rate = self.rate(g, alphas, block_len, hits)
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = g, rate
        return best

    def initial(self, alphas: Sequence[float] | None = None, block_len: BlockLen | None = None) -> int:
        """gamma before both costs are measured. With a block-cost curve: the best gamma for free drafts at the
        prior alpha (a draft that costs as much as the target makes any long first block a loss). Without one: a
        short first draft (:data:`FIRST_GAMMA`), since on a CPU a long block can cost several steps; the learned
        curve then says whether longer drafts pay (flat block costs, as on a GPU, take gamma up at once)."""
        if self.target_cost is None:
            return min(self.gamma_max, FIRST_GAMMA)
        alpha = self.alpha if not alphas else sum(alphas) / len(alphas)
        length = block_len or self.block_len
        return best_gamma(alpha, self.gamma_max, lambda k: self.target_cost(length(k - 1)))  # type: ignore[misc]

    def choose(self, alphas: Sequence[float] | None = None, block_len: BlockLen | None = None,
               hits: Sequence[float] | None = None) -> int:
        """This round's gamma: :meth:`best`, after the anchor round and with the rare probes that keep alpha
        measured while the schedule sits at 0 (module docstring). ``block_len`` and ``hits`` as in :meth:`best`."""
        if self.c_draft is None or self.c_target is None:
            return self.initial(alphas, block_len)
        if self.target_cost is None and 1 not in self.block_s and not self.anchors:
            self.anchors += 1  # one plain round: the learned curve's anchor at k = 1
            return 0
        g = self.best(alphas, block_len, hits)
        if g > 0:
            self._zeros, self._interval = 0, self.probe_every
            return g
        self._zeros += 1
        if self._zeros < self._interval or self.gamma_max == 0:
            return 0
        tokens = max(self.catch_up() if callable(self.catch_up) else self.catch_up, 0) + 1
        per_token = self.probe_s_per_token if self.probe_s_per_token is not None else self.ingest_s_per_token
        need = self.probe_cost_s if per_token is None else per_token * tokens
        if need is None or self.budget_s >= need:
            # probe: draft once so alpha stays measured; the next decision says whether it paid
            self._zeros, self._interval = 0, min(2 * self._interval, self.probe_max)
            self.probes += 1
            self._probing = True
            self._probe_tokens = tokens
            return max(1, max(range(1, self.gamma_max + 1), key=lambda g: self.rate(g, alphas, block_len, hits)))
        return 0

    def rate(self, g: int, alphas: Sequence[float] | None = None, block_len: BlockLen | None = None,
             hits: Sequence[float] | None = None) -> float:
        """Expected tokens per second of a round of depth ``g`` for the rows of ``alphas`` whose shares of rounds
        that draft anything are ``hits`` (default: 1 each; this schedule's own when ``alphas`` is None); needs the
        costs."""
        cost = self.round_cost(g, block_len)
        if not alphas:
            alphas, hits = [self.alpha], [self.hit]
        if hits is not None and len(hits) != len(alphas):
            raise ValueError(f"{len(alphas)} acceptances but {len(hits)} hit rates")
        tokens = sum(expected_tokens(a, g, h) for a, h in zip(alphas, hits or [1.0] * len(alphas), strict=True))
        return tokens / cost if cost > 0 else float("inf")

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.decay) * old + self.decay * new

    def update(self, drafted: int, accepted: int, draft_s: float, target_s: float, scored: int | None = None) -> None:
        """Fold in one round: ``accepted`` of ``drafted`` tokens; the positions reached were min(drafted,
        accepted + 1), each a Bernoulli(alpha) trial. The first update's times (prefill) are not used."""
        first = self.updates == 0
        self.observe_acceptance(drafted, accepted)
        if not first:
            self.observe_costs(drafted, draft_s, target_s, scored)

    def observe_acceptance(self, drafted: int, accepted: int, asked: int | None = None) -> None:
        """Fold in one row's acceptance: ``accepted`` of ``drafted`` (depths, for a tree); ``asked``: the depth
        the round asked of it (None: not known), so that a round asked to draft that drafted nothing lowers
        :attr:`hit` (its alpha is not measured)."""
        self.updates += 1
        if asked is not None and asked > 0:
            self.asked_rounds += 1
            self.hit = self._ema(self.hit, 1.0 if drafted else 0.0)
        if drafted:
            self.drafted_rounds += 1
            reached = min(drafted, accepted + 1)
            self.alpha = min(max(self._ema(self.alpha, accepted / reached), 0.0), 0.999)

    def observe_ingest(self, draft_s: float, tokens: int) -> None:
        """Fold in a round that ran a prefill and drafted: the draft took in ``tokens`` tokens (its prompt, and
        what it drafted) in ``draft_s`` seconds. Its cost per token prices probes until one has run (module
        docstring); the round's times are not costs of a decode round, so nothing else is updated."""
        if tokens < 1 or draft_s < 0:
            raise ValueError(f"need tokens >= 1 and draft_s >= 0, got {tokens}, {draft_s}")
        self.ingest_s_per_token = self._ema(self.ingest_s_per_token, draft_s / tokens)

    def observe_costs(self, drafted: int, draft_s: float, target_s: float, scored: int | None = None) -> None:
        """Fold in one round's seconds: ``draft_s`` for ``drafted`` draft steps, ``target_s`` for scoring
        ``scored`` tokens (default ``drafted + 1``, a chain). The caller leaves out rounds that ran a prefill."""
        k = drafted + 1 if scored is None else scored
        if drafted:
            self.c_draft = self._ema(self.c_draft, draft_s / drafted)
        elif self.c_draft is None:
            self.c_draft = 0.0
        plain = self.block_s.get(1)
        self.block_s[k] = self._ema(self.block_s.get(k), target_s)
        if self.target_cost is None:
            self.c_target = self.target_seconds(1)
        else:
            self.c_target = self._ema(self.c_target, target_s / float(self.target_cost(k)))
        if drafted == 0:
            self.budget_s += self.overhead * target_s
        elif self._probing:  # what probing cost beyond the plain round it replaced
            extra = draft_s + max(target_s - (plain if plain is not None else target_s), 0.0)
            self.probe_cost_s = extra
            self.probe_spent_s += extra
            self.probe_s_per_token = extra / self._probe_tokens
            self.budget_s = max(self.budget_s - extra, 0.0)
        self._probing = False
