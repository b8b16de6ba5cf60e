"""The register stage: MLflow model versions, the candidate/champion aliases and the gate, on
tiny random models and crafted eval metrics, each test with its own SQLite MLflow store."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from hargo.io import HargoInputError
from hargo.params import apply_overrides
from hargo.config import as_config

pytestmark = pytest.mark.timeout(600)

LABELS = ["yes", "no"] * 4          # 8 race_c prompts, 4 racy
RACE_IDS = [f"race_c-{i:05d}" for i in range(8)]
PLP_IDS = [f"plp-{i:05d}" for i in range(8)]
IDS = RACE_IDS + PLP_IDS


def model_rows(race: str = "yyyyyyyy", plp=0.40, win=0, ids=IDS) -> list[dict]:
    """Per-prompt rows as the evaluate stage writes them (data/eval/<model>.jsonl): ``race`` the
    predictions on the 8 race prompts (y/n, ``?`` unparseable), ``plp`` the similarity on the 8
    PLP prompts (one value or one per prompt), ``win`` the verdicts against SFT (one or 16)."""
    sims = [plp] * 8 if isinstance(plp, (int, float)) else list(plp)
    wins = [win] * 16 if isinstance(win, int) else list(win)
    rows = []
    for i, (rid, lab, p) in enumerate(zip(RACE_IDS, LABELS, race)):
        pred = {"y": "yes", "n": "no"}.get(p)
        rows.append({"id": rid, "task": "race_c", "label": lab, "prediction": pred,
                     "correct": pred == lab, "reward": float(pred == lab), "win": wins[i]})
    for i, (rid, sim) in enumerate(zip(PLP_IDS, sims)):
        rows.append({"id": rid, "task": "plp", "similarity": sim, "reward": sim,
                     "correct": sim >= 0.5, "win": wins[8 + i]})
    return [r for r in rows if r["id"] in ids]


SFT_ROWS = model_rows()   # all "yes": DR-F1 2*4/(2*4+4) = 2/3; PLP 0.40


def metrics_of(rows) -> dict:
    """metrics/eval.json's entry for ``rows``, by hand: F1 = 2TP / (2TP + FP + FN)."""
    race = [r for r in rows if r["task"] == "race_c"]
    tp = sum(r["label"] == "yes" and r["prediction"] == "yes" for r in race)
    fp = sum(r["label"] == "no" and r["prediction"] == "yes" for r in race)
    fn = sum(r["label"] == "yes" and r["prediction"] != "yes" for r in race)
    plp = [r["similarity"] for r in rows if r["task"] == "plp"]
    return {"dr_f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
            "plp_similarity": sum(plp) / len(plp),
            "avg_score": sum(r["reward"] for r in rows) / len(rows),
            "win_rate": sum((r["win"] + 1) / 2 for r in rows) / len(rows)}


