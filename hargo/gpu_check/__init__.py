"""The GPU check: one prepared, self-contained run for the lent GPU machine, and its CPU dry run.

    python -m hargo.gpu_check [--dry-run | --smoke] [--out DIR] [--model DIR] [--data DIR]
                              [--parts correctness,speed,compare] [--time-budget-s N]

``scripts/gpu_check.sh`` wraps it: ``build`` makes the payload here, ``stage`` and ``gpu`` are the
two device calls, ``dry-run`` is the CPU run CI tests (``tests/test_gpu_check.py``).

Modes: ``--dry-run``: the CPU (even on a GPU host), a tiny random Llama with SmolLM2's tokenizer,
synthetic records of the four tasks (or ``--model``/``--data`` when given), 1-2 steps per run,
and MLflow, Prefect, DVC, Great Expectations and vLLM hidden from the process, since the GPU
machine has none of them. ``--smoke``: the same sizes, on the device (device call 1 runs the
correctness part so, as the code's first GPU run, before call 2 spends ten minutes). Neither:
the GPU run (SmolLM2-135M, the prepared splits).

One module per concern:

================ ===================================================================================
``common``       constants (:data:`PARTS`, :data:`PART_CAPS`, :data:`OUTPUT_FILES`), JSON output,
                 the log line, hidden packages, :class:`Deadline`, memory, the environment
``plan``         :func:`make_plan`: the sizes of every part, GPU run or dry run
``inputs``       the fixed batch (:data:`FIXED_GROUPS`, :func:`fixed_rollout`), synthetic records,
                 the dry run's model and data
``correctness``  part ``correctness``: the same two ``hargo`` steps CPU fp32 vs device fp32/bf16,
                 state placement, a checkpoint round trip, every estimator on both devices
``speed``        part ``speed``: seconds per RL step split into generation / scoring / update
``compare``      part ``compare``: SFT, grpo/dr_grpo/hargo on one budget, greedy eval, WinRate,
                 paired bootstrap; :func:`rescore`
``outputs``      ``generations.jsonl.gz``, ``speed.png``, ``compare.png``
``run``          :func:`run_check`: the parts in turn within the time budget, into ``--out``
``tracking``     the MLflow-free ``tracking.jsonl`` (:class:`Tracker`) and :func:`import_mlflow`
``payload``      MiniLM int8 packing, the GGUF conversion, :func:`preflight`
``cli``          :func:`main`
================ ===================================================================================

Other entry points, used by ``scripts/gpu_check.sh``: ``--preflight`` (versions, CUDA, imports;
``preflight.json``), ``--pack-minilm SRC DST``, ``--unpack-minilm SRC DST [--shim SITE]``,
``--convert-gguf GGUF DST``, ``--save-tokenizer DIR``; and here, after the run:
``--import-mlflow DIR`` (the tracking log into MLflow) and ``--rescore DIR`` (every metric again
with the exact MiniLM).
"""
from hargo.gpu_check.cli import main
from hargo.gpu_check.common import (BOX_MISSING, OUTPUT_FILES, PART_CAPS, PARTS, Deadline,
                                    hide_packages)
from hargo.gpu_check.compare import headline, rescore
from hargo.gpu_check.correctness import ROUNDTRIP_TOL, TOLERANCES
from hargo.gpu_check.inputs import FIXED_GROUPS, fixed_records, fixed_rollout, synthetic_records
from hargo.gpu_check.payload import convert_gguf, pack_minilm, preflight, unpack_minilm
from hargo.gpu_check.plan import Plan, make_plan
from hargo.gpu_check.run import run_check
from hargo.gpu_check.tracking import Tracker, import_mlflow

__all__ = ["PARTS", "PART_CAPS", "BOX_MISSING", "OUTPUT_FILES", "headline", "TOLERANCES",
           "ROUNDTRIP_TOL", "FIXED_GROUPS", "Tracker", "Deadline", "Plan", "make_plan",
           "fixed_records", "fixed_rollout", "synthetic_records", "hide_packages", "run_check",
           "pack_minilm", "unpack_minilm", "convert_gguf", "import_mlflow", "rescore",
           "preflight", "main"]
