"""Shared fixtures: a tiny random Llama with SmolLM2's tokenizer, a temporary MLflow store,
the real raw data and the committed params."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer (from the embedded GGUF, ~15 s to read), kept in ~/.cache/hargo.

    The cache folder is keyed by the GGUF's recorded sha256 and written atomically, so a stale
    or half-written cache cannot be picked up.
    """
    from hargo.io import atomic_dir
    from hargo.models.smollm2 import GGUF_SHA256
    from hargo.testing import save_tokenizer

    cache = Path(os.environ.get("HARGO_CACHE", Path.home() / ".cache" / "hargo"))
    folder = cache / f"smollm2-tokenizer-{GGUF_SHA256[:12]}"
    if not (folder / ".complete").exists():
        with atomic_dir(folder) as tmp:
            save_tokenizer(tmp)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """A random 2-layer Llama (fp32, ~6.6M parameters), read-only for tests: copy it to modify."""
    from hargo.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tiny_tokenizer_dir)


@pytest.fixture(autouse=True, scope="session")
def _session_mlflow_store(tmp_path_factory):
    """No test writes into the project's own mlruns/: every test logs to a throwaway store
    unless it asks for a fresh one of its own (``mlflow_uri``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI",
              f"sqlite:///{tmp_path_factory.mktemp('mlflow-session') / 'mlflow.db'}")
    yield
    mp.undo()


@pytest.fixture()
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh SQLite MLflow store for one test (MLFLOW_TRACKING_URI points at it)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    return uri


@pytest.fixture(scope="session")
def committed_params() -> dict:
    """params.yaml as committed (validated)."""
    from hargo.params import load_params

    return load_params(ROOT / "params.yaml")


def _raw_from_store() -> Path | None:
    import json

    store = ROOT.parent / "shared" / "dvc-store" / "files" / "md5"
    index = store / "d4" / "b8976c107bec18a39c09fdbc1f0999.dir"
    if not index.exists():
        return None
    return store, json.loads(index.read_text())


@pytest.fixture(scope="session")
def real_raw_dir(tmp_path_factory) -> Path:
    """The four real HPC-GPT files: data/raw/hpc-gpt if pulled, else copied out of the DVC store."""
    import shutil

    local = ROOT / "data" / "raw" / "hpc-gpt"
    if local.is_dir() and len(list(local.glob("*.json"))) == 4:
        return local
    found = _raw_from_store()
    if found is None:
        pytest.fail("the HPC-GPT data is neither pulled (dvc pull) nor in ../shared/dvc-store")
    store, entries = found
    out = tmp_path_factory.mktemp("raw") / "hpc-gpt"
    out.mkdir()
    for e in entries:
        md5 = e["md5"]
        shutil.copy(store / md5[:2] / md5[2:], out / e["relpath"])
    return out
