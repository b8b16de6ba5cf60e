"""Methods as plug-ins (hargo/methods/, issue 28): the registry's API and errors, each method's
estimator / policy loss / KL estimator found by name in its registry, the hand-written DVC
params lists that still name the RL methods' blocks, and a toy RL method added as one new module
plus one params block -- seen by ``hargo rl --help``, ``hargo check-params``, the params checks,
the comparison's method list and labels, and trained through the ``rl`` stage on the tiny model,
with no other file edited."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from plugin_helpers import package_copy_with, rediscover
from rl_helpers import TASKS, rl_params, write_jsonl

from hargo.methods import (FAMILIES, RL_FAMILIES, Method, UnknownMethodError, get_method,
                           method_names, methods, methods_of_family, register_method)
from hargo.testing import crafted_records
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]

#: The methods and their order before the registry (hargo/vocab.py's tuples at 55ddbd3).
BEFORE = ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "ppo", "dpo", "kto", "simpo",
          "hpcgpt")
#: Added with the one loss path: the uniform-weight controls and hargo's batch variants.
ADDED = ("uniform_sample", "uniform_pop", "hargo_batch", "hargo_contrast")


# ------------------------------------------------------------------------------ registry

@pytest.mark.fast
def test_registry_lists_every_method_in_the_former_order_with_its_family():
    """The built-ins are listed in their order (a plug-in may add more: it is not refused)."""
    builtin = lambda names: tuple(n for n in names if n in BEFORE + ADDED)  # noqa: E731
    assert builtin(method_names()) == BEFORE[:5] + ADDED + BEFORE[5:]
    assert builtin(method_names(*RL_FAMILIES)) == BEFORE[:5] + ADDED + ("ppo",)
    assert {f: builtin(method_names(f)) for f in FAMILIES} == {
        "grpo_family": BEFORE[:5] + ADDED, "value": ("ppo",),
        "preference": ("dpo", "kto", "simpo"), "sft": ("hpcgpt",)}
    assert methods_of_family("value") == (get_method("ppo"),)
    labels = {m.name: m.label for m in methods()}
    assert [labels[n] for n in BEFORE] == ["GRPO", "Dr.GRPO", "HARGO", "HARGO-B1", "HARGO-B2",
                                           "PPO", "DPO", "KTO", "SimPO", "HPC-GPT"]
    assert all(m.description.strip() for m in methods())


@pytest.mark.fast
def test_unknown_method_is_refused_with_the_valid_names():
    with pytest.raises(UnknownMethodError,
                       match=r"unknown method 'grop'; valid: grpo, dr_grpo, .*, hpcgpt$"):
        get_method("grop")
    with pytest.raises(ValueError, match=r"method 'dpo' is of family preference, not "
                                         r"grpo_family/value; valid: grpo, .*, ppo$"):
        get_method("dpo", *RL_FAMILIES)
    with pytest.raises(ValueError, match="unknown method family 'rl'"):
        methods_of_family("rl")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_method(Method(name="grpo", label="x", description="x", family="preference"))
    with pytest.raises(TypeError, match="expected a hargo.methods.Method"):
        register_method("grpo")


@pytest.mark.fast
def test_an_inconsistent_method_is_refused_when_built():
    from hargo.method_config import GRPOParams

    ok = dict(name="m", label="M", description="d", family="grpo_family", kl="k3",
              params_class=GRPOParams)
    full = dict(ok, estimator="grpo", policy_loss="clipped_surrogate")
    assert Method(**full, loss="weighted").is_rl
    with pytest.raises(ValueError, match="a weighted loss needs an estimator and a policy_loss"):
        Method(**ok, loss="weighted")
    with pytest.raises(ValueError, match=r"loss 'ppo' \(the grpo_family trainer implements "
                                         r"weighted\)"):
        Method(**ok, loss="ppo")
    with pytest.raises(ValueError, match=r"loss 'trl' \(the grpo_family trainer implements "
                                         r"weighted\)"):   # the one loss path: no TRL loss
        Method(**full, loss="trl")
    with pytest.raises(ValueError, match="needs_reference is for a weighted loss"):
        Method(name="p", label="P", description="d", family="value", kl="k1", loss="ppo",
               params_class=GRPOParams, needs_reference=True)
    with pytest.raises(ValueError, match="no params_class"):
        Method(**{**full, "params_class": None}, loss="weighted")
    with pytest.raises(ValueError, match="description must be a non-empty string"):
        Method(**{**full, "description": " "}, loss="weighted")
    with pytest.raises(ValueError, match="family 'rl'"):
        Method(name="m", label="M", description="d", family="rl")


@pytest.mark.fast
def test_each_methods_estimator_policy_loss_and_kl_are_registered_by_name():
    from hargo.advantages import ESTIMATORS, needs_reference
    from hargo.losses import KL_ESTIMATORS, POLICY_LOSSES

    for m in methods_of_family(*RL_FAMILIES):
        assert m.kl in KL_ESTIMATORS, m.name
        assert m.policy_loss is None or m.policy_loss in POLICY_LOSSES, m.name
        if m.estimator is not None:
            assert m.estimator in ESTIMATORS and needs_reference(m.estimator) == \
                m.needs_reference, m.name
    got = {m.name: (m.loss, m.estimator, m.policy_loss, m.kl, m.needs_reference)
           for m in methods_of_family(*RL_FAMILIES)}
    assert {k: got[k] for k in BEFORE[:6] + ADDED} == {
        "grpo": ("weighted", "grpo", "clipped_surrogate", "k3", False),
        "dr_grpo": ("weighted", "dr_grpo", "clipped_surrogate", "k3", False),
        "uniform_sample": ("weighted", "hargo_uniform", "clipped_surrogate", "k3", False),
        "uniform_pop": ("weighted", "hargo_uniform", "clipped_surrogate", "k3", False),
        "hargo_batch": ("weighted", "hargo_batch", "clipped_surrogate", "k3", True),
        "hargo_contrast": ("weighted", "hargo_contrast", "clipped_surrogate", "k3", False),
        "hargo": ("weighted", "hargo", "clipped_surrogate", "k3", True),
        "hargo_b1": ("weighted", "hargo_b1", "clipped_surrogate", "k3", False),
        "hargo_b2": ("weighted", "hargo_b2", "clipped_surrogate", "k3", True),
        "ppo": ("ppo", None, None, "k1", False)}


@pytest.mark.fast
def test_the_trl_settings_are_the_methods_own():
    """hargo computes every RL method's loss, so every built-in keeps TRL's ``grpo`` settings
    (which then only shape TRL's logging); the loss form is the method's ``aggregation``."""
    from hargo.training.trl_options import trl_loss_settings

    assert {m: trl_loss_settings(m) for m in BEFORE[:6] + ADDED} == {
        m: {"loss_type": "grpo", "scale_rewards": "group"} for m in BEFORE[:6] + ADDED}
    with pytest.raises(ValueError, match="'dpo' is of family preference"):
        trl_loss_settings("dpo")


@pytest.mark.fast
def test_no_dvc_yaml_lists_a_methods_block_as_params():
    """DVC's ``params:`` refuses a key params.yaml lacks (MissingParamsError), so no stage may
    list a method's block (``rl.<method>``, ``compare.<method>``): a params.yaml without a new
    method's block must run. The RL stages depend on the resolved knobs the params stage writes
    instead: ``rl@<method>`` and each ``compare_train`` item on their own method's file, the
    test bed's RL stage on the folder."""
    stages = {}
    for f in ("dvc.yaml", "compare/dvc.yaml", "synthetic/dvc.yaml"):
        for name, spec in yaml.safe_load((ROOT / f).read_text())["stages"].items():
            stages[name] = spec.get("do", spec)
    names = set(method_names())
    for name, spec in stages.items():
        listed = [p for p in spec.get("params", []) if isinstance(p, str)]
        blocks = [p for p in listed if p.split(".")[0] in ("rl", "compare")
                  and len(p.split(".")) > 1 and p.split(".")[1] in names]
        assert not blocks, (name, blocks)
    deps = lambda name: [d if isinstance(d, str) else next(iter(d))  # noqa: E731
                         for d in stages[name].get("deps", [])]
    assert "reports/method-params/${item}.json" in deps("rl")
    assert "reports/method-params/${item.method}.json" in deps("compare_train")
    assert "reports/method-params" in deps("synthetic_rl")


def test_importing_the_registry_and_the_cli_loads_no_torch():
    code = ("import sys, hargo.cli; from hargo.methods import methods; methods(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ a toy method, one module

TOY_MODULE = textwrap.dedent('''\
    """``toy``: its own estimator (the group advantage times a knob, ``rl.toy.shrink``) in the
    GRPO family's one loss, with the k2 KL."""
    from dataclasses import dataclass

    from hargo.estimators import register_estimator
    from hargo.method_config import GRPOParams, knob
    from hargo.methods import Method, register_method


    @dataclass(frozen=True)
    class ToyParams(GRPOParams):
        """``rl.toy``: GRPO's knobs (beta, std, std_eps, std_scope, aggregation) and one more."""

        beta: float = knob(0.05, "coefficient of the k2 KL term", lo=0.0)
        shrink: float = knob(0.5, "the advantage is multiplied by this", lo=0.0)


    @register_estimator("toy_shrunk")
    def toy_shrunk(rewards, ref_logprob, baseline, config):
        """(N, G) rewards -> the group advantage of the block's std convention x shrink,
        uniform 1/G weights."""
        import torch

        from hargo.advantages import EstimatorOutput

        adv = config.advantage(rewards) * config.params.shrink
        weights = torch.full(rewards.shape, 1.0 / rewards.shape[1])
        return EstimatorOutput(adv.to(torch.float32), weights)


    register_method(Method(
        name="toy", label="TOY", description="a toy: shrunk group advantages, k2 KL",
        family="grpo_family", rank=35, estimator="toy_shrunk", loss="weighted",
        policy_loss="clipped_surrogate", kl="k2", params_class=ToyParams))
''')


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    """A copy of the ``hargo`` package with one new module, ``hargo/methods/toy.py``; returns
    the folder to put on ``PYTHONPATH``."""
    return package_copy_with(tmp_path_factory.mktemp("pkg"), "methods", "toy", TOY_MODULE)


@pytest.fixture()
def toy_registered(toy_package, monkeypatch):
    """This process's registry, re-discovered with the copy's ``hargo/methods`` on the package's
    path (so ``toy.py`` is found as a module of the package); restored afterwards."""
    import hargo.methods as registry

    from hargo import estimators

    rediscover(monkeypatch, registry, toy_package)
    monkeypatch.setattr(estimators, "ESTIMATORS", dict(estimators.ESTIMATORS))
    try:
        yield get_method("toy")
    finally:
        sys.modules.pop("hargo.methods.toy", None)


def _toy_params(params: dict) -> dict:
    p = copy.deepcopy(params)
    p["rl"]["toy"] = {"beta": 0.05}          # the one params block
    return p


def _hargo(args: list[str], pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "hargo.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


def test_toy_method_module_appears_in_the_cli_and_the_params_check(toy_package, tmp_path):
    top = _hargo(["--help"], toy_package, tmp_path)
    assert "hargo_b2 (grpo_family), toy (grpo_family), uniform_sample (grpo_family)" in top.stdout
    out = _hargo(["rl", "--help"], toy_package, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "toy: a toy: shrunk group advantages, k2 KL" in out.stdout
    assert "hargo: HARGO: discrimination x confidence response weights; hargo_b1:" in out.stdout
    assert "a method of compare.methods: grpo, dr_grpo, hargo, hargo_b1, hargo_b2, toy, uniform" \
        in _hargo(["compare-train", "--help"], toy_package, tmp_path).stdout

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # an older params.yaml without rl.toy still validates: its knobs take their defaults
    missing = _hargo(["check-params"], toy_package, tmp_path)
    assert missing.returncode == 0, missing.stderr
    p = _toy_params(params)
    p["rl"]["methods"] = [*p["rl"]["methods"], "toy"]
    p["compare"]["methods"] = [*p["compare"]["methods"], "toy"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    ok = _hargo(["check-params"], toy_package, tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = _hargo(["check-params", "-S", "rl.toy.beta=-1"], toy_package, tmp_path)
    assert "rl.toy.beta: must be >= 0.0, got -1" in bad.stderr
    # the repository's own package does not know it: the module is the only change
    plain = _hargo(["check-params"], ROOT, tmp_path)
    assert "rl.methods: unknown method 'toy'" in plain.stderr


def test_toy_method_is_checked_compared_and_trained_by_the_rl_stage(
        toy_registered, committed_params, tiny_model_dir, mlflow_uri, tmp_path):
    """One optimizer step of the toy through ``rl.run``: the trainer runs the method's own
    estimator (registered in its module) with its own knob, in the one loss, its k2 KL by name,
    and the comparison lists and labels it."""
    from hargo.compare import render
    from hargo.compare.train import family, run_params
    from hargo.params import ParamsError, validate_params
    from hargo.training import rl

    toy = toy_registered
    assert method_names("grpo_family")[:6] == ("grpo", "dr_grpo", "hargo", "hargo_b1",
                                               "hargo_b2", "toy")
    data = tmp_path / "prepared"
    write_jsonl(data / "train.jsonl", crafted_records(per_task=1))
    params = rl_params(_toy_params(committed_params), tiny_model_dir, data, steps=1,
                       num_generations=2, prompts_per_step=4, save_steps=1, max_new_tokens=4)
    assert params["rl"]["toy"] == {"beta": 0.02}      # rl_params sets every block's beta
    params["rl"]["methods"] = ["toy"]
    params["compare"]["methods"] = ["hargo", "toy"]
    validate_params(params)
    with pytest.raises(ParamsError, match=r"rl\.toy: unknown key\(s\) alpha; valid: beta"):
        validate_params({**params, "rl": {**params["rl"], "toy": {"beta": 0.1, "alpha": 1}}})

    # the comparison: its method list, family, run params and label
    assert family("toy") == "rl" and render.pretty("toy") == "TOY"
    assert run_params(as_config(params), "toy", 3)["rl"]["toy"] == {"beta": 0.02}

    res = rl.run(as_config(params), "toy", root=tmp_path, keep_history=True)
    assert res["method"] == "toy" and res["steps"] == 1
    assert (tmp_path / "models" / "rl" / "toy" / "model.safetensors").is_file()
    on_disk = json.loads((tmp_path / "metrics" / "rl" / "toy.json").read_text())
    assert on_disk["steps"] == 1 and set(on_disk["rewards"]) == set(TASKS) | {"all"}
    # the toy's estimator with its knob: (r - mean) / (sample std + 1e-4) x shrink, by hand:
    # rewards (1, 0): 0.5 / (0.70711 + 1e-4) x 0.5 = 0.35350; (0.5, 0.5): 0
    import torch

    from hargo.advantages import HargoConfig, estimate
    from hargo.methods import method_params

    mp = method_params(params, "toy")
    assert mp.shrink == 0.5 and mp.std == "sample"     # defaults: the block names beta only
    cfg = HargoConfig.of(mp, toy.estimator)
    out = estimate(toy.estimator, torch.tensor([[1.0, 0.0], [0.5, 0.5]]), config=cfg)
    assert out.advantages.reshape(-1).tolist() == pytest.approx([0.35350, -0.35350, 0.0, 0.0],
                                                                abs=1e-5)
    cfg2 = HargoConfig.of(method_params({"rl": {"toy": {"shrink": 2.0}}}, "toy"), toy.estimator)
    assert estimate(toy.estimator, torch.tensor([[1.0, 0.0]]), config=cfg2).advantages[0, 0] \
        == pytest.approx(1.41401, abs=1e-5)
    # uniform 1/G weights in every group, advantages of mean 0
    (step,) = res["history"]
    assert step["step"] == 1
    assert step["all/weight_mean"] == pytest.approx(0.5)
    assert step["all/weight_max"] == pytest.approx(0.5)
    assert step["all/advantage_mean"] == pytest.approx(0.0, abs=1e-6)
    assert toy.kl == "k2" and get_method("toy") is toy
