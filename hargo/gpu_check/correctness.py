"""The GPU check's ``correctness`` part: the same two RL steps on the CPU and on the device.

A fixed batch of rollouts (4 prompts x G=4, given completions fed through TRL's
``rollout_func``; no sampling; the plp group is left out where MiniLM is not installed, as in
device call 1) trained for 2 steps with ``hargo`` by :func:`hargo.training.rl.build_trainer` on
the CPU in fp32 (the reference) and on the device (CUDA fp32 and CUDA bf16 autocast; in
``--dry-run`` the CPU again, so every difference must be exactly 0). Compared per response, in a
canonical order: rewards, reference log-prob ``l``, confidence ``c``, advantage ``M``, weight
``w``, the EMA baseline ``g``, the logged loss and gradient norm. Each variant also checks where
its state lives (policy parameters and optimizer state on the device, ``g`` a host float) and a
checkpoint round trip: the run resumed from ``checkpoint-1`` (weights, optimizer, RNG,
``method_state.json``) must redo step 2 as the uninterrupted run did. Plus
``hargo.advantages.estimate`` of every estimator on random (64, 4) batches, CPU float32 vs
device tensors.
"""
from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any, Mapping

from hargo.gpu_check.common import _cuda, _free_memory, _now, log
from hargo.gpu_check.inputs import G_FIXED, fixed_records, fixed_rollout

#: Per-response values compared between devices.
QUANTITIES = ("rewards", "ref_logprob", "confidence", "advantages", "weights")
#: Absolute tolerances of device vs CPU fp32 (loss and g absolute; grad_norm relative).
TOLERANCES = {
    "fp32": {"rewards": 0.0, "ref_logprob": 1e-3, "confidence": 2e-4, "advantages": 2e-4,
             "weights": 2e-4, "baseline": 1e-3, "loss": 2e-4, "grad_norm": 1e-3,
             "estimate": 1e-6},
    "bf16": {"rewards": 0.0, "ref_logprob": 0.1, "confidence": 0.025, "advantages": 0.05,
             "weights": 0.025, "baseline": 0.05, "loss": 0.05, "grad_norm": 0.1,
             "estimate": 1e-6},
}
#: The round trip must reproduce step 2 to this (same device, same code path; GPU kernels may
#: differ in the last bits between two launches).
ROUNDTRIP_TOL = {"fp32": 1e-5, "bf16": 1e-3}


def _capture_recorder():
    """A StepRecorder that also keeps every generation batch's raw per-response values."""
    from hargo.training.rl_logging import StepRecorder

    class CaptureRecorder(StepRecorder):
        def __init__(self):
            super().__init__(max_table_rows=16)
            self.raw: list[dict] = []

        def add_generation(self, **kw):
            keep = ("tasks", "rewards", "advantages", "weights", "confidence", "ref_logprob",
                    "baseline", "completions")
            self.raw.append({k: (list(kw[k]) if isinstance(kw.get(k), (list, tuple))
                                 else kw.get(k)) for k in keep})
            super().add_generation(**kw)

    return CaptureRecorder()


def _canonical(raw: list[dict]) -> list[dict]:
    """Per generation batch: the per-response values sorted by (task, completion, value), so two
    runs compare response by response whatever order the sampler drew the prompts in."""
    out = []
    for b in raw:
        n = len(b["tasks"])
        comps = b.get("completions") or [""] * n
        texts = []
        for c in comps:
            if isinstance(c, (list, tuple)) and c and isinstance(c[-1], dict):
                c = c[-1].get("content", "")
            texts.append(str(c))
        order = sorted(range(n), key=lambda i: (b["tasks"][i], texts[i], b["rewards"][i]))
        out.append({"keys": [f"{b['tasks'][i]}|{texts[i]}" for i in order],
                    "baseline": b.get("baseline"),
                    **{q: (None if b.get(q) is None else [float(b[q][i]) for i in order])
                       for q in QUANTITIES}})
    return out


def _step_logs(trainer) -> dict[int, dict]:
    out = {}
    for e in trainer.state.log_history:
        if "loss" in e and "step" in e and "train_loss" not in e:
            out[int(e["step"])] = {"loss": float(e["loss"]),
                                   "grad_norm": float(e["grad_norm"]) if e.get("grad_norm")
                                   is not None else None}
    return out


def _state_devices(trainer) -> dict:
    import torch

    model = trainer.accelerator.unwrap_model(trainer.model)
    params = {p.device.type for p in model.parameters()}
    opt = set()
    if trainer.optimizer is not None:
        for st in trainer.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    opt.add(v.device.type)
    ema = trainer.ema.value
    return {"parameters": sorted(params), "optimizer_state": sorted(opt),
            "ema_type": type(ema).__name__, "ema_value": ema}


