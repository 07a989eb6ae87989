"""Run a sweep on a Ray cluster: units are spread over a pool of Ray actors, the driver writes the results.

Each worker is a Ray actor (:class:`UnitWorker`) that loads the engine once and then runs units with the local
runner's :class:`~verispec.eval.run.UnitExecutor` (:func:`~verispec.eval.run.run_unit`), one unit at a
time. The driver is the only writer of the run directory: it finds the pending units with
:func:`~verispec.eval.run.open_run` (same lock, settings check, torn-line repair and resume as a local run),
and appends each result line to ``results.jsonl`` with the local runner's writer (one ``write``, flush and
``fsync`` per line) as soon as it arrives. So a Ray run directory is a local run directory: resume (with or
without Ray), ``--shard``, ``bench report`` and ``bench estimate`` read it unchanged. A unit is a pure function
of its config and seed, so which worker ran it does not change its result.

Failures, as in the local runner, go to ``errors.jsonl`` and are retried by the next ``bench run``:

- a unit that raises on its worker is logged once (``{key, error, at, worker}``) and not retried in this run;
- a worker that dies while running a unit (process killed, out of memory, node lost) is replaced by a new
  actor and the unit is run again, at most ``max_retries`` times; every loss is logged
  (``{key, error, at, worker, attempt, retried}``), and a unit still without a result after its last attempt
  counts as failed;
- a worker that cannot start (its engine fails to load) is logged and not replaced; when no worker is left the
  run stops with :class:`RuntimeError` (everything written so far stays).

``ray`` is imported only here, and only when a Ray run starts: ``pip install 'verispec[ray]'``.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.eval.grid import SweepConfig, WorkUnit
from verispec.eval.run import (
    EngineFactory,
    RunPlan,
    RunSummary,
    UnitExecutor,
    _progress,
    default_engine_factory,
    open_run,
)
from verispec.eval.store import append_line, log_failure
from verispec.eval.tasks.base import Problem

__all__ = ["RayOptions", "RaySummary", "UnitWorker", "parse_ray_address", "run_sweep_ray"]

INSTALL_HINT = "Ray is not installed; install it with: pip install 'verispec[ray]'  (or: pip install 'ray[default]')"
_WAIT_S = 30.0  # the driver wakes at least this often to refresh the progress line


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    return ray


def parse_ray_address(text: str | None) -> str:
    """``--ray`` value -> address: ``auto`` (also the empty value), ``local``, ``HOST:PORT`` or
    ``ray://HOST:PORT``; anything else is refused with ValueError."""
    text = (text or "auto").strip()
    if text in ("auto", "local") or text.startswith("ray://"):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray takes auto, local, HOST:PORT or ray://HOST:PORT, got {text!r}")
    return text


