"""Preference baselines of the comparison: DPO, KTO and SimPO with TRL 1.16's own
trainers, from the SFT model on the pairs of the ``preferences`` stage
(:mod:`hargo.compare.preferences`).

==========  ===============================================  ==================================
method      trainer (trl 1.16)                               loss
==========  ===============================================  ==================================
``dpo``     ``trl.DPOTrainer`` / ``DPOConfig``               sigmoid DPO (Rafailov et al. 2023),
                                                             ``beta = compare.dpo.beta``
``kto``     ``trl.KTOTrainer`` / ``KTOConfig``               KTO (Ethayarajh et al. 2024),
                                                             ``beta = compare.kto.beta``
``simpo``   ``trl.experimental.cpo.CPOTrainer`` /            SimPO (Meng et al. 2024):
            ``CPOConfig(loss_type="simpo", cpo_alpha=0)``    ``beta = compare.simpo.beta``,
                                                             ``simpo_gamma = compare.simpo.gamma``
==========  ===============================================  ==================================

Model: LoRA (params ``rl.lora``, :func:`hargo.training.common.lora_config`) on the SFT model, or
full fine-tuning when ``rl.lora.enabled`` is false. The reference model of DPO and KTO is the SFT
model itself: with LoRA, TRL computes the reference log-probs with the adapter disabled (no
second copy in memory); without LoRA, TRL loads a frozen copy. SimPO has no reference model.

Budget (the comparison's, same as the RL methods): ``compare.steps`` optimizer steps of
``compare.prompts_per_step`` pairs each, so every method sees ``steps * prompts_per_step``
prompts. The pairs are drawn by :func:`pair_order` (seeded; cycled when there are fewer than
needed) and fed in that order (``train_sampling_strategy="sequential"``); one step is one
batch, no gradient accumulation. KTO is unpaired: a pair gives two examples, its chosen
completion labelled desirable (True) and its rejected one undesirable (False), so a KTO batch
holds ``2 * prompts_per_step`` completions of ``prompts_per_step`` prompts (:func:`kto_rows`).

No checkpoints, no resume: a run is ``compare.steps`` optimizer steps (2 in params.yaml, a short
run), so a preference run writes no checkpoint (``save_strategy="no"``; its trainer folder is
a temporary one, removed when the run ends or fails) and an interrupted run starts over from the
SFT model. Being seeded (``seed``: LoRA init, pair order, trainer) it then ends on the weights of
an uninterrupted run (``tests/test_preference_training.py``). Unlike the RL methods, there is no
``checkpoints/compare/<run>`` folder for these methods.

Lengths: prompts were capped upstream (``train.max_prompt_tokens``, by
:func:`hargo.training.common.select_subset` in the preferences stage); every trainer gets
``max_length = sft.max_length`` (prompt + completion tokens), so no sequence can be longer.
DPO and SimPO cut the completion's tail past it; KTO drops an example whose prompt alone fills it.
"""
from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from hargo.config import Config
from hargo.io import HargoInputError, read_jsonl
from hargo import hardware
from hargo.models import loading
from hargo.training import common

__all__ = ["METHODS", "check_params", "check_pairs", "pair_order", "dpo_rows", "kto_rows",
           "build_config", "build_trainer", "train_preference"]

METHODS = ("dpo", "kto", "simpo")
#: Metrics TRL logs per step that the result keeps (their last logged value).
FINAL_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
              "logps/chosen", "logps/rejected", "kl", "nll_loss")


def check_params(params: Config, method: str) -> Config:
    """Check ``method`` (one of :data:`METHODS`) and that the typed config ``params`` has the
    ``compare`` section a preference run reads (its values, ``compare.<method>``'s
    :class:`~hargo.config.compare.PreferenceParams` included, were checked when the config was
    built); returns ``params``.

    Raises:
        ParamsError: naming the bad key (or the unknown method); no ``compare`` section.
    """
    from hargo.params import ParamsError

    if method not in METHODS:
        raise ParamsError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    if params.compare is None:
        raise ParamsError("compare: missing (no key 'compare')")
    return params


def _message_list(x, role: str | None = None) -> bool:
    return isinstance(x, list) and bool(x) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str)
        and (role is None or m.get("role") == role) for m in x)


