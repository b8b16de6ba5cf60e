#!/usr/bin/env bash
# Mutation testing of the pure modules with mutmut 3, against the fast tests only (pytest -m fast).
#
# Usage: scripts/mutation.sh [module ...]
#   modules: advantages stats gate split metrics rewards (default: all of them)
#   gate is the registry gate (hargo/gate.py: gate(); hargo/config/gate_rule.py: check_gate_params()).
#
# Each module runs in its own scratch copy ($MUTATION_DIR/<module>, default
# ${TMPDIR:-/tmp}/hargo-mutation) holding hargo/, tests/, benchmarks/, scripts/, params.yaml,
# dvc.yaml, compare/dvc.yaml, data/raw/hpc-gpt.dvc (tests read these while collecting or running)
# and a
# pyproject.toml with a generated [tool.mutmut] section, so the repository is never touched and
# modules can be re-run one at a time. Prints, per module, killed/tested and the score (killed
# and timed-out mutants over tested ones), then the surviving mutants; `mutmut show <name>` in
# the scratch copy shows one (docs/mutation.md lists the known equivalent survivors).
#
# Environment: PYTHON (a python whose environment has mutmut and the dev extra; default
# .venv/bin/python, else python3), MUTATION_JOBS (parallel mutants, default 2),
# MUTATION_DIR (scratch root), MUTATION_KEEP=1 (reuse a scratch copy's earlier results).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
MUTMUT="$(dirname "$(command -v "$PYTHON")")/mutmut"
[[ -x "$MUTMUT" ]] || { echo "mutation.sh: no mutmut beside $PYTHON (pip install -e '.[dev]')" >&2; exit 2; }
WORK="${MUTATION_DIR:-${TMPDIR:-/tmp}/hargo-mutation}"
JOBS="${MUTATION_JOBS:-2}"
unset PYTHONPATH  # the scratch copy's mutated hargo must be the one imported

declare -A FILES=(
  [advantages]="hargo/advantages.py hargo/advantage_math.py"   # its tensor pieces moved out
  [stats]="hargo/stats.py"
  [gate]="hargo/gate.py hargo/config/gate_rule.py"   # the rule moved into the config
  [split]="hargo/data/split.py"
  [metrics]="hargo/metrics.py"
  [rewards]="hargo/rewards/*"
)
# mutant-name globs when only part of a file is under test
declare -A NAMES=(
)
ALL=(advantages stats gate split metrics rewards)
MODULES=("$@")
[[ ${#MODULES[@]} -gt 0 ]] || MODULES=("${ALL[@]}")

summary=()
for mod in "${MODULES[@]}"; do
  [[ -n "${FILES[$mod]:-}" ]] || { echo "mutation.sh: unknown module '$mod' (valid: ${ALL[*]})" >&2; exit 2; }
  dir="$WORK/$mod"
  if [[ "${MUTATION_KEEP:-0}" != 1 ]]; then rm -rf "$dir"; fi
  mkdir -p "$dir"
  rm -rf "$dir/hargo" "$dir/tests" "$dir/benchmarks" "$dir/scripts" "$dir/compare" "$dir/data"
  cp -r "$ROOT/hargo" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/scripts" "$ROOT/params.yaml" "$ROOT/dvc.yaml" "$dir/"
  mkdir -p "$dir/compare" && cp "$ROOT/compare/dvc.yaml" "$dir/compare/"
  # the data's DVC pointer (a fast test reads the data version from it), not the data
  mkdir -p "$dir/data/raw" && cp "$ROOT/data/raw/hpc-gpt.dvc" "$dir/data/raw/"
  cp "$ROOT/pyproject.toml" "$dir/pyproject.toml"
  # FILES holds one or more space-separated paths (globs passed to mutmut unexpanded)
  set -f; only=""; for f in ${FILES[$mod]}; do only+="\"$f\", "; done; set +f
  cat >> "$dir/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["hargo"]
also_copy = ["params.yaml", "benchmarks", "scripts", "dvc.yaml", "compare", "data"]
only_mutate = [${only%, }]
pytest_add_cli_args = ["-m", "fast", "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]
pytest_add_cli_args_test_selection = ["tests/"]
EOF
  echo "[mutation] $mod: mutating ${FILES[$mod]} ${NAMES[$mod]:-} in $dir" >&2
  # shellcheck disable=SC2086  # NAMES holds several globs, passed to mutmut unexpanded
  if ! (cd "$dir" && set -f && "$MUTMUT" run --max-children "$JOBS" ${NAMES[$mod]:-} > run.log 2>&1); then
    if grep -q "could not find any test case for any mutant" "$dir/run.log"; then
      line="$(printf '%-11s no fast test reaches %s: mark its pure tests @pytest.mark.fast' "$mod" "${FILES[$mod]}")"
      echo "$line"; summary+=("$line"); continue
    fi
    echo "[mutation] $mod: mutmut failed, see $dir/run.log" >&2; tail -20 "$dir/run.log" >&2; exit 1
  fi
  (cd "$dir" && "$MUTMUT" results --all true > results.txt 2>/dev/null) || true
  line="$("$PYTHON" - "$dir/results.txt" "$mod" ${NAMES[$mod]:-} <<'PY'
import fnmatch, sys
path, mod, globs = sys.argv[1], sys.argv[2], sys.argv[3:]
counts, survivors = {}, []
for raw in open(path, encoding="utf-8"):
    name, _, status = raw.strip().rpartition(": ")
    if not name or (globs and not any(fnmatch.fnmatch(name, g) for g in globs)):
        continue
    counts[status] = counts.get(status, 0) + 1
    if status == "survived":
        survivors.append(name)
killed = counts.get("killed", 0) + counts.get("timeout", 0)
tested = killed + counts.get("survived", 0) + counts.get("suspicious", 0)
score = 100.0 * killed / tested if tested else 0.0
other = {k: v for k, v in counts.items() if k not in ("killed", "timeout", "survived")}
print(f"{mod:<11} {killed:>4}/{tested:<4} killed  {score:5.1f}%  {other if other else ''}")
for s in survivors:
    print(f"    survived: {s}")
PY
)"
  echo "$line"
  summary+=("$(head -1 <<<"$line")")
done
echo
echo "module      killed/tested   score"
printf '%s\n' "${summary[@]}"
