"""How an RL model folder goes into the MLflow store: its LoRA adapter with a reference to the
base model it was trained on, or (full fine-tuning) its full weights.

A folder the rl stage wrote with LoRA (``rl.lora.enabled``) keeps the adapter in
``adapter/`` (:data:`hargo.models.loading.ADAPTER_DIR`) with the digest of its base, the SFT
model. The register stage then stores:

- the base once: the SFT model folder logged as a transformers model and registered as a
  version of ``<register.model_name>-base`` tagged ``hargo.base_sha256``; a later register whose
  SFT model has the same digest reuses that version instead of storing the weights again;
- per RL model, the adapter only: MLflow's transformers flavour with a ``PeftModel`` and
  ``base_model_path`` (MLflow >= 3.9, ``mlflow.transformers.log_model``'s documented PEFT path)
  saves the adapter and the tokenizer and records the base's local folder; the version is
  tagged ``hargo.base_model`` = ``models:/<name>-base/<version>``.

The recorded base folder never changes under a version: with a local artifact store it is the
base version's own artifact folder in the store; with a remote one, a copy in the local base
cache (:func:`base_cache_dir`, keyed by the base's sha256, checked after filling). So
``mlflow.transformers.load_model('models:/hargo-hpc@champion')`` works as is on the machine that
registered it, and never puts an adapter on a re-trained SFT model. :func:`base_model_path`
resolves the base again from the registry (after a move; on another machine it downloads the
base once into the cache), which :func:`load_registered` (re-exported by :mod:`hargo.registry`)
passes as ``base_model_path``; :func:`ask` answers a prompt with the model it loads.

Upstream: https://mlflow.org/docs/latest/ml/deep-learning/transformers/guide/#peft-models
(``base_model_path``), ``mlflow/transformers/__init__.py`` ``save_model``/``load_model``.
"""
from __future__ import annotations

import json
import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

from hargo.champion import CANDIDATE, CHAMPION, not_found
from hargo.io import HargoInputError, atomic_dir
from hargo.models.loading import ADAPTER_BASE_FILE, ADAPTER_DIR, model_digest

__all__ = ["BASE_SUFFIX", "BASE_TAG", "BASE_DIGEST_TAG", "adapter_dir", "check_adapter_base",
           "check_adapter_agrees",
           "base_model_name", "find_base_version", "local_model_folder", "base_model_path",
           "log_adapter_model", "adapter_weights_dtype", "pip_requirements", "ensure_registered_model",
           "store_base_version", "base_cache_dir", "cached_base", "load_registered", "ask"]

BASE_SUFFIX = "-base"
#: model-version tag of an adapter version: the ``models:/`` URI of its base's version
BASE_TAG = "hargo.base_model"
#: model-version tag of a base version: :func:`hargo.models.loading.model_digest` of its folder
BASE_DIGEST_TAG = "hargo.base_sha256"
#: the artifact subfolder of an MLflow transformers model that holds the weights and config
_MODEL_SUBDIR = "model"


def base_model_name(model_name: str) -> str:
    """The registered model that holds the base models of ``model_name``'s adapter versions."""
    return f"{model_name}{BASE_SUFFIX}"


def adapter_dir(model_dir: str | Path) -> Path | None:
    """``model_dir/adapter`` when the folder keeps a PEFT adapter (``adapter_config.json``
    there), else None (a full fine-tuning folder: its full weights are registered)."""
    a = Path(model_dir) / ADAPTER_DIR
    return a if (a / "adapter_config.json").is_file() else None


def check_adapter_base(adapter: Path, base_dir: Path, base_digest: str) -> None:
    """Check that ``adapter`` was trained on the model in ``base_dir`` (digest ``base_digest``,
    :func:`~hargo.models.loading.model_digest`): an adapter put on another base loads without
    error and answers wrongly, so it is refused.

    Raises:
        HargoInputError: ``adapter/hargo_base.json`` is missing or unreadable, or records another
            base digest (e.g. the SFT model was re-trained after the rl stage ran).
    """
    f = adapter / ADAPTER_BASE_FILE
    try:
        recorded = json.loads(f.read_text(encoding="utf-8"))["base_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HargoInputError(f, f"cannot read the digest of the adapter's base "
                              f"({type(e).__name__}: {e}); re-run the rl stage") from None
    if recorded != base_digest:
        raise HargoInputError(f, f"the adapter was trained on another base model (sha256 "
                              f"{str(recorded)[:12]}...) than {base_dir} ({base_digest[:12]}...); "
                              "re-run the rl stage on this SFT model (`dvc repro`)")