def check_pairs(path: str | Path, pairs: Sequence[Mapping]) -> None:
    """Check preference pairs (:mod:`hargo.compare.preferences` records): a non-empty list whose
    records have ``prompt`` (non-empty list of messages) and ``chosen`` / ``rejected`` (lists of
    assistant messages).

    Raises:
        HargoInputError: no pairs, or a malformed record (names ``path``, record and field).
    """
    if not pairs:
        raise HargoInputError(path, "no preference pairs: every prompt's samples tied (see "
                              "stats.json); re-run the preferences stage with more prompts "
                              "(compare.preferences.samples_per_task) or a higher temperature")
    for i, p in enumerate(pairs):
        if not isinstance(p, Mapping):
            raise HargoInputError(path, "expected a JSON object", record=i)
        if not _message_list(p.get("prompt")):
            raise HargoInputError(path, "expected a non-empty list of {role, content} messages",
                                  record=i, field="prompt")
        for f in ("chosen", "rejected"):
            if not _message_list(p.get(f), "assistant"):
                raise HargoInputError(path, "expected a list of assistant messages "
                                      "([{'role': 'assistant', 'content': ...}])",
                                      record=i, field=f)


def pair_order(n_pairs: int, needed: int, seed: int) -> list[int]:
    """Indices of the pairs to train on, in order: ``needed`` draws from ``n_pairs`` pairs.

    Successive seeded permutations of ``range(n_pairs)`` (``random.Random(seed)``) are
    concatenated and cut at ``needed``: with more pairs than needed, a seeded draw without
    replacement; with fewer, every pair once per cycle before any repeats.

    Raises:
        ValueError: ``n_pairs < 1`` or ``needed < 0``.
    """
    if n_pairs < 1 or needed < 0:
        raise ValueError(f"pair_order: need n_pairs >= 1 and needed >= 0, got {n_pairs}, {needed}")
    rng, order = random.Random(seed), []
    while len(order) < needed:
        perm = list(range(n_pairs))
        rng.shuffle(perm)
        order += perm
    return order[:needed]


def _messages(ms: Sequence[Mapping]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in ms]


def dpo_rows(pairs: Sequence[Mapping], order: Sequence[int]) -> list[dict]:
    """TRL conversational preference rows ``{"prompt", "chosen", "rejected"}`` in ``order``
    (DPO and SimPO)."""
    return [{"prompt": _messages(pairs[i]["prompt"]), "chosen": _messages(pairs[i]["chosen"]),
             "rejected": _messages(pairs[i]["rejected"])} for i in order]


def kto_rows(pairs: Sequence[Mapping], order: Sequence[int], prompts_per_step: int) -> list[dict]:
    """TRL conversational unpaired rows ``{"prompt", "completion", "label"}`` for KTO.

    Each batch of ``prompts_per_step`` pairs (consecutive in ``order``) becomes ``2 *
    prompts_per_step`` rows: the batch's chosen completions (label True) and then its rejected
    ones (label False). TRL estimates KTO's KL term from each row's prompt with the previous
    row's completion within the batch (rotation by one, ``KTOTrainer._prepare_dataset``); this
    layout pairs a prompt with another prompt's completion whenever ``prompts_per_step > 1``.
    """
    rows = []
    for start in range(0, len(order), prompts_per_step):
        batch = [pairs[i] for i in order[start:start + prompts_per_step]]
        for key, label in (("chosen", True), ("rejected", False)):
            rows += [{"prompt": _messages(p["prompt"]), "completion": _messages(p[key]),
                      "label": label} for p in batch]
    return rows


