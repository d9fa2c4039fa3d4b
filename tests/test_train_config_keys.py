"""`paravt train grpo|sft --show-config`: every key the config loader accepts, with its default and one line,
read from the dataclasses (a typo's error lists the names only, and --help listed none)."""

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from paravt.cli import app
from paravt.train.config_keys import config_keys
from paravt.train.grpo import GRPOConfig
from paravt.train.sft import SFTConfig

runner = CliRunner()
CONFIGS = {"grpo": GRPOConfig, "sft": SFTConfig}


def settable(cls, prefix=""):
    """The dotted keys `from_dict` accepts, walked independently of config_keys."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or "Callable" in str(hints[f.name]):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out += settable(hints[f.name], prefix + f.name + ".")
        else:
            out.append(prefix + f.name)
    return out


@pytest.mark.parametrize("kind", CONFIGS)
def test_every_key_has_a_default_and_a_line(kind):
    """A field added without a comment fails here, so the listing cannot fall behind the dataclasses."""
    keys = config_keys(CONFIGS[kind])
    assert [k.key for k in keys] == settable(CONFIGS[kind])
    assert [k.key for k in keys if not k.help.strip()] == []
    assert all("\n" not in k.help for k in keys)


@pytest.mark.parametrize("kind", CONFIGS)
def test_show_config_lists_every_key_with_its_default(kind):
    r = runner.invoke(app, ["train", kind, "--show-config"])
    assert r.exit_code == 0, r.output
    lines = {line.split()[0]: line for line in r.output.splitlines()[1:]}
    keys = config_keys(CONFIGS[kind])
    assert list(lines) == [k.key for k in keys]
    assert lines["steps"].split()[1] == str(CONFIGS[kind]().steps)
    if kind == "grpo":
        assert lines["episode.max_turns"].split()[1] == "3" and "answer now" in lines["episode.max_turns"]
        assert lines["reward.lambda_anchor"].split()[1] == "0.5"
        assert lines["k_choices"].split(None, 1)[1].startswith("[4, 8, 16, 32, 64]")


def test_show_config_with_a_config_shows_its_values_and_trains_nothing(tmp_path):
    r = runner.invoke(app, ["train", "grpo", "--config", "src/paravt/configs/grpo_tiny.yaml", "-o", "seed=2",
                            "-o", f"out={tmp_path / 'run'}", "--show-config"])
    assert r.exit_code == 0, r.output
    lines = {line.split()[0]: line for line in r.output.splitlines()[1:]}
    assert lines["seed"].split()[1] == "2" and "[default: 0]" in lines["seed"]
    assert lines["lr"].split()[1] == "1e-05" and "[default: 2e-06]" in lines["lr"]
    assert "[default" not in lines["rollouts_per_prompt"]
    assert not (tmp_path / "run").exists()


def test_help_and_a_typo_point_at_show_config():
    r = runner.invoke(app, ["train", "grpo", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "--show-config" in r.output
    r = runner.invoke(app, ["train", "grpo", "-o", "stpes=3"])
    assert r.exit_code == 2
    assert "unknown config key(s) stpes" in r.output and "paravt train grpo --show-config" in r.output
