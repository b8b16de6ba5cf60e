"""Resuming an RL run exactly: the prompt order and hargo's method state across checkpoints.

:class:`ResumeMixin` is among :class:`hargo.training.grpo.HargoGRPOTrainer`'s bases, before TRL's
``GRPOTrainer``. Its steps run through two private TRL 1.16 / transformers 5.19 methods
(both pinned in ``pyproject.toml``; the overrides sit in :class:`hargo.training.trl_overrides.
GRPOOverrides`) and two public hooks:

``_get_train_sampler`` -> :meth:`ResumeMixin.train_sampler`
    TRL's prompt order from :class:`hargo.training.sampling.EpochRepeatSampler`; with
    ``prompt_quota`` set (before ``train()``), a :class:`hargo.training.sampling.
    TaskQuotaSampler`: every step that many prompts of each task.
``TrainerCallback.on_epoch_begin`` -> :class:`SamplerEpochCallback`
    sets the sampler's epoch at the start of every epoch (transformers calls it right before
    the epoch's pass over the data), so a run resumed at or after an epoch boundary continues
    the uninterrupted run's order instead of repeating the first epoch's (see
    :mod:`hargo.training.sampling`); accelerate's ``set_epoch`` does not reach the sampler
    through every wrapper (several processes + the batch skip of a mid-epoch resume).
``_save_checkpoint`` -> :meth:`ResumeMixin.write_method_state`
    writes ``method_state.json`` (EMA baseline, per-step history) into every checkpoint before
    transformers writes its files (``trainer_state.json`` last).
``Trainer.train`` (public)
    restores ``method_state.json`` of the checkpoint a run resumes from before training starts.

The class it is mixed into provides ``method`` (str), ``ema`` (an object with ``state_dict`` /
``load_state_dict``), ``recorder`` (None or such an object) and ``task_column`` (the dataset column
naming a row's task, read with ``prompt_quota``). Which checkpoint a stage resumes
from is decided in :mod:`hargo.training.checkpoints`. Tested in ``tests/test_rl.py``
(resume after any checkpoint equals the uninterrupted run) and ``tests/test_rl_distributed.py``.
"""
from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from hargo.io import atomic_write_json
from hargo.training.checkpoints import METHOD_STATE_NAME, read_method_state
from hargo.training.sampling import EpochRepeatSampler, TaskQuotaSampler

__all__ = ["ResumeMixin", "SamplerEpochCallback"]


class SamplerEpochCallback(TrainerCallback):
    """Sets the trainer's sampler to the epoch about to run, at each ``on_epoch_begin``.

    transformers 5.19 calls ``on_epoch_begin`` right before each epoch's pass over the data
    (the resumed epoch first); ``state.epoch`` is then the number of epochs done (its fraction
    the share of the current one done, so ``int`` of it is the epoch index).

    Args:
        sampler: ``() -> sampler or None`` (the trainer's current sampler, which has
            ``set_epoch``).
    """

    def __init__(self, sampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        sampler = self.sampler()
        if sampler is not None:
            sampler.set_epoch(int(state.epoch or 0))


class ResumeMixin:
    """Exact resume for a TRL ``GRPOTrainer`` subclass (see the module docstring)."""

    #: the sampler of the current run, set by :meth:`train_sampler`
    _train_sampler: EpochRepeatSampler | None = None
    #: None, or task -> prompts of that task in every step (summing to the step's prompts),
    #: read from the dataset's ``task_column``; set it before ``train()`` (the synthetic test
    #: bed's ``synthetic.rl.prompts_per_step_per_task``)
    prompt_quota: dict[str, int] | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(SamplerEpochCallback(lambda: self._train_sampler))

    # ------------------------------------------------------------------ data order

    def train_sampler(self, dataset=None) -> EpochRepeatSampler:
        """TRL 1.16's ``RepeatSampler`` arguments, as an :class:`EpochRepeatSampler` (the same
        order in an uninterrupted run; the right epoch's order after a resume) over ``dataset``
        (None: the train dataset); kept as the run's sampler."""
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

    def write_method_state(self, run_dir) -> None:
        """Write ``method_state.json`` into the checkpoint folder of the current step under
        ``run_dir`` (the run's output folder, as transformers resolves it for the checkpoint)
        (main process only). It goes in first; transformers writes ``trainer_state.json`` last,
        so a folder with both files is complete (see ``checkpoints.is_complete_checkpoint``)."""
        if self.args.should_save:
            folder = Path(run_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(folder / METHOD_STATE_NAME, self.method_state_dict())

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``, after restoring ``method_state.json`` (EMA baseline, per-step
        history, a subclass's own state) of the checkpoint it resumes from (a path, or True:
        the last in ``args.output_dir``, as transformers resolves it).

        Raises:
            ValueError: the checkpoint belongs to another method.
            FileNotFoundError: the checkpoint has no ``method_state.json``.
        """
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):
            checkpoint = get_last_checkpoint(self.args.output_dir) if checkpoint else None
        if checkpoint is not None:
            self.load_method_state(read_method_state(checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)
