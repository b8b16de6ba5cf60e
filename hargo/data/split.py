"""The two split strategies of the ``prepare`` stage (:mod:`hargo.data.prepare`):
:func:`split_grouped` (no group, by default no prompt, in both splits) and :func:`split_paper`
(the papers' per-file random split).
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from typing import Callable


def eval_size(n: int, eval_fraction: float) -> int:
    """floor(n * eval_fraction), robust to float error (``0.29 * 100`` -> 29, not 28)."""
    return math.floor(round(n * eval_fraction, 9))


def _rng(kind: str, seed: int, task: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.Random: the same on every run and platform.
    return random.Random(f"hargo-split:{kind}:{seed}:{task}")


def _by_task(records: list[dict]) -> "OrderedDict[str, list[int]]":
    out: "OrderedDict[str, list[int]]" = OrderedDict()
    for k, r in enumerate(records):
        out.setdefault(r["task"], []).append(k)
    return out


def check_fraction(eval_fraction: float) -> None:
    """Raise ``ValueError`` unless ``eval_fraction`` is in (0, 1)."""
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ValueError(f"data.split.eval_fraction must be in (0, 1), got {eval_fraction!r}")


def split_grouped(records: list[dict], eval_fraction: float, seed: int,
                  key: Callable[[dict], str] | None = None) -> tuple[list[dict], list[dict]]:
    """Seeded per-task split that keeps every group (same ``key``, default the prompt text)
    wholly in one split.

    Per task: the groups, in first-seen order, are shuffled by a ``random.Random`` seeded from
    ``(seed, task)``; walking that order, a group goes to eval while it fits in the eval target
    ``floor(n * eval_fraction)`` records, else to train. With one record per group (the prepared
    grouped data) eval has exactly the target size; with larger groups at most the target.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    check_fraction(eval_fraction)
    key = key or (lambda r: r["prompt"][0]["content"])
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        groups: "OrderedDict[str, list[int]]" = OrderedDict()
        for k in idx:
            groups.setdefault(key(records[k]), []).append(k)
        order = list(groups)
        _rng("grouped", seed, task).shuffle(order)
        target, n_eval = eval_size(len(idx), eval_fraction), 0
        for g in order:
            if n_eval + len(groups[g]) <= target:
                n_eval += len(groups[g])
                for k in groups[g]:
                    in_eval[k] = True
    return ([r for r, e in zip(records, in_eval) if not e],
            [r for r, e in zip(records, in_eval) if e])


def split_paper(records: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """The papers' split: per task (= per raw file) a seeded random permutation, the first
    ``floor(n * eval_fraction)`` records to eval, the rest to train. Repeated instructions may
    land in both splits. On the real files: 5,273 train / 584 eval.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    check_fraction(eval_fraction)
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        perm = list(idx)
        _rng("paper", seed, task).shuffle(perm)
        for k in perm[:eval_size(len(idx), eval_fraction)]:
            in_eval[k] = True
    return ([r for r, e in zip(records, in_eval) if not e],
            [r for r, e in zip(records, in_eval) if e])
