"""Every trainer config hargo builds is valid on every hardware profile (CPU without native bf16,
CPU with AVX512-BF16/AMX, CUDA), simulated by patching the detection, not the machine; one real
bf16-autocast training step on the CPU whatever the machine; the thread rule and its inputs."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from hargo import hardware
from hargo.config import as_config, as_section
from hargo.hardware import PROFILES, HardwareProfile

pytestmark = pytest.mark.timeout(900)


# ---------------------------------------------------------------- pure pieces

def test_trainer_precision_kwargs_per_profile(committed_params):
    p = copy.deepcopy(committed_params)
    p["train"]["bf16"] = True
    got = {n: hardware.trainer_precision_kwargs(as_config(p), prof) for n, prof in PROFILES.items()}
    assert got == {
        "cpu": {"use_cpu": True, "bf16": False, "fp16": False, "dataloader_pin_memory": False},
        "cpu-bf16": {"use_cpu": True, "bf16": True, "fp16": False,
                     "dataloader_pin_memory": False},
        "cuda": {"use_cpu": False, "bf16": True, "fp16": False, "dataloader_pin_memory": True},
    }
    p["train"]["bf16"] = False
    assert [hardware.trainer_precision_kwargs(as_config(p), prof)["bf16"]
            for prof in PROFILES.values()] \
        == [False, False, False]
    # a pre-Ampere GPU: CUDA without bf16
    old_gpu = HardwareProfile("cuda", "cuda", False)
    assert hardware.trainer_precision_kwargs(
        as_config({**p, "train": {**p["train"], "bf16": True}}), old_gpu) == \
        {"use_cpu": False, "bf16": False, "fp16": False, "dataloader_pin_memory": True}
    # the typed train section alone, as the typed config's node
    train = as_section({"train": {"bf16": True, "max_prompt_tokens": 64}}, "train")
    assert hardware.trainer_precision_kwargs(train, PROFILES["cuda"])["bf16"] is True
    assert hardware.trainer_precision_kwargs(train, old_gpu)["bf16"] is False


def test_generation_dtype_per_profile():
    assert [hardware.generation_dtype("auto", prof) for prof in PROFILES.values()] == \
        ["float32", "bfloat16", "bfloat16"]
    assert hardware.generation_dtype(None, PROFILES["cpu"]) == "float32"
    assert hardware.generation_dtype("float32", PROFILES["cuda"]) == "float32"
    with pytest.raises(ValueError, match=r"evaluate\.dtype: must be one of auto, float32, "
                                         r"bfloat16, float16, got 'fp8'"):
        hardware.generation_dtype("fp8", PROFILES["cpu"])


def test_detect_profile_reads_the_cpu_flags(monkeypatch, tmp_path):
    import torch

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert hardware.cpu_flags(info) == {"fpu", "sse", "avx2", "avx512f", "avx512_bf16"}
    assert hardware.cpu_flags(tmp_path / "missing") == frozenset()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    for flags, name in ((frozenset({"avx2"}), "cpu"), (frozenset({"avx2", "avx512_bf16"}),
                                                        "cpu-bf16"),
                        (frozenset({"amx_bf16"}), "cpu-bf16")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda *a, f=flags: f)
        assert hardware.detect_profile().name == name
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert hardware.detect_profile().name == "cpu"   # flags without oneDNN support: emulated
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert hardware.detect_profile() == PROFILES["cuda"]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert hardware.detect_profile() == HardwareProfile("cuda", "cuda", False)


def test_auto_threads_rule():
    # allowed cores minus the cores busy more than a quarter of the time, at least one
    assert [hardware.auto_threads(2, b) for b in (0.0, 0.24, 0.26, 0.9, 1.0, 1.26, 2.0)] == \
        [2, 2, 1, 1, 1, 1, 1]
    assert [hardware.auto_threads(8, b) for b in (0.0, 1.0, 3.3, 7.9)] == [8, 7, 4, 1]
    assert hardware.auto_threads(1, 0.0) == 1


def _stat(*cpus: tuple[int, int]) -> str:
    """A /proc/stat text whose cpuN lines have ``busy`` user jiffies and ``idle`` idle jiffies."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (busy, idle) in enumerate(cpus):
        lines.append(f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0")
    return "\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n"


def test_busy_cores_from_two_reads_of_proc_stat(monkeypatch, tmp_path):
    import os

    stat = tmp_path / "stat"
    stat.write_text(_stat((100, 900), (500, 500)))
    # between the two reads: cpu0 busy 10 of 100 jiffies, cpu1 busy 100 of 100
    monkeypatch.setattr(hardware.time, "sleep",
                        lambda s: stat.write_text(_stat((110, 990), (600, 500))))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert hardware.busy_cores(0.0, stat) == pytest.approx(1.1)
    stat.write_text(_stat((100, 900), (500, 500)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})   # only cpu0 is ours
    assert hardware.busy_cores(0.0, stat) == pytest.approx(0.1)
    assert hardware.busy_cores(0.0, tmp_path / "missing") == 0.0


def test_resolve_threads(monkeypatch):
    import torch

    monkeypatch.setattr(hardware, "allowed_cores", lambda: 2)
    monkeypatch.setattr(hardware, "busy_cores", lambda window_s=0.3: 1.0)
    assert hardware.resolve_threads("auto") == 1
    monkeypatch.setattr(hardware, "busy_cores", lambda window_s=0.3: 0.0)
    assert hardware.resolve_threads("auto") == 2
    assert hardware.resolve_threads(3) == 3
    assert hardware.resolve_threads(0) == torch.get_num_threads()
    for bad in (-1, "two", 1.5, True):
        with pytest.raises(ValueError, match="train.threads: expected 'auto' or an integer"):
            hardware.resolve_threads(bad)


def test_train_threads_param_accepts_auto_and_integers(committed_params):
    from hargo.params import ParamsError, validate_params

    assert committed_params["train"]["threads"] == "auto"
    for ok in ("auto", 0, 1, 2):
        p = copy.deepcopy(committed_params)
        p["train"]["threads"] = ok
        validate_params(p)
    for bad in ("many", -1, 1.5):
        p = copy.deepcopy(committed_params)
        p["train"]["threads"] = bad
        with pytest.raises(ParamsError, match="train.threads"):
            validate_params(p)


# ---------------------------------------------------------------- the profile matrix

def _trainer_methods() -> list[str]:
    """Every method that builds a trainer config: the main pipeline's SFT and every comparison
    method (RL, preference, HPC-GPT) -- a method added to the registry (hargo.methods) is tested here."""
    from hargo.methods import method_names

    return ["sft", *method_names()]


@pytest.fixture()
def profile(request, monkeypatch):
    """Simulate a hardware profile: hargo's detection says so; for ``cuda`` transformers' own
    checks are told a bf16 GPU exists (only the config is built then, nothing touches a GPU)."""
    prof = PROFILES[request.param]
    monkeypatch.setattr(hardware, "detect_profile", lambda: prof)
    if prof.device == "cuda":
        import transformers.training_args as ta

        monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)
    return prof


