"""``hargo summary``: metrics per model from metrics/eval.json, stage wall times from the child
runs under the pipeline's parent run in MLflow (stages without a run: cached), and the
champion decision from metrics/register.json."""
from __future__ import annotations

import json

import pytest

from hargo.params import apply_overrides
from hargo.config import as_config


def test_summary_reads_metrics_stage_runs_and_the_register_decision(tmp_path, committed_params,
                                                                   mlflow_uri, capsys,
                                                                   monkeypatch):
    from mlflow.tracking import MlflowClient

    # the table follows $COLUMNS (test_summary_is_as_wide_as_columns_says); a width another test
    # or the shell left in the environment must not cut the columns this test reads
    monkeypatch.setenv("COLUMNS", "220")
    from hargo import summary, tracking

    params = apply_overrides(committed_params, {"rl.methods": ["grpo", "hargo"]})
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps({
        "sft": {"dr_f1": 0.5, "dr_mcc": 0.125, "dr_yes_share": 0.75, "plp_similarity": 0.25,
                "mlperf_em": 0.125, "avg_score": 0.375, "gen_tokens_per_s": 400.0,
                "dr_always_yes_f1": 0.6875},
        "grpo": {"dr_f1": 0.75, "dr_mcc": 0.5, "dr_auc": 0.8125, "dr_yes_share": 0.5,
                 "plp_similarity": 0.5, "mlperf_em": 0.25, "avg_score": 0.5, "win_rate": 0.625,
                 "gen_tokens_per_s": 410.0},
        "base": {"dr_f1": 0.25, "dr_mcc": -0.0625, "dr_auc": 0.4375, "dr_yes_share": 0.375,
                 "plp_similarity": 0.125, "mlperf_em": 0.0, "avg_score": 0.25,
                 "win_rate": 0.3125, "gen_tokens_per_s": 420.0},
        "always-yes": {"baseline": True, "dr_f1": 0.6875, "dr_mcc": 0.0, "dr_auc": 0.5,
                       "dr_yes_share": 1.0},
        "nearest-train": {"baseline": True, "dr_f1": 0.9375, "dr_mcc": 0.875, "dr_auc": 0.96875,
                          "dr_yes_share": 0.5625},
        "run": {"judge": "task-reward"}}))
    (tmp_path / "metrics" / "register.json").write_text(json.dumps({
        "model_name": "hargo-hpc", "decision": "champion moved to v1 (grpo) from sft",
        "champion": {"version": "1", "method": "grpo", "moved": True},
        "candidate": {"version": "1", "method": "grpo"},
        "versions": [{"method": "grpo", "version": "1", "gate": "passed", "reference": "sft"}]}))

    # this pipeline ran sft, rl@grpo and evaluate; the rest were cached by DVC
    for stage, tags in (("sft", None), ("rl", {"hargo.method": "grpo"}), ("evaluate", None)):
        with tracking.stage_run(stage, as_config(params), tmp_path, extra_tags=tags):
            pass
    # a run under another pipeline (other params) must not count
    other = apply_overrides(params, {"seed": 7})
    with tracking.stage_run("prepare", as_config(other), tmp_path):
        pass

    data = summary.run(as_config(params), root=tmp_path)

    assert data["judge"] == "task-reward"
    assert data["models"]["sft"] == {"dr_f1": 0.5, "dr_mcc": 0.125, "dr_auc": None,
                                     "dr_yes_share": 0.75, "plp_similarity": 0.25,
                                     "mlperf_em": 0.125, "avg_score": 0.375, "win_rate": None,
                                     "gen_tokens_per_s": 400.0, "alias": "", "baseline": False}
    # the baselines first, on the same prompts, then the trained models
    assert list(data["models"]) == ["always-yes", "nearest-train", "base", "sft", "grpo",
                                    "hargo"]
    assert [k for k, v in data["models"].items() if v and v["baseline"]] == list(
        summary.BASELINES)
    ay = data["models"][summary.ALWAYS_YES]
    assert (ay["dr_f1"], ay["dr_mcc"], ay["dr_auc"], ay["dr_yes_share"]) == (0.6875, 0.0, 0.5,
                                                                             1.0)
    assert ay["plp_similarity"] is None and ay["win_rate"] is None
    nn = data["models"][summary.NEAREST_TRAIN]
    assert (nn["dr_f1"], nn["dr_mcc"], nn["dr_auc"], nn["dr_yes_share"]) == (0.9375, 0.875,
                                                                             0.96875, 0.5625)
    assert data["models"]["base"]["win_rate"] == 0.3125
    assert data["models"]["grpo"]["win_rate"] == 0.625
    assert data["models"]["grpo"]["alias"] == "@champion v1, @candidate v1"
    assert data["models"]["hargo"] is None
    st = data["stages"]
    assert list(st) == ["prepare", "validate", "base_model", "sft", "rl@grpo", "rl@hargo",
                        "evaluate", "register"]
    assert [st[s]["status"] for s in st] == ["cached", "cached", "cached", "ran", "ran",
                                             "cached", "ran", "cached"]
    client = MlflowClient(mlflow_uri)
    parent = tracking.parent_run_id(as_config(params), tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("hargo").experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    want = {r.data.tags["hargo.stage"]: (r.info.end_time - r.info.start_time) / 1000 for r in runs}
    assert st["sft"]["seconds"] == pytest.approx(want["sft"])
    assert st["evaluate"]["seconds"] == pytest.approx(want["evaluate"])
    assert data["total_s"] == pytest.approx(sum(want.values()))
    assert data["stages_note"] is None

    out = capsys.readouterr().out
    assert "champion moved to v1 (grpo) from sft" in out
    assert "task-reward" in out and "cached" in out and "rl@grpo" in out
    assert "0.750" in out and "0.625" in out and "0.688" in out
    # every baseline row marked as one, with its MCC, AUC and yes share; the new columns
    assert "DR MCC" in out and "DR AUC" in out and "yes share" in out
    lines = out.splitlines()
    row = lambda name: next(x for x in lines if name in x)  # noqa: E731
    assert [c.strip() for c in row("always-yes (baseline)").split("│")[2:6]] == [
        "0.688", "0.000", "0.500", "1.000"]
    assert [c.strip() for c in row("nearest-train (baseline)").split("│")[2:6]] == [
        "0.938", "0.875", "0.969", "0.562"]
    assert [c.strip() for c in row("base (baseline)").split("│")[2:6]] == [
        "0.250", "-0.062", "0.438", "0.375"]
    assert [c.strip() for c in row("│ grpo").split("│")[2:6]] == ["0.750", "0.500", "0.812",
                                                                  "0.500"]


def test_summary_always_yes_row_from_an_older_eval_json(tmp_path, committed_params, mlflow_uri):
    """eval.json without baseline entries: the always-yes row from SFT's recorded F1 (MCC 0,
    yes share 1, AUC unknown); no nearest-train or base row."""
    from hargo import summary

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps({
        "sft": {"dr_f1": 0.5, "dr_always_yes_f1": 0.6875}, "run": {"judge": "j"}}))
    params = apply_overrides(committed_params, {"rl.methods": ["grpo"]})
    data = summary.collect(as_config(params), root=tmp_path)
    assert list(data["models"]) == ["always-yes", "sft", "grpo"]
    ay = data["models"]["always-yes"]
    assert (ay["dr_f1"], ay["dr_mcc"], ay["dr_auc"], ay["dr_yes_share"], ay["baseline"]) == (
        0.6875, 0.0, None, 1.0, True)


