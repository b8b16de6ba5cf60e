"""Stage ``sft``: supervised fine-tuning of the base model on the prepared train split with TRL's
``SFTTrainer`` (pinned trl 1.16), LoRA through PEFT or full fine-tuning.

Data: ``data.out_dir/train.jsonl`` records become TRL *conversational prompt-completion*
examples ``{"prompt": record["prompt"], "completion": [{"role": "assistant", "content":
record["answer"]}]}``, rendered with the model's own chat template; the loss is on the completion
tokens only (``completion_only_loss=True``). A seeded, task-balanced subset of
``sft.samples_per_task`` records per task is used; prompts over ``train.max_prompt_tokens`` are
skipped and counted (:func:`hargo.data.records.select_subset`). Sequences longer than
``sft.max_length`` have their completion's tail cut by TRL (counted as ``truncated``).

Outputs: ``sft.out_dir`` (adapters merged, whole or nothing; the frozen reference model and the
start of every RL method) and ``metrics/sft.json``. The trainer logs every step into the
``sft`` MLflow child run (transformers' ``MLflowCallback`` joins the active run); the train
loss curve is logged there as ``sft_loss.png``.

Several processes (``accelerate launch --num_processes N -m hargo.cli sft``, or torchrun):
``sft.batch_size`` stays the *global* batch (each process takes ``batch_size / N`` examples per
micro-batch, which must divide evenly), so the optimizer steps, learning rate and loss curve are
comparable with a 1-process run. Every process trains; only the main process opens the MLflow
run, merges and saves the model (after all processes finished training) and writes the metrics
file (see :mod:`hargo.training.launch`). Length bucketing is single-process only (N processes use
the trainer's distributed sampler).

The paper's recipe (2 epochs, lr 2e-5, batch 4, full data) is ``sft.epochs=2 sft.max_steps=-1
sft.learning_rate=2e-5 sft.batch_size=4 sft.samples_per_task=null sft.lora.enabled=false``
(scripts/paper_recipe.sh).
"""
from __future__ import annotations

import contextlib
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from hargo.config import Config
from hargo.data.records import read_prepared, select_subset
from hargo.io import HargoInputError, atomic_write_json
from hargo import hardware
from hargo.models import loading
from hargo.training import common

METRICS_PATH = Path("metrics") / "sft.json"


