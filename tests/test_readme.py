"""The README's Python example runs as written, offline (it once loaded a hub model that is not
local and failed for every new user)."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs_as_written(tmp_path):
    block = re.search(r"From Python.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    env = {k: v for k, v in os.environ.items() if k != "PARAVT_MODEL"} | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    answer_line = r.stdout.strip().splitlines()[-1]
    assert answer_line and (tmp_path / "outputs" / "example.mp4").stat().st_size > 1000


def test_version_flag():
    r = subprocess.run([sys.executable, "-m", "paravt", "--version"], capture_output=True, text=True, timeout=60)
    import paravt

    assert r.returncode == 0 and r.stdout.strip() == f"paravt {paravt.__version__}"
