"""scripts/paradox_testbed.py's crops table: whether a cold start reads its crops is read from its K = 4
event-colour questions, so a model that answers every question with the background's colour must not pass."""

from __future__ import annotations

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("paradox_testbed_script", ROOT / "scripts" / "paradox_testbed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_cell(out: Path, name: str, cell: str, rows: list[tuple[bool, float, int]]) -> None:
    """(needs_event, score, n_calls) per question; a rerun's row for the first question is appended."""
    d = out / "measure" / name / cell
    d.mkdir(parents=True)
    lines = [{"id": f"q{i}", "extras": {"needs_event": e}, "score": s, "n_calls": c, "n_problems": 0, "episode": {"turns": []}}
             for i, (e, s, c) in enumerate(rows)]
    lines.insert(0, {**lines[0], "score": 1.0 - lines[0]["score"]})  # superseded by the later row
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_crops_table_splits_event_from_background_questions(tmp_path):
    mod = load()
    a = Namespace(out=tmp_path, k64_samples=2)
    # reads its crops: both event questions right, one background question of two
    write_cell(tmp_path, "reader", "greedy_k4", [(True, 1.0, 5), (True, 1.0, 5), (False, 1.0, 5), (False, 0.0, 3)])
    # answers the background: event questions wrong, background right
    write_cell(tmp_path, "background", "greedy_k4", [(True, 0.0, 5), (True, 0.0, 5), (False, 1.0, 5), (False, 1.0, 5)])
    # at K = 64 with the prefix: one skip of four, the skip wrong, two of three calls right
    write_cell(tmp_path, "reader", "t07_k64", [(True, 1.0, 2), (True, 1.0, 3), (False, 0.0, 1), (False, 0.0, 0)])
    # a second seed pooled with the first: one more call, right
    write_cell(tmp_path, "reader", "t07_k64_s1", [(True, 1.0, 1)])
    lines = mod.crops_table(a, ["reader", "background", "absent"]).splitlines()
    assert len(lines) == 4  # the header, its rule, one row a measured model
    assert lines[2] == "| reader | 75.0 | 100.0 / 50.0 | 4.50 | 0.00 | 0.20 / – (5 / 0) | 0.75 / 0.00 | – / – |"
    assert lines[3].startswith("| background | 50.0 | 0.0 / 100.0 | 5.00 |")