#: largest |logit| difference allowed between an RL folder's merged weights and its base +
#: adapter on :data:`AGREEMENT_PROBE` (float32; LoRA on the projections: ~1e-6 on the tiny
#: model, 1.5e-4 on SmolLM2; a LoRA on the tied embedding: up to 1.53)
AGREEMENT_ATOL = 1e-3
#: the probe both forms of an RL model are compared on: code and prose, as the tasks' prompts
AGREEMENT_PROBE = ("Is there a data race? #pragma omp parallel for\nfor (i = 0; i < n; i++) "
                   "a[i] = a[i + 1];\nWhat does MLPerf measure? Answer in one sentence.")


def check_adapter_agrees(model_dir: Path, adapter: Path, base_dir: Path,
                         atol: float = AGREEMENT_ATOL, trust_remote_code: bool = False) -> float:
    """Check that an RL folder's two forms are one model: its merged weights (what ``evaluate``
    scored) and ``adapter`` on ``base_dir`` (what is registered), by their logits on
    :data:`AGREEMENT_PROBE` in float32. They part when the merge is not base + adapter, e.g. a
    LoRA on a weight the model ties to another (``embed_tokens`` = ``lm_head``; refused at the
    params stage, :mod:`hargo.config.lora_targets`). Returns the largest difference.

    Raises:
        HargoInputError: the logits differ by more than ``atol`` (names the folder, the
            difference and the fix).
    """
    import torch
    from peft import PeftModel

    from hargo.models.loading import load_model, load_tokenizer

    ids = load_tokenizer(model_dir)(AGREEMENT_PROBE, return_tensors="pt")
    with torch.no_grad():
        merged = load_model(model_dir, "float32", trust_remote_code)(**ids).logits
        on_base = PeftModel.from_pretrained(load_model(base_dir, "float32", trust_remote_code),
                                            str(adapter))(**ids).logits
    diff = (merged - on_base).abs().max().item()
    if not diff <= atol:     # NaN too
        raise HargoInputError(model_dir, f"the merged weights and the adapter on its base "
                              f"({adapter.name}/ on {base_dir}) are two models: their logits "
                              f"differ by up to {diff:.3g} (> {atol:g}), so the evaluated model "
                              "is not the one that would be registered (a LoRA on a tied "
                              "weight?); check rl.lora.target_modules and re-run the rl stage")
    return diff


def find_base_version(client, name: str, digest: str):
    """The newest version of registered model ``name`` tagged ``hargo.base_sha256 = digest``, or
    None (also when ``name`` does not exist)."""
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except Exception as e:
        if not_found(e):
            return None
        raise
    same = [v for v in versions if v.tags.get(BASE_DIGEST_TAG) == digest]
    return max(same, key=lambda v: int(v.version)) if same else None


def local_model_folder(client, version) -> Path | None:
    """The folder holding a registered transformers version's weights and ``config.json`` in a
    local (``file:``) artifact store, or None when the store is remote or the folder is not
    there."""
    model_id = getattr(version, "model_id", None) or str(version.source).rsplit("/", 1)[-1]
    try:
        location = client.get_logged_model(model_id).artifact_location
    except Exception as e:
        if not_found(e):
            return None
        raise
    parsed = urlparse(str(location))
    if parsed.scheme not in ("", "file"):
        return None
    folder = Path(unquote(parsed.path)) / _MODEL_SUBDIR
    return folder if (folder / "config.json").is_file() else None


def base_model_path(client, version) -> Path | None:
    """The local folder of the base model an adapter version refers to (its ``hargo.base_model``
    tag), for ``mlflow.transformers.load_model(..., base_model_path=...)``; None for a version
    with full weights.

    A local artifact store gives the base version's own folder; a remote one the base cache's
    copy (:func:`cached_base`), downloaded once (``mlflow.artifacts.download_artifacts``).

    Raises:
        LookupError: the base version the tag names is not in the registry (deleted).
        RuntimeError: a downloaded base does not have the digest its version is tagged with.
    """
    import mlflow

    ref = version.tags.get(BASE_TAG)
    if not ref:
        return None
    name, number = ref.removeprefix("models:/").rsplit("/", 1)
    try:
        base = client.get_model_version(name, number)
    except Exception as e:
        if not not_found(e):
            raise
        raise LookupError(f"{version.name} v{version.version} is a LoRA adapter on {ref}, which "
                          f"the registry does not have ({type(e).__name__}: {e})") from None
    local = local_model_folder(client, base)
    if local is not None:
        return local

    def download(tmp: Path) -> None:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref,
                                                       dst_path=str(tmp / ".download")))
        for f in (got / _MODEL_SUBDIR).iterdir():
            shutil.move(str(f), str(tmp / f.name))
        shutil.rmtree(tmp / ".download")
    return cached_base(base.tags[BASE_DIGEST_TAG], download, ref)


