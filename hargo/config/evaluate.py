"""params.yaml ``evaluate``, ``register`` and ``mlflow``, typed: the evaluation of every model,
the registry's promotion gate that reads it (its rule: :mod:`hargo.config.gate_rule`) and the
MLflow experiment both log to (sections of :mod:`hargo.config`).
"""
from __future__ import annotations

from typing import Mapping

from hargo.config import names
from hargo.config.fields import REQUIRED, knob
from hargo.config.gate_rule import check_gate_params
from hargo.config.knobs import _DTYPES, _bool, _budget, _int, _str, section
from hargo.param_values import ParamsError

__all__ = ["Evaluate", "Register", "Mlflow"]


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
                                         "(hargo.config.gate_rule.gate_metrics())", kind="list")
    tolerance: float = knob(0.0, "candidate must not lose more than this on any gate metric", 0)
    resamples: int = _int(2000, "paired bootstrap resamples", 100)
    confidence: float = knob(0.95, "bootstrap interval confidence", 0, 1, lo_open=True,
                             hi_open=True)

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.param_values import as_number

        # numbers as every knob takes them, before the gate's rule (which takes typed values):
        # any spelling, and a whole float (2000.0, 2e3) for the integer (issue 42: the file's
        # `resamples: 2000.0` was refused while `seed: 42.0` passed)
        if isinstance(raw, dict):
            for k, integer in (("tolerance", False), ("resamples", True), ("confidence", False)):
                if k in raw and not isinstance(raw[k], bool):
                    try:
                        raw[k] = as_number(f"register.{k}", raw[k], integer)
                    except ParamsError:
                        pass                    # the gate's rule names what it expects
        check_gate_params(raw)                  # the gate's rule (hargo/config/gate_rule.py)


# -------------------------------------------------------------------------------------- mlflow
@section
class Mlflow:
    """``mlflow``: experiment tracking."""

    experiment: str = _str("hargo", "MLflow experiment name")

    @staticmethod
    def _after(value: "Mlflow", key: str, root: Mapping) -> None:
        names.check_experiment_name("mlflow.experiment", value.experiment)   # MLflow's rule
