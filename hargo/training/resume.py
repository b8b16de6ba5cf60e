"""Resuming an RL run exactly: the prompt order and hargo's method state across checkpoints.

:class:`ResumeMixin` goes before TRL's ``GRPOTrainer`` in :class:`hargo.training.grpo.
HargoGRPOTrainer`'s bases. It overrides these *private* methods of TRL 1.16 / transformers 5.19
(both pinned in ``pyproject.toml``; re-read them before moving a pin):

``_get_train_sampler`` / ``_run_epoch`` (the latter transformers 5.19's ``Trainer``)
    TRL's prompt order from :class:`hargo.training.sampling.EpochRepeatSampler`, whose epoch is
    set at the start of every epoch (``_run_epoch``'s ``epoch`` argument), so a run resumed at or
    after an epoch boundary continues the uninterrupted run's order instead of repeating the
    first epoch's (see that module). With ``prompt_quota`` set (before ``train()``), a
    :class:`hargo.training.sampling.TaskQuotaSampler`: every step that many prompts of each
    task.
``_save_checkpoint`` / ``_load_optimizer_and_scheduler``
    also write/read ``method_state.json`` (EMA baseline, per-step history) in every checkpoint,
    the same hooks TRL 1.16 uses for its adaptive-entropy state.

The class it is mixed into provides ``method`` (str), ``ema`` (an object with ``state_dict`` /
``load_state_dict``), ``recorder`` (None or such an object) and ``task_column`` (the dataset column
naming a row's task, read with ``prompt_quota``). Which checkpoint a stage resumes
from is decided in :mod:`hargo.training.checkpoints`. Tested in ``tests/test_rl.py``
(resume after any checkpoint equals the uninterrupted run) and ``tests/test_rl_distributed.py``.
"""
from __future__ import annotations

from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hargo.io import atomic_write_json
from hargo.training.checkpoints import METHOD_STATE_NAME, read_method_state
from hargo.training.sampling import EpochRepeatSampler, TaskQuotaSampler

__all__ = ["ResumeMixin"]


class ResumeMixin:
    """Exact resume for a TRL ``GRPOTrainer`` subclass (see the module docstring)."""

    #: the sampler of the current run, set by :meth:`_get_train_sampler`
    _train_sampler: EpochRepeatSampler | None = None
    #: None, or task -> prompts of that task in every step (summing to the step's prompts),
    #: read from the dataset's ``task_column``; set it before ``train()`` (the synthetic test
    #: bed's ``synthetic.rl.prompts_per_step_per_task``)
    prompt_quota: dict[str, int] | None = None

    # ------------------------------------------------------------------ data order

    def _get_train_sampler(self, dataset=None) -> EpochRepeatSampler:
        """TRL 1.16's ``RepeatSampler`` arguments, as an :class:`EpochRepeatSampler` (the same
        order in an uninterrupted run; the right epoch's order after a resume)."""
        if dataset is None:
            dataset = self.train_dataset
        kw = dict(data_source=dataset, mini_repeat_count=self.num_generations,
                  batch_size=self.args.generation_batch_size // self.num_generations,
                  repeat_count=self.num_iterations * self.args.steps_per_generation,
                  shuffle=self.shuffle_dataset, seed=self.args.seed)
        if self.prompt_quota:
            sampler = TaskQuotaSampler(**kw, tasks=list(dataset[self.task_column]),
                                       quota=self.prompt_quota)
        else:
            sampler = EpochRepeatSampler(**kw)
        self._train_sampler = sampler
        return sampler

    def _run_epoch(self, *args, **kwargs):
        # transformers 5.19 calls this once per epoch with keyword ``epoch`` (the resumed one
        # first); accelerate's ``set_epoch`` does not reach the sampler through every wrapper
        # (several processes + the batch skip of a mid-epoch resume), so set it here.
        if self._train_sampler is not None:
            self._train_sampler.set_epoch(kwargs["epoch"])
        return super()._run_epoch(*args, **kwargs)

    # -------------------------------------------------------------------- checkpoints

    def method_state_dict(self) -> dict:
        """What ``method_state.json`` holds: method, EMA state, global step, recorder history."""
        state = {"method": self.method, "ema": self.ema.state_dict(),
                 "global_step": int(self.state.global_step)}
        if self.recorder is not None and hasattr(self.recorder, "state_dict"):
            state["recorder"] = self.recorder.state_dict()
        return state

    def load_method_state(self, state: dict) -> None:
        """Restore from :meth:`method_state_dict` output.

        Raises:
            ValueError: the checkpoint belongs to another method.
        """
        if state.get("method") != self.method:
            raise ValueError(f"checkpoint is for method {state.get('method')!r}, "
                             f"not {self.method!r}")
        self.ema.load_state_dict(state["ema"])
        if self.recorder is not None and "recorder" in state and hasattr(self.recorder,
                                                                          "load_state_dict"):
            self.recorder.load_state_dict(state["recorder"])

    def _save_checkpoint(self, model, trial):
        # method_state.json goes in first; transformers writes trainer_state.json last, so a folder
        # with both files is complete (see ``checkpoints.is_complete_checkpoint``).
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / \
                f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(folder / METHOD_STATE_NAME, self.method_state_dict())
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_method_state(read_method_state(checkpoint))
