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


def shape_row(rate, limit, prompt=7986, b=1):
    return {"batch": b, "prompt_tokens": prompt, "tokens": 64, "decode_tok_s": rate, "step_ms": 1000 * b / rate,
            "prefill_s": 0.5, "prefill_tok_s": prompt * b / 0.5, "weights_gb": 15.1, "kv_valid_gb_step": 1.2 * b,
            "limit_tok_s": limit, "share_of_limit": rate / limit, "kv_read_gb_step": 1.25 * b}


def test_episode_shapes_breakdown_episodes_and_targets_of_a_run_cut_short(tmp_path):
    """The second round's sections: the shapes table (a path stopped part-way shows what it reached),
    the profiles' breakdown, episodes per minute, and the targets table last, measured and met or
    not, `not measured` where the run did not get there."""
    gr = report()
    out = tmp_path / "out"
    out.mkdir()
    bd = {"device": True, "busy_s": 0.9, "wall_s": 1.0, "categories": {"GEMM": 0.6, "attention": 0.2,
                                                                      "idle / host gaps": 0.1}, "phases": {}}
    dec = {"bandwidth_gbs": 4228.0, "step_weight_gb": 15.14, "kv_mb_per_token": 0.147, "tokens": 64,
           "shapes": {"static-graphs": {"main": {"1": shape_row(180.0, 270.0), "32": shape_row(2000.0, 2550.0, b=32)},
                                        "sub": {"5": shape_row(700.0, 1300.0, 1700, 5)}},
                      "static-graphs-bucket": {"main": {"1": shape_row(150.0, 270.0)}}},
           "profile": {"main b1": {"wall_s": 1.0, "breakdown": bd}}, "decode": {}}
    upd = {"packing": True, "mfu": 0.42, "tokens_per_s": 5000.0, "sequences": 20, "main_tokens": 7986,
           "params_b": 8.77, "master_dtype": "bf16", "activation_checkpointing": True, "kl_mode": "loss",
           "flops_per_token_n": 10, "profile": {**bd, "phases": {"reference forward": 0.15, "recompute": 0.2}}}
    eps = {"frames": 64, "crops": 5, "sub_tokens": 128, "decode": "static-graphs", "frames_from": "rendered (no PyAV)",
           "modes": {"parallel": {"episodes": 8, "wall_s": 12.0, "episodes_per_min": 40.0, "prefill_s": 5.0,
                                  "decode_s": 6.0, "decode_tokens": 6000, "prefills": [8, 40, 8]},
                     "sequential": {"episodes": 8, "wall_s": 30.0, "episodes_per_min": 16.0, "prefills": [8] * 11}},
           "sequential_over_parallel": 2.5}
    epi = [{"n": n, "parallel": {"wall_s": 1.0 + 0.02 * n, "sub_batches": [n]}, "sequential": {"wall_s": n}}
           for n in range(1, 6)]
    shapes = gr.shapes_table(dec)
    assert "| main, 1 (7986) | 270 (15.1 + 1.2) | **180** (67 %), 5.6 ms, KV read 1.25 GB | **150** (56 %)" in shapes
    assert "| main, 32 (7986) | 2550 (15.1 + 38.4) | **2000** (78 %), 16.0 ms, KV read 40 GB | — |" in shapes
    assert "| sub, 5 (1700) |" in shapes and "4228 GB/s" in shapes
    text = gr.breakdown_section(dec, upd)
    assert "| share of the wall time | decode main b1 | update (packed) |" in text
    assert "| GEMM | 60.0 % | 60.0 % |" in text and "| phase: reference forward | — | 15.0 % |" in text
    assert "device (kernel) time" in text
    assert "| parallel | 8 | 12.00 | **40.0** |" in gr.episodes_table(eps) and "2.50×" in gr.episodes_table(eps)
    assert "KL loss (FLOPs counted 10N a token)" in gr.update_table(upd)
    targets = gr.targets_table(dec, upd, epi)
    assert "| decode batch 1, main shape: ≥ 150 tok/s decode-only, ≥ 60 % of the roofline | 180 tok/s (67 % of 270) " \
           "| yes |" in targets
    assert "| decode batch 32, main shape: ≥ 2,500 tok/s decode-only | 2000 tok/s (78 % of 2550) | no |" in targets
    assert "| decode batch 32, short prompts: ≥ 2,500 tok/s decode-only | not measured | — |" in targets
    assert "| PARA-GRPO update (packed): ≥ 40 % MFU | 42.0 % (10N FLOPs a token) | yes |" in targets
    assert "| parallel episode, 5 crops / 1 crop: ≤ 1.1× | 1.08× | yes |" in targets
    nothing = gr.targets_table(None, None, None)
    assert nothing.count("not measured") == 5 and "| yes |" not in nothing and "| no |" not in nothing


def test_the_switch_table_has_a_row_per_switch_and_the_target_reads_the_fastest_exact_one():
    """bench_switches' rows: measured, not run (with why), failed; equal or not; the MFU target is
    read from the fastest row equal to its baseline."""
    gr = report()
    row = {"tokens_per_s": 2000.0, "peak_gb": 90.0, "loss_ratio": 1.0, "grad_norm_ratio": 1.001, "dlogp_mean": 0.004,
           "dlogp_max": 0.05, "equal_to": "baseline"}
    upd = {"sequences": 2, "tokens": 15972, "computed_tokens": 11500, "trained_tokens": 3072, "forward_passes": 1,
           "token_budget": 16384, "tolerance": {"mean_dlogp": 0.02, "max_dlogp": 0.25, "grad_rel": 0.02},
           "switches": [{"switch": "baseline", "config": {}, **row, "mfu": 0.2, "equal": True},
                        {"switch": "varlen", "config": {"packed_attention": "varlen"}, **row, "mfu": 0.25, "equal": True},
                        {"switch": "liger", "config": {"liger": ["all"]}, **row, "mfu": 0.45, "equal": False,
                         "dlogp_max": 3.1},
                        {"switch": "ckpt_attention", "config": {"checkpoint_part": "attention"},
                         "error": "OutOfMemoryError: CUDA out of memory"},
                        {"switch": "vision_cache", "config": {"freeze_vision": True, "vision_cache": True},
                         "not_run": "transformers 5.17's Qwen3-VL takes no mm_encoder_outputs"}]}
    text = gr.update_table(upd)
    head = text.splitlines()[0].split(" | ")
    assert "| switch |" in text.splitlines()[0] and any("MFU" in c for c in head) and any("equal" in c for c in head)
    assert "| varlen | packed_attention: varlen | 2000 | 25.0 % | 90 | yes | 0.004 / 0.05 | 1.0000, 1.0010 |" in text
    assert "| liger | liger: [all] | 2000 | 45.0 % | 90 | **no** |" in text
    assert "| ckpt_attention | checkpoint_part: attention | failed: `OutOfMemoryError" in text
    assert "| vision_cache | freeze_vision: true, vision_cache: true | not run: transformers 5.17" in text
    targets = gr.targets_table(None, upd, None)
    assert "| PARA-GRPO update (packed): ≥ 40 % MFU | 25.0 % (varlen, equal to baseline) | no |" in targets
