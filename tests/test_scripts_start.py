"""Every script under scripts/ and benchmarks/ starts: `--help` exits 0. They are never run by the
suite, so an import that breaks them (scripts/rl_proof.py once imported a name its neighbour no
longer had) went unseen until someone needed the script."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for d in ("scripts", "benchmarks") for p in (ROOT / d).glob("*.py")
                 if "__main__" in p.read_text())

# one process for all: each script's top level and its imports run, then argparse's --help exits
PROBE = """
import runpy, sys
failed = []
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    try:
        runpy.run_path(path, run_name="__main__")
        failed.append(f"{path}: --help did not exit")
    except SystemExit as e:
        if e.code not in (0, None):
            failed.append(f"{path}: exit {e.code}")
    except BaseException as e:
        failed.append(f"{path}: {type(e).__name__}: {e}")
print("FAILED", failed)
"""


def test_every_script_answers_help():
    assert len(SCRIPTS) >= 15
    r = subprocess.run([sys.executable, "-c", PROBE, *map(str, SCRIPTS)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "FAILED []", r.stdout[-3000:]
