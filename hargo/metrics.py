"""Evaluation metrics (method.md "Metrics on the eval split"): one function, ``compute_metrics``,
turns (samples, completions) into the metrics dict that evaluation, MLflow and the report use.

Definitions:

- **Data Race F1** (``dr_f1``, ``dr_precision``, ``dr_recall``, ``dr_confusion``): pooled over
  race_c and race_fortran, positive class ``"yes"``, prediction = ``extract_yes_no`` (word
  boundaries; hargo.rewards.race). An unparseable answer (both or neither word) is a wrong
  prediction: it enters the confusion matrix as the opposite of the label (a missed "yes" is a
  false negative, an unparseable answer to a "no" sample a false positive). Per-language
  ``dr_f1_race_c`` / ``dr_f1_race_fortran``. scikit-learn computes all of them
  (``zero_division=0``). ``dr_confusion`` is ``{"tp", "fp", "fn", "tn", "labels": ["yes", "no"],
  "matrix": [[tp, fn], [fp, tn]]}`` (rows: true label, columns: prediction, sklearn's layout).
- **MLPerf EM** (``mlperf_em``): fraction of mlperf samples whose normalised reference
  (casefolded, whitespace collapsed, outer quotes and trailing punctuation stripped) occurs in the
  normalised completion as a whole phrase by the reward's token-boundary rule
  (``hargo.rewards.mlperf.reference_occurs``; module docstring of ``hargo.rewards.mlperf``): an edge
  of the reference that is a number must not touch a word character, a decimal point, or a
  hyphen/comma joining it to a longer id or number (``"2"`` is not in ``"2.00GHz"``, ``"0"`` not
  in ``"3.0-2018"``, ``"3.0"`` not in ``"v3.0"``; ``"2"`` is in ``"2 GPUs"``), any other edge no
  word character; and which offer no other candidate answer
  (``hargo.rewards.mlperf.mlperf_em``: the reward's hedging rule, the question's own values
  excused): ``"0 1 2 4 8 16 32 64 128"`` is not an exact match of ``"8"``.
- **PLP Similarity** (``plp_similarity``): mean MiniLM cosine of completion and reference (no
  bonus or penalty).
- **AvgScore** (``avg_score``): mean task reward over all samples.
- ``accuracy_<task>``: fraction correct by the task's one rule (``hargo.tasks.Task.correct``,
  the rule training's accuracy uses too): not degenerate and the task reward >= the task's
  threshold -- race and mlperf the full reward 1.0 (race: the extracted answer equals the label;
  mlperf: exact, numeric or all-values match, not hedged); plp a reward (cosine plus format bonus
  minus length penalty) >= 0.5 (``plp_correct_threshold``).
- ``n_<task>``, ``mean_completion_chars_<task>``, ``median_completion_chars_<task>``.

Every metric reads a completion as the rewards do (``hargo.rewards.text``: NFKC, format
characters removed), and a *degenerate* completion (``TaskReward.degenerate``: past its task's
``rewards.answer.max_chars`` or made of one repeated unit) counts as no answer: no race
prediction (a wrong one in the confusion matrix), no MLPerf exact match, never correct;
``degenerate_share_<task>`` reports how many there were. ``"yes " * 250000`` is not a "yes".

A metric whose tasks are absent from the samples is ``None``.

Which fields a task's samples get and which metrics it feeds is the task's own
(``hargo.tasks``: ``Task.score``, ``Task.summarize``, ``Task.correct``); the pooled race
metrics are computed over every yes/no task. A sample of an unregistered task is an error that
names the task and the sample, never scored as PLP.
"""
from __future__ import annotations

import statistics
from typing import Mapping

from hargo.rewards import TaskReward, check_task, completion_text
from hargo.rewards.race import canonical_label
from hargo.tasks import ScoreBatch, get_task, tasks
from hargo.tasks import mean as _mean
from hargo.tasks.plp import PLP_CORRECT_THRESHOLD

__all__ = ["score_samples", "compute_metrics", "race_classification", "race_auc", "win_rate",
           "PLP_CORRECT_THRESHOLD", "headline_metrics", "headline"]


def headline_metrics() -> tuple[str, ...]:
    """The DVC metrics of each pipeline (``metrics/headline.json``,
    ``metrics/compare/headline.json``): the registered tasks' metrics of the ``headline`` view
    (:func:`hargo.tasks.headline_metrics`; the built-ins: the paper's three task metrics and the
    race metric that chance cannot fool, ``dr_f1``, ``dr_mcc``, ``plp_similarity``,
    ``mlperf_em``), then their average ``avg_score`` and the judged ``win_rate``, so ``dvc
    metrics show`` / ``dvc exp show`` stay readable; every other number stays in the stage's
    full JSON (a plain DVC output). Read from the registry when called."""
    from hargo.tasks import headline_metrics as task_metrics

    return tuple(m.key for m in task_metrics("headline")) + ("avg_score", "win_rate")


