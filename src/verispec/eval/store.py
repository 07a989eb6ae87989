"""A run directory's storage: append-only JSONL result files, one per shard, a lock, the schema version.

Crash safety. Each result line is written with one ``write`` call, flushed and ``os.fsync``-ed before the next unit
starts; on (re)start a trailing partial line (a kill mid-write) is cut off (:func:`repair_tail`), and
:func:`read_results` merges every result file, first occurrence of each key. ``flock`` keeps two runners out of one
directory, while the shards of one split run side by side (:func:`locked`). Units that raised are logged to
``errors.jsonl`` (:func:`log_failure`). No torch here: reports read runs without loading models.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ERRORS", "RESULTS", "SCHEMA", "SHARD_RESULTS", "append_line", "locked", "log_failure", "now",
           "parse_shard", "read_lines", "read_results", "repair_tail", "replacing", "results_files",
           "shard_results_name", "shards_overlap", "write_atomic"]

RESULTS = "results.jsonl"
SHARD_RESULTS = "results-{i}-of-{n}.jsonl"
ERRORS = "errors.jsonl"
SCHEMA = 1


def now() -> str:
    """The current UTC time, ISO format, to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def repair_tail(path: Path) -> int:
    """Cut a trailing partial line (no final newline) off ``path``; return the number of bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # find the last newline
        pos, chunk = size, 1 << 16
        last_nl = -1
        while pos > 0 and last_nl < 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                last_nl = start + i
            pos = start
        keep = last_nl + 1
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


def results_files(run_dir: str | Path) -> list[Path]:
    """The result files of a run directory: ``results.jsonl`` first, then each shard's (sorted by name)."""
    run_dir = Path(run_dir)
    files = [run_dir / RESULTS] if (run_dir / RESULTS).exists() else []
    return files + sorted(run_dir.glob(SHARD_RESULTS.format(i="*", n="*")))


def shard_results_name(shard: tuple[int, int] | None) -> str:
    """File name the runner appends to: ``results.jsonl``, or ``results-I-of-N.jsonl`` for shard I of N."""
    return RESULTS if shard is None else SHARD_RESULTS.format(i=shard[0], n=shard[1])


def read_lines(path: Path) -> tuple[list[dict], bytes]:
    """Every complete result line of one file, in file order (duplicates kept), and the partial last line that a
    kill mid-write left (``b""`` when the file ends with a newline); ValueError naming the file and line for a
    malformed complete line."""
    lines = path.read_bytes().split(b"\n")
    complete = lines[:-1]  # the last element is b"" when the file ends with a newline, else a partial line
    out = []
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}:{n}: malformed result line ({exc})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
            raise ValueError(f"{path}:{n}: malformed result line (not an object with a string \"key\")")
        out.append(rec)
    return out, lines[-1]


def _read_file(path: Path, out: list[dict], seen: set[str]) -> None:
    for rec in read_lines(path)[0]:
        if rec["key"] in seen:
            continue
        seen.add(rec["key"])
        out.append(rec)


def read_results(run_dir: str | Path) -> list[dict]:
    """All complete result lines of a run directory (``results.jsonl`` and every shard's file), first occurrence
    of each key.

    A last line without its newline (a run killed mid-write) is ignored; a malformed line elsewhere raises.
    """
    out: list[dict] = []
    seen: set[str] = set()
    for path in results_files(run_dir):
        _read_file(path, out, seen)
    return out


def append_line(f: Any, rec: dict) -> None:
    f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    f.flush()
    os.fsync(f.fileno())


def shards_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether shards ``a`` = (I, N) and ``b`` = (J, M) share units: :func:`~verispec.eval.grid.shard_units` gives
    a unit to shard ``x mod N`` for a running index x, and some x has x = I mod N and x = J mod M exactly when
    I = J mod gcd(N, M) (so shard I of N is the union of shards I and I + N of 2N, and disjoint from the others)."""
    return (a[0] - b[0]) % math.gcd(a[1], b[1]) == 0


@contextlib.contextmanager
def locked(run_dir: Path, shard: tuple[int, int] | None = None) -> Iterator[None]:
    """An unsharded run holds ``.lock`` exclusively; shard I of N holds it shared and ``.lock-I-of-N``
    exclusively, and starts only where no running shard shares units with it (:func:`shards_overlap`): the
    shards of one N run side by side, and so do shards of 2N that split a shard of N no one runs; never an
    unsharded run beside a shard, a twin, or shards whose units overlap."""
    with contextlib.ExitStack() as stack:

        def take(path: Path, mode: int) -> None:
            f = stack.enter_context(open(path, "a"))
            try:
                fcntl.flock(f, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"another `bench run` holds {run_dir} (lock file {path})") from None
            stack.callback(fcntl.flock, f, fcntl.LOCK_UN)

        take(run_dir / ".lock", fcntl.LOCK_SH if shard else fcntl.LOCK_EX)
        if shard:
            # shards are admitted one at a time, so two overlapping shards cannot both find the other absent
            with open(run_dir / ".lock-admit", "a") as admit:
                fcntl.flock(admit, fcntl.LOCK_EX)
                try:
                    for path in run_dir.glob(".lock-*-of-*"):
                        other = _shard_of_lock(path.name)
                        if other is None or other == shard or not shards_overlap(shard, other):
                            continue
                        with open(path, "a") as f:
                            try:
                                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                            except BlockingIOError:
                                raise RuntimeError(
                                    f"shard {other[0]}/{other[1]} is running in {run_dir} and shares units with "
                                    f"shard {shard[0]}/{shard[1]} (lock file {path})") from None
                            fcntl.flock(f, fcntl.LOCK_UN)
                    take(run_dir / f".lock-{shard[0]}-of-{shard[1]}", fcntl.LOCK_EX)
                finally:
                    fcntl.flock(admit, fcntl.LOCK_UN)
        yield


def _shard_of_lock(name: str) -> tuple[int, int] | None:
    """``.lock-I-of-N`` -> (I, N); None for any other name."""
    i, sep, n = name.removeprefix(".lock-").partition("-of-")
    return (int(i), int(n)) if sep and i.isdigit() and n.isdigit() and int(n) > 0 else None


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write, renamed over ``path`` when the block ends without an error: a
    reader (or a kill mid-write) sees the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    yield tmp
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so that shards starting together never leave a torn file."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must look like I/N (e.g. 0/2), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard I/N needs 0 <= I < N, got {text!r}")
    return i, n


def log_failure(run_dir: Path, key: str, message: str, **extra: Any) -> None:
    """Append one line ``{key, error, at, **extra}`` to ``RUN_DIR/errors.jsonl`` (a unit that did not produce
    a result; it is retried on the next start)."""
    with open(run_dir / ERRORS, "a") as errs:
        errs.write(json.dumps({"key": key, "error": message, "at": now(), **extra}) + "\n")
