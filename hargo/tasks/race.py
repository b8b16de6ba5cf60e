"""``race_c`` and ``race_fortran``: yes/no data-race detection on C and Fortran kernels
(HPC-GPT's task 2). Reward: 1.0 when the completion's yes/no (``hargo.rewards.race``:
word boundaries; both or neither word is no answer) equals the record's ``label``, else 0.0.
Metrics: the pooled Data Race F1 and its companions (``dr_*`` of ``hargo.metrics``: MCC,
balanced accuracy, the always-yes baseline; the AUC from first-token scores in evaluation) and
the per-language ``dr_f1_<task>``. Correct: the full reward 1.0, not degenerate."""
from __future__ import annotations

from hargo.tasks import Metric, RewardBatch, ScoreBatch, Task, register_task

#: The metrics the race tasks feed together (pooled over both languages), besides
#: ``dr_f1_<task>`` of each.
RACE_METRICS: tuple[str, ...] = (
    "dr_f1", "dr_precision", "dr_recall", "dr_confusion", "dr_unparseable", "dr_accuracy",
    "dr_mcc", "dr_balanced_accuracy", "dr_yes_share", "dr_always_yes_f1",
    "dr_always_yes_accuracy")
#: The pooled race metrics in the headline tables (``hargo.tasks.headline_metrics``): DR-F1
#: everywhere; MCC (0 for any constant answer) in the summary and the DVC headline; the
#: first-token AUC (evaluation's) and the "yes" share in the summary; precision and recall in
#: the gate's metric list.
RACE_HEADLINE: tuple[Metric, ...] = (
    Metric("dr_f1", "DR-F1", "prediction", "f1", percent=True),
    Metric("dr_mcc", "DR MCC", views=("summary", "headline")),
    Metric("dr_auc", "DR AUC", views=("summary",)),
    Metric("dr_yes_share", "yes share", views=("summary",)),
    Metric("dr_precision", "DR precision", "prediction", "precision", percent=True,
           views=("gate",)),
    Metric("dr_recall", "DR recall", "prediction", "recall", percent=True, views=("gate",)))


def _headline(name: str) -> tuple[Metric, ...]:
    """:data:`RACE_HEADLINE` and the task's own F1 (``dr_f1_<name>``, a gate metric)."""
    return RACE_HEADLINE + (Metric(f"dr_f1_{name}", f"DR-F1 {name}", "prediction", "f1",
                                   percent=True, views=("gate",)),)


def race_rewards(batch: RewardBatch) -> list[float]:
    """``hargo.rewards.race.race_reward`` of each completion against its label.

    Raises:
        ValueError: a label other than yes/no."""
    from hargo.rewards.race import race_reward

    return [race_reward(text, label) for text, label in zip(batch.texts, batch.labels)]


def race_scores(batch: ScoreBatch) -> list[dict]:
    """Per completion ``label`` (canonical "yes"/"no") and ``prediction`` ("yes"/"no"/None;
    None for a degenerate completion or one naming both or neither word)."""
    from hargo.rewards.race import canonical_label, extract_yes_no

    return [{"label": canonical_label(s["label"]),
             "prediction": None if deg else extract_yes_no(text)}
            for s, text, deg in zip(batch.samples, batch.texts, batch.degenerate)]


def _summarize(name: str):
    def summarize(rows: list[dict]) -> dict:
        """``dr_f1_<task>``: the F1 of this language's rows alone (``hargo.metrics.
        race_classification``; None without rows). The pooled ``dr_*`` metrics of every yes/no
        task are ``hargo.metrics.compute_metrics``'s."""
        from hargo.metrics import race_classification

        return {f"dr_f1_{name}": race_classification([r["label"] for r in rows],
                                                     [r["prediction"] for r in rows])["f1"]}
    return summarize


RACE_C = register_task(Task(
    name="race_c", description="data race yes/no, C kernels", kind="yes_no",
    reward=race_rewards, score=race_scores, metrics=RACE_METRICS + ("dr_f1_race_c",),
    headline=_headline("race_c"),
    labelled=True, raw_file="task2_c_c++.json", rank=10,
    summarize=_summarize("race_c")))
RACE_FORTRAN = register_task(Task(
    name="race_fortran", description="data race yes/no, Fortran kernels", kind="yes_no",
    reward=race_rewards, score=race_scores, metrics=RACE_METRICS + ("dr_f1_race_fortran",),
    headline=_headline("race_fortran"),
    labelled=True, raw_file="task2_fortran.json", rank=20,
    summarize=_summarize("race_fortran")))
