"""How a training stage was launched: one process, or N under ``accelerate launch`` / ``torchrun``.

A stage launched N times (``accelerate launch --num_processes N -m hargo.cli rl --method M``,
or ``python -m torch.distributed.run --nproc_per_node N -m hargo.cli ...``) trains on every
process, but only the main process opens the MLflow stage run, writes files (checkpoint
fingerprint, merged model, metrics) and prints the summary; see ``hargo.training.rl.run`` and
``hargo.training.sft.run``.

The shipped launch configs are ``configs/accelerate/{multi_gpu,deepspeed_zero2,
deepspeed_zero3,fsdp2}.yaml``; one launch form serves every training stage (docs/gpu.md)::

    accelerate launch --config_file configs/accelerate/<x>.yaml -m hargo.cli rl --method hargo

A stage started plainly (``hargo rl ...``, as ``dvc repro`` and the Prefect flows do) re-launches
itself that way when ``$HARGO_ACCELERATE_CONFIG`` names a config file
(:func:`accelerate_relaunch`; the Prefect ``gpu`` pool sets it), so DVC's stage commands stay
the same on one process or N.

On a host without GPUs (gloo), launch with ``--config_file configs/accelerate/multi_gpu.yaml
--num_processes N`` (or torchrun): accelerate 1.15's ``launch --cpu --num_processes N`` starts
one process only (its multi-CPU launch goes through mpirun).
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["LaunchState", "launch_state", "accelerate_relaunch", "ACCELERATE_CONFIG_ENV",
           "ACCELERATE_ARGS_ENV", "TRAINING_STAGES"]

#: Names the accelerate config a plainly started training stage re-launches itself under.
ACCELERATE_CONFIG_ENV = "HARGO_ACCELERATE_CONFIG"
#: Further ``accelerate launch`` arguments (shell words), e.g. ``--num_processes 4``.
ACCELERATE_ARGS_ENV = "HARGO_ACCELERATE_ARGS"
#: The ``hargo`` subcommands that train (and so may run on several processes).
TRAINING_STAGES = ("sft", "rl", "compare-train")


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


def accelerate_relaunch(argv: Sequence[str], env: Mapping[str, str] | None = None,
                        gpus: int | None = None) -> list[str] | None:
    """The command that re-runs ``hargo <argv>`` under accelerate, or None to run it here.

    ``argv``: the ``hargo`` arguments (``["rl", "--method", "hargo", ...]``); ``env`` defaults
    to ``os.environ``. Returns ``[python, -m, accelerate.commands.launch, --config_file
    $HARGO_ACCELERATE_CONFIG, *$HARGO_ACCELERATE_ARGS, -m, hargo.cli, *argv]`` when
    :data:`ACCELERATE_CONFIG_ENV` is set and non-empty, ``argv[0]`` is one of
    :data:`TRAINING_STAGES`, and this process is not already one of a launch (no ``WORLD_SIZE``
    or ``LOCAL_RANK``). ``--num_processes`` is added as ``gpus`` (default: the visible CUDA
    devices) when the extra arguments give none and ``gpus >= 1``; otherwise the config's own
    ``num_processes`` holds.

    Raises:
        FileNotFoundError: the named config file does not exist (the message names the variable).
    """
    env = os.environ if env is None else env
    config = (env.get(ACCELERATE_CONFIG_ENV) or "").strip()
    if not config or not argv or argv[0] not in TRAINING_STAGES:
        return None
    if "WORLD_SIZE" in env or "LOCAL_RANK" in env:
        return None
    if not os.path.isfile(config):
        raise FileNotFoundError(f"${ACCELERATE_CONFIG_ENV}: no accelerate config at {config!r} "
                                "(the shipped ones are configs/accelerate/*.yaml)")
    extra = shlex.split(env.get(ACCELERATE_ARGS_ENV, ""))
    if not any(a == "--num_processes" or a.startswith("--num_processes=") for a in extra):
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus >= 1:
            extra = ["--num_processes", str(gpus), *extra]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
            *extra, "-m", "hargo.cli", *argv]
