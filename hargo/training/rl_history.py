"""What an RL run's per-step history (:attr:`hargo.training.rl_logging.StepRecorder.history`)
becomes at the end of the run: the summary in ``metrics/rl/<method>.json``
(:func:`summarize_history`) and the per-task plots logged to MLflow (:func:`plot_history`).

Each history entry is one step's ``{"step": int, "<scope>/<metric>": float, ...}`` (scope: a task
or ``all``; the metrics are listed in :mod:`hargo.training.rl_logging`); NaN or None means the
value did not exist at that step and is left out of every summary.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

__all__ = ["LEARNING_KEYS", "summarize_history", "plot_history", "is_missing"]

#: The learning signals :func:`summarize_history` summarises (first, final, mean over steps).
LEARNING_KEYS = ("loss", "grad_norm", "all/adv_logprob", "all/adv_log_ratio", "all/kl")


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def summarize_history(history: Sequence[dict]) -> dict[str, Any]:
    """What ``metrics/rl/<method>.json`` reports of a run's per-step history.

    ``rewards``: per scope (task or ``all``), the last step's reward mean/std/accuracy, the first
    step's and the mean over all steps; ``time``: the summed time split; ``dynamic_sampling``
    (only when it ran): per scope the groups sampled and dropped over the run, and the refill
    and unfilled group counts;
    ``zero_variance_groups``: per scope, the share of groups whose G rewards were all equal, at
    the last step (``final``) and averaged over the steps; ``learning``: ``loss``, ``grad_norm``,
    ``adv_logprob``, ``adv_log_ratio``, ``kl`` (the ``all`` scope) at the first and last step and
    averaged over the steps, for those the history holds (module docstring). NaN is left out."""
    out: dict[str, Any] = {"steps_logged": len(history)}
    if not history:
        return out
    scopes = sorted({k.split("/")[0] for h in history for k in h if k.endswith("/reward_mean")})
    per = {}
    for s in scopes:
        vals = [h[f"{s}/reward_mean"] for h in history
                if f"{s}/reward_mean" in h and not is_missing(h[f"{s}/reward_mean"])]
        last = next((h for h in reversed(history) if f"{s}/reward_mean" in h), {})
        per[s] = {"final_reward_mean": last.get(f"{s}/reward_mean"),
                  "final_reward_std": last.get(f"{s}/reward_std"),
                  "final_accuracy": last.get(f"{s}/accuracy"),
                  "mean_reward_over_steps": _mean(vals) if vals else None,
                  "first_reward_mean": vals[0] if vals else None}
    out["rewards"] = {s: {k: (None if is_missing(v) else v) for k, v in d.items()}
                      for s, d in per.items()}
    out["time"] = {k.split("/", 1)[1]: float(sum(h.get(k, 0.0) or 0.0 for h in history))
                   for k in ("time/generation_s", "time/scoring_s", "time/update_s", "time/step_s")}
    zero = {}
    for s in sorted({k.split("/")[0] for h in history for k in h
                     if k.endswith("/zero_variance_groups")}):
        vals = [h[f"{s}/zero_variance_groups"] for h in history
                if not is_missing(h.get(f"{s}/zero_variance_groups"))]
        if vals:
            zero[s] = {"final": vals[-1], "mean_over_steps": _mean(vals)}
    out["zero_variance_groups"] = zero
    if any(not is_missing(h.get("all/sampled_groups")) for h in history):
        total = lambda key: float(sum(h.get(key) or 0.0 for h in history  # noqa: E731
                                      if not is_missing(h.get(key))))
        out["dynamic_sampling"] = {
            "per_task": {s: {"sampled_groups": total(f"{s}/sampled_groups"),
                             "dropped_groups": total(f"{s}/dropped_groups")}
                         for s in sorted({k.split("/")[0] for h in history for k in h
                                          if k.endswith("/sampled_groups")})},
            "refill_groups": total("all/refill_groups"),
            "unfilled_groups": total("all/unfilled_groups")}
    learning = {}
    for key in LEARNING_KEYS:
        vals = [h[key] for h in history if not is_missing(h.get(key))]
        if vals:
            learning[key.replace("all/", "")] = {"first": vals[0], "final": vals[-1],
                                                 "mean_over_steps": _mean(vals)}
    out["learning"] = learning
    return out


def is_missing(v) -> bool:
    """True for a history value that did not exist at its step: None or a float NaN."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def plot_history(history: Sequence[dict], out_dir: str | Path, title: str = "") -> list[Path]:
    """Draw ``reward_per_task.png`` (reward mean per task over steps) and ``weight_per_task.png``
    (loss weight mean, solid, and max, dashed, per task) into ``out_dir``; returns the paths.
    Empty history: no files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not history:
        return []
    scopes = sorted({k.split("/")[0] for h in history for k in h if k.endswith("/reward_mean")})
    paths = []

    def series(key):
        pts = [(h["step"], h[key]) for h in history if key in h and not is_missing(h[key])]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in scopes:
        x, y = series(f"{s}/reward_mean")
        ax.plot(x, y, marker="o", label=s, linewidth=2.5 if s == "all" else 1.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"{title} reward per task".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "reward_per_task.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, s in enumerate(scopes):
        color = f"C{i % 10}"
        x, y = series(f"{s}/weight_mean")
        ax.plot(x, y, marker="o", color=color, label=f"{s} mean")
        x, y = series(f"{s}/weight_max")
        ax.plot(x, y, linestyle="--", color=color, label=f"{s} max")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL step")
    ax.set_ylabel("per-response loss weight w (mean is 1/G by construction)")
    ax.set_title(f"{title} loss weight per task".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    p = out_dir / "weight_per_task.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
