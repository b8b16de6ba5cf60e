"""How a training stage was launched: one process, or N under ``accelerate launch`` / ``torchrun``.

A stage launched N times (``accelerate launch --num_processes N -m hargo.cli rl --method M``,
or ``python -m torch.distributed.run --nproc_per_node N -m hargo.cli ...``) trains on every
process, but only the main process opens the MLflow stage run, writes files (checkpoint
fingerprint, merged model, metrics) and prints the summary; see ``hargo.training.rl.run`` and
``hargo.training.sft.run``.

On a host without GPUs (gloo), launch with torchrun or ``accelerate launch --multi_gpu
--num_processes N``: accelerate 1.15's ``launch --cpu --num_processes N`` starts one process
only (its multi-CPU launch goes through mpirun).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LaunchState", "launch_state"]


@dataclass(frozen=True)
class LaunchState:
    """``num_processes`` (the launcher's world size, >= 1) and this process's ``process_index``
    (0 .. num_processes - 1; 0 is the main process)."""

    num_processes: int = 1
    process_index: int = 0

    @property
    def is_main(self) -> bool:
        """True on the process that logs and writes (index 0)."""
        return self.process_index == 0

    def wait_for_everyone(self) -> None:
        """Barrier over all processes (``torch.distributed.barrier``); a no-op on one process."""
        if self.num_processes <= 1:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()


def launch_state() -> LaunchState:
    """This process's launch state.

    One process (``$WORLD_SIZE`` unset or 1): ``LaunchState(1, 0)``, nothing is initialized.
    Several: accelerate's ``PartialState`` is created, which joins the process group the
    launcher set up (gloo on a host without CUDA or under ``accelerate launch --cpu``, nccl on
    GPUs) -- the same state the trainers'
    ``TrainingArguments`` build later (they re-create it and reuse the process group), so
    barriers work before a trainer exists.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return LaunchState()
    from accelerate import PartialState

    from hargo.hardware import detect_profile

    cpu = detect_profile().on_cpu or \
        os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")  # launch --cpu
    state = PartialState(cpu=cpu)
    return LaunchState(int(state.num_processes), int(state.process_index))
