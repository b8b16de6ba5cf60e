"""Stage ``compare_train@<method>-<seed>``: train one method with one seed for the comparison.

``run(params, method, seed)`` (``hargo compare-train --method M --seed S``, the Prefect
comparison flow) trains from the shared upstream outputs -- nothing upstream re-runs:

``grpo``, ``dr_grpo``, ``hargo``, ``hargo_b1``, ``hargo_b2``, ``ppo`` (online RL: every method of
:mod:`hargo.methods`' ``grpo_family`` and ``value`` families)
    :func:`hargo.training.rl.run` from the SFT model, with ``rl.steps = compare.steps``,
    ``rl.prompts_per_step = compare.prompts_per_step`` and a prompt pool of
    ``compare.samples_per_task`` prompts per task drawn with this seed; every other ``rl.*``
    knob (G, temperature, beta, alpha, rho, clip range, learning rate, LoRA) is shared with the
    ``rl`` stage. Checkpoints go to ``checkpoints/compare/<run>`` (an interrupted run resumes).
``dpo``, ``kto``, ``simpo`` (family ``preference``)
    :func:`hargo.training.preference_trainers.train_preference` from the SFT model on the pairs of the
    ``preferences`` stage (``data/preferences/pairs.jsonl``): ``compare.steps`` optimizer steps
    of ``compare.prompts_per_step`` pairs. No checkpoints: an interrupted run starts over (and,
    seeded, ends on the uninterrupted run's weights).
``hpcgpt`` (the HPC-GPT baseline, family ``sft``)
    the HPC-GPT LoRA SFT recipe (``compare.hpcgpt``: r=8, alpha=16, lr 2e-5) applied to the
    *base* model with SFT's data budget (``sft.samples_per_task``, ``sft.epochs``), through
    :func:`hargo.training.sft.train`.

Budget: every RL and preference method sees ``compare.steps * compare.prompts_per_step``
prompts; ``hpcgpt`` replaces SFT and sees SFT's examples. The run's seed replaces ``seed`` for
the training (sampling, data order, prompt pool); the SFT model is the same for all seeds.

Launch: one process, or for the online RL methods several, with the launch form of every
training stage (``accelerate launch --config_file configs/accelerate/<x>.yaml -m hargo.cli
compare-train --method M --seed S``; or ``$HARGO_ACCELERATE_CONFIG`` with the plain command, as
compare/dvc.yaml runs it); see :func:`run`.

Outputs (whole or not at all): ``models/compare/<run>/`` (merged model) and
``metrics/compare/train/<run>.json``: ``{"method", "seed", "run", "family", "prompts_seen",
"steps", "wall_s", "history", ...}`` with ``history`` the per-step per-task rows of
:class:`hargo.training.rl_logging.StepRecorder` for online RL methods (``[]`` otherwise).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hargo.config import Config, as_section, params_dict
from hargo.io import HargoInputError, atomic_write_json, read_jsonl
from hargo.compare.layout import TRAIN_METRICS_ROOT, run_name  # re-exported
from hargo.methods import RL_FAMILIES, get_method
from hargo.params import ParamsError

__all__ = ["run", "run_name", "run_config", "run_params", "family", "model_dir",
           "metrics_path", "TRAIN_METRICS_ROOT", "CHECKPOINT_ROOT"]

CHECKPOINT_ROOT = Path("checkpoints") / "compare"


def family(method: str) -> str:
    """``"rl"`` (online RL: the GRPO family and PPO), ``"preference"`` or ``"sft"`` (hpcgpt), from
    the method's family (:func:`hargo.methods.get_method`).

    Raises:
        ParamsError: not a registered method.
    """
    try:
        fam = get_method(method).family
    except ParamsError as e:
        raise ParamsError(f"method: {e}") from None
    return "rl" if fam in RL_FAMILIES else fam


def model_dir(params: Config, method: str, seed: int, root: str | Path = ".") -> Path:
    """``<compare.out_dir>/<method>-s<seed>`` of the typed config ``params``."""
    out_dir = as_section(params, "compare", required=True).out_dir
    return Path(root) / out_dir / run_name(method, seed)


def metrics_path(method: str, seed: int, root: str | Path = ".") -> Path:
    """``metrics/compare/train/<method>-s<seed>.json``."""
    return Path(root) / TRAIN_METRICS_ROOT / f"{run_name(method, seed)}.json"


def run_config(params: Config, method: str, seed: int) -> Config:
    """The typed config one comparison run trains with: ``params`` (the typed config) where
    ``seed`` is the run's seed and ``rl.steps / rl.prompts_per_step / rl.samples_per_task`` are
    the comparison's budget (``compare.steps / prompts_per_step / samples_per_task``); for
    ``hpcgpt`` ``sft.learning_rate`` and ``sft.lora.r / alpha`` are the HPC-GPT recipe's
    (``compare.hpcgpt``: :class:`~hargo.config.compare.HPCGPTParams`), with the adapter enabled.
    Built and checked again (:meth:`~hargo.config.Config.with_values`), so that its
    :func:`~hargo.config.params_dict` is the run's own mapping.

    Raises:
        ParamsError: unknown method, or bad params (by the key's dotted name)."""
    fam = family(method)
    c = as_section(params, "compare", required=True)
    values: dict[str, Any] = {"seed": int(seed), "rl.steps": int(c.steps),
                              "rl.prompts_per_step": int(c.prompts_per_step),
                              "rl.samples_per_task": c.samples_per_task}
    if fam == "sft":       # the HPC-GPT recipe (compare.<method>: hpcgpt's block)
        h = c.method(method)
        values.update({"sft.learning_rate": float(h.learning_rate),
                       "sft.lora.enabled": True, "sft.lora.r": int(h.lora_r),
                       "sft.lora.alpha": float(h.lora_alpha)})
    return params.with_values(values)


def run_params(params: Config, method: str, seed: int) -> dict:
    """:func:`run_config` as the params mapping MLflow logs (:func:`hargo.config.params_dict`).

    Raises:
        ParamsError: unknown method, or bad params (by the key's dotted name)."""
    return params_dict(run_config(params, method, seed))


def _train_hpcgpt(cfg: Config, root: Path, out_dir: Path) -> dict:
    from hargo.data.records import read_prepared, select_subset
    from hargo.models import loading
    from hargo.training import sft

    base = loading.resolve_model_dir(root / cfg.model.out_dir)
    train_path = root / cfg.data.out_dir / "train.jsonl"
    records = read_prepared(train_path, require_answer=True)
    tok = loading.load_tokenizer(base)
    subset, skipped = select_subset(records, cfg.sft.samples_per_task, int(cfg.seed),
                                    tok, int(cfg.train.max_prompt_tokens))
    if not subset:
        raise HargoInputError(train_path, "every prompt is longer than train.max_prompt_tokens")
    m = sft.train(cfg, base, subset, out_dir)
    return {"prompts_seen": int(m["examples"] * float(cfg.sft.epochs)),
            "steps": m["steps"], "loss_curve": m.get("loss_curve", []),
            "final_loss": m.get("final_loss"), "skipped_too_long": skipped,
            "train_s": m["train_seconds"], "base_model": str(cfg.model.out_dir)}


def _train_preference(cfg: Config, method: str, seed: int, root: Path, out_dir: Path) -> dict:
    from hargo.models.loading import resolve_model_dir
    from hargo.training.preference_trainers import train_preference

    pairs_path = root / cfg.compare.preferences.out_dir / "pairs.jsonl"
    if not pairs_path.is_file():
        raise FileNotFoundError(f"{pairs_path}: missing (written by stage preferences; "
                                "`dvc repro compare/dvc.yaml` runs it)")
    pairs = read_jsonl(pairs_path)
    sft_dir = resolve_model_dir(root / cfg.sft.out_dir)
    m = train_preference(cfg, method, sft_dir, pairs, out_dir, seed)
    m.setdefault("prompts_seen", int(cfg.compare.steps) * int(cfg.compare.prompts_per_step))
    return m


def run(params: Config, method: str, seed: int, root: str | Path = ".") -> dict:
    """Train ``method`` with ``seed`` (see the module docstring; ``params``: the typed config);
    returns the metrics written.

    Raises:
        ParamsError: bad params, unknown method, or a seed not in ``compare.seeds`` (before any
            work).
        FileNotFoundError: an upstream output (SFT/base model, pairs) is missing.
        HargoInputError: bad or too few train records / pairs.

    Several processes (``accelerate launch --config_file configs/accelerate/<x>.yaml -m
    hargo.cli compare-train ...``): online RL methods train on every process through
    :func:`hargo.training.rl.run` and only the main process writes the metrics; preference and
    SFT methods are refused (ParamsError) -- they run on one process.
    """
    import mlflow

    from hargo import tracking

    cfg = params
    c = as_section(cfg, "compare", required=True)
    fam = family(method)
    if fam == "rl":    # a vLLM backend that cannot run here, before the checkpoint folder
        from hargo.training.rl import check_generation_backend

        check_generation_backend(cfg)
    if method not in c.methods:
        raise ParamsError(f"--method: {method!r} is not in compare.methods {list(c.methods)}")
    if int(seed) not in [int(s) for s in c.seeds]:
        raise ParamsError(f"--seed: {seed} is not in compare.seeds {list(c.seeds)}")
    from hargo.training.launch import launch_state

    launch = launch_state()
    if launch.num_processes > 1 and fam != "rl":
        raise ParamsError(f"--method {method}: a {fam} method trains on one process; launch "
                          f"compare-train --method {method} without accelerate (online RL "
                          f"methods run on several)")
    root = Path(root)
    name = run_name(method, seed)
    run_cfg = run_config(cfg, method, seed)
    out_dir = model_dir(cfg, method, seed, root)
    mpath = metrics_path(method, seed, root)
    t0 = time.perf_counter()
    print(f"[compare {name}] {fam} method {method}, seed {seed}", flush=True)
    if fam == "rl":
        from hargo.training import rl

        r = rl.run(run_cfg, method, root, run_name=name, out_dir=out_dir,
                   ckpt_dir=root / CHECKPOINT_ROOT / name, metrics_path=mpath,
                   keep_history=True)
        result = {**r, "prompts_seen": int(r["steps"]) * int(run_cfg.rl.prompts_per_step)}
    else:
        with tracking.stage_run("compare", run_cfg, root, extra_tags={"hargo.method": method,
                                                                     "hargo.run": name},
                                run_name=f"compare-{name}"):
            tracking.log_split("train", "training", run_cfg, root)
            result = (_train_hpcgpt(run_cfg, root, out_dir) if fam == "sft"
                      else _train_preference(run_cfg, method, seed, root, out_dir))
            result["history"] = []
            mlflow.log_metrics({k: float(v) for k, v in result.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)})
    result.update(method=method, seed=int(seed), run=name, family=fam,
                  wall_s=round(time.perf_counter() - t0, 3))
    if not launch.is_main:     # several processes: the main one writes and prints (as rl.run)
        return result
    atomic_write_json(mpath, result)
    print(f"[compare {name}] done in {result['wall_s']:.1f} s, "
          f"{result['prompts_seen']} prompts seen -> {out_dir}", flush=True)
    return result
