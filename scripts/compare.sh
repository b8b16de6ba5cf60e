#!/usr/bin/env bash
# The nine-method comparison (compare/dvc.yaml) in one command, after scripts/setup.sh:
#   scripts/compare.sh [quick]     params.yaml's `compare` as committed: 8 methods x 3 seeds,
#                                  2 steps each (~1 h on a 2-core CPU): checks that everything
#                                  runs and the report renders; it does not rank methods.
#   scripts/compare.sh cpu         the CPU research size (a DVC experiment; 33 min on a 2-core
#                                  AMX Xeon after the main job, 40.7 min on a 2-core AMD EPYC
#                                  from a fresh clone, SFT included): SFT, GRPO and HARGO x 3
#                                  seeds, 12 steps x 2 prompts (G=4) each, 96 eval prompts
#                                  (24 per task), with the baselines and paired intervals.
#                                  Resumable: an interrupted run keeps its finished stages.
#   scripts/compare.sh research    a DVC experiment sized so that methods can differ: + the
#                                  HARGO ablations B1/B2, 100 steps x 4 prompts per method
#                                  (~28 h on a 2-core CPU, estimated from the quick run).
#   scripts/compare.sh paper       the paper's full recipe (Qwen2.5-0.5B-Instruct from the hub,
#                                  all 5,273 training samples, its hyperparameters; GPU host).
#   scripts/compare.sh synthetic   the synthetic test bed (synthetic/dvc.yaml): grpo, dr_grpo,
#                                  hargo, hargo_b1, hargo_b2 x 10 seeds on generated tasks with a
#                                  tiny policy, heterogeneous and homogeneous rewards (29 min on
#                                  a 2-core CPU; docs/synthetic.md); no HPC-GPT data.
# Extra arguments go to `dvc exp run` (cpu, research, paper, synthetic), e.g. -S 'compare.seeds=[1,2,3,4,5]'.
# Results: reports/comparison.md and .html, metrics/compare/summary.json; `dvc exp show`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && source .venv/bin/activate
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
size="${1:-quick}"
[ $# -gt 0 ] && shift
start=$(date +%s)
[ "$size" = synthetic ] || dvc pull -q data/raw/hpc-gpt.dvc
case "$size" in
  synthetic)
    # a DVC experiment when options are given (e.g. -S synthetic.data.scale_long=0.2), else a repro
    if [ $# -gt 0 ]; then dvc exp run synthetic/dvc.yaml "$@"; else dvc repro synthetic/dvc.yaml; fi
    echo "comparison (synthetic) wall time: $(( $(date +%s) - start )) s"
    echo "report: reports/synthetic.md"; exit 0 ;;
  quick)
    dvc repro compare/dvc.yaml ;;
  cpu)
    # sized from measured step times (docs/results.md "The CPU research size"). It runs in the
    # workspace: every finished stage is in dvc.lock and the cache, so after an interruption
    # the same command re-runs only the missing stages. Preference pairs: the pipeline's
    # preferences stage runs anyway (no preference method here), so at its smallest.
    dvc exp run compare/dvc.yaml -n compare-cpu \
      -S 'compare.methods=[grpo,hargo]' -S 'compare.seeds=[1,2,3]' \
      -S compare.samples_per_task=16 -S compare.steps=12 -S compare.prompts_per_step=2 \
      -S compare.preferences.samples_per_task=4 -S compare.evaluate.samples_per_task=24 \
      -S 'compare.evaluate.max_new_tokens={race_c:8,race_fortran:8,mlperf:48,plp:48}' "$@" ;;
  research)
    dvc exp run compare/dvc.yaml -n compare-research \
      -S 'compare.methods=[hpcgpt,ppo,dpo,kto,simpo,grpo,dr_grpo,hargo,hargo_b1,hargo_b2]' \
      -S 'compare.seeds=[1,2,3]' -S compare.samples_per_task=64 -S compare.steps=100 \
      -S compare.prompts_per_step=4 -S compare.preferences.samples_per_task=128 \
      -S compare.evaluate.samples_per_task=100 -S compare.evaluate.max_new_tokens=48 "$@" ;;
  paper)
    # scripts/paper_recipe.sh's values (the main pipeline) plus the comparison at full size.
    dvc exp run compare/dvc.yaml -n compare-paper \
      -S model.source=Qwen/Qwen2.5-0.5B-Instruct -S model.dtype=bfloat16 \
      -S data.split.strategy=paper \
      -S sft.samples_per_task=null -S sft.epochs=2 -S sft.max_steps=-1 -S sft.learning_rate=2e-5 \
      -S sft.batch_size=4 -S sft.lora.enabled=false -S sft.max_length=4096 \
      -S train.max_prompt_tokens=3072 -S train.threads=0 \
      -S rl.num_generations=4 -S rl.grpo.beta=0.02 -S rl.dr_grpo.beta=0.02 \
      -S rl.hargo.beta=0.02 -S rl.hargo.alpha=0.3 -S rl.hargo.rho=0.9 \
      -S rl.hargo_b1.beta=0.02 -S rl.hargo_b2.beta=0.02 -S rl.hargo_b2.alpha=0.3 \
      -S rl.hargo_b2.rho=0.9 -S rl.ppo.kl_coef=0.02 \
      -S rl.temperature=0.6 -S rl.max_new_tokens=256 -S rl.lora.enabled=false \
      -S rl.generation_backend=vllm \
      -S 'compare.methods=[hpcgpt,ppo,dpo,kto,simpo,grpo,dr_grpo,hargo,hargo_b1,hargo_b2]' \
      -S compare.samples_per_task=null -S compare.steps=500 -S compare.prompts_per_step=8 \
      -S compare.preferences.samples_per_task=null -S compare.preferences.max_new_tokens=256 \
      -S compare.evaluate.samples_per_task=null -S compare.evaluate.max_new_tokens=256 \
      -S evaluate.max_prompt_tokens=8192 -S evaluate.gpu_memory_utilization=0.4 "$@" ;;
  *)
    echo "usage: scripts/compare.sh [quick|cpu|research|paper|synthetic] [dvc exp run options]" >&2; exit 2 ;;
esac
echo "comparison ($size) wall time: $(( $(date +%s) - start )) s"
[ -f reports/comparison.md ] && echo "report: reports/comparison.md, reports/comparison.html"