def base_cache_dir(digest: str) -> Path:
    """Where the local copy of a base with sha256 ``digest`` lives for a remote artifact store:
    ``$HARGO_CACHE_DIR/bases/<digest>``, else ``$XDG_CACHE_HOME/hargo/bases/<digest>``, else
    ``~/.cache/hargo/bases/<digest>``."""
    root = os.environ.get("HARGO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hargo")
    return Path(root) / "bases" / digest


def cached_base(digest: str, fill: Callable[[Path], None], what: str) -> Path:
    """The base cache's folder for ``digest`` (:func:`base_cache_dir`), filled by ``fill(tmp)``
    (whole or not at all, :func:`hargo.io.atomic_dir`) when it is not there yet, and checked:
    its :func:`~hargo.models.loading.model_digest` must be ``digest``.

    Raises:
        RuntimeError: the filled folder has another digest (it is removed; ``what`` names the
            source in the message).
    """
    folder = base_cache_dir(digest)
    if (folder / ".complete").is_file():
        return folder
    with atomic_dir(folder) as tmp:
        fill(tmp)
        got = model_digest(tmp)
        if got != digest:
            raise RuntimeError(f"the base model from {what} has sha256 {got[:12]}..., not the "
                               f"{digest[:12]}... its version is tagged with")
    return folder


def log_adapter_model(model_dir: Path, adapter: Path, base_dir: Path, base_local: Path,
                      name: str, **log_kwargs):
    """Log an RL model as its PEFT adapter on ``base_local``
    (``mlflow.transformers.log_model`` with a ``PeftModel`` and ``base_model_path``): the
    artifact holds the adapter (``peft/``) and the tokenizer, not the base weights.

    Args:
        model_dir: the RL model folder (its tokenizer is logged).
        adapter: its ``adapter/`` folder (:func:`adapter_dir`).
        base_dir: the base model folder the adapter was trained on (loaded to build the
            ``PeftModel``; float32; the adapter keeps the dtype it was saved in,
            ``rl.lora.adapter_dtype``).
        base_local: the base folder to record (MLflow checks it has a ``config.json``).
        name: the logged model's name; ``log_kwargs`` go to ``log_model`` (params, tags,
            pip_requirements, ...).

    Returns:
        MLflow's ``ModelInfo``.
    """
    import mlflow
    from peft import PeftModel

    from hargo.models.loading import cast_lora_params, load_model, load_tokenizer

    stored = adapter_weights_dtype(adapter)     # before the base loads: a bad file fails fast
    base = load_model(base_dir, dtype="float32")
    model = PeftModel.from_pretrained(base, str(adapter))
    # PEFT loads the adapter into fp32 LoRA layers (the base's dtype); MLflow saves them as they
    # are, so a bf16 adapter (rl.lora.adapter_dtype) is put back to bf16: its values are bf16
    # already, nothing is rounded, and loading it for use upcasts it to fp32 again
    cast_lora_params(model, stored)
    return mlflow.transformers.log_model(
        transformers_model={"model": model, "tokenizer": load_tokenizer(model_dir)},
        name=name, task="text-generation", base_model_path=str(base_local), **log_kwargs)


def adapter_weights_dtype(adapter: Path):
    """The torch dtype of the tensors in ``adapter/adapter_model.safetensors`` (one dtype: the
    rl stage writes all of them in ``rl.lora.adapter_dtype``).

    Raises:
        HargoInputError: the file is missing or holds tensors of several dtypes.
    """
    import torch
    from safetensors import safe_open

    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        raise HargoInputError(path, "missing: the rl stage writes the adapter there")
    with safe_open(str(path), "pt") as f:
        kinds = {f.get_slice(k).get_dtype() for k in f.keys()}
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    if len(kinds) != 1 or next(iter(kinds)) not in names:
        raise HargoInputError(path, f"expected one float dtype for every tensor, got {sorted(kinds)}")
    return names[kinds.pop()]


def pip_requirements(peft: bool = False) -> list[str]:
    """Pinned ``pip_requirements`` for a logged transformers model (the installed versions of
    transformers, torch, accelerate, safetensors, and peft for an adapter): explicit, so MLflow
    skips its ~9 s requirement inference."""
    reqs = []
    for pkg in ("transformers", "torch", "accelerate", "safetensors") + (("peft",) if peft else ()):
        try:
            reqs.append(f"{pkg}=={metadata.version(pkg).split('+')[0]}")
        except metadata.PackageNotFoundError:
            reqs.append(pkg)
    return reqs