def write_eval(root: Path, models: dict, ids=IDS, run=None) -> dict:
    """data/eval/<model>.jsonl (SFT's all-"yes" rows unless given), metrics/eval.json with the
    metrics those rows give, data/eval/prompts.json with the evaluated ids (the evaluation's
    identity is read from both). Returns the eval.json document."""
    models = {"sft": SFT_ROWS, **models}
    doc = {"run": {"judge": "task-reward", "n_prompts": len(ids), **(run or {})}}
    (root / "data" / "eval").mkdir(parents=True, exist_ok=True)
    for name, rows in models.items():
        rows = [r for r in rows if r["id"] in ids]
        (root / "data" / "eval" / f"{name}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        doc[name] = metrics_of(rows)
    (root / "metrics").mkdir(parents=True, exist_ok=True)
    (root / "metrics" / "eval.json").write_text(json.dumps(doc))
    (root / "data" / "eval" / "prompts.json").write_text(json.dumps({"ids": list(ids)}))
    return doc


#: a healthy run's training record (hargo.training.divergence.training_record), by hand
HEALTHY_RECORD = {"diverged": False, "problem": None, "logged_steps": 2,
                  "bounds": {"max_loss": 100.0, "max_kl": 10.0, "max_grad_norm": 1000.0},
                  "peaks": {"loss": {"value": 2.5, "step": 1}, "kl": {"value": 0.1, "step": 2},
                            "grad_norm": {"value": 4.0, "step": 1}}}


@pytest.fixture()
def reg_root(tmp_path, tiny_model_dir) -> Path:
    from hargo.training.divergence import TRAINING_RECORD

    for m in ("grpo", "hargo"):
        shutil.copytree(tiny_model_dir, tmp_path / "models" / "rl" / m)
        (tmp_path / "models" / "rl" / m / TRAINING_RECORD).write_text(json.dumps(HEALTHY_RECORD))
    return tmp_path


def reg_params(committed_params, methods=("grpo",), **over):
    return as_config(apply_overrides(committed_params, {
        "rl.methods": list(methods), "register.model_name": "hargo-hpc",
        "register.gate_metrics": ["dr_f1", "plp_similarity"], "register.tolerance": 0.0, **over}))


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _aliases(uri, name="hargo-hpc") -> dict[str, str]:
    return {k: str(v) for k, v in _client(uri).get_registered_model(name).aliases.items()}


def _versions(uri, name="hargo-hpc") -> list[str]:
    return sorted(str(v.version) for v in _client(uri).search_model_versions(f"name='{name}'"))


def _registered_names(uri) -> list[str]:
    return [m.name for m in _client(uri).search_registered_models()]


# --------------------------------------------------------------------------------------------
# the gate, by hand


@pytest.mark.fast
def test_gate_passes_on_a_gain_on_every_prompt_with_its_exact_interval():
    """PLP +0.05 on each of the 8 PLP prompts: every resample's difference is 0.05, so the
    interval is [0.05, 0.05]; DR-F1 is equal (2/3 both), not worse."""
    from hargo.gate import gate

    ok, why, ci = gate(model_rows(plp=0.45), SFT_ROWS, ["dr_f1", "plp_similarity"], 0.0)
    assert ok, why
    assert why == ("better on plp_similarity (95% interval above zero), none worse beyond 0: "
                   "dr_f1 0.6667 vs 0.6667 (+0.0000, 95% CI [+0.0000, +0.0000], 8 prompts); "
                   "plp_similarity 0.4500 vs 0.4000 (+0.0500, 95% CI [+0.0500, +0.0500], 8 "
                   "prompts) (2000 bootstrap resamples of each metric's paired prompts)")
    assert ci["plp_similarity"] == pytest.approx(
        {"candidate": 0.45, "reference": 0.40, "diff": 0.05, "low": 0.05, "high": 0.05,
         "n_prompts": 8})
    assert ci["dr_f1"] == pytest.approx({"candidate": 2 / 3, "reference": 2 / 3, "diff": 0.0,
                                         "low": 0.0, "high": 0.0, "n_prompts": 8})
    # rows are paired by id, not by position
    ok2, why2, _ = gate(model_rows(plp=0.45)[::-1], SFT_ROWS, ["dr_f1", "plp_similarity"], 0.0)
    assert (ok2, why2) == (ok, why)


@pytest.mark.fast
def test_gate_refuses_a_point_gain_that_is_noise():
    """The issue's case in small: a better mean from one prompt. One PLP prompt +0.4 (mean
    +0.05, as above) but (7/8)^8 = 34% of resamples miss that prompt and differ by 0, so the
    2.5% quantile is 0: the interval is not above zero and the champion stays."""
    from hargo.gate import gate

    one = model_rows(plp=[0.8] + [0.4] * 7)
    ok, why, ci = gate(one, SFT_ROWS, ["dr_f1", "plp_similarity"], 0.0)
    assert not ok
    assert why.startswith("no gate metric better with its 95% interval above zero: ")
    assert ci["plp_similarity"]["diff"] == pytest.approx(0.05)
    assert ci["plp_similarity"]["low"] == 0.0 and ci["plp_similarity"]["high"] > 0.05
    # the same gain on every prompt is evidence
    assert gate(model_rows(plp=0.45), SFT_ROWS, ["plp_similarity"], 0.0)[0]
    # identical rows: nothing better
    ok, why, _ = gate(SFT_ROWS, SFT_ROWS, ["dr_f1", "plp_similarity"], 0.0)
    assert not ok and "no gate metric better" in why


@pytest.mark.fast
def test_gate_tolerance_boundary_and_the_race_interval():
    """Worse on a metric: the point difference against ``-tolerance`` (0.25 = 0.5 - 0.25, exact
    in binary, is within a tolerance of 0.25; one ulp further is not). Race: the perfect
    predictor against all-"yes" has F1 1 vs 2/3; the interval is the bootstrap's own, above 0."""
    from hargo.gate import gate, metric_values
    from hargo.stats import f1_statistic, paired_bootstrap_ci

    gates = ["dr_f1", "plp_similarity"]
    ref = model_rows(plp=0.5)
    cand = model_rows(race="ynynynyn", plp=0.25)
    ok, why, ci = gate(cand, ref, gates, 0.25)
    assert ok, why
    assert why.startswith("better on dr_f1 (95% interval above zero), none worse beyond 0.25: "
                          "dr_f1 1.0000 vs 0.6667 (+0.3333, 95% CI [")
    a, stat = metric_values(cand, "dr_f1")
    assert stat is f1_statistic and a.tolist() == [[1, 1], [0, 0]] * 4
    want = paired_bootstrap_ci(a, metric_values(ref, "dr_f1")[0], f1_statistic, 2000, 0.95, 0)
    assert ci["dr_f1"]["low"] == want["low"] > 0 and ci["dr_f1"]["high"] == want["high"]
    tighter = math.nextafter(0.25, 0.0)                   # one ulp less tolerance
    ok, why, _ = gate(cand, ref, gates, tighter)
    assert not ok and why.startswith(f"worse than the reference by more than the tolerance "
                                     f"{tighter:g} on plp_similarity: ")
    # tolerance never makes an equal-or-worse candidate pass
    assert not gate(model_rows(plp=0.3), ref, gates, 0.5)[0]
    # only the listed gate metrics count
    assert gate(cand, ref, ["dr_f1"], 0.0)[0]
    assert not gate(cand, ref, gates, 0.0)[0]
    # another seed draws other prompts: the interval is reproducible per seed
    assert gate(cand, ref, gates, 0.25, seed=7)[2] == gate(cand, ref, gates, 0.25, seed=7)[2]


@pytest.mark.fast
def test_gate_refuses_rows_that_are_not_the_same_prompts_or_lack_a_field():
    from hargo.gate import gate, metric_values

    with pytest.raises(ValueError, match=r"only in candidate: \[\], only in reference: "
                                         r"\['race_c-00007'\], 15 vs 16 rows"):
        gate(model_rows()[:7] + model_rows()[8:], SFT_ROWS, ["dr_f1"], 0.0)
    old = [{k: v for k, v in r.items() if k != "label"} for r in SFT_ROWS]
    with pytest.raises(ValueError, match=r"gate metric dr_f1: prompt 'race_c-00000' has no "
                                         r"'label' \(evaluated by an older hargo"):
        gate(old, SFT_ROWS, ["dr_f1"], 0.0)
    with pytest.raises(ValueError, match=r"gate metric mlperf_em: no evaluated prompt of task"):
        metric_values(SFT_ROWS, "mlperf_em")
    # every gate metric has a per-prompt form
    from hargo.gate import gate_metrics, metric_forms
    assert set(metric_forms()) == set(gate_metrics())


@pytest.mark.fast
def test_eval_identity_and_what_makes_two_evaluations_incomparable():
    import hashlib

    from hargo.gate import IDENTITY_FIELDS, eval_identity, identity_mismatch

    run_ = {"max_new_tokens": 8, "temperature": 0.0, "max_prompt_tokens": 1536,
            "backend": "vllm", "dtype": "bfloat16", "judge": "task-reward", "n_race_c": 2}
    a = eval_identity(run_, ["race_c-2", "plp-1"], "c0de")
    assert a == {"prompts": hashlib.sha256(b"plp-1\nrace_c-2").hexdigest()[:16], "n_prompts": 2,
                 "max_new_tokens": 8, "temperature": 0.0, "max_prompt_tokens": 1536,
                 "backend": "vllm", "dtype": "bfloat16", "judge": "task-reward",
                 "metric_code": "c0de"}
    assert list(a) == ["prompts", "n_prompts", "metric_code", *IDENTITY_FIELDS[2:8]]
    assert eval_identity(run_, ["plp-1", "race_c-2"], "c0de") == a          # order-free
    assert eval_identity({}, [], "x")["max_new_tokens"] is None
    assert identity_mismatch(a, dict(a)) == []
    assert identity_mismatch(a, None) == ["the reference has no recorded evaluation identity"]
    b = {**a, "judge": "llm", "max_new_tokens": 16}
    assert identity_mismatch(a, b) == ["max_new_tokens: 8 vs 16", "judge: 'task-reward' vs 'llm'"]
    assert identity_mismatch(a, {**a, "metric_code": "beef"}) == ["metric_code: 'c0de' vs 'beef'"]


@pytest.mark.fast
def test_the_metric_code_digest_follows_the_scoring_code(tmp_path, monkeypatch):
    from hargo.evaluation import identity

    d = identity.metric_code_digest()
    assert len(d) == 16 and d == identity.metric_code_digest()
    pkg = tmp_path / "hargo"
    (pkg / "rewards").mkdir(parents=True)
    for f in ("metrics.py", "judges.py", "rewards/race.py"):
        (pkg / f).write_text("x = 1\n")
    monkeypatch.setattr(identity, "PACKAGE_DIR", pkg)
    before = identity.metric_code_digest()
    (pkg / "rewards" / "race.py").write_text("x = 2\n")
    assert identity.metric_code_digest() != before
    (pkg / "rewards" / "race.py").write_text("x = 1\n")
    assert identity.metric_code_digest() == before
    (pkg / "training.py").write_text("y = 1\n")                # not scoring code
    assert identity.metric_code_digest() == before


@pytest.mark.fast
def test_gate_params_refuse_a_bad_tolerance_and_bad_metrics():
    from hargo.gate import check_gate_params, gate_metrics

    ok = {"model_name": "hargo-hpc", "gate_metrics": ["dr_f1", "win_rate"]}
    default = ("hargo-hpc", ["dr_f1", "win_rate"], 0.0, 2000, 0.95)   # the documented defaults
    assert check_gate_params(ok) == default
    assert check_gate_params({**ok, "tolerance": 0}) == default
    tol = check_gate_params({**ok, "tolerance": 0.02}).tolerance
    assert tol == 0.02 and isinstance(tol, float)
    got = check_gate_params({**ok, "resamples": 500, "confidence": 0.9})
    assert (got.resamples, got.confidence) == (500, 0.9)
    for bad in (99, 0, 2000.0, True, "2000", None):
        with pytest.raises(ValueError, match=r"register\.resamples: expected an integer >= 100"):
            check_gate_params({**ok, "resamples": bad})
    for bad in (0, 1, 1.5, -0.1, True, "0.95", None):
        with pytest.raises(ValueError, match=r"register\.confidence: expected a number in \(0, 1\)"):
            check_gate_params({**ok, "confidence": bad})
    # infinity would let every candidate through the "not worse beyond the tolerance" rule
    for bad in (-0.01, -1, float("nan"), float("inf"), "0.02", None, True, [0.1]):
        with pytest.raises(ValueError,
                           match=r"register\.tolerance: expected a finite number >= 0, got"):
            check_gate_params({**ok, "tolerance": bad})
    for bad_name in ("", "  ", None, 3):
        with pytest.raises(ValueError, match=r"register\.model_name: expected a non-empty name"):
            check_gate_params({**ok, "model_name": bad_name})
    for bad_gates in ([], None, "dr_f1"):
        with pytest.raises(ValueError, match=r"register\.gate_metrics: expected a non-empty list"):
            check_gate_params({**ok, "gate_metrics": bad_gates})
    with pytest.raises(ValueError, match=r"unknown gate metric 'loss'; valid \(higher is better\): "
                       + re.escape(", ".join(gate_metrics()))):
        check_gate_params({**ok, "gate_metrics": ["dr_f1", "loss"]})


@pytest.mark.fast
def test_win_rate_gate_reads_the_judges_verdicts(tmp_path):
    """SFT's rows carry ``win`` 0 (a tie with itself): WinRate 0.5. A candidate tying on every
    prompt (0.5) is not better; one winning every prompt (1.0) is, with interval [0.5, 0.5]; a
    candidate without ``win_rate`` in eval.json is refused, naming the field."""
    from hargo.gate import gate
    from hargo.registry import read_eval_metrics

    gates = ["dr_f1", "win_rate"]
    ok, why, _ = gate(model_rows(win=0), SFT_ROWS, gates, 0.0)
    assert not ok and "win_rate 0.5000 vs 0.5000 (+0.0000, 95% CI [+0.0000, +0.0000], 16 prompts)" in why
    ok, why, ci = gate(model_rows(win=1), SFT_ROWS, gates, 0.0)
    assert ok and why.startswith("better on win_rate (95% interval above zero), none worse")
    assert ci["win_rate"] == pytest.approx({"candidate": 1.0, "reference": 0.5, "diff": 0.5,
                                            "low": 0.5, "high": 0.5, "n_prompts": 16})
    doc = write_eval(tmp_path, {"grpo": model_rows(win=1)})
    del doc["sft"]["win_rate"]
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(doc))
    got = read_eval_metrics(tmp_path / "metrics" / "eval.json", ["sft", "grpo"], gates)
    assert got["sft"]["win_rate"] == 0.5 and got["grpo"]["win_rate"] == 1.0
    del doc["grpo"]["win_rate"]
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(doc))
    with pytest.raises(HargoInputError, match=r"field 'grpo\.win_rate'"):
        read_eval_metrics(tmp_path / "metrics" / "eval.json", ["sft", "grpo"], ["win_rate"])


