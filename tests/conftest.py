"""Shared fixtures: a tiny random Llama with SmolLM2's tokenizer, a temporary MLflow store,
the real raw data and the committed params; and the per-test teardown of any process group,
accelerate state and launcher environment a test leaves behind (``_distributed_isolation``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

#: The xdist group of the tests that run vLLM in their own process (marker ``vllm``, no group
#: of their own): one worker imports vLLM (~12 s on the 2-core CPUs) and builds their engines,
#: not both.
VLLM_GROUP = "vllm-in-process"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Put every ``vllm``-marked test without an ``xdist_group`` into :data:`VLLM_GROUP`
    (before pytest-xdist's own hook reads the groups for ``--dist loadgroup``)."""
    for item in items:
        if item.get_closest_marker("vllm") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(VLLM_GROUP))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer (from the embedded GGUF, ~15 s to read), kept in ~/.cache/hargo.

    The cache folder is keyed by the GGUF's recorded sha256 and written atomically, so a stale
    or half-written cache cannot be picked up; a file lock makes one pytest-xdist worker build it
    while the others wait.
    """
    from filelock import FileLock

    from hargo.io import atomic_dir
    from hargo.models.smollm2 import GGUF_SHA256
    from hargo.testing import save_tokenizer

    cache = Path(os.environ.get("HARGO_CACHE", Path.home() / ".cache" / "hargo"))
    folder = cache / f"smollm2-tokenizer-{GGUF_SHA256[:12]}"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".complete").exists():
            with atomic_dir(folder) as tmp:
                save_tokenizer(tmp)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """A random 2-layer Llama (fp32, ~6.6M parameters), read-only for tests: copy it to modify."""
    from hargo.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tiny_tokenizer_dir)


#: What a launcher (torchrun, accelerate launch) or TRL's colocated vLLM sets in ``os.environ``.
_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
               "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def _launch_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in _LAUNCH_ENV or k.startswith("ACCELERATE_")}


def _tear_down_distributed() -> None:
    """Destroy what a test left initialised in this process: vLLM's parallel groups, the
    torch.distributed default process group, accelerate's shared (Borg) state. Only modules
    already imported are touched, so a test that never imported torch stays torch-free."""
    vllm_ps = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_ps is not None:  # TRL's colocated vLLM: its TP/PP/world groups over the default one
        vllm_ps.destroy_model_parallel()
        vllm_ps.destroy_distributed_environment()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    acc_state = sys.modules.get("accelerate.state")
    if acc_state is not None:
        acc_state.AcceleratorState._reset_state(reset_partial_state=True)
        acc_state.GradientState._reset_state()


@pytest.fixture(autouse=True)
def _distributed_isolation(request):
    """Each test leaves no process group behind and starts none on a fixed port.

    Before a ``vllm``-marked test (TRL's colocated vLLM initialises a process group in-process
    on $MASTER_PORT, 29500 when unset and free): MASTER_ADDR/MASTER_PORT point at a free port.
    After every test: the default process group is destroyed (vLLM's groups first), accelerate's
    shared state is reset, and the launcher variables (MASTER_ADDR/PORT, RANK, WORLD_SIZE,
    LOCAL_RANK, ..., ACCELERATE_*) are as they were before the test -- so a later test's Trainer
    sees neither a stale group nor a distributed accelerate state, in any test order.
    """
    before = _launch_env()
    if request.node.get_closest_marker("vllm") is not None and "MASTER_PORT" not in os.environ:
        from rl_helpers import free_port

        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
    yield
    _tear_down_distributed()
    for k in _launch_env().keys() - before.keys():
        del os.environ[k]
    os.environ.update(before)


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


# ------------------------------------------------------------------ the shared tiny pipeline
@pytest.fixture(scope="session")
def dvc_door(tmp_path_factory, real_raw_dir, tiny_model_dir):
    """The main pipeline reproduced once by ``dvc repro`` in a tiny project (40 raw records a
    file, the tiny model, ``tiny_overrides``), logging to its own MLflow store. Read-only for
    its tests: one that changes the project works on ``Door.copy`` (with a store of its own).
    Tests using it carry ``@pytest.mark.xdist_group(flow_project.PIPELINE_GROUP)``."""
    import subprocess

    from flow_project import Door, make_project, tiny_overrides

    overrides = tiny_overrides(tiny_model_dir, 40)
    base = tmp_path_factory.mktemp("dvc-door")
    root = make_project(base / "project", real_raw_dir, 40, params_updates=overrides, dvc=True)
    uri = f"sqlite:///{base / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARGO_")}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", DVC_NO_ANALYTICS="1",
               MLFLOW_TRACKING_URI=uri)
    proc = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"dvc repro of the shared tiny pipeline failed:\n{proc.stdout[-4000:]}\n"
                    f"{proc.stderr[-4000:]}")
    return Door(root, overrides, uri, env)



@pytest.fixture(scope="session")
def dvc_compare_door(dvc_door, tmp_path_factory):
    """:func:`dvc_door`'s project copied, then ``dvc repro compare/dvc.yaml`` in it: each of
    ``flow_project.DOOR_METHODS`` (one per trainer path) x seed 1 trained, evaluated and reported on the tiny model, logging to an
    MLflow store of its own. ``log`` holds the command's output and ``sft_mtime_ns`` the SFT
    model's mtime before it ran. Read-only for its tests, like :func:`dvc_door`."""
    import subprocess

    from flow_project import Door

    base = tmp_path_factory.mktemp("dvc-compare-door")
    root = dvc_door.copy(base / "project")
    uri = f"sqlite:///{base / 'mlflow.db'}"
    env = {**dvc_door.env, "MLFLOW_TRACKING_URI": uri}
    sft_mtime = (root / "models" / "sft").stat().st_mtime_ns
    proc = subprocess.run([sys.executable, "-m", "dvc", "repro", "compare/dvc.yaml"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"dvc repro compare/dvc.yaml of the shared tiny pipeline failed:\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    door = Door(root, dvc_door.overrides, uri, env)
    door.log, door.sft_mtime_ns = proc.stdout, sft_mtime
    return door
