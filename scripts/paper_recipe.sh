#!/usr/bin/env bash
# The paper's full recipe as a DVC experiment (needs a GPU host with hub access):
# Qwen2.5-0.5B-Instruct, every raw record (the paper's 5,273 / 584 split), SFT 2 epochs lr 2e-5
# batch 4 (full fine-tuning), then RL with G=4, beta=0.02, alpha=0.3, rho=0.9, T=0.6 from the same
# SFT checkpoint, evaluated on the whole eval split. Extra -S overrides may follow.
set -euo pipefail
cd "$(dirname "$0")/.."
exec dvc exp run -n paper-recipe \
  -S model.source=Qwen/Qwen2.5-0.5B-Instruct -S model.dtype=bfloat16 \
  -S data.split.strategy=paper \
  -S sft.samples_per_task=null -S sft.epochs=2 -S sft.max_steps=-1 -S sft.learning_rate=2e-5 \
  -S sft.batch_size=4 -S sft.lora.enabled=false -S sft.max_length=4096 \
  -S train.max_prompt_tokens=3072 -S train.threads=0 \
  -S 'rl.methods=[grpo,dr_grpo,hargo]' -S rl.samples_per_task=null -S rl.steps=500 \
  -S rl.prompts_per_step=8 -S rl.num_generations=4 \
  -S rl.grpo.beta=0.02 -S rl.dr_grpo.beta=0.02 -S rl.hargo.beta=0.02 -S rl.hargo.alpha=0.3 \
  -S rl.hargo.rho=0.9 -S rl.temperature=0.6 -S rl.max_new_tokens=256 -S rl.lora.enabled=false \
  -S rl.generation_backend=vllm \
  -S evaluate.samples_per_task=null -S evaluate.max_new_tokens=256 \
  -S evaluate.max_prompt_tokens=8192 -S evaluate.gpu_memory_utilization=0.4 "$@"