def _correctness_variant(params: dict, model_dir: Path, work: Path, name: str,
                         overrides: Mapping, tok, precision: str = "fp32") -> dict:
    """Two steps of ``hargo`` on the fixed batch, then the same run resumed from checkpoint-1."""
    from hargo.hardware import setup_torch
    from hargo.training.checkpoints import METHOD_STATE_NAME
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback

    t0 = _now()
    records = fixed_records()
    from hargo.config import as_config
    from hargo.params import apply_overrides

    p = as_config(apply_overrides(params, {"rl.num_generations": G_FIXED,
                                           "rl.prompts_per_step": len(records),
                                           "rl.max_new_tokens": 16, "rl.steps": 2,
                                           "rl.save_steps": 1, "rl.hargo.beta": 0.02}))
    kw = dict(overrides)
    runs = {}
    for run in ("a", "b"):
        setup_torch(p)
        rec = _capture_recorder()
        out_dir = work / f"corr-{name}-{run}"
        trainer = build_trainer(p, "hargo", model_dir, records, out_dir, recorder=rec,
                                callbacks=[RLLoggingCallback(rec, f"correctness {name}/{run}")],
                                tokenizer=tok, trainer_kwargs={"rollout_func": fixed_rollout},
                                **kw)
        if run == "a":
            trainer.train()
            ckpt1 = out_dir / "checkpoint-1"
            # method_state.json: the trainer's own state (EMA baseline, history) in a checkpoint
            state1 = json.loads((ckpt1 / METHOD_STATE_NAME).read_text(encoding="utf-8"))
            files = sorted(f.name for f in ckpt1.iterdir())
        else:
            trainer.train(resume_from_checkpoint=str(work / f"corr-{name}-a" / "checkpoint-1"))
        runs[run] = {"batches": _canonical(rec.raw), "logs": _step_logs(trainer),
                     "devices": _state_devices(trainer), "ema": trainer.ema.value,
                     "global_step": int(trainer.state.global_step),
                     "bf16": bool(trainer.args.bf16), "device": str(trainer.accelerator.device)}
        del trainer
        _free_memory()
    a, b = runs["a"], runs["b"]
    # Round trip: the resumed run's only step is step 2 of the uninterrupted run.
    rt: dict[str, Any] = {"checkpoint_files": files,
                          "checkpoint_ema": state1.get("ema", {}).get("value"),
                          "step1_ema": a["batches"][0]["baseline"] if a["batches"] else None,
                          "resumed_global_step": b["global_step"]}
    diffs = {}
    if len(a["batches"]) >= 2 and b["batches"]:
        s2a, s2b = a["batches"][1], b["batches"][0]
        for q in QUANTITIES:
            if s2a[q] is not None and s2b[q] is not None:
                diffs[q] = max(abs(x - y) for x, y in zip(s2a[q], s2b[q]))
        diffs["keys_equal"] = s2a["keys"] == s2b["keys"]
    diffs["ema"] = abs(a["ema"] - b["ema"]) if a["ema"] is not None and b["ema"] is not None \
        else None
    if 2 in a["logs"] and 2 in b["logs"]:
        diffs["loss"] = abs(a["logs"][2]["loss"] - b["logs"][2]["loss"])
    if rt["checkpoint_ema"] is not None and rt["step1_ema"] is not None:
        diffs["checkpoint_ema_vs_step1"] = abs(rt["checkpoint_ema"] - rt["step1_ema"])
    rt["diffs"] = diffs
    need = {METHOD_STATE_NAME, "trainer_state.json", "optimizer.pt"}
    numeric = [v for k, v in diffs.items() if k != "keys_equal"]
    rt["passed"] = (need <= set(files) and b["global_step"] == 2
                    and diffs.get("keys_equal", False)
                    and all(v is not None and v <= ROUNDTRIP_TOL[precision] for v in numeric))
    return {"name": name, "wall_s": round(_now() - t0, 2), "run": a, "resumed": b,
            "roundtrip": rt}