def _matrix_params(committed: dict, tiny_model_dir: Path) -> dict:
    p = copy.deepcopy(committed)
    p["train"].update(bf16=True, threads=1, gradient_checkpointing=False)
    p["sft"]["max_length"] = 64
    p["compare"].update(steps=1, prompts_per_step=2)
    p["rl"].update(prompts_per_step=2, num_generations=2, max_new_tokens=4,
                   generation_backend="transformers")
    return p


def _build_config(params: dict, method: str, out: Path):
    from hargo.compare.train import family, run_config

    if method == "sft":
        from hargo.training.sft import sft_config

        return sft_config(as_config(params), out, report_to=())
    p = run_config(as_config(params), method, 1)
    fam = family(method)
    if fam == "rl":
        from hargo.training.rl import build_grpo_config

        return build_grpo_config(p, method, out)
    if fam == "preference":
        from hargo.training.preference_trainers import build_config

        return build_config(p, method, out, seed=1)
    from hargo.training.sft import sft_config   # hpcgpt: SFT's config with the HPC-GPT recipe

    return sft_config(as_config(p), out, report_to=())


@pytest.mark.parametrize("profile", list(PROFILES), indirect=True)
@pytest.mark.parametrize("method", _trainer_methods())
def test_every_trainer_config_is_valid_on_every_profile(profile, method, committed_params,
                                                        tiny_model_dir, tmp_path):
    params = _matrix_params(committed_params, tiny_model_dir)
    args = _build_config(params, method, tmp_path / "out")
    assert (args.use_cpu, args.bf16, args.fp16) == (profile.on_cpu, profile.native_bf16, False)
    assert args.dataloader_pin_memory is (not profile.on_cpu)


