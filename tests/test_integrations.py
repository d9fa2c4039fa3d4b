"""The lmms-eval entry point, without lmms-eval: declared in the package metadata, and light (lmms-eval
imports every `lmms_eval.models` entry point when it starts). The model itself is tested in
tests/test_lmms_eval.py (opt-in, in .venv-lmms)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points


def test_the_lmms_eval_entry_point_is_declared():
    found = [e for e in entry_points(group="lmms_eval.models") if e.name == "paravt"]
    assert [e.value for e in found] == ["paravt.integrations:lmms_eval_models"]


def test_the_entry_point_module_imports_nothing_heavy():
    code = ("import sys, paravt.integrations as m; assert callable(m.lmms_eval_models); "
            "print(sorted(k for k in ('torch', 'transformers', 'lmms_eval', 'av', 'numpy') if k in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
