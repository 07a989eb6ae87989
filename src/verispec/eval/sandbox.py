"""Run untrusted (model-written) Python code in a separate, confined process.

``run_python(code)`` never executes ``code`` in this process. It starts a fresh interpreter
(``python -I -S -B``: no user site, no ``PYTHON*`` variables, no site-packages, no script dir on
``sys.path``) with a clean environment (only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG``) and a fresh
scratch directory as cwd and ``HOME``. The code is sent on stdin to a small trusted bootstrap
(``_BOOTSTRAP``) that installs an audit hook and then ``exec``\\ s it.

Layers, strongest first (``SandboxResult.isolation`` says which applied):

``"namespace"`` (root and a working ``unshare``; the case on this project's machines)
    new network namespace (only a down loopback: no connection anywhere, 127.0.0.1 included),
    new PID namespace (the process tree dies with it), new mount/IPC/UTS namespaces in which every
    mount is re-mounted read-only, ``/root``, ``/home``, ``/work`` and the project checkout are
    covered by empty read-only tmpfs, and the scratch dir is a size-capped tmpfs (the only
    writable place); then privileges drop to ``nobody`` (uid/gid 65534, no groups,
    ``no_new_privs``) so ``RLIMIT_NPROC`` applies.
``"uid"`` (root without ``unshare``)
    privileges drop to ``nobody`` (the bootstrap's first step); no network or mount isolation beyond the hook.
``"rlimit"`` (not root)
    rlimits, a new session and the audit hook only.

Packages: ``packages=("numpy", "sympy")`` makes those importable (read-only), as the reference graders'
environments have them: a copy of each (with its vendored ``<name>.libs``) is made once per machine in a
world-readable directory outside the hidden ones (:func:`package_library`), because the sandbox user cannot read
this environment's site-packages, and the directory is put on the sandboxed ``sys.path``. Nothing else of the
environment is importable. A package the code names is imported by the bootstrap before the audit hook is
installed (numpy's own import loads the C API through ``ctypes``, which the hook refuses to the code itself).

In every mode: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
``RLIMIT_NPROC``, ``RLIMIT_CORE=0``, set by the bootstrap on itself before it reads the code (no ``preexec_fn``,
so starting a sandbox does not fork this process, see :func:`_limits`); a new session whose whole process group is
SIGKILLed on the wall-clock timeout; stdout/stderr are drained concurrently and capped in size.

The audit hook (defence in depth, NOT a security boundary: C extensions could bypass it) refuses
sockets, subprocesses, ``os.fork``/``exec``/``spawn``/``system``, ``ctypes`` and any open-for-write,
create, delete, rename, chmod/chown outside the scratch dir.
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
#: CPU seconds the bootstrap may spend importing ``packages`` before the code's own ``cpu_s`` starts
PRELOAD_CPU_S = 20
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

_BOOTSTRAP = r'''
import sys
def _sandbox_limits():  # first, before the code is read: rlimits, then (uid mode) nobody
    import os, resource
    for name, soft, hard in LIMITS:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    uid = DROP_TO_UID
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
_sandbox_limits()
del _sandbox_limits
def _sandbox_boot():
    import os, linecache
    scratch = os.path.realpath(os.getcwd())
    src = sys.stdin.read()
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    banned = ("socket.", "subprocess.", "os.exec", "os.fork", "os.posix_spawn", "os.spawn",
              "os.system", "os.forkpty", "pty.", "ctypes.", "os.startfile", "sys.remote_exec")
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                   "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree",
                   "shutil.copyfile", "shutil.move", "os.mkfifo", "os.mknod", "os.chroot"}

    def inside(p):
        if isinstance(p, int):
            return True
        try:
            r = realpath(fsdecode(p))
        except Exception:
            return False
        return r == scratch or r.startswith(scratch + sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & wflags)
            if writing and path is not None and not inside(path):
                raise PermissionError("sandbox: writing outside the scratch dir is not allowed")
        elif event.startswith(banned):
            raise PermissionError("sandbox: %s is not allowed" % event)
        elif event in path_events:
            for a in args:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError("sandbox: %s outside the scratch dir" % event)

    for name in PRELOAD:  # trusted imports before the hook: numpy's own import needs ctypes.dlopen
        if name in src:
            try:
                __import__(name)
            except Exception:
                pass
    if CPU_AFTER_PRELOAD:  # the code's CPU budget starts after the imports (RLIMIT_CPU is in whole seconds)
        import math, resource
        ru = resource.getrusage(resource.RUSAGE_SELF)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU,
                           (min(hard, math.ceil(ru.ru_utime + ru.ru_stime) + CPU_AFTER_PRELOAD), hard))
    linecache.cache["<sandbox>"] = (len(src), None, src.splitlines(True), "<sandbox>")
    code = compile(src, "<sandbox>", "exec")
    if HOOK:
        sys.addaudithook(hook)
    return code
sys.path.extend(LIBS)
_code = _sandbox_boot()
del _sandbox_boot
_g = {"__name__": MODULE_NAME, "__builtins__": __builtins__}
exec(_code, _g)
'''

# Runs as root inside the new namespaces: "$1" scratch mount point, "$2" its size in MiB, "$3" a
# colon-separated list of dirs to cover with empty tmpfs, the rest is the interpreter's argv.
# The shell stays PID 1 of the PID namespace (so the interpreter is not signal-immune as PID 1)
# and exits with 128+N when the interpreter dies of signal N; run_python turns that into -N.
_SETUP_SH = r"""
set -u
S="$1"; FS="$2"; HIDE="$3"; shift 3
for mp in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  mount -o remount,bind,ro "$mp" 2>/dev/null
done
IFS=:
for h in $HIDE; do
  [ -d "$h" ] && mount -t tmpfs -o ro,size=4k,mode=755 tmpfs "$h"
