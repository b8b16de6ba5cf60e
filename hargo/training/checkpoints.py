"""The RL trainers' checkpoint folders: transformers' ``checkpoint-N`` plus hargo's
``method_state.json`` (written by
:meth:`hargo.training.resume.ResumeMixin.write_method_state`, read back on resume),
and the rule for resuming: ``checkpoints/rl/<method>/run_fingerprint.json`` records what the run
was started with (:func:`run_fingerprint`); a stage resumes only a checkpoint of the same
fingerprint that is short of ``rl.steps`` (:func:`resumable_checkpoint`), and otherwise starts
over in an emptied folder (:func:`prepare_checkpoint_dir`).

A folder is complete when it holds both ``method_state.json`` (written first) and
``trainer_state.json`` (written by transformers last); :func:`last_checkpoint` only ever returns a
complete one, so an interrupted save is never resumed from.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hargo.config import params_dict
from hargo.io import atomic_write_json, sha256_files
from hargo.methods import RL_FAMILIES, method_names

if TYPE_CHECKING:
    from hargo.config import Config

__all__ = ["METHOD_STATE_NAME", "TRAINER_STATE_NAME", "FINGERPRINT_NAME", "is_complete_checkpoint",
           "last_checkpoint", "read_method_state", "checkpoint_step", "run_fingerprint", "resumable_checkpoint",
           "prepare_checkpoint_dir"]

#: File written into every checkpoint folder next to TRL's/transformers' files.
METHOD_STATE_NAME = "method_state.json"
TRAINER_STATE_NAME = "trainer_state.json"
#: ``checkpoints/rl/<method>/run_fingerprint.json``: what the checkpoints there were trained from.
FINGERPRINT_NAME = "run_fingerprint.json"
# rl.* keys that do not change what is trained (left out of the fingerprint)
_NON_TRAINING_KEYS = ("methods", "out_dir", "save_steps", "log_completions_steps",
                      "vllm_server")   # where the server runs, not what it computes


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


def _digest_files(paths) -> str:
    return sha256_files(paths)


def run_fingerprint(params: "Config", method: str, model_dir: str | os.PathLike,
                    data_path: str | os.PathLike) -> dict:
    """What a checkpoint must agree with to be resumed: the method, the params that shape
    training (seed, train.*, rewards.*, rl.* except methods/out_dir/save_steps/
    log_completions_steps/vllm_server and the other methods' blocks) and digests of the SFT
    model's files and of the train data.

    Args:
        params: the typed config (:class:`hargo.config.Config`); its sections are recorded as
            its params mapping has them (:func:`hargo.config.params_dict`).
        method: the RL method (``rl.<method>`` is kept, the other methods' blocks are not).
        model_dir: the SFT model folder (its ``*.safetensors``, ``*.json`` and ``*.bin`` are
            hashed).
        data_path: the train split file (hashed).

    Returns:
        A JSON-able dict ``{"method", "seed", "train", "rewards", "rl", "model_sha256",
        "data_sha256"}`` (written beside the checkpoints; compared by equality).

    Raises:
        FileNotFoundError: ``model_dir`` or ``data_path`` is missing."""
    # Deliberately the params *mapping* (params_dict), not the typed config: the fingerprint
    # records the sections as params.yaml spells them, so it stays comparable with fingerprints
    # already written next to checkpoints, and a typed field added with a default does not
    # make every existing checkpoint stale. These string keys are the file's, not reads of knobs.
    pd = params_dict(params)
    other = method_names(*RL_FAMILIES)     # the registered RL methods' rl.<method> blocks
    rl = {k: v for k, v in pd["rl"].items()
          if k not in _NON_TRAINING_KEYS and (k == method or k not in other)}
    model_files = [p for p in Path(model_dir).iterdir()
                   if p.is_file() and p.suffix in (".safetensors", ".json", ".bin")]
    return {"method": method, "seed": pd["seed"], "train": pd["train"],
            "rewards": pd.get("rewards"), "rl": rl,
            "model_sha256": _digest_files(model_files),
            "data_sha256": _digest_files([Path(data_path)])}


def checkpoint_step(ckpt: Path) -> int:
    """``global_step`` of a complete checkpoint (its ``trainer_state.json``)."""
    return int(json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def resumable_checkpoint(ckpt_dir: Path, fingerprint: dict) -> Path | None:
    """The last complete checkpoint in ``ckpt_dir`` when its fingerprint file equals
    ``fingerprint`` and it is short of ``rl.steps`` (an interrupted run), else None (reads only).

    A checkpoint at the final step belongs to a run that finished: DVC re-runs such a stage only
    when something it depends on changed (code, another param), so it starts over instead of
    resuming (transformers would otherwise train one step past ``max_steps``)."""
    fp_path = ckpt_dir / FINGERPRINT_NAME
    old = None
    if fp_path.is_file():
        try:
            old = json.loads(fp_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            old = None
    if old != json.loads(json.dumps(fingerprint)):
        return None
    ckpt = last_checkpoint(ckpt_dir)
    if ckpt is None or checkpoint_step(ckpt) >= int(fingerprint["rl"]["steps"]):
        return None
    return ckpt


def prepare_checkpoint_dir(ckpt_dir: Path, fingerprint: dict, log=print):
    """Return the checkpoint to resume from (or None), after clearing stale or finished
    checkpoints and writing ``fingerprint`` (main process only: it writes)."""
    fp_path = ckpt_dir / FINGERPRINT_NAME
    ckpt = resumable_checkpoint(ckpt_dir, fingerprint)
    if ckpt is None:
        if ckpt_dir.exists() and any(ckpt_dir.iterdir()):
            log(f"[rl] {ckpt_dir}: no resumable checkpoint for these inputs (changed, or the run "
                "had finished); starting over")
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(fp_path, fingerprint)
    else:
        log(f"[rl] resuming from {ckpt}")
    return ckpt
