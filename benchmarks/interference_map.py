"""The interference map of the synthetic test bed (issue 40, item 4): where does mixing tasks
cost GRPO something, and is it the reward heterogeneity or plain dilution?

For each mechanism at each of its values (a *cell*; the first value is the neutral end, the bed
as committed), GRPO trains on the three-task mix at a fixed per-task quota a step
(``synthetic.rl.prompts_per_step_per_task``, 2/2/2 unless the mechanism is the mix itself) and on
each task alone at that task's prompts a step (its own pool, no other task), in the
heterogeneous and the homogeneous configuration, over the seeds; ``--full-step`` adds, in the
flagged cells, each task alone at the full step (every prompt of the step from it), and
``--methods`` adds those methods' mixed runs there (each minus GRPO). The report
(:mod:`interference_report`) gives per cell and task alone minus mixed with paired two-level
intervals, the difference-in-differences against the homogeneous control, at the end, by the
area under the eval curve and at an early step, and flags a cell whose interval lies above 0;
and what each arm does to every task against the SFT policy (:func:`interference_report.transfer`:
a habit the tasks share, such as one hedge, lifts a task that another task's training alone
never showed, and so hides interference).

Mechanisms (no new SFT policy: they change RL only; ``-S`` may set ``synthetic.data.noise_*``
because the noise touches the training reward only):

- ``aggregation``: ``rl.<method>.aggregation`` response_mean (neutral) | token_mean |
  constant_length
- ``std``: ``rl.<method>.std_scope`` group (neutral) | batch, and ``rl.<method>.std`` none
- ``noise``: ``synthetic.data.noise_yesno`` 0 (neutral) | 0.1 | 0.3 (one task's reward noise)
- ``mix``: ``synthetic.rl.prompts_per_step_per_task`` 2/2/2 (neutral) | 4/1/1 | 1/1/4
- ``dynamic`` (not in the default set): ``synthetic.rl.dynamic_sampling`` off | one refill
  round | two

Mechanisms that need their own SFT policy (a variant under ``--root``, ``synthetic_sweep.py
--train-sft -S ...``): ``synthetic.sft.hedge_style`` (task_specific) and
``synthetic.data.conflict`` (shared_surface), and ``synthetic.data`` shapes in general. Each is
one cell: the neutral cell (``--mechanisms std=group``) under that root with the same ``-S``
(part of every run's point), e.g. ``--full --mechanisms std=group --root /tmp/conflict -S
synthetic.data.conflict=shared_surface`` (docs/synthetic/interference_map_sft_cells.md).

    python benchmarks/interference_map.py --screen --workers 2      # 3 seeds, every cell
    python benchmarks/interference_map.py --full --full-step --methods hargo hargo_b1 \\
        hargo_b2 hargo_batch hargo_contrast uniform_sample uniform_pop --workers 2

Runs go to ``--out`` (JSON lines, one a run, through ``synthetic_sweep``'s worker): a run
already there (same point, method, seed, configuration, SFT policy and code digest,
:func:`hargo.compare.synthetic_code.code_digest`) is skipped, so the command resumes. ``--out``
is git-ignored (~80 KB a run); what survives a session is ``--archive`` (default
``metrics/synthetic/interference_map_runs.jsonl.gz`` with the default ``--out``; committed): per
run only what the report reads (:func:`compact`), gzipped, rewritten atomically after each
finished run. On start its runs join ``--out``'s, so a fresh checkout resumes from it. A
commit that touches code a run imports changes the digest; ``--adopt-code`` then trains one
run of the old digest again and takes the old runs over when its readings are the same to the
last bit (:func:`adopt`).
"""
from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interference_report as report  # noqa: E402
import synthetic_sweep as sweep  # noqa: E402

TASKS = ("syn_yesno", "syn_short", "syn_long")   # hargo.data.synthetic.SYNTHETIC_TASKS
QUOTA = "synthetic.rl.prompts_per_step_per_task"
SCREEN_SEEDS = (1, 2, 3)
FULL_SEEDS = tuple(range(1, 11))
DEFAULT_MECHANISMS = ("aggregation", "std", "noise", "mix")
OUT = "metrics/synthetic/interference_map.jsonl"
ARCHIVE = "metrics/synthetic/interference_map_runs.jsonl.gz"


