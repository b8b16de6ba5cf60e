"""Per-task diagnostics of :class:`~hargo.training.grpo.HargoGRPOTrainer`: each response's task,
carried through TRL's batch as an index into ``trainer.task_names``, and the per-response KL,
clip fraction and advantage-weighted log-prob / log-ratio of each loss micro-batch, handed to
the recorder
(:class:`hargo.training.rl_logging.StepRecorder`) with those tasks. The weighting never reads
them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hargo.losses import (advantage_weighted_logprob, clip_fraction, importance_ratio, kl_penalty,
                          masked_mean)

if TYPE_CHECKING:
    from hargo.training.grpo import HargoGRPOTrainer

__all__ = ["dataset_tasks", "task_index", "record_loss_diagnostics"]


def dataset_tasks(dataset, task_column: str) -> list[str]:
    """The sorted task names in ``dataset``'s ``task_column``; ``["all"]`` when it has none."""
    tasks = []
    if dataset is not None and task_column in getattr(dataset, "column_names", []):
        tasks = sorted({str(t) for t in dataset[task_column]})
    return tasks or ["all"]


def task_index(task_names: list[str], task) -> int:
    """The index of ``task`` (None counts as ``"all"``) in ``task_names``, appended when new."""
    name = "all" if task is None else str(task)
    if name not in task_names:
        task_names.append(name)
    return task_names.index(name)


def record_loss_diagnostics(trainer: HargoGRPOTrainer, inputs: dict) -> None:
    """Per response of ``trainer``'s micro-batch ``inputs`` (from the policy log-probs its loss
    forward captured): KL (k3, token-averaged), clip fraction, the advantage-weighted log-prob
    ``G w_i mean_t A_i log pi(y_t)`` (the surrogate's gradient-carrying part,
    :func:`~hargo.losses.advantage_weighted_logprob`) and, when a reference ran, the
    advantage-weighted log-ratio ``G w_i mean_t A_i (log pi - log pi_ref)(y_t)``; gathered from all
    processes and handed to the recorder with the responses' tasks."""
    logps = trainer._captured_logps
    if logps is None or "task_ids" not in inputs:
        return
    mask = trainer._loss_mask(inputs)
    ref = inputs.get("ref_per_token_logps")
    kl = None if ref is None else masked_mean(kl_penalty(logps, ref, "k3"), mask)
    weights = inputs.get("response_weights")
    G = trainer.num_generations
    adv_logp = advantage_weighted_logprob(logps, inputs["advantages"], mask, weights, G)
    adv_lr = None if ref is None else advantage_weighted_logprob(logps - ref, inputs["advantages"],
                                                                 mask, weights, G)
    old = inputs.get("old_per_token_logps")
    ratio = importance_ratio(logps, logps if old is None else old)
    _, _, clipped = clip_fraction(ratio, inputs["advantages"], trainer.epsilon_low,
                                  trainer.epsilon_high, trainer.args.delta)
    clip = trainer.accelerator.gather(masked_mean(clipped.float(), mask))
    task_ids = trainer.accelerator.gather(inputs["task_ids"])
    gather = lambda x: None if x is None else trainer.accelerator.gather(x).tolist()  # noqa: E731
    kl, adv_logp, adv_lr = gather(kl), gather(adv_logp), gather(adv_lr)
    if trainer.recorder is not None:
        trainer.recorder.add_loss(tasks=[trainer.task_names[i] for i in task_ids.tolist()],
                                  kl=kl, clip_fraction=clip.tolist(), adv_logprob=adv_logp,
                                  adv_log_ratio=adv_lr)
