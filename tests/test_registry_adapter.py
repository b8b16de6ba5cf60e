"""The register stage with LoRA runs: each version stores its adapter and a reference to its base
(the SFT model, stored once in ``hargo-hpc-base``), and still loads as the model that was
evaluated: ``mlflow.transformers.load_model('models:/hargo-hpc@champion')``, ``load_registered`` and
``ask``, also after the project moved. Tiny random models; each test its own MLflow store."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hargo.io import HargoInputError
from tests.test_registry import HEALTHY_RECORD, model_rows, reg_params, write_eval
from hargo.config import as_config

pytestmark = pytest.mark.timeout(600)

PROMPT = "Is there a data race? #pragma omp parallel for\nfor(i=0;i<n;i++) a[i]=a[i+1];"


def make_lora_rl(sft_dir: Path, out_dir: Path, seed: int, adapter_dtype: str = "bfloat16",
                 target_modules="all-linear") -> None:
    """An RL model folder as the rl stage writes it with LoRA: a random (non-zero) LoRA adapter
    on ``sft_dir``'s ``target_modules``, merged, and kept in ``adapter/`` (in ``adapter_dtype``,
    params.yaml's ``rl.lora.adapter_dtype`` by default)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from hargo.models.loading import load_model, load_tokenizer, save_merged

    torch.manual_seed(seed)
    model = get_peft_model(load_model(sft_dir), LoraConfig(
        r=4, lora_alpha=8, target_modules=target_modules, init_lora_weights=False))
    save_merged(model, load_tokenizer(sft_dir), out_dir, dtype="float32", adapter_base=sft_dir,
                adapter_dtype=adapter_dtype, training_record=HEALTHY_RECORD)


