"""The race baselines of the comparison report: always-yes, nearest-train and (when evaluated) the
untuned base model, beside SFT and every method, in the race metrics a prior cannot fool.

Pure functions of rows already loaded (``hargo.compare.report`` reads the files). The metrics are
those of the ``evaluate`` stage (``hargo.evaluation.evaluate.race_entry``: DR-F1, Matthews
correlation, ROC AUC of the first-token ``yes_no_score``, share of "yes" answers) on the
comparison's own race prompts, and the baselines are built by the same rules
(``hargo.evaluation.evaluate.baseline_entries``).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from hargo.stats import mean_std
from hargo.rewards import RACE_TASKS

__all__ = ["RACE_KEYS", "run_race_metrics", "race_table"]

#: The race columns of the report's baseline table, in order.
RACE_KEYS = ("dr_f1", "dr_mcc", "dr_auc", "dr_yes_share")


def run_race_metrics(rows: Sequence[Mapping], labels: Mapping[str, str]) -> dict:
    """:data:`RACE_KEYS` of one run from its generations rows.

    ``dr_auc`` is None when a race row has no ``yes_no_score`` (generations written before the
    score existed) or only one label occurs; every metric is None without race rows.
    """
    from hargo.evaluation.baselines import race_entry

    race = [r for r in rows if r["task"] in RACE_TASKS]
    scores = [r.get("yes_no_score") for r in race]
    e = race_entry([labels[r["id"]] for r in race], [r["prediction"] for r in race],
                   None if any(s is None for s in scores) else scores)
    return {k: e[k] for k in RACE_KEYS}


def race_table(samples: Sequence[Mapping], rows: Mapping[str, Sequence[Mapping]],
               labels: Mapping[str, str], train: Sequence[Mapping], methods: Sequence[str],
               seeds: Sequence[int], base_rows: Sequence[Mapping] | None = None) -> dict:
    """Every row of the report's race baseline table.

    Args:
        samples: the eval records in the canonical prompt order.
        rows: per run name (``sft``, ``<method>-s<seed>``), its generations rows.
        labels: race label per race id.
        train: the train split's records (race records used by nearest-train).
        methods, seeds: the compared methods and seeds.
        base_rows: the untuned base model's generations rows, or None when not evaluated.

    Returns:
        ``{"baselines": {"always-yes": {key: value}, "nearest-train": {...}[, "base": {...}]},
        "sft": {key: value}, "methods": {method: {key: {"mean", "std", "values"} or None}}}``
        over :data:`RACE_KEYS`; a method's metric is None when a seed lacks it.
    """
    from hargo.compare.layout import run_name
    from hargo.evaluation.baselines import BASE, baseline_entries

    entries, _ = baseline_entries(samples, train)
    base = {name: {k: e[k] for k in RACE_KEYS} for name, e in entries.items()}
    if base_rows is not None:
        base[BASE] = run_race_metrics(base_rows, labels)
    out_methods: dict[str, dict] = {}
    for m in methods:
        per_seed = [run_race_metrics(rows[run_name(m, s)], labels) for s in seeds]
        out_methods[m] = {}
        for k in RACE_KEYS:
            vals = [p[k] for p in per_seed]
            if any(v is None for v in vals):
                out_methods[m][k] = None
                continue
            mu, sd = mean_std(vals)
            out_methods[m][k] = {"mean": mu, "std": sd, "values": [float(v) for v in vals]}
    return {"baselines": base, "sft": run_race_metrics(rows["sft"], labels),
            "methods": out_methods}
