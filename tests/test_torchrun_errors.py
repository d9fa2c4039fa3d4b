"""A training run that fails under torchrun: paravt's one line comes from rank 0 only, and every rank's
one-line cause goes into the error file torchrun reads, so its failure table names it (it said "To enable
traceback see: https://pytorch.org/..." for each rank, after a copy of paravt's line per rank)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paravt.cli import app
from paravt.procs import free_port

ROOT = Path(__file__).resolve().parents[1]
CAUSE = "error: unknown config key(s) stpes"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_rank_0_prints_and_each_rank_tells_torchrun(tmp_path, monkeypatch, rank):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr("paravt.cli.TORCHRUN_GRACE_S", 0.0)
    r = CliRunner().invoke(app, ["train", "grpo", "-o", "stpes=3"])
    assert r.exit_code == 2
    assert (CAUSE in r.output) == (rank == "0"), r.output
    said = json.loads(error_file.read_text())["message"]
    assert said["message"].startswith(CAUSE) and int(said["extraInfo"]["timestamp"]) > 0


@pytest.mark.slow
def test_a_failing_torchrun_prints_the_cause_once_and_torchrun_names_it(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "paravt", "train", "grpo", "-o", "stpes=3", "-o", f"out={tmp_path / 'run'}"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    lines = (r.stdout + r.stderr).splitlines()
    # paravt's own line, from rank 0 (none if a loaded machine let rank 1 fail first: the table still says it)
    assert sum(line.startswith(CAUSE) for line in lines) <= 1, lines
    # torchrun's table: the cause of each rank that failed (one torchrun stopped first may show its SIGTERM)
    table = [line for line in lines if line.strip().startswith("traceback :")]
    assert any(CAUSE in line for line in table), table
    assert all(CAUSE in line or "SIGTERM" in line for line in table), table
