"""The one command that installs a part of paravt this installation lacks, written for this installation:
from a checkout installed editable (`make install`), `pip install -e '<checkout>[extra]'` with this
Python's pip; otherwise `pip install 'paravt[extra]'`. The versions each extra was tested with are in
pyproject.toml and the README's feature table."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse


def checkout_root() -> Path | None:
    """The source folder of an editable install of paravt (it has pyproject.toml), else None."""
    try:
        info = json.loads(metadata.distribution("paravt").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, json.JSONDecodeError):
        return None
    if not (info.get("dir_info") or {}).get("editable") or not str(info.get("url", "")).startswith("file://"):
        return None
    root = Path(unquote(urlparse(info["url"]).path))
    return root if (root / "pyproject.toml").is_file() else None


def install_command(extra: str) -> str:
    """The command that installs paravt's `extra` (mcp, lmms-eval) for this installation. lmms-eval goes in
    an environment of its own (its PyAV cap; docs/lmms_eval.md): from a checkout, `make lmms-eval-env`."""
    root = checkout_root()
    if extra == "lmms-eval":
        if root is not None:
            return f"make -C {shlex.quote(str(root))} lmms-eval-env"
        return "pip install 'paravt[lmms-eval]' in a virtualenv of its own"
    py = shlex.quote(sys.executable)
    if root is not None:
        return f"{py} -m pip install -e {shlex.quote(f'{root}[{extra}]')}"
    return f"{py} -m pip install 'paravt[{extra}]'"


def missing_extra(what: str, extra: str, error: BaseException | None = None) -> str:
    """The one-line error of a command that needs an extra: what is missing and the command to run."""
    cause = f" ({error})" if error is not None else ""
    return f"{what} needs paravt[{extra}]{cause}; install it with: {install_command(extra)}"


def require_vllm(python: str) -> None:
    """Raise ValueError, naming the command to run, when `python` cannot import vllm (a launched vLLM
    would otherwise exit at once and the run stop on 'a rollout server exited with code 1')."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        ok = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"rollout.launch vllm: cannot run rollout.vllm_python {python!r} ({e})") from None
    if not ok:
        raise ValueError(f"rollout.launch vllm: {python} has no vllm; install it there with: "
                         f"{shlex.quote(python)} -m pip install vllm (tested: vLLM 0.32.0, its CPU build), or set "
                         "rollout.vllm_python to the python of an environment that has it")
