#!/usr/bin/env bash
# Screenshots of the MLflow UI after the main job, taken in headless Chromium, into docs/mlflow/:
#   experiment.png       the hargo experiment (a training experiment: it opens on its runs)
#   run.png              the evaluate run: its datasets (the prepared split, DVC hash as digest)
#   registered.png       the registered model hargo-hpc: versions, aliases, the gate's tag
#   version.png          the newest version: tags, the gate's reason (with intervals) as description
#   logged_model.png     that version's logged model: the evaluation metrics linked to it
# Usage: scripts/mlflow_screenshots.sh [OUT_DIR]   (run from a project that ran `dvc repro`)
# Needs: the project's .venv (mlflow) and Chromium (Debian: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/mlflow}"
db="mlruns/mlflow.db"
[[ -f "$db" ]] || { echo "no MLflow store at $db: run the main job (scripts/main.sh) first" >&2; exit 1; }
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[[ -n "$browser" ]] || { echo "no Chromium found: install it (Debian: apt-get install chromium)" >&2; exit 1; }
py=".venv/bin/python"
[[ -x "$py" ]] || py=python3
port="${HARGO_UI_PORT:-5077}"

"$py" -m hargo.cli tracking-reroot >/dev/null   # a copied project: artifacts under this clone

# the ids the pages need, read from the store
read -r exp_id run_id model_id version < <("$py" - "$db" <<'EOF'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
exp = con.execute("SELECT experiment_id FROM experiments WHERE name='hargo'").fetchone()
if exp is None:
    sys.exit("no experiment 'hargo' in the store: run the main job first")
run = con.execute("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid=r.run_uuid "
                  "WHERE r.experiment_id=? AND t.key='hargo.stage' AND t.value='evaluate' "
                  "ORDER BY r.start_time DESC LIMIT 1", exp).fetchone()
mv = con.execute("SELECT version, source FROM model_versions WHERE name='hargo-hpc' "
                 "ORDER BY version DESC LIMIT 1").fetchone()
if run is None or mv is None:
    sys.exit("no evaluate run or no registered hargo-hpc version: run the main job first")
model_id = mv[1].split("models:/")[-1].split("/")[0]
print(exp[0], run[0], model_id, mv[0])
EOF
)

log="$(mktemp)"
"${py%/python}/mlflow" ui --backend-store-uri "sqlite:///$PWD/$db" --host 127.0.0.1 --port "$port" \
  >"$log" 2>&1 &
ui=$!
profile="$(mktemp -d)"
trap 'kill $ui 2>/dev/null || true; rm -rf "$profile" "$log"' EXIT
for _ in $(seq 60); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $ui 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "mlflow ui did not start" >&2; cat "$log" >&2; exit 1; }

mkdir -p "$out"
base="http://127.0.0.1:$port/#"
shot() {   # name url
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars --window-size=1920,1080 \
    --virtual-time-budget=20000 --screenshot="$out/$1.png" "$2" >/dev/null 2>&1
  echo "[screenshots] $out/$1.png <- $2"
}
# MLflow 3.17's UI opens every experiment in its GenAI view unless the URL (or the browser's
# remembered choice) says "Model training": the experiment's mlflow.experimentKind tag no longer
# decides. docs/tracking.md gives the same URLs.
ml="workflowType=machine_learning"
shot experiment "$base/experiments/$exp_id?$ml"
shot run "$base/experiments/$exp_id/runs/$run_id?$ml"
shot registered "$base/models/hargo-hpc?$ml"
shot version "$base/models/hargo-hpc/versions/$version?$ml"
shot logged_model "$base/experiments/$exp_id/models/$model_id?$ml"
