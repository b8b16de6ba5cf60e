"""The synthetic test bed: "does HARGO beat GRPO?" decided on a CPU in minutes.

Tasks with the HPC tasks' reward heterogeneity and none of their content
(:mod:`hargo.data.synthetic`: a yes/no task with a 0/1 reward, a short answer with tiered
credit, a long answer with a continuous similarity minus a length penalty), a tiny policy built
from a config (:mod:`hargo.models.tiny`), and the project's own trainers and estimators:
:func:`hargo.training.sft.train` warm-starts the policy so that groups have reward variance,
then :func:`hargo.training.rl.build_trainer` (TRL's GRPO machinery with HARGO's weights) trains
every method of ``synthetic.methods`` with every seed of ``synthetic.seeds`` at the same budget.
Two configurations share the data and the SFT policy:

``heterogeneous``
    the rewards of ``synthetic.data`` (the three reward shapes);
``homogeneous``
    the control: every task gets a 0/1 exact-match reward (``SyntheticConfig.homogeneous``);
    with no reward heterogeneity to exploit, HARGO is expected not to differ from GRPO there
    (the report shows whether it does).

The pipeline (``synthetic/dvc.yaml``, ``scripts/compare.sh synthetic``), one function per stage
(the plan and paths: :mod:`hargo.compare.synthetic_plan`; a stage's config, the RL pool, the
SFT examples, a run's reward and per-step task quota: :mod:`hargo.compare.synthetic_inputs`):

``synthetic_data``    :func:`hargo.compare.synthetic_data.prepare_data`:
                      ``data/synthetic/{train,eval}.jsonl`` and ``stats.json``
:func:`train_sft`     ``models/synthetic/sft`` (tiny policy + SFT) and
                      ``metrics/synthetic/sft.json`` (its eval rewards: the untuned baseline)
:func:`train_configuration`  every method x seed of one configuration:
                      ``metrics/synthetic/<configuration>.json``; each finished run is kept in
                      ``checkpoints/synthetic/<configuration>/<method>-s<seed>.json`` with a
                      fingerprint of its inputs, so an interrupted stage resumes at the next run
``synthetic_report``  :func:`hargo.compare.synthetic_report.report`: ``reports/synthetic.md``,
                      its figures in ``reports/synthetic/``, ``metrics/synthetic/summary.json``

Evaluation: greedy completions of the eval split (``synthetic.evaluate.max_new_tokens``, per
task) scored with the configuration's reward divided by the task's scale (so the reward-scale
knobs change training, not the yardstick) and by exact match (:func:`score`). Intervals: the
paired bootstrap over seeds and prompts (:func:`hargo.stats.paired_bootstrap_ci_seeds`) of HARGO minus each
method, on the mean eval reward over all prompts and per task.

The *update mass* of a response is ``w_i * |A_i|`` (its weight times the absolute advantage
that multiplies its policy-gradient term, ``hargo.advantages``); a task's share of a step's
update mass is how much of the update the task drives. Uniform GRPO weights give a task the
share its groups' advantages give it; HARGO's weights are meant to move it toward the groups
whose rewards discriminate (docs/method.md); the report draws both. The trainers' :class:`hargo.training.rl_logging.StepRecorder` logs ``<task>/update_mass_share`` every step.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from transformers import TrainerCallback

from hargo.compare.layout import run_name
from hargo.compare.synthetic_inputs import (prompt_quota, rl_prompts,  # noqa: F401
                                            sft_records, stage_params, train_reward)
from hargo.compare.synthetic_plan import (CONFIGURATIONS, METRICS_DIR, MODEL_DIR, RUNS_DIR,
                                          SyntheticPlan, configuration, plan, read_split)
from hargo.config import Config, as_config, params_dict, to_plain
from hargo.data.synthetic import SYNTHETIC_TASKS, SyntheticConfig
from hargo.io import atomic_write_json
from hargo.training.rl_logging import StepRecorder

__all__ = ["stage_params", "rl_prompts", "sft_records", "score", "evaluate_policy", "eval_summary",
           "code_digest", "run_fingerprint", "train_run", "train_sft",
           "train_configuration"]



# --------------------------------------------------------------------------- evaluation

def score(config: SyntheticConfig, tasks: Sequence[str], completions: Sequence[str],
          answers: Sequence[str], labels: Sequence[str | None]) -> dict[str, list[float]]:
    """Per prompt: ``reward``, the configuration's reward with every scale 1 (in
    [``long_min_reward``, 1]; 0/1 in the homogeneous configuration), and ``correct``, the
    exact-match reward (the homogeneous one, 0/1) -- so a scale knob changes training, not the
    yardstick (a scale of 0 included).

    Returns:
        ``{"reward": [N floats], "correct": [N floats]}``.
    """
    from hargo.data.synthetic import synthetic_reward

    unit = replace(config, scale_yesno=1.0, scale_short=1.0, scale_long=1.0)
    exact = replace(unit, homogeneous=True)
    rewards, correct = [], []
    for t, c, a, lab in zip(tasks, completions, answers, labels, strict=True):
        rewards.append(synthetic_reward(t, c, a, lab, unit))
        correct.append(synthetic_reward(t, c, a, lab, exact))
    return {"reward": rewards, "correct": correct}


def evaluate_policy(model_dir: str | Path, records: Sequence[Mapping], p: SyntheticPlan,
                    configs: Mapping[str, SyntheticConfig], seed: int = 0) -> dict[str, dict]:
    """Greedy completions of ``records`` by the model in ``model_dir`` (transformers backend,
    per-task budgets ``synthetic.evaluate.max_new_tokens``), generated once and scored by
    :func:`score` under each of ``configs``: ``{name: {"ids", "tasks", "reward", "correct",
    "completions"}}`` (lists in record order). With ``p.evaluate.samples = k > 0`` also ``k``
    completions per prompt sampled at ``synthetic.rl.temperature`` (seeded by ``seed``) and
    ``"sampled_reward"``, each prompt's mean reward over them (:func:`score`'s ``reward``):
    the quantity RL raises, next to the greedy answer that evaluation reads.

    Raises:
        ValueError: a prompt plus its budget does not fit ``synthetic.policy.max_positions``.
    """
    from hargo.evaluation.generate import run_generation

    tasks = [r["task"] for r in records]
    prompts = [r["prompt"] for r in records]
    names = ("synthetic.policy.max_positions", "synthetic.evaluate.max_new_tokens")
    res = run_generation(model_dir, prompts,
                         {"max_new_tokens": dict(p.evaluate.max_new_tokens), "temperature": 0.0,
                          "dtype": "float32", "batch_size": 64}, "transformers", tasks=tasks,
                         param_names=names)
    answers, labels = [r["answer"] for r in records], [r.get("label") for r in records]
    out = {name: {"ids": [r["id"] for r in records], "tasks": tasks,
                  **score(cfg, tasks, res.completions, answers, labels),
                  "completions": list(res.completions)}
           for name, cfg in configs.items()}
    k = int(p.evaluate.samples)
    if k > 0:
        sampled = run_generation(model_dir, prompts,
                                 {"max_new_tokens": dict(p.evaluate.max_new_tokens),
                                  "temperature": float(p.rl.temperature), "dtype": "float32",
                                  "batch_size": 64}, "transformers", seed=seed, num_samples=k,
                                 tasks=tasks, param_names=names)
        rep = [x for x in range(len(records)) for _ in range(k)]   # prompt-major, k each
        for name, cfg in configs.items():
            r = score(cfg, [tasks[i] for i in rep], sampled.completions, [answers[i] for i in rep],
                      [labels[i] for i in rep])["reward"]
            out[name]["sampled_reward"] = [sum(r[i * k:(i + 1) * k]) / k
                                           for i in range(len(records))]
    return out


def eval_summary(ev: Mapping) -> dict[str, float]:
    """Mean ``reward`` and ``correct`` (and ``sampled_reward`` when evaluated) over all prompts
    (``all/...``) and per task."""
    out = {}
    keys = ("reward", "correct") + (("sampled_reward",) if "sampled_reward" in ev else ())
    for scope in ("all",) + SYNTHETIC_TASKS:
        idx = [i for i, t in enumerate(ev["tasks"]) if scope == "all" or t == scope]
        for k in keys:
            out[f"{scope}/{k}"] = sum(ev[k][i] for i in idx) / len(idx) if idx else float("nan")
    return out


# --------------------------------------------------------------------------- training

def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_digest(root: str | Path | None = None) -> str:
    """sha256 of the hargo modules a run executes (:mod:`hargo.compare.synthetic_code`: the
    import closure of the bed's entry points, name and content): a run trained by other code is
    not reused, and a commit that touches none of those files keeps every run."""
    from hargo.compare.synthetic_code import code_digest as digest

    return digest(root)


def run_fingerprint(params: Config, p: SyntheticPlan, name: str, method: str, seed: int,
                    model_digest: str, code: str) -> str:
    """What a finished run's result depends on: the tasks, the RL budget and the eval budgets
    of the plan (not its method and seed lists or the bootstrap), the configuration, the
    method's own knobs (``rl.<method>``, ``rl.clip_range``), the seed, the SFT policy's digest,
    the code it executes (:func:`code_digest`), bf16 autocast on this hardware and the versions
    of torch, transformers and TRL.

    ``params``: the main typed config (:class:`hargo.config.Config`; its ``rl`` section as its
    params mapping has it, :func:`hargo.config.params_dict`); ``p``: its plan. Returns the first
    16 hex digits of a sha256; raises nothing."""
    import torch
    import transformers
    import trl

    from hargo.hardware import use_bf16

    # the method's block as params.yaml spells it (params_dict), like the checkpoints' run
    # fingerprint: a digest of the file's entries, not a read of a knob
    rl = params_dict(params)["rl"]
    return _digest({"data": asdict(p.data), "rl": to_plain(p.rl),
                    "eval": dict(p.evaluate.max_new_tokens),
                    "eval_samples": p.evaluate.samples, "eval_every": p.evaluate.every_steps,
                    "sft_examples": dict(p.sft.examples_per_task),   # the held-out pool's offset
                    "configuration": name, "method": method, "seed": seed,
                    "method_params": rl.get(method), "clip": rl["clip_range"],
                    "model": model_digest, "code": code, "bf16": use_bf16(params),
                    "versions": [torch.__version__, transformers.__version__, trl.__version__]})


class _EvalEvery(TrainerCallback):
    """A ``transformers.TrainerCallback`` that evaluates the policy every
    ``every`` RL steps (:func:`evaluate_policy` of a saved copy) into ``curve``: rows
    ``{"step", **eval_summary}``, and into ``prompts`` the per-prompt values behind them:
    ``{"step", "reward": [...], "correct": [...]}`` (the eval split's order; for intervals
    over the curve, e.g. its area, benchmarks/interference_map.py)."""

    def __init__(self, every: int, evaluate, tokenizer, work: Path):
        self.every, self.evaluate, self.tokenizer, self.work = every, evaluate, tokenizer, work
        self.curve: list[dict] = []
        self.prompts: list[dict] = []
        self.seconds = 0.0   # spent evaluating inside training

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = int(state.global_step)
        if self.every and step % self.every == 0 and step < int(state.max_steps):
            t0 = time.perf_counter()
            folder = self.work / f"eval-{step}"
            _save_policy(model, self.tokenizer, folder)
            self.add(step, self.evaluate(folder))
            self.seconds += time.perf_counter() - t0

    def add(self, step: int, ev: Mapping) -> None:
        self.curve.append({"step": step, **eval_summary(ev)})
        self.prompts.append({"step": step, "reward": list(ev["reward"]),
                             "correct": list(ev["correct"])})


def train_run(params: Config, p: SyntheticPlan, name: str, method: str, seed: int,
              train: Sequence[Mapping], eval_records: Sequence[Mapping], model_dir: Path,
              print_fn=print) -> dict:
    """Train ``method`` with ``seed`` in configuration ``name`` from the SFT policy and evaluate
    it: ``{"method", "seed", "configuration", "history", "eval", "eval_summary",
    "eval_curve", "wall_s", "train_s"}`` (``history``: per-step rows of :class:`StepRecorder`;
    ``eval_curve``: ``{"step", **eval_summary}`` every ``synthetic.evaluate.every_steps``
    steps and at the end, and with ``every_steps`` also ``eval_curve_prompts``, the per-prompt
    ``reward`` and ``correct`` of each of those points; ``train_s`` excludes those
    intermediate evaluations). ``params``: the main typed config (:class:`hargo.config.Config`,
    turned into the run's by :func:`stage_params`); ``p``: its plan."""
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_tokenizer
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback

    t0 = time.perf_counter()
    config = configuration(p, name)
    q = stage_params(params, p, seed)
    setup_torch(q)
    recorder = StepRecorder(max_table_rows=0)
    label = f"{name}/{run_name(method, seed)}"
    callback = RLLoggingCallback(recorder, label, 0, print_fn=print_fn)
    with tempfile.TemporaryDirectory(prefix="hargo-synthetic-") as work:
        work = Path(work)
        tokenizer = load_tokenizer(model_dir)

        def evaluate(folder):
            # generation seeds torch's global RNG; the run's own sampling must not notice that
            # it was evaluated (a run with an eval curve is the run without one)
            import torch

            with torch.random.fork_rng(devices=[]):
                return evaluate_policy(folder, eval_records, p, {name: config}, seed=seed)[name]

        every = _EvalEvery(p.evaluate.every_steps, evaluate, tokenizer, work)
        trainer = build_trainer(q, method, model_dir, rl_prompts(train, p, seed), work / "trainer",
                                recorder=recorder, callbacks=[callback, every],
                                reward_funcs=[train_reward(config, seed)])
        trainer.prompt_quota = prompt_quota(p)   # None: a step draws from the pool's mix
        if p.evaluate.every_steps:
            every.add(0, evaluate(model_dir))
        tt = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - tt - every.seconds
        model = trainer.accelerator.unwrap_model(trainer.model)
        _save_policy(model, tokenizer, work / "policy")
        ev = evaluate(work / "policy")
    summary = eval_summary(ev)
    curve = every.curve + [{"step": int(p.rl.steps), **summary}]
    extra = {"eval_curve_prompts": every.prompts + [
        {"step": int(p.rl.steps), "reward": list(ev["reward"]), "correct": list(ev["correct"])}]
    } if p.evaluate.every_steps else {}
    return {"method": method, "seed": int(seed), "configuration": name,
            "history": recorder.history, "eval": ev, "eval_summary": summary,
            "eval_curve": curve, **extra, "train_s": round(train_s, 2),
            "wall_s": round(time.perf_counter() - t0, 2)}


def _save_policy(model, tokenizer, out: Path) -> None:
    from hargo.io import atomic_dir

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


# --------------------------------------------------------------------------- stages

def train_sft(params: Config, root: str | Path = ".") -> dict:
    """Stage ``synthetic_sft`` (``params``: the typed config): build the tiny policy (its small tokenizer trained on the train
    split's prompts and answers), SFT it on :func:`sft_records` (``synthetic.sft``), write
    ``models/synthetic/sft`` and ``metrics/synthetic/sft.json`` (SFT metrics, the policy's
    size, its greedy eval rewards under both configurations: the untuned row of the report).
    SFT sees :func:`sft_records` (``synthetic.sft.examples_per_task``)."""
    from hargo.hardware import setup_torch
    from hargo.models.loading import describe, load_model
    from hargo.models.tiny import build_tiny_policy
    from hargo.training import sft

    root = Path(root)
    p = plan(params)
    train, ev = read_split(root, "train"), read_split(root, "eval")
    seed = params.seed
    q = stage_params(params, p, seed)
    setup_torch(q)
    texts = [m["content"] for r in train for m in r["prompt"]] + [r["answer"] for r in train]
    with tempfile.TemporaryDirectory(prefix="hargo-synthetic-init-") as work:
        init = build_tiny_policy(Path(work) / "init", p.policy, texts, seed=seed)
        size = describe(load_model(init))
        metrics = sft.train(q, init, sft_records(train, p), root / MODEL_DIR, report_to=())
    metrics.pop("loss_curve", None)
    evals = evaluate_policy(root / MODEL_DIR, ev, p,
                            {name: configuration(p, name) for name in CONFIGURATIONS},
                            seed=seed)
    out = {"sft": metrics, "parameters": size, "policy": asdict(p.policy),
           "eval": {name: {"summary": eval_summary(e), **e} for name, e in evals.items()}}
    atomic_write_json(root / METRICS_DIR / "sft.json", out)
    return out


def _train_run_job(job: tuple) -> dict:
    """One run of :func:`train_configuration` in a worker process (``synthetic.parallel_runs``
    > 1): ``(params, configuration, method, seed, root, model_dir)``, ``params`` the config's
    :func:`~hargo.config.params_dict` (a typed config's read-only maps do not pickle), typed
    again here; its step logs are not printed (the parent prints one line a finished run)."""
    params, name, method, seed, root, model_dir = job
    params = as_config(params)
    p = plan(params)
    root = Path(root)
    return train_run(params, p, name, method, seed, read_split(root, "train"),
                     read_split(root, "eval"), Path(model_dir), print_fn=lambda *a, **k: None)


def train_configuration(params: Config, name: str, root: str | Path = ".",
                        print_fn=print) -> dict:
    """Stage ``synthetic_rl@<name>`` (``params``: the typed config): every method x seed, resumable per run (module
    docstring), ``synthetic.parallel_runs`` at once (each finished run is kept as it arrives);
    writes ``metrics/synthetic/<name>.json``: ``{"configuration", "runs":
    {"<method>-s<seed>": train_run's dict}, "wall_s"}``.

    Raises:
        ValueError: an unknown configuration.
        FileNotFoundError: the data or the SFT policy is missing.
    """
    from hargo.models.loading import model_digest, resolve_model_dir

    root = Path(root)
    p = plan(params)
    configuration(p, name)
    train, ev = read_split(root, "train"), read_split(root, "eval")
    model_dir = resolve_model_dir(root / MODEL_DIR)
    digest, code = model_digest(model_dir), code_digest()
    cache = root / RUNS_DIR / name
    t0 = time.perf_counter()
    runs: dict[str, dict] = {}
    todo = [(m, s) for s in p.seeds for m in p.methods]
    pending = []
    for i, (method, seed) in enumerate(todo, 1):
        rn = run_name(method, seed)
        fp = run_fingerprint(params, p, name, method, seed, digest, code)
        path = cache / f"{rn}.json"
        if path.exists():
            done = json.loads(path.read_text())
            if done.get("fingerprint") == fp:
                runs[rn] = done["run"]
                print_fn(f"[synthetic {name}] {i}/{len(todo)} {rn}: done earlier, kept")
                continue
        pending.append((method, seed, fp, path))

    def finished(run: dict, fp: str, path: Path) -> None:
        atomic_write_json(path, {"fingerprint": fp, "run": run})
        rn = run_name(run["method"], run["seed"])
        runs[rn] = run
        s = run["eval_summary"]
        per_task = ", ".join(f"{t} {s[f'{t}/reward']:.3f}" for t in SYNTHETIC_TASKS)
        print_fn(f"[synthetic {name}] {len(runs)}/{len(todo)} {rn}: eval reward "
                 f"{s['all/reward']:.3f} ({per_task}) in {run['wall_s']:.0f} s")

    if p.parallel_runs > 1 and len(pending) > 1:
        import multiprocessing as mp

        from hargo.hardware import resolve_threads

        each = max(1, resolve_threads(params.train.threads) // p.parallel_runs)
        q = params_dict(params.with_values({"train.threads": each}))   # pickled to the workers
        jobs = [(q, name, m, s, str(root), str(model_dir)) for m, s, _, _ in pending]
        where = {(m, s): (fp, path) for m, s, fp, path in pending}
        # a worker trains run after run: a fresh process per run cost ~10 s of imports each
        # (a quarter of a 25-step run); a run's result does not depend on what its process ran
        # before (train_run seeds everything; tests/test_synthetic_compare.py)
        with mp.get_context("spawn").Pool(min(p.parallel_runs, len(jobs))) as pool:
            for run in pool.imap_unordered(_train_run_job, jobs):
                finished(run, *where[(run["method"], run["seed"])])
    else:
        for method, seed, fp, path in pending:
            finished(train_run(params, p, name, method, seed, train, ev, model_dir,
                               print_fn=print_fn), fp, path)
    runs = {run_name(m, s): runs[run_name(m, s)] for m, s in todo}   # plan order
    out = {"configuration": name, "runs": runs, "wall_s": round(time.perf_counter() - t0, 1)}
    atomic_write_json(root / METRICS_DIR / f"{name}.json", out)
    return out