def _construct_trainer(params: dict, method: str, model_dir: Path, out: Path):
    """Construct (not train) the trainer of ``method`` on the tiny model and crafted data."""
    from hargo.compare.train import family, run_config
    from hargo.models import loading
    from hargo.testing import crafted_records

    records = crafted_records(1)
    if method in ("sft", "hpcgpt"):
        from hargo.training import sft

        p = params if method == "sft" else run_config(as_config(params), method, 1)
        model = loading.load_model(model_dir)
        return sft.build_trainer(as_config(p), model, loading.load_tokenizer(model_dir), records,
                                 sft.sft_config(as_config(p), out, report_to=()))
    p = run_config(as_config(params), method, 1)
    if family(method) == "rl":
        from hargo.training.rl import build_trainer

        return build_trainer(p, method, model_dir, records, out)
    from hargo.training import preference_trainers as preference

    pairs = [{"prompt": r["prompt"], "chosen": [{"role": "assistant", "content": "yes"}],
              "rejected": [{"role": "assistant", "content": "no idea"}]} for r in records[:2]]
    rows = (preference.kto_rows(pairs, [0, 1], 2) if method == "kto"
            else preference.dpo_rows(pairs, [0, 1]))
    args = preference.build_config(as_config(p), method, out, seed=1)
    return preference.build_trainer(as_config(p), method, loading.load_model(model_dir),
                                    loading.load_tokenizer(model_dir), rows, args)


@pytest.mark.parametrize("profile", ["cpu", "cpu-bf16"], indirect=True)
@pytest.mark.parametrize("method", _trainer_methods())
def test_every_trainer_constructs_on_both_cpu_profiles(profile, method, committed_params,
                                                       tiny_model_dir, tmp_path):
    params = _matrix_params(committed_params, tiny_model_dir)
    trainer = _construct_trainer(params, method, tiny_model_dir, tmp_path / "out")
    assert trainer.args.bf16 is profile.native_bf16 and trainer.args.use_cpu is True
    assert trainer.accelerator.device.type == "cpu"
    assert trainer.accelerator.mixed_precision == ("bf16" if profile.native_bf16 else "no")


@pytest.mark.parametrize("profile", ["cpu-bf16"], indirect=True)
def test_one_real_bf16_autocast_sft_step_on_the_cpu(profile, committed_params, tiny_model_dir,
                                                   tmp_path):
    """One real optimizer step under bf16 autocast on the CPU, on any CPU (emulated on AVX2):
    the forward really runs in bf16, the loss is finite and near the random-init loss, the fp32
    LoRA weights move."""
    import torch

    from hargo.models import loading
    from hargo.testing import crafted_records
    from hargo.training import sft

    params = _matrix_params(committed_params, tiny_model_dir)
    params["sft"].update(max_steps=1, batch_size=4, learning_rate=5e-3)
    model = loading.load_model(tiny_model_dir)
    trainer = sft.build_trainer(as_config(params), model, loading.load_tokenizer(tiny_model_dir),
                                crafted_records(1), sft.sft_config(as_config(params), tmp_path, report_to=()))
    seen: list[torch.dtype] = []
    layer = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    out = trainer.train()
    hook.remove()
    assert trainer.state.global_step == 1
    assert torch.bfloat16 in seen, seen   # autocast ran the linear layers in bf16
    # a random init starts near ln(vocab) = ln 49152 = 10.80 nats
    assert math.isfinite(out.training_loss) and abs(out.training_loss - 10.80) < 0.3
    moved = [n for n, p in trainer.model.named_parameters()
             if p.requires_grad and not torch.equal(p.detach(), lora[n])]
    assert moved and all(p.dtype == torch.float32 for p in trainer.model.parameters())
