"""Sweeps on Ray (``bench run --ray``): same results as a local run, lost workers retried, resume, a two-node
cluster.

Everything Ray runs inside a private network namespace and PID namespace (``unshare --net --pid --kill-child``):
Ray's servers listen on every interface of the namespace they run in, and this one has only loopback; when the
namespace's first process exits, the kernel ends every process in it, so no Ray process outlives a test (the
script also runs ``ray stop --force`` there at its end, which sees only that namespace's processes). One cluster
of two nodes (``ray start``, 1 CPU each) serves every Ray test: the CLI's run first, then the other phases.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import verispec
from verispec.eval import run as runner
from verispec.eval.grid import expand, load_config
from verispec.eval.ray_runner import RayOptions, parse_ray_address
from verispec.eval.run import run_sweep
from verispec.eval.store import RESULTS, read_results

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "ray_driver.py"
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
# what a unit's result depends on; timings and the finishing time do not enter a comparison
SAME = ("text", "token_ids", "finish_reason", "grade", "be", "rounds", "drafted", "accepted", "per_round",
        "prompt_tokens", "gen_seed", "settings", "params", "label", "baseline")


def _namespaces_work() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command"
    try:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if r.returncode == 0 else f"unshare needs root: {r.stderr.decode(errors='replace').strip()}"


def _skip_reason() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]')"
    return _namespaces_work()


_SKIP = _skip_reason()
needs_ray = pytest.mark.skipif(_SKIP is not None, reason=f"Ray tests need ray and network namespaces: {_SKIP}")


def _env() -> dict[str, str]:
    """The tests' environment for Ray: this checkout's verispec, token auth with a fresh token (nothing read from
    or written to ~/.ray), no usage stats, no address of another cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    src = str(Path(verispec.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else src
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_USAGE_STATS_ENABLED="0",
               RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    return env


def _toy(path: Path, seeds=(0, 1), limit=4, max_new_tokens=12) -> Path:
    path.write_text(
        f'name = "ray"\nseeds = {list(seeds)}\ngamma = 3\nmax_new_tokens = {max_new_tokens}\n'
        '[models]\ntarget = "toy"\nthreads = 1\n'
        f'[[tasks]]\nname = "toy"\nlimit = {limit}\n'
        '[[methods]]\nrule = "spec-cascade"\nparams = { p_base = 0.3 }\n'
        '[[methods]]\nrule = "lenience"\nparams = { l = 0.5 }\n'
    )
    return path


def _grid(cfg_path: Path) -> list[str]:
    cfg = load_config(cfg_path)
    return [u.key for u in expand(cfg, {k: [p.id for p in v] for k, v in runner.load_problems(cfg).items()})]


def _raw_keys(run_dir: Path) -> list[str]:
    return [json.loads(x)["key"] for x in (run_dir / RESULTS).read_bytes().split(b"\n") if x]


def _same_results(ray_dir: Path, local_dir: Path) -> None:
    a = {r["key"]: r for r in read_results(ray_dir)}
    b = {r["key"]: r for r in read_results(local_dir)}
    assert a.keys() == b.keys()
    for key in a:
        for field in SAME:
            assert a[key][field] == b[key][field], f"{key}: {field} differs between the Ray and the local run"


CLUSTER = r"""
set -eu
"$PY" "$DRIVER" lo-up
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'ray stop --force > "$T/stop.log" 2>&1' EXIT
common="--node-ip-address=127.0.0.1 --num-cpus=1 --object-store-memory=100000000 --disable-usage-stats"
ray start --head --port="$PORT" --include-dashboard=false --temp-dir="$T" $common > "$T/head.log" 2>&1
ray start --address="127.0.0.1:$PORT" $common > "$T/node.log" 2>&1
"$PY" -c 'import sys, ray; ray.init(address=sys.argv[1], logging_level="WARNING");
print("alive nodes:", sum(n["Alive"] for n in ray.nodes()))' "127.0.0.1:$PORT" > "$W/nodes.out"
set +e
"$PY" -m verispec.cli.main bench run "$W/full.toml" --out "$W/full" --ray "127.0.0.1:$PORT" --no-progress \
  > "$W/cli.out" 2> "$W/cli.err"
echo $? > "$W/cli.rc"
set -e
"$PY" "$DRIVER" phases "$W/spec.json" "$W/phases.json" "127.0.0.1:$PORT"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Ray cluster in a private namespace: ``ray start --head`` plus a second node joining it on 127.0.0.1,
    1 CPU each. On it, in order:

    full:   ``verispec bench run --ray 127.0.0.1:PORT`` (the CLI), the toy grid (32 units) from scratch
    again:  the same directory again (nothing to run)
    kill:   the same grid in a directory a local run started (8 units); one worker SIGKILLed mid-unit
    flaky:  every unit of (seed 0, toy/1) raises on its worker
    broken: a target that does not exist: no worker can start

    The phases after the first run through ``ray_driver.py``, connected to the same cluster.
    """
    root = tmp_path_factory.mktemp("ray")
    # 48 new tokens a unit: about 8 s of work, so both nodes' workers are up before the grid is done
    cfgs = {"full": _toy(root / "full.toml", max_new_tokens=48), "kill": _toy(root / "kill.toml", max_new_tokens=48),
            "flaky": _toy(root / "flaky.toml", seeds=(0,), limit=2)}
    broken = root / "broken.toml"
    broken.write_text(cfgs["flaky"].read_text().replace('target = "toy"', 'target = "/nonexistent/model"\n'
                                                                          'drafter = "none"'))
    run_sweep(cfgs["kill"], root / "kill", progress=False, max_units=8)  # a local run, cut short
    spec = {"phases": [
        {"name": "again", "config": str(cfgs["full"]), "run_dir": str(root / "full"), "workers": 2},
        {"name": "kill", "config": str(cfgs["kill"]), "run_dir": str(root / "kill"), "workers": 2,
         "kill_after": 8 + 3},
        {"name": "flaky", "config": str(cfgs["flaky"]), "run_dir": str(root / "flaky"), "workers": 1,
         "factory": "flaky"},
        {"name": "broken", "config": str(broken), "run_dir": str(root / "broken"), "workers": 1},
    ]}
    (root / "spec.json").write_text(json.dumps(spec))
    temp_dir = tempfile.mkdtemp(prefix="vsray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = _env() | {"PY": sys.executable, "DRIVER": str(DRIVER), "T": temp_dir, "W": str(root)}
    try:
        r = subprocess.run([*UNSHARE, "bash", "-c", CLUSTER], env=env, capture_output=True, text=True,
                           timeout=600)  # a bound, generous for a loaded 2-core machine
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in Path(temp_dir).glob("*.log"))
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    out = root / "phases.json"
    assert r.returncode == 0 and out.exists(), \
        f"cluster run failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}{logs}"
    cli = {"rc": int((root / "cli.rc").read_text()), "stdout": (root / "cli.out").read_text(),
           "stderr": (root / "cli.err").read_text(), "nodes": (root / "nodes.out").read_text()}
    return root, cfgs, cli, json.loads(out.read_text())


@pytest.fixture(scope="module")
def local_run(cluster, tmp_path_factory):
    """The same 32-unit grid run locally: what every Ray run of it must equal."""
    _, cfgs, _, _ = cluster
    local = tmp_path_factory.mktemp("local") / "run"
    run_sweep(cfgs["full"], local, progress=False)
    return local


@needs_ray
def test_two_node_cluster_run_equals_local_run(cluster, local_run):
    """Tests 1 and 4: `verispec bench run --ray 127.0.0.1:PORT` on the two-node cluster runs a worker on each node
    and every unit exactly once, identical to a local run."""
    root, cfgs, cli, _ = cluster
    assert cli["rc"] == 0, f"cluster run failed:\n{cli['stdout'][-3000:]}{cli['stderr'][-3000:]}"
    assert "alive nodes: 2" in cli["nodes"]
    assert "Ray cluster: 2 node(s), 2 CPUs" in cli["stderr"]
    ran = {line.rsplit("(node ", 1)[1]: int(line.split()[0]) for line in cli["stderr"].splitlines()
           if " units ran on pid " in line}
    assert len(ran) == 2 and all(ran.values()), f"both nodes should have run units:\n{cli['stderr']}"
    assert sum(ran.values()) == 32
    assert "32 units done now on 2 Ray workers, 0 were already done, 0 failed" in cli["stdout"]
    keys = _raw_keys(root / "full")
    assert len(keys) == len(set(keys)) == 32 and sorted(keys) == sorted(_grid(cfgs["full"]))
    _same_results(root / "full", local_run)
    assert not (root / "full" / "errors.jsonl").exists()


@needs_ray
def test_second_ray_run_skips_done_units(cluster):
    """Test 3: the same directory again runs nothing and leaves results.jsonl as it was; a Ray run also resumes
    a directory that a local run started."""
    root, cfgs, _, rep = cluster
    s = rep["again"]["summary"]
    assert (s["completed"], s["skipped"], s["workers"]) == (0, 32, 0)
    assert not any("Ray cluster" in line for line in rep["again"]["log"]), "nothing to run: no Ray needed"
    assert len(_raw_keys(root / "full")) == 32
    k = rep["kill"]["summary"]
    assert (k["skipped"], k["completed"]) == (8, 32 - 8)


@needs_ray
def test_killed_worker_unit_is_retried(cluster, local_run):
    """Test 2: one worker SIGKILLed while it runs a unit: that unit runs again on a new worker; no unit is lost
    or written twice, the loss is in errors.jsonl, and the results equal a local run's."""
    root, cfgs, _, rep = cluster
    kill = rep["kill"]
    assert "killed_pid" in kill, "no worker was killed: the sweep ended first (make the units longer)"
    s = kill["summary"]
    assert (s["lost_workers"], s["retried"], s["failed"]) == (1, 1, 0)
    assert sum("running it again (retry 1 of 2)" in line for line in kill["log"]) == 1
    keys = _raw_keys(root / "kill")
    assert len(keys) == len(set(keys)) == 32 and sorted(keys) == sorted(_grid(cfgs["kill"]))
    errs = [json.loads(x) for x in (root / "kill" / "errors.jsonl").read_text().splitlines()]
    assert len(errs) == 1 and errs[0]["retried"] is True and errs[0]["attempt"] == 1
    assert errs[0]["error"].startswith("worker lost") and f"pid {kill['killed_pid']}" in errs[0]["worker"]
    assert errs[0]["key"] in keys
    _same_results(root / "kill", local_run)


@needs_ray
def test_unit_errors_and_dead_pool(cluster):
    """A unit that raises on a worker is logged as a local failure (and a local run completes it later); a
    pool where no worker can start stops with the engine's error."""
    root, cfgs, _, rep = cluster
    s = rep["flaky"]["summary"]
    assert (s["completed"], s["failed"], s["lost_workers"]) == (4, 4, 0)
    assert all("boom on purpose" in f for f in s["failures"])
    errs = [json.loads(x) for x in (root / "flaky" / "errors.jsonl").read_text().splitlines()]
    assert len(errs) == 4 and all("|toy/1|" in e["key"] and "RuntimeError: boom" in e["error"] for e in errs)
    again = run_sweep(cfgs["flaky"], root / "flaky", progress=False)
    assert (again.skipped, again.completed, again.failed) == (4, 4, 0)
    err = rep["broken"].get("error", "")
    assert err.startswith("RuntimeError: no Ray worker left") and "nonexistent" in err
    assert not (root / "broken" / RESULTS).exists() or not _raw_keys(root / "broken")


# ------------------------------------------------------------------------------------------ without a cluster


def test_cli_refuses_bad_ray_options(tmp_path):
    from verispec.cli.bench import bench

    cfg = _toy(tmp_path / "toy.toml")
    out = str(tmp_path / "run")
    cases = [
        (["--ray-workers", "2"], "need --ray"),
        (["--ray", "--shard", "0/2"], "cannot be combined"),
        (["--ray", "nohost"], "HOST:PORT"),
        (["--ray", "host:99999"], "HOST:PORT"),
        (["--ray", "--ray-cpus-per-worker", "0"], "ray-cpus-per-worker"),
    ]
    for args, message in cases:
        r = CliRunner().invoke(bench, ["run", str(cfg), "--out", out, "--no-progress", *args])
        assert r.exit_code != 0 and message in r.output, (args, r.output)
    assert not Path(out).exists(), "a refused command leaves nothing behind"


def test_ray_options_validation():
    assert parse_ray_address(None) == parse_ray_address("") == "auto"
    assert parse_ray_address("ray://head:10001") == "ray://head:10001"
    assert parse_ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    for bad in ({"workers": 0}, {"cpus_per_worker": 0}, {"gpus_per_worker": -1}, {"max_retries": -1},
                {"address": "head"}):
        with pytest.raises(ValueError):
            RayOptions(**bad)
    # counts are whole numbers (a pool of 2.5 workers failed only once Ray was up), amounts finite numbers
    RayOptions(workers=2, cpus_per_worker=1, gpus_per_worker=0, max_retries=0)
    for bad, name in (({"workers": 2.5}, "workers"), ({"workers": True}, "workers"),
                      ({"max_retries": 0.5}, "retries"), ({"max_retries": None}, "retries"),
                      ({"cpus_per_worker": "1"}, "CPUs"), ({"gpus_per_worker": float("inf")}, "GPUs")):
        with pytest.raises(ValueError, match=name):
            RayOptions(**bad)


def test_local_runs_never_import_ray(tmp_path):
    """Ray is an optional extra: the CLI, the Ray runner module and a local run do not import it."""
    cfg = _toy(tmp_path / "toy.toml", seeds=(0,), limit=1)
    code = ("import sys; from verispec.cli.bench import bench; import verispec.eval.ray_runner; "
            "from click.testing import CliRunner; "
            f"r = CliRunner().invoke(bench, ['run', {str(cfg)!r}, '--out', {str(tmp_path / 'run')!r}, "
            "'--no-progress']); assert r.exit_code == 0, r.output; print('ray' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    assert len(read_results(tmp_path / "run")) == 4