def ensure_registered_model(client, name: str, description: str) -> bool:
    """Create registered model ``name`` unless it exists; True when this call created it."""
    try:
        client.get_registered_model(name)
        return False
    except Exception as e:
        if not not_found(e):
            raise
    client.create_registered_model(name, description=description)
    return True


def store_base_version(client, name: str, base_dir: Path, digest: str, version_tags: dict,
                       common: dict, created: list, made: list,
                       model_card=None) -> tuple[dict, Path]:
    """The version of ``<name>-base`` holding the SFT model in ``base_dir`` (digest ``digest``):
    an existing one with that digest, else the folder logged in the active run and registered
    (appended to ``created``; its registered model to ``made`` when new), with ``model_card``
    (:func:`hargo.model_card.local_model_card`; MLflow asks the hub for none).

    Returns:
        (``{"name", "version", "sha256", "reused"}``, the base folder to record in the adapter
        versions: the version's own folder in a local artifact store, else the base cache's
        copy of ``base_dir``).
    """
    import mlflow

    base_name = base_model_name(name)
    mv = find_base_version(client, base_name, digest)
    reused = mv is not None
    if mv is None:
        if ensure_registered_model(client, base_name, f"hargo: the SFT base models that "
                                   f"{name}'s LoRA adapter versions refer to (tag {BASE_TAG})"):
            made.append(base_name)
        info = mlflow.transformers.log_model(
            transformers_model=str(base_dir), name="model-base", task="text-generation",
            pip_requirements=pip_requirements(), tags={"hargo.role": "base", **common},
            model_card=model_card)
        mv = mlflow.register_model(info.model_uri, base_name,
                                   tags={BASE_DIGEST_TAG: digest, **version_tags})
        created.append((None, mv))   # rolled back with the candidates; None: not a method
    local = local_model_folder(client, mv)
    if local is None:   # a remote artifact store: record a copy that never changes
        local = cached_base(digest, lambda tmp: _copy_model_files(base_dir, tmp), str(base_dir))
    print(f"[register] base model: {base_name} v{mv.version} "
          f"({'reused, same sha256' if reused else 'stored'}; {digest[:12]}...)", flush=True)
    return ({"name": base_name, "version": str(mv.version), "sha256": digest,
             "reused": reused}, local)


def _copy_model_files(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name != ".complete":
            shutil.copy2(f, dst / f.name)


def load_registered(model_name: str = "hargo-hpc", alias: str = CHAMPION,
                    root: str | Path = "."):
    """Load ``models:/<model_name>@<alias>`` from the project's MLflow store as a transformers
    text-generation pipeline (``mlflow.transformers.load_model``). A LoRA adapter version loads
    on its base version (:func:`hargo.registered_models.base_model_path`, also after the project
    moved).

    Raises:
        LookupError: no version of ``model_name`` holds ``alias`` (e.g. the gate has not moved
            ``champion`` yet); the message lists the aliases that exist.
        mlflow.exceptions.MlflowException: no such registered model, or the store failed.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    from hargo.tracking import tracking_uri
    from hargo.tracking_store import is_local_store, reroot

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    if is_local_store(uri, root):       # a moved or copied project loads its own artifacts
        reroot(root, quiet=True)
    client = mlflow.MlflowClient()
    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except MlflowException as e:
        if not not_found(e):
            raise
        aliases = client.get_registered_model(model_name).aliases
        have = ", ".join(f"@{a} -> v{v}" for a, v in sorted(aliases.items())) or "none"
        raise LookupError(f"{model_name}: no version holds the alias @{alias} (aliases: {have}); "
                          f"metrics/register.json says why the gate moved none. Load another "
                          f"alias, e.g. alias='{CANDIDATE}'") from None
    base = base_model_path(client, version)
    return mlflow.transformers.load_model(
        f"models:/{model_name}@{alias}", **({"base_model_path": str(base)} if base else {}))


def ask(prompt: str, model_name: str = "hargo-hpc", alias: str = CHAMPION,
        max_new_tokens: int = 48, root: str | Path = ".", pipeline=None) -> str:
    """Answer one user prompt with the registered model (greedy), e.g.
    ``python -c "from hargo.registry import ask; print(ask('Is there a data race ...?'))"``
    (:mod:`hargo.registry` re-exports it and :func:`load_registered`).

    ``pipeline``: an already loaded :func:`load_registered` pipeline (else it is loaded).
    Returns the assistant's reply text.
    """
    pipe = pipeline or load_registered(model_name, alias, root)
    out = pipe([{"role": "user", "content": prompt}], max_new_tokens=max_new_tokens,
               do_sample=False, return_full_text=False)
    gen = out[0]["generated_text"]
    if isinstance(gen, list):  # chat output: the appended assistant message
        return str(gen[-1].get("content", ""))
    return str(gen)
