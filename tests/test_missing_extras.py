"""A command whose optional part is not installed says the one command that installs it, for this
installation (an editable checkout here: `<python> -m pip install -e '<checkout>[mcp]'`)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paravt import extras
from paravt.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_fits_the_installation(monkeypatch):
    assert extras.checkout_root() == ROOT  # `make install-test` installs this checkout editable
    assert extras.install_command("mcp") == f"{sys.executable} -m pip install -e '{ROOT}[mcp]'"
    assert extras.install_command("lmms-eval") == f"make -C {ROOT} lmms-eval-env"
    monkeypatch.setattr(extras, "checkout_root", lambda: None)  # installed from a wheel
    assert extras.install_command("mcp") == f"{sys.executable} -m pip install 'paravt[mcp]'"


def test_mcp_without_its_extra_names_the_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "paravt.integrations.mcp.server", None)  # as if mcp were not installed
    r = CliRunner().invoke(app, ["mcp", "--media-root", str(tmp_path)])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert f"install it with: {extras.install_command('mcp')}" in text, text


@pytest.mark.skipif(importlib.util.find_spec("lmms_eval") is not None, reason="lmms-eval is installed here")
def test_the_lmms_eval_model_without_lmms_eval_names_the_command():
    r = subprocess.run([sys.executable, "-c", "import paravt.integrations.lmms_eval"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert f"install it with: make -C {ROOT} lmms-eval-env" in r.stderr.splitlines()[-1]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this Python")
def test_launching_vllm_where_there_is_none_names_the_command(tmp_path):
    """It launched the server, which exited at once: 'a rollout server exited with code 1; see ...log'."""
    from paravt.train.rollout import RolloutConfig, RolloutServers

    cfg = RolloutConfig(engine="servers", launch="vllm", devices=["cpu"], vllm_python=sys.executable)
    with pytest.raises(ValueError, match=r"has no vllm; install it there with: \S+ -m pip install vllm"):
        RolloutServers.start(cfg, "src/paravt/assets/tiny-paravt", tmp_path / "servers")
    assert not (tmp_path / "servers").exists()  # nothing was started