def test_summary_without_a_pipeline_run_or_eval_metrics(tmp_path, committed_params, mlflow_uri):
    from hargo import summary

    with pytest.raises(FileNotFoundError, match="run the pipeline first"):
        summary.run(as_config(committed_params), root=tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps({"run": {"judge": "llm:judge"}}))
    data = summary.collect(as_config(committed_params), root=tmp_path)
    assert all(v["status"] == "cached" for v in data["stages"].values())
    assert "no MLflow experiment" in data["stages_note"]
    assert data["register"] is None and data["judge"] == "llm:judge"


@pytest.mark.parametrize("file, text, match", [
    ("eval.json", "[]", r"eval\.json: expected a JSON object \(one entry per model\), got list \[\]"),
    ("eval.json", "3", r"eval\.json: expected a JSON object .*got int 3"),
    ("eval.json", "{bad", r"eval\.json: not valid JSON"),
    ("eval.json", '{"sft": {"dr_f1": "0.5"}}',
     r"eval\.json, field 'dr_f1': model 'sft': expected a number or null, got '0\.5'"),
    ("eval.json", '{"sft": {"win_rate": true}}', r"field 'win_rate': model 'sft': .*got True"),
    ("register.json", '["v1"]', r"register\.json: expected a JSON object .*got list"),
])
def test_a_metrics_file_of_the_wrong_shape_is_one_error_naming_it(
        tmp_path, committed_params, mlflow_uri, file, text, match):
    """A new user's `echo '[]' > metrics/eval.json; hargo summary` gave AttributeError: the
    shape of eval.json and register.json is checked, each metric a number or null."""
    from hargo import summary
    from hargo.io import HargoInputError

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text('{"sft": {"dr_f1": 0.5}}')
    (tmp_path / "metrics" / file).write_text(text)
    with pytest.raises(HargoInputError, match=match):
        summary.collect(as_config(committed_params), root=tmp_path)


