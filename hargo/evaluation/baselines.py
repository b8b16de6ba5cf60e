"""Race baselines that need no training: the rows every trained model is read against.

- **always-yes** (:func:`always_yes_predictions`): "yes" to every race prompt. Its F1 is
  ``2p / (1 + p)`` for a share ``p`` of "yes" labels (0.67 at p = 0.5), its MCC 0 and its
  balanced accuracy 0.5 whatever the balance; its score is a constant, so its ROC AUC is 0.5
  (every yes/no pair a tie) when both labels occur.
- **nearest-train** (:func:`nearest_train`): the 1-nearest-neighbour lookup of the eval kernel in
  the train split. A model whose race gain does not beat this row may have learned lookup, not
  race detection (on the grouped split's 336 race eval prompts it scored accuracy 0.902, F1
  0.896, MCC 0.803 when it was written; docs/results.md's main-job table has the current figure).

Nearest-train, exactly:

- Tokens of a prompt (:func:`kernel_tokens`) and their similarity (:func:`jaccard`): defined in
  :mod:`hargo.data.similarity` (the ``similarity`` split and ``prepare``'s statistics use the
  same), re-exported here: the token set of the prompt's user text (regular expression
  ``\\w+|[^\\w\\s]``, case kept) and the Jaccard of two such sets. This reproduces the
  figures above.
- Train pool: every race record (``race_c`` and ``race_fortran``, either language for either
  eval task) of the same split's ``train.jsonl``, in file order.
- Prediction: the label of the most similar train kernel; ties go to the first in file order.
- Score (for ROC AUC): ``s_yes - s_no``, the similarity of the nearest "yes" train kernel minus
  that of the nearest "no" kernel, in [-1, 1]. Its sign is the prediction (a tie, score 0, goes
  to whichever of the two comes first in the file), so the AUC ranks by the same evidence the
  1-NN vote uses.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from hargo.data.similarity import TOKEN_RE, jaccard, kernel_text, kernel_tokens
from hargo.rewards import RACE_TASKS
from hargo.rewards.race import canonical_label

__all__ = ["TOKEN_RE", "kernel_text", "kernel_tokens", "jaccard", "nearest_train",
           "always_yes_predictions", "BASE", "ALWAYS_YES", "NEAREST_TRAIN", "BASELINES",
           "race_entry", "baseline_entries"]


def nearest_train(train: Sequence[Mapping], queries: Sequence[Mapping]) -> list[dict]:
    """The nearest-train baseline of each query (module docstring for the exact rule).

    Args:
        train: prepared records of the train split, in file order; only race records
            (``task`` in ``RACE_TASKS``) are used, with their ``label``.
        queries: the eval records to predict (race records; ``prompt`` used).

    Returns:
        One dict per query, in order: ``prediction`` ("yes"/"no", the nearest kernel's label),
        ``similarity`` (its Jaccard), ``neighbour`` (its id), ``score`` (``s_yes - s_no``).

    Raises:
        ValueError: no race record in ``train``, or only one label among them (then there is no
            nearest "yes" or "no" kernel), or a train label other than yes/no.
    """
    pool = [(r.get("id"), canonical_label(r.get("label")), kernel_tokens(r["prompt"]))
            for r in train if r.get("task") in RACE_TASKS]
    if not pool:
        raise ValueError("nearest_train: the train split has no race record")
    if len({lab for _, lab, _ in pool}) < 2:
        raise ValueError("nearest_train: the train split's race records have a single label")
    out = []
    for q in queries:
        toks = kernel_tokens(q["prompt"])
        best = {"yes": (-1.0, None), "no": (-1.0, None)}  # per label: (similarity, pool index)
        for k, (_, lab, t) in enumerate(pool):
            s = jaccard(toks, t)
            if s > best[lab][0]:  # strict: the first in file order keeps a tie
                best[lab] = (s, k)
        (sy, ky), (sn, kn) = best["yes"], best["no"]
        k = ky if (sy > sn or (sy == sn and ky < kn)) else kn
        out.append({"prediction": pool[k][1], "similarity": max(sy, sn),
                    "neighbour": pool[k][0], "score": sy - sn})
    return out


def always_yes_predictions(n: int) -> list[str]:
    """``n`` times "yes": the always-yes baseline's predictions (its score is a constant)."""
    return ["yes"] * n


#: The untuned base model (``model.out_dir``), evaluated like the trained ones: a baseline row.
BASE = "base"
#: The race baselines that need no model, computed on the same race prompts.
ALWAYS_YES = "always-yes"
NEAREST_TRAIN = "nearest-train"
BASELINES = (ALWAYS_YES, NEAREST_TRAIN)


def race_entry(labels: Sequence[str], predictions: Sequence[str | None],
               scores: Sequence[float] | None) -> dict:
    """The race metrics of a baseline as stored in ``metrics/eval.json``.

    Args:
        labels: the race prompts' labels ("yes"/"no").
        predictions: one "yes"/"no" per label (None counts as the wrong answer, as for models).
        scores: one score per label for the AUC ("yes" higher), or None (then ``dr_auc`` is
            None).

    Returns:
        ``{"baseline": True, "n_race", "dr_f1", "dr_precision", "dr_recall", "dr_accuracy",
        "dr_mcc", "dr_balanced_accuracy", "dr_yes_share", "dr_auc", "dr_confusion": {tp, fp,
        fn, tn}}`` (``hargo.metrics.race_classification`` / ``race_auc``; all None without
        labels).
    """
    from hargo.metrics import race_auc, race_classification

    c = race_classification(list(labels), list(predictions))
    auc = race_auc(list(labels), list(scores)) if scores is not None and labels else None
    return {"baseline": True, "n_race": len(labels), "dr_f1": c["f1"],
            "dr_precision": c["precision"], "dr_recall": c["recall"],
            "dr_accuracy": c["accuracy"], "dr_mcc": c["mcc"],
            "dr_balanced_accuracy": c["balanced_accuracy"], "dr_yes_share": c["yes_share"],
            "dr_auc": auc,
            "dr_confusion": None if c["confusion"] is None else
            {k: int(c["confusion"][k]) for k in ("tp", "fp", "fn", "tn")}}


def baseline_entries(subset: Sequence[Mapping], train: Sequence[Mapping]) -> tuple[dict, list]:
    """The race baselines on the race prompts of ``subset`` (module docstring, step 5).

    Args:
        subset: the eval prompt set (every task; only race records are used).
        train: the train split's records, in file order (race records used).

    Returns:
        ``({"always-yes": race_entry, "nearest-train": race_entry}, rows)``; ``rows`` holds
        per race prompt ``id``, ``task``, ``label`` and nearest-train's ``prediction``,
        ``neighbour``, ``similarity``, ``score``. Without race prompts both entries hold
        None metrics and ``rows`` is empty (the train split is not read).

    Raises:
        ValueError: race prompts but no race record (or a single label) in ``train``.
    """
    race = [r for r in subset if r["task"] in RACE_TASKS]
    labels = [canonical_label(r["label"]) for r in race]
    nn = nearest_train(train, race) if race else []
    rows = [{"id": r["id"], "task": r["task"], "label": lab, **n}
            for r, lab, n in zip(race, labels, nn)]
    return ({ALWAYS_YES: race_entry(labels, always_yes_predictions(len(race)), [0.0] * len(race)),
             NEAREST_TRAIN: race_entry(labels, [n["prediction"] for n in nn],
                                       [n["score"] for n in nn])}, rows)
