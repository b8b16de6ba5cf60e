"""params.yaml ``rl``, typed: the knobs every online RL method shares, its dynamic sampling and
vLLM server blocks, and the ``rl.<method>`` blocks of the :mod:`hargo.methods` registry
(:class:`_MethodBlocks`, which ``compare`` shares; a section of :mod:`hargo.config`).
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from hargo.config import names
from hargo.config.fields import REQUIRED, knob, node
from hargo.config.knobs import _bool, _budget, _int, _names, _str, section
from hargo.config.train import RLLora
from hargo.param_values import ParamsError

__all__ = ["GENERATION_BACKENDS", "DynamicSampling", "VLLMServer", "SERVER_KEYS", "RL"]

#: ``rl.generation_backend``: TRL's transformers generation, its colocated vLLM engine, or a vLLM
#: server started apart (``rl.vllm_server``; hargo/training/vllm_rollout.py).
GENERATION_BACKENDS = ("transformers", "vllm", "vllm-server")


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
        (:class:`hargo.method_config.HargoParams` ...) or of ``compare.<name>``
        (:class:`hargo.config.compare.PreferenceParams` ...).

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
