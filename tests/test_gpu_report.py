"""benchmarks/gpu_report.py turns whatever a GPU run left into docs/gpu.md's section: a decode path
stopped part-way shows what it reached, a failed step shows its exit status and the end of its log,
and the rest of the page stays. (A lent GPU's minutes are few: a run cut short must still report.)"""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def report():
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "benchmarks/gpu_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_run_cut_short_still_reports_what_it_measured(tmp_path):
    gr = report()
    out = tmp_path / "out"
    out.mkdir()
    (out / "machine.txt").write_text("NVIDIA H200, 580.159.04, 143771 MiB\n")
    decode = {"device_name": "NVIDIA H200", "torch": "2.11", "transformers": "5.24", "bandwidth_gbs": 4228.0,
              "text_weight_gb": 16.38, "limit_batch1_tok_s": 258.1, "tokens": 64,
              "batch1_share_of_limit/static-graphs": 0.5,
              "decode": {"eager": {"1": {"tok_s": 9.8, "first_call_s": 6.6}},
                         "static-graphs": {"1": {"tok_s": 84.1, "first_call_s": 1.4, "decode_tok_s": 129.0,
                                                 "greedy_same_as_eager": 12},
                                           "32": {"tok_s": 1201.7, "first_call_s": 1.2, "decode_tok_s": 2600.0},
                                           "capture_failed": "RuntimeError: no graph"}},
              "errors": {"prefill": "OutOfMemoryError: CUDA out of memory"}}
    (out / "decode.json").write_text(json.dumps(decode))
    (out / "update.rc").write_text("124\n")
    (out / "update.log").write_text("building\nupdating\nKilled\n")
    doc = tmp_path / "gpu.md"
    doc.write_text(f"# kept\n\nprose\n\n{gr.BEGIN}\nold figures\n{gr.END}\n\n## after\n")
    gr.write_section(doc, "".join([gr.machine(out, decode), gr.decode_table(decode), gr.failed(out, "update")]))
    page = doc.read_text()
    assert page.startswith("# kept\n\nprose") and page.endswith("## after\n") and "old figures" not in page
    assert "NVIDIA H200, 580.159.04" in page
    assert "| 1 | 10 (6.6 s) | 129 / 84 (1.4 s) |" in page  # eager measured batch 1 only
    assert "| 32 | — | 2600 / 1202 (1.2 s) |" in page
    assert "static-graphs the first 12 of 64" in page and "50.0 %" in page
    assert "capturing failed" in page and "prefill failed: `OutOfMemoryError" in page
    assert "**update failed** (exit 124)" in page and "Killed" in page


def test_update_and_episode_tables():
    gr = report()
    upd = {"packed": {"forward_passes": 8, "tokens_per_s": 1816.2, "mfu": 0.161, "sequences": 24, "main_tokens": 7986,
                      "params_b": 8.77, "master_dtype": "bf16", "activation_checkpointing": True},
           "padded": {"error": "OutOfMemoryError"}}
    text = gr.update_table(upd)
    assert "| mfu | 0.161 | None |" in text and "| error | None | OutOfMemoryError |" in text
    rows = [{"n": n, "parallel": {"wall_s": 0.3 + 0.05 * n, "sub_batches": [n]}, "sequential": {"wall_s": 0.35 * n}}
            for n in (1, 2)]
    text = gr.episode_table(rows)
    assert "| 2 | 0.40 (1.14×) | 0.70 | 1.75 | [2] |" in text


def test_the_gpu_mode_refuses_a_machine_without_cuda_and_writes_nothing(tmp_path):
    """A CPU run of `benchmarks/gpu.sh` in its default mode once rewrote docs/gpu.md's measured H200
    section with a failed run's table: it now stops in one line before writing anything."""
    import os
    import subprocess
    import sys

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the default mode would measure")
    page = (ROOT / "docs" / "gpu.md").read_bytes()
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OUT": str(out), "PYTHON": sys.executable})
    assert r.returncode == 2 and "no CUDA device" in r.stderr, r.stderr
    assert not out.exists() and (ROOT / "docs" / "gpu.md").read_bytes() == page
