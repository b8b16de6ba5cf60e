"""Per-step, per-task diagnostics of an RL run: collected from the trainer, logged to MLflow,
printed as one line per step, and drawn as plots at the end.

The trainer (``hargo.training.grpo.HargoGRPOTrainer``) hands the :class:`StepRecorder` the
gathered per-response values of each step together with each response's task; the task is used
here, for splitting the diagnostics, and never by the weighting. :class:`RLLoggingCallback` turns
each finished step into MLflow metrics named ``<scope>/<metric>`` where scope is a task
(``race_c``, ``race_fortran``, ``mlperf``, ``plp``) or ``all``:

=========================  ================================================================
metric                     meaning (per step, over that scope's completions)
=========================  ================================================================
reward_mean, reward_std    task reward, population std
accuracy                   share of completions counted correct (:func:`is_correct`)
completion_length          completion tokens (padding excluded)
advantage_mean             advantage put into the surrogate (HARGO: ``M_i``)
weight_mean, weight_max    per-response loss weight ``w_i`` (GRPO family: 1/G)
confidence_mean            reference confidence ``c_i`` (hargo, hargo_b2)
ref_logprob_mean           ``l_i``, reference log-prob per token at T = 1 (hargo, hargo_b2)
kl                         k3 KL(policy || reference) per token, averaged per response
                           (when a reference ran: beta > 0, or hargo/hargo_b2)
clip_fraction              share of tokens whose ratio was clipped
adv_logprob                advantage-weighted policy log-prob ``G w_i mean_t A_i log pi``:
                           the surrogate's gradient-carrying part, as a value (the loss's
                           policy gradient is minus its gradient, see below)
adv_log_ratio              ``G w_i mean_t A_i (log pi - log pi_ref)`` (when a reference ran):
                           0 at the start, grows as the policy favours the better responses
update_mass                ``sum_i w_i |A_i|`` over the scope's completions: how much of
                           the step's update the scope drives (HARGO's weights move it
                           between tasks; GRPO's are 1/G). PPO records the mean of its
                           per-token advantages, whose signs cancel: not its update mass
update_mass_share          the task's ``update_mass`` / the step's (tasks only; NaN when the
                           step's mass is 0, e.g. every group zero-variance)
zero_variance_groups       share of groups (prompts) whose G rewards were all equal (with
                           dynamic sampling: of every group sampled, trained on or not)
sampled_groups             groups sampled for the step (dynamic sampling only)
dropped_groups             zero-variance groups left out of the update (dynamic sampling only)
=========================  ================================================================

and, with dynamic sampling, ``all/refill_groups`` (groups sampled in refill rounds) and
``all/unfilled_groups`` (zero-variance groups trained on for want of informative ones);
plus ``n_completions`` (completions in the scope), ``ema_baseline`` (``g``),
``time/generation_s`` (sampling the rollouts, refills included), ``time/scoring_s``
(reference/old log-probs, rewards, advantages), ``time/update_s`` (policy forward, backward,
optimizer step) and ``time/step_s``; and, from the trainer's log of the step, ``loss`` and
``grad_norm`` (the gradient norm before clipping). TRL's own log values go to MLflow as
``trl/<name>``.

Why ``loss`` can read 0 while the weights move (GRPO, ``beta = 0``: ratio 1 in value, group
advantages of mean 0), and what shows learning instead: docs/operations.md, *Reading an RL run*.

One console line per step (:class:`RLLoggingCallback`) carries reward, accuracy, ``w_max``,
``g``, ``loss``, ``grad_norm``, ``adv_logprob``, ``adv_log_ratio``, ``kl``, the share of
zero-variance groups per task, the dropped groups per task (dynamic sampling), and the time
split; :func:`~hargo.training.rl_history.summarize_history` puts the per-task
zero-variance shares and the learning signals in ``metrics/rl/<method>.json``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from transformers import TrainerCallback

from hargo.rewards import completion_text
from hargo.tasks.plp import PLP_CORRECT_THRESHOLD
# the end-of-run summary and plots, re-exported here beside the recorder that feeds them
from hargo.training.rl_history import (LEARNING_KEYS, is_missing, plot_history,
                                       summarize_history)
# the step's metrics, computed over the recorder's records (is_correct: re-exported)
from hargo.training.step_metrics import generation_metrics, is_correct, loss_metrics

__all__ = ["PLP_ACCURACY_THRESHOLD", "LEARNING_KEYS", "is_correct", "StepRecorder",
           "RLLoggingCallback", "plot_history", "summarize_history", "prompt_preview"]

#: plp has no exact answer: a completion counts as correct when its reward (MiniLM cosine plus
#: the format bonus minus the length penalty) reaches this value (the plp task's
#: ``correct_threshold``, also evaluation's: ``hargo.tasks.plp``).
PLP_ACCURACY_THRESHOLD = PLP_CORRECT_THRESHOLD
#: What :meth:`StepRecorder.add_trainer_log` takes from the trainer's log of a step.
_TRAINER_LOG_KEYS = ("loss", "grad_norm")


def prompt_preview(prompt: Any, limit: int = 400) -> str:
    """The last user message of a conversational prompt (or the prompt string), cut to ``limit``
    characters with a trailing ``...``."""
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", "")
    text = prompt if isinstance(prompt, str) else str(prompt)
    return text if len(text) <= limit else text[:limit] + "..."


class StepRecorder:
    """Collects the raw per-response values of one RL step and turns them into metrics.

    The trainer calls :meth:`add_generation` once per generated batch (with values gathered from
    all processes, in TRL's group-major order) and :meth:`add_loss` once per loss micro-batch;
    :meth:`finish_step` then computes the step's metrics and appends them to :attr:`history`.

    Attributes:
        history: one dict per finished step: ``{"step": int, "<scope>/<metric>": float, ...}``.
            Part of the trainer state (saved in checkpoints through :meth:`state_dict`), so plots
            drawn after a resume cover the whole run.
    """

    def __init__(self, max_table_rows: int = 64):
        self.max_table_rows = int(max_table_rows)
        self.history: list[dict] = []
        self._gen: list[dict] = []
        self._loss: list[dict] = []
        self._last_gen: dict | None = None

    # ----------------------------------------------------------------- collection

    def add_generation(self, *, tasks: Sequence[str], rewards: Sequence[float],
                       advantages: Sequence[float], weights: Sequence[float],
                       completion_lengths: Sequence[float], group_size: int,
                       confidence: Sequence[float] | None = None,
                       ref_logprob: Sequence[float] | None = None, baseline: float | None = None,
                       prompts: Sequence[Any] | None = None,
                       completions: Sequence[Any] | None = None,
                       generation_s: float = 0.0, scoring_s: float = 0.0,
                       sampled_groups: dict | None = None) -> None:
        """Record one generated batch of ``B`` completions (``B`` a multiple of ``group_size``).

        All sequences have length ``B`` and are in TRL's order (the ``group_size`` completions
        of one prompt are consecutive). ``generation_s``/``scoring_s``: seconds spent sampling and
        scoring this batch. ``sampled_groups`` (dynamic sampling, ``hargo.training.
        dynamic_sampling``): every group sampled for the batch, trained on or not, as equal-length
        lists ``tasks``, ``zero_variance``, ``kept``, ``refill`` (bools); the zero-variance shares
        are then taken over the sampled groups, and the dropped ones are counted.

        Raises:
            ValueError: lengths differ or ``B`` is not a multiple of ``group_size``.
        """
        B = len(tasks)
        named = {"rewards": rewards, "advantages": advantages, "weights": weights,
                 "completion_lengths": completion_lengths, "confidence": confidence,
                 "ref_logprob": ref_logprob, "prompts": prompts, "completions": completions}
        for name, seq in named.items():
            if seq is not None and len(seq) != B:
                raise ValueError(f"StepRecorder.add_generation: {name} has {len(seq)} values for "
                                 f"{B} tasks")
        if group_size < 1 or B % group_size:
            raise ValueError(f"StepRecorder.add_generation: {B} completions do not form groups of "
                             f"{group_size}")
        if sampled_groups is not None:
            n = {k: len(sampled_groups[k]) for k in ("tasks", "zero_variance", "kept", "refill")}
            if len(set(n.values())) != 1:
                raise ValueError(f"StepRecorder.add_generation: sampled_groups lengths differ: {n}")
            sampled_groups = {k: list(sampled_groups[k]) for k in n}
        rec = {"tasks": list(tasks), "group_size": int(group_size), "baseline": baseline,
               "generation_s": float(generation_s), "scoring_s": float(scoring_s),
               "sampled_groups": sampled_groups}
        for name, seq in named.items():
            rec[name] = None if seq is None else list(seq)
        self._gen.append(rec)
        self._last_gen = rec

    def add_loss(self, *, tasks: Sequence[str], kl: Sequence[float] | None,
                 clip_fraction: Sequence[float], adv_logprob: Sequence[float] | None = None,
                 adv_log_ratio: Sequence[float] | None = None) -> None:
        """Record one loss micro-batch: per response, its task, token-averaged KL (None when no
        reference ran), clipped-token share, advantage-weighted log-prob and log-ratio to the
        reference (None: not computed; see the module docstring).

        Raises:
            ValueError: the sequences differ in length.
        """
        named = {"kl": kl, "clip_fraction": clip_fraction, "adv_logprob": adv_logprob,
                 "adv_log_ratio": adv_log_ratio}
        if any(v is not None and len(v) != len(tasks) for v in named.values()):
            raise ValueError("StepRecorder.add_loss: tasks, kl, clip_fraction, adv_logprob and "
                             "adv_log_ratio differ in length")
        self._loss.append({"tasks": list(tasks),
                           **{k: None if v is None else list(v) for k, v in named.items()}})

    # ---------------------------------------------------------------- step metrics

    def finish_step(self, step: int, step_s: float | None = None) -> dict[str, float]:
        """Metrics of the step just finished (see the module docstring;
        :func:`~hargo.training.step_metrics.generation_metrics` and
        :func:`~hargo.training.step_metrics.loss_metrics`), appended to :attr:`history` and
        returned. Buffers are cleared. A step without any generation record (e.g. the optimizer
        step of a resumed, already finished run) gives only ``step``."""
        metrics: dict[str, float] = {"step": int(step)}
        gens, losses = self._gen, self._loss
        self._gen, self._loss = [], []
        if gens:
            metrics.update(generation_metrics(gens))
        if losses:
            metrics.update(loss_metrics(losses))
        if step_s is not None:
            metrics["time/step_s"] = float(step_s)
            if gens:
                metrics["time/update_s"] = max(0.0, float(step_s) - metrics["time/generation_s"]
                                               - metrics["time/scoring_s"])
        self.history.append(metrics)
        return metrics

    def add_trainer_log(self, step: int, logs: dict) -> dict[str, float]:
        """Copy ``loss`` and ``grad_norm`` of the trainer's log of ``step`` (transformers logs
        them after ``on_step_end``) into that step's :attr:`history` entry; returns what was
        copied (nothing when the latest entry is another step's or the log has neither)."""
        if not self.history or self.history[-1].get("step") != int(step):
            return {}
        got = {k: float(logs[k]) for k in _TRAINER_LOG_KEYS
               if isinstance(logs.get(k), (int, float)) and not isinstance(logs.get(k), bool)}
        self.history[-1].update(got)
        return got

    def completion_table(self, step: int, max_rows: int | None = None) -> dict[str, list] | None:
        """Sample completions of the latest generated batch, whole groups first-come, as columns
        ``step, task, group, prompt, completion, reward, advantage, weight, confidence`` (up to
        ``max_rows`` rows, default ``max_table_rows``). None when no texts were recorded."""
        g = self._last_gen
        if g is None or g["completions"] is None:
            return None
        n = min(len(g["tasks"]), max_rows or self.max_table_rows)
        G = g["group_size"]
        conf = g["confidence"]
        return {
            "step": [int(step)] * n,
            "task": g["tasks"][:n],
            "group": [i // G for i in range(n)],
            "prompt": [prompt_preview(g["prompts"][i]) if g["prompts"] else "" for i in range(n)],
            "completion": [completion_text(c) for c in g["completions"][:n]],
            "reward": [float(x) for x in g["rewards"][:n]],
            "advantage": [float(x) for x in g["advantages"][:n]],
            "weight": [float(x) for x in g["weights"][:n]],
            "confidence": [None if conf is None else float(conf[i]) for i in range(n)],
        }

    # ------------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """``{"history": [...]}`` (JSON-ready; NaN values become None)."""
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in h.items()}
                 for h in self.history]
        return {"history": clean}

    def load_state_dict(self, state: dict) -> None:
        """Restore :attr:`history` from :meth:`state_dict` output."""
        hist = state.get("history", [])
        if not isinstance(hist, list):
            raise ValueError("StepRecorder.load_state_dict: 'history' must be a list")
        self.history = [{k: (float("nan") if v is None else v) for k, v in h.items()} for h in hist]