# --------------------------------------------------------------------------------------------
# registration, aliases, and the champion loading back


def test_register_moves_champion_when_the_gate_passes_and_the_champion_loads(
        reg_root, committed_params, mlflow_uri, tiny_model_dir):
    from hargo.evaluation.generate import generate
    from hargo.registry import ask, load_registered, run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    doc = run(reg_params(committed_params), root=reg_root)

    assert doc["previous_champion"] is None
    assert doc["versions"][0]["intervals"]["plp_similarity"] == pytest.approx(
        {"candidate": 0.45, "reference": 0.40, "diff": 0.05, "low": 0.05, "high": 0.05,
         "n_prompts": 8})
    assert (doc["resamples"], doc["confidence"]) == (2000, 0.95)
    assert doc["versions"][0]["gate"] == "passed" and doc["versions"][0]["reference"] == "sft"
    assert doc["champion"] == {"version": "1", "method": "grpo", "moved": True}
    # a folder without adapter/ (full fine-tuning) is registered with its full weights, no base
    assert doc["versions"][0]["stored"] == "full" and doc["base"] is None
    assert doc["candidate"] == {"version": "1", "method": "grpo"}
    assert doc["decision"] == "champion moved to v1 (grpo) from sft"
    assert json.loads((reg_root / "metrics" / "register.json").read_text()) == doc
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}

    client = _client(mlflow_uri)
    mv = client.get_model_version("hargo-hpc", "1")
    # a handful of tags; the reason in the description; the metrics linked to the logged model
    assert set(mv.tags) == {"hargo.method", "hargo.seed", "hargo.data_version",
                            "hargo.git_commit", "hargo.gate", "hargo.eval_identity"}
    identity = json.loads(mv.tags["hargo.eval_identity"])
    assert identity == doc["eval_identity"] and identity["n_prompts"] == 16
    assert identity["judge"] == "task-reward" and len(identity["prompts"]) == 16
    assert mv.tags["hargo.method"] == "grpo" and mv.tags["hargo.gate"] == "passed"
    assert mv.description.startswith("gate passed against sft: better on plp_similarity (95% "
                                      "interval above zero)")
    assert "plp_similarity 0.4500 vs 0.4000 (+0.0500, 95% CI [+0.0500, +0.0500], 8 prompts)" \
        in mv.description
    linked = {m.key: m.value for m in client.get_logged_model(mv.source.split("/")[-1]).metrics}
    assert linked["dr_f1"] == pytest.approx(2 / 3) and linked["win_rate"] == 0.5
    assert linked["plp_similarity"] == pytest.approx(0.45)
    # the gate's evidence is kept with the version: a later register pairs its rows
    import mlflow
    kept = mlflow.artifacts.load_dict(f"runs:/{mv.run_id}/eval/grpo.per_prompt.json")
    assert kept == {"rows": model_rows(plp=0.45)}
    full = Path(mlflow.artifacts.download_artifacts("models:/hargo-hpc/1"))
    assert (full / "model" / "model.safetensors").is_file() and not (full / "peft").exists()
    run_ = _client(mlflow_uri).get_run(doc["run_id"])
    assert run_.data.tags["hargo.stage"] == "register"
    assert run_.data.params["register.model_name"] == "hargo-hpc"

    # models:/hargo-hpc@champion loads and answers, exactly as the folder does (greedy)
    pipe = load_registered("hargo-hpc", "champion", root=reg_root)
    prompt = "Is there a data race? #pragma omp parallel for\nfor(i=0;i<n;i++) a[i]=a[i+1];"
    answer = ask(prompt, max_new_tokens=8, pipeline=pipe)
    want = generate(tiny_model_dir, [[{"role": "user", "content": prompt}]],
                    {"max_new_tokens": 8, "temperature": 0.0, "dtype": "float32",
                     "batch_size": 1}, "transformers")[0]
    assert isinstance(answer, str) and answer == want
    # an alias no version holds: a clear error naming the aliases there are
    with pytest.raises(LookupError, match=r"no version holds the alias @best \(aliases: "
                                          r"@candidate -> v1, @champion -> v1\)"):
        load_registered("hargo-hpc", "best", root=reg_root)


