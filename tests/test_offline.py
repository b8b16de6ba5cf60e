"""With local models no stage opens a network connection (issue 30, item 4): ``register`` asked
the Hugging Face hub about ``models/sft`` twelve times. The tests turn the hub *on* (as
scripts/main.sh did, HF_HUB_OFFLINE=0), block every outbound socket, and record each attempt."""
from __future__ import annotations

import json
import os
import socket

import pytest

from hargo.models.base import needs_hub
from hargo.offline import hub_offline


@pytest.fixture
def hub_online_no_network(monkeypatch):
    """The hub in online mode, and every non-loopback DNS lookup or connection recorded and
    refused (so a hub request fails at once, and the test sees it was attempted)."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    attempts: list[str] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def local(host) -> bool:
        return host in (None, "localhost", "127.0.0.1", "::1", "") or str(host).startswith("/")

    def getaddrinfo(host, *a, **k):
        if not local(host):
            attempts.append(f"dns {host}")
            raise socket.gaierror(f"blocked by the test: {host}")
        return real_getaddrinfo(host, *a, **k)

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if not local(host):
            attempts.append(f"connect {address}")
            raise OSError(f"blocked by the test: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


def test_the_block_is_offline_and_restores_the_state(hub_online_no_network):
    import huggingface_hub
    import huggingface_hub.constants as hub_constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    with hub_offline():
        assert hub_constants.is_offline_mode() and os.environ["HF_HUB_OFFLINE"] == "1"
        with pytest.raises(OfflineModeIsEnabled):
            huggingface_hub.list_repo_files("HuggingFaceTB/SmolLM2-135M-Instruct")
        with hub_offline():      # re-entrant
            pass
        assert hub_constants.is_offline_mode()
    assert hub_online_no_network == []          # refused before any connection
    assert not hub_constants.is_offline_mode() and os.environ["HF_HUB_OFFLINE"] == "0"
    # outside the block the fixture's guard sees an attempt (so the tests here can fail)
    with pytest.raises(OSError):
        socket.getaddrinfo("huggingface.co", 443)
    assert hub_online_no_network == ["dns huggingface.co"]


@pytest.mark.parametrize("source, hub", [("smollm2", False), ("Qwen/Qwen2.5-0.5B-Instruct", True),
                                         ("./models/mine", False), ("/abs/folder", False)])
def test_only_a_hub_id_needs_the_hub(source, hub, committed_params):
    from hargo.config import as_section

    model = as_section({"model": {**committed_params["model"], "source": source}}, "model")
    assert needs_hub(model) is hub


def test_register_opens_no_connection(hub_online_no_network, tmp_path, committed_params,
                                      mlflow_uri, tiny_model_dir, monkeypatch):
    """The full register stage with LoRA adapters, as the main job registers them (the SFT base
    logged as full weights through MLflow's transformers flavour, the step that asked the hub),
    with the hub online and no network: no attempt. Run from the project folder with root ".",
    as dvc runs it: MLflow then sees the relative ``models/sft``, which reads as a hub id (an
    absolute path fails huggingface_hub's id check before any request)."""
    import shutil

    from hargo.registry import run
    from tests.test_registry import model_rows, reg_params, write_eval
    from tests.test_registry_adapter import make_lora_rl

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "sft")
    for seed, m in enumerate(("grpo", "hargo"), start=1):
        make_lora_rl(tmp_path / "models" / "sft", tmp_path / "models" / "rl" / m, seed)
    write_eval(tmp_path, {"grpo": model_rows(plp=0.45)})
    monkeypatch.chdir(tmp_path)
    doc = run(reg_params(committed_params), root=".")
    assert doc["versions"][0]["stored"] == "adapter" and doc["base"]["version"] == "1"
    assert hub_online_no_network == [], hub_online_no_network
    assert json.loads((tmp_path / "metrics" / "register.json").read_text())["run_id"]


def test_every_stage_command_runs_offline(monkeypatch):
    """hargo.cli runs each stage inside hub_offline, except base-model with a hub id."""
    import huggingface_hub.constants as hub_constants

    from hargo import cli

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    seen = []
    cli._run(lambda: seen.append(hub_constants.is_offline_mode()))
    cli._run(lambda: seen.append(hub_constants.is_offline_mode()), online=True)
    assert seen == [True, False]
