#!/usr/bin/env bash
# The test suite (the README's test command). Runs in the environment made by scripts/setup.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
       PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
# glibc's malloc serves every allocation over its mmap threshold (at most 32 MiB) with a fresh
# mmap and unmaps it on free, so each training step faults the logits (vocabulary x tokens x 4
# bytes, ~200 MB for the tiny model's 49k vocabulary) in again page by page: 14 M page faults and
# 39 s of system time in the 98 s GPU-check dry run. mmap_max=0 serves them from the heap and
# trim_threshold keeps freed memory for the next step (PyTorch's CPU tuning guide swaps in
# jemalloc/tcmalloc for the same reason; these glibc tunables need no install and are ignored
# elsewhere): the dry run 49 s, 2.5 s system, 0.57 M faults, peak RSS 2.4 GB instead of 2.1 GB
# (docs/development.md "The suite's allocator"). Every process the suite starts inherits it.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
# pytest-randomly (dev extra) shuffles the test order and reseeds random/numpy per test from one
# seed, new each run. -q hides its header line, so the seed is picked and printed here (again at
# the end of a failed run); repeat an order with: scripts/test.sh ... -p randomly --randomly-seed=N
# (-p no:randomly: file order).
args=("$@")
seed=""
if [[ " $* " != *" --randomly-seed"* && " $* " != *"no:randomly"* ]] \
   && .venv/bin/python -c "import pytest_randomly" 2>/dev/null; then
  seed=$(( (RANDOM << 15 | RANDOM) ))
  args+=("--randomly-seed=$seed")
  echo "pytest-randomly: --randomly-seed=$seed"
fi
# pytest-xdist (dev extra): HARGO_TEST_WORKERS processes (default 2, one a core of the 2-core
# machines this is measured on; 0: one process). Every test is single-threaded
# (OMP_NUM_THREADS=1 above) and the distributed tests pick free ports. --dist loadgroup: the
# tests of one xdist_group (the shared tiny pipeline, tests/flow_project.PIPELINE_GROUP, and the
# modules with costly module fixtures) run on one worker, which builds their fixtures once.
# Measured alone on a fresh clone of 5cd0f5b on a 2-core AMD EPYC with AVX512-BF16 and no AMX,
# 1,526 tests: 15 min 24 s (2026-12-07). On a 2-core AVX2-only AMD EPYC, 1,185 tests at d0d2b6a:
# 25 min 11 s (2026-12-04). Every figure, with its machine: docs/development.md "How long the
# suite takes".
if [[ " $* " != *" -n "* && " $* " != *" -n="* && " $* " != *"no:xdist"* ]] \
   && .venv/bin/python -c "import xdist" 2>/dev/null; then
  args+=("-n" "${HARGO_TEST_WORKERS:-2}" "--dist" "loadgroup")
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "${args[@]}"
rc=$?
# pytest's 5 means no test ran: that is a failure here, never a pass.
[[ $rc -eq 5 ]] && echo "no tests ran" >&2
[[ $rc -ne 0 && -n $seed ]] && echo "test order: repeat it with -p randomly --randomly-seed=$seed" >&2
exit $rc