done
unset IFS
mount -t tmpfs -o "size=${FS}m,mode=700,uid=65534,gid=65534" tmpfs "$S" || exit 125
cd "$S" || exit 125
setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs -- "$@"
exit $?
"""


@functools.lru_cache(maxsize=8)
def package_library(packages: tuple[str, ...]) -> str:
    """A world-readable directory holding a copy of each of ``packages`` (top-level import names, found in this
    environment without importing them) and its ``<name>.libs`` sibling, made once per machine and reused: the
    directory's name carries the packages' versions, and it is filled in a temporary directory then renamed, so
    concurrent graders never see half a copy. ValueError for a package this environment lacks."""
    import hashlib
    import importlib.metadata
    import importlib.util

    sources: list[Path] = []
    versions = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"sandbox package {name!r} is not installed here (pip install {name})")
        pkg = Path(next(iter(spec.submodule_search_locations)))
        sources.append(pkg)
        libs = pkg.parent / f"{name}.libs"
        if libs.is_dir():
            sources.append(libs)
        try:
            versions.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name}=?")
    tag = hashlib.sha256(" ".join([sys.version, *versions]).encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"verispec-sandbox-lib-{os.geteuid()}-{tag}"
    if root.is_dir() and root.stat().st_uid == os.geteuid() and not root.stat().st_mode & 0o022:
        return str(root)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    try:
        for src in sources:
            shutil.copytree(src, tmp / src.name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
        for path in [tmp, *tmp.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        try:
            tmp.rename(root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(root)


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    ``ok`` is True iff the process exited with status 0 before the timeout. ``returncode`` is
    negative (-signal) when it was killed by a signal. ``killed_reason`` is one of ``None``,
    ``"timeout"``, ``"cpu"``, ``"memory"``, ``"signal:N"``.
    """

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    isolation: str = "rlimit"
    duration_s: float = 0.0
    output_truncated: bool = False


