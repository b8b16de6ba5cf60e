"""Where the time of one RL step of the synthetic test bed goes, and how far it is from the
hardware: generation / reference / other scoring / update, the step's FLOPs, and their rate
against one core's measured matmul peak.

    .venv/bin/python benchmarks/bench_synthetic_step.py [--method hargo] [--steps 10] \\
        [--threads 1] [-S synthetic.rl.prompts_per_step=6 ...]

Runs the test bed's own trainer (``hargo.compare.synthetic``: the committed ``synthetic`` params,
the SFT policy ``models/synthetic/sft`` when it exists, else a random tiny policy of the same
config) for 2 warm-up steps and ``--steps`` measured ones, alone on the machine (a busy neighbour
makes 2-thread torch ~11x slower). Phases, in seconds per step:

- ``generation``: TRL's rollout (``HargoGRPOTrainer.timing["generation_s"]``);
- ``reference``: forward passes of the frozen reference model (timed at its ``forward``);
- ``scoring``: the rest of ``_generate_and_score_completions`` (rewards, advantages, weights,
  TRL's bookkeeping);
- ``update``: the rest of the step (policy forward + backward + optimizer).

FLOPs (per step, counted from the shapes the trainer saw, multiply-add = 2 FLOPs), with ``N``
the non-embedding parameters, ``d`` the width, ``V`` the vocabulary, ``n_layer`` the layers:
a forward pass over one token at context position ``c`` costs ``2 N + 2 d V + 4 n_layer c d``
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1, with the attention
term counted for both Q K^T and the weighted sum of V, plus the LM head at every position, a
few % more than HF computes where it keeps only the last logits); a
backward pass twice the forward. Generation: the prompt prefill plus one token per step for every
row of the batch until the batch's largest budget (finished rows still compute: HF generate);
reference: one forward over prompt + completion, padded; update: forward + backward over the
same. ``padded`` counts every position the kernels ran; ``useful`` only real tokens.

The peak is one thread's ``torch.matmul`` of two 1024 x 1024 matrices in float32 and, where the
CPU has native bf16, in bfloat16: the best FLOP/s a core reaches on large dense products. Prints
one Markdown table; name the CPU (``grep -o 'avx512_bf16\\|amx_bf16' /proc/cpuinfo``) beside it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_peak(dtype_name: str, n: int = 1024, repeats: int = 20) -> float:
    """Best FLOP/s of ``repeats`` timed ``n x n @ n x n`` products (2 n^3 FLOPs each)."""
    import torch

    dtype = getattr(torch, dtype_name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return 2 * n ** 3 / best


def forward_flops(n_params: int, d: int, vocab: int, n_layer: int, positions) -> float:
    """FLOPs of a forward pass over tokens at context positions ``positions`` (an iterable of
    ints): ``sum_c (2 N + 2 d V + 4 n_layer c d)`` (module docstring)."""
    pos = list(positions)
    return len(pos) * (2 * n_params + 2 * d * vocab) + 4 * n_layer * d * sum(pos)


def step_flops(shape: dict, arch: dict) -> dict:
    """Per-step FLOPs of generation, reference and update from one step's ``shape``:
    ``B`` rows, ``P`` padded prompt length, ``T`` padded completion length, ``prompt_tokens``
    and ``completion_tokens`` (lists, real tokens per row). Returns ``{phase: (padded, useful)}``."""
    f = lambda pos: forward_flops(arch["N"], arch["d"], arch["V"], arch["L"], pos)  # noqa: E731
    B, P, T = shape["B"], shape["P"], shape["T"]
    gen_pad = B * f(range(P + T))                        # prefill P, then T single-token steps
    gen_use = sum(f(range(p + c)) for p, c in zip(shape["prompt_tokens"], shape["completion_tokens"]))
    fwd_pad = B * f(range(P + T))
    fwd_use = gen_use
    return {"generation": (gen_pad, gen_use), "reference": (fwd_pad if shape["ref"] else 0.0,
                                                            fwd_use if shape["ref"] else 0.0),
            "update": (3 * fwd_pad, 3 * fwd_use)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--method", default="hargo")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", default="heterogeneous")
    ap.add_argument("-S", "--set", dest="sets", action="append", default=[])
    ap.add_argument("--json", help="also write the row as JSON here")
    a = ap.parse_args(argv)

    import torch

    from hargo.compare.synthetic import prompt_quota, rl_prompts, stage_params, train_reward
    from hargo.compare.synthetic_data import read_split
    from hargo.compare.synthetic_plan import MODEL_DIR, configuration, plan
    from hargo.data.synthetic import generate
    from hargo.hardware import setup_torch, use_bf16
    from hargo.models.loading import load_model
    from hargo.models.tiny import build_tiny_policy
    from hargo.config import as_config, as_section
    from hargo.params import load_params
    from hargo.training.rl import build_trainer
    from transformers import TrainerCallback

    warm = 2
    params = as_config(load_params(a.params, a.sets + [f"train.threads={a.threads}",
                                                       f"synthetic.rl.steps={warm + a.steps}"]))
    p = plan(params)
    q = stage_params(params, p, 1)
    setup_torch(q)
    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="hargo-bench-step-"))
    model_dir = ROOT / MODEL_DIR
    try:
        train = read_split(ROOT, "train")
    except FileNotFoundError:
        train, _ = generate(p.data, as_section(params, "seed"))
    source = "SFT policy"
    if not (model_dir / ".complete").exists():
        texts = [m["content"] for r in train for m in r["prompt"]] + [r["answer"] for r in train]
        model_dir = build_tiny_policy(work / "init", p.policy, texts, seed=1)
        source = "random policy"
    m = load_model(model_dir, dtype="float32")
    cfg = m.config
    emb = cfg.vocab_size * cfg.hidden_size
    arch = {"N": sum(x.numel() for x in m.parameters()) - emb, "d": cfg.hidden_size,
            "V": cfg.vocab_size, "L": cfg.num_hidden_layers}
    del m

    trainer = build_trainer(q, a.method, model_dir, rl_prompts(train, p, 1), work / "trainer",
                            reward_funcs=[train_reward(configuration(p, a.config), 1)])
    trainer.prompt_quota = prompt_quota(p)   # the bed's run: its reward and per-step task quota
    ref_s = [0.0]
    shapes: list[dict] = []
    if trainer.ref_model is not None:
        fwd = trainer.ref_model.forward

        def timed_forward(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fwd(*args, **kw)
            finally:
                ref_s[0] += time.perf_counter() - t0

        trainer.ref_model.forward = timed_forward
    inner = trainer._generate_and_score_completions

    def shaped(inputs):
        out = inner(inputs)
        if trainer.model.training:
            pm, cm = out["prompt_mask"], out["completion_mask"]
            shapes.append({"B": int(pm.size(0)), "P": int(pm.size(1)), "T": int(cm.size(1)),
                           "prompt_tokens": pm.sum(1).tolist(),
                           "completion_tokens": cm.sum(1).tolist(),
                           "ref": trainer.ref_model is not None})
        return out

    trainer._generate_and_score_completions = shaped
    rows: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.before = (dict(trainer.timing), ref_s[0])

        def on_step_end(self, args, state, control, **kw):
            t, (timing, r0) = time.perf_counter() - self.t0, self.before
            gen = trainer.timing["generation_s"] - timing["generation_s"]
            score = trainer.timing["scoring_s"] - timing["scoring_s"]
            ref = ref_s[0] - r0
            rows.append({"step_s": t, "generation": gen, "reference": ref,
                         "scoring": score - ref, "update": t - gen - score})

    trainer.add_callback(Clock())
    trainer.train()
    rows, shapes = rows[warm:], shapes[warm:]
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    fl = [step_flops(s, arch) for s in shapes]
    flops = {ph: (sum(f[ph][0] for f in fl) / len(fl), sum(f[ph][1] for f in fl) / len(fl))
             for ph in ("generation", "reference", "update")}
    peak32 = matmul_peak("float32")
    bf16 = use_bf16(q)
    peak = matmul_peak("bfloat16") if bf16 else peak32
    pad_share = 1 - sum(f[1] for f in flops.values()) / max(1.0, sum(f[0] for f in flops.values()))
    print(f"\nRL step of the synthetic test bed: {a.method}, {source} ({arch['N'] / 1e6:.2f}M "
          f"non-embedding params, d={arch['d']}, V={arch['V']}, {arch['L']} layers), "
          f"{p.rl.prompts_per_step} prompts x G={p.rl.num_generations}, budgets "
          f"{dict(p.rl.max_new_tokens)}, {a.threads} thread(s), bf16 autocast {bf16}; "
          f"mean of {len(rows)} steps after {warm} warm-up. Peak of one thread: "
          f"{peak32 / 1e9:.0f} GFLOP/s fp32" + (f", {peak / 1e9:.0f} GFLOP/s bf16" if bf16 else "")
          + f". Padded positions: {pad_share:.0%} of the FLOPs.\n")
    print("| phase | s/step | share | GFLOP/step (padded) | GFLOP/step (useful) | GFLOP/s | of peak |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    total_pad = 0.0
    for ph in ("generation", "reference", "scoring", "update"):
        s = mean[ph]
        pad, use = flops.get(ph, (0.0, 0.0))
        total_pad += pad
        rate = pad / s if s > 0 and pad else 0.0
        print(f"| {ph} | {s:.3f} | {s / mean['step_s']:.0%} | {pad / 1e9:.2f} | {use / 1e9:.2f} | "
              + (f"{rate / 1e9:.1f} | {rate / peak:.1%} |" if pad else "- | - |"))
    rate = total_pad / mean["step_s"]
    print(f"| step | {mean['step_s']:.3f} | 100% | {total_pad / 1e9:.2f} | "
          f"{sum(f[1] for f in flops.values()) / 1e9:.2f} | {rate / 1e9:.1f} | {rate / peak:.1%} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"mean": mean, "flops": flops, "peak_fp32": peak32,
                                            "peak": peak, "bf16": bf16, "arch": arch,
                                            "shapes": shapes}, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
