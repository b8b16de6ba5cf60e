"""The one place that decides device, precision and CPU threads for every stage.

Three hardware profiles are supported, and every trainer config hargo builds (SFT, the RL
methods, PPO, the preference trainers, the HPC-GPT baseline) takes its device and precision
fields from :func:`trainer_precision_kwargs`, never from its own test of the machine:

========== ======================================= =========== ============= ================
profile    machine                                 device      bf16 autocast generation dtype
========== ======================================= =========== ============= ================
``cpu``    CPU without native bf16 (AVX2 only)     CPU         off           float32
``cpu-bf16`` CPU with AVX512-BF16 or AMX-BF16      CPU         ``train.bf16`` bfloat16
``cuda``   an NVIDIA GPU (bf16 on Ampere or newer) CUDA        ``train.bf16`` bfloat16
========== ======================================= =========== ============= ================

Why ``use_cpu`` matters: transformers' ``TrainingArguments`` refuses ``bf16=True`` unless a GPU
supports it *or* ``use_cpu=True`` ("Your setup doesn't support bf16/gpu"); on a host without
CUDA hargo therefore always sets ``use_cpu=True``, which also makes accelerate use gloo when a
stage is launched on several CPU processes.

Tests simulate a profile by patching :func:`detect_profile` (the machine is not changed).

Threads (``train.threads``): an integer pins torch's intra-op thread count; ``auto`` takes the
cores this process may run on that are not busy right now (:func:`auto_threads`), re-checked at
the start of every stage. On a 2-core machine 2 threads are ~1.7x faster than 1 when the machine
is quiet, but ~10x *slower* when another process keeps one core busy (OpenMP threads spin and
wait on each other): see ``benchmarks/bench_hardware.py`` and the tables in docs/results.md.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hargo.config import Config, Train

__all__ = ["HardwareProfile", "PROFILES", "detect_profile", "cpu_flags", "native_bf16_cpu",
           "use_bf16", "trainer_precision_kwargs", "generation_dtype", "GENERATION_DTYPES",
           "auto_threads", "resolve_threads", "setup_torch", "busy_cores", "allowed_cores", "describe_cpu"]

GENERATION_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class HardwareProfile:
    """What the training and generation code needs to know about the machine.

    Attributes:
        name: ``"cpu"``, ``"cpu-bf16"`` or ``"cuda"``.
        device: ``"cpu"`` or ``"cuda"``.
        native_bf16: bf16 matmuls run natively (a GPU with bf16, or a CPU with AVX512-BF16 /
            AMX-BF16); elsewhere bf16 is emulated and slower than fp32.
    """

    name: str
    device: str
    native_bf16: bool

    @property
    def on_cpu(self) -> bool:
        """True when training runs on the CPU (``TrainingArguments.use_cpu``)."""
        return self.device == "cpu"


PROFILES: dict[str, HardwareProfile] = {
    "cpu": HardwareProfile("cpu", "cpu", False),
    "cpu-bf16": HardwareProfile("cpu-bf16", "cpu", True),
    "cuda": HardwareProfile("cuda", "cuda", True),
}


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags of the first ``flags`` line of ``cpuinfo`` (empty when the file
    cannot be read, e.g. not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def native_bf16_cpu() -> bool:
    """Whether this CPU runs bf16 natively: oneDNN supports bf16 here and the CPU has
    AMX-BF16 or AVX512-BF16 (from ``/proc/cpuinfo``). AVX2-only CPUs emulate bf16, slower than
    fp32."""
    import torch

    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
    except (AttributeError, RuntimeError):
        return False
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def detect_profile() -> HardwareProfile:
    """This machine's profile: ``cuda`` when torch sees a GPU (``native_bf16`` from
    ``torch.cuda.is_bf16_supported()``; a pre-Ampere GPU gets a ``cuda`` profile without bf16),
    else ``cpu-bf16`` or ``cpu`` by :func:`native_bf16_cpu`. Cheap; not cached, so a test can
    patch it."""
    import torch

    if torch.cuda.is_available():
        bf16 = bool(torch.cuda.is_bf16_supported())
        return PROFILES["cuda"] if bf16 else HardwareProfile("cuda", "cuda", False)
    return PROFILES["cpu-bf16"] if native_bf16_cpu() else PROFILES["cpu"]


def _train_section(params: "Config | Train") -> "Train":
    """The typed ``train`` section of ``params``: a :class:`hargo.config.Train` as it is, else
    the :class:`hargo.config.Config`'s node."""
    from hargo.config import Train

    return params if isinstance(params, Train) else params.train


def use_bf16(params: "Config | Train", profile: HardwareProfile | None = None) -> bool:
    """bf16 autocast for training: ``train.bf16`` and the profile's ``native_bf16``.

    ``params``: the typed config (:class:`hargo.config.Config`) or its typed ``train`` section
    (:class:`hargo.config.Train`); ``profile``: default :func:`detect_profile`. Raises
    nothing."""
    profile = profile or detect_profile()
    return _train_section(params).bf16 and profile.native_bf16