def _project_root() -> str | None:
    """The source checkout holding this module (hidden from sandboxed code), if any."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").exists():
            return str(parent)
    return None


def _hidden_dirs(scratch: str, python: str) -> list[str]:
    """Dirs to cover in the sandbox: homes, /work and the checkout, minus any that hold the
    interpreter or its stdlib (or the scratch dir)."""
    keep = [os.path.realpath(python), os.path.realpath(scratch)]
    if keep[0] == os.path.realpath(sys.executable):
        keep.append(os.path.realpath(sys.base_prefix))
    out: list[str] = []
    for d in ["/root", "/home", "/work", _project_root() or ""]:
        d = os.path.realpath(d) if d else ""
        if d in ("", "/") or not os.path.isdir(d) or any(d == o or d.startswith(o + "/") for o in out):
            continue
        if any(k == d or k.startswith(d + "/") for k in keep):
            continue
        out.append(d)
    return out


def _world_executable(path: str) -> bool:
    """True when user ``nobody`` can reach and run ``path`` (every parent dir o+x)."""
    p = Path(path).resolve()
    try:
        return all(os.stat(d).st_mode & 0o001 for d in [*p.parents, p])
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _isolation_mode() -> str:
    """Probe once which isolation this machine allows."""
    if os.geteuid() != 0:
        return "rlimit"
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if unshare and setpriv:
        try:
            probe = subprocess.run(
                [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc",
                 "--uts", "--", "/bin/sh", "-c", "mount -t tmpfs tmpfs /mnt && echo ok"],
                capture_output=True, timeout=20, env={"PATH": _SAFE_PATH},
            )
            if probe.returncode == 0 and b"ok" in probe.stdout:
                return "namespace"
        except (OSError, subprocess.SubprocessError):
            pass
    return "uid"


def _interpreter(drop_uid: bool) -> str:
    """An interpreter that the sandbox user can execute (stdlib only is needed)."""
    if not drop_uid or _world_executable(sys.executable):
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _world_executable(cand):
            return cand
    raise RuntimeError("no interpreter executable by the sandbox user (nobody) was found")


def _limits(memory_mb: int, cpu_s: int, fsize_mb: int, nofile: int, nproc: int) -> list[tuple[str, int, int]]:
    """The rlimits the bootstrap sets on itself, as (``resource`` name, soft, hard). The bootstrap sets them (and in
    'uid' mode drops privileges) before it reads the code, rather than a ``preexec_fn``: a ``preexec_fn`` makes
    ``subprocess`` fork, and a fork copies the parent's page tables, about 0.35 s per sandbox from a process that
    holds 8 GB (a sweep holding its models) against 0.07 s without one."""
    mem = memory_mb * 1024 * 1024
    return [("RLIMIT_AS", mem, mem), ("RLIMIT_CPU", cpu_s, cpu_s + 1),
            ("RLIMIT_FSIZE", fsize_mb << 20, fsize_mb << 20), ("RLIMIT_NOFILE", nofile, nofile),
            ("RLIMIT_NPROC", nproc, nproc), ("RLIMIT_CORE", 0, 0)]


def _drain(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout/stderr until EOF or deadline, keeping at most ``cap`` bytes of each."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    truncated = False
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    timed_out = False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf = bufs[key.fileobj]
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            if len(chunk) > room:
                truncated = True
    sel.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, truncated


def run_python(
    code: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    *,
    cpu_s: int | None = None,
    fsize_mb: int = 16,
    scratch_mb: int = 64,
    nofile: int = 64,
    nproc: int = 32,
    max_output_bytes: int = 1 << 20,
    audit_hook: bool = True,
    module_name: str = "__main__",
    isolation: str | None = None,
    packages: tuple[str, ...] = (),
) -> SandboxResult:
    """Run ``code`` as a Python program in a confined child process and collect its output.

    ``packages``: top-level packages the code may import besides the standard library (read-only copies,
    :func:`package_library`); their BLAS runs on one thread. Those the code names are imported first, and
    ``cpu_s`` counts from there (at most :data:`PRELOAD_CPU_S` seconds go to the imports).

    ``timeout_s`` is wall clock (the whole process group is SIGKILLed when it runs out);
    ``cpu_s`` (RLIMIT_CPU soft limit; hard = soft + 1) defaults to ``int(timeout_s) + 2``.
    ``memory_mb`` caps the address space (RLIMIT_AS).
    ``module_name``: the program's ``__name__`` (``"__main__"``: its main block runs, as ``python FILE`` runs it).
    ``audit_hook=False`` leaves only the OS-level confinement (tests use it to check those layers).
    ``isolation`` forces a weaker mode than the probed one ("uid" or "rlimit"), for tests.
    """
    mode = _isolation_mode()
    order = ["rlimit", "uid", "namespace"]
    if isolation is not None:
        if order.index(isolation) > order.index(mode):
            raise ValueError(f"isolation {isolation!r} is not available here (best: {mode!r})")
        mode = isolation
    drop_uid = mode in ("namespace", "uid")
    python = _interpreter(drop_uid)
    cpu = cpu_s if cpu_s is not None else int(timeout_s) + 2
    if not isinstance(module_name, str) or not module_name.isidentifier():
        raise ValueError(f"module_name must be an identifier, got {module_name!r}")
    boot = _BOOTSTRAP.replace("if HOOK:", f"if {bool(audit_hook)}:").replace("MODULE_NAME", repr(module_name))
    libs = [package_library(tuple(packages))] if packages else []
    boot = boot.replace("sys.path.extend(LIBS)", f"sys.path.extend({libs!r})").replace(
        "in PRELOAD:", f"in {tuple(packages)!r}:").replace("CPU_AFTER_PRELOAD", repr(cpu if packages else 0))
    if packages:
        cpu += PRELOAD_CPU_S  # the hard limit leaves room for the imports; the bootstrap lowers the soft one
    boot = boot.replace("in LIMITS:", f"in {_limits(memory_mb, cpu, fsize_mb, nofile, nproc)!r}:").replace(
        "DROP_TO_UID", repr(NOBODY if drop_uid and mode == "uid" else None))
    scratch = tempfile.mkdtemp(prefix="verispec-sbx-")
    env = {"PATH": _SAFE_PATH, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
    if packages:
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    argv = [python, "-I", "-S", "-B", "-c", boot]
    if mode == "namespace":
        argv[0] = python = os.path.realpath(python)
        hide = ":".join(d for d in _hidden_dirs(scratch, python) if ":" not in d)
        argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc",
                "--uts", "--", "/bin/sh", "-c", _SETUP_SH, "sandbox", scratch, str(scratch_mb),
                hide, *argv]
    elif drop_uid:
        os.chown(scratch, NOBODY, NOBODY)
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=scratch, env=env, start_new_session=True, close_fds=True,
        )
        threading.Thread(target=_feed, args=(proc, code), daemon=True).start()
        out, err, timed_out, truncated = _drain(proc, deadline, max_output_bytes)
        if not timed_out and not _exited(proc.pid, deadline):
            timed_out = True
        # The leader is exited but not reaped, so its group id cannot have been reused:
        # kill whatever is left of the group (everything, on timeout), then reap.
        _kill_group(proc)
        rc = proc.wait()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if mode == "namespace" and rc is not None and 128 < rc < 160:
        rc = -(rc - 128)
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    reason = _reason(rc, timed_out, stderr)
    return SandboxResult(
        ok=(rc == 0 and not timed_out), returncode=rc, stdout=stdout, stderr=stderr,
        timed_out=timed_out, killed_reason=reason, isolation=mode,
        duration_s=time.monotonic() - start, output_truncated=truncated,
    )


def _feed(proc: subprocess.Popen, code: str) -> None:
    """Send the program on stdin (in a thread, so a child that never reads cannot block us)."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(code.encode("utf-8", "surrogatepass"))
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _exited(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits or ``deadline``, WITHOUT reaping it (``WNOWAIT``)."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reason(rc: int | None, timed_out: bool, stderr: str) -> str | None:
    """Explain why the run did not finish normally, if it did not."""
    if timed_out:
        return "timeout"
    if rc is None or rc == 0:
        return None
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "cpu"
    if "MemoryError" in stderr[-2000:]:
        return "memory"
    if rc == -signal.SIGKILL:
        return "signal:9 (cpu or memory limit)"
    if rc < 0:
        return f"signal:{-rc}"
    return None
