"""SFT stage on the tiny random Llama: the loss falls, the merged output loads, LoRA and full
both work, over-long prompts are skipped and counted, bad input fails before training."""
from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from hargo.io import HargoInputError, atomic_write_jsonl
from hargo.data import records
from hargo.models import loading
from hargo.training import common, sft
from hargo.config import as_config

TASKS = ("race_c", "race_fortran", "mlperf", "plp")
ANSWERS = {"race_c": "yes", "race_fortran": "no", "mlperf": "42",
           "plp": "A graph neural network over the AST."}


def crafted_records() -> list[dict]:
    """3 short records per task plus one over-long race_c prompt (30,000 characters)."""
    recs = []
    for task in TASKS:
        for i in range(3):
            recs.append({"id": f"{task}-{i}", "task": task,
                         "prompt": [{"role": "user", "content": f"{task} question number {i}?"}],
                         "answer": ANSWERS[task],
                         "label": ANSWERS[task] if task.startswith("race") else None,
                         "alt_answers": [],
                         "source": {"file": "crafted", "index": i}})
    recs.append({"id": "race_c-long", "task": "race_c",
                 "prompt": [{"role": "user", "content": "int a[100];\n" * 2500}],
                 "answer": "yes", "label": "yes", "alt_answers": [],
                 "source": {"file": "crafted", "index": 99}})
    return recs


def sft_params(committed: dict, lora: bool) -> dict:
    p = copy.deepcopy(committed)
    p["train"].update({"max_prompt_tokens": 64, "gradient_checkpointing": False, "threads": 1,
                       "bf16": False})  # fp32 on every machine: the margins are fp32's
    p["sft"].update({"samples_per_task": 2, "max_steps": 10, "batch_size": 4, "grad_accum": 1,
                     "max_length": 96, "learning_rate": 5e-3 if lora else 2e-3})
    p["sft"]["lora"] = {**p["sft"]["lora"], "enabled": lora, "r": 8, "alpha": 16,
                        "dropout": 0.0}
    return p