def test_a_champion_registered_by_an_older_hargo_is_not_comparable(
        reg_root, committed_params, mlflow_uri, tiny_model_dir):
    """A version an older hargo registered (metrics as hargo.metric.* tags, no evaluation
    identity): nothing says its evaluation matches this one, so the gate refuses and says why."""
    from hargo.registry import run

    client = _client(mlflow_uri)
    client.create_registered_model("hargo-hpc")
    old = client.create_model_version(
        "hargo-hpc", source=str(tiny_model_dir),
        tags={"hargo.method": "hargo", "hargo.metric.dr_f1": "0.1",
              "hargo.metric.plp_similarity": "0.1"})
    client.set_registered_model_alias("hargo-hpc", "champion", old.version)
    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    doc = run(reg_params(committed_params), root=reg_root)
    v = doc["versions"][0]
    assert v["gate"] == "failed" and v["reference"] == "champion v1 (hargo)"
    assert v["reason"].startswith("not comparable with champion v1 (hargo)'s evaluation, so the "
                                  "gate cannot decide (the reference has no recorded evaluation "
                                  "identity)")
    assert doc["decision"] == "champion stays v1 (hargo)"
    assert _aliases(mlflow_uri) == {"champion": "1", "candidate": "2"}


def test_a_champion_without_per_prompt_rows_is_not_comparable(
        reg_root, committed_params, mlflow_uri, tiny_model_dir):
    """Same evaluation identity, but no per-prompt rows recorded with the champion: the gate has
    no evidence to pair, so it refuses and says why."""
    from hargo.evaluation.identity import read_eval_identity
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    client = _client(mlflow_uri)
    client.create_registered_model("hargo-hpc")
    old = client.create_model_version(
        "hargo-hpc", source=str(tiny_model_dir),
        tags={"hargo.method": "hargo",
              "hargo.eval_identity": json.dumps(read_eval_identity(reg_root), sort_keys=True)})
    client.set_registered_model_alias("hargo-hpc", "champion", old.version)
    doc = run(reg_params(committed_params), root=reg_root)
    v = doc["versions"][0]
    assert v["gate"] == "failed" and v["intervals"] == {}
    assert "(the champion has no per-prompt evaluation recorded (eval/<method>.per_prompt.json))" \
        in v["reason"]
    assert _aliases(mlflow_uri) == {"champion": "1", "candidate": "2"}


