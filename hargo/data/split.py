"""The two split strategies of the ``prepare`` stage (:mod:`hargo.data.prepare`):
:func:`split_grouped` (no normalised text, by default the prompt, in both splits) and
:func:`split_paper` (the papers' per-file random split).
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from typing import Callable

from hargo.data.raw import normalise_text


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


def _prompt_text(r: dict) -> str:
    return r["prompt"][0]["content"]


def split_grouped(records: list[dict], eval_fraction: float, seed: int,
                  text: Callable[[dict], str] | None = None) -> tuple[list[dict], list[dict]]:
    """Seeded per-task split that keeps every group wholly in one split. A group is the records
    whose ``text`` (default: the prompt) is the same after :func:`~hargo.data.raw.normalise_text`
    (whitespace runs and line ends, case, surrounding blanks), so a copy of a train instruction
    with CRLF line ends or a trailing space cannot land in eval.

    Per task: the groups, in first-seen order, are shuffled by a ``random.Random`` seeded from
    ``(seed, task)``; walking that order, a group goes to eval while it fits in the eval target
    ``floor(n * eval_fraction)`` records, else to train. With one record per group eval has
    exactly the target size; with larger groups at most the target.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    check_fraction(eval_fraction)
    text = text or _prompt_text
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        groups: "OrderedDict[str, list[int]]" = OrderedDict()
        for k in idx:
            groups.setdefault(normalise_text(text(records[k])), []).append(k)
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


def near_duplicates(records: list[dict], text: Callable[[dict], str] | None = None) -> dict[str, dict]:
    """Per task, the groups of :func:`split_grouped` that join records whose ``text`` differs
    as written but is the same after :func:`~hargo.data.raw.normalise_text` (the records an
    exact-text grouping would have split independently, and could have leaked).

    Returns:
        ``{task: {"groups": g, "records": n}}`` for every task in ``records``: ``g`` such groups
        holding ``n`` records in all; each group sits wholly in one split.
    """
    text = text or _prompt_text
    out = {}
    for task, idx in _by_task(records).items():
        variants: "OrderedDict[str, list[str]]" = OrderedDict()
        for k in idx:
            variants.setdefault(normalise_text(text(records[k])), []).append(text(records[k]))
        near = [v for v in variants.values() if len(set(v)) > 1]
        out[task] = {"groups": len(near), "records": sum(map(len, near))}
    return out


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