@pytest.fixture()
def workdir(tmp_path, monkeypatch, tiny_model_dir, mlflow_uri) -> Path:
    """A project folder: models/base = the tiny model, data/prepared/train.jsonl crafted."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "base")
    atomic_write_jsonl(tmp_path / "data" / "prepared" / "train.jsonl", crafted_records())
    return tmp_path


def _run_and_check(workdir: Path, params: dict, margin: float) -> dict:
    import mlflow
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    metrics = sft.run(as_config(params))
    # the loss on the fixed set of 8 examples falls by a real margin (a random init starts near
    # ln 49152 = 10.80 nats; measured at step 10: full 10.92 -> 8.46, LoRA 10.92 -> 10.01)
    assert metrics["steps"] == 10
    assert metrics["initial_loss"] == pytest.approx(10.80, abs=0.2)
    assert metrics["final_loss"] < metrics["initial_loss"] - margin
    assert metrics["examples"] == 8
    assert metrics["examples_per_task"] == {t: 2 for t in sorted(TASKS)}
    assert metrics["skipped_too_long"] == {"mlperf": 0, "plp": 0, "race_c": 1, "race_fortran": 0}
    assert metrics["tokens"] > 0 and metrics["tokens_per_s"] > 0
    assert json.loads((workdir / "metrics" / "sft.json").read_text()) == json.loads(
        json.dumps(metrics))
    out = workdir / "models" / "sft"
    assert (out / ".complete").exists()
    record = json.loads((out / "training_record.json").read_text())   # read by register
    assert record["diverged"] is False and record["logged_steps"] >= 1
    assert metrics["initial_loss"] <= record["peaks"]["loss"]["value"] < 100
    assert not list(out.glob("adapter_*")), "adapters must be merged"
    model = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(workdir / "models" / "base")
    assert set(model.state_dict()) == set(base.state_dict())
    w = "model.layers.0.self_attn.q_proj.weight"
    assert (model.state_dict()[w] - base.state_dict()[w]).abs().max().item() > 1e-4
    # MLflow: the sft child run holds a per-step loss history and the loss-curve plot
    client = MlflowClient(mlflow.get_tracking_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`hargo.stage` = 'sft'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["mlflow.parentRunId"]
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in losses) == list(range(1, 11))
    assert run.data.metrics["sft.final_loss"] == pytest.approx(metrics["final_loss"])
    assert "sft_loss.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
    # the train split it read, as an MLflow dataset: digest = the file's md5 (no dvc.lock here)
    (inp,) = run.inputs.dataset_inputs
    train = workdir / "data" / "prepared" / "train.jsonl"
    assert inp.dataset.name == "hpc-gpt-train"
    assert inp.dataset.digest == hashlib.md5(train.read_bytes()).hexdigest()
    counts = Counter(json.loads(line)["task"] for line in train.read_text().splitlines())
    assert json.loads(inp.dataset.profile)["tasks"] == dict(sorted(counts.items()))
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"
    return metrics


def test_sft_full_lowers_loss_and_writes_merged_model(workdir, committed_params):
    metrics = _run_and_check(workdir, sft_params(committed_params, lora=False), margin=2.0)
    assert metrics["lora"] is False
    assert metrics["trainable_parameters"] > 6_000_000  # every weight of the tiny model


def test_sft_lora_lowers_loss_and_merges(workdir, committed_params):
    metrics = _run_and_check(workdir, sft_params(committed_params, lora=True), margin=0.5)
    assert metrics["lora"] is True
    # LoRA r=8 on all 7 linear projections of 2 layers (hidden 128, mlp 256, 2 heads x 64)
    per_layer = 8 * ((128 + 128) * 4 + (128 + 256) * 3)
    assert metrics["trainable_parameters"] == 2 * per_layer


def test_sft_rejects_bad_input_before_training(workdir, committed_params):
    params = sft_params(committed_params, lora=True)
    bad = crafted_records()
    bad[3]["answer"] = ""
    atomic_write_jsonl(workdir / "data" / "prepared" / "train.jsonl", bad)
    with pytest.raises(HargoInputError, match=r"train.jsonl, record 3, field 'answer'"):
        sft.run(as_config(params))
    shutil.rmtree(workdir / "models" / "base")
    with pytest.raises(FileNotFoundError, match="base_model"):
        sft.run(as_config(params))
    assert not (workdir / "models" / "sft").exists()
    assert not (workdir / "metrics" / "sft.json").exists()


def test_select_subset_skips_overlong_and_is_balanced_and_deterministic(tiny_tokenizer_dir):
    tok = loading.load_tokenizer(tiny_tokenizer_dir)
    recs = crafted_records()
    # a prompt of 40 short words is under the 8-chars-per-token shortcut but over 32 tokens:
    # it is tokenised and skipped
    recs.append({"task": "plp", "prompt": [{"role": "user", "content": "word " * 40}],
                 "answer": "x"})
    sub, skipped = records.select_subset(recs, 2, 7, tok, max_prompt_tokens=40)
    assert skipped == {"mlperf": 0, "plp": 1, "race_c": 1, "race_fortran": 0}
    assert sorted(r["task"] for r in sub) == sorted(t for t in TASKS for _ in range(2))
    assert all(len(r["prompt"][0]["content"]) < 100 for r in sub)
    again, _ = records.select_subset(recs, 2, 7, tok, max_prompt_tokens=40)
    assert [r["id"] for r in again] == [r["id"] for r in sub]
    all_, skipped_all = records.select_subset(recs, None, 7, tok, max_prompt_tokens=40)
    assert len(all_) == 12 and sum(skipped_all.values()) == 2
    # the exact token rule: the system prompt + "word " * 40 under ChatML
    n = records.prompt_tokens(tok, [{"role": "user", "content": "word " * 40}])
    assert 40 < n < 80
    assert records.select_subset(recs[-1:], None, 7, tok, max_prompt_tokens=n)[0] == recs[-1:]
    assert records.select_subset(recs[-1:], None, 7, tok, max_prompt_tokens=n - 1)[0] == []


def test_select_subset_per_task_caps_keep_a_long_task_and_name_a_missing_one(tiny_tokenizer_dir):
    """rl.max_prompt_tokens per task: the long plp prompt stays under a plp cap that fits it,
    while the same cap for every task would let every other task's prompts grow too."""
    tok = loading.load_tokenizer(tiny_tokenizer_dir)
    recs = crafted_records()
    recs.append({"task": "plp", "prompt": [{"role": "user", "content": "word " * 40}],
                 "answer": "x"})
    n = records.prompt_tokens(tok, recs[-1]["prompt"])
    caps = {"race_c": 40, "race_fortran": 40, "mlperf": 40, "plp": n}
    kept, skipped = records.select_subset(recs, None, 7, tok, max_prompt_tokens=caps)
    assert skipped == {"mlperf": 0, "plp": 0, "race_c": 1, "race_fortran": 0}
    assert recs[-1] in kept and len(kept) == 13
    # one cap below the long prompt: skipped again, counted under its task
    _, skipped = records.select_subset(recs, None, 7, tok, max_prompt_tokens={**caps, "plp": n - 1})
    assert skipped["plp"] == 1
    with pytest.raises(ValueError, match=r"no cap for task\(s\) \['mlperf', 'plp', 'race_fortran'\]"):
        records.select_subset(recs, None, 7, tok, max_prompt_tokens={"race_c": 40})