def test_a_champions_unreadable_or_unpairable_rows_stop_register_before_anything_is_registered(
        reg_root, committed_params, mlflow_uri):
    """The champion's rows are there but broken: a clear error naming the version, the run and
    the artifact, before any version is created (not "not comparable", which would hide it)."""
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    first = run(reg_params(committed_params), root=reg_root)
    [kept] = list((reg_root / "mlruns").rglob("grpo.per_prompt.json"))
    kept.write_text(json.dumps([1, 2]))
    with pytest.raises(RuntimeError, match=r"hargo-hpc v1 \(champion\): its per-prompt rows "
                       r"eval/grpo.per_prompt.json in run " + first["run_id"]
                       + r" is not a list of rows with ids"):
        run(reg_params(committed_params), root=reg_root)
    kept.write_text(json.dumps({"rows": model_rows(plp=0.45)[:-1]}))       # a prompt short
    with pytest.raises(RuntimeError, match=r"hargo-hpc v1 \(champion\): its per-prompt rows "
                       r"cannot be paired with this evaluation's \(the gate pairs prompts: .*"
                       r"only in candidate: \['plp-00007'\].*nothing was registered"):
        run(reg_params(committed_params), root=reg_root)
    assert _versions(mlflow_uri) == ["1"]
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}


def test_an_evaluation_that_is_not_the_champions_cannot_move_it(reg_root, committed_params,
                                                                  mlflow_uri):
    """The issue's case: a second register after an evaluation on other prompts (fewer, or
    decoded with another budget) compared metrics that cannot be compared. Now it refuses and
    names what differs; on the champion's own evaluation the same candidate passes."""
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}

    better = {"grpo": model_rows(plp=0.60)}
    fewer = RACE_IDS[:4] + PLP_IDS[:4]
    write_eval(reg_root, better, ids=fewer)                         # 8 prompts instead of 16
    doc = run(reg_params(committed_params), root=reg_root)
    v = doc["versions"][0]
    assert v["gate"] == "failed" and "n_prompts: 8 vs 16" in v["reason"]
    assert "prompts: '" in v["reason"] and doc["champion"]["moved"] is False
    assert _aliases(mlflow_uri) == {"candidate": "2", "champion": "1"}

    write_eval(reg_root, better, run={"max_new_tokens": 64})         # same prompts, other budget
    doc = run(reg_params(committed_params), root=reg_root)
    assert "max_new_tokens: 64 vs None" in doc["versions"][0]["reason"]
    assert "n_prompts" not in doc["versions"][0]["reason"]
    assert _aliases(mlflow_uri)["champion"] == "1"

    write_eval(reg_root, better)                                     # the champion's evaluation
    doc = run(reg_params(committed_params), root=reg_root)
    assert doc["versions"][0]["gate"] == "passed"
    assert _aliases(mlflow_uri) == {"candidate": "4", "champion": "4"}


def test_champion_stays_when_the_gate_fails_then_moves_when_it_passes(
        reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}

    # better DR-F1 (1 vs 2/3, interval above 0) but worse PLP than the champion: candidate only
    write_eval(reg_root, {"grpo": model_rows(race="ynynynyn", plp=0.44)})
    doc = run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "2", "champion": "1"}
    v = doc["versions"][0]
    assert v["gate"] == "failed" and v["reference"] == "champion v1 (grpo)"
    assert "plp_similarity 0.4400 vs 0.4500" in v["reason"]
    assert doc["champion"] == {"version": "1", "method": "grpo", "moved": False}
    assert doc["decision"] == "champion stays v1 (grpo)"
    mv2 = _client(mlflow_uri).get_model_version("hargo-hpc", "2")
    assert mv2.tags["hargo.gate"] == "failed"

    # the same loss on PLP within a tolerance of 0.02: it passes and takes the champion alias
    doc = run(reg_params(committed_params, **{"register.tolerance": 0.02}), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "3", "champion": "3"}
    assert doc["champion"] == {"version": "3", "method": "grpo", "moved": True}
    assert doc["previous_champion"] == {"version": "1", "method": "grpo"}


def test_no_champion_when_no_candidate_beats_sft_and_two_methods_are_judged_in_order(
        reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    # grpo ties SFT (nothing better): no champion; hargo beats SFT on every PLP prompt: champion
    write_eval(reg_root, {"grpo": model_rows(), "hargo": model_rows(plp=0.41)})
    doc = run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert [(v["method"], v["version"], v["gate"]) for v in doc["versions"]] == [
        ("grpo", "1", "failed"), ("hargo", "2", "passed")]
    assert _aliases(mlflow_uri) == {"candidate": "2", "champion": "2"}

    write_eval(reg_root, {"grpo": model_rows(plp=0.40)})              # below the champion's 0.41
    doc = run(reg_params(committed_params, methods=("grpo",)), root=reg_root)
    assert doc["versions"][0]["reference"] == "champion v2 (hargo)"
    assert _aliases(mlflow_uri) == {"candidate": "3", "champion": "2"}


def test_no_candidate_beats_sft_leaves_champion_unset(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(race="nnnnnnnn")})      # DR-F1 0
    doc = run(reg_params(committed_params), root=reg_root)
    assert doc["champion"] is None
    assert doc["decision"] == "champion stays unset (no candidate beat sft)"
    assert _aliases(mlflow_uri) == {"candidate": "1"}


