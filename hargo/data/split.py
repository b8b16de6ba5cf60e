"""The three split strategies of the ``prepare`` stage (:mod:`hargo.data.prepare`):
:func:`split_grouped` (no normalised text, by default the prompt, in both splits),
:func:`split_similarity` (``grouped``, and race kernels whose token sets have Jaccard >= a
threshold, chained, in one split) and :func:`split_paper` (the papers' per-file random split).
``grouped`` and ``similarity`` place groups by one rule, :func:`split_groups`.
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from typing import Callable

from hargo.data.raw import normalise_text
from hargo.data.similarity import components, kernel_tokens, lsh_bands, similar_pairs
from hargo import vocab  # its task lists read when used (a task module added later counts)


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


def split_groups(records: list[dict], groups: dict[str, list[list[int]]], eval_fraction: float,
                 seed: int) -> tuple[list[dict], list[dict]]:
    """Place whole groups: per task, the groups (lists of indices into ``records``, in
    first-seen order) are shuffled by a ``random.Random`` seeded from ``(seed, task)``; walking
    that order, a group goes to eval while it fits in the eval target ``floor(n *
    eval_fraction)`` records (``n`` the task's records), else to train. With one record per
    group eval has exactly the target size; with larger groups at most the target.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1); a task of ``records`` without groups, or
            groups that are not a partition of its records.
    """
    check_fraction(eval_fraction)
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        mine = groups.get(task)
        if mine is None or sorted(k for g in mine for k in g) != idx:
            raise ValueError(f"split_groups: the groups of task {task!r} are not a partition of "
                             f"its {len(idx)} records")
        order = list(range(len(mine)))
        _rng("grouped", seed, task).shuffle(order)
        target, n_eval = eval_size(len(idx), eval_fraction), 0
        for g in order:
            if n_eval + len(mine[g]) <= target:
                n_eval += len(mine[g])
                for k in mine[g]:
                    in_eval[k] = True
    return ([r for r, e in zip(records, in_eval) if not e],
            [r for r, e in zip(records, in_eval) if e])


def text_groups(records: list[dict], text: Callable[[dict], str] | None = None
                ) -> dict[str, list[list[int]]]:
    """Per task, the records whose ``text`` (default: the prompt) is the same after
    :func:`~hargo.data.raw.normalise_text`, as lists of indices into ``records``, in first-seen
    order."""
    text = text or _prompt_text
    out = {}
    for task, idx in _by_task(records).items():
        groups: "OrderedDict[str, list[int]]" = OrderedDict()
        for k in idx:
            groups.setdefault(normalise_text(text(records[k])), []).append(k)
        out[task] = list(groups.values())
    return out


def split_grouped(records: list[dict], eval_fraction: float, seed: int,
                  text: Callable[[dict], str] | None = None) -> tuple[list[dict], list[dict]]:
    """Seeded per-task split that keeps every group wholly in one split. A group is the records
    whose ``text`` (default: the prompt) is the same after :func:`~hargo.data.raw.normalise_text`
    (whitespace runs and line ends, case, surrounding blanks), so a copy of a train instruction
    with CRLF line ends or a trailing space cannot land in eval (:func:`text_groups`). The
    groups are placed by :func:`split_groups`.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    check_fraction(eval_fraction)
    return split_groups(records, text_groups(records, text), eval_fraction, seed)


def similarity_groups(records: list[dict], threshold: float, num_perm: int, seed: int,
                      text: Callable[[dict], str] | None = None
                      ) -> tuple[dict[str, list[list[int]]], dict[str, dict]]:
    """The groups of the ``similarity`` split. Per race task (``RACE_TASKS``): the connected
    components of the graph whose edges join two records that are the same after
    :func:`~hargo.data.raw.normalise_text` of ``text`` (as :func:`text_groups`) or whose prompt
    token sets (:func:`~hargo.data.similarity.kernel_tokens`) have Jaccard >= ``threshold``
    (:func:`~hargo.data.similarity.similar_pairs`: MinHash LSH candidates, each verified
    exactly). Links chain: A~B and B~C put A, B, C in one group even when A and C are below
    the threshold. Other tasks: :func:`text_groups`.

    Args:
        records: prepared records (``task``, ``prompt``).
        threshold: Jaccard in (0, 1]; 1.0 links equal token sets only.
        num_perm: MinHash permutations (``data.split.minhash_perm``).
        seed: seeds the MinHash permutations.
        text: the text compared after normalisation (default: the prompt).

    Returns:
        ``(groups, info)``: ``groups`` as :func:`text_groups` (indices into ``records``, each
        group ascending, groups in first-seen order); ``info[task]`` for each race task:
        ``linked_pairs`` (verified pairs at Jaccard >= threshold), ``groups``,
        ``multi_groups`` / ``multi_records`` (groups of more than one record, and their
        records), ``largest`` (records in the largest group).

    Raises:
        ValueError: a threshold outside (0, 1] or ``num_perm < 4``; a race prompt without a
            user message (naming the record's id).
    """
    lsh_bands(num_perm, threshold)  # checks both before any work
    groups = text_groups(records, text)
    info = {}
    for task, idx in _by_task(records).items():
        if task not in vocab.RACE_TASKS:
            continue
        local = {k: i for i, k in enumerate(idx)}
        toks = []
        for k in idx:
            try:
                toks.append(kernel_tokens(records[k]["prompt"]))
            except ValueError as e:
                raise ValueError(f"record {records[k].get('id')!r}, field prompt: {e}") from None
        pairs = similar_pairs(toks, threshold, num_perm, seed)
        same_text = [(local[g[0]], local[k]) for g in groups[task] for k in g[1:]]
        comps = components(len(idx), [(i, j) for i, j, _ in pairs] + same_text)
        groups[task] = [[idx[i] for i in c] for c in comps]
        multi = [c for c in comps if len(c) > 1]
        info[task] = {"linked_pairs": len(pairs), "groups": len(comps), "multi_groups": len(multi),
                      "multi_records": sum(map(len, multi)), "largest": max(map(len, comps))}
    return groups, info


def split_similarity(records: list[dict], eval_fraction: float, seed: int, threshold: float,
                     num_perm: int, text: Callable[[dict], str] | None = None
                     ) -> tuple[list[dict], list[dict]]:
    """The ``similarity`` split: the groups of :func:`similarity_groups` (race kernels at token
    Jaccard >= ``threshold``, chained, and normalised-text copies) placed by
    :func:`split_groups`, so no race eval record has a train record of its task at Jaccard >=
    ``threshold`` (up to LSH's miss chance, :data:`~hargo.data.similarity.MAX_MISS` per pair at
    the threshold). Non-race tasks are split exactly as by :func:`split_grouped`.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1); see :func:`similarity_groups`.
    """
    check_fraction(eval_fraction)
    groups, _ = similarity_groups(records, threshold, num_perm, seed, text)
    return split_groups(records, groups, eval_fraction, seed)


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