def headline(entries: Mapping) -> dict:
    """``{name: {metric: value}}`` keeping, of each entry, the :func:`headline_metrics` it has,
    in that order; a value that is a ``{"mean": ...}`` aggregate is replaced by its mean.
    Entries that are not mappings (e.g. a list of seeds) are left out."""
    keys = headline_metrics()
    out = {}
    for name, entry in entries.items():
        if not isinstance(entry, Mapping):
            continue
        row = {}
        for k in keys:
            v = entry.get(k)
            if isinstance(v, Mapping):
                v = v.get("mean")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                row[k] = v
        out[name] = row
    return out

_LABELS = ["yes", "no"]


def _check(samples: list[dict], completions: list, what: str = "completions") -> None:
    if len(samples) != len(completions):
        raise ValueError(f"{len(samples)} samples but {len(completions)} {what}")
    for i, s in enumerate(samples):
        sid = s.get("id", f"#{i}") if isinstance(s, dict) else f"#{i}"
        if not isinstance(s, dict):
            raise ValueError(f"sample {sid}: not a dict")
        check_task(s.get("task"), f"sample id {sid!r}")
        if get_task(s["task"]).labelled:
            try:
                canonical_label(s.get("label"))
            except ValueError as e:
                raise ValueError(f"sample id {sid!r}, field 'label': {e}") from None
        elif not isinstance(s.get("answer"), str):
            raise ValueError(f"sample id {sid!r}, field 'answer': expected a string, "
                             f"got {s.get('answer')!r}")


def score_samples(samples: list[dict], completions: list, reward_fn: TaskReward | None = None,
                  rewards: list[float] | None = None,
                  plp_correct_threshold: float = PLP_CORRECT_THRESHOLD) -> list[dict]:
    """Per-sample scores.

    Args:
        samples: prepared records (``id``, ``task``, ``answer``, ``label``, ...).
        completions: one completion per sample (string or conversational list).
        reward_fn: the ``TaskReward`` (default ``TaskReward()``); also provides the PLP cosine.
        rewards: precomputed rewards (skips the reward call).
        plp_correct_threshold: the reward from which a plp answer counts as correct (the plp
            task's ``correct_threshold``, 0.5).

    Returns:
        One dict per sample: ``id``, ``task``, ``completion``, ``reward``, ``correct`` (bool,
        ``Task.correct``), ``chars``, ``degenerate`` (``TaskReward.degenerate``:
        ``"over_budget"``, ``"repetitive"`` or None; a degenerate completion is never correct,
        predicts nothing on race and is no exact match on mlperf) and the task's own fields
        (``Task.score``): ``label`` (the canonical "yes"/"no") and ``prediction``
        ("yes"/"no"/None; race), ``em`` (bool; mlperf) or ``similarity`` (float; plp).

    Raises:
        ValueError: length mismatch, or a record with an unknown task / missing field (names the
            record id and the task or field).
    """
    _check(samples, completions)
    reward_fn = reward_fn or TaskReward()
    texts = [completion_text(c) for c in completions]
    if rewards is None:
        rewards = reward_fn(prompts=[s.get("prompt") for s in samples],
                            completions=texts, task=[s["task"] for s in samples],
                            answer=[s.get("answer") for s in samples],
                            label=[s.get("label") for s in samples])
    elif len(rewards) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(rewards)} rewards")
    degs = [reward_fn.degenerate(text, s["task"]) for s, text in zip(samples, texts)]
    fields: list[dict] = [{} for _ in samples]
    by_task: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_task.setdefault(s["task"], []).append(i)
    for t, idx in by_task.items():
        got = get_task(t).score(ScoreBatch(
            samples=[samples[i] for i in idx], texts=[texts[i] for i in idx],
            rewards=[float(rewards[i]) for i in idx], degenerate=[degs[i] for i in idx],
            reward_fn=reward_fn))
        for i, f in zip(idx, got):
            fields[i] = f
    out = []
    for i, (s, text) in enumerate(zip(samples, texts)):
        task = get_task(s["task"])
        rec = {"id": s.get("id"), "task": s["task"], "completion": text,
               "reward": float(rewards[i]), "chars": len(text), "degenerate": degs[i],
               **fields[i]}
        rec["correct"] = task.correct(rec["reward"], degs[i], plp_correct_threshold
                                      if task.name == "plp" else None)
        out.append(rec)
    return out