# --------------------------------------------------------------------------------------------
# bad input and failures: a clear error, no alias moved, nothing partial registered


def test_missing_metrics_for_a_model_is_a_clear_error(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    doc = write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    with pytest.raises(HargoInputError, match=r"eval.json, field 'hargo': no metrics for model"):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    doc["grpo"]["plp_similarity"] = None
    (reg_root / "metrics" / "eval.json").write_text(json.dumps(doc))
    with pytest.raises(HargoInputError, match=r"field 'grpo.plp_similarity'"):
        run(reg_params(committed_params), root=reg_root)
    # rows from another evaluation than eval.json's: the gate would resample the wrong rows
    doc = write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    doc["grpo"]["plp_similarity"] = 0.5
    (reg_root / "metrics" / "eval.json").write_text(json.dumps(doc))
    with pytest.raises(HargoInputError, match=r"field 'grpo.plp_similarity': plp_similarity of "
                       r"grpo is 0.5 but its per-prompt rows give 0.45"):
        run(reg_params(committed_params), root=reg_root)
    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    (reg_root / "data" / "eval" / "grpo.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"grpo.jsonl not found: run the evaluate stage"):
        run(reg_params(committed_params), root=reg_root)
    (reg_root / "metrics" / "eval.json").unlink()
    with pytest.raises(FileNotFoundError, match="hargo evaluate"):
        run(reg_params(committed_params), root=reg_root)
    assert _registered_names(mlflow_uri) == []


def test_unknown_gate_metric_is_a_clear_error(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    with pytest.raises(ValueError, match=r"unknown gate metric 'mean_completion_chars_plp'"):
        run(reg_params(committed_params,
                       **{"register.gate_metrics": ["dr_f1", "mean_completion_chars_plp"]}),
            root=reg_root)
    assert _registered_names(mlflow_uri) == []


@pytest.mark.parametrize("damage", ["missing", "half-written"])
def test_missing_or_half_written_model_folder(reg_root, committed_params, mlflow_uri, damage):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45), "hargo": model_rows(plp=0.5)})
    folder = reg_root / "models" / "rl" / "hargo"
    if damage == "missing":
        shutil.rmtree(folder)
    else:
        (folder / ".complete").unlink()
    with pytest.raises(FileNotFoundError, match="does not exist" if damage == "missing"
                       else "incomplete"):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert _registered_names(mlflow_uri) == []  # grpo, though fine, was not registered either


@pytest.mark.parametrize("record", ["diverged", "past-bound", "missing"])
def test_a_model_whose_training_diverged_is_refused_before_anything_is_registered(
        reg_root, committed_params, mlflow_uri, record):
    """Issue 30 item 1: register reads each model's training record; grpo, though healthy and
    first in order, is not registered either."""
    from hargo.registry import run
    from hargo.training.divergence import TRAINING_RECORD

    write_eval(reg_root, {"grpo": model_rows(plp=0.45), "hargo": model_rows(plp=0.5)})
    path = reg_root / "models" / "rl" / "hargo" / TRAINING_RECORD
    if record == "missing":
        path.unlink()
        match = r"models/rl/hargo/training_record.json: model folder of 'hargo' has no training"
    elif record == "diverged":
        path.write_text(json.dumps({**HEALTHY_RECORD, "diverged": True,
                                    "problem": "step 2: loss = 3.1e+23 (bound |loss| <= 100)"}))
        match = r"field 'diverged'.*diverged in training \(step 2: loss = 3.1e\+23"
    else:   # trained with train.divergence.max_kl raised to 1e6; registered under the default 10
        path.write_text(json.dumps({**HEALTHY_RECORD, "peaks": {"kl": {"value": 9.7e24,
                                                                       "step": 2}}}))
        match = r"field 'peaks.kl'.*reached 9.7e\+24 at step 2, past train.divergence.max_kl = 10"
    with pytest.raises(HargoInputError, match=match):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert _registered_names(mlflow_uri) == []
    assert not (reg_root / "metrics" / "register.json").exists()


def test_store_that_cannot_be_opened_is_a_clear_error(reg_root, committed_params, monkeypatch):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    blocker = reg_root / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    with pytest.raises(RuntimeError, match=r"MLflow store sqlite:///.*not-a-folder.* cannot be used"):
        run(reg_params(committed_params), root=reg_root)
    assert not (reg_root / "metrics" / "register.json").exists()


def test_unwritable_artifact_store_keeps_the_champion_and_registers_nothing(
        reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    first = run(reg_params(committed_params), root=reg_root)
    before = (reg_root / "metrics" / "register.json").read_text()
    # the artifact store becomes unwritable: its folder is replaced by a file
    artifacts = reg_root / "mlruns" / "artifacts"
    shutil.rmtree(artifacts)
    artifacts.write_text("not a folder")
    write_eval(reg_root, {"grpo": model_rows(plp=0.60)})  # would win the gate
    with pytest.raises(RuntimeError, match="nothing was registered and no alias moved"):
        run(reg_params(committed_params), root=reg_root)
    assert _versions(mlflow_uri) == ["1"]
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": first["champion"]["version"]}
    assert (reg_root / "metrics" / "register.json").read_text() == before


def test_failure_midway_deletes_the_versions_already_created(reg_root, committed_params,
                                                             mlflow_uri, monkeypatch):
    import mlflow

    from hargo.registry import run

    write_eval(reg_root, {"grpo": model_rows(plp=0.45), "hargo": model_rows(plp=0.5)})
    real = mlflow.register_model
    calls = []

    def flaky(*a, **k):
        calls.append(a)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*a, **k)

    monkeypatch.setattr(mlflow, "register_model", flaky)
    with pytest.raises(RuntimeError, match="OSError: disk full"):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert len(calls) == 2
    assert _registered_names(mlflow_uri) == []  # grpo's version 1 and the model were removed
    assert not (reg_root / "metrics" / "register.json").exists()


