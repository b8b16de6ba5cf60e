"""Race baselines that need no training: the rows every trained model is read against.

- **always-yes** (:func:`always_yes_predictions`): "yes" to every race prompt. Its F1 is
  ``2p / (1 + p)`` for a share ``p`` of "yes" labels (0.67 at p = 0.5), its MCC 0 and its
  balanced accuracy 0.5 whatever the balance; its score is a constant, so its ROC AUC is 0.5
  (every yes/no pair a tie) when both labels occur.
- **nearest-train** (:func:`nearest_train`): the 1-nearest-neighbour lookup of the eval kernel in
  the train split. A model whose race gain does not beat this row may have learned lookup, not
  race detection (issue 15: on the grouped split's 336 race eval prompts it scores accuracy
  0.902, F1 0.896, MCC 0.803).

Nearest-train, exactly:

- Tokens of a prompt (:func:`prompt_tokens`): the set of matches of the regular expression
  ``\\w+|[^\\w\\s]`` (Python ``re``, Unicode: runs of word characters, and every other
  non-space character on its own) over the text of the prompt's user messages (``role ==
  "user"``, joined with a newline), case kept (``N`` and ``n`` are different tokens). This
  reproduces issue 15's figures above.
- Similarity: Jaccard of the two token sets, ``|A & B| / |A | B|`` (0.0 when both are empty).
- Train pool: every race record (``race_c`` and ``race_fortran``, either language for either
  eval task) of the same split's ``train.jsonl``, in file order.
- Prediction: the label of the most similar train kernel; ties go to the first in file order.
- Score (for ROC AUC): ``s_yes - s_no``, the similarity of the nearest "yes" train kernel minus
  that of the nearest "no" kernel, in [-1, 1]. Its sign is the prediction (a tie, score 0, goes
  to whichever of the two comes first in the file), so the AUC ranks by the same evidence the
  1-NN vote uses.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from hargo.rewards import RACE_TASKS
from hargo.rewards.race import canonical_label

__all__ = ["TOKEN_RE", "prompt_text", "prompt_tokens", "jaccard", "nearest_train",
           "always_yes_predictions"]

#: Tokenisation of the nearest-train baseline: word runs, and each other non-space character.
TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def prompt_text(prompt: Sequence[Mapping]) -> str:
    """The text of a conversational prompt's user messages, joined with ``"\\n"``.

    Raises:
        ValueError: no user message with string content.
    """
    parts = [m["content"] for m in prompt
             if isinstance(m, Mapping) and m.get("role") == "user"
             and isinstance(m.get("content"), str)]
    if not parts:
        raise ValueError(f"prompt has no user message: {str(prompt)[:80]!r}")
    return "\n".join(parts)


def prompt_tokens(prompt: Sequence[Mapping]) -> frozenset[str]:
    """The token set of a prompt's user text (:data:`TOKEN_RE`; case kept)."""
    return frozenset(TOKEN_RE.findall(prompt_text(prompt)))


def jaccard(a: frozenset | set, b: frozenset | set) -> float:
    """``|a & b| / |a | b|``; 0.0 when both sets are empty."""
    inter = len(a & b)
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


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
    pool = [(r.get("id"), canonical_label(r.get("label")), prompt_tokens(r["prompt"]))
            for r in train if r.get("task") in RACE_TASKS]
    if not pool:
        raise ValueError("nearest_train: the train split has no race record")
    if len({lab for _, lab, _ in pool}) < 2:
        raise ValueError("nearest_train: the train split's race records have a single label")
    out = []
    for q in queries:
        toks = prompt_tokens(q["prompt"])
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
