"""The sandbox stops hostile code and the harness carries on afterwards.

Every hostile snippet here is bounded by itself (loop caps, short sleeps), so that even a broken
sandbox cannot hurt the test machine: the fork test forks at most 300 children that each sleep
1 s and exit, and never fork again.
"""

from __future__ import annotations

import ast
import os
import uuid
from pathlib import Path

import pytest

from verispec.eval.sandbox import _isolation_mode, run_python

NAMESPACES = _isolation_mode() == "namespace"
needs_ns = pytest.mark.skipif(not NAMESPACES, reason="needs root and a working unshare")
HOOK_MODES = [True, pytest.param(False, marks=needs_ns, id="os-only")]


def _harness_still_works() -> None:
    res = run_python("print(sum(range(10)))")
    assert res.ok and res.stdout.strip() == "45", res


def test_normal_run_and_clean_environment():
    res = run_python("import os, sys\nprint(os.getcwd())\nprint(sorted(os.environ))\n"
                     "print(sys.flags.isolated, sys.flags.no_site)\nprint(open('f', 'w').write('x'))")
    assert res.ok, res
    cwd, env, flags, wrote = res.stdout.splitlines()
    assert "verispec-sbx-" in cwd
    assert set(ast.literal_eval(env)) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "OLDPWD", "SHLVL", "_"}
    assert flags == "1 1" and wrote == "1"
    assert not Path(cwd).exists() or not any(Path(cwd).iterdir())  # scratch is cleaned up


def test_exit_status_and_exceptions_are_reported():
    assert run_python("import sys; sys.exit(3)").returncode == 3
    res = run_python("raise ValueError('boom')")
    assert not res.ok and "ValueError: boom" in res.stderr


def test_sleep_forever_is_stopped_by_timeout():
    res = run_python("import time\nwhile True: time.sleep(1)", timeout_s=1.5)
    assert res.timed_out and not res.ok and res.killed_reason == "timeout"
    assert res.duration_s < 10
    _harness_still_works()


def test_busy_loop_hits_cpu_limit():
    res = run_python("while True: pass", timeout_s=30, cpu_s=1)
    assert not res.ok and not res.timed_out and res.killed_reason == "cpu", res
    _harness_still_works()


def test_unbounded_allocation_is_stopped():
    res = run_python("x = []\nwhile True: x.append(bytearray(10**7))", memory_mb=256, timeout_s=20)
    assert not res.ok and not res.timed_out
    assert res.killed_reason == "memory" or (res.returncode or 0) < 0, res
    _harness_still_works()


FORK = """
import os, time
n = 0
for i in range(300):
    try:
        pid = os.fork()
    except (OSError, PermissionError) as e:
        print("refused", n, type(e).__name__)
        break
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    n += 1
print("forked", n)
"""


@pytest.mark.parametrize("hook", HOOK_MODES)
def test_fork_bomb_is_refused_or_capped(hook):
    res = run_python(FORK, audit_hook=hook, nproc=16, timeout_s=20)
    out = res.stdout
    if hook:
        assert "refused 0 PermissionError" in out, res
    else:  # the kernel's RLIMIT_NPROC for user nobody caps it
        assert "refused" in out, res
        assert int(out.split("forked")[1]) <= 16, res
    _harness_still_works()


@pytest.mark.parametrize("hook", HOOK_MODES)
def test_writing_outside_scratch_fails(hook, tmp_path):
    outside = Path("/tmp") / f"xyz_outside_{uuid.uuid4().hex}"
    repo_file = Path(__file__).resolve().parents[2] / f"xyz_outside_{uuid.uuid4().hex}"
    code = "\n".join(
        f"try:\n    open({str(p)!r}, 'w').write('x')\n    print('WROTE')\nexcept OSError as e:\n"
        f"    print('blocked', type(e).__name__)" for p in (outside, repo_file)
    ) + "\nimport os\ntry:\n    os.remove('/etc/hostname')\nexcept OSError:\n    print('blocked rm')"
    res = run_python(code, audit_hook=hook)
    assert "WROTE" not in res.stdout and res.stdout.count("blocked") == 3, res
    assert not outside.exists() and not repo_file.exists()
    assert os.path.exists("/etc/hostname") or not os.path.exists("/etc")
    _harness_still_works()


@needs_ns
def test_project_and_home_are_hidden():
    repo = Path(__file__).resolve().parents[2]
    res = run_python(f"import os\nprint(os.path.exists({str(repo / 'pyproject.toml')!r}))\n"
                     "print(os.listdir('/root'))")
    assert res.ok and res.stdout.split() == ["False", "[]"], res


@pytest.mark.parametrize("hook", HOOK_MODES)
def test_network_is_unreachable(hook):
    code = ("import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)")
    res = run_python(code, audit_hook=hook, timeout_s=10)
    assert "CONNECTED" not in res.stdout and "blocked" in res.stdout, res
    _harness_still_works()


def test_output_is_capped():
    res = run_python("import sys\nfor _ in range(200): sys.stdout.write('x' * 100000)",
                     max_output_bytes=10000)
    assert res.ok and len(res.stdout) == 10000 and res.output_truncated


@pytest.mark.parametrize("mode", ["uid", "rlimit"])
def test_weaker_modes_still_confine(mode):
    if mode == "uid" and os.geteuid() != 0:
        pytest.skip("needs root")
    assert run_python("print(1)", isolation=mode).ok
    assert run_python("import time; time.sleep(60)", timeout_s=1, isolation=mode).timed_out
    res = run_python("import socket; socket.socket()", isolation=mode)
    assert not res.ok and "PermissionError" in res.stderr
