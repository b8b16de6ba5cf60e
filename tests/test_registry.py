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

pytestmark = pytest.mark.timeout(600)

SFT = {"dr_f1": 0.60, "plp_similarity": 0.40, "mlperf_em": 0.10, "avg_score": 0.35}


def eval_doc(**models) -> dict:
    doc = {"sft": dict(SFT), "run": {"judge": "task-reward", "n_prompts": 8}}
    for name, over in models.items():
        doc[name] = {**SFT, "win_rate": 0.5, **over}
    return doc


IDS = [f"race_c-{i:05d}" for i in range(8)]


def write_eval(root: Path, doc: dict, ids=IDS) -> None:
    """metrics/eval.json, and data/eval/prompts.json with the evaluated prompt ids (the
    evaluation's identity is read from both)."""
    (root / "metrics").mkdir(parents=True, exist_ok=True)
    (root / "metrics" / "eval.json").write_text(json.dumps(doc))
    (root / "data" / "eval").mkdir(parents=True, exist_ok=True)
    (root / "data" / "eval" / "prompts.json").write_text(json.dumps({"ids": list(ids)}))


@pytest.fixture()
def reg_root(tmp_path, tiny_model_dir) -> Path:
    for m in ("grpo", "hargo"):
        shutil.copytree(tiny_model_dir, tmp_path / "models" / "rl" / m)
    return tmp_path


def reg_params(committed_params, methods=("grpo",), **over) -> dict:
    return apply_overrides(committed_params, {"rl.methods": list(methods),
                                              "register.model_name": "hargo-hpc",
                                              "register.gate_metrics": ["dr_f1", "plp_similarity"],
                                              "register.tolerance": 0.0, **over})


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


def test_gate_rule_by_hand():
    from hargo.gate import gate

    ref = {"dr_f1": 0.80, "plp_similarity": 0.50}
    ok, why = gate({"dr_f1": 0.85, "plp_similarity": 0.50}, ref, ["dr_f1", "plp_similarity"], 0.0)
    assert ok and "better on dr_f1" in why and "dr_f1 0.8500 vs 0.8000 (+0.0500)" in why
    ok, why = gate(dict(ref), ref, ["dr_f1", "plp_similarity"], 0.0)
    assert not ok and "not strictly better" in why
    worse = {"dr_f1": 0.90, "plp_similarity": 0.49}
    ok, why = gate(worse, ref, ["dr_f1", "plp_similarity"], 0.0)
    assert not ok and "by more than the tolerance 0 on plp_similarity" in why
    ok, why = gate(worse, ref, ["dr_f1", "plp_similarity"], 0.02)  # -0.01 is within 0.02
    assert ok
    ok, _ = gate(worse, ref, ["dr_f1", "plp_similarity"], 0.005)
    assert not ok
    # tolerance never makes an equal-or-worse candidate pass
    ok, _ = gate({"dr_f1": 0.79, "plp_similarity": 0.49}, ref, ["dr_f1", "plp_similarity"], 0.5)
    assert not ok