@dataclass(frozen=True)
class Cell:
    """A mechanism at one value: its overrides (``{m}`` in a key: the method's block) and the
    mixed run's per-task prompts a step (:data:`TASKS` order; None: the base quota,
    :class:`Points`)."""
    mechanism: str
    value: str
    overrides: tuple = ()
    quota: tuple | None = None
    # override key -> the one task it acts on (an alone run of another task leaves it out)
    only: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.mechanism}={self.value}"


def _dyn(refills: int) -> str:
    return f"{{enabled: true, refill_factor: 2.0, max_refills: {refills}}}"


MECHANISMS: dict[str, tuple[Cell, ...]] = {
    "aggregation": tuple(Cell("aggregation", v, () if v == "response_mean" else
                              (("rl.{m}.aggregation", v),))
                         for v in ("response_mean", "token_mean", "constant_length")),
    "std": (Cell("std", "group"), Cell("std", "batch", (("rl.{m}.std_scope", "batch"),)),
            Cell("std", "none", (("rl.{m}.std", "none"),))),
    "noise": tuple(Cell("noise", v, () if v == "0" else (("synthetic.data.noise_yesno", v),),
                        only={"synthetic.data.noise_yesno": "syn_yesno"})
                   for v in ("0", "0.1", "0.3")),
    "mix": tuple(Cell("mix", "/".join(map(str, q)), quota=q)   # sums to the bed's 6
                 for q in ((2, 2, 2), (4, 1, 1), (1, 1, 4))),
    "dynamic": (Cell("dynamic", "off"),
                Cell("dynamic", "refill1", (("synthetic.rl.dynamic_sampling", _dyn(1)),)),
                Cell("dynamic", "refill2", (("synthetic.rl.dynamic_sampling", _dyn(2)),))),
}


def parse_mechanisms(items) -> list[Cell]:
    """``name`` (every value) or ``name=v1,v2`` (those values) per item."""
    cells = []
    for it in items:
        name, _, vals = it.partition("=")
        if name not in MECHANISMS:
            raise SystemExit(f"--mechanisms {name}: unknown; known: {sorted(MECHANISMS)}")
        want = vals.split(",") if vals else [c.value for c in MECHANISMS[name]]
        known = {c.value: c for c in MECHANISMS[name]}
        bad = [v for v in want if v not in known]
        if bad:
            raise SystemExit(f"--mechanisms {name}: unknown values {bad}; known: {list(known)}")
        cells += [known[v] for v in want]
    return cells


class Points:
    """A run's overrides (its *point*, part of its identity in ``--out``) per arm.

    ``fixed``: the ``-S`` values, in every point; ``every``: ``synthetic.evaluate.every_steps``;
    ``pools``: each task's RL pool in the mix (``synthetic.rl.prompts_per_task``), which an alone
    run keeps for its task (0 for the others); ``quota``: the mixed runs' prompts a step per
    task where the cell sets none (:func:`base_quota`)."""

    def __init__(self, fixed: dict, every: int, pools: dict, quota: tuple = (2, 2, 2)):
        self.fixed, self.every, self.pools = dict(fixed), int(every), dict(pools)
        self.quota = tuple(quota)

    def _quota(self, cell: Cell) -> tuple:
        return cell.quota or self.quota

    def _base(self) -> dict:
        return {**self.fixed, "synthetic.evaluate.every_steps": str(self.every)}

    @staticmethod
    def _own(cell: Cell, method: str, task: str | None) -> dict:
        return {k.format(m=method): v for k, v in cell.overrides
                if task is None or cell.only.get(k, task) == task}

    def mixed(self, cell: Cell, method: str) -> dict:
        quota = ", ".join(f"{t}: {k}" for t, k in zip(TASKS, self._quota(cell)))
        return {**self._base(), QUOTA: "{" + quota + "}", **self._own(cell, method, None)}

    def alone(self, cell: Cell, task: str, method: str, full: bool = False) -> dict:
        """``task`` alone at the mixed run's prompts a step for it (``full``: at the whole
        step); an override acting on another task only (``Cell.only``) is left out, so such a
        cell shares the neutral cell's alone runs."""
        q = self._quota(cell)
        k = sum(q) if full else q[TASKS.index(task)]
        pools = ", ".join(f"{t}: {self.pools[t] if t == task else 0}" for t in TASKS)
        return {**self._base(), "synthetic.rl.prompts_per_task": "{" + pools + "}",
                "synthetic.rl.prompts_per_step": str(k), QUOTA: "null",
                **self._own(cell, method, task)}