def _compare_variant(ref: dict, dev: dict, precision: str) -> dict:
    tol = TOLERANCES[precision]
    diffs: dict[str, float | None] = {}
    ra, da = ref["run"], dev["run"]
    order_ok = len(ra["batches"]) == len(da["batches"]) and all(
        x["keys"] == y["keys"] for x, y in zip(ra["batches"], da["batches"]))
    for q in QUANTITIES:
        vals = []
        for x, y in zip(ra["batches"], da["batches"]):
            if x[q] is None or y[q] is None:
                continue
            vals += [abs(u - v) for u, v in zip(x[q], y[q])]
        diffs[q] = max(vals) if vals else None
    bl = [abs(x["baseline"] - y["baseline"]) for x, y in zip(ra["batches"], da["batches"])
          if x["baseline"] is not None and y["baseline"] is not None]
    diffs["baseline"] = max(bl) if bl else None
    for k in ("loss", "grad_norm"):
        vals = []
        for step, e in ra["logs"].items():
            o = da["logs"].get(step)
            if o is None or e[k] is None or o[k] is None:
                continue
            d = abs(e[k] - o[k])
            vals.append(d / max(abs(e[k]), 1e-8) if k == "grad_norm" else d)
        diffs[k] = max(vals) if vals else None
    checks = {q: (d is not None and d <= tol[q]) for q, d in diffs.items()}
    want = dev["run"]["device"].split(":")[0]
    dev_ok = (dev["run"]["devices"]["parameters"] == [want]
              and dev["run"]["devices"]["optimizer_state"] in ([want], [])
              and dev["resumed"]["devices"]["optimizer_state"] in ([want], [])
              and dev["run"]["devices"]["ema_type"] == "float")
    return {"precision": precision, "device": dev["run"]["device"], "bf16": dev["run"]["bf16"],
            "max_abs_diff": diffs, "tolerance": {q: tol[q] for q in diffs},
            "within_tolerance": checks, "same_response_order": order_ok,
            "state_on_device": dev_ok, "roundtrip_passed": dev["roundtrip"]["passed"],
            "passed": bool(all(checks.values()) and order_ok and dev_ok
                           and dev["roundtrip"]["passed"])}


def _estimate_check(params: Mapping, device: str) -> dict:
    """``hargo.advantages.estimate`` of every GRPO-family method's estimator: CPU float32 vs
    ``device`` tensors, each with its ``rl.<method>`` constants (``HargoConfig.of``)."""
    import torch

    from hargo.advantages import EMABaseline, HargoConfig, estimate
    from hargo.methods import method_params, methods_of_family

    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (64, 4), generator=gen).float()
    rewards[:8] = torch.rand((8, 4), generator=gen)          # some continuous (plp-like) groups
    rewards[8:12] = 1.0                                       # some groups with no contrast
    ref = -torch.rand((64, 4), generator=gen) * 3.0
    out = {}
    for m in methods_of_family("grpo_family"):
        method = m.name
        cfg = HargoConfig.of(method_params(params, method), m.estimator)
        a = estimate(m.estimator, rewards, ref, EMABaseline(cfg.rho), cfg)
        b = estimate(m.estimator, rewards.to(device), ref.to(device), EMABaseline(cfg.rho), cfg)
        d = {"device": str(b.advantages.device)}
        for k in ("advantages", "weights", "confidence", "discrimination"):
            x, y = getattr(a, k), getattr(b, k)
            if x is not None:
                d[k] = float((x - y.cpu()).abs().max())
        if a.baseline is not None:
            d["baseline"] = abs(a.baseline - b.baseline)
        out[method] = d
    worst = max((v for d in out.values() for k, v in d.items() if k != "device"), default=0.0)
    return {"per_method": out, "max_abs_diff": worst,
            "passed": worst <= TOLERANCES["fp32"]["estimate"]}


def run_correctness(ctx: dict) -> dict:
    from hargo.models.loading import load_tokenizer

    plan, params, model_dir, work = ctx["plan"], ctx["params"], ctx["model_dir"], ctx["work"]
    tok = load_tokenizer(model_dir)
    end = ctx["part_end"]
    log("correctness: reference = CPU fp32")
    ref = _correctness_variant(params, model_dir, work, "cpu-fp32",
                               {"use_cpu": True, "bf16": False,
                                "dataloader_pin_memory": False}, tok)
    recs = fixed_records()
    out: dict[str, Any] = {"reference": "cpu-fp32", "fixed_batch": {
        "groups": len(recs), "G": G_FIXED, "tasks": [r["task"] for r in recs]},
        "variants": {"cpu-fp32": ref}, "comparisons": {}}
    for name, precision, overrides in plan.device_variants:
        if _now() > end:
            out["comparisons"][name] = {"skipped": "time budget"}
            continue
        log(f"correctness: {name}")
        try:
            dev = _correctness_variant(params, model_dir, work, name, overrides, tok, precision)
        except Exception as e:   # one variant failing (say bf16) must not lose the others
            traceback.print_exc()
            out["comparisons"][name] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
            _free_memory()
            continue
        out["variants"][name] = dev
        out["comparisons"][name] = _compare_variant(ref, dev, precision)
        d = out["comparisons"][name]
        log(f"correctness {name}: passed={d['passed']} max|diff| "
            + ", ".join(f"{k} {v:.3g}" for k, v in d["max_abs_diff"].items() if v is not None))
        ctx["tracker"].metrics(f"correctness/{name}", {
            f"max_abs_diff/{k}": v for k, v in d["max_abs_diff"].items() if v is not None})
    out["estimate"] = _estimate_check(params, "cuda" if _cuda() else "cpu")
    out["ref_roundtrip_passed"] = ref["roundtrip"]["passed"]
    done = [c for c in out["comparisons"].values() if "passed" in c]
    out["passed"] = bool(done) and all(c["passed"] for c in done) and out["estimate"]["passed"] \
        and ref["roundtrip"]["passed"]
    return out