def trainer_precision_kwargs(params: "Config | Train",
                             profile: HardwareProfile | None = None) -> dict[str, bool]:
    """The device and precision fields of a ``transformers.TrainingArguments`` (and every TRL
    config derived from it) for ``params`` (the typed config, :class:`hargo.config.Config`, or
    its typed ``train`` section, :class:`hargo.config.Train`) on ``profile`` (default:
    :func:`detect_profile`).

    Returns ``{"use_cpu", "bf16", "fp16", "dataloader_pin_memory"}``: ``use_cpu`` on a CPU
    profile (required there for bf16, see the module docstring), ``bf16`` from
    :func:`use_bf16`, ``fp16`` always False (hargo trains in fp32 weights with bf16 autocast;
    fp16 needs a loss scaler and gains nothing on bf16 hardware), pinned memory only on CUDA.
    """
    profile = profile or detect_profile()
    return {"use_cpu": profile.on_cpu, "bf16": use_bf16(params, profile), "fp16": False,
            "dataloader_pin_memory": not profile.on_cpu}


def generation_dtype(requested: str | None, profile: HardwareProfile | None = None,
                     param: str = "evaluate.dtype") -> str:
    """The weights' dtype for generation (vLLM and transformers backends).

    ``auto`` (or None): ``bfloat16`` where bf16 is native (:class:`HardwareProfile`), else
    ``float32``. Any other value is returned as is.

    Raises:
        ValueError: not one of auto, float32, bfloat16, float16 (the message names ``param``).
    """
    requested = requested or "auto"
    if requested not in GENERATION_DTYPES:
        raise ValueError(f"{param}: must be one of {', '.join(GENERATION_DTYPES)}, "
                         f"got {requested!r}")
    if requested != "auto":
        return requested
    profile = profile or detect_profile()
    return "bfloat16" if profile.native_bf16 else "float32"


def allowed_cores() -> int:
    """CPUs this process may run on: its affinity set, capped by a cgroup v2 CPU quota
    (``/sys/fs/cgroup/cpu.max``) when one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _cpu_times(stat: str) -> dict[str, tuple[int, int]]:
    """``{"cpuN": (busy, total)}`` jiffies from the text of ``/proc/stat``."""
    out = {}
    for line in stat.splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *vals = line.split()
            v = [int(x) for x in vals[:8]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            out[name] = (sum(v) - idle, sum(v))
    return out


def busy_cores(window_s: float = 0.3, stat_path: str | Path = "/proc/stat") -> float:
    """How many of this process's CPUs other processes kept busy over ``window_s`` seconds
    (the sum of their busy fractions, from two reads of ``/proc/stat``; this process sleeps in
    between, so its own load is not counted). 0.0 where ``/proc/stat`` cannot be read."""
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    except (AttributeError, OSError):
        allowed = None
    try:
        a = _cpu_times(Path(stat_path).read_text())
        time.sleep(window_s)
        b = _cpu_times(Path(stat_path).read_text())
    except OSError:
        return 0.0
    busy = 0.0
    for cpu, (busy1, total1) in b.items():
        if allowed is not None and cpu not in allowed or cpu not in a:
            continue
        d_total = total1 - a[cpu][1]
        if d_total > 0:
            busy += (busy1 - a[cpu][0]) / d_total
    return busy


def auto_threads(allowed: int, busy: float) -> int:
    """The ``auto`` thread rule: the allowed cores minus the busy ones, at least 1.

    A core counts as busy from a quarter of its time on (``floor(busy + 0.75)`` cores): a
    neighbour that keeps a core busy even part of the time makes a spinning OpenMP thread on
    that core wait, which is what makes 2 threads ~10x slower than 1 on a shared 2-core machine.

    >>> auto_threads(2, 0.05), auto_threads(2, 0.3), auto_threads(2, 1.0), auto_threads(2, 2.0)
    (2, 1, 1, 1)
    """
    return max(1, int(allowed) - math.floor(max(0.0, float(busy)) + 0.75))


def resolve_threads(setting: int | str) -> int:
    """torch's intra-op thread count for ``train.threads``: a positive integer as is, 0 for
    torch's own default (``torch.get_num_threads()``), ``auto`` for :func:`auto_threads` of
    :func:`allowed_cores` and :func:`busy_cores`.

    Raises:
        ValueError: anything else (names ``train.threads``).
    """
    if setting == "auto":
        return auto_threads(allowed_cores(), busy_cores())
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise ValueError(f"train.threads: expected 'auto' or an integer >= 0, got {setting!r}")
    if setting == 0:
        import torch

        return int(torch.get_num_threads())
    return setting


def describe_cpu() -> str:
    """One line naming this machine for a benchmark table: CPU model, cores allowed, and the
    bf16 flags found (``avx512_bf16``, ``amx_bf16``) or ``no native bf16``."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return (f"{model}, {allowed_cores()} cores, "
            f"{'+'.join(flags) if flags else 'no native bf16 (AVX2)'}")


def setup_torch(params: "Config", seed: int | None = None) -> int:
    """Set torch's intra-op thread count from ``train.threads`` (an integer, 0 for torch's
    default, or ``auto``: see :func:`hargo.hardware.resolve_threads`, re-checked at every call)
    and seed Python, NumPy and torch (``transformers.set_seed`` of ``seed``, default the
    config's).

    ``params``: the typed config.

    Returns the thread count in force."""
    import torch
    from transformers import set_seed

    threads = resolve_threads(params.train.threads)
    torch.set_num_threads(threads)
    set_seed(int(params.seed if seed is None else seed))
    return threads
