#!/usr/bin/env bash
# The main job on a fresh clone: set up, run the whole pipeline on the real HPC-GPT data with the
# embedded SmolLM2-135M-Instruct on the CPU, then print the summary table.
#   scripts/main.sh            CPU (this machine's kind)
#   scripts/main.sh --gpu      GPU host: CUDA torch + CUDA vLLM
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "$@"
source .venv/bin/activate
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-0}"
start=$(date +%s)
# The raw data from the DVC remote, then every stage. (Not `dvc repro --pull`: with --pull, DVC
# skips a stage whose only change is a missing output, so a fresh clone would never re-run
# `validate` and get its report. The stage outputs are not in the read-only remote anyway.)
dvc pull data/raw/hpc-gpt.dvc
dvc repro
hargo summary
echo "pipeline wall time: $(( $(date +%s) - start )) s"
