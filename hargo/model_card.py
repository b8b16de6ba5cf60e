"""The model card hargo gives a local model folder it logs to MLflow.

``mlflow.transformers.log_model`` of a local folder asks the Hugging Face hub for the card and
license of a repository named after the folder's path, which never exists: in hub offline mode
(where every stage runs) that printed "The model card could not be retrieved from the hub" for
every model ``register`` stored. :func:`local_model_card` builds the card from what the project
knows instead -- the base model's record (``models/base/hargo_source.json``, written by the
``base_model`` stage) -- so MLflow asks the hub nothing and stores a card that names the base
model and its license where it is known.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

__all__ = ["KNOWN_LICENSES", "base_record", "local_model_card"]

#: Licenses hargo knows for a base model ``kind``: the embedded SmolLM2-135M-Instruct wheel
#: is Apache-2.0 (hargo/models/smollm2.py). Any other base: the card says ``other`` (MLflow
#: then notes that the license is unknown, which it is).
KNOWN_LICENSES = {"smollm2": "apache-2.0"}


def base_record(base_dir: str | Path) -> dict:
    """The ``base_model`` stage's record of where the base model came from
    (``<base_dir>/hargo_source.json``: kind, source, revision); ``{}`` when there is none."""
    try:
        record = json.loads((Path(base_dir) / "hargo_source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def local_model_card(folder: str | Path, base: Mapping | None = None, what: str = "model"):
    """A ``huggingface_hub.ModelCard`` for the local model ``folder``, made without the hub:
    ``<folder>/README.md`` when the folder has one, else a card whose data give the base model
    (``base``: :func:`base_record`'s dict), its license (:data:`KNOWN_LICENSES`, else
    ``other``), ``library_name: transformers`` and ``pipeline_tag: text-generation``, and whose
    text says what the model is (``what``: e.g. "the SFT model")."""
    from huggingface_hub import ModelCard, ModelCardData

    readme = Path(folder) / "README.md"
    if readme.is_file():
        return ModelCard.load(readme)
    base = dict(base or {})
    source = base.get("source")
    data = ModelCardData(license=KNOWN_LICENSES.get(str(base.get("kind")), "other"),
                         base_model=str(source) if source and base.get("kind") == "hub" else None,
                         library_name="transformers", pipeline_tag="text-generation")
    origin = (f"from the base model {source}" + (f" (revision {base['revision']})"
                                                 if base.get("revision") else "")
              if source else "from a base model hargo has no record of")
    text = (f"# hargo: {what}\n\nPost-trained by the hargo pipeline {origin}. The MLflow run "
            "that logged it holds its params, metrics and evaluation rows.\n")
    return ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n" + text)