def base_quota(p) -> tuple:
    """The mixed runs' per-task prompts a step: ``synthetic.rl.prompts_per_step_per_task`` when
    set, else ``prompts_per_step`` split evenly (the bed's 6: 2/2/2, the mix's mean today)."""
    q = p.rl.prompts_per_step_per_task
    if q is not None:
        return tuple(int(q[t]) for t in TASKS)
    if p.rl.prompts_per_step % len(TASKS):
        raise SystemExit(f"synthetic.rl.prompts_per_step {p.rl.prompts_per_step}: not a "
                         f"multiple of {len(TASKS)}; set {QUOTA}")
    return (p.rl.prompts_per_step // len(TASKS),) * len(TASKS)


def plan_runs(points: Points, cells, seeds, tasks=TASKS, configs=("heterogeneous",
              "homogeneous"), full_step: bool = False, methods=()) -> list[tuple]:
    """``(arm, point, method, config, seed)`` of every run a set of cells needs, each once:
    GRPO mixed and alone per task in ``configs``; with ``full_step`` GRPO alone at the full
    step (heterogeneous); ``methods``' mixed runs (heterogeneous)."""
    out, seen = [], set()

    def add(arm, pt, m, conf, s):
        key = (report.point_key(pt), m, conf, s)
        if key not in seen:
            seen.add(key)
            out.append((arm, pt, m, conf, s))

    for cell in cells:
        for s in seeds:
            for conf in configs:
                add("mixed", points.mixed(cell, "grpo"), "grpo", conf, s)
                for t in tasks:
                    add("alone", points.alone(cell, t, "grpo"), "grpo", conf, s)
            for t in tasks if full_step else ():
                add("alone_full", points.alone(cell, t, "grpo", True), "grpo", "heterogeneous", s)
            for m in methods:
                add("mixed", points.mixed(cell, m), m, "heterogeneous", s)
    return out


def run_key(point: dict, method: str, seed: int, config: str, policy: str, code: str) -> str:
    return json.dumps({"point": point, "method": method, "seed": int(seed), "config": config,
                       "policy": policy, "code": code}, sort_keys=True)


def pending(runs, have: set[str], policy: str, code: str) -> list[tuple]:
    """The runs of ``runs`` whose key is not in ``have`` (the resume rule)."""
    return [r for r in runs if run_key(r[1], r[2], r[4], r[3], policy, code) not in have]


def _worker(job) -> dict:
    """``synthetic_sweep``'s worker, plus the arm, the map's key and the hargo modules the
    process loaded that the code digest misses (expected: none)."""
    arm, code, *sweep_job = job
    row = sweep._worker(tuple(sweep_job))
    from hargo.compare.synthetic_code import unlisted

    row.update(arm=arm, code=code, key=run_key(row["point"], row["method"], row["seed"],
                                                row["config"], row["policy"], code),
               unlisted_modules=unlisted(getattr(m, "__file__", None) or ""
                                         for m in list(sys.modules.values())))
    return row


# ------------------------------------------------------------------------------ the archive

#: The row fields the archive keeps besides ``run`` (:func:`compact`).
KEPT = ("key", "arm", "point", "method", "seed", "config", "policy", "code", "machine",
        "diverged", "adopted_from")


def _rle(tasks) -> list:
    """``[[task, count], ...]`` of a list of task names (the eval split is grouped by task)."""
    out: list = []
    for t in tasks:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return out


def _num(x):
    """A reading as the archive writes it: exact (``repr`` round-trips a float), integral values
    as ints (``1`` for ``1.0``: shorter, and the report reads both as the same float)."""
    x = float(x)
    return int(x) if x.is_integer() else x


def compact(row: dict) -> dict:
    """What :mod:`interference_report` reads of one run (every table, the timing and the
    diverged list) and what the resume rule keys it by: ``run`` becomes ``{"tasks"`` (run
    lengths), ``"curve"`` (the per-prompt ``reward`` and ``correct`` of each eval point),
    ``"wall_s"}``, plus ``"end"`` only where the final eval is not the curve's last point (no
    curve: ``synthetic.evaluate.every_steps`` 0). :func:`expand` undoes it."""
    out = {k: row[k] for k in KEPT if k in row}
    run = row.get("run")
    if not run:
        return {**out, "run": None}
    ev = run["eval"]
    end = {m: [_num(v) for v in ev[m]] for m in ("reward", "correct")}
    curve = [{"step": int(c["step"]), **{m: [_num(v) for v in c[m]] for m in ("reward", "correct")}}
             for c in run.get("eval_curve_prompts") or []]
    c = {"tasks": _rle(ev["tasks"]), "curve": curve, "wall_s": run.get("wall_s")}
    if not curve or {m: curve[-1][m] for m in end} != end:
        c["end"] = end
    return {**out, "run": c}


def expand(row: dict) -> dict:
    """An archived run (:func:`compact`) as the report reads a row of ``--out``."""
    c = row.get("run")
    if not c:
        return dict(row)
    end = c.get("end") or {m: c["curve"][-1][m] for m in ("reward", "correct")}
    run = {"eval": {"tasks": [t for t, n in c["tasks"] for _ in range(n)], **end},
           "wall_s": c.get("wall_s")}
    if c["curve"]:
        run["eval_curve_prompts"] = c["curve"]
    return {**row, "run": run, "archived": True}


class Archive:
    """The committed runs (a gzip of :func:`compact` JSON lines, one a run, sorted by key, the
    gzip header's time 0: the same runs give the same bytes). ``path`` None: no archive."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lines: dict[str, str] = {}
        if path and path.exists():
            for ln in gzip.decompress(path.read_bytes()).decode().splitlines():
                if ln.strip():
                    self.lines[json.loads(ln)["key"]] = ln

    def rows(self) -> list[dict]:
        return [expand(json.loads(ln)) for ln in self.lines.values()]

    def add(self, rows) -> int:
        """Keep ``rows`` (full or archived); how many were new."""
        new = 0
        for r in rows:
            if r.get("archived") and r["key"] in self.lines:
                continue                      # compact(expand(x)) is x: nothing to redo
            new += r["key"] not in self.lines
            self.lines[r["key"]] = json.dumps(compact(r), sort_keys=True, separators=(",", ":"))
        return new

    def save(self) -> None:
        if self.path is None:
            return
        from hargo.io import atomic_write_bytes

        text = "".join(self.lines[k] + "\n" for k in sorted(self.lines))
        atomic_write_bytes(self.path, gzip.compress(text.encode(), 6, mtime=0))


def machine(params: dict) -> dict:
    """This machine as the SFT policy's digest depends on it: the CPU, its bf16 flags and the
    precision a run trains at (bf16 autocast where ``train.bf16`` and the flags allow)."""
    from hargo.config import as_config
    from hargo.hardware import cpu_flags, describe_cpu, use_bf16

    flags = "+".join(sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"})) or "none"
    return {"cpu": describe_cpu(), "bf16_flags": flags,
            "precision": "bf16" if use_bf16(as_config(params)) else "fp32"}


def _where(m: dict | None) -> str:
    return (f"bf16 flags {m['bf16_flags']}, {m['precision']}; {m['cpu']}" if m
            else "machine not recorded")


def resume_lines(rows, policy: str, code: str, here: dict) -> list[str]:
    """Why each group of ``rows`` (archived runs) is or is not resumed here: this policy and
    code; another code digest (a commit changed code a run executes); another SFT policy, with
    the machine it was trained on (its CPU kind and precision make the digest)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        why = ("match" if r.get("policy") == policy and r.get("code") == code else
               "code" if r.get("policy") == policy else "policy")
        m = r.get("machine")
        groups.setdefault((why, r.get("policy", "?"), json.dumps(m, sort_keys=True)), []) \
            .append(r)
    out = []
    order = {"match": 0, "code": 1, "policy": 2}
    for (why, pol, m), rs in sorted(groups.items(),
                                    key=lambda g: (order[g[0][0]], g[0][1:])):
        m = json.loads(m)
        if why == "match":
            out.append(f"  {len(rs)} of this policy and code: resumed (trained on {_where(m)})")
        elif why == "code":
            out.append(f"  {len(rs)} of this policy but another code digest "
                       f"({', '.join(sorted({r['code'][:12] for r in rs}))}): a commit changed "
                       "code a run executes; not resumed")
        else:
            same = m and (m["bf16_flags"], m["precision"]) == (here["bf16_flags"],
                                                               here["precision"])
            out.append(f"  {len(rs)} of another SFT policy {pol[:12]} (trained on {_where(m)}): "
                       + ("the same CPU kind and precision as here, so another SFT (other data "
                          "or params?)" if same else "another CPU kind or precision than here")
                       + "; not resumed")
    return out


def train(jobs, args, root: Path, out: Path, policy: str, code: str, done: list,
          archive: Archive | None = None, here: dict | None = None) -> None:
    threads = 1 if args.workers > 1 else 2
    work = [(arm, code, args.params, [], pt, m, s, conf, str(root), threads, policy)
            for arm, pt, m, conf, s in jobs]
    if not work:
        return
    print(f"[map] {len(work)} runs to train, {args.workers} worker(s)", flush=True)
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with mp.get_context("spawn").Pool(args.workers) as pool, out.open("a") as f:
        for i, r in enumerate(pool.imap_unordered(_worker, work), 1):
            if here:
                r["machine"] = here
            f.write(json.dumps(r) + "\n")
            f.flush()
            done.append(r)
            if archive:                     # after each run: an interrupt loses one run at most
                archive.add([r])
                archive.save()
            miss = f" UNLISTED CODE {r['unlisted_modules']}" if r["unlisted_modules"] else ""
            got = (f"DIVERGED ({r['diverged']})" if r["run"] is None else
                   f"eval {r['run']['eval_summary']['all/reward']:.3f} "
                   f"in {r['run']['wall_s']:.0f} s")
            print(f"[map] {i}/{len(work)} {r['arm']} {r['config'][:3]} {r['method']} "
                  f"s{r['seed']}: {got} ({time.perf_counter() - t0:.0f} s){miss}", flush=True)


def _readings(row: dict) -> dict | None:
    """What the report reads of a run (:func:`compact`'s curve, end and tasks; no wall time)."""
    run = compact(row).get("run")
    return None if run is None else {k: v for k, v in run.items() if k != "wall_s"}


def adopt(rows: list, policy: str, code: str, args, root: Path, out: Path,
          archive: Archive | None, here: dict | None) -> list[dict]:
    """``--adopt-code``: runs of this SFT policy made at another code digest, taken over as this
    code's where a commit in between changed none of their results. Per other digest, one of
    its runs (an alone run first: the cheapest) is trained again here; if every reading of it
    (each eval point's per-prompt reward and correct, the end) equals the archived one exactly,
    the digest's runs are re-keyed to this code (``adopted_from``: the old digest; in the
    archive they replace the old lines). Otherwise nothing of that digest is adopted, and
    those runs are trained again where the map plans them. Returns the rows that now count
    here: the probes trained here and the adopted runs. Needs the archived runs' machine kind
    and thread count (``--workers`` > 1: one thread a run) for equal readings."""
    groups: dict[str, list] = {}
    for r in rows:
        if r.get("policy") == policy and r.get("code") not in (None, code) and r.get("run"):
            groups.setdefault(r["code"], []).append(r)
    have = {r["key"] for r in rows if r.get("code") == code}
    out_rows: list[dict] = []
    for old, rs in sorted(groups.items()):
        probe = min(rs, key=lambda r: (r.get("arm") != "alone", r["key"]))
        mine = run_key(probe["point"], probe["method"], probe["seed"], probe["config"], policy,
                       code)
        fresh = [r for r in rows + out_rows if r["key"] == mine]
        if not fresh:
            train([(probe["arm"], probe["point"], probe["method"], probe["config"],
                    probe["seed"])], args, root, out, policy, code, fresh, archive, here)
            out_rows += fresh
        have.add(mine)
        what = f"{probe['arm']} {probe['config'][:3]} {probe['method']} s{probe['seed']}"
        if not fresh[0].get("run") or _readings(fresh[0]) != _readings(probe):
            print(f"[map] code {old[:12]}: {len(rs)} runs; {what} trained again here gives "
                  "other readings: not adopted", flush=True)
            continue
        taken = [{**r, "code": code, "adopted_from": old,
                  "key": run_key(r["point"], r["method"], r["seed"], r["config"], policy, code)}
                 for r in rs]
        taken = [r for r in taken if r["key"] not in have]
        have.update(r["key"] for r in taken)
        out_rows += taken
        with out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in taken)
        if archive is not None and archive.path:
            for r in rs:
                archive.lines.pop(r["key"], None)
            archive.add([{k: v for k, v in r.items() if k != "archived"} for r in taken])
            archive.save()
        print(f"[map] code {old[:12]}: {len(rs)} runs; {what} trained again here gives the "
              f"same readings: {len(taken)} adopted as code {code[:12]}'s", flush=True)
    return out_rows