def race_classification(labels: list[str], predictions: list[str | None]) -> dict:
    """Binary classification metrics with "yes" positive (scikit-learn).

    Args:
        labels: true labels, "yes"/"no".
        predictions: extracted answers; None (unparseable) is replaced by the opposite label.

    Returns:
        ``{"f1", "precision", "recall", "accuracy", "mcc", "balanced_accuracy", "yes_share",
        "confusion": {...}, "always_yes": {"f1", "accuracy", "mcc", "balanced_accuracy"}}``,
        or all None for empty input. ``mcc`` (Matthews correlation) and ``balanced_accuracy``
        cannot be fooled by a prior: answering "yes" to everything scores MCC 0 and balanced
        accuracy 0.5 whatever the label balance, while its F1 is ``2p / (1 + p)`` for a share
        ``p`` of "yes" labels (0.67 at p = 0.5). ``yes_share`` is the share of "yes" predictions;
        ``always_yes`` are the scores of that trivial baseline on the same labels.
    """
    if not labels:
        return {k: None for k in ("f1", "precision", "recall", "accuracy", "mcc",
                                  "balanced_accuracy", "yes_share", "confusion", "always_yes")}
    from sklearn.metrics import (accuracy_score, balanced_accuracy_score, confusion_matrix,
                                 f1_score, matthews_corrcoef, precision_score, recall_score)

    y_true = [canonical_label(x) for x in labels]
    y_pred = [p if p is not None else ("no" if t == "yes" else "yes")
              for t, p in zip(y_true, predictions)]
    kw = dict(labels=_LABELS, pos_label="yes", average="binary", zero_division=0)
    cm = confusion_matrix(y_true, y_pred, labels=_LABELS)
    (tp, fn), (fp, tn) = cm.tolist()
    yes = ["yes"] * len(y_true)

    def scores(pred):
        return {"f1": float(f1_score(y_true, pred, **kw)),
                "accuracy": float(accuracy_score(y_true, pred)),
                "mcc": float(matthews_corrcoef(y_true, pred)),
                "balanced_accuracy": _balanced(y_true, pred, balanced_accuracy_score)}

    return {**scores(y_pred),
            "precision": float(precision_score(y_true, y_pred, **kw)),
            "recall": float(recall_score(y_true, y_pred, **kw)),
            "yes_share": sum(p == "yes" for p in y_pred) / len(y_pred),
            "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "labels": list(_LABELS),
                          "matrix": cm.tolist()},
            "always_yes": scores(yes)}


def race_auc(labels: list[str], scores: list[float]) -> float | None:
    """Threshold-free ROC AUC of race scores, "yes" the positive class (scikit-learn
    ``roc_auc_score``).

    The AUC is the probability that a random "yes" prompt scores above a random "no" prompt,
    ties counting half: 0.5 for a constant score (the always-yes baseline), 1.0 for a perfect
    ranking, whatever the label balance or the threshold a greedy answer applies.

    Args:
        labels: true labels, "yes"/"no" (case and surrounding whitespace ignored).
        scores: one finite score per label, higher meaning "more likely yes" (e.g. the
            first-token ``log P(yes) - log P(no)`` of ``hargo.evaluation.scoring``).

    Returns:
        The AUC in [0, 1], or None when it is undefined: no labels, or a single class present
        (not 0.5, which would read as "chance").

    Raises:
        ValueError: lengths differ, a label is not yes/no, or a score is None or not finite.
    """
    import math

    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    y = [canonical_label(x) == "yes" for x in labels]
    bad = [i for i, v in enumerate(scores)
           if v is None or isinstance(v, bool) or not math.isfinite(float(v))]
    if bad:
        raise ValueError(f"race_auc: score #{bad[0]} is {scores[bad[0]]!r}, not a finite number")
    if len(set(y)) < 2:
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, [float(v) for v in scores]))


