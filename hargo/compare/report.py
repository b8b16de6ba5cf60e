"""Stage ``report``: the nine-method comparison as a report.

``run(params, root)`` reads, for every method ``m`` in ``compare.methods`` and seed ``s`` in
``compare.seeds`` (run ``<m>-s<s>``), and for the SFT model (run ``sft``, evaluated once):

- ``data/compare/eval/<run>/generations.jsonl`` (``hargo.metrics.score_samples`` rows: ``id``,
  ``task``, ``completion``, ``reward``, ``correct``, ``chars`` and ``prediction`` / ``em`` /
  ``similarity``) and ``data/compare/eval/<run>/metrics.json`` (stage ``compare_eval``);
- ``metrics/compare/train/<run>.json`` (``prompts_seen``, ``steps``, ``wall_s``, ``history``:
  StepRecorder rows, ``[]`` for offline methods; stage ``compare_train``);
- ``<compare.preferences.out_dir>/stats.json`` when a preference method (dpo, kto, simpo) is
  compared (stage ``preferences``);
- ``<data.out_dir>/eval.jsonl``: the race labels and references of the eval ids, and
  ``<data.out_dir>/train.jsonl``: the race kernels of the nearest-train baseline (stage
  ``prepare``);
- optionally ``data/compare/eval/base/generations.jsonl`` (stage ``compare_base``, the untuned
  base model on the same prompts): a baseline row when present.

Every metric is recomputed from the per-prompt rows (``hargo.compare.aggregate``) and checked
against the run's ``metrics.json``: a disagreement means the two files come from different
evaluations and is an error. No reward is recomputed (the PLP embedder is not loaded): WinRate
vs SFT uses the judge of ``evaluate`` (``hargo.judges.make_judge``) through
``hargo.metrics.win_rate`` on the same prompt ids, and the ``reward`` judge reads the task rewards
stored in the generations (``hargo.compare.aggregate.StoredRewards``).

Outputs (each whole or not at all; ``hargo.io``), rendered by ``hargo.compare.render``:

- ``reports/comparison.md`` (readable in a terminal) and ``reports/comparison.html``
  (self-contained: the images are embedded as base64 PNG);
- ``reports/comparison/*.png``: ``confusion.png`` (pooled race confusion matrix per model,
  summed over seeds), ``reward_curves.png``, ``weight_curves.png`` and ``update_mass_share.png``
  (cumulative share of the update mass; one panel per task, a line
  per online RL method, mean over seeds), ``answer_lengths.png`` (completion characters per task,
  SFT and each method, seeds pooled);
- ``metrics/compare/summary.json`` (a plain output) and ``metrics/compare/headline.json`` (the
  DVC metrics, ``{"compare": {model: {metric: value}}}``: SFT and each method's mean over seeds
  of :func:`hargo.metrics.headline_metrics`);
- an MLflow run tagged ``hargo.kind=comparison`` with the summary metrics and all of the above as
  artifacts.

Contents: the paper-style table as mean +- std over seeds (sample std, ddof=1; SFT one row), the
paper's own figures beside ours (method.md), 95% paired-bootstrap CIs of HARGO minus each other
method (headline: HARGO - GRPO; ``hargo.stats``), the race baselines (always-yes,
nearest-train, base when evaluated) beside SFT and each method in DR-F1, MCC, AUC and the "yes"
share (``hargo.compare.baselines``), the confusion matrices, training
curves, answer lengths, the judge, budget, seeds, data version and git commit.

This module does the input and output: :func:`load_inputs` (read and check), :func:`write_outputs`
(files) and :func:`log_to_mlflow`; :func:`run` chains them with the aggregation and rendering.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from hargo.compare import render
from hargo.config import Config, as_section
from hargo.compare.aggregate import (SFT, Aggregates, RecordingJudge, StoredRewards, aggregate,
                                     bootstrap_cis, run_metrics, run_name, sft_cis)
from hargo.compare.baselines import race_table
from hargo.compare.layout import BASE_RUN, EVAL_ROOT, TRAIN_METRICS_ROOT
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_text, read_jsonl
from hargo.methods import method_names
from hargo.tasks import get_task, headline_metrics

__all__ = ["EVAL_ROOT", "TRAIN_METRICS_ROOT", "REPORT_MD", "REPORT_HTML", "FIGURES_DIR",
           "SUMMARY_FILE", "HEADLINE_FILE", "Inputs", "load_inputs", "Outputs", "write_outputs", "flat_metrics",
           "log_to_mlflow", "run"]

REPORT_MD = Path("reports") / "comparison.md"
REPORT_HTML = Path("reports") / "comparison.html"
FIGURES_DIR = Path("reports") / "comparison"
SUMMARY_FILE = Path("metrics") / "compare" / "summary.json"
#: the comparison's DVC metrics: SFT's and each method's mean over seeds of the headline metrics
HEADLINE_FILE = Path("metrics") / "compare" / "headline.json"



def _checked() -> list[str]:
    """Metrics of a run's metrics.json checked against the ones recomputed from its
    generations: the tasks' metrics of the ``report`` view (built-ins: ``dr_f1``,
    ``plp_similarity``, ``mlperf_em``) and ``avg_score``."""
    return [m.key for m in headline_metrics("report")] + ["avg_score"]


def _task_fields(task: str) -> dict[str, str]:
    """The per-prompt fields a generations row of ``task`` must hold, field -> statistic (of
    the task's :attr:`hargo.tasks.Task.headline` metrics computed from rows: race
    ``prediction``, mlperf ``em``, plp ``similarity``)."""
    return {m.field: m.statistic for m in get_task(task).headline if m.field is not None}


def _field_ok(value, statistic: str) -> bool:
    """A yes/no prediction ("yes", "no" or None) for an F1-family statistic, else a number (a
    bool counts: ``em``)."""
    if statistic != "mean":
        return value in ("yes", "no", None)
    return isinstance(value, (int, float))


# ----------------------------------------------------------------------------- inputs

def _missing(path: Path, stage: str) -> FileNotFoundError:
    return FileNotFoundError(f"{path}: missing; it is written by the {stage} stage "
                             "(run the comparison first: `dvc repro compare/dvc.yaml`, or "
                             "scripts/compare.sh)")


# ----------------------------------------------------------------------------- inputs

def _read_json(path: Path, stage: str) -> dict:
    if not path.exists():
        raise _missing(path, stage)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HargoInputError(path, f"not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise HargoInputError(path, f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _load_eval_records(path: Path) -> dict[str, dict]:
    if not path.exists():
        raise _missing(path, "prepare")
    out = {}
    for i, r in enumerate(read_jsonl(path)):
        if not isinstance(r.get("id"), str):
            raise HargoInputError(path, "missing or non-string id", record=i, field="id")
        out[r["id"]] = r
    return out


def _race_labels(records: Mapping[str, dict], path: Path) -> dict[str, str]:
    from hargo.rewards.race import canonical_label
    from hargo.vocab import RACE_TASKS as race

    out = {}
    for i, r in records.items():
        if r.get("task") in race:
            try:
                out[i] = canonical_label(r.get("label"))
            except ValueError as e:
                raise HargoInputError(path, f"record id {i!r}: {e}", field="label") from None
    return out


def _load_generations(path: Path, records: Mapping[str, dict]) -> dict[str, dict]:
    """Rows of one run keyed by id, each field checked (names file, record and field)."""
    if not path.exists():
        raise _missing(path, "compare_eval")
    out: dict[str, dict] = {}
    for i, r in enumerate(read_jsonl(path)):
        rid = r.get("id")
        if rid not in records:
            raise HargoInputError(path, f"id {rid!r} is not in the eval split", record=i,
                                  field="id")
        if rid in out:
            raise HargoInputError(path, f"id {rid!r} appears twice", record=i, field="id")
        task = r.get("task")
        if task != records[rid].get("task"):
            raise HargoInputError(path, f"task {task!r} but the eval split says "
                                  f"{records[rid].get('task')!r}", record=i, field="task")
        for f, kinds in (("reward", (int, float)), ("correct", (bool,)), ("chars", (int,)),
                         ("completion", (str,))):
            if not isinstance(r.get(f), kinds) or (f == "reward" and isinstance(r[f], bool)):
                raise HargoInputError(path, f"expected {'/'.join(k.__name__ for k in kinds)}, "
                                      f"got {r.get(f)!r:.60}", record=i, field=f)
        for f, stat in _task_fields(task).items():
            v = r.get(f)
            if f not in r or not _field_ok(v, stat):
                raise HargoInputError(path, f"bad or missing value {v!r:.60} for a {task} row",
                                      record=i, field=f)
        out[rid] = r
    if not out:
        raise HargoInputError(path, "no generations")
    return out


@dataclass
class Inputs:
    """The comparison's inputs, read and checked.

    Attributes:
        samples: the eval records of the SFT run's prompt ids, in its order (the canonical
            prompt order).
        labels: race label ("yes"/"no") per race id.
        rows: per run name (``sft`` first, then ``<method>-s<seed>`` by method, then seed),
            its generations rows in the order of ``samples``.
        train: per method and seed, the run's training metrics.
        pref_stats: the preference pairs' stats, or None when no preference method is compared.
        train_records: the train split's records (the nearest-train baseline's pool).
        base_rows: the untuned base model's rows in the order of ``samples``, or None when it
            was not evaluated.
    """

    samples: list[dict]
    labels: dict[str, str]
    rows: dict[str, list[dict]]
    train: dict[str, dict[int, dict]]
    pref_stats: dict | None
    train_records: list[dict] = field(default_factory=list)
    base_rows: list[dict] | None = None


def _check_stored_metrics(path: Path, stored: Mapping, rows: Sequence[Mapping],
                          labels: Mapping[str, str]) -> None:
    m = run_metrics(rows, labels)
    for k in _checked():
        if stored.get(k) is not None and (m[k] is None or abs(stored[k] - m[k]) > 1e-6):
            raise HargoInputError(path, f"{stored[k]!r} disagrees with {m[k]!r} recomputed from "
                                  f"generations.jsonl (files of different evaluations?): re-run "
                                  f"compare_eval", field=k)


def load_inputs(params: Config, root: Path, methods: Sequence[str],
                seeds: Sequence[int]) -> Inputs:
    """Read every input of the report (module docstring; ``params``: the typed config) and
    check it before anything is written: each generations row's fields, every run answering the SFT run's prompt ids, each
    ``metrics.json`` agreeing with its generations, each training history a list.

    Raises:
        FileNotFoundError, HargoInputError: as :func:`run`.
    """
    cfg = params
    eval_path = root / cfg.data.out_dir / "eval.jsonl"
    records = _load_eval_records(eval_path)
    labels = _race_labels(records, eval_path)
    by_id: dict[str, dict[str, dict]] = {}
    for name in [SFT] + [run_name(m, s) for m in methods for s in seeds]:
        d = root / EVAL_ROOT / name
        by_id[name] = _load_generations(d / "generations.jsonl", records)
        stored = _read_json(d / "metrics.json", "compare_eval")
        if name != SFT and set(by_id[name]) != set(by_id[SFT]):
            diff = sorted(set(by_id[name]) ^ set(by_id[SFT]))
            raise HargoInputError(d / "generations.jsonl", f"prompt ids differ from the SFT run's "
                                  f"({len(diff)} ids, e.g. {diff[:3]}); every model must answer "
                                  f"the same prompts: re-run compare_eval", field="id")
        _check_stored_metrics(d / "metrics.json", stored, [by_id[name][i] for i in by_id[SFT]],
                              labels)
    ids = list(by_id[SFT])  # the canonical prompt order
    base_rows = None
    base_gen = root / EVAL_ROOT / BASE_RUN / "generations.jsonl"
    if base_gen.exists():
        base = _load_generations(base_gen, records)
        if set(base) != set(ids):
            raise HargoInputError(base_gen, "prompt ids differ from the SFT run's: re-run "
                                  "compare_base", field="id")
        base_rows = [base[i] for i in ids]
    train_path = root / cfg.data.out_dir / "train.jsonl"
    if not train_path.exists():
        raise _missing(train_path, "prepare")
    train_records = list(read_jsonl(train_path))
    train: dict[str, dict[int, dict]] = {m: {} for m in methods}
    for m in methods:
        for s in seeds:
            p = root / TRAIN_METRICS_ROOT / f"{run_name(m, s)}.json"
            doc = _read_json(p, "compare_train")
            if not isinstance(doc.get("history", []), list):
                raise HargoInputError(p, "expected a list", field="history")
            train[m][s] = doc
    pref_stats = None
    if any(m in method_names("preference") for m in methods):
        pref_stats = _read_json(root / cfg.compare.preferences.out_dir / "stats.json",
                                "preferences")
    return Inputs(samples=[records[i] for i in ids], labels=labels,
                  rows={name: [rs[i] for i in ids] for name, rs in by_id.items()}, train=train,
                  pref_stats=pref_stats, train_records=train_records, base_rows=base_rows)


def _judge(cfg: Config, inputs: Inputs) -> RecordingJudge:
    """The WinRate judge of ``evaluate`` (``judge``, ``judge_endpoint``, ``judge_model``), its
    task rewards read from the generations (a completion without a stored reward is scored by a
    ``TaskReward``)."""
    from hargo.judges import make_judge
    from hargo.rewards import RewardConfig, TaskReward

    stored = StoredRewards(lambda: TaskReward(RewardConfig.from_params(cfg.rewards)))
    for rows in inputs.rows.values():
        for sample, row in zip(inputs.samples, rows):
            stored.add(sample, row)
    return RecordingJudge(make_judge(cfg.evaluate, stored))


# ----------------------------------------------------------------------------- outputs

@dataclass
class Outputs:
    """Paths of the written report: ``md``, ``html``, ``summary`` and the ``figures``."""

    md: Path
    html: Path
    summary: Path
    figures: list[Path]


def write_outputs(root: Path, blocks: list, summary: Mapping, agg: Aggregates) -> Outputs:
    """Write the figures, the markdown and HTML report of ``blocks`` and the summary JSON under
    ``root`` (module docstring), each whole or not at all."""
    fig_dir = root / FIGURES_DIR
    images: dict[str, bytes] = {}
    with atomic_dir(fig_dir) as tmp:
        render.write_figures(tmp, agg)
        for p in sorted(tmp.glob("*.png")):
            images[p.name] = p.read_bytes()
    md = atomic_write_text(root / REPORT_MD, render.render_md(blocks, FIGURES_DIR.name))
    html = atomic_write_text(root / REPORT_HTML,
                             render.render_html(blocks, images, "hargo method comparison"))
    summary_path = atomic_write_json(root / SUMMARY_FILE, summary)
    from hargo.metrics import headline

    # under "compare": the column names differ from the main pipeline's (sft.dr_f1), so DVC
    # shows them without a file prefix and `dvc exp show --keep` matches them by name
    atomic_write_json(root / HEADLINE_FILE, {"compare": headline(
        {SFT: summary.get(SFT) or {}, **(summary.get("results") or {})})})
    return Outputs(md=md, html=html, summary=summary_path,
                   figures=[fig_dir / n for n in sorted(images)])


def flat_metrics(agg: Aggregates, ci: Mapping[str, Mapping]) -> dict[str, float]:
    """The MLflow metrics: ``sft/<metric>``, ``<method>/<metric>_mean`` / ``_std`` and
    ``ci/<a>-<b>/<metric>_{diff,low,high}`` (``hargo-<other>`` and ``<method>-sft``);
    non-finite values left out."""
    flat: dict[str, float] = {}
    for k, v in agg.per_run[SFT].items():
        if isinstance(v, (int, float)) and v is not None:
            flat[f"sft/{k}"] = float(v)
    for m, ks in agg.results.items():
        for k, v in ks.items():
            if v is not None:
                flat[f"{m}/{k}_mean"], flat[f"{m}/{k}_std"] = v["mean"], v["std"]
    for pair, cs in ci.items():
        for k, c in cs.items():
            for f in ("diff", "low", "high"):
                flat[f"ci/{pair}/{k}_{f}"] = c[f]
    return {k: v for k, v in flat.items() if math.isfinite(v)}


def log_to_mlflow(params: Config, root: Path, setup: render.Setup, agg: Aggregates,
                  ci: Mapping[str, Mapping], out: Outputs) -> str:
    """Log the comparison as an MLflow run tagged ``hargo.kind=comparison``: the
    :func:`flat_metrics`, the comparison's params (``params``: the typed config) and the written
    files as artifacts.

    Returns:
        The MLflow run id.
    """
    import mlflow

    from hargo import tracking

    cfg = params
    exp_id = tracking.setup(cfg, root)
    tags = {**tracking.common_tags(cfg, root), "hargo.kind": "comparison",
            "hargo.judge": setup.judge, "hargo.seeds": ",".join(map(str, setup.seeds)),
            "hargo.methods": ",".join(setup.methods)}
    with mlflow.start_run(experiment_id=exp_id, run_name="comparison", tags=tags) as mlrun:
        mlflow.log_metrics(flat_metrics(agg, ci))
        mlflow.log_params({"compare.methods": ",".join(setup.methods),
                           "compare.seeds": ",".join(map(str, setup.seeds)),
                           "compare.steps": cfg.compare.steps,
                           "compare.prompts_per_step": cfg.compare.prompts_per_step,
                           "bootstrap_resamples": setup.resamples,
                           "confidence": setup.confidence})
        for p in (out.md, out.html, out.summary):
            mlflow.log_artifact(str(p), artifact_path="comparison")
        for p in out.figures:
            mlflow.log_artifact(str(p), artifact_path="comparison/figures")
        return mlrun.info.run_id


# ----------------------------------------------------------------------------- stage

def _setup(cfg: Config, root: Path, methods: list[str], seeds: list[int],
           judge: str) -> render.Setup:
    """What the comparison ran with, from the typed config and the repository at ``root``."""
    from hargo import tracking

    cmp = cfg.compare
    return render.Setup(
        model=str(cfg.model.source), methods=methods, seeds=seeds,
        judge=judge, steps=int(cmp.steps), prompts_per_step=int(cmp.prompts_per_step),
        num_generations=int(cfg.rl.num_generations),
        sft_samples_per_task=cfg.sft.samples_per_task, sft_epochs=cfg.sft.epochs,
        resamples=int(cmp.report.bootstrap_resamples),
        confidence=float(cmp.report.confidence), bootstrap_seed=int(cfg.seed),
        data_version=tracking.data_version(root), git_commit=tracking.git_commit(root))


def run(params: Config, root: str | Path = ".") -> dict:
    """Run the ``report`` stage (see the module docstring).

    Args:
        params: the typed config (``seed``, ``data.out_dir``, ``evaluate`` (judge),
            ``rewards``, ``rl.num_generations``, ``sft``, ``model.source``, ``mlflow``,
            ``compare``: ``methods``, ``seeds``, ``steps``, ``prompts_per_step``,
            ``preferences.out_dir``, ``report.bootstrap_resamples``, ``report.confidence``).
        root: the repository root that relative paths start from.

    Returns:
        ``{"report": md path, "html": html path, "summary": summary path, "figures": [png
        paths], "methods", "seeds", "judge", "ci": {"hargo-<other>": {metric: {diff, low,
        high}}}, "sft_ci": {"<method>-sft": {metric: {diff, low, high}}}, "run_id": MLflow run
        id}``.

    Raises:
        ParamsError: bad params (by the key's dotted name), or no ``compare`` section.
        FileNotFoundError: an input is missing (the message names it and the stage that writes
            it: compare_train, compare_eval, preferences or prepare; train.jsonl included).
        HargoInputError: a bad input record, a run whose prompt ids differ from SFT's, or a
            ``metrics.json`` that disagrees with its ``generations.jsonl``.
        RuntimeError: the MLflow store cannot be used.
    """
    cfg = params
    as_section(cfg, "compare", required=True)
    root = Path(root)
    methods = list(cfg.compare.methods)
    seeds = [int(s) for s in cfg.compare.seeds]
    inputs = load_inputs(cfg, root, methods, seeds)
    judge = _judge(cfg, inputs)
    agg = aggregate(inputs.samples, inputs.rows, inputs.labels, inputs.train, methods, seeds,
                    judge)
    setup = _setup(cfg, root, methods, seeds, judge.name)
    ci, notes = bootstrap_cis(agg.per_prompt, methods, seeds, setup.resamples, setup.confidence,
                              setup.bootstrap_seed)
    sft_ci = sft_cis(agg.per_prompt, methods, seeds, setup.resamples, setup.confidence,
                     setup.bootstrap_seed)
    race = race_table(inputs.samples, inputs.rows, inputs.labels, inputs.train_records, methods,
                      seeds, inputs.base_rows)
    blocks = render.document(setup, inputs.samples, agg, ci, notes, inputs.train,
                             inputs.pref_stats, race=race, sft_ci=sft_ci)
    summary = render.summary(setup, inputs.samples, agg, ci, notes, inputs.train,
                             inputs.pref_stats, race=race, sft_ci=sft_ci)
    out = write_outputs(root, blocks, summary, agg)
    run_id = log_to_mlflow(cfg, root, setup, agg, {**ci, **sft_ci}, out)
    return {"report": str(out.md), "html": str(out.html), "summary": str(out.summary),
            "figures": [str(p) for p in out.figures], "methods": methods, "seeds": seeds,
            "judge": judge.name,
            "ci": {pair: {k: {f: c[f] for f in ("diff", "low", "high")} for k, c in cs.items()}
                   for pair, cs in ci.items()},
            "sft_ci": {pair: {k: {f: c[f] for f in ("diff", "low", "high")}
                              for k, c in cs.items()} for pair, cs in sft_ci.items()},
            "run_id": run_id}