@pytest.mark.fast
def test_gate_tolerance_boundary_passes():
    """The rule is ``candidate >= reference - tolerance``: a candidate exactly ``tolerance`` below
    on one metric (0.25 = 0.5 - 0.25, all exact in binary) is within it and passes when it is
    strictly better elsewhere; one ulp further below fails."""
    from hargo.gate import gate

    ref = {"dr_f1": 0.5, "plp_similarity": 0.5}
    gates = ["dr_f1", "plp_similarity"]
    ok, why = gate({"dr_f1": 0.75, "plp_similarity": 0.25}, ref, gates, 0.25)
    assert ok, why
    assert why == ("better on dr_f1, none worse beyond 0.25: dr_f1 0.7500 vs 0.5000 (+0.2500); "
                   "plp_similarity 0.2500 vs 0.5000 (-0.2500)")
    below = math.nextafter(0.25, 0.0)
    ok, why = gate({"dr_f1": 0.75, "plp_similarity": below}, ref, gates, 0.25)
    assert not ok and why.startswith("worse than the reference by more than the tolerance 0.25 "
                                     "on plp_similarity: ")
    # tolerance 0: equal is not worse, and exactly equal everywhere is not strictly better
    ok, why = gate({"dr_f1": 0.5, "plp_similarity": 0.5}, ref, gates, 0.0)
    assert not ok and why.startswith("not strictly better on any gate metric: ")
    ok, _ = gate({"dr_f1": 0.5, "plp_similarity": math.nextafter(0.5, 1.0)}, ref, gates, 0.0)
    assert ok
    # only the listed gate metrics count: a worse metric outside them does not block
    ok, _ = gate({"dr_f1": 0.6, "plp_similarity": 0.0}, ref, ["dr_f1"], 0.0)
    assert ok
    with pytest.raises(KeyError):
        gate({"dr_f1": 0.6}, ref, gates, 0.0)
    # several metrics deciding: listed in gate_metrics order, comma-separated
    three = ["dr_f1", "plp_similarity", "mlperf_em"]
    ref3 = {**ref, "mlperf_em": 0.5}
    ok, why = gate({"dr_f1": 0.75, "plp_similarity": 0.75, "mlperf_em": 0.5}, ref3, three, 0.0)
    assert ok and why.startswith("better on dr_f1, plp_similarity, none worse beyond 0: ")
    ok, why = gate({"dr_f1": 0.25, "plp_similarity": 0.75, "mlperf_em": 0.0}, ref3, three, 0.0)
    assert not ok and why.startswith("worse than the reference by more than the tolerance 0 on "
                                     "dr_f1, mlperf_em: ")


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
    from hargo.gate import GATE_METRICS, check_gate_params

    ok = {"model_name": "hargo-hpc", "gate_metrics": ["dr_f1", "win_rate"]}
    assert check_gate_params(ok) == ("hargo-hpc", ["dr_f1", "win_rate"], 0.0)  # default 0
    assert check_gate_params({**ok, "tolerance": 0}) == ("hargo-hpc", ["dr_f1", "win_rate"], 0.0)
    name, gates, tol = check_gate_params({**ok, "tolerance": 0.02})
    assert tol == 0.02 and isinstance(tol, float)
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
                       + re.escape(", ".join(GATE_METRICS))):
        check_gate_params({**ok, "gate_metrics": ["dr_f1", "loss"]})


@pytest.mark.fast
def test_sft_default_win_rate_half_is_a_gate_metric(tmp_path):
    """SFT's ``win_rate`` against itself is 0.5 when eval.json has none; as a gate metric a
    candidate at 0.5 (all ties with SFT) is not better on it, one above is."""
    from hargo.gate import gate
    from hargo.registry import read_eval_metrics

    write_eval(tmp_path, eval_doc(grpo={"win_rate": 0.5}, hargo={"win_rate": 0.625}))
    got = read_eval_metrics(tmp_path / "metrics" / "eval.json", ["sft", "grpo", "hargo"],
                            ["dr_f1", "win_rate"])
    assert got["sft"] == {**SFT, "win_rate": 0.5}
    gates = ["dr_f1", "win_rate"]
    ok, why = gate(got["grpo"], got["sft"], gates, 0.0)
    assert not ok and "win_rate 0.5000 vs 0.5000 (+0.0000)" in why
    ok, why = gate(got["hargo"], got["sft"], gates, 0.0)
    assert ok and why.startswith("better on win_rate, none worse beyond 0: ")
    # an SFT win_rate written by the evaluate stage is kept, not overwritten
    doc = eval_doc(grpo={})
    doc["sft"]["win_rate"] = 0.25
    write_eval(tmp_path, doc)
    got = read_eval_metrics(tmp_path / "metrics" / "eval.json", ["sft", "grpo"], ["win_rate"])
    assert got["sft"]["win_rate"] == 0.25
    # a candidate without win_rate is refused, naming the field
    doc = eval_doc(grpo={})
    del doc["grpo"]["win_rate"]
    write_eval(tmp_path, doc)
    with pytest.raises(HargoInputError, match=r"field 'grpo\.win_rate'"):
        read_eval_metrics(tmp_path / "metrics" / "eval.json", ["sft", "grpo"], ["win_rate"])


# --------------------------------------------------------------------------------------------
# registration, aliases, and the champion loading back


