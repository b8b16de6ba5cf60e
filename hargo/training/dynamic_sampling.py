"""Dynamic sampling (DAPO, Yu et al. 2025, "DAPO: an open-source LLM reinforcement learning system
at scale", section 3.2): train only on groups whose rewards disagree.

A group whose G rewards are all equal has group advantages of exactly 0 (GRPO: ``r - mean = 0``;
HARGO: ``A = 0``, so ``M = A (1 + alpha c) = 0`` and the all-equal fallback gives it uniform
weights over a zero surrogate). It contributes no policy gradient, only the KL term, yet costs a
forward and backward pass. With an SFT model that answers "yes" to every race kernel, most race
groups are such groups (issue 15). Dynamic sampling drops them and fills the step with groups that
carry a signal:

1. the step's own prompts are sampled and scored as usual (TRL);
2. if some groups have all-equal rewards, ``refill_factor`` x (the number of missing groups) more
   prompts are drawn from the RL prompt pool (the trainer's dataset: ``rl.samples_per_task``
   train prompts per task; :func:`draw_refill_indices`, reproducible from
   ``(seed, step, round, process)`` alone, so a resumed run draws the same), sampled and scored,
   up to ``max_refills`` rounds;
3. the step trains on exactly ``prompts_per_step`` groups (:func:`select_groups`): the
   informative groups of the step's own prompts, then informative refill groups; if there are
   still too few, zero-variance groups of the step's own prompts fill the rest (counted as
   *unfilled*), so a step's shape never changes. Dropped groups get no policy forward or
   backward, and for ``hargo``/``hargo_b2`` no reference pass (hargo's own, after the
   selection); TRL's reference pass (``grpo``, ``dr_grpo``, ``hargo_b1`` with ``beta > 0``) and,
   with vLLM, its old-log-prob forward run inside each scored call, refills included.

This module holds the pure parts (which groups, which prompts, how two scored batches are joined);
:class:`hargo.training.grpo_batches.DynamicSamplingMixin` (a base of ``HargoGRPOTrainer``) calls them.
What it changes in the method (the all-equal fallback, the KL term): ``docs/method.md``.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hargo.config import DynamicSampling

if TYPE_CHECKING:  # torch is imported where it is used: params validation reads the config
    import torch

__all__ = ["DynamicSamplingConfig", "GroupSelection", "informative_groups", "select_groups",
           "refill_prompt_count", "draw_refill_indices", "join_rows", "PROMPT_SIDE_KEYS"]

#: Tensors of a scored batch padded on the left (TRL left-pads prompts); every other 2-D tensor
#: whose width is the completion width is padded on the right.
PROMPT_SIDE_KEYS = ("prompt_ids", "prompt_mask")
#: Rewards closer than this count as equal (TRL's own zero-std test is ``isclose(std, 0)``).
EQUAL_ATOL = 1e-6


#: ``rl.dynamic_sampling`` of params.yaml: the typed config's block
#: (:class:`hargo.config.DynamicSampling`: ``enabled``, ``refill_factor`` >= 1, ``max_refills``
#: >= 0; defaults off, 2.0, 1), read as ``cfg.rl.dynamic_sampling``. The trainer takes it.
DynamicSamplingConfig = DynamicSampling


def informative_groups(rewards: torch.Tensor, group_size: int,
                       atol: float = EQUAL_ATOL) -> torch.Tensor:
    """Which groups' rewards disagree.

    Args:
        rewards: (B,) rewards in group-major order (the ``group_size`` completions of one prompt
            are consecutive); NaN (unscorable completion) is ignored.
        group_size: G.
        atol: rewards within this of each other are equal.

    Returns:
        (B / G,) bool: True where the group's finite rewards span more than ``atol`` (a group
        with fewer than two finite rewards is not informative).

    Raises:
        ValueError: B is not a multiple of G.
    """
    import torch

    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"informative_groups: {tuple(rewards.shape)} rewards do not form groups "
                         f"of {group_size}")
    g = rewards.detach().float().view(-1, group_size)
    finite = torch.isfinite(g)
    hi = torch.where(finite, g, torch.full_like(g, -math.inf)).max(dim=1).values
    lo = torch.where(finite, g, torch.full_like(g, math.inf)).min(dim=1).values
    return (finite.sum(dim=1) >= 2) & ((hi - lo) > atol)


@dataclass
class GroupSelection:
    """Which sampled groups a step trains on. A group is ``(batch, index)``: batch 0 is the
    step's own prompts, batch k >= 1 the k-th refill; index counts groups within the batch.

    Attributes:
        keep: the groups trained on, ``needed`` of them.
        dropped: zero-variance groups not trained on.
        surplus: informative groups not needed (sampled, scored, not trained on).
        unfilled: how many of ``keep`` have zero variance (too few informative groups).
    """

    keep: list[tuple[int, int]] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)
    surplus: list[tuple[int, int]] = field(default_factory=list)
    unfilled: int = 0


def select_groups(informative: Sequence[Sequence[bool]], needed: int) -> GroupSelection:
    """The groups a step trains on (module docstring, step 3).

    Args:
        informative: per batch (the step's own first, then each refill), per group, whether its
            rewards disagree (:func:`informative_groups`).
        needed: groups the step trains on (this process's share of ``prompts_per_step``).

    Returns:
        :class:`GroupSelection`: informative groups in batch order first; if fewer than
        ``needed``, the step's own zero-variance groups in order fill the rest.

    Raises:
        ValueError: ``needed`` exceeds the step's own groups (batch 0 must be able to fill it).
    """
    own = len(informative[0]) if informative else 0
    if needed > own:
        raise ValueError(f"select_groups: {needed} groups needed but the step's own batch has "
                         f"{own}")
    sel = GroupSelection()
    for b, flags in enumerate(informative):
        for i, ok in enumerate(flags):
            if ok:
                (sel.keep if len(sel.keep) < needed else sel.surplus).append((b, i))
    zero = [(b, i) for b, flags in enumerate(informative) for i, ok in enumerate(flags) if not ok]
    fill = [g for g in zero if g[0] == 0][:needed - len(sel.keep)]
    sel.unfilled = len(fill)
    sel.keep.extend(fill)
    sel.dropped = [g for g in zero if g not in fill]
    return sel


def refill_prompt_count(missing: int, refill_factor: float) -> int:
    """Prompts to draw in a refill round for ``missing`` groups: ``ceil(missing * factor)``
    (0 when nothing is missing)."""
    return 0 if missing <= 0 else int(math.ceil(missing * refill_factor - 1e-9))


def draw_refill_indices(n_rows: int, n: int, *, seed: int, step: int, round_: int, process: int,
                        exclude: Sequence[int] = ()) -> list[int]:
    """``n`` row indices of the RL prompt pool for a refill round, reproducible from the arguments
    alone (so a resumed run draws what the uninterrupted run drew).

    Rows not in ``exclude`` (the prompts the step already sampled) are drawn without
    replacement; if there are fewer than ``n`` of them, the rest is drawn from all rows (a prompt
    sampled again gets G new completions).

    Raises:
        ValueError: ``n_rows`` < 1 or ``n`` < 0.
    """
    if n_rows < 1 or n < 0:
        raise ValueError(f"draw_refill_indices: n_rows={n_rows}, n={n}")
    rng = random.Random(f"hargo-dynamic-sampling/{seed}/{step}/{round_}/{process}")
    skip = set(exclude)
    pool = [i for i in range(n_rows) if i not in skip]
    take = rng.sample(pool, min(n, len(pool)))
    take += [rng.randrange(n_rows) for _ in range(n - len(take))]
    return take


def _pad(t: torch.Tensor, width: int, left: bool, value) -> torch.Tensor:
    import torch

    extra = width - t.size(1)
    if extra <= 0:
        return t
    pad = torch.full((t.size(0), extra) + tuple(t.shape[2:]), value, dtype=t.dtype,
                     device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def join_rows(batches: Sequence[Mapping[str, Any]], rows: Sequence[tuple[int, int]],
              pad_token_id: int, skip: Sequence[str] = ("num_items_in_batch",)) -> dict:
    """One scored batch made of ``rows`` (``(batch, row)`` pairs) of TRL scored batches.

    Each batch is the dict TRL 1.16's ``_generate_and_score_completions`` returns (text-only).
    ``prompt_ids``/``prompt_mask`` are left-padded to the widest prompt, every 2-D tensor as wide
    as its batch's ``completion_ids`` right-padded to the widest completion, (B,) and (B, 1)
    tensors concatenated; then the columns no kept row uses (mask 0 in every row) are cut, so
    rows of a single batch come back exactly as they were. Pads: ``pad_token_id`` for ids, 0
    elsewhere (masked out). Keys in ``skip`` are left out (the caller recomputes them).

    Returns:
        dict of (len(rows), ...) tensors.

    Raises:
        ValueError: a key holds something this join cannot align (images, per-image tensors).
    """
    import torch

    keys = [k for k in batches[0] if k not in skip]
    used_batches = sorted({b for b, _ in rows})
    by_batch = {b: [r for bb, r in rows if bb == b] for b in used_batches}
    dest = [n for b in used_batches for n, (bb, _) in enumerate(rows) if bb == b]
    inv = torch.empty(len(rows), dtype=torch.long)
    inv[torch.tensor(dest, dtype=torch.long)] = torch.arange(len(rows))
    kinds: dict[str, str] = {}
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ts = [batches[b][key] for b in used_batches]
        sizes = [batches[b]["completion_ids"].shape for b in used_batches]
        if any(not isinstance(t, torch.Tensor) or t.size(0) != n for t, (n, _) in zip(ts, sizes)):
            raise ValueError(f"dynamic sampling: cannot join {key!r} of the scored batch "
                             "(one value per completion expected; multimodal inputs are not "
                             "supported)")
        if key in PROMPT_SIDE_KEYS:
            kind = "prompt"
        elif all(t.dim() == 1 for t in ts):
            kind = "row"
        elif all(t.dim() == 2 and t.size(1) == w for t, (_, w) in zip(ts, sizes)):
            kind = "completion"
        elif all(t.dim() == 2 and t.size(1) == 1 for t in ts):
            kind = "row"
        else:
            raise ValueError(f"dynamic sampling: cannot join {key!r} of shapes "
                             f"{[tuple(t.shape) for t in ts]}")
        kinds[key] = kind
        parts = [t[torch.tensor(by_batch[b], dtype=torch.long, device=t.device)]
                 for t, b in zip(ts, used_batches)]
        if kind != "row":
            width = max(p.size(1) for p in parts)
            value = pad_token_id if key.endswith("_ids") else 0
            parts = [_pad(p, width, kind == "prompt", value) for p in parts]
        cat = torch.cat(parts, dim=0)
        out[key] = cat[inv.to(cat.device)]
    # cut the columns no kept row uses
    if "prompt_mask" in out:
        used = out["prompt_mask"].bool().any(dim=0).nonzero()
        first = int(used.min()) if used.numel() else out["prompt_mask"].size(1)
        for key in (k for k, kind in kinds.items() if kind == "prompt"):
            out[key] = out[key][:, first:]
    if "completion_mask" in out:
        used = out["completion_mask"].bool().any(dim=0).nonzero()
        last = int(used.max()) + 1 if used.numel() else 0
        for key in (k for k, kind in kinds.items() if kind == "completion"):
            out[key] = out[key][:, :last]
    return out