def _active_mlflow():
    try:
        import mlflow
    except ImportError:  # pragma: no cover - mlflow is a dependency
        return None
    return mlflow if mlflow.active_run() is not None else None


class RLLoggingCallback(TrainerCallback):
    """Finishes each step in the :class:`StepRecorder`, logs it to the active MLflow run (if any),
    prints one progress line (:meth:`step_line`, with the step's ``loss`` and ``grad_norm`` from
    the trainer's log), and every ``log_completions_steps`` steps logs a completions table
    as the MLflow artifact ``completions/step_NNNNN.json``.

    Args:
        recorder: the trainer's recorder.
        method: RL method name, for the progress line.
        log_completions_steps: table period in steps (0: never).
        print_fn: where progress lines go (default ``print``, flushed).
    """

    def __init__(self, recorder: StepRecorder, method: str, log_completions_steps: int = 0,
                 print_fn: Callable[[str], None] | None = None):
        self.recorder = recorder
        self.method = method
        self.log_completions_steps = int(log_completions_steps or 0)
        self.print_fn = print_fn or (lambda s: print(s, flush=True))
        self._t0: float | None = None
        self._pending: tuple[dict, int, int] | None = None
        self.tables: list[str] = []

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run starts a new MLflow run: replay the steps restored from the checkpoint,
        # so this run's charts cover the whole training.
        mlflow = _active_mlflow() if state.is_world_process_zero else None
        if mlflow is None:
            return
        for m in self.recorder.history:
            # loss/grad_norm came from the trainer's log, which MLflow has as trl/<name>
            vals = {k: float(v) for k, v in m.items()
                    if k != "step" and k not in _TRAINER_LOG_KEYS and not is_missing(v)}
            if vals:
                mlflow.log_metrics(vals, step=int(m["step"]))
        if self.recorder.history:
            mlflow.set_tag("hargo.resumed_from_step", str(int(self.recorder.history[-1]["step"])))

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s = None if self._t0 is None else time.perf_counter() - self._t0
        m = self.recorder.finish_step(state.global_step, step_s)
        if not state.is_world_process_zero:
            return
        mlflow = _active_mlflow()
        if mlflow is not None:
            mlflow.log_metrics({k: float(v) for k, v in m.items()
                                if k != "step" and not is_missing(v)}, step=state.global_step)
            if self.log_completions_steps and state.global_step % self.log_completions_steps == 0:
                table = self.recorder.completion_table(state.global_step)
                if table is not None:
                    name = f"completions/step_{state.global_step:05d}.json"
                    mlflow.log_table(data=table, artifact_file=name)
                    self.tables.append(name)
        # transformers logs the step's loss and grad_norm right after on_step_end: the line waits
        # for them (on_log), or goes out without them at the next step / the end of training.
        self._flush()
        self._pending = (m, state.global_step, state.max_steps)

    def _flush(self) -> None:
        if self._pending is not None:
            self.print_fn(self.step_line(*self._pending))
            self._pending = None

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._flush()

    def step_line(self, m: dict, step: int, max_steps: int) -> str:
        """The console line of step ``step``'s metrics ``m`` (a :attr:`StepRecorder.history`
        entry): reward, accuracy, w_max, g, loss, grad_norm, adv_logprob, adv_log_ratio, kl, the
        share of zero-variance groups per task (``zero-var <task> <share> ...``) and the time
        split, each when ``m`` has it."""
        parts = [f"[rl {self.method}] step {step}/{max_steps}"]
        if "all/reward_mean" in m:
            parts.append(f"reward {m['all/reward_mean']:.3f}")
            parts.append(f"acc {m['all/accuracy']:.2f}")
            parts.append(f"w_max {m['all/weight_max']:.3f}")
        if "ema_baseline" in m:
            parts.append(f"g {m['ema_baseline']:.3f}")
        for key, label, fmt in (("loss", "loss", ".4g"), ("grad_norm", "grad_norm", ".4g"),
                                ("all/adv_logprob", "adv_logp", ".4g"),
                                ("all/adv_log_ratio", "adv_lr", ".4g"), ("all/kl", "kl", ".4f")):
            if key in m and not is_missing(m[key]):
                parts.append(f"{label} {m[key]:{fmt}}")
        zero = [(k.split("/")[0], v) for k, v in m.items()
                if k.endswith("/zero_variance_groups") and not k.startswith("all/")]
        if zero:
            parts.append("zero-var " + " ".join(f"{t} {v:.2f}" for t, v in sorted(zero)))
        dropped = [(k.split("/")[0], v) for k, v in m.items()
                   if k.endswith("/dropped_groups") and not k.startswith("all/")]
        if dropped:
            parts.append("dropped " + " ".join(f"{t} {int(v)}" for t, v in sorted(dropped))
                         + f" (refill {int(m.get('all/refill_groups', 0))}, "
                           f"unfilled {int(m.get('all/unfilled_groups', 0))})")
        for k in ("generation_s", "scoring_s", "update_s"):
            if f"time/{k}" in m:
                parts.append(f"{k[:-2]} {m[f'time/{k}']:.1f}s")
        return "  ".join(parts)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        # every process: the checkpoint's recorder history then holds loss and grad_norm too
        got = self.recorder.add_trainer_log(state.global_step, logs)
        if not state.is_world_process_zero:
            return
        if got and self._pending is not None and self._pending[1] == state.global_step:
            self._pending[0].update(got)
            self._flush()
        mlflow = _active_mlflow()
        if mlflow is None:
            return
        vals = {f"trl/{k}": float(v) for k, v in logs.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(float(v))}
        if vals:
            mlflow.log_metrics(vals, step=state.global_step)