def test_register_moves_champion_when_the_gate_passes_and_the_champion_loads(
        reg_root, committed_params, mlflow_uri, tiny_model_dir):
    from hargo.evaluation.generate import generate
    from hargo.registry import ask, load_registered, run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70, "plp_similarity": 0.40}))
    doc = run(reg_params(committed_params), root=reg_root)

    assert doc["previous_champion"] is None
    assert doc["versions"][0]["gate"] == "passed" and doc["versions"][0]["reference"] == "sft"
    assert doc["champion"] == {"version": "1", "method": "grpo", "moved": True}
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
    assert identity == doc["eval_identity"] and identity["n_prompts"] == 8
    assert identity["judge"] == "task-reward" and len(identity["prompts"]) == 16
    assert mv.tags["hargo.method"] == "grpo" and mv.tags["hargo.gate"] == "passed"
    assert mv.description.startswith("gate passed against sft: better on dr_f1")
    linked = {m.key: m.value for m in client.get_logged_model(mv.source.split("/")[-1]).metrics}
    assert linked["dr_f1"] == 0.70 and linked["win_rate"] == 0.5
    assert linked["plp_similarity"] == 0.40 and linked["mlperf_em"] == 0.10
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
    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.85, "plp_similarity": 0.49}))
    doc = run(reg_params(committed_params), root=reg_root)
    v = doc["versions"][0]
    assert v["gate"] == "failed" and v["reference"] == "champion v1 (hargo)"
    assert v["reason"].startswith("not comparable with champion v1 (hargo)'s evaluation, so the "
                                  "gate cannot decide (the reference has no recorded evaluation "
                                  "identity)")
    assert doc["decision"] == "champion stays v1 (hargo)"
    assert _aliases(mlflow_uri) == {"champion": "1", "candidate": "2"}


def test_an_evaluation_that_is_not_the_champions_cannot_move_it(reg_root, committed_params,
                                                                  mlflow_uri):
    """The issue's case: a second register after an evaluation on other prompts (fewer, or
    decoded with another budget) compared metrics that cannot be compared. Now it refuses and
    names what differs; on the champion's own evaluation the same candidate passes."""
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70, "plp_similarity": 0.40}))
    run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}

    better = eval_doc(grpo={"dr_f1": 0.95, "plp_similarity": 0.60})
    write_eval(reg_root, better, ids=IDS[:4])                       # 4 prompts instead of 8
    doc = run(reg_params(committed_params), root=reg_root)
    v = doc["versions"][0]
    assert v["gate"] == "failed" and "n_prompts: 4 vs 8" in v["reason"]
    assert "prompts: '" in v["reason"] and doc["champion"]["moved"] is False
    assert _aliases(mlflow_uri) == {"candidate": "2", "champion": "1"}

    better["run"]["max_new_tokens"] = 64                             # same prompts, other budget
    write_eval(reg_root, better)
    doc = run(reg_params(committed_params), root=reg_root)
    assert "max_new_tokens: 64 vs None" in doc["versions"][0]["reason"]
    assert "n_prompts" not in doc["versions"][0]["reason"]
    assert _aliases(mlflow_uri)["champion"] == "1"

    del better["run"]["max_new_tokens"]                              # the champion's evaluation
    write_eval(reg_root, better)
    doc = run(reg_params(committed_params), root=reg_root)
    assert doc["versions"][0]["gate"] == "passed"
    assert _aliases(mlflow_uri) == {"candidate": "4", "champion": "4"}


def test_champion_stays_when_the_gate_fails_then_moves_when_it_passes(
        reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70, "plp_similarity": 0.45}))
    run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}

    # better DR-F1 but worse PLP than the champion (0.45): candidate only
    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.90, "plp_similarity": 0.44}))
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

    # grpo ties SFT (not strictly better): no champion; hargo beats SFT: champion
    write_eval(reg_root, eval_doc(grpo={}, hargo={"plp_similarity": 0.41}))
    doc = run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert [(v["method"], v["version"], v["gate"]) for v in doc["versions"]] == [
        ("grpo", "1", "failed"), ("hargo", "2", "passed")]
    assert _aliases(mlflow_uri) == {"candidate": "2", "champion": "2"}

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.59}))
    doc = run(reg_params(committed_params, methods=("grpo",)), root=reg_root)
    assert doc["versions"][0]["reference"] == "champion v2 (hargo)"
    assert _aliases(mlflow_uri) == {"candidate": "3", "champion": "2"}


def test_no_candidate_beats_sft_leaves_champion_unset(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.5}))
    doc = run(reg_params(committed_params), root=reg_root)
    assert doc["champion"] is None
    assert doc["decision"] == "champion stays unset (no candidate beat sft)"
    assert _aliases(mlflow_uri) == {"candidate": "1"}


# --------------------------------------------------------------------------------------------
# bad input and failures: a clear error, no alias moved, nothing partial registered


