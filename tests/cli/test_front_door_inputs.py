"""The front doors and what they load: the request schema's checks on the command line, `verispec generate` and
`verispec analyze` on bad input, load_engine's arguments and cache key, and the sha256 check of a GGUF before it
loads. Toy models and fake chunk packages only: no real model loads."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import verispec.api as api
from verispec import models
from verispec.cli.main import main
from verispec.defaults import MAX_GAMMA
from verispec.options import OptionError, check
from verispec.testing import ToyTokenizer, tiny_qwen, toy_engine

HUGE = "1" + "0" * 400  # an integer no float holds


def _no_traceback(res) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


@pytest.fixture
def toy_load(monkeypatch: pytest.MonkeyPatch) -> dict:
    """`verispec generate` on the toy pair; the arguments it passed to load_engine are recorded."""
    seen: dict = {}
    engine = toy_engine("model")

    def fake_load(*args, **kw):
        seen.update(args=args, **kw)
        return engine

    monkeypatch.setattr(api, "load_engine", fake_load)
    return seen


# ------------------------------------------------------------------------------------- the request schema


def test_a_float_option_refuses_an_integer_too_large_for_a_float(toy_load):
    with pytest.raises(OptionError, match="temperature must be a finite number"):
        check("temperature", int(HUGE))
    res = CliRunner().invoke(main, ["generate", "hi", "--temperature", HUGE])
    _no_traceback(res)
    assert res.exit_code == 1 and "Error: --temperature must be a finite number" in res.output


@pytest.mark.parametrize("items", [("5=1", "5=-2"), ("5=1", "05=1")])
def test_the_cli_refuses_a_logit_bias_token_given_twice(toy_load, items):
    args = [a for item in items for a in ("--logit-bias", item)]
    res = CliRunner().invoke(main, ["generate", "hi", "--max-new-tokens", "2", *args])
    _no_traceback(res)
    assert res.exit_code == 1 and "--logit-bias: token 5 is given twice" in res.output


# ----------------------------------------------------------------------------------- generate and analyze


def test_no_draft_passes_no_tree_options(toy_load):
    res = CliRunner().invoke(main, ["generate", "hi", "--no-draft", "--max-new-tokens", "2", "--target-backend", "hf"])
    assert res.exit_code == 0, res.output
    assert toy_load["args"][2] == "none" and toy_load["tree"] is None  # else load_engine refuses tree options


@pytest.mark.parametrize(("extra", "flag"), [(["--drafter", "tree"], "--drafter"), (["--draft", "d"], "--draft")])
def test_no_draft_refuses_a_drafter_or_draft_it_would_ignore(toy_load, extra, flag):
    """--no-draft beside --drafter or --draft contradicts it: refused by name before anything loads (it ran the
    target alone, and --drafter tree even moved the target to transformers)."""
    res = CliRunner().invoke(main, ["generate", "hi", "--no-draft", *extra, "--max-new-tokens", "2"])
    _no_traceback(res)
    assert res.exit_code == 1 and f"--no-draft runs the target alone: drop {flag}" in res.output
    assert toy_load == {}


@pytest.mark.parametrize("gamma", [MAX_GAMMA + 1, 100_000])
def test_analyze_refuses_a_gamma_beyond_the_longest_draft(gamma):
    res = CliRunner().invoke(main, ["analyze", "--rule", "lossless", "--p", "1", "--q", "1", "--gamma", str(gamma)])
    _no_traceback(res)
    assert res.exit_code == 1 and f"--gamma must be in [1, {MAX_GAMMA}]" in res.output


def test_analyze_takes_the_longest_draft():
    res = CliRunner().invoke(main, ["analyze", "--rule", "lossless", "--p", "1", "--q", "1", "--gamma",
                                    str(MAX_GAMMA), "--json"])
    assert res.exit_code == 0, res.output


def test_generate_refuses_rule_params_beside_a_rule_object(toy_load):
    import verispec
    from verispec.core.rules import get

    with pytest.raises(ValueError, match="rule_params apply to a rule given by name"):
        verispec.generate("hi", rule=get("lenience", l=0.5), rule_params={"l": 0.9}, max_new_tokens=2)


# ------------------------------------------------------------------------------------------- load_engine


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> list:
    """load_model gives the toy target (recording what it was asked for); a fresh engine cache."""
    calls: list = []

    def fake_load_model(name, dtype="bfloat16", device="cpu"):
        calls.append(name)
        return tiny_qwen(1), ToyTokenizer()

    monkeypatch.setattr(models, "load_model", fake_load_model)
    monkeypatch.setattr(api, "ENGINES", api.EngineCache())
    return calls


@pytest.mark.parametrize(("kw", "name"), [
    ({"threads": 0}, "threads"), ({"threads": -3}, "threads"), ({"threads": 2.5}, "threads"),
    ({"dtype": "int8"}, "dtype"), ({"dtype": "bogus"}, "dtype"),
    ({"draft_p_min": 2.0}, "draft_p_min"), ({"draft_p_min": float("nan")}, "draft_p_min"),
    ({"max_rows": 0}, "max_rows"),
])
def test_load_engine_refuses_what_it_cannot_honour_by_name(fake_models, kw, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        api.load_engine("x", None, "none", target_backend="hf", cache=False, **kw)
    assert fake_models == []  # refused before anything loads


def test_load_engine_refuses_a_missing_mps_device(fake_models):
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    with pytest.raises(ValueError, match="device 'mps'"):
        api.load_engine("x", None, "none", target_backend="hf", cache=False, device="mps")
    assert fake_models == []


def test_a_draft_the_drafter_does_not_load_shares_the_engine(fake_models):
    a = api.load_engine("x", "some-draft", "ngram", target_backend="hf")
    b = api.load_engine("x", None, "ngram", target_backend="hf")
    assert a is b and len(api.ENGINES) == 1 and fake_models == ["x"]


def test_a_relative_path_is_keyed_by_what_it_names(fake_models, tmp_path, monkeypatch):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    first = api.load_engine("model", None, "none", target_backend="hf")
    monkeypatch.chdir(tmp_path / "two")
    second = api.load_engine("model", None, "none", target_backend="hf")
    assert second is not first  # another directory, another model
    assert api.load_engine("./model", None, "none", target_backend="hf") is second  # the same directory


# ------------------------------------------------------------------------------------- the GGUF's sha256

FAKE = "fake-test-model"


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A registered model whose GGUF is one fake chunk package (installed or not) under an empty cache."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    data = b"GGUF" + bytes(range(256)) * 8

    def register(chunks: bool) -> bytes:
        prefix = "vs_test_chunks_part" if chunks else "vs_test_absent_part"
        if chunks:
            pkg = tmp_path / "site" / f"{prefix}1"
            (pkg / "data").mkdir(parents=True)
            (pkg / "data" / "part01.bin").write_bytes(data)
            monkeypatch.syspath_prepend(str(tmp_path / "site"))
        spec = dataclasses.replace(models.REGISTRY[models.DEFAULT_DRAFT], name=FAKE, module_prefix=prefix,
                                   package_prefix=prefix.replace("_", "-"), n_chunks=1, gguf_file="fake.gguf",
                                   size=len(data), sha256=hashlib.sha256(data).hexdigest())
        monkeypatch.setitem(models.REGISTRY, FAKE, spec)
        models.gguf_path(FAKE).parent.mkdir(parents=True)
        return data

    return register


def test_a_partial_gguf_is_refused_not_loaded(fake_gguf):
    data = fake_gguf(chunks=False)
    models.gguf_path(FAKE).write_bytes(data[:100])  # cut short
    with pytest.raises(models.ModelInstallError, match="partial or corrupted"):
        api._gguf_of(FAKE, "drafter")


def test_a_corrupted_gguf_is_rebuilt_before_it_loads(fake_gguf):
    data = fake_gguf(chunks=True)
    models.gguf_path(FAKE).write_bytes(b"\0" * len(data))  # the right size, the wrong bytes
    path, registered = api._gguf_of(FAKE, "drafter")
    assert registered and Path(path).read_bytes() == data


def test_a_checked_gguf_is_hashed_once(fake_gguf, monkeypatch):
    data = fake_gguf(chunks=False)
    models.gguf_path(FAKE).write_bytes(data)
    api._gguf_of(FAKE, "drafter")

    def no_hash(path):
        raise AssertionError("hashed again")

    monkeypatch.setattr(models, "_sha256_file", no_hash)
    assert api._gguf_of(FAKE, "drafter")[0] == str(models.gguf_path(FAKE))


def test_an_empty_stop_string_is_refused_at_every_front_door():
    """An empty stop string would match before every token (vLLM refuses it too): the schema refuses it, so the
    engine, verispec.generate and the command line do."""
    from verispec import options
    from verispec.testing import toy_engine

    with pytest.raises(ValueError, match="stop must be non-empty strings"):
        options.check("stop", "")
    with pytest.raises(ValueError, match="stop must be non-empty strings"):
        toy_engine("model").generate([1, 2, 3], max_new_tokens=4, stop=["x", ""])
    assert options.check("stop", "x") == ["x"]


@pytest.mark.parametrize("command", ["grid", "run"])
@pytest.mark.parametrize("tasks", [",", ""])
def test_an_empty_task_list_is_refused(tmp_path, command, tasks):
    """`--tasks ,` (or empty) named no task and ran every task of the config."""
    root = Path(__file__).resolve().parents[2]
    args = ["bench", command, str(root / "configs" / "toy.toml"), "--tasks", tasks]
    res = CliRunner().invoke(main, args + (["--out", str(tmp_path / "run")] if command == "run" else []))
    _no_traceback(res)
    assert res.exit_code == 2 and "--tasks must list at least one name" in res.output, res.output
    assert not (tmp_path / "run").exists()