def _balanced(y_true, y_pred, fn) -> float:
    """Balanced accuracy; with one class present, sklearn warns and scores the recall of that
    class (the mean over the classes present), which is what we want."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(y_true, y_pred))


def compute_metrics(samples: list[dict], completions: list, rewards: list[float] | None = None,
                    reward_fn: TaskReward | None = None,
                    plp_correct_threshold: float = PLP_CORRECT_THRESHOLD) -> dict:
    """The full metrics dict of one model's completions on ``samples``.

    Args:
        samples, completions: aligned lists (see ``score_samples``).
        rewards: precomputed task rewards, or None to compute them with ``reward_fn``.
        reward_fn: a ``TaskReward`` (default ``TaskReward()``); its scorer gives the PLP cosine.
        plp_correct_threshold: see ``score_samples``.

    Returns:
        ``n``, ``avg_score``, ``dr_f1``, ``dr_precision``, ``dr_recall``, ``dr_confusion``,
        ``dr_unparseable``, ``dr_accuracy``, ``dr_mcc``, ``dr_balanced_accuracy``,
        ``dr_yes_share``, ``dr_always_yes_f1``, ``dr_always_yes_accuracy`` (the trivial
        baseline on the same prompts; pooled over the yes/no tasks), each task's own metrics
        (``Task.summarize``: ``dr_f1_race_c``, ``dr_f1_race_fortran``, ``mlperf_em``,
        ``plp_similarity``), and for each task present ``n_<task>``, ``accuracy_<task>``,
        ``mean_completion_chars_<task>``, ``median_completion_chars_<task>``,
        ``degenerate_share_<task>``.

    Raises:
        ValueError: see ``score_samples``.
    """
    scored = score_samples(samples, completions, reward_fn, rewards, plp_correct_threshold)
    known = tasks()
    by_task = {t.name: [r for r, s in zip(scored, samples) if s["task"] == t.name] for t in known}
    race = [(s, r) for s, r in zip(samples, scored) if get_task(s["task"]).kind == "yes_no"]
    pooled = race_classification([s["label"] for s, _ in race], [r["prediction"] for _, r in race])
    m: dict = {
        "n": len(scored),
        "avg_score": _mean([r["reward"] for r in scored]),
        "dr_f1": pooled["f1"], "dr_precision": pooled["precision"],
        "dr_recall": pooled["recall"], "dr_confusion": pooled["confusion"],
        "dr_unparseable": sum(r["prediction"] is None for _, r in race) if race else None,
        "dr_accuracy": pooled["accuracy"], "dr_mcc": pooled["mcc"],
        "dr_balanced_accuracy": pooled["balanced_accuracy"], "dr_yes_share": pooled["yes_share"],
        "dr_always_yes_f1": (pooled["always_yes"] or {}).get("f1"),
        "dr_always_yes_accuracy": (pooled["always_yes"] or {}).get("accuracy"),
    }
    for t in known:
        if t.summarize is not None:
            m.update(t.summarize(by_task[t.name]))
    for t, rows in by_task.items():
        if not rows:
            continue
        m[f"n_{t}"] = len(rows)
        m[f"accuracy_{t}"] = _mean([float(r["correct"]) for r in rows])
        m[f"mean_completion_chars_{t}"] = _mean([r["chars"] for r in rows])
        m[f"median_completion_chars_{t}"] = float(statistics.median(r["chars"] for r in rows))
        m[f"degenerate_share_{t}"] = _mean([float(r["degenerate"] is not None) for r in rows])
    return m


def win_rate(samples: list[dict], completions: list, baseline_completions: list, judge) -> dict:
    """Pairwise WinRate of ``completions`` against ``baseline_completions`` (same prompts).

    ``win_rate = (wins + 0.5 * ties) / n``. Uses ``judge.compare_batch`` when the judge has it.

    Returns:
        ``{"win_rate": float | None (n = 0), "wins", "ties", "losses", "n", "judge": judge.name,
        "verdicts": [1 | 0 | -1 per sample]}``.

    Raises:
        ValueError: the three lists differ in length, or a judge verdict is not 1, 0 or -1.
    """
    _check(samples, completions)
    _check(samples, baseline_completions, "baseline completions")
    a = [completion_text(c) for c in completions]
    b = [completion_text(c) for c in baseline_completions]
    if hasattr(judge, "compare_batch"):
        verdicts = list(judge.compare_batch(samples, a, b))
    else:
        verdicts = [judge.compare(s, x, y) for s, x, y in zip(samples, a, b)]
    if len(verdicts) != len(samples) or any(v not in (1, 0, -1) for v in verdicts):
        raise ValueError(f"judge {judge.name}: verdicts must be 1, 0 or -1 per sample, got {verdicts!r:.200}")
    wins, ties, losses = verdicts.count(1), verdicts.count(0), verdicts.count(-1)
    n = len(verdicts)
    return {"win_rate": (wins + 0.5 * ties) / n if n else None, "wins": wins, "ties": ties,
            "losses": losses, "n": n, "judge": judge.name, "verdicts": verdicts}
