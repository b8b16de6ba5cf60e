"""Per-task diagnostics of :class:`~hargo.training.grpo.HargoGRPOTrainer`: each response's task,
carried through TRL's batch as an index into ``trainer.task_names``, and the per-response KL and
clip fraction of each loss micro-batch, handed to the recorder
(:class:`hargo.training.rl_logging.StepRecorder`) with those tasks. The weighting never reads
them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hargo.losses import clip_fraction, importance_ratio, kl_penalty, masked_mean

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
    """Per-response KL (k3, token-averaged) and clip fraction of ``trainer``'s micro-batch
    ``inputs`` (from the policy log-probs its loss forward captured), gathered from all processes
    and handed to the recorder with the responses' tasks."""
    logps = trainer._captured_logps
    if logps is None or "task_ids" not in inputs:
        return
    mask = trainer._loss_mask(inputs)
    ref = inputs.get("ref_per_token_logps")
    kl = None if ref is None else masked_mean(kl_penalty(logps, ref, "k3"), mask)
    old = inputs.get("old_per_token_logps")
    ratio = importance_ratio(logps, logps if old is None else old)
    _, _, clipped = clip_fraction(ratio, inputs["advantages"], trainer.epsilon_low,
                                  trainer.epsilon_high, trainer.args.delta)
    clip = trainer.accelerator.gather(masked_mean(clipped.float(), mask))
    task_ids = trainer.accelerator.gather(inputs["task_ids"])
    if kl is not None:
        kl = trainer.accelerator.gather(kl)
    if trainer.recorder is not None:
        trainer.recorder.add_loss(tasks=[trainer.task_names[i] for i in task_ids.tolist()],
                                  kl=None if kl is None else kl.tolist(),
                                  clip_fraction=clip.tolist())