def test_missing_metrics_for_a_model_is_a_clear_error(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.7}))
    with pytest.raises(HargoInputError, match=r"eval.json, field 'hargo': no metrics for model"):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    doc = eval_doc(grpo={"dr_f1": 0.7})
    doc["grpo"]["plp_similarity"] = None
    write_eval(reg_root, doc)
    with pytest.raises(HargoInputError, match=r"field 'grpo.plp_similarity'"):
        run(reg_params(committed_params), root=reg_root)
    (reg_root / "metrics" / "eval.json").unlink()
    with pytest.raises(FileNotFoundError, match="hargo evaluate"):
        run(reg_params(committed_params), root=reg_root)
    assert _registered_names(mlflow_uri) == []


def test_unknown_gate_metric_is_a_clear_error(reg_root, committed_params, mlflow_uri):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.7}))
    with pytest.raises(ValueError, match=r"unknown gate metric 'mean_completion_chars_plp'"):
        run(reg_params(committed_params,
                       **{"register.gate_metrics": ["dr_f1", "mean_completion_chars_plp"]}),
            root=reg_root)
    assert _registered_names(mlflow_uri) == []


@pytest.mark.parametrize("damage", ["missing", "half-written"])
def test_missing_or_half_written_model_folder(reg_root, committed_params, mlflow_uri, damage):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.7}, hargo={"dr_f1": 0.8}))
    folder = reg_root / "models" / "rl" / "hargo"
    if damage == "missing":
        shutil.rmtree(folder)
    else:
        (folder / ".complete").unlink()
    with pytest.raises(FileNotFoundError, match="does not exist" if damage == "missing"
                       else "incomplete"):
        run(reg_params(committed_params, methods=("grpo", "hargo")), root=reg_root)
    assert _registered_names(mlflow_uri) == []  # grpo, though fine, was not registered either


def test_store_that_cannot_be_opened_is_a_clear_error(reg_root, committed_params, monkeypatch):
    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.7}))
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

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70}))
    first = run(reg_params(committed_params), root=reg_root)
    before = (reg_root / "metrics" / "register.json").read_text()
    # the artifact store becomes unwritable: its folder is replaced by a file
    artifacts = reg_root / "mlruns" / "artifacts"
    shutil.rmtree(artifacts)
    artifacts.write_text("not a folder")
    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.95}))  # would win the gate
    with pytest.raises(RuntimeError, match="nothing was registered and no alias moved"):
        run(reg_params(committed_params), root=reg_root)
    assert _versions(mlflow_uri) == ["1"]
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": first["champion"]["version"]}
    assert (reg_root / "metrics" / "register.json").read_text() == before


def test_failure_midway_deletes_the_versions_already_created(reg_root, committed_params,
                                                             mlflow_uri, monkeypatch):
    import mlflow

    from hargo.registry import run

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.7}, hargo={"dr_f1": 0.8}))
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

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70}))
    registry.run(reg_params(committed_params), root=reg_root)
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}
    before = (reg_root / "metrics" / "register.json").read_text()

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.95}))   # wins the gate: the champion moves
    seen = []

    def fail_after_alias(path, doc):
        seen.append(_aliases(mlflow_uri))                   # the aliases when the write fails
        raise OSError("disk full")

    monkeypatch.setattr(registry, "atomic_write_json", fail_after_alias)
    with pytest.raises(RuntimeError, match="nothing was registered and no alias moved: "
                                           "OSError: disk full"):
        registry.run(reg_params(committed_params), root=reg_root)
    assert seen == [{"candidate": "2", "champion": "2"}]   # it had moved
    assert _aliases(mlflow_uri) == {"candidate": "1", "champion": "1"}
    assert _versions(mlflow_uri) == ["1"]
    assert (reg_root / "metrics" / "register.json").read_text() == before


def test_failure_after_the_first_champion_was_set_removes_it(reg_root, committed_params,
                                                             mlflow_uri, monkeypatch):
    """No champion before, the gate passes, then a failure: no champion, no model left."""
    from hargo import registry

    write_eval(reg_root, eval_doc(grpo={"dr_f1": 0.70}))
    monkeypatch.setattr(registry, "atomic_write_json",
                        lambda path, doc: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(RuntimeError, match="OSError: disk full"):
        registry.run(reg_params(committed_params), root=reg_root)
    assert _registered_names(mlflow_uri) == []