def test_lora_config_and_bf16_flag(committed_params):
    assert common.lora_config({"enabled": False}) is None
    cfg = common.lora_config({"enabled": True, "r": 8, "alpha": 16, "dropout": 0.05,
                              "target_modules": "all-linear"})
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.target_modules) == \
        (8, 16.0, 0.05, "all-linear")
    from hargo.hardware import PROFILES, use_bf16

    p = copy.deepcopy(committed_params)
    p["train"]["bf16"] = False
    assert [use_bf16(as_config(p), prof) for prof in PROFILES.values()] == [False, False, False]
    p["train"]["bf16"] = True
    assert {n: use_bf16(as_config(p), prof) for n, prof in PROFILES.items()} == \
        {"cpu": False, "cpu-bf16": True, "cuda": True}


def test_bucketed_order_groups_similar_lengths_in_random_batch_order():
    import random

    lengths = [5, 50, 6, 51, 7, 52, 8, 53, 100, 9]  # 10 samples, batches of 2, buckets of 2 batches
    order = sft.bucketed_order(lengths, batch_size=2, bucket_batches=2, rng=random.Random(3))
    assert sorted(order) == list(range(10))
    batches = [order[i:i + 2] for i in range(0, 10, 2)]
    # the shuffled indices are cut into buckets of 4 and sorted: each batch pairs neighbours in
    # length within its bucket, so a batch's spread is below the overall spread
    shuffled = list(range(10))
    random.Random(3).shuffle(shuffled)
    buckets = [sorted(shuffled[i:i + 4], key=lambda j: lengths[j]) for i in (0, 4, 8)]
    expected = {tuple(b[k:k + 2]) for b in buckets for k in range(0, len(b), 2)}
    assert {tuple(b) for b in batches} == expected
    assert order == sft.bucketed_order(lengths, 2, 2, random.Random(3))
    assert sft.bucketed_order(lengths, 2, 0, random.Random(3)) == shuffled
    # an odd count: the one short batch comes last, so loader batches align with ours
    odd = sft.bucketed_order(lengths[:9], batch_size=2, bucket_batches=2, rng=random.Random(1))
    assert len(odd) == 9 and sorted(odd) == list(range(9))
    sampler = sft.LengthBucketSampler(lengths, 2, 2, seed=42)
    first, second = list(sampler), list(sampler)
    assert first == sft.bucketed_order(lengths, 2, 2, random.Random("42:0"))
    assert second == sft.bucketed_order(lengths, 2, 2, random.Random("42:1"))
    sampler.set_epoch(0)
    assert list(sampler) == first