def build_config(params: Config, method: str, output_dir: str | Path, seed: int):
    """The TRL config of one run of the typed config ``params``: ``DPOConfig``, ``KTOConfig``
    or ``CPOConfig`` (SimPO).

    Shared: ``max_steps = compare.steps``, one batch per step (``per_device_train_batch_size =
    compare.prompts_per_step``, KTO twice that), sequential sampling (the order is
    :func:`pair_order`'s), ``max_length = sft.max_length``, device and precision from
    :func:`hargo.hardware.trainer_precision_kwargs`, ``gradient_checkpointing =
    train.gradient_checkpointing`` (TRL's default is True), logging every step, no checkpoints, no evaluation, ``report_to``
    none (the caller logs to MLflow), no progress bars.
    """
    from hargo.hardware import trainer_precision_kwargs

    c = params.compare
    m = c.method(method)            # compare.<method>: PreferenceParams / SimPOParams
    pps = int(c.prompts_per_step)
    gc = bool(params.train.gradient_checkpointing)
    shared = dict(
        output_dir=str(output_dir), seed=int(seed), data_seed=int(seed),
        max_steps=int(c.steps), num_train_epochs=1,
        per_device_train_batch_size=2 * pps if method == "kto" else pps,
        gradient_accumulation_steps=1, learning_rate=float(m.learning_rate),
        beta=float(m.beta), max_length=int(params.sft.max_length),
        gradient_checkpointing=gc,
        gradient_checkpointing_kwargs={"use_reentrant": False} if gc else None,
        train_sampling_strategy="sequential",
        logging_steps=1, logging_first_step=True, disable_tqdm=True,
        logging_nan_inf_filter=False,      # the divergence guard must see a NaN loss
        save_strategy="no", eval_strategy="no", report_to="none", run_name=method,
        dataloader_num_workers=0, **trainer_precision_kwargs(params.train),
    )
    if method == "dpo":
        from trl import DPOConfig

        return DPOConfig(loss_type=["sigmoid"], **shared)
    if method == "kto":
        from trl import KTOConfig

        return KTOConfig(loss_type="kto", desirable_weight=1.0, undesirable_weight=1.0, **shared)
    if method == "simpo":
        from trl.experimental.cpo import CPOConfig

        # remove_unused_columns=False: CPO's collator needs its tokenised columns (it would set
        # it itself, with a warning)
        return CPOConfig(loss_type="simpo", cpo_alpha=0.0, simpo_gamma=float(m.gamma),
                         remove_unused_columns=False, **shared)
    raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")


@contextlib.contextmanager
def _quiet_datasets():
    """No ``datasets`` progress bars while the trainer tokenises (restored afterwards)."""
    from datasets.utils import logging as ds_logging

    was_enabled = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            ds_logging.enable_progress_bar()


def build_trainer(params: Config, method: str, model, tokenizer, rows: list[dict],
                  args):
    """The TRL trainer of ``method`` on ``rows`` with the LoRA of ``rl.lora`` (None: full) of
    the typed config ``params``."""
    from datasets import Dataset

    from hargo.training.divergence import DivergenceBounds, DivergenceGuard

    dataset = Dataset.from_list(rows)
    peft = common.lora_config(params.rl.lora)
    kw = dict(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
              peft_config=peft,
              callbacks=[DivergenceGuard(DivergenceBounds.of(params.train.divergence),
                                         method)])
    with _quiet_datasets():
        if method == "dpo":
            from trl import DPOTrainer

            return DPOTrainer(**kw)
        if method == "kto":
            from trl import KTOTrainer

            return KTOTrainer(**kw)
        from trl.experimental.cpo import CPOTrainer

        return CPOTrainer(**kw)


def _final_metrics(log_history: Sequence[Mapping]) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in log_history:
        if "train_loss" in e:
            continue
        for k in FINAL_KEYS:
            if k in e and e[k] is not None:
                out[k] = float(e[k])
    return out