def to_prompt_completion(records: Sequence[dict]) -> list[dict]:
    """Prepared records -> TRL conversational prompt-completion examples (only those 2 keys)."""
    return [{"prompt": [{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
             "completion": [{"role": "assistant", "content": r["answer"]}]} for r in records]


def sft_config(params: Config, output_dir: str | Path, report_to: Sequence[str] = ("mlflow",),
               world_size: int = 1):
    """The ``trl.SFTConfig`` expressing ``params.sft`` / ``params.train`` (``params``: the typed
    config).

    ``per_device_train_batch_size = sft.batch_size / world_size``: ``sft.batch_size`` is the
    global batch over ``world_size`` processes.

    Device and precision (``use_cpu``, ``bf16``, ``fp16``, pinned memory) come from
    :func:`hargo.hardware.trainer_precision_kwargs`, the same for every trainer on every
    hardware profile. TRL's own defaults that differ from what we mean are set explicitly:
    ``gradient_checkpointing`` (TRL: True) is
    ``train.gradient_checkpointing``, ``logging_steps`` (TRL: 10) is 1. No checkpoints are
    saved (the stage is short; its output is the merged model), no evaluation. ``report_to``:
    the trainer's trackers (the stage: MLflow; the benchmark: none).

    Raises:
        ParamsError: ``sft.batch_size`` not divisible by ``world_size``.
    """
    from trl import SFTConfig

    from hargo.hardware import trainer_precision_kwargs
    from hargo.params import ParamsError

    s, seed = params.sft, params.seed
    if int(s.batch_size) % world_size:
        raise ParamsError(f"sft.batch_size: {s.batch_size} examples do not split over "
                          f"{world_size} processes")
    gc = bool(params.train.gradient_checkpointing)
    return SFTConfig(
        output_dir=str(output_dir),
        seed=int(seed), data_seed=int(seed),
        num_train_epochs=float(s.epochs), max_steps=int(s.max_steps),
        learning_rate=float(s.learning_rate),
        per_device_train_batch_size=int(s.batch_size) // world_size,
        gradient_accumulation_steps=int(s.grad_accum),
        max_length=int(s.max_length),
        completion_only_loss=True, assistant_only_loss=False, packing=False,
        gradient_checkpointing=gc,
        gradient_checkpointing_kwargs={"use_reentrant": False} if gc else None,
        logging_steps=1, logging_first_step=True, disable_tqdm=False,
        logging_nan_inf_filter=False,      # the divergence guard must see a NaN loss
        save_strategy="no", eval_strategy="no", report_to=list(report_to) or "none", run_name="sft",
        dataloader_num_workers=0,
        **trainer_precision_kwargs(params.train),
    )


def bucketed_order(lengths: Sequence[int], batch_size: int, bucket_batches: int,
                   rng: random.Random) -> list[int]:
    """A seeded sample order whose consecutive ``batch_size`` slices are batches of similar
    length (less padding), still in random order.

    Shuffle all indices; cut them into buckets of ``bucket_batches * batch_size``; sort each
    bucket by length and cut it into batches; shuffle the full batches and put the one short
    batch (if any) last, so the data loader's batches are exactly these. ``bucket_batches <= 1``
    gives a plain shuffle. With the split's length mix, 8 batches per bucket raised the share of
    real (non-padding) tokens in a batch of 4 from ~60% to ~90%.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if bucket_batches <= 1:
        return order
    size = bucket_batches * batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), size):
        bucket = sorted(order[start:start + size], key=lambda i: lengths[i])
        batches += [bucket[k:k + batch_size] for k in range(0, len(bucket), batch_size)]
    full = [b for b in batches if len(b) == batch_size]
    rng.shuffle(full)
    return [i for b in full + [b for b in batches if len(b) < batch_size] for i in b]


class LengthBucketSampler:
    """Torch sampler yielding :func:`bucketed_order`, reseeded per epoch with
    ``random.Random(f"{seed}:{epoch}")`` (the epoch advances on each iteration, or is set by
    ``set_epoch``). Single process: with several the trainer keeps its distributed sampler."""

    def __init__(self, lengths: Sequence[int], batch_size: int, bucket_batches: int, seed: int):
        self.lengths, self.batch_size = list(lengths), batch_size
        self.bucket_batches, self.seed, self.epoch = bucket_batches, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        rng = random.Random(f"{self.seed}:{self.epoch}")
        self.epoch += 1
        return iter(bucketed_order(self.lengths, self.batch_size, self.bucket_batches, rng))


def _bucketed_trainer_class():
    from trl import SFTTrainer

    from hargo.training.trl_overrides import SFTOverrides

    class BucketedSFTTrainer(SFTOverrides, SFTTrainer):
        """TRL's SFTTrainer drawing training batches from :class:`LengthBucketSampler` (through
        ``transformers.Trainer._get_train_sampler``, transformers 5.19:
        :class:`hargo.training.trl_overrides.SFTOverrides`)."""

        bucket_batches: int = 0

        def length_bucket_sampler(self, train_dataset=None) -> LengthBucketSampler | None:
            """The :class:`LengthBucketSampler` over ``train_dataset`` (None: the train dataset),
            or None (transformers' own sampler) with ``bucket_batches <= 1`` or several
            processes."""
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            if self.bucket_batches <= 1 or self.args.world_size > 1:
                return None
            return LengthBucketSampler([len(x) for x in dataset["input_ids"]],
                                       self.args.per_device_train_batch_size,
                                       self.bucket_batches, self.args.seed)

    return BucketedSFTTrainer


def build_trainer(params: Config, model, tokenizer, records: Sequence[dict], args):
    """The SFT trainer (TRL ``SFTTrainer`` with length-bucketed batches) of ``model`` on the
    prepared ``records`` with ``args`` (:func:`sft_config`) and the LoRA of ``sft.lora``
    (None: full fine-tuning)."""
    from datasets import Dataset

    from hargo.training.divergence import DivergenceBounds, DivergenceGuard

    s = params.sft
    trainer = _bucketed_trainer_class()(
        model=model, args=args, train_dataset=Dataset.from_list(to_prompt_completion(records)),
        processing_class=tokenizer, peft_config=common.lora_config(s.lora),
        callbacks=[DivergenceGuard(DivergenceBounds.of(params.train.divergence), "sft")])
    trainer.bucket_batches = int(s.length_bucket_batches)  # read by the sampler
    return trainer


def loss_curve(log_history: Sequence[Mapping]) -> list[tuple[int, float]]:
    """``(step, loss)`` of every training log entry (the trainer's ``state.log_history``)."""
    return [(int(e["step"]), float(e["loss"])) for e in log_history
            if "loss" in e and "step" in e and "train_loss" not in e]


def plot_loss(curve: Sequence[tuple[int, float]], path: str | Path, title: str) -> Path:
    """Write the train loss curve (step vs loss) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s for s, _ in curve], [v for _, v in curve], marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (completion tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def train(params: Config, model_dir: str | Path, records: Sequence[dict],
          out_dir: str | Path | None, report_to: Sequence[str] = ("mlflow",)) -> dict[str, Any]:
    """Fine-tune the model in ``model_dir`` on ``records`` (already selected) with TRL, as the
    typed config ``params`` says.

    With ``report_to=("mlflow",)`` it logs into the active MLflow run (otherwise the trainer's
    callback opens its own); ``report_to=()`` logs nowhere. Writes the merged model to ``out_dir`` unless it is None (the benchmark). Returns the
    metrics dict: ``initial_loss``, ``final_loss`` (first/last logged step's train loss),
    ``steps``, ``train_seconds`` (wall), ``train_cpu_seconds`` (CPU time of the process: with one
    thread, the wall time it would take on an otherwise idle machine), ``tokens`` (prompt + completion tokens processed, padding
    excluded), ``tokens_per_s``, ``truncated``, ``examples``, ``trainable_parameters``,
    ``bf16``, ``peak_rss_mb``, ``loss_curve``.

    Launched on several processes it trains on all of them (``sft.batch_size`` is the global
    batch, see :func:`sft_config`); the losses and token counts are the trainer's, gathered over
    the processes, times and memory are this process's; only the main process logs the plot and
    writes ``out_dir``.
    """
    from hargo.training.launch import launch_state

    launch = launch_state()
    sft, model_cfg = params.sft, params.model
    hardware.setup_torch(params)
    model = loading.load_model(model_dir, dtype="float32",
                              trust_remote_code=bool(model_cfg.trust_remote_code))
    tok = loading.load_tokenizer(model_dir)
    work = Path(tempfile.mkdtemp(prefix="hargo-sft-"))
    try:
        args = sft_config(params, work / "trainer", report_to, world_size=launch.num_processes)
        trainer = build_trainer(params, model, tok, records, args)
        max_length = int(sft.max_length)
        truncated = sum(1 for ids in trainer.train_dataset["input_ids"] if len(ids) >= max_length)
        counts = loading.describe(trainer.model)
        t0, c0 = time.perf_counter(), time.process_time()
        out = trainer.train()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        curve = loss_curve(trainer.state.log_history)
        # TRL logs the running count of non-padding tokens seen as `num_tokens`
        tokens = int(max((e.get("num_tokens", 0) for e in trainer.state.log_history), default=0))
        metrics = {
            "initial_loss": curve[0][1] if curve else None,
            "final_loss": curve[-1][1] if curve else None,
            "mean_train_loss": float(out.training_loss),
            "steps": int(trainer.state.global_step),
            "train_seconds": round(seconds, 2),
            "train_cpu_seconds": round(cpu_seconds, 2),
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
            "examples": len(records),
            "truncated": truncated,
            "trainable_parameters": counts["trainable"],
            "bf16": bool(args.bf16),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "loss_curve": curve,
        }
        if curve:
            png = plot_loss(curve, work / "sft_loss.png",
                            f"SFT train loss ({'LoRA' if sft.lora.enabled else 'full'})")
            import mlflow

            if launch.is_main and mlflow.active_run() is not None:
                mlflow.log_artifact(str(png))
        if out_dir is not None:
            if launch.num_processes > 1:
                trainer.accelerator.wait_for_everyone()
            if launch.is_main:   # one writer: atomic_dir's rename would race between processes
                from hargo.training.divergence import DivergenceBounds, training_record

                loading.save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                                   dtype=model_cfg.dtype,
                                   training_record=training_record(
                                       trainer.state.log_history,
                                       DivergenceBounds.of(params.train.divergence)))
        return metrics
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(params: Config) -> dict[str, Any]:
    """Stage ``sft`` (``params``: the typed config): checks inputs (before any training), selects the subset, trains, writes
    ``sft.out_dir`` (merged model) and ``metrics/sft.json``, all inside the MLflow child run
    ``sft``. Returns the metrics written (on every process of a multi-process launch; only the
    main one logs and writes them).

    Raises:
        FileNotFoundError: ``model.out_dir`` missing or incomplete (run ``base_model``).
        HargoInputError: the train split is missing, empty or malformed, or every prompt is
            over ``train.max_prompt_tokens``.
        ValueError: ``sft.max_length`` is past the model's context (``max_position_embeddings``).
    """
    import mlflow

    from hargo import tracking
    from hargo.training.launch import launch_state

    t_start = time.perf_counter()
    cfg = params
    model_dir = loading.resolve_model_dir(cfg.model.out_dir)
    train_path = Path(cfg.data.out_dir) / "train.jsonl"
    records = read_prepared(train_path, require_answer=True)
    tok = loading.load_tokenizer(model_dir)
    subset, skipped = select_subset(records, cfg.sft.samples_per_task,
                                    int(cfg.seed), tok,
                                    int(cfg.train.max_prompt_tokens))
    if not subset:
        raise HargoInputError(train_path, f"every prompt is longer than train.max_prompt_tokens="
                              f"{cfg.train.max_prompt_tokens} tokens (skipped: {skipped})")
    limit = loading.context_length(model_dir)
    if limit is not None and int(cfg.sft.max_length) > limit:
        raise ValueError(f"sft.max_length={cfg.sft.max_length} is past the model's "
                         f"context of {limit} tokens: lower sft.max_length to at most {limit}")
    per_task = {t: sum(1 for r in subset if r["task"] == t) for t in sorted(skipped)}
    launch = launch_state()
    with tracking.stage_run("sft", cfg) if launch.is_main else contextlib.nullcontext():
        metrics = train(cfg, model_dir, subset, cfg.sft.out_dir)
        curve = metrics.pop("loss_curve")
        metrics.update({
            "skipped_too_long": skipped, "skipped_too_long_total": sum(skipped.values()),
            "examples_per_task": per_task, "lora": bool(cfg.sft.lora.enabled),
            "wall_seconds": round(time.perf_counter() - t_start, 2),
        })
        if not launch.is_main:
            return metrics
        tracking.log_split("train", "training", cfg)   # the data version, in the UI
        mlflow.log_metrics({f"sft.{k}": float(v) for k, v in metrics.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)
                            and v is not None})
        mlflow.log_metrics({f"sft.skipped.{t}": n for t, n in skipped.items()})
        mlflow.log_dict({"loss_curve": curve}, "sft_loss_curve.json")
        atomic_write_json(METRICS_PATH, metrics)
    return metrics
