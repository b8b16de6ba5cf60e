"""TRL's scored batches in :class:`hargo.training.grpo.HargoGRPOTrainer`, and dynamic sampling
over them (:mod:`hargo.training.dynamic_sampling`, DAPO): the step's own batch is scored by TRL,
its zero-variance groups dropped and refilled from the prompt pool, and the kept groups joined
into one batch of the step's size before hargo's estimator runs on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object

from hargo.training.dynamic_sampling import (draw_refill_indices, informative_groups, join_rows,
                                             refill_prompt_count, select_groups)

__all__ = ["DynamicSamplingMixin"]


class DynamicSamplingMixin:
    """Scoring one training batch with TRL and dynamic sampling over such batches, for a
    :class:`~hargo.training.grpo.HargoGRPOTrainer` (which provides TRL's attributes and
    ``task_column``, ``task_budgets``, ``dynamic_sampling``, ``_row_budgets``,
    ``_prompt_rows`` and ``_gathered_rewards_per_func``)."""

    def _scored_batch(self, inputs: list) -> "_ScoredBatch":
        """TRL's ``_generate_and_score_completions`` on ``inputs`` (training), with the gathered
        rewards per function and the gathered prompt and completion texts of exactly this call
        (:meth:`~hargo.training.trl_overrides.GRPOOverrides.scored_with_logged_texts`: TRL's
        logged texts are bounded by one generation batch; a refill can be larger)."""
        self._gathered_rewards_per_func = None
        if self.task_budgets is not None:
            from hargo.generation_budget import row_budgets

            self._row_budgets = row_budgets(
                self.task_budgets, [str(x.get(self.task_column)) for x in inputs],
                "rl.max_new_tokens")
        try:
            output, *texts = self.scored_with_logged_texts(inputs)
        finally:
            self._row_budgets = None
        return _ScoredBatch(list(inputs), output, self._gathered_rewards_per_func, *texts)

    def _combined_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """(B,) rewards from (B, n_funcs), combined as TRL does ("sum_then_normalize")."""
        rpf = rewards_per_func
        out = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        out[torch.isnan(rpf).all(dim=1)] = float("nan")
        return out

    def _refill_rows(self, n: int, round_: int, used: list) -> list[int]:
        """Train-split rows of a refill round (``draw_refill_indices``), avoiding the prompts in
        ``used`` (dataset rows)."""
        if self._prompt_rows is None:
            self._prompt_rows = {}
            for i, row in enumerate(self.train_dataset):
                self._prompt_rows.setdefault(_prompt_key(row["prompt"]), []).append(i)
        exclude = sorted({i for x in used for i in self._prompt_rows.get(_prompt_key(x["prompt"]),
                                                                          [])})
        return draw_refill_indices(len(self.train_dataset), n, seed=int(self.args.seed),
                                   step=int(self.state.global_step), round_=round_,
                                   process=self.accelerator.process_index, exclude=exclude)

    def _dynamic_sampling(self, own: "_ScoredBatch") -> tuple["_ScoredBatch", dict]:
        """Drop the zero-variance groups of the step and refill it (``hargo.training.
        dynamic_sampling``, DAPO). Returns the batch the step trains on (same size as ``own``) and
        what was sampled, per group of all processes: ``tasks``, ``zero_variance``, ``kept``,
        ``refill`` (for the recorder).

        Every process runs the same number of refill rounds of the same size (TRL gathers inside
        each call): a round runs while any process misses informative groups."""
        G, world = self.num_generations, self.accelerator.num_processes
        rank = self.accelerator.process_index
        cfg = self.dynamic_sampling
        batches = [own]
        flags = [informative_groups(self._combined_rewards(own.rewards_per_func), G).tolist()]
        needed = own.output["completion_ids"].size(0) // G

        def local(flag_list: list, n_local: int, p: int) -> list:
            return flag_list[p * n_local:(p + 1) * n_local]

        for round_ in range(1, cfg.max_refills + 1):
            have = [sum(sum(local(f, len(f) // world, p)) for f in flags) for p in range(world)]
            missing = max(needed - h for h in have)
            if missing <= 0:
                break
            n = refill_prompt_count(missing, cfg.refill_factor)
            used = [x for b in batches for x in b.inputs[::G]]
            rows = self._refill_rows(n, round_, used)
            extra = [dict(self.train_dataset[i]) for i in rows for _ in range(G)]
            batch = self._scored_batch(extra)
            batches.append(batch)
            flags.append(informative_groups(self._combined_rewards(batch.rewards_per_func),
                                            G).tolist())

        local_flags = [local(f, len(f) // world, rank) for f in flags]
        sel = select_groups(local_flags, needed)
        kept = set(sel.keep)
        tasks_local = [[str(x.get(self.task_column, "all")) for x in b.inputs[::G]]
                       for b in batches]
        sampled_local = [(tasks_local[b][i], not local_flags[b][i], (b, i) in kept, b > 0)
                         for b in range(len(batches)) for i in range(len(local_flags[b]))]
        sampled_all = [s for part in gather_object([sampled_local]) for s in part]
        sampled = {k: [s[j] for s in sampled_all]
                   for j, k in enumerate(("tasks", "zero_variance", "kept", "refill"))}
        if len(batches) == 1 and sel.keep == [(0, i) for i in range(needed)]:
            return own, sampled   # nothing dropped: the step's own batch, untouched

        rows = [(b, i * G + j) for b, i in sel.keep for j in range(G)]
        joined = join_rows([b.output for b in batches], rows,
                           pad_token_id=int(_tokenizer(self.processing_class).pad_token_id
                                            or 0))
        mask = self._loss_mask(joined)
        joined["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        inputs = [batches[b].inputs[r] for b, r in rows]

        def local_rows(b: int) -> slice:
            n = batches[b].output["completion_ids"].size(0)
            return slice(rank * n, (rank + 1) * n)

        rpf_local = torch.stack([batches[b].rewards_per_func[local_rows(b)][r] for b, r in rows])
        texts = []
        for attr in ("prompts", "completions"):
            mine = [getattr(batches[b], attr)[local_rows(b)][r] for b, r in rows] \
                if all(len(getattr(x, attr)) == x.rewards_per_func.size(0) for x in batches) \
                else []
            texts.append([t for part in gather_object([mine]) for t in part])
        return _ScoredBatch(inputs, joined, self.accelerator.gather(rpf_local), *texts), sampled


@dataclass
class _ScoredBatch:
    """One call of TRL's ``_generate_and_score_completions`` in training: this process's
    ``inputs`` rows and ``output`` (B_local rows), and, gathered from every process,
    ``rewards_per_func`` (B_total, n_funcs) and the prompt and completion texts."""

    inputs: list
    output: dict
    rewards_per_func: torch.Tensor
    prompts: list
    completions: list


def _prompt_key(prompt: Any) -> str:
    """A hashable identity of a dataset prompt (text, or a chat as JSON)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def _tokenizer(processing_class):
    """The tokenizer of the trainer's public ``processing_class`` (a processor's own), as TRL 1.16
    resolves its private ``_tokenizer`` (GRPOTrainer accepts a tokenizer or a processor)."""
    from transformers import ProcessorMixin

    if isinstance(processing_class, ProcessorMixin):
        return processing_class.tokenizer
    return processing_class