def train_preference(params: Config, method: str, model_dir: str | Path,
                     pairs: Sequence[Mapping] | str | Path, out_dir: str | Path | None,
                     seed: int) -> dict[str, Any]:
    """Train ``method`` (dpo | kto | simpo) from the model in ``model_dir`` on preference pairs;
    write the merged model to ``out_dir`` (skipped when None).

    Args:
        params: the typed config (``compare``, ``rl.lora``,
            ``sft.max_length``, ``train``, ``model.dtype``).
        method: "dpo", "kto" or "simpo".
        model_dir: a complete model folder (the SFT model).
        pairs: pair records (:mod:`hargo.compare.preferences`), or the path of a pairs.jsonl.
        out_dir: the merged model's folder (whole or not at all).
        seed: the run's seed (LoRA init, pair order, trainer).

    No checkpoint is written: an interrupted call leaves nothing behind (no ``out_dir``, no
    trainer folder) and calling it again trains from the start to the same result (see the
    module docstring).

    Returns:
        ``method``, ``seed``, ``steps`` (optimizer steps run), ``pairs_available``,
        ``pairs_used`` (distinct pairs trained on), ``prompts_seen`` (``steps *
        prompts_per_step``), ``completions_seen`` (KTO: 2 per prompt; DPO/SimPO: 2 per pair as
        well, chosen and rejected), ``train_s``, ``loss_curve`` ([(step, loss)]),
        ``initial_loss``/``final_loss``, ``final`` (last logged ``rewards/*``, ``logps/*``,
        ``kl``, ``nll_loss`` where the trainer logs them), ``bf16``, ``lora``,
        ``trainable_parameters``.

    Raises:
        ParamsError: bad params or unknown method.
        FileNotFoundError: ``model_dir`` missing or incomplete.
        HargoInputError: no pairs, or malformed ones (names pairs.jsonl, record, field).
    """
    cfg = check_params(params, method)
    pairs = _checked_pairs(cfg, pairs)
    model_dir = loading.resolve_model_dir(model_dir)
    order, rows = _training_rows(cfg, method, pairs, int(seed))
    hardware.setup_torch(cfg, seed=int(seed))
    model = loading.load_model(model_dir, dtype="float32",
                              trust_remote_code=bool(cfg.model.trust_remote_code))
    tok = loading.load_tokenizer(model_dir)
    work = Path(tempfile.mkdtemp(prefix=f"hargo-{method}-"))
    try:
        args = build_config(cfg, method, work / "trainer", int(seed))
        trainer = build_trainer(cfg, method, model, tok, rows, args)
        counts = loading.describe(trainer.model)
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
        result = _result(cfg, method, int(seed), trainer, pairs, order, train_s, counts, args)
        if out_dir is not None:
            from hargo.training.divergence import DivergenceBounds, training_record

            loading.save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                               dtype=cfg.model.dtype,
                               training_record=training_record(
                                   trainer.state.log_history,
                                   DivergenceBounds.of(cfg.train.divergence)))
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _checked_pairs(cfg: Config, pairs: Sequence[Mapping] | str | Path) -> Sequence[Mapping]:
    """The pair records (read when ``pairs`` is a path), checked.

    Raises:
        HargoInputError: no pairs, or malformed ones (names pairs.jsonl, record, field).
    """
    if isinstance(pairs, (str, Path)):
        path = Path(pairs)
        pairs = read_jsonl(path)
    else:
        path = Path(cfg.compare.preferences.out_dir) / "pairs.jsonl"
    check_pairs(path, pairs)
    return pairs


def _training_rows(cfg: Config, method: str, pairs: Sequence[Mapping],
                   seed: int) -> tuple[list[int], list[dict]]:
    """``(order, rows)``: the pair order of ``compare.steps x compare.prompts_per_step`` draws
    (:func:`pair_order`) and the trainer's rows in that order."""
    steps, pps = int(cfg.compare.steps), int(cfg.compare.prompts_per_step)
    order = pair_order(len(pairs), steps * pps, seed)
    rows = kto_rows(pairs, order, pps) if method == "kto" else dpo_rows(pairs, order)
    return order, rows


def _result(cfg: Config, method: str, seed: int, trainer, pairs: Sequence[Mapping],
            order: list[int], train_s: float, counts: dict, args) -> dict[str, Any]:
    """What :func:`train_preference` returns (see there) for the trained ``trainer``."""
    from hargo.training.sft import loss_curve

    pps = int(cfg.compare.prompts_per_step)
    curve = loss_curve(trainer.state.log_history)
    return {
        "method": method, "seed": seed, "steps": int(trainer.state.global_step),
        "pairs_available": len(pairs), "pairs_used": len(set(order)),
        "prompts_seen": int(trainer.state.global_step) * pps,
        "completions_seen": int(trainer.state.global_step) * pps * 2,
        "train_s": round(train_s, 3),
        "loss_curve": curve,
        "initial_loss": curve[0][1] if curve else None,
        "final_loss": curve[-1][1] if curve else None,
        "final": _final_metrics(trainer.state.log_history),
        "bf16": bool(args.bf16), "lora": bool(cfg.rl.lora.enabled),
        "trainable_parameters": counts["trainable"],
    }
