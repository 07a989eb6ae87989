"""Failures on the way in and out of a batch (toy engine): a request whose row cannot be released or reported fails
alone and its handle still finishes; a row whose start fails half-way leaves no cache row behind."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from verispec.core.sampling import SamplingConfig
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import Request, Row
from verispec.testing import toy_engine

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture
def engine() -> Any:
    return toy_engine("model", cache=False)  # a fresh engine: the tests patch it and count its rows


def _requests(n: int) -> list[Request]:
    return [Request([1 + i % 60, (3 * i) % 64, 7], sampling=GREEDY, max_new_tokens=4, gamma=2) for i in range(n)]


def test_failing_release_or_result_fails_only_its_request(engine, monkeypatch):
    """24 requests, 4 at a time; releasing 5 of the rows and reporting 3 others raises. Every handle finishes
    (bounded wait: a stuck one fails the test) and runs its on_done once; the 8 carry finish_reason "error" and the
    injected message; the others equal a clean run; no step raises; only the rows whose release failed stay held."""
    n = 24
    clean = [r.token_ids for r in engine.generate([r.prompt for r in _requests(n)], sampling=GREEDY,
                                                   max_new_tokens=4, gamma=2)]
    requests = _requests(n)
    index = {id(r): i for i, r in enumerate(requests)}
    bad_release = {i for i in range(n) if i % 5 == 1}
    bad_result = {i for i in range(n) if i % 7 == 3}
    release, result = engine.release, engine.result

    def failing_release(row: Row) -> None:
        if index[id(row.request)] in bad_release:
            raise RuntimeError("injected release failure")
        release(row)

    def failing_result(row: Row) -> Any:
        if index[id(row.request)] in bad_result:
            raise RuntimeError("injected result failure")
        return result(row)

    monkeypatch.setattr(engine, "release", failing_release)
    monkeypatch.setattr(engine, "result", failing_result)
    sched = Scheduler(engine, max_batch=4)
    notified: list[int] = []
    hs = [sched.submit(r, on_done=lambda h: notified.append(h.id)) for r in requests]
    raised: list[Exception] = []

    def drive() -> None:  # as the server's worker: a step that raises is logged and stepping goes on
        while not sched.idle:
            try:
                sched.step()
            except Exception as exc:
                raised.append(exc)

    stepper = threading.Thread(target=drive, daemon=True)
    stepper.start()
    stepper.join(timeout=120)
    assert not stepper.is_alive(), "the scheduler never went idle"
    stuck = [i for i, h in enumerate(hs) if not h.done_event.wait(timeout=1)]
    assert stuck == [], f"handles never finished: {stuck}"
    assert raised == []
    assert sorted(notified) == [h.id for h in hs]
    for i, h in enumerate(hs):
        if i in bad_release | bad_result:
            word = "release" if i in bad_release else "result"
            assert h.result.finish_reason == "error" and h.error == h.result.error, i
            assert h.error == f"RuntimeError: injected {word} failure", i
            assert h.result.token_ids == h.tokens  # what it committed before its row failed to leave
        else:
            assert h.error is None and h.result.finish_reason == "length", i
            assert h.result.token_ids == clean[i], i
    assert engine.target.num_rows == len(bad_release)


class _BrokenGrammar:
    """A grammar compiler whose request checks pass and whose per-row constraint fails."""

    def grammar(self, response_format: object) -> None:
        return None

    def constraint(self, response_format: object) -> Any:
        raise RuntimeError("injected constraint failure")


def _boom(*args: object, **kwargs: object) -> Any:
    raise RuntimeError("injected start failure")


@pytest.mark.parametrize("where", ["constraint", "budget", "drafter", "drafter backend"])
def test_failing_start_leaves_no_rows(engine, monkeypatch, where):
    """A step of Engine.start after the target's row is allocated raises (the grammar constraint, the budget check,
    the drafter's add_row, or the draft model's row inside it): start re-raises, and the target and draft backends
    hold the rows they held before; the engine then decodes as usual."""
    req = _requests(1)[0]
    prepared = engine.prepare(req)
    kept = engine.start(_requests(1)[0])  # a row that stays: cleanup frees the failed row's only
    before = engine.target.num_rows, engine.drafter.backend.num_rows
    if where == "constraint":
        req.response_format = {"type": "regex", "regex": "ab"}
        monkeypatch.setattr(engine, "_grammar", _BrokenGrammar())
    elif where == "budget":
        req.budget = {"tv": 0.1}
        monkeypatch.setattr(engine, "_check_budget", _boom)
    elif where == "drafter":
        monkeypatch.setattr(engine.drafter, "add_row", _boom)
    else:
        monkeypatch.setattr(engine.drafter.backend, "add_row", _boom)
    with pytest.raises(RuntimeError, match="injected"):
        engine.start(req, prepared)
    assert (engine.target.num_rows, engine.drafter.backend.num_rows) == before
    monkeypatch.undo()
    engine.release(kept)
    assert (engine.target.num_rows, engine.drafter.backend.num_rows) == (0, 0)
    out = engine.generate([1, 2, 3], sampling=GREEDY, max_new_tokens=4, gamma=2)
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    assert (engine.target.num_rows, engine.drafter.backend.num_rows) == (0, 0)
