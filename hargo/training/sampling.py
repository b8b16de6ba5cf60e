"""The RL trainers' prompt sampler: TRL 1.16's ``RepeatSampler`` order, as a function of the epoch.

Why: TRL's ``RepeatSampler`` draws each epoch's permutation from one ``torch.Generator`` seeded
once at construction, so epoch ``e`` gets the ``(e + 1)``-th permutation only because the same
sampler object was iterated ``e`` times before. transformers resumes a run by building a fresh
sampler and starting at epoch ``global_step // steps_per_epoch`` *without* replaying the
earlier epochs (``Trainer._inner_training_loop``), so a run resumed at or after an epoch
boundary repeated the first epoch's prompt order, and its weights, EMA baseline and rewards
drifted from the uninterrupted run's. Resuming inside the first epoch was exact
(transformers skips the trained batches of that epoch).

:class:`EpochRepeatSampler` yields exactly TRL's order -- the same permutations, repeats and
batch chunking, epoch after epoch -- but computes epoch ``e``'s permutation from ``(seed, e)``
alone (a fresh generator seeded with ``seed`` that draws and discards ``e`` permutations
first), so a fresh sampler told its epoch (``set_epoch``, transformers' and accelerate's hook,
which :class:`hargo.training.grpo.HargoGRPOTrainer` also calls itself at the start of every
epoch) continues where the interrupted run's left off. An uninterrupted run's order is unchanged
(tested against TRL's sampler in ``tests/test_rl.py``).

:class:`TaskQuotaSampler` is the same sampler with a fixed number of prompts of each task in
every chunk (a step's prompts): the synthetic test bed's ``synthetic.rl.prompts_per_step_per_task``,
installed through the trainer's ``prompt_quota`` hook (:class:`hargo.training.resume.ResumeMixin`).
"""
from __future__ import annotations

import random
from typing import Iterator, Mapping, Sequence, Sized

import torch
from trl.trainer.utils import RepeatSampler

__all__ = ["EpochRepeatSampler", "TaskQuotaSampler"]


class EpochRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` whose order depends on ``(seed, epoch)`` only.

    Args:
        data_source: the dataset (only its length is used).
        mini_repeat_count: times each index repeats in a row (TRL: ``num_generations``).
        batch_size: distinct indices per chunk (TRL: prompts per generation batch); a last
            incomplete chunk is dropped, as TRL does.
        repeat_count: times each chunk repeats (TRL: ``num_iterations * steps_per_generation``).
        shuffle: permute the indices each epoch (False: ``0..n-1`` every epoch).
        seed: seed of the permutations. None: the default seed of a fresh ``torch.Generator``
            (what TRL's sampler then uses too); torch's global RNG is never touched.

    Attributes:
        epoch: the epoch the next ``__iter__`` yields (0-based); ``set_epoch`` sets it, and a
            complete iteration advances it by one, so iterating the same object repeatedly gives
            TRL's successive epochs even when nobody calls ``set_epoch``.
    """

    def __init__(self, data_source: Sized, mini_repeat_count: int, batch_size: int = 1,
                 repeat_count: int = 1, shuffle: bool = True, seed: int | None = None):
        super().__init__(data_source, mini_repeat_count, batch_size=batch_size,
                         repeat_count=repeat_count, shuffle=shuffle, seed=seed)
        self.base_seed = int(torch.Generator().initial_seed() if seed is None else seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield epoch ``epoch`` (0-based).

        Raises:
            ValueError: a negative epoch.
        """
        if int(epoch) < 0:
            raise ValueError(f"EpochRepeatSampler.set_epoch: epoch must be >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def permutation(self, epoch: int) -> list[int]:
        """The order of the ``len(data_source)`` indices in epoch ``epoch``: TRL's ``(epoch+1)``-th
        ``torch.randperm`` of a generator seeded with ``base_seed`` (``0..n-1`` without shuffle)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator()
        g.manual_seed(self.base_seed)
        for _ in range(int(epoch)):
            torch.randperm(self.num_samples, generator=g)
        return torch.randperm(self.num_samples, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        indexes = self.permutation(self.epoch)
        chunks = [indexes[i:i + self.batch_size] for i in range(0, len(indexes), self.batch_size)]
        for chunk in chunks:
            if len(chunk) != self.batch_size:
                continue
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index
        self.epoch += 1


class TaskQuotaSampler(EpochRepeatSampler):
    """:class:`EpochRepeatSampler` whose every chunk of ``batch_size`` prompts holds exactly
    ``quota[t]`` prompts of each task ``t``, the pool unchanged.

    Epoch ``e``: each task's rows (in dataset order) are shuffled by
    ``random.Random(f"hargo.quota:{seed}:{e}:{t}")`` (kept in order without ``shuffle``); chunk
    ``c`` is rows ``c*quota[t] .. (c+1)*quota[t]-1`` of each task's order, the tasks in
    ``quota``'s order. An epoch has ``min_t n_t // quota[t]`` chunks (over tasks with a quota
    > 0; ``n_t`` the task's rows); the rest of a task's rows wait for a later epoch's order.
    Repeats and chunking are the parent's (each index ``mini_repeat_count`` times in a row,
    each chunk ``repeat_count`` times).

    Args:
        tasks: the task of every dataset row (``len(data_source)`` names).
        quota: task -> prompts per chunk (0: none of the task), summing to ``batch_size``.
        (the rest): :class:`EpochRepeatSampler`'s.

    Raises:
        ValueError: ``tasks`` of another length than the dataset; a quota that does not sum
            to ``batch_size``, names a task the dataset lacks, or exceeds a task's rows.
    """

    def __init__(self, data_source: Sized, mini_repeat_count: int, batch_size: int = 1,
                 repeat_count: int = 1, shuffle: bool = True, seed: int | None = None, *,
                 tasks: Sequence[str], quota: Mapping[str, int]):
        super().__init__(data_source, mini_repeat_count, batch_size=batch_size,
                         repeat_count=repeat_count, shuffle=shuffle, seed=seed)
        if len(tasks) != self.num_samples:
            raise ValueError(f"TaskQuotaSampler: {len(tasks)} task names for "
                             f"{self.num_samples} rows")
        self.quota = {t: int(n) for t, n in quota.items() if int(n) > 0}
        if sum(self.quota.values()) != batch_size:
            raise ValueError(f"TaskQuotaSampler: the quota {dict(quota)} sums to "
                             f"{sum(self.quota.values())}, not the {batch_size} prompts a step")
        self.rows = {t: [i for i, x in enumerate(tasks) if x == t] for t in self.quota}
        short = {t: n for t, n in self.quota.items() if n > len(self.rows[t])}
        if short:
            raise ValueError(f"TaskQuotaSampler: the quota {short} exceeds the task's rows "
                             f"{ {t: len(self.rows[t]) for t in short} }")
        self.chunks = min(len(self.rows[t]) // n for t, n in self.quota.items())

    def permutation(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s order: ``chunks * batch_size`` indices, each consecutive
        ``batch_size`` of them one chunk with the quota of every task (class docstring)."""
        order = {}
        for t, rows in self.rows.items():
            rows = list(rows)
            if self.shuffle:
                random.Random(f"hargo.quota:{self.base_seed}:{int(epoch)}:{t}").shuffle(rows)
            order[t] = rows
        return [i for c in range(self.chunks) for t, n in self.quota.items()
                for i in order[t][c * n:(c + 1) * n]]

    def __len__(self) -> int:
        return self.chunks * self.batch_size * self.mini_repeat_count * self.repeat_count
