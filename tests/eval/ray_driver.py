"""Helper of ``test_ray_runner.py``: runs Ray sweeps inside a private network namespace (only loopback).

Usage (from the test, under ``unshare --net --pid --fork --kill-child --mount-proc``):

    python3 ray_driver.py lo-up                               # bring the namespace's loopback up (no `ip` needed)
    python3 ray_driver.py phases SPEC.json OUT.json HOST:PORT  # the phases of SPEC in order, on that cluster

SPEC: ``{"phases": [{"name", "config", "run_dir", "workers", "factory", "kill_after"}]}``; each phase's summary (or
error) goes to OUT. ``factory`` "flaky" makes every unit with the generation seed
of (seed 0, toy/1) raise; "kill_after": N SIGKILLs one worker process while it runs a unit, once the results
file holds N lines.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any


def loopback_up() -> None:
    """``ip link set lo up`` with two ioctls."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, struct.pack("16sH14s", b"lo", 0, b"")))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


class Flaky:
    """An engine whose units of one (seed, problem) raise (defined in __main__: Ray ships it by value)."""

    def __init__(self, engine: Any, bad_seed: int) -> None:
        self.engine, self.tokenizer, self.bad_seed = engine, engine.tokenizer, bad_seed

    def generate(self, prompt_ids: Any, **kwargs: Any) -> Any:
        if kwargs.get("seed") == self.bad_seed:
            raise RuntimeError("boom on purpose")
        return self.engine.generate(prompt_ids, **kwargs)


def flaky_factory(cfg: Any) -> Any:
    from verispec.eval.grid import generation_seed
    from verispec.eval.run import default_engine_factory

    return Flaky(default_engine_factory(cfg), generation_seed(0, "toy", "toy/1"))


def kill_one_worker(results: Path, after_lines: int, deadline: float, seen: dict) -> None:
    """SIGKILL one Ray worker process while it runs a unit (process title ``ray::UnitWorker.run``). Every
    process of this PID namespace belongs to the test, so /proc is searched whole."""
    while time.time() < deadline:
        if results.exists() and results.read_bytes().count(b"\n") >= after_lines:
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    title = cmdline.read_bytes().split(b"\0")[0]
                except OSError:  # the process ended
                    continue
                if title.startswith(b"ray::UnitWorker.run"):
                    seen["lines_at_kill"] = results.read_bytes().count(b"\n")
                    pid = int(cmdline.parent.name)
                    os.kill(pid, signal.SIGKILL)
                    seen["killed_pid"] = pid
                    return
        time.sleep(0.005)


def run_phases(spec_path: str, out_path: str, address: str) -> None:
    import ray

    from verispec.eval.ray_runner import RayOptions, run_sweep_ray

    spec = json.loads(Path(spec_path).read_text())
    ray.init(address=address, logging_level="WARNING")
    report: dict[str, Any] = {}
    try:
        for ph in spec["phases"]:
            seen: dict[str, Any] = {}
            killer = None
            if ph.get("kill_after") is not None:
                killer = threading.Thread(target=kill_one_worker, daemon=True, args=(
                    Path(ph["run_dir"]) / "results.jsonl", ph["kill_after"], time.time() + 90, seen))
                killer.start()
            log: list[str] = []
            t0 = time.time()
            try:
                s = run_sweep_ray(ph["config"], ph["run_dir"], options=RayOptions(workers=ph.get("workers")),
                                  engine_factory=flaky_factory if ph.get("factory") == "flaky" else None,
                                  progress=False, log=log.append)
            except Exception as exc:  # reported to the test, which decides
                report[ph["name"]] = {"error": f"{type(exc).__name__}: {exc}", "log": log}
                continue
            finally:
                if killer is not None:
                    killer.join(timeout=1)
            summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items()}
            report[ph["name"]] = {"summary": summary, "log": log, "seconds": time.time() - t0, **seen}
    finally:
        ray.shutdown()
        Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "lo-up":
        loopback_up()
    else:
        run_phases(sys.argv[2], sys.argv[3], sys.argv[4])