def _tensor_dtypes(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


def test_a_bf16_adapter_is_half_the_bytes_and_the_merge_is_exactly_base_plus_it(
        tmp_path, tiny_model_dir):
    """rl.lora.adapter_dtype: bfloat16 rounds the LoRA weights before saving and merging, so the
    evaluated (merged) folder is what the stored adapter on its base computes."""
    import torch
    from peft import PeftModel

    from hargo.models.loading import load_model, load_tokenizer

    for dt in ("float32", "bfloat16"):
        make_lora_rl(tiny_model_dir, tmp_path / dt, seed=3, adapter_dtype=dt)
    f32 = tmp_path / "float32" / "adapter" / "adapter_model.safetensors"
    b16 = tmp_path / "bfloat16" / "adapter" / "adapter_model.safetensors"
    assert _tensor_dtypes(f32) == {"F32"} and _tensor_dtypes(b16) == {"BF16"}
    # the same tensors at 2 bytes instead of 4 (the safetensors header is the same size)
    assert 1.9 < f32.stat().st_size / b16.stat().st_size <= 2.0
    tok = load_tokenizer(tiny_model_dir)
    merged = load_model(tmp_path / "bfloat16")
    on_base = PeftModel.from_pretrained(load_model(tiny_model_dir), str(b16.parent))
    assert {p.dtype for n, p in on_base.named_parameters() if "lora_" in n} == {torch.float32}
    torch.testing.assert_close(_logits(on_base, tok), _logits(merged, tok), atol=1e-5, rtol=1e-5)
    # the rounding moved the merged weights, by a fraction of the update, not of the weights
    w32 = load_model(tmp_path / "float32").state_dict()
    wsft = load_model(tiny_model_dir).state_dict()
    for k, w in merged.state_dict().items():
        update = (w32[k] - wsft[k]).abs().max()
        assert (w - w32[k]).abs().max() <= update * 2 ** -7 + 1e-7, k
    with pytest.raises(ValueError, match="adapter_dtype must be one of"):
        make_lora_rl(tiny_model_dir, tmp_path / "bad", seed=3, adapter_dtype="int8")


@pytest.fixture()
def lora_root(tmp_path, tiny_model_dir) -> Path:
    root = tmp_path / "project"
    shutil.copytree(tiny_model_dir, root / "models" / "sft")
    for seed, m in enumerate(("grpo", "hargo"), start=1):
        make_lora_rl(root / "models" / "sft", root / "models" / "rl" / m, seed)
    return root


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _greedy(model_dir: Path) -> str:
    from hargo.evaluation.generate import generate

    return generate(model_dir, [[{"role": "user", "content": PROMPT}]],
                    {"max_new_tokens": 8, "temperature": 0.0, "dtype": "float32",
                     "batch_size": 1}, "transformers")[0]


def _logits(model, tok):
    import torch

    ids = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


def test_the_rl_folder_keeps_its_adapter_and_the_digest_of_its_base(lora_root):
    from hargo.models.loading import model_digest

    a = lora_root / "models" / "rl" / "grpo" / "adapter"
    assert sorted(p.name for p in a.iterdir()) == ["README.md", "adapter_config.json",
                                                   "adapter_model.safetensors", "hargo_base.json"]
    assert json.loads((a / "hargo_base.json").read_text()) == {
        "base_sha256": model_digest(lora_root / "models" / "sft")}
    # the digest follows the weights, not the folder's place or its adapter/ and marker
    assert model_digest(lora_root / "models" / "rl" / "grpo") != model_digest(
        lora_root / "models" / "sft")


def test_lora_versions_store_the_adapter_on_a_base_stored_once_and_load_as_evaluated(
        lora_root, committed_params, mlflow_uri):
    import mlflow
    from mlflow.tracking import MlflowClient

    from hargo.models.loading import load_model, load_tokenizer
    from hargo.registry import ask, load_registered, run

    write_eval(lora_root, {"grpo": model_rows(plp=0.45), "hargo": model_rows(plp=0.50)})
    doc = run(reg_params(committed_params, methods=("grpo", "hargo")), root=lora_root)

    from hargo.models.loading import model_digest
    digest = model_digest(lora_root / "models" / "sft")
    assert doc["base"] == {"name": "hargo-hpc-base", "version": "1", "sha256": digest,
                           "reused": False}
    assert [v["stored"] for v in doc["versions"]] == ["adapter", "adapter"]
    assert doc["champion"] == {"version": "2", "method": "hargo", "moved": True}
    client = MlflowClient(mlflow_uri)
    base_mv = client.get_model_version("hargo-hpc-base", "1")
    assert base_mv.tags["hargo.base_sha256"] == digest
    for v in ("1", "2"):
        mv = client.get_model_version("hargo-hpc", v)
        assert mv.tags["hargo.base_model"] == "models:/hargo-hpc-base/1"
        assert mv.tags["hargo.gate"] == "passed"

    # what each version stores: the adapter and the tokenizer, never the base weights
    def artifacts(mv) -> Path:
        return Path(mlflow.artifacts.download_artifacts(f"models:/{mv.name}/{mv.version}"))
    stored = _files(artifacts(client.get_model_version("hargo-hpc", "2")))
    base_files = _files(artifacts(base_mv))
    assert "peft/adapter_model.safetensors" in stored
    assert not any(k.endswith("model.safetensors") and not k.startswith("peft/") for k in stored)
    assert base_files["model/model.safetensors"] > 0
    adapter_bytes = stored["peft/adapter_model.safetensors"]
    assert adapter_bytes * 20 < base_files["model/model.safetensors"]
    # the registry keeps the rl stage's bf16 adapter as it is (not upcast to fp32 on logging)
    assert _tensor_dtypes(artifacts(client.get_model_version("hargo-hpc", "2"))
                          / "peft" / "adapter_model.safetensors") == {"BF16"}

    # MLflow's own loader, as is: the adapter on the base version's folder in the store
    pipe = mlflow.transformers.load_model("models:/hargo-hpc@champion")
    merged = load_model(lora_root / "models" / "rl" / "hargo")
    tok = load_tokenizer(lora_root / "models" / "rl" / "hargo")
    import torch
    torch.testing.assert_close(_logits(pipe.model, tok), _logits(merged, tok), atol=1e-4,
                               rtol=1e-4)
    # hargo's loader and ask(): the same greedy answer as the evaluated (merged) folder
    want = _greedy(lora_root / "models" / "rl" / "hargo")
    assert ask(PROMPT, max_new_tokens=8, root=lora_root) == want
    assert ask(PROMPT, max_new_tokens=8, pipeline=load_registered(alias="candidate",
                                                                  root=lora_root)) == want

    # a second register on the same SFT model reuses the stored base
    doc2 = run(reg_params(committed_params, methods=("grpo",)), root=lora_root)
    assert doc2["base"] == {"name": "hargo-hpc-base", "version": "1", "sha256": digest,
                            "reused": True}
    base_versions = client.search_model_versions("name='hargo-hpc-base'")
    assert [str(v.version) for v in base_versions] == ["1"]
    assert client.get_model_version("hargo-hpc", "3").tags["hargo.base_model"] == \
        "models:/hargo-hpc-base/1"


def test_an_adapter_trained_on_another_sft_model_is_refused_before_anything_is_registered(
        lora_root, committed_params, mlflow_uri, tiny_tokenizer_dir):
    from hargo.registry import run
    from hargo.testing import make_tiny_model

    write_eval(lora_root, {"grpo": model_rows(plp=0.45)})
    shutil.rmtree(lora_root / "models" / "sft")     # SFT re-trained after the rl stage ran
    make_tiny_model(lora_root / "models" / "sft", tiny_tokenizer_dir, seed=7)
    with pytest.raises(HargoInputError, match=r"grpo/adapter/hargo_base\.json.*trained on another "
                                              r"base model.*re-run the rl stage"):
        run(reg_params(committed_params), root=lora_root)
    from mlflow.tracking import MlflowClient
    assert MlflowClient(mlflow_uri).search_registered_models() == []


@pytest.mark.parametrize("tied", ["embed_tokens", "lm_head"])
def test_a_model_whose_merge_is_not_base_plus_adapter_is_refused_before_anything_is_registered(
        lora_root, committed_params, mlflow_uri, tied):
    """Issue 42 item 4: a LoRA on a tied weight (the params stage refuses it now; a folder from
    before, or made by hand) merges into both embedding and head, so the evaluated folder and
    the adapter on its base are two models. ``register`` compares their logits and refuses."""
    import warnings

    from mlflow.tracking import MlflowClient

    from hargo.registry import run

    write_eval(lora_root, {"grpo": model_rows(plp=0.45)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # PEFT's tied-weights warning: the case under test
        make_lora_rl(lora_root / "models" / "sft", lora_root / "models" / "rl" / "grpo", 1,
                     adapter_dtype="float32", target_modules=[tied, "q_proj"])
    with pytest.raises(HargoInputError, match=r"rl/grpo: the merged weights and the adapter on "
                                              r"its base .* differ by up to .*rl\.lora\."
                                              r"target_modules"):
        run(reg_params(committed_params), root=lora_root)
    assert MlflowClient(mlflow_uri).search_registered_models() == []


def test_a_failure_after_the_base_was_stored_leaves_nothing_registered(
        lora_root, committed_params, mlflow_uri, monkeypatch):
    import hargo.registry as registry
    from mlflow.tracking import MlflowClient

    write_eval(lora_root, {"grpo": model_rows(plp=0.45)})

    def broken(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(registry, "log_adapter_model", broken)
    with pytest.raises(RuntimeError, match="nothing was registered.*disk full"):
        registry.run(as_config(reg_params(committed_params)), root=lora_root)
    assert MlflowClient(mlflow_uri).search_registered_models() == []


def test_a_moved_project_loads_its_adapter_version_on_its_own_base(
        lora_root, committed_params, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from hargo import tracking
    from hargo.registry import ask, run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the project's own mlruns/
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    write_eval(lora_root, {"grpo": model_rows(plp=0.45)})
    run(reg_params(committed_params), root=lora_root)
    want = _greedy(lora_root / "models" / "rl" / "grpo")
    moved = tmp_path / "elsewhere" / "project"
    moved.parent.mkdir()
    shutil.move(str(lora_root), str(moved))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)   # set by the first process
    assert ask(PROMPT, max_new_tokens=8, root=moved) == want
    # the base it loaded is the one in the moved store
    from hargo.registered_models import base_model_path
    client = MlflowClient(tracking.tracking_uri(moved))
    path = base_model_path(client, client.get_model_version("hargo-hpc", "1"))
    assert str(path).startswith(str(moved / "mlruns"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_registered_adapter_of_a_real_rl_run_is_the_evaluated_merged_model(
        dtype, committed_params, tiny_model_dir, mlflow_uri, tmp_path):
    """Review (rev13): the real training path (``hargo.training.rl.run`` with LoRA), with
    ``model.dtype`` float32 and bfloat16 (the SFT folder and the merged RL folder saved in that
    dtype). The registered version must give the logits of the merged folder that the evaluate
    stage scored, within much less than what RL changed. In bfloat16 the merged weights are
    rounded to bf16 after merging (most of a small LoRA delta is rounded away), so the adapter
    on the bf16 base would be another model: no adapter is kept and full weights are
    registered."""
    import torch
    from rl_helpers import rl_params, write_jsonl

    from hargo.models.loading import load_model, load_tokenizer, save_merged
    from hargo.registry import load_registered, run
    from hargo.testing import crafted_records
    from hargo.training import rl

    root = tmp_path / "project"
    sft = root / "models" / "sft"
    save_merged(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), sft, dtype=dtype)
    data = write_jsonl(tmp_path / "data" / "train.jsonl", crafted_records(per_task=1)).parent
    params = rl_params(committed_params, sft, data, steps=2)
    params["model"]["dtype"] = dtype
    rl.run(as_config(params), "grpo", root=root)
    write_eval(root, {"grpo": model_rows(plp=0.45)})
    doc = run(reg_params(params), root=root)
    kept = dtype == "float32"
    assert (root / "models" / "rl" / "grpo" / "adapter").exists() == kept
    assert doc["versions"][0]["stored"] == ("adapter" if kept else "full")
    assert (doc["base"] is not None) == kept

    merged_dir = root / "models" / "rl" / "grpo"
    tok = load_tokenizer(merged_dir)
    # both in float32 compute (bf16 weights widen exactly): the weights are what is compared
    registered = _logits(load_registered(alias="candidate", root=root).model.float(), tok)
    evaluated = _logits(load_model(merged_dir, dtype="float32"), tok)  # the folder evaluate reads
    rl_change = (evaluated - _logits(load_model(sft, dtype="float32"), tok)).abs().max().item()
    assert rl_change > 1e-4       # RL did change the model
    torch.testing.assert_close(registered, evaluated, atol=1e-4, rtol=1e-4)


def test_a_remote_artifact_store_records_a_cached_base_that_a_retrained_sft_cannot_change(
        lora_root, committed_params, mlflow_uri, monkeypatch, tmp_path, tiny_tokenizer_dir):
    """With a remote artifact store (no local folder for the base version) the adapter versions
    record the base cache's copy, keyed by the base's sha256: MLflow's own loader keeps loading
    the right base after SFT is re-trained, and another machine downloads it once, checked."""
    import mlflow
    import torch

    import hargo.registered_models as rm
    from hargo.models.loading import load_model, load_tokenizer
    from hargo.registry import ask, run
    from hargo.testing import make_tiny_model

    monkeypatch.setenv("HARGO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(rm, "local_model_folder", lambda client, version: None)  # as s3://
    write_eval(lora_root, {"grpo": model_rows(plp=0.45)})
    doc = run(reg_params(committed_params), root=lora_root)
    cache = tmp_path / "cache" / "bases" / doc["base"]["sha256"]
    assert (cache / ".complete").is_file() and (cache / "model.safetensors").is_file()
    merged = lora_root / "models" / "rl" / "grpo"
    tok = load_tokenizer(merged)
    want = _logits(load_model(merged), tok)
    want_answer = _greedy(merged)

    shutil.rmtree(lora_root / "models" / "sft")     # SFT re-trained: the record must not follow
    make_tiny_model(lora_root / "models" / "sft", tiny_tokenizer_dir, seed=7)
    pipe = mlflow.transformers.load_model("models:/hargo-hpc@candidate")
    torch.testing.assert_close(_logits(pipe.model, tok), want, atol=1e-4, rtol=1e-4)

    shutil.rmtree(tmp_path / "cache")               # another machine: downloaded once, checked
    assert ask(PROMPT, max_new_tokens=8, alias="candidate", root=lora_root) == want_answer
    assert (cache / ".complete").is_file()


def test_a_base_cache_fill_with_another_digest_is_refused_and_leaves_nothing(
        tmp_path, monkeypatch, tiny_model_dir):
    from hargo.models.loading import model_digest
    from hargo.registered_models import base_cache_dir, cached_base

    monkeypatch.setenv("HARGO_CACHE_DIR", str(tmp_path / "cache"))
    digest = model_digest(tiny_model_dir)
    assert base_cache_dir(digest) == tmp_path / "cache" / "bases" / digest

    def wrong(tmp):
        (tmp / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"the base model from s3://b/m has sha256 .* not the"):
        cached_base(digest, wrong, "s3://b/m")
    assert not base_cache_dir(digest).exists()

    def right(tmp):
        for f in tiny_model_dir.iterdir():
            shutil.copy2(f, tmp / f.name)
    assert cached_base(digest, right, "x") == base_cache_dir(digest)
    assert cached_base(digest, wrong, "x") == base_cache_dir(digest)   # filled: not refilled