def test_failure_after_the_champion_moved_puts_the_champion_back(reg_root, committed_params,
                                                                  mlflow_uri, monkeypatch):
    """A failure after the champion alias moved (writing metrics/register.json): the old
    champion is restored, the new version deleted, and the candidate alias is back on the
    version it held."""
    from hargo import registry

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    registry.run(as_config(reg_params(committed_params)), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}
    before = (reg_root / "metrics" / "register.json").read_text()

    write_eval(reg_root, {"grpo": model_rows(plp=0.60)})   # wins the gate: the champion moves
    seen = []

    def fail_after_alias(path, doc):
        seen.append(_aliases(mlflow_uri))                   # the aliases when the write fails
        raise OSError("disk full")

    monkeypatch.setattr(registry, "atomic_write_json", fail_after_alias)
    with pytest.raises(RuntimeError, match="nothing was registered and no alias moved: "
                                           "OSError: disk full"):
        registry.run(as_config(reg_params(committed_params)), root=reg_root)
    assert seen == [{"candidate": "2", "champion": "2"}]   # it had moved
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}
    assert _versions(mlflow_uri) == ["1"]
    assert (reg_root / "metrics" / "register.json").read_text() == before


def test_failure_after_the_first_champion_was_set_removes_it(reg_root, committed_params,
                                                             mlflow_uri, monkeypatch):
    """No champion before, the gate passes, then a failure: no champion, no model left."""
    from hargo import registry

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    monkeypatch.setattr(registry, "atomic_write_json",
                        lambda path, doc: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(RuntimeError, match="OSError: disk full"):
        registry.run(as_config(reg_params(committed_params)), root=reg_root)
    assert _registered_names(mlflow_uri) == []


@pytest.mark.fast
def test_gate_passes_its_bootstrap_settings_through_and_names_every_metric():
    """resamples, confidence and seed reach the bootstrap (the intervals are exactly
    paired_bootstrap_ci's with the same settings); several deciding metrics are all named."""
    from hargo.gate import gate, metric_values
    from hargo.stats import f1_statistic, paired_bootstrap_ci

    cand, ref = model_rows(race="ynynynyn", plp=0.25), model_rows(plp=0.5)
    a, b = metric_values(cand, "dr_f1")[0], metric_values(ref, "dr_f1")[0]
    for kw in ({"resamples": 100}, {"confidence": 0.5}, {"seed": 1}, {}):
        want = paired_bootstrap_ci(a, b, f1_statistic, **{"resamples": 2000, "confidence": 0.95,
                                                            "seed": 0, **kw})
        got = gate(cand, ref, ["dr_f1"], 0.0, **kw)[2]["dr_f1"]
        assert (got["low"], got["high"]) == (want["low"], want["high"]), kw
    # continuous values: each setting gives another interval, so none can be dropped silently
    noisy = model_rows(plp=[0.05, 0.13, 0.29, 0.37, 0.41, 0.53, 0.67, 0.71])
    seen = {str(gate(noisy, SFT_ROWS, ["plp_similarity"], 0.0, **kw)[2])
            for kw in ({}, {"resamples": 100}, {"confidence": 0.5}, {"seed": 1})}
    assert len(seen) == 4
    noisy = model_rows(plp=[0.05, 0.13, 0.29, 0.37, 0.41, 0.53, 0.67, 0.71])
    assert gate(noisy, SFT_ROWS, ["plp_similarity"], 0.0, seed=1)[2] != \
        gate(noisy, SFT_ROWS, ["plp_similarity"], 0.0)[2] == \
        gate(noisy, SFT_ROWS, ["plp_similarity"], 0.0, seed=0)[2]
    assert "(100 bootstrap resamples of each metric's paired prompts)" in gate(cand, ref, ["dr_f1"], 0.0,
                                                                   resamples=100)[1]
    assert " 50% CI [" in gate(cand, ref, ["dr_f1"], 0.0, confidence=0.5)[1]
    # two metrics better, two worse: each list names both
    both = model_rows(race="ynynynyn", plp=0.6)
    ok, why, _ = gate(both, SFT_ROWS, ["dr_f1", "plp_similarity"], 0.0)
    assert ok and why.startswith("better on dr_f1, plp_similarity (95% interval above zero)")
    ok, why, _ = gate(SFT_ROWS, both, ["dr_f1", "plp_similarity"], 0.0)
    assert not ok and why.startswith("worse than the reference by more than the tolerance 0 on "
                                     "dr_f1, plp_similarity: ")


@pytest.mark.fast
def test_gate_pairing_refuses_duplicates_and_names_at_most_three_ids():
    from hargo.gate import gate, metric_values

    for cand, ref in ((SFT_ROWS + SFT_ROWS[:1], SFT_ROWS), (SFT_ROWS, SFT_ROWS + SFT_ROWS[:1])):
        with pytest.raises(ValueError, match=r"must hold the same unique prompt ids"):
            gate(cand, ref, ["plp_similarity"], 0.0)
    with pytest.raises(ValueError, match=r"only in candidate: \[\], only in reference: "
                       r"\['plp-00003', 'plp-00004', 'plp-00005'\], 11 vs 16 rows"):
        gate(SFT_ROWS[:11], SFT_ROWS, ["plp_similarity"], 0.0)
    # int ids beside str ones (ids come from JSON): sorted as text, at most three named
    mixed = [{**r, "id": i} for r, i in zip(SFT_ROWS, [7, "x1", 12, "x2", "x3"])] + SFT_ROWS[5:]
    msg = (r"only in candidate: \[12, 7, 'x1'\], only in reference: \['race_c-00000', "
           r"'race_c-00001', 'race_c-00002'\], 16 vs 16 rows")
    with pytest.raises(ValueError, match=msg):
        gate(mixed, SFT_ROWS, ["plp_similarity"], 0.0)
    with pytest.raises(ValueError, match=r"only in candidate: \['race_c-00000', 'race_c-00001', "
                       r"'race_c-00002'\], only in reference: \[12, 7, 'x1'\]"):
        gate(SFT_ROWS, mixed, ["plp_similarity"], 0.0)
    with pytest.raises(ValueError, match=r"gate metric avg_score: no evaluated prompt of task\(s\) "
                                         r"any$"):
        metric_values([], "avg_score")
    no_pred = [{k: v for k, v in r.items() if k != "prediction"} for r in SFT_ROWS]
    with pytest.raises(ValueError, match=r"prompt 'race_c-00000' has no 'prediction'"):
        metric_values(no_pred, "dr_recall")
    plp_only = [r for r in SFT_ROWS if r["task"] == "plp"]
    with pytest.raises(ValueError, match=r"gate metric dr_f1: no evaluated prompt of task\(s\) "
                                         r"race_c, race_fortran$"):
        metric_values(plp_only, "dr_f1")


@pytest.mark.fast
def test_rows_must_give_the_reported_metrics(tmp_path):
    from hargo.gate import GateParams, check_gate_params, check_rows_match_metrics

    rows = {"sft": SFT_ROWS, "grpo": model_rows(plp=0.45)}
    metrics = {m: metrics_of(r) for m, r in rows.items()}
    gates = ["dr_f1", "plp_similarity", "win_rate"]
    check_rows_match_metrics(rows, metrics, gates, tmp_path / "eval.json")   # no error
    near = {**metrics, "grpo": {**metrics["grpo"], "plp_similarity": 0.45 + 5e-7}}
    check_rows_match_metrics(rows, near, gates, tmp_path / "eval.json")      # within 1e-6
    off = {**metrics, "grpo": {**metrics["grpo"], "plp_similarity": 0.45 + 2e-6}}
    with pytest.raises(HargoInputError, match=r"eval.json, field 'grpo.plp_similarity': "
                       r"plp_similarity of grpo is 0.450002 but its per-prompt rows give 0.45\d*: "
                       r"data/eval and metrics/eval.json come from different evaluations; re-run "
                       r"hargo evaluate"):
        check_rows_match_metrics(rows, off, gates, tmp_path / "eval.json")
    with pytest.raises(HargoInputError, match=r"eval.json, field 'sft.mlperf_em': gate metric mlperf_em: "
                                              r"no evaluated prompt"):
        check_rows_match_metrics(rows, metrics, ["mlperf_em"], tmp_path / "eval.json")
    assert check_gate_params({"model_name": "m", "gate_metrics": ["dr_f1"], "resamples": 100}) \
        == GateParams("m", ["dr_f1"], 0.0, 100, 0.95)


@pytest.mark.parametrize("when", ["before-the-first-registry-write", "while-logging-versions"])
def test_a_params_edit_during_register_leaves_the_registry_as_it_was(
        reg_root, committed_params, mlflow_uri, monkeypatch, when):
    """Issue 42 item 3's kind in `register`: before, a params file edited during the stage
    failed it only at its end, after the new versions were registered and @candidate moved,
    and its MLflow run stayed FINISHED. Now a change seen before the first registry write
    stops it there; one seen after the versions were logged is rolled back like any failure;
    the stage's run ends FAILED either way."""
    import mlflow
    import yaml
    from mlflow.tracking import MlflowClient

    from hargo import registry, stage_inputs
    from hargo.params import ParamsError, read_params_file

    write_eval(reg_root, {"grpo": model_rows(plp=0.45)})
    if when == "while-logging-versions":       # an earlier registration: v1 champion, candidate
        registry.run(reg_params(committed_params), root=reg_root)
        write_eval(reg_root, {"grpo": model_rows(plp=0.60)})   # would win: the champion moves
    before = {"names": _registered_names(mlflow_uri),
              "aliases": _aliases(mlflow_uri) if _registered_names(mlflow_uri) else {},
              "doc": (reg_root / "metrics" / "register.json").read_text()
              if (reg_root / "metrics" / "register.json").exists() else None}
    params_file = reg_root / "params.yaml"
    params_file.write_text(yaml.safe_dump(committed_params, sort_keys=False))

    def edit():
        doc = yaml.safe_load(params_file.read_text())
        doc["register"]["tolerance"] = 0.02
        params_file.write_text(yaml.safe_dump(doc, sort_keys=False))

    def after_edit(real):
        def wrapped(*a, **k):
            edit()
            return real(*a, **k)
        return wrapped

    if when == "before-the-first-registry-write":   # during the checks of the inputs
        monkeypatch.setattr(registry, "base_record", after_edit(registry.base_record))
        expected = (ParamsError, r"^params\.yaml changed while the stage ran "
                                 r"\(register\.tolerance: 0\.0 -> 0\.02\)")
    else:
        monkeypatch.setattr(mlflow, "register_model", after_edit(mlflow.register_model))
        expected = (RuntimeError, r"nothing was registered and no alias moved: ParamsError: "
                                  r"params\.yaml changed while the stage ran")
    with stage_inputs.watching():
        stage_inputs.remember_params("params.yaml", read_params_file(params_file))
        stage_inputs._STATE["params_file"] = str(params_file)
        with pytest.raises(expected[0], match=expected[1]):
            registry.run(reg_params(committed_params), root=reg_root)
    assert _registered_names(mlflow_uri) == before["names"]
    if before["names"]:
        assert _aliases(mlflow_uri) == before["aliases"] == {"candidate": "1", "champion": "1"}
        assert _versions(mlflow_uri) == ["1"]
    doc = reg_root / "metrics" / "register.json"
    assert (doc.read_text() if doc.exists() else None) == before["doc"]
    runs = MlflowClient(mlflow_uri).search_runs(
        [MlflowClient(mlflow_uri).get_experiment_by_name("hargo").experiment_id],
        "tags.`hargo.stage` = 'register'", order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "FAILED"
