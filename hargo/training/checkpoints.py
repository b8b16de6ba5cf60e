"""The RL trainers' checkpoint folders: transformers' ``checkpoint-N`` plus hargo's
``method_state.json`` (written by ``HargoGRPOTrainer._save_checkpoint``, read back on resume).

A folder is complete when it holds both ``method_state.json`` (written first) and
``trainer_state.json`` (written by transformers last); :func:`last_checkpoint` only ever returns a
complete one, so an interrupted save is never resumed from.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

__all__ = ["METHOD_STATE_NAME", "TRAINER_STATE_NAME", "is_complete_checkpoint",
           "last_checkpoint", "read_method_state"]

#: File written into every checkpoint folder next to TRL's/transformers' files.
METHOD_STATE_NAME = "method_state.json"
TRAINER_STATE_NAME = "trainer_state.json"


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """A ``checkpoint-N`` folder is complete when it holds ``method_state.json`` (written first) and
    ``trainer_state.json`` (written by transformers after the weights, optimizer and RNG)."""
    p = Path(path)
    return (p / METHOD_STATE_NAME).is_file() and (p / TRAINER_STATE_NAME).is_file()


def last_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The complete ``checkpoint-N`` folder with the largest N under ``output_dir``, or None."""
    d = Path(output_dir)
    if not d.is_dir():
        return None
    found = []
    for p in d.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = p.name[len(PREFIX_CHECKPOINT_DIR) + 1:]
        if suffix.isdigit() and p.is_dir() and is_complete_checkpoint(p):
            found.append((int(suffix), p))
    return max(found)[1] if found else None


def read_method_state(checkpoint: str | os.PathLike) -> dict:
    """Read ``method_state.json`` of a checkpoint folder.

    Raises:
        FileNotFoundError: the file is missing (the checkpoint is incomplete).
        ValueError: not valid JSON or not an object (names the file).
    """
    path = Path(checkpoint) / METHOD_STATE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; checkpoint {checkpoint} is incomplete")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg})") from e
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return state