@dataclass(frozen=True)
class RayOptions:
    """Where and how a sweep runs on Ray.

    ``address``: ``auto`` (Ray's own discovery: ``RAY_ADDRESS``, else the cluster last started on this machine
    with ``ray start``, else a new local instance), ``local`` (always a new instance on this machine),
    ``HOST:PORT`` of a cluster's head (GCS port, 6379 by default) or ``ray://HOST:PORT`` (Ray client).
    Ignored when the calling process has already called ``ray.init``: that connection is used and left open.
    ``workers``: actors in the pool (default: as many as the cluster's CPUs / GPUs hold, at most one per unit).
    ``cpus_per_worker`` / ``gpus_per_worker``: Ray resources each actor reserves (GPU: the engine must use it).
    ``max_retries``: how often a unit whose worker died is run again before it counts as failed.
    """

    address: str = "auto"
    workers: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        parse_ray_address(self.address)
        # counts are whole numbers (a pool of 2.5 actors would fail only once Ray is up); bool is not a count
        if self.workers is not None and (not _is_int(self.workers) or self.workers < 1):
            raise ValueError(f"Ray workers must be an integer >= 1, got {self.workers!r}")
        if not _is_number(self.cpus_per_worker) or not self.cpus_per_worker > 0:
            raise ValueError(f"CPUs per Ray worker must be > 0, got {self.cpus_per_worker!r}")
        if not _is_number(self.gpus_per_worker) or not self.gpus_per_worker >= 0:
            raise ValueError(f"GPUs per Ray worker must be >= 0, got {self.gpus_per_worker!r}")
        if not _is_int(self.max_retries) or self.max_retries < 0:
            raise ValueError(f"max retries must be an integer >= 0, got {self.max_retries!r}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class RaySummary(RunSummary):
    """:class:`RunSummary` plus what the pool did: workers that started, workers lost, units run again."""

    address: str = ""
    workers: int = 0
    lost_workers: int = 0
    retried: int = 0


class UnitWorker:
    """A Ray actor: loads the engine once (``engine_factory(cfg)``), then runs units one at a time."""

    def __init__(self, cfg: SweepConfig, problems: Mapping[str, Sequence[Problem]],
                 engine_factory: EngineFactory | None = None) -> None:
        self.execute = UnitExecutor(cfg, (engine_factory or default_engine_factory)(cfg), problems)

    def info(self) -> dict[str, Any]:
        """Where this worker runs: ``{host, pid, node}`` (returns once the engine is loaded)."""
        import ray

        return {"host": socket.gethostname(), "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def run(self, unit: WorkUnit) -> dict:
        """The unit's result line (:func:`~verispec.eval.run.run_unit`)."""
        return self.execute(unit)


@contextmanager
def _connected(ray: Any, address: str, say: Callable[[str], None]) -> Iterator[None]:
    """Connect to (or start) Ray unless this process already has; shut down only what was opened here."""
    if ray.is_initialized():
        say("Ray: using this process's existing connection")
        yield
        return
    try:
        ray.init(address=None if address == "auto" else address, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "a Ray cluster (auto)" if address == "auto" else f"the Ray cluster at {address}"
        raise RuntimeError(f"could not connect to {where}: {exc}") from None
    try:
        yield
    finally:
        ray.shutdown()


def _pool_size(ray: Any, opts: RayOptions, n_units: int, say: Callable[[str], None]) -> int:
    res = ray.cluster_resources()
    cpus, gpus = float(res.get("CPU", 0)), float(res.get("GPU", 0))
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    fits = math.floor(cpus / opts.cpus_per_worker + 1e-9)
    if opts.gpus_per_worker > 0:
        fits = min(fits, math.floor(gpus / opts.gpus_per_worker + 1e-9))
    need = f"{opts.cpus_per_worker:g} CPU" + (f", {opts.gpus_per_worker:g} GPU" if opts.gpus_per_worker else "")
    say(f"Ray cluster: {nodes} node(s), {cpus:g} CPUs, {gpus:g} GPUs; room for {fits} worker(s) of {need}")
    if opts.workers is None:
        if fits < 1:
            raise RuntimeError(f"the Ray cluster has {cpus:g} CPUs and {gpus:g} GPUs, too few for one worker of "
                               f"{need}; lower --ray-cpus-per-worker / --ray-gpus-per-worker or add nodes")
        return min(fits, n_units)
    if opts.workers > fits:
        say(f"{opts.workers} workers asked for, the cluster holds {fits} now: the others wait for resources")
    return min(opts.workers, n_units)


def _where(info: Mapping[str, Any] | None) -> str:
    if not info:
        return "a worker that had not started"
    return f"pid {info['pid']} on {info['host']} (node {str(info['node'])[:12]})"


def _message(exc: BaseException) -> str:
    """One line on a Ray error: the unit's own exception, the exception that stopped a worker's start (the last
    line of Ray's report), or the first line of Ray's report on a lost worker."""
    cause = getattr(exc, "cause", None)  # RayTaskError: the exception the unit raised on the worker
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"[:500]
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if ln.strip()]
    if getattr(exc, "actor_init_failed", False) and lines:
        return lines[-1][:500]  # "FileNotFoundError: ..." raised in UnitWorker.__init__
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


def _kill(ray: Any, actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone, or the connection is closing
        pass


class _Pool:
    """The driver's loop: start actors, hand each ready one a unit, collect results, replace lost actors."""

    def __init__(self, ray: Any, opts: RayOptions, plan: RunPlan, summary: RaySummary, size: int,
                 engine_factory: EngineFactory | None, progress: bool, say: Callable[[str], None]) -> None:
        self.ray, self.opts, self.plan, self.summary, self.say = ray, opts, plan, summary, say
        self.actor_cls = ray.remote(UnitWorker).options(
            num_cpus=opts.cpus_per_worker, num_gpus=opts.gpus_per_worker, max_restarts=0, max_task_retries=0)
        self.problems_ref = ray.put(plan.problems)
        self.engine_factory = engine_factory
        self.size = size
        self.starting: dict[Any, Any] = {}  # info() ref -> actor
        self.idle: list[tuple[Any, dict]] = []
        self.busy: dict[Any, tuple[WorkUnit, Any, dict]] = {}  # run() ref -> (unit, actor, info)
        self.actors: list[Any] = []
        self.queue: deque[WorkUnit] = deque(plan.todo)
        self.attempts: Counter[str] = Counter()
        self.written: set[str] = set()
        self.ran: dict[str, int] = {}  # worker -> units it completed
        self.start_error = ""
        self.bar = _progress(len(plan.todo), progress)
        self.passed = 0
        self.be_sum = 0.0

    def _start_worker(self) -> None:
        actor = self.actor_cls.remote(self.plan.cfg, self.problems_ref, self.engine_factory)
        self.actors.append(actor)
        self.starting[actor.info.remote()] = actor

    def _refresh(self) -> None:
        if self.bar is None:
            return
        s = self.summary
        n = max(s.completed, 1)
        self.bar.set_postfix_str(
            f"workers {len(self.idle) + len(self.busy)} (+{len(self.starting)} starting) | running {len(self.busy)}"
            f" | failed {s.failed} | retried {s.retried} | BE {self.be_sum / n:.2f} acc {100 * self.passed / n:.0f}%",
            refresh=False)

    def _finish(self) -> None:
        """One more unit settled (a result, or a failure not retried in this run)."""
        if self.bar is not None:
            self.bar.update(1)

    def run(self, out: Any) -> None:
        for _ in range(self.size):
            self._start_worker()
        waited = 0.0
        while self.queue or self.busy:
            while self.idle and self.queue:
                actor, info = self.idle.pop()
                unit = self.queue.popleft()
                self.busy[actor.run.remote(unit)] = (unit, actor, info)
            if not (self.starting or self.idle or self.busy):
                raise RuntimeError(f"no Ray worker left to run the {len(self.queue)} remaining units; the last "
                                   f"worker error: {self.start_error or 'none'}")
            self._refresh()
            ready, _ = self.ray.wait(list(self.starting) + list(self.busy), num_returns=1, timeout=_WAIT_S)
            if not ready:
                waited += _WAIT_S
                if not (self.idle or self.busy) and waited % 300 < _WAIT_S:
                    self.say(f"waiting for Ray workers to start ({len(self.starting)} pending, {waited:.0f} s)")
                continue
            waited = 0.0
            ref = ready[0]
            if ref in self.starting:
                self._started(ref)
            else:
                self._collected(ref, out)

    def _started(self, ref: Any) -> None:
        actor = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            self.start_error = _message(exc)
            self.say(f"a Ray worker could not start: {self.start_error}")
            _kill(self.ray, actor)
            return
        self.summary.workers += 1
        self.ran[_where(info)] = 0
        self.say(f"worker {self.summary.workers} ready: {_where(info)}")
        self.idle.append((actor, info))

    def _collected(self, ref: Any, out: Any) -> None:
        ray, s = self.ray, self.summary
        unit, actor, info = self.busy.pop(ref)
        try:
            rec = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the unit raised on a healthy worker: as a local failure
            msg = _message(exc)
            s.failed += 1
            s.failures.append(f"{unit.key}: {msg}")
            log_failure(s.run_dir, unit.key, msg, worker=_where(info))
            self.say(f"FAILED {unit.key}: {msg}")
            self.idle.append((actor, info))
            self._finish()
        except ray.exceptions.RayError as exc:  # the worker died (killed, out of memory, node lost)
            self._lost(unit, actor, info, exc)
        else:
            if rec.get("key") != unit.key or unit.key in self.written:
                raise RuntimeError(f"worker returned {rec.get('key')!r} for unit {unit.key!r}")  # a bug, not data
            append_line(out, rec)
            self.written.add(unit.key)
            self.ran[_where(info)] += 1
            s.completed += 1
            self.passed += rec["grade"]["passed"]
            self.be_sum += rec["be"]
            self.idle.append((actor, info))
            self._finish()

    def _lost(self, unit: WorkUnit, actor: Any, info: dict, exc: BaseException) -> None:
        s = self.summary
        s.lost_workers += 1
        _kill(self.ray, actor)
        self.attempts[unit.key] += 1
        attempt = self.attempts[unit.key]
        retry = attempt <= self.opts.max_retries
        msg = f"worker lost: {_message(exc)}"
        log_failure(s.run_dir, unit.key, msg, worker=_where(info), attempt=attempt, retried=retry)
        if retry:
            s.retried += 1
            self.queue.appendleft(unit)
            self.say(f"worker {_where(info)} lost while running {unit.key}; running it again "
                     f"(retry {attempt} of {self.opts.max_retries})")
        else:
            s.failed += 1
            s.failures.append(f"{unit.key}: {msg}")
            self.say(f"FAILED {unit.key}: {msg} ({attempt} attempts)")
            self._finish()
        if self.queue:
            self._start_worker()

    def close(self) -> None:
        if self.bar is not None:
            self._refresh()
            self.bar.close()
        for where, n in self.ran.items():
            self.say(f"{n} units ran on {where}")
        for actor in self.actors:
            _kill(self.ray, actor)


def run_sweep_ray(
    config: SweepConfig | str | Path,
    out_dir: str | Path,
    *,
    options: RayOptions | None = None,
    engine_factory: EngineFactory | None = None,
    limit: int | None = None,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool = True,
    max_units: int | None = None,
    log: Callable[[str], None] | None = None,
    methods: Sequence[str] | None = None,
) -> RaySummary:
    """Run (or resume) a sweep into ``out_dir`` on Ray; arguments as :func:`~verispec.eval.run.run_sweep`
    (no ``shard``: Ray spreads the units), plus ``options`` (:class:`RayOptions`). ``engine_factory`` must be
    importable on the workers (a module-level function); default: the configured pair.

    Ray is connected only when units are pending, so resuming a finished run needs no cluster.
    """
    opts = options or RayOptions()
    ray = _import_ray()
    start = time.perf_counter()
    say = log or (lambda s: None)
    with open_run(config, out_dir, limit=limit, tasks=tasks, seeds=seeds, max_units=max_units, log=say,
                  methods=methods) as plan:
        summary = RaySummary(**vars(plan.summary), address=opts.address)
        if plan.todo:
            with _connected(ray, opts.address, say):
                size = _pool_size(ray, opts, len(plan.todo), say)
                say(f"starting {size} Ray worker(s), each loads the engine once")
                pool = _Pool(ray, opts, plan, summary, size, engine_factory, progress, say)
                try:
                    with open(plan.results_path, "ab") as out:
                        pool.run(out)
                finally:
                    pool.close()
    summary.seconds = time.perf_counter() - start
    return summary
