"""The shipped launch configs (configs/accelerate/), the launch form of every training stage,
and the recipes that use it (scripts/slurm/hargo.sbatch, the Prefect ``gpu`` pool).

The DDP config *runs* in the suite (2 gloo CPU processes: tests/test_rl_distributed.py and
tests/test_multiprocess_stages.py). DeepSpeed and FSDP cannot run here: accelerate applies them
only on accelerator devices (``AcceleratorState`` keeps ``MULTI_CPU`` for CPU processes, with
or without ``ACCELERATE_USE_FSDP`` / ``ACCELERATE_USE_DEEPSPEED``), and DeepSpeed is not
installed in the CPU environment (it is in the ``gpu`` extra). What is checked for them here:
each file parses into accelerate's own config class with the expected fields; accelerate's own
launcher code turns it, on 2 nodes of 8 GPUs, into the world size, node rank, rendezvous and
environment the processes start with; accelerate's plugins built from that environment
(``FullyShardedDataParallelPlugin``, ``DeepSpeedPlugin``) have the sharding asked for; and
hargo's RL config splits the global batch over that world size.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "accelerate"
NAMES = ("multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "fsdp2")

#: 2 nodes x 8 GPUs, node rank 1: what the SLURM recipe passes to the second training node.
TWO_NODES = ["--num_processes", "16", "--num_machines", "2", "--machine_rank", "1",
             "--main_process_ip", "10.0.0.1", "--main_process_port", "29555",
             "--rdzv_backend", "c10d"]


def test_the_four_configs_and_no_others_are_shipped():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(NAMES)


@pytest.mark.parametrize("name, kind", [("multi_gpu", "MULTI_GPU"),
                                        ("deepspeed_zero2", "DEEPSPEED"),
                                        ("deepspeed_zero3", "DEEPSPEED"), ("fsdp2", "FSDP")])
def test_config_parses_into_accelerates_config_class(name, kind):
    """accelerate's ``load_config_from_file`` (what ``accelerate launch --config_file`` reads)
    gives a ``ClusterConfig`` with the distributed type; mixed precision is 'no' in every file
    (params.yaml's train.bf16 decides: accelerate's 'bf16' would turn bf16 autocast on under
    train.bf16: false), one machine of 8 processes unless the command line says otherwise."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    cfg = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type == DistributedType[kind]
    assert cfg.mixed_precision == "no" and cfg.downcast_bf16 == "no"
    assert (cfg.num_machines, cfg.num_processes, cfg.machine_rank) == (1, 8, 0)
    assert cfg.use_cpu is False and cfg.compute_environment.value == "LOCAL_MACHINE"
    if kind == "DEEPSPEED":
        ds = cfg.deepspeed_config
        stage = int(name[-1])
        assert ds["zero_stage"] == stage and ds["gradient_accumulation_steps"] == 1
        assert ds["offload_optimizer_device"] == ds["offload_param_device"] == "none"
        assert ds["deepspeed_multinode_launcher"] == "standard"   # torchrun per node (SLURM)
        assert ds["zero3_init_flag"] is (stage == 3)
        if stage == 3:
            assert ds["zero3_save_16bit_model"] is True   # one whole model saved by process 0
        assert cfg.fsdp_config == {}
    elif kind == "FSDP":
        f = cfg.fsdp_config
        assert f["fsdp_version"] == 2 and f["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert f["fsdp_state_dict_type"] == "FULL_STATE_DICT"
        assert f["fsdp_reshard_after_forward"] is True and f["fsdp_offload_params"] is False
        assert cfg.deepspeed_config == {}
    else:
        assert cfg.fsdp_config == {} and cfg.deepspeed_config == {}


def _launch_args(name: str, *extra: str):
    """accelerate's own parsing of ``accelerate launch --config_file <name> <extra> -m hargo.cli
    rl --method hargo``: (args, config defaults) after the config file is merged in."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / f"{name}.yaml"), *extra,
         "-m", "hargo.cli", "rl", "--method", "hargo"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    return args, defaults, mp_from_config


@pytest.mark.parametrize("name", NAMES)
def test_two_node_launch_world_size_and_environment(name, monkeypatch):
    """On 2 nodes x 8 GPUs (the SLURM recipe's arguments), accelerate's launcher code gives
    each node 8 processes of a 16-process world, this node rank 1, c10d rendezvous at the main
    node, the module hargo.cli; and the environment the processes start with names the sharding
    (DDP: none; FSDP: version 2, full state dict; ZeRO: its stage)."""
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    args, defaults, mp_from_config = _launch_args(name, *TWO_NODES)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (16, 2, 1)
    assert args.module is True
    assert args.training_script == "hargo.cli"
    assert args.training_script_args == ["rl", "--method", "hargo"]
    assert args.use_deepspeed is name.startswith("deepspeed")
    assert args.use_fsdp is (name == "fsdp2")
    if args.use_deepspeed:     # accelerate's launch_command does this before its launcher
        args.deepspeed_fields_from_accelerate_config = ",".join(
            list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else []))
        cmd, env = prepare_deepspeed_cmd_env(args)
        assert cmd is None                 # the standard launcher: torchrun on each node
    else:
        env = prepare_multi_gpu_env(args)
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("8", "2", 1)
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "10.0.0.1:29555"
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"
    sharding = {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_USE_",
                                                              "ACCELERATE_DEEPSPEED_"))}
    if name == "multi_gpu":
        assert sharding == {}
    elif name == "fsdp2":
        assert sharding["ACCELERATE_USE_FSDP"] == "true" and sharding["FSDP_VERSION"] == "2"
        assert sharding["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
        assert sharding["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    else:
        assert sharding["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert sharding["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == name[-1]
        assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "1"


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3", "fsdp2"])
def test_accelerate_plugins_built_from_the_launch_environment(name, monkeypatch):
    """What each process's Accelerator builds from that environment: the FSDP2 plugin (version
    2, transformer-layer wrapping, full state dict, resharded after forward) or the DeepSpeed
    plugin (ZeRO stage; ZeRO-3 also initialises the model sharded). DeepSpeed itself is not
    needed for the plugin."""
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    args, defaults, mp = _launch_args(name, "--num_processes", "2")
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(list(defaults.deepspeed_config))
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    for k, v in env.items():
        if k.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.setenv(k, v)
    if name == "fsdp2":
        from torch.distributed.fsdp import StateDictType

        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
        assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    else:
        plugin = DeepSpeedPlugin()
        stage = int(name[-1])
        assert plugin.zero_stage == stage
        assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
        assert plugin.zero3_init_flag is (stage == 3)


def test_hargo_splits_the_global_batch_over_the_configs_world_size(committed_params, tmp_path):
    """The world size a config launches (8 processes a node) divides rl.prompts_per_step x G,
    the *global* batch of a step: 16 prompts x G=4 over 8 processes is 8 completions each, over
    2 nodes (16) 4 each; the committed 2 x 4 over 16 is refused, naming the key."""
    from hargo.params import ParamsError
    from hargo.training.rl import build_grpo_config

    p = json.loads(json.dumps(committed_params))
    p["rl"].update(prompts_per_step=16, num_generations=4)
    p["train"]["bf16"] = False
    for world, per_device in ((8, 8), (16, 4)):
        cfg = build_grpo_config(as_config(p), "hargo", tmp_path / str(world), world_size=world)
        assert cfg.per_device_train_batch_size == per_device
        assert cfg.num_generations == 4 and cfg.gradient_accumulation_steps == 1
    with pytest.raises(ParamsError, match=r"^rl\.prompts_per_step: 2 prompts x G=4 completions "
                                          r"do not split over 16 processes"):
        build_grpo_config(as_config(committed_params), "hargo", tmp_path / "x", world_size=16)


# ----------------------------------------------------------------------------- re-launch

def test_relaunch_command_of_a_plain_stage(tmp_path):
    """``$HARGO_ACCELERATE_CONFIG`` turns a plain training stage into the launch form; the
    process count is the visible GPUs unless ``$HARGO_ACCELERATE_ARGS`` gives one; nothing
    happens for other commands, inside a launch, or without the variable; a missing file is
    refused naming the variable."""
    from hargo.training.launch import TRAINING_STAGES, accelerate_relaunch

    cfg = "configs/accelerate/fsdp2.yaml"
    env = {"HARGO_ACCELERATE_CONFIG": str(ROOT / cfg)}
    head = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / cfg)]
    assert TRAINING_STAGES == ("sft", "rl", "compare-train")
    assert accelerate_relaunch(["rl", "--method", "hargo"], env, gpus=4) == \
        head + ["--num_processes", "4", "-m", "hargo.cli", "rl", "--method", "hargo"]
    assert accelerate_relaunch(["compare-train", "--method", "grpo", "--seed", "1"],
                               {**env, "HARGO_ACCELERATE_ARGS": "--num_processes 2 --main_process_port 0"},
                               gpus=8) == \
        head + ["--num_processes", "2", "--main_process_port", "0", "-m", "hargo.cli",
                "compare-train", "--method", "grpo", "--seed", "1"]
    assert accelerate_relaunch(["sft"], env, gpus=0) == head + ["-m", "hargo.cli", "sft"]
    assert accelerate_relaunch(["evaluate"], env, gpus=4) is None
    assert accelerate_relaunch(["rl", "--method", "hargo"], {**env, "WORLD_SIZE": "2"}, 4) is None
    assert accelerate_relaunch(["rl", "--method", "hargo"], {**env, "LOCAL_RANK": "0"}, 4) is None
    assert accelerate_relaunch(["sft"], {"HARGO_ACCELERATE_CONFIG": ""}, gpus=4) is None
    assert accelerate_relaunch(["sft"], {}, gpus=4) is None
    with pytest.raises(FileNotFoundError, match=r"^\$HARGO_ACCELERATE_CONFIG: no accelerate "
                                                r"config at 'configs/accelerate/zero9.yaml'"):
        accelerate_relaunch(["sft"], {"HARGO_ACCELERATE_CONFIG": "configs/accelerate/zero9.yaml"})


def test_cli_relaunches_training_stages_only(tmp_path):
    """With ``$HARGO_ACCELERATE_CONFIG`` naming a missing file, the stages that re-launch stop
    at once naming the variable (sft, rl, compare-train of an online RL method); compare-train
    of a preference or SFT method does not re-launch (it goes on to read params, absent here)."""
    env = {**os.environ, "HARGO_ACCELERATE_CONFIG": "nowhere.yaml"}
    env.pop("WORLD_SIZE", None)
    env.pop("LOCAL_RANK", None)

    def hargo(*args):
        return subprocess.run([sys.executable, "-m", "hargo.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    missing = "$HARGO_ACCELERATE_CONFIG: no accelerate config at 'nowhere.yaml'"
    for args in (["sft"], ["rl", "--method", "hargo"],
                 ["compare-train", "--method", "ppo", "--seed", "1"]):
        r = hargo(*args)
        assert r.returncode == 2 and missing in r.stderr, (args, r.stderr[-1000:])
    for method in ("dpo", "hpcgpt"):
        r = hargo("compare-train", "--method", method, "--seed", "1")
        assert r.returncode == 2 and missing not in r.stderr
        assert "params.yaml" in r.stderr, r.stderr[-1000:]      # it went on, to the params


def test_prefect_gpu_pool_launches_training_stages_through_accelerate():
    """Both forms of the Prefect ``gpu`` pool (prefect.yaml's job variables, the Kubernetes
    base job template) set ``HARGO_ACCELERATE_CONFIG`` to a shipped config, so the flow's
    ``dvc repro`` of a training stage runs ``accelerate launch --config_file ... --num_processes
    <GPUs> -m hargo.cli <stage>``; the cpu pool does not."""
    from hargo.training.launch import accelerate_relaunch

    raw = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pools = raw["definitions"]["work_pools"]
    gpu_env = pools["gpu"]["job_variables"]["env"]
    assert "HARGO_ACCELERATE_CONFIG" not in pools["cpu"]["job_variables"]["env"]
    tpl = json.loads((ROOT / "deploy" / "gpu-kubernetes-job-template.json").read_text())
    props = tpl["variables"]["properties"]
    k8s_env = props["env"]["default"]
    for env in (gpu_env, k8s_env):
        cfg = env["HARGO_ACCELERATE_CONFIG"]
        assert cfg == "configs/accelerate/multi_gpu.yaml" and (ROOT / cfg).is_file()
        cwd = os.getcwd()
        try:
            os.chdir(ROOT)                        # the flow runs in the clone's root
            cmd = accelerate_relaunch(["rl", "--method", "hargo"], env,
                                      gpus=props["gpu_count"]["default"])
        finally:
            os.chdir(cwd)
        assert cmd[1:] == ["-m", "accelerate.commands.launch", "--config_file", cfg,
                           "--num_processes", "1", "-m", "hargo.cli", "rl", "--method", "hargo"]


# ----------------------------------------------------------------------------- SLURM

def _fake_cluster(tmp_path: Path, nodes: list[str]) -> tuple[Path, dict]:
    """A bin folder with fake ``scontrol`` (the job's node names), ``srun`` (logs its options,
    runs its command once per task with ``SLURM_PROCID`` set), ``accelerate`` and ``hargo``
    (log their arguments), and a venv whose ``activate`` puts it first on PATH."""
    log = tmp_path / "calls.log"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin"
    scripts = {
        "scontrol": f'[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" {" ".join(nodes)}',
        "srun": 'opts=(); n=1\n'
                'while [[ $1 == --* ]]; do opts+=("$1"); [[ $1 == --ntasks=* ]] && n=${1#--ntasks=}; shift; done\n'
                'echo "srun ${opts[*]}" >> "$CALLS"\n'
                'for ((i = 0; i < n; i++)); do SLURM_PROCID=$i "$@"; done',
        "accelerate": 'echo "accelerate rank=$SLURM_PROCID $*" >> "$CALLS"',
        # the nodes' cluster addresses: gpu-<n> -> 10.0.0.<n>, three lines as getent prints
        "getent": '[[ $1 == ahostsv4 && $2 == gpu-* ]] || exit 2\n'
                  'for kind in STREAM DGRAM RAW; do echo "10.0.0.${2#gpu-}  $kind $2"; done',
        "hargo": 'echo "hargo $*" >> "$CALLS"',
    }
    for name, body in scripts.items():
        (fake / name).write_text("#!/bin/bash\n" + body + "\n")
        (fake / name).chmod(0o755)
    (fake / "python").symlink_to(sys.executable)
    (fake / "activate").write_text(f'export PATH="{fake}:$PATH"\n')
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "CALLS": str(log), "HARGO_VENV": str(venv), "SLURM_JOB_NODELIST": "gpu-[1-3]",
           "PYTHONPATH": str(ROOT)}
    return log, env


def test_sbatch_recipe_parses():
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "slurm" / "hargo.sbatch")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (ROOT / "scripts" / "slurm" / "hargo.sbatch").read_text()
    assert "#SBATCH --nodes=3" in text and "#SBATCH --ntasks-per-node=1" in text


def test_sbatch_recipe_launches_n_training_nodes_and_one_vllm_server(tmp_path):
    """The recipe run with fake SLURM commands on a 3-node job: the last node runs ``hargo
    vllm-serve`` on params.yaml's rl.vllm_server.port; the other two each run ``accelerate
    launch --config_file <config> --num_machines 2 --num_processes 16 --machine_rank <its
    SLURM_PROCID> --main_process_ip <first node> --rdzv_backend c10d -m hargo.cli rl --method
    hargo`` pointed at the server (its host and port; the vllm-server backend must be in the
    params file, or the recipe refuses before starting anything)."""
    log, env = _fake_cluster(tmp_path, ["gpu-1", "gpu-2", "gpu-3"])
    env["ACCELERATE_CONFIG"] = "configs/accelerate/deepspeed_zero3.yaml"
    sbatch = ["bash", str(ROOT / "scripts" / "slurm" / "hargo.sbatch"), "rl", "--method", "hargo"]
    # params.yaml as committed (transformers backend): a server node is refused, nothing runs
    r = subprocess.run(sbatch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not log.exists()
    assert ("params.yaml: rl.generation_backend is 'transformers'; set it to vllm-server for a "
            "server node, or SERVER_NODES=0") in r.stderr
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["rl"]["generation_backend"] = "vllm-server"
    params["rl"]["vllm_server"]["port"] = port = 8123
    (tmp_path / "server-params.yaml").write_text(yaml.safe_dump(params))
    env["PARAMS"] = str(tmp_path / "server-params.yaml")
    r = subprocess.run(sbatch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    # the server step runs in the background: its lines may come before or among the others
    server = ["srun --nodes=1 --ntasks=1 --nodelist=gpu-3",
              "hargo vllm-serve --host 10.0.0.3 --tensor-parallel-size 1 --data-parallel-size 1 "
              f"--params {env['PARAMS']} -S rl.vllm_server.port={port}"]
    assert [c for c in calls if c in server] == server
    calls = [c for c in calls if c not in server]
    assert calls[0] == "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=gpu-1,gpu-2"
    launches = calls[1:]
    assert len(launches) == 2
    for rank, line in enumerate(launches):
        words = shlex.split(line)
        assert words[:3] == ["accelerate", f"rank={rank}", "launch"]
        opts = dict(zip(words[3:], words[4:]))
        assert opts["--config_file"] == "configs/accelerate/deepspeed_zero3.yaml"
        assert (opts["--num_machines"], opts["--num_processes"]) == ("2", "16")
        assert opts["--machine_rank"] == str(rank)
        assert (opts["--main_process_ip"], opts["--main_process_port"]) == ("gpu-1", "29500")
        assert opts["--rdzv_backend"] == "c10d"
        i = words.index("-m")
        assert words[i:] == ["-m", "hargo.cli", "rl", "--method", "hargo",
                             "--params", env["PARAMS"],
                             "-S", "rl.vllm_server.host=10.0.0.3",
                             "-S", f"rl.vllm_server.port={port}"]


def test_sbatch_recipe_binds_the_server_to_one_cluster_address(tmp_path):
    """The server's command names exactly one address to bind, the server node's cluster
    address (not a wildcard, not loopback), and the trainers reach it at that same address;
    ``VLLM_HOST`` picks another (an InfiniBand address); a node whose name resolves to nothing
    or to loopback is refused before anything starts."""
    import ipaddress

    log, env = _fake_cluster(tmp_path, ["gpu-1", "gpu-2", "gpu-3"])
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["rl"]["generation_backend"] = "vllm-server"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    env["PARAMS"] = str(tmp_path / "p.yaml")
    sbatch = ["bash", str(ROOT / "scripts" / "slurm" / "hargo.sbatch"), "rl", "--method", "hargo"]
    for extra, want in (({}, "10.0.0.3"), ({"VLLM_HOST": "192.168.7.3"}, "192.168.7.3")):
        log.unlink(missing_ok=True)
        r = subprocess.run(sbatch, cwd=ROOT, env={**env, **extra}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        calls = log.read_text().splitlines()
        serve = shlex.split(next(c for c in calls if c.startswith("hargo vllm-serve")))
        hosts = [serve[i + 1] for i, w in enumerate(serve) if w == "--host"]
        assert hosts == [want]
        addr = ipaddress.ip_address(hosts[0])
        assert not (addr.is_unspecified or addr.is_loopback)
        for c in calls:
            if c.startswith("accelerate"):
                assert f"rl.vllm_server.host={want}" in shlex.split(c)
    (Path(env["HARGO_VENV"]) / "bin" / "getent").write_text(
        '#!/bin/bash\necho "127.0.1.1  STREAM $2"\n')
    log.unlink(missing_ok=True)
    r = subprocess.run(sbatch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not log.exists()
    assert "server node gpu-3: no cluster address to bind ('127.0.1.1'); set VLLM_HOST" \
        in r.stderr


def test_sbatch_recipe_without_a_server_node(tmp_path):
    """``SERVER_NODES=0``: every node trains (here sft on 2 nodes of 4 GPUs), no server, no
    backend override."""
    log, env = _fake_cluster(tmp_path, ["gpu-1", "gpu-2"])
    env.update(SERVER_NODES="0", GPUS_PER_NODE="4")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "slurm" / "hargo.sbatch"), "sft"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=gpu-1,gpu-2"
    assert len(calls) == 3 and not any(c.startswith("hargo ") for c in calls)
    for rank, line in enumerate(calls[1:]):
        words = shlex.split(line)
        opts = dict(zip(words[3:], words[4:]))
        assert opts["--config_file"] == "configs/accelerate/multi_gpu.yaml"
        assert (opts["--num_processes"], opts["--machine_rank"]) == ("8", str(rank))
        assert words[words.index("-m"):] == ["-m", "hargo.cli", "sft", "--params", "params.yaml"]


# ----------------------------------------------------------------------------- compare-train

def test_compare_train_under_several_processes(committed_params, tmp_path, monkeypatch):
    """compare-train's online RL runs go through rl.run (every process trains) and only the
    main process writes the run's metrics; preference and SFT methods are refused on several
    processes, before any work."""
    from hargo.compare import train as stage
    from hargo.params import ParamsError
    from hargo.training import launch, rl

    calls = []

    def fake_rl_run(p, method, root, **kw):
        calls.append((method, kw["run_name"]))
        return {"steps": 3, "method": method}

    monkeypatch.setattr(rl, "run", fake_rl_run)
    seed = committed_params["compare"]["seeds"][0]
    for index in (1, 0):
        monkeypatch.setattr(launch, "launch_state", lambda _i=index: launch.LaunchState(2, _i))
        out = stage.run(as_config(committed_params), "hargo", seed, root=tmp_path)
        assert out["prompts_seen"] == 3 * committed_params["compare"]["prompts_per_step"]
        written = stage.metrics_path("hargo", seed, tmp_path)
        assert written.is_file() is (index == 0)             # the main process only
    assert calls == [("hargo", f"hargo-s{seed}")] * 2
    assert json.loads(written.read_text())["run"] == f"hargo-s{seed}"
    for method in ("dpo", "hpcgpt"):
        with pytest.raises(ParamsError, match=rf"^--method {method}: a (preference|sft) method "
                                              "trains on one process"):
            stage.run(as_config(committed_params), method, seed, root=tmp_path)
