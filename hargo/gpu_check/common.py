"""Pieces every part of the GPU check uses: the run's constants, JSON output, the log line,
hiding the packages the GPU machine lacks, the time budget (:class:`Deadline` and a trainer
callback that honours it) and memory bookkeeping."""
from __future__ import annotations

import gc
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

#: The repository root (params.yaml, data/prepared).
ROOT = Path(__file__).resolve().parents[2]

PARTS = ("correctness", "speed", "compare")
#: Most of the time budget each of the first two parts may take (seconds and share of the
#: budget, whichever is smaller); the comparison gets the rest.
PART_CAPS = {"correctness": (120.0, 0.2), "speed": (150.0, 0.2)}
#: Seconds kept back for the figures and the last writes.
RESERVE_S = 15.0
#: Python packages the GPU machine does not have (the dry run hides them, so it runs as there).
BOX_MISSING = ("mlflow", "prefect", "dvc", "great_expectations", "vllm")
#: Everything written into --out (the device machine returns at most 8 files).
OUTPUT_FILES = ("results.json", "tracking.jsonl", "gpu_check.log", "speed.png", "compare.png",
                "generations.jsonl.gz")


# ------------------------------------------------------------------------------ small pieces

def _now() -> float:
    return time.monotonic()


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _clean(x):
    """JSON-safe copy: NaN/inf floats become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, default=_json_default) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def hide_packages(names: Sequence[str] = BOX_MISSING) -> list[str]:
    """Make ``names`` unimportable in this process (``sys.modules[name] = None``: ``import``
    raises ImportError and ``importlib.util.find_spec`` answers None), as on the GPU machine.
    Returns the names hidden (those not already imported)."""
    hidden = []
    for n in names:
        if n not in sys.modules:
            sys.modules[n] = None  # type: ignore[assignment]
            hidden.append(n)
    return hidden


class Deadline:
    """The run's time budget: ``left()`` seconds remain until ``end`` (monotonic clock)."""

    def __init__(self, budget_s: float):
        self.start = _now()
        self.budget_s = float(budget_s)
        self.end = self.start + self.budget_s

    def left(self) -> float:
        return self.end - _now()

    def elapsed(self) -> float:
        return _now() - self.start


def _deadline_callback(end: float):
    """A transformers callback that stops training after the step during which ``end``
    (monotonic) passed, and says so in ``.stopped``."""
    from transformers import TrainerCallback

    class DeadlineCallback(TrainerCallback):
        stopped = False

        def on_step_end(self, args, state, control, **kwargs):
            if _now() >= end and state.global_step < state.max_steps:
                control.should_training_stop = True
                self.stopped = True
            return control

    return DeadlineCallback()


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _peak_gpu_mib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / (1 << 20), 1)


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_rss_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _environment() -> dict:
    import importlib.metadata as md

    env: dict[str, Any] = {"python": platform.python_version(), "host": platform.node(),
                           "machine": platform.machine()}
    for pkg in ("torch", "transformers", "trl", "peft", "accelerate", "datasets",
                "sentence-transformers", "huggingface-hub", "gguf", "numpy"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    try:
        import torch

        env["cuda"] = torch.cuda.is_available()
        if env["cuda"]:
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_memory_mib"] = round(torch.cuda.get_device_properties(0).total_memory
                                          / (1 << 20))
            env["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
        env["torch_threads"] = torch.get_num_threads()
    except Exception as e:  # informational
        env["torch_error"] = repr(e)
    try:
        from hargo.hardware import describe_cpu

        env["cpu"] = describe_cpu()
    except Exception:
        pass
    return env