def test_summary_is_as_wide_as_columns_says(tmp_path, committed_params, mlflow_uri, capsys,
                                            monkeypatch):
    """Issue 42, item 9: the table was 140 columns wide whatever COLUMNS said. COLUMNS set:
    that width; unset in a pipe (no terminal to ask): 140, so names are not cut at 80. (One
    store for the three: a new one costs MLflow's migrations.)"""
    from hargo import summary

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps({
        "sft": {"dr_f1": 0.5, "dr_always_yes_f1": 0.6875}, "run": {"judge": "j"}}))
    params = apply_overrides(committed_params, {"rl.methods": ["grpo"]})
    for columns in ("90", "120", None):
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        summary.run(as_config(params), root=tmp_path)
        widest = max(len(line) for line in capsys.readouterr().out.splitlines())
        assert widest == int(columns or 140), columns   # the table needs more: it fills it


def _crafted_summary(n_models: int = 4) -> tuple[dict, list[str]]:
    """A summary's data (collect's shape) whose every metric cell is a different number, and the
    numbers as the table shows them."""
    from hargo import summary

    cols = summary.columns()
    models, shown = {}, []
    for i in range(n_models):
        vals = {k: round(-0.5 + 0.0137 * (i * 20 + j), 4) for j, (k, _) in enumerate(cols)}
        win, tps = round(0.3 + 0.011 * i, 4), 400.0 + 7 * i
        models[f"method{i}"] = {**vals, "win_rate": win, "gen_tokens_per_s": tps,
                                "alias": f"@candidate v{i}", "baseline": i == 0}
        shown += [f"{v:.3f}" for v in vals.values()] + [f"{win:.3f}", f"{tps:.0f}"]
    models["unevaluated"] = None
    return ({"judge": "task-reward", "models": models, "stages": {}, "stages_note": None,
             "total_s": 0.0, "register": None}, shown)


@pytest.mark.parametrize("columns", ["60", "80", "100", "140"])
def test_summary_shows_every_number_whole_at_any_width(columns, capsys, monkeypatch):
    """Issue 42 (new user): at COLUMNS=80 every metric cell read ``0…`` (rich shortened each
    cell to squeeze the wide table in), at 100 ``0.5…``. Now the table is laid out so that each
    cell fits (wide, else metrics as rows, else one block per model): every number appears
    whole, and no line is wider than the console."""
    import re

    from hargo import summary
    from hargo.console import table_console

    monkeypatch.setenv("COLUMNS", columns)
    data, shown = _crafted_summary()
    console = table_console(140)
    for r in summary.render(data, console.width):
        console.print(r)
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    tokens = re.findall(r"-?\d+(?:\.\d+)?", out)
    missing = [n for n in shown if n not in tokens]
    assert not missing, (columns, missing, out)
    words = out.split()   # an alias may wrap at its space, a name never
    for i in range(4):
        assert f"method{i}" in words and f"v{i}" in words
    assert words.count("@candidate") == 4
    assert "unevaluated" in words and "evaluated" in words


@pytest.mark.parametrize("columns", ["0", "", "junk", "-5", " 00 "])
def test_summary_unusable_columns_count_as_unset(columns, capsys, monkeypatch):
    """Issue 42 (new user): ``COLUMNS=0`` printed nothing and exited 0 (rich took it as a
    zero-wide console). A COLUMNS that is not a positive width counts as unset: in a pipe the
    default 140 columns, and the numbers are there."""
    from hargo import summary
    from hargo.console import table_console

    monkeypatch.setenv("COLUMNS", columns)
    console = table_console(140)
    assert console.width == 140
    data, shown = _crafted_summary(2)
    for r in summary.render(data, console.width):
        console.print(r)
    out = capsys.readouterr().out
    assert all(n in out for n in shown), out
    monkeypatch.setenv("COLUMNS", "12")   # a width too narrow for any layout: the narrowest
    assert table_console(140).width == 40
