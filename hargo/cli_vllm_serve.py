"""``hargo vllm-serve``'s steps; the command itself (its options, help text and order of steps)
is :func:`hargo.cli.vllm_serve`. Here: the one address the server may bind, the ``vllm serve``
command line for the SFT model the rl stage starts from, and replacing this process with it.
A refusal is one red line on stderr and exit 2 (a wildcard host, no ``rl.vllm_server``) or 1
(no SFT model yet), as in every command.

Imports (inside the functions): :mod:`hargo.config`, :mod:`hargo.training.rl` and
:mod:`hargo.training.vllm_rollout`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from hargo.config import Config

__all__ = ["serve_host", "serve_plan", "exec_server"]


def serve_host(host: str) -> str:
    """``host`` as the server may bind it (:func:`hargo.training.vllm_rollout.check_serve_host`:
    one address, never a wildcard).

    Raises:
        typer.Exit: code 2, after one red ``error: ...`` line."""
    from hargo.training.vllm_rollout import check_serve_host

    try:
        return check_serve_host(host)
    except ValueError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2)


def serve_plan(p: "Config", params: str, host: str, tensor_parallel_size: int,
               data_parallel_size: int) -> tuple[list[str], str]:
    """(the ``vllm serve`` command, ``sft.out_dir``) for the typed config ``p`` read
    from the file ``params``: the SFT model served on ``rl.vllm_server.port`` at ``host``
    (:func:`hargo.training.vllm_rollout.serve_command`), its context the rl stage's
    (:func:`hargo.training.rl.vllm_max_len`).

    Raises:
        typer.Exit: code 2 when ``params`` sets no ``rl.vllm_server``, after one red line."""
    from hargo.training.rl import vllm_max_len
    from hargo.training.vllm_rollout import serve_command

    cfg = p
    if cfg.rl.vllm_server is None:
        typer.secho(f"error: rl.vllm_server: not set in {params} (hargo vllm-serve serves on "
                    "rl.vllm_server.port; give rl.vllm_server its host, port and timeout)",
                    fg="red", err=True)
        raise typer.Exit(2)
    sft_dir = cfg.sft.out_dir
    cmd = serve_command(sft_dir, cfg.rl.vllm_server.port, host=host,
                        tensor_parallel_size=tensor_parallel_size,
                        data_parallel_size=data_parallel_size, max_model_len=vllm_max_len(p))
    return cmd, sft_dir


def exec_server(cmd: list[str], sft_dir: str) -> None:
    """Replace this process with ``cmd`` (``VLLM_SERVER_DEV_MODE=1`` in its environment: TRL's
    weight-transfer endpoints), once ``sft_dir`` holds a model.

    Raises:
        typer.Exit: code 1 when ``sft_dir`` has no ``config.json``, after one red line."""
    import os

    if not Path(sft_dir, "config.json").is_file():
        typer.secho(f"error: sft.out_dir: no model at {sft_dir} (run the sft stage "
                    "or dvc pull first)", fg="red", err=True)
        raise typer.Exit(1)
    os.execve(cmd[0], cmd, {**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
