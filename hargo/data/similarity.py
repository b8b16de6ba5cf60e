"""Token-set similarity of prompts: the one tokenisation and Jaccard that the nearest-train race
baseline (:mod:`hargo.evaluation.baselines`), the ``similarity`` split
(:func:`hargo.data.split.split_similarity`), ``prepare``'s nearest-train statistics and
``validate``'s near-copy check share.

- Tokens of a prompt (:func:`kernel_tokens`): the set of matches of the regular expression
  ``\\w+|[^\\w\\s]`` (Python ``re``, Unicode: runs of word characters, and every other non-space
  character on its own) over the text of the prompt's user messages (``role == "user"``, joined
  with a newline), case kept (``N`` and ``n`` are different tokens). The race prompts' fixed
  instruction text ("Given the code snippet: ..., help me detect ...") is part of it, so two
  kernels with nothing in common still share ~25 tokens.
- Similarity: Jaccard of the two token sets, ``|A & B| / |A | B|`` (0.0 when both are empty).
- Near-copy pairs (:func:`similar_pairs`): candidates from MinHash LSH (``datasketch``: ``MinHash``
  with ``num_perm`` permutations seeded from the split seed, ``MinHashLSH`` with the bands of
  :func:`lsh_bands`), each verified with the exact Jaccard, so a returned pair always has
  Jaccard >= the threshold. A true pair can be missed only if its MinHash signatures share no
  band: probability ``(1 - s**r)**b`` for a pair of Jaccard ``s`` (Leskovec, Rajaraman, Ullman,
  *Mining of Massive Datasets*, 3rd ed., section 3.4.2), at most :data:`MAX_MISS` at the
  threshold and less above it. ``validate`` checks the outcome exactly (no eval record near a
  train record), so a miss cannot pass unseen.
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Mapping, Sequence

__all__ = ["TOKEN_RE", "MAX_MISS", "kernel_text", "kernel_tokens", "jaccard", "check_threshold",
           "lsh_bands", "similar_pairs", "components", "nearest_similarity", "similarity_summary"]

#: Tokenisation of prompts: word runs, and each other non-space character.
TOKEN_RE = re.compile(r"\w+|[^\w\s]")
#: The largest chance that LSH misses a pair exactly at the threshold (:func:`lsh_bands`).
MAX_MISS = 1e-4


def kernel_text(prompt: Sequence[Mapping]) -> str:
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


def kernel_tokens(prompt: Sequence[Mapping]) -> frozenset[str]:
    """The token set of a prompt's user text (:data:`TOKEN_RE`; case kept)."""
    return frozenset(TOKEN_RE.findall(kernel_text(prompt)))


def jaccard(a: frozenset | set, b: frozenset | set) -> float:
    """``|a & b| / |a | b|``; 0.0 when both sets are empty."""
    inter = len(a & b)
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


def check_threshold(threshold: float, name: str = "data.split.similarity_threshold") -> None:
    """Raise ``ValueError`` (naming ``name``) unless ``threshold`` is a number in (0, 1]."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not 0.0 < threshold <= 1.0:
        raise ValueError(f"{name} must be a number in (0, 1], got {threshold!r}")


def lsh_bands(num_perm: int, threshold: float, max_miss: float = MAX_MISS) -> tuple[int, int]:
    """LSH bands ``(b, r)`` (``b`` bands of ``r`` rows, ``b * r <= num_perm``, ``b >= 2`` as
    ``MinHashLSH`` requires): the largest ``r`` whose miss probability at the threshold,
    ``(1 - threshold**r)**b`` with ``b = num_perm // r``, is at most ``max_miss`` (larger ``r``:
    fewer false candidates to verify); ``r = 1`` if none is. ``(128, 0.9)`` -> ``(18, 7)``.

    Raises:
        ValueError: ``num_perm < 4`` or a threshold outside (0, 1].
    """
    if isinstance(num_perm, bool) or not isinstance(num_perm, int) or num_perm < 4:
        raise ValueError(f"data.split.minhash_perm must be an integer >= 4, got {num_perm!r}")
    check_threshold(threshold)
    for r in range(num_perm // 2, 0, -1):
        b = num_perm // r
        if (1.0 - threshold ** r) ** b <= max_miss:
            return b, r
    return num_perm, 1


def similar_pairs(token_sets: Sequence[frozenset], threshold: float, num_perm: int,
                  seed: int) -> list[tuple[int, int, float]]:
    """Every pair of ``token_sets`` that MinHash LSH proposes and whose exact Jaccard is at
    least ``threshold`` (module docstring).

    Args:
        token_sets: one token set per record (:func:`kernel_tokens`).
        threshold: in (0, 1].
        num_perm: MinHash permutations (>= 4).
        seed: seeds the MinHash permutations (``seed % 2**32``): the same pairs on every run.

    Returns:
        ``(i, j, jaccard)`` with ``i < j`` (indices into ``token_sets``), sorted. Two empty sets
        (Jaccard 0.0) are never a pair.
    """
    from datasketch import MinHash, MinHashLSH

    b, r = lsh_bands(num_perm, threshold)
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, params=(b, r))
    kw = {"num_perm": num_perm, "seed": seed % 2**32, "scheme": "affine32"}
    kw["permutations"] = MinHash(**kw).permutations  # drawn once from the seed, then shared
    pairs = []
    for k, toks in enumerate(token_sets):
        m = MinHash(**kw)
        m.update_batch([t.encode("utf-8") for t in sorted(toks)])
        for j in lsh.query(m):  # earlier records only: each pair is proposed once
            s = jaccard(token_sets[j], toks)
            if s >= threshold:
                pairs.append((j, k, s))
        lsh.insert(k, m)
    return sorted(pairs)


def components(n: int, pairs: Sequence[tuple[int, int] | tuple[int, int, float]]) -> list[list[int]]:
    """Connected components of the graph on ``0..n-1`` whose edges are ``pairs`` (union-find).

    Returns:
        The components, each ascending, ordered by their smallest member (first-seen order).
    """
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    for i, j, *_ in pairs:
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)  # the smallest index is every root
    out: dict[int, list[int]] = {}
    for k in range(n):
        out.setdefault(root(k), []).append(k)
    return list(out.values())


def nearest_similarity(pool: Sequence[frozenset], queries: Sequence[frozenset]) -> list[float]:
    """For each query, the largest exact Jaccard to any set of ``pool`` (brute force,
    ``len(pool) * len(queries)`` Jaccards; ~1 s per 300k on the race prompts); 0.0 with an
    empty pool."""
    return [max((jaccard(q, t) for t in pool), default=0.0) for q in queries]


def similarity_summary(values: Sequence[float], threshold: float) -> dict:
    """Summary of nearest-train similarities: ``n``, ``median`` (``statistics.median``), ``p90``
    (nearest rank: the ``ceil(0.9 n)``-th smallest), ``max``, ``share_ge_0_9`` and
    ``share_ge_threshold`` (the share of values >= 0.9, >= ``threshold``); rounded to 4
    decimals, None when ``values`` is empty (``n`` 0)."""
    v = sorted(values)
    if not v:
        return {"n": 0, "median": None, "p90": None, "max": None, "share_ge_0_9": None,
                "share_ge_threshold": None}
    return {"n": len(v), "median": round(statistics.median(v), 4),
            "p90": round(v[math.ceil(round(0.9 * len(v), 9)) - 1], 4), "max": round(v[-1], 4),
            "share_ge_0_9": round(sum(x >= 0.9 for x in v) / len(v), 4),
            "share_ge_threshold": round(sum(x >= threshold for x in v) / len(v), 4)}