def cpu_line(params: dict) -> str:
    from hargo.config import as_config
    from hargo.hardware import describe_cpu, use_bf16

    flags = sorted({f for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("flags") for f in ln.split()
                    if f in ("avx512_bf16", "amx_bf16")}) if Path("/proc/cpuinfo").exists() else []
    bf16 = params["train"]["bf16"]
    return (f"CPU: {describe_cpu()} (bf16 flags: {', '.join(flags) or 'none'}). Precision: "
            f"train.bf16 = {bf16}, so {'bf16 autocast' if use_bf16(as_config(params)) else 'fp32'} here.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--screen", action="store_true", help="every cell at --seeds (default 3)")
    mode.add_argument("--full", action="store_true",
                      help="screen first, then --seeds (default 10) in flagged + neutral cells")
    ap.add_argument("--seeds", nargs="+", type=int)
    ap.add_argument("--screen-seeds", nargs="+", type=int, default=list(SCREEN_SEEDS))
    ap.add_argument("--mechanisms", nargs="+", default=list(DEFAULT_MECHANISMS),
                    help="name or name=v1,v2 (values: interference_map.MECHANISMS)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    ap.add_argument("--configs", nargs="+", default=["heterogeneous", "homogeneous"],
                    choices=["heterogeneous", "homogeneous"], help="the DiD needs both")
    ap.add_argument("--full-step", action="store_true", help="alone at the full step, flagged")
    ap.add_argument("--methods", nargs="*", default=[], help="minus GRPO in flagged cells")
    ap.add_argument("--every", type=int, default=5, help="synthetic.evaluate.every_steps")
    ap.add_argument("--early-step", type=int, help="the early reading (default: first point)")
    ap.add_argument("--metric", default="reward", choices=["reward", "correct"])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--root", default=".", help="holds data/synthetic and the SFT policy")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--archive", help=f"the committed runs (default {ARCHIVE} with the default "
                    "--out, none otherwise; 'none': none)")
    ap.add_argument("--report", default="reports/interference_map.md")
    ap.add_argument("-S", "--set", dest="sets", action="append", default=[])
    ap.add_argument("--analyse-only", action="store_true")
    ap.add_argument("--adopt-code", action="store_true",
                    help="take over runs of another code digest when one of them, trained "
                         "again here, gives the same readings (see adopt())")
    a = ap.parse_args(argv)

    from hargo.compare.synthetic_code import code_digest
    from hargo.compare.synthetic_plan import MODEL_DIR, plan
    from hargo.config import as_config
    from hargo.models.loading import model_digest, resolve_model_dir
    from hargo.params import ParamsError

    cells = parse_mechanisms(a.mechanisms)
    params = sweep.load_run_params(a.params, a.sets)
    p = plan(as_config(params))
    points = Points(dict(s.partition("=")[::2] for s in a.sets), a.every,
                    dict(p.rl.prompts_per_task), base_quota(p))
    seeds = a.seeds or (list(FULL_SEEDS) if a.full else list(a.screen_seeds))
    first = a.screen_seeds if a.full else seeds
    every_run = plan_runs(points, cells, sorted(set(seeds) | set(first)), a.tasks, full_step=True,
                          methods=a.methods)
    for key in {report.point_key(r[1]) for r in every_run}:   # a bad value fails here, first
        try:
            plan(as_config(sweep.load_run_params(a.params, [f"{k}={v}" for k, v
                                                            in json.loads(key).items()])))
        except (ParamsError, ValueError) as e:
            raise SystemExit(f"error: {e}")
    root = Path(a.root)
    policy = model_digest(resolve_model_dir(root / MODEL_DIR))
    code = code_digest()
    out = Path(a.out)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] \
        if out.exists() else []
    here = machine(params)
    arch = a.archive or (ARCHIVE if a.out == OUT else "none")
    archive = Archive(None if arch == "none" else Path(arch))
    print(f"[map] here: {_where(here)}; code {code[:12]}, policy {policy[:12]}", flush=True)
    if archive.path:
        have = {r["key"] for r in rows}
        kept = archive.rows()
        new = [r for r in kept if r["key"] not in have]
        print(f"[map] archive {archive.path}: {len(kept)} runs, {len(new)} not in {out}",
              flush=True)
        for ln in resume_lines(kept, policy, code, here):
            print(f"[map] {ln}", flush=True)
        if new and not a.analyse_only:       # --out holds the union from now on
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
        rows += new
        if archive.add(rows) and not a.analyse_only:   # runs of --out the archive lacked
            archive.save()
    done = [r for r in rows if r.get("policy") == policy and r.get("code") == code]
    if a.adopt_code and not a.analyse_only:
        done += adopt(rows, policy, code, a, root, out, archive, here)
    print(f"[map] {len(done)} runs of this policy and code in {out}"
          f"{' and the archive' if archive.path else ''} ({len(rows)} in all)", flush=True)
    conf = dict(metric=a.metric, early_step=a.early_step, resamples=p.bootstrap.resamples,
                confidence=p.bootstrap.confidence)

    def step(cs, ss, **kw):
        if not a.analyse_only:
            have = {r["key"] for r in done}
            kw.setdefault("configs", a.configs)
            train(pending(plan_runs(points, cs, ss, a.tasks, **kw), have, policy, code), a,
                  root, out, policy, code, done, archive, here)
        return report.analyse(done, cells, a.tasks, points, a.methods, **conf)

    t0 = time.perf_counter()
    numbers = step(cells, first)                                   # every cell, screening seeds
    if a.full:
        flag = set(report.flagged(numbers))
        chosen = [c for c in cells if c.name in flag
                  or c.value == MECHANISMS[c.mechanism][0].value]
        numbers = step(chosen, seeds)                              # flagged + neutral: all seeds
    flag = set(report.flagged(numbers))
    if a.full_step or a.methods:
        numbers = step([c for c in cells if c.name in flag], seeds, configs=(),
                       full_step=a.full_step, methods=a.methods)
    wall = time.perf_counter() - t0
    rep = Path(a.report)
    rep.parent.mkdir(parents=True, exist_ok=True)
    fig = rep.with_suffix(".png")
    report.plot(numbers, cells, fig, p.bootstrap.confidence)
    t = report.timing(done)
    stopped = report.diverged(done)
    early = f"step {a.early_step}" if a.early_step else f"step {a.every}"
    head = [
        "# The interference map of the synthetic test bed", "",
        cpu_line(params), "",
        f"`benchmarks/interference_map.py` ({'full' if a.full else 'screen'}; seeds {seeds}; "
        f"fixed overrides: {points.fixed or 'none'}): {p.rl.steps} RL steps a run, "
        f"{p.rl.prompts_per_step} prompts a step (mixed: {'/'.join(map(str, points.quota))} "
        f"unless the cell sets it) x G = {p.rl.num_generations}, lr "
        f"{p.rl.learning_rate}, eval every {a.every} steps; SFT policy {policy[:12]}, code "
        f"{code[:12]}. Metric: each configuration's eval `{a.metric}`. Mean time a run "
        f"(wall, eval included): mixed {t['mixed']:.0f} s, alone {t['alone']:.0f} s; "
        f"this call took {wall:.0f} s.", "",
        "Alone - mixed: GRPO on the task alone at the mixed run's prompts a step for it, minus "
        "the same task in the mix (> 0: the mix costs the task that much), paired two-level "
        f"bootstrap {int(round(p.bootstrap.confidence * 100))}% intervals (seed pairs and "
        "prompts resampled). AUC: the mean eval reward over the curve (trapezoid / steps); "
        f"{early}: the early reading. DiD: heterogeneous alone - mixed minus homogeneous "
        "alone - mixed on the same seeds (> 0: more than plain dilution). **>0**: the interval "
        f"lies above 0. Intervals at < {report.FINDING_SEEDS} seeds are screening only.", "",
        f"Flagged cells: {', '.join(sorted(flag)) or 'none'}.", "",
        *(["Runs the divergence guard stopped (`train.divergence`; recorded, never scored: "
           "their seed pairs drop out of the intervals):", "",
           *[f"- {d}" for d in stopped], ""] if stopped else []),
        f"![alone - mixed per cell]({fig.name})", ""]
    md = "\n".join(head) + "\n" + report.markdown(numbers, cells, p.bootstrap.confidence, early)
    tr = report.transfer(done, cells, a.tasks, points, a.metric, p.bootstrap.resamples,
                         p.bootstrap.confidence)
    md += "\n" + report.transfer_markdown(tr, a.tasks, p.bootstrap.confidence)
    from hargo.io import atomic_write_text

    atomic_write_text(rep, md)
    atomic_write_text(rep.with_suffix(".json"), json.dumps(numbers, indent=1))
    atomic_write_text(rep.with_name(rep.stem + "_transfer.json"), json.dumps(tr, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
