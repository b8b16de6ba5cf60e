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
dvc repro --pull
hargo summary
echo "pipeline wall time: $(( $(date +%s) - start )) s"
