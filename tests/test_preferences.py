"""The preference-pair stage: ranking and tie rules on crafted rewards, the stage end to end on
the tiny random model (transformers backend), and ``run_generation(num_samples=k)``."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hargo.compare import preferences
from hargo.io import HargoInputError
from hargo.params import ParamsError, apply_overrides
from hargo.config import as_config

pytestmark = pytest.mark.timeout(600)


def _rec(rid: str, task: str, text: str, answer: str = "x", label=None) -> dict:
    return {"id": rid, "task": task, "prompt": [{"role": "user", "content": text}],
            "answer": answer, "label": label, "alt_answers": [],
            "source": {"file": "test", "index": 0}}


# --------------------------------------------------------------------------------------------
# make_pairs: pure


def test_make_pairs_ranks_by_reward_drops_and_counts_ties():
    records = [_rec("r1", "race_c", "q1"), _rec("r2", "race_c", "q2"),
               _rec("m1", "mlperf", "q3"), _rec("p1", "plp", "q4"), _rec("p2", "plp", "q5"),
               _rec("f1", "race_fortran", "q6")]
    completions = ["r1a", "r1b", "r2a", "r2b", "m1a", "m1b", "p1a", "p1b", "p2a", "p2b",
                   "f1a", "f1b"]
    rewards = [0.0, 1.0,        # r1: second is better
               1.0, 1.0,        # r2: tie -> dropped
               0.2, 0.1,        # m1: first is better
               0.61, 0.61,      # p1: tie -> dropped
               0.35, 0.8,       # p2
               0.0, 0.0]        # f1: tie -> dropped
    pairs, stats = preferences.make_pairs(records, completions, rewards, 2)

    assert [p["id"] for p in pairs] == ["r1", "m1", "p2"]
    assert [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs] == [
        ("r1b", "r1a"), ("m1a", "m1b"), ("p2b", "p2a")]
    assert [(p["chosen_reward"], p["rejected_reward"]) for p in pairs] == [
        (1.0, 0.0), (0.2, 0.1), (0.8, 0.35)]
    assert all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
    assert pairs[0]["prompt"] == [{"role": "user", "content": "q1"}]
    assert pairs[0]["chosen"] == [{"role": "assistant", "content": "r1b"}]
    assert set(pairs[0]) == {"id", "task", "prompt", "chosen", "rejected", "chosen_reward",
                             "rejected_reward"}
    assert stats == {
        "prompts": 6, "pairs": 3, "ties_dropped": 3, "samples_per_prompt": 2,
        "per_task": {"mlperf": {"prompts": 1, "pairs": 1, "ties_dropped": 0},
                     "plp": {"prompts": 2, "pairs": 1, "ties_dropped": 1},
                     "race_c": {"prompts": 2, "pairs": 1, "ties_dropped": 1},
                     "race_fortran": {"prompts": 1, "pairs": 0, "ties_dropped": 1}},
        "mean_reward_gap": pytest.approx((1.0 + 0.1 + 0.45) / 3),
    }


def test_make_pairs_with_more_samples_takes_best_and_worst_first_on_equal():
    records = [_rec("a", "mlperf", "q"), _rec("b", "mlperf", "q2")]
    completions = ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    rewards = [0.5, 1.0, 0.0, 1.0,   # best: a1 (first of the two 1.0), worst: a2
               0.2, 0.2, 0.2, 0.2]   # all equal: dropped
    pairs, stats = preferences.make_pairs(records, completions, rewards, 4)
    assert [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs] == [
        ("a1", "a2")]
    assert stats["pairs"] == 1 and stats["ties_dropped"] == 1
    assert stats["mean_reward_gap"] == pytest.approx(1.0)
    none, s = preferences.make_pairs(records[1:], completions[4:], rewards[4:], 4)
    assert none == [] and s["mean_reward_gap"] is None and s["ties_dropped"] == 1


def test_make_pairs_refuses_bad_shapes_and_rewards():
    recs = [_rec("a", "plp", "q")]
    with pytest.raises(ValueError, match="need 2 completions and rewards, got 3 and 2"):
        preferences.make_pairs(recs, ["x", "y", "z"], [0.0, 1.0], 2)
    with pytest.raises(ValueError, match="samples_per_prompt: must be an integer >= 2"):
        preferences.make_pairs(recs, ["x"], [0.0], 1)
    with pytest.raises(ValueError, match=r"record 0 \('a'\): non-finite reward"):
        preferences.make_pairs(recs, ["x", "y"], [float("nan"), 1.0], 2)


def test_check_params_names_the_key(committed_params):
    preferences.check_params(as_config(committed_params))
    for key, value, msg in [
            ("compare.preferences.samples_per_prompt", 1, "must be >= 2"),
            ("compare.preferences.temperature", 0.0, "must be > 0"),
            ("compare.preferences.backend", "llamacpp", "must be one of vllm, transformers"),
            ("compare.preferences.out_dir", "", "expected a non-empty path")]:
        p = apply_overrides(committed_params, {key: value})
        with pytest.raises(ParamsError, match=f"{key}: {msg}"):
            preferences.check_params(as_config(p))


# --------------------------------------------------------------------------------------------
# the stage on the tiny model

TRAIN = [
    _rec("race_c-1", "race_c", "Is there a data race? #pragma omp parallel for\n"
         "for(i=0;i<n;i++) a[i]=a[i+1];", "yes", "yes"),
    _rec("race_c-2", "race_c", "Is there a data race? #pragma omp parallel for\n"
         "for(i=0;i<n;i++) a[i]=b[i];", "no", "no"),
    _rec("race_c-long", "race_c", "Is there a data race? " + "x = x + 1; " * 120, "no", "no"),
    _rec("race_fortran-1", "race_fortran", "Data race? !$omp parallel do\ndo i=1,n\n"
         " a(i)=a(i+1)\nend do", "yes", "yes"),
    _rec("mlperf-1", "mlperf", "How many accelerators did the ResNet submission use?", "8"),
    _rec("mlperf-2", "mlperf", "Which organisation submitted the BERT result?", "NVIDIA"),
    _rec("plp-1", "plp", "What is code summarisation?",
         "Code summarisation generates a natural-language description of source code."),
    _rec("plp-2", "plp", "What is CodeBERT?",
         "CodeBERT is a bimodal pre-trained model for programming and natural languages."),
    _rec("plp-3", "plp", "What is a data race?",
         "Two threads access the same memory location without ordering and one writes."),
]


@pytest.fixture()
def pref_root(tmp_path, tiny_model_dir) -> Path:
    """A repository-shaped folder: models/sft (the tiny model), data/prepared/train.jsonl."""
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "sft")
    path = tmp_path / "data" / "prepared" / "train.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    return tmp_path


def stage_params(committed_params, **over) -> dict:
    base = {"compare.preferences.backend": "transformers",
            "compare.preferences.samples_per_task": 2,
            "compare.preferences.temperature": 1.0,
            "compare.preferences.max_new_tokens": 8,
            "train.max_prompt_tokens": 120, "evaluate.dtype": "float32",
            "evaluate.batch_size": 4}
    base.update(over)
    return apply_overrides(committed_params, base)


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_stage_writes_ranked_pairs_and_stats(pref_root, committed_params, mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    from hargo.rewards import RewardConfig, TaskReward

    params = stage_params(committed_params)
    out = preferences.run(as_config(params), root=pref_root)
    folder = pref_root / "data" / "preferences"
    assert (folder / ".complete").exists()
    pairs = _jsonl(folder / "pairs.jsonl")
    stats = json.loads((folder / "stats.json").read_text())

    # 2 prompts per task (race_c: its 2 short ones, the over-long one skipped and counted),
    # except race_fortran, which has 1 record: 2 + 1 + 2 + 2
    assert stats["prompts"] == 7
    assert stats["skipped_too_long"] == {"mlperf": 0, "plp": 0, "race_c": 1, "race_fortran": 0}
    assert {t: c["prompts"] for t, c in stats["per_task"].items()} == {
        "mlperf": 2, "plp": 2, "race_c": 2, "race_fortran": 1}
    assert stats["pairs"] == len(pairs) and stats["pairs"] + stats["ties_dropped"] == 7
    for t, c in stats["per_task"].items():
        assert c["pairs"] + c["ties_dropped"] == c["prompts"]
        assert c["pairs"] == sum(p["task"] == t for p in pairs)
    # a random tiny model's text never contains the race answer: race samples always tie at 0
    assert stats["per_task"]["race_c"]["ties_dropped"] == 2
    # plp rewards are continuous (MiniLM cosine): two different samples never tie
    assert stats["per_task"]["plp"]["pairs"] == 2
    assert stats["samples_per_prompt"] == 2 and stats["backend"] == "transformers"
    assert stats["seed"] == params["seed"]

    # every pair: chosen strictly better, and the stored rewards are the task reward's
    by_id = {r["id"]: r for r in TRAIN}
    reward = TaskReward(RewardConfig.from_params(params["rewards"]))
    for p in pairs:
        assert p["chosen_reward"] > p["rejected_reward"]
        assert p["prompt"] == by_id[p["id"]]["prompt"] and p["task"] == by_id[p["id"]]["task"]
        r = by_id[p["id"]]
        got = reward(prompts=[r["prompt"]] * 2,
                     completions=[p["chosen"], p["rejected"]], task=[r["task"]] * 2,
                     answer=[r["answer"]] * 2, label=[r["label"]] * 2)
        # PLP rewards are float32 MiniLM cosines: a batch of 2 here vs the stage's batch sums in
        # another order, ~1e-7 apart on an AMX Xeon (rel 1e-6, pytest's default, is too tight)
        assert got == pytest.approx([p["chosen_reward"], p["rejected_reward"]], abs=1e-5)
    gaps = [p["chosen_reward"] - p["rejected_reward"] for p in pairs]
    assert stats["mean_reward_gap"] == pytest.approx(sum(gaps) / len(gaps))
    assert out["pairs"] == stats["pairs"] and out["out_dir"] == str(folder)
    assert "[preferences] 7 prompts x 2 samples" in capsys.readouterr().out

    # MLflow child run
    run = MlflowClient(mlflow_uri).get_run(out["run_id"])
    assert run.data.tags["hargo.stage"] == "preferences"
    assert run.data.metrics["preferences/pairs"] == stats["pairs"]
    assert run.data.metrics["preferences/race_c/ties_dropped"] == 2

    # seeded: a second run writes the same pairs
    preferences.run(as_config(params), root=pref_root)
    assert _jsonl(folder / "pairs.jsonl") == pairs


def test_stage_bad_input_fails_before_generating_and_writes_nothing(pref_root, committed_params,
                                                                    mlflow_uri, monkeypatch):
    from hargo.evaluation import generate

    def boom(*a, **k):
        raise AssertionError("generation must not start on bad input")

    monkeypatch.setattr(generate, "run_generation", boom)
    bad = [*TRAIN[:4], {**TRAIN[4], "task": "race_cobol"}]
    (pref_root / "data" / "prepared" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(HargoInputError, match=r"train.jsonl, record 4, field 'task'"):
        preferences.run(as_config(stage_params(committed_params)), root=pref_root)
    (pref_root / "models" / "sft" / ".complete").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        preferences.run(as_config(stage_params(committed_params)), root=pref_root)
    assert not (pref_root / "data" / "preferences").exists()


def test_zero_pairs_fail_when_a_preference_method_needs_them(pref_root, committed_params,
                                                            mlflow_uri):
    """Race prompts always tie on the tiny model (0 reward each): 0 pairs. With dpo/kto/simpo in
    compare.methods the stage fails at once (not later in compare_train) and writes nothing;
    without them it writes the empty pairs file."""
    races = [r for r in TRAIN if r["task"].startswith("race") and r["id"] != "race_c-long"]
    (pref_root / "data" / "prepared" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in races))
    with pytest.raises(ValueError, match=r"0 pairs from 3 prompts.*lists dpo, kto, simpo"):
        preferences.run(as_config(stage_params(committed_params)), root=pref_root)
    assert not (pref_root / "data" / "preferences").exists()
    out = preferences.run(as_config(stage_params(committed_params, **{"compare.methods": ["grpo"]})),
                          root=pref_root)
    assert out["pairs"] == 0 and out["ties_dropped"] == 3
    assert (pref_root / "data" / "preferences" / "pairs.jsonl").read_text() == ""


# --------------------------------------------------------------------------------------------
# run_generation(num_samples=k)

PROMPTS = [[{"role": "user", "content": "What is CodeBERT?"}],
           [{"role": "user", "content": "Is there a data race in a[i]=a[i+1]?"}]]


def test_transformers_num_samples_gives_different_samples_prompt_major(tiny_model_dir):
    from hargo.evaluation.generate import run_generation

    pe = {"max_new_tokens": 12, "temperature": 1.0, "dtype": "float32", "batch_size": 2}
    r = run_generation(tiny_model_dir, PROMPTS, pe, "transformers", seed=3, num_samples=2)
    assert len(r.completions) == len(r.completion_tokens) == len(r.prompt_tokens) == 4
    assert r.prompt_tokens[0] == r.prompt_tokens[1] != r.prompt_tokens[2] == r.prompt_tokens[3]
    assert r.completions[0] != r.completions[1] and r.completions[2] != r.completions[3]
    assert r.extra["num_samples"] == 2
    again = run_generation(tiny_model_dir, PROMPTS, pe, "transformers", seed=3, num_samples=2)
    assert again.completions == r.completions   # seeded

    # greedy: the one greedy completion, repeated; same as num_samples=1
    g = {**pe, "temperature": 0.0}
    one = run_generation(tiny_model_dir, PROMPTS, g, "transformers", seed=0)
    two = run_generation(tiny_model_dir, PROMPTS, g, "transformers", seed=0, num_samples=2)
    assert two.completions == [one.completions[0]] * 2 + [one.completions[1]] * 2
    assert "num_samples" not in one.extra
    with pytest.raises(ValueError, match="num_samples: must be an integer >= 1"):
        run_generation(tiny_model_dir, PROMPTS, g, "transformers", num_samples=0)


@pytest.mark.vllm
def test_vllm_num_samples_gives_different_samples_prompt_major(tiny_model_dir):
    """vLLM seeds each request: n=2 (child seeds seed, seed+1) must still give 2 samples."""
    from hargo.evaluation.generate import run_generation

    pe = {"max_new_tokens": 12, "temperature": 1.0, "dtype": "float32", "kv_cache_gib": 0.25,
          "enforce_eager": True}
    r = run_generation(tiny_model_dir, PROMPTS, pe, "vllm", seed=3, num_samples=2)
    assert len(r.completions) == len(r.completion_tokens) == len(r.prompt_tokens) == 4
    assert r.prompt_tokens[0] == r.prompt_tokens[1] != r.prompt_tokens[2] == r.prompt_tokens[3]
    assert r.completions[0] != r.completions[1] and r.completions[2] != r.completions[3]
