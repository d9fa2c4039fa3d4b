"""scripts/paradox.py reads the campaign's logs into Table 2's claims: a wrong read would print
"reproduced" on runs that show the opposite, so its arithmetic is checked on logs whose answer is known. The
generated sections of docs/paradox_log.md are checked against the run records kept in docs/paradox_runs."""

from __future__ import annotations

import importlib
import importlib.util
import gzip
import io
import json
import sys
import tarfile
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paradox():
    """The modules of scripts/paradox.py: its run families and commands (campaign), the records read back (read),
    the tables and claims (tables), the log page and figures (page)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return SimpleNamespace(**{name: importlib.import_module(f"paradox_{name}")
                                  for name in ("campaign", "read", "tables", "page")})
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def args(tmp_path: Path, **kw) -> Namespace:
    base = dict(out=tmp_path, steps=10, runs=[], ks=[4, 16, 64], k_choices=[4, 8, 16, 32, 64], limit=2,
                paravt=["paravt"], test=tmp_path / "test", base=tmp_path / "base", cold=tmp_path / "cold",
                max_new_tokens=320, set=[], config=tmp_path / "grpo.yaml", docs=tmp_path / "docs", smooth=3,
                skip_label="skip cold start")
    return Namespace(**{**base, **kw})


def write_run(a: Namespace, rid: str, kappa: tuple[float, float], f_tau: tuple[float, float], steps: int = 10,
              checkpoint: bool = True) -> Path:
    """A run whose κ and fτ go linearly from first to last; every rollout at K = 64 calls round(κ) times."""
    d = a.out / "rl" / rid
    d.mkdir(parents=True)
    logs, rolls = [], []
    for s in range(1, steps + 1):
        t = (s - 1) / max(steps - 1, 1)
        k, f = kappa[0] + t * (kappa[1] - kappa[0]), f_tau[0] + t * (f_tau[1] - f_tau[0])
        logs.append({"step": s, "kappa": k, "f_tau": f, "step_time_s": 20.0})
        rolls += [{"step": s, "group": 0, "k": 64, "n_parsed_calls": round(k), "advantage": 0.0, "accuracy": 0.5,
                   "format": f, "reward": 0.5 + f, "problem_turns": 0}]
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logs))
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rolls))
    if checkpoint:
        (d / "checkpoint").mkdir()
        (d / "checkpoint" / "config.json").write_text("{}")
    return d


def test_only_finished_runs_are_evaluated(paradox, tmp_path):
    a = args(tmp_path)
    write_run(a, "para_s1", (4, 4), (0.8, 0.9))
    write_run(a, "vanilla_s1", (4, 4), (0.2, 0.3), steps=6)  # training: its checkpoint is step 6's
    assert set(paradox.campaign.models(a)) == {"base", "cold", "para_s1"}
    rows = {r[0]: r for r in paradox.campaign.status(a)}
    assert rows["para_s1"][1:4] == ["10/10", "20 s", "done"]
    assert rows["vanilla_s1"][1] == "6/10" and rows["vanilla_s1"][3] == f"{4 * 20 / 3600:.1f} h"
    assert rows["no_tool_s1"][1] == "–"
    assert rows["eval cells"][1] == f"0/{3 * 3 + 3 * 3}"  # 3 models × 3 K, block C 3 modes × 3 K
    a.docs.mkdir()
    doc = paradox.page.write_doc(a)  # a run still training makes no claim, though its table row shows where it is
    assert "| vanilla GRPO | 1 | 6 |" in doc
    assert "- vanilla GRPO loses the tools: κ last ≤ 0.1 × κ first (> 0): not measured yet" in doc
    assert (a.docs / "paradox_curves.png").stat().st_size > 0


def test_claims_follow_the_logs(paradox, tmp_path):
    a = args(tmp_path)
    write_run(a, "vanilla_s1", (3.0, 0.1), (0.2, 0.2))  # collapse, no format repair: the paper's vanilla
    write_run(a, "para_s1", (3.0, 3.0), (0.3, 0.9))
    write_run(a, "gating_only_s1", (3.0, 2.5), (0.3, 0.4))
    write_run(a, "no_tool_s1", (3.0, 1.0), (0.3, 0.9))
    summaries = {rid: paradox.read.run_summary(a, rid) for rid in ("vanilla_s1", "para_s1", "gating_only_s1", "no_tool_s1")}
    assert summaries["vanilla_s1"]["k_first"] == pytest.approx(3.0) and summaries["vanilla_s1"]["k_max_last"] == 0
    lines = {line.split(":")[0]: line for line in paradox.tables.claims(a, summaries)}
    assert ": reproduced (κ 3.00 → 0.10)" in lines["- vanilla GRPO loses the tools"]
    assert ": reproduced (" in lines["- PARA-GRPO repairs the format"]
    assert ": reproduced (2.50 vs 0.10)" in lines["- gating only keeps more of the tools than vanilla"]
    assert ": reproduced (1.00 vs 3.00)" in lines["- PARA-GRPO − R_tool loses the tools"]
    assert "not measured yet" in lines["- anchoring only repairs the format"]

    assert "(fτ 0.30 → 0.90: 86 % of the gap; vanilla 0 %)" in lines["- PARA-GRPO repairs the format"]

    b = args(tmp_path / "b")
    write_run(b, "vanilla_s1", (3.0, 4.0), (0.2, 0.3))  # no collapse; a small repair from a low start
    write_run(b, "para_s1", (3.0, 3.0), (0.8, 0.95))  # a small gain from a high start: most of its gap
    lines = paradox.tables.claims(b, {rid: paradox.read.run_summary(b, rid) for rid in ("vanilla_s1", "para_s1")})
    assert "**not reproduced** (κ 3.00 → 4.00)" in lines[0]
    assert lines[1].endswith("reproduced (fτ 0.20 → 0.30: 12 % of the gap)")
    assert "PARA-GRPO repairs the format" in lines[3] and ": reproduced (fτ 0.80 → 0.95: 75 % of the gap" in lines[3]
    write_run(b, "no_tool_s1", (3.0, 2.9), (0.8, 0.95))  # a little below PARA-GRPO's κ is not a loss of the tools
    lines = paradox.tables.claims(b, {rid: paradox.read.run_summary(b, rid) for rid in ("vanilla_s1", "para_s1", "no_tool_s1")})
    assert [x for x in lines if "R_tool" in x][0].endswith("**not reproduced** (2.90 vs 3.00)")


def test_advantage_gap_and_call_vs_skip_read_the_same_groups(paradox, tmp_path):
    a = args(tmp_path)
    d = a.out / "rl" / "para_s1"
    d.mkdir(parents=True)
    rolls = []
    for step in range(1, 13):
        # K = 64: callers +1, skippers -1 (gap 2); K = 4: everyone calls (no gap to measure)
        rolls += [{"step": step, "group": 0, "k": 64, "n_parsed_calls": 2, "advantage": 1.0, "accuracy": 1.0,
                   "format": 1.0, "reward": 2.8, "problem_turns": 0},
                  {"step": step, "group": 0, "k": 64, "n_parsed_calls": 0, "advantage": -1.0, "accuracy": 1.0,
                   "format": 0.8, "reward": 1.8, "problem_turns": 1},
                  {"step": step, "group": 1, "k": 4, "n_parsed_calls": 3, "advantage": 0.5, "accuracy": 0.0,
                   "format": 1.0, "reward": 1.1, "problem_turns": 0},
                  {"step": step, "group": 1, "k": 4, "n_parsed_calls": 1, "advantage": -0.5, "accuracy": 0.0,
                   "format": 1.0, "reward": 1.0, "problem_turns": 0}]
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rolls))
    gap = paradox.read.advantage_gap(a, "para_s1")
    assert list(gap) == [64] and gap[64] == [2.0] * 10
    rows = paradox.tables.call_vs_skip(a)  # K = 64 only, steps 9-12 (the last third)
    assert rows[2:] == ["| PARA-GRPO 1 | 8 | 0.50 | 1.00 / 1.00 | 1.00 / 0.80 | 2.80 / 1.80 | 0.00 / 1.00 |"]
    # episode.on_bad_call=end: a column for the calling rollouts an unreadable call ended (one in four here),
    # and a half-written last line (a run still appending) is skipped, not a crash
    for r in rolls:
        r["stopped_on_bad_call"] = r["n_parsed_calls"] == 2 and r["step"] % 4 == 0
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rolls) + '{"step": 13, "gro')
    rows = paradox.tables.call_vs_skip(a)
    assert rows[0].endswith("| calls stopped by a bad call |") and rows[1].count("---") == 8
    assert rows[2:] == ["| PARA-GRPO 1 | 8 | 0.50 | 1.00 / 1.00 | 1.00 / 0.80 | 2.80 / 1.80 | 0.00 / 1.00 | 0.25 |"]
    # the first tenth: steps 1-2 here (12 steps), whose calls were not stopped; the column stays
    first = paradox.tables.call_vs_skip(a, first=True)
    assert first[2:] == ["| PARA-GRPO 1 | 4 | 0.50 | 1.00 / 1.00 | 1.00 / 0.80 | 2.80 / 1.80 | 0.00 / 1.00 | 0.00 |"]


def test_a_cell_still_being_evaluated_is_neither_shown_as_a_figure_nor_claimed(paradox, tmp_path):
    a = args(tmp_path)  # limit=2 questions a cell
    write_run(a, "para_s1", (4, 4), (0.8, 0.9))
    write_run(a, "vanilla_s1", (4, 4), (0.2, 0.3))

    def cell(model, k, rows):
        d = paradox.read.eval_dir(a, model, "parallel", k)
        d.mkdir(parents=True)
        (d / "results.jsonl").write_text("".join(json.dumps({"id": i, "score": s}) + "\n" for i, s in rows))

    cell("para_s1", 4, [("q1", 1.0), ("q2", 1.0)])
    cell("vanilla_s1", 4, [("q1", 0.0), ("q2", 0.0)])
    cell("para_s1", 16, [("q1", 0.0)])  # one of two: the eval stage is still on it
    cell("vanilla_s1", 16, [("q1", 1.0), ("q2", 1.0)])
    lines, _ = paradox.tables.main_table(a)
    para = [x for x in lines if x.startswith("| PARA-GRPO |")][0]
    assert "| 100.0 [" in para and "| 1/2 scored |" in para
    summaries = {r: paradox.read.run_summary(a, r) for r in ("para_s1", "vanilla_s1")}
    got = {x.split(":")[0]: x for x in paradox.tables.claims(a, summaries)}
    assert ": reproduced (+100.0" in got["- PARA-GRPO above vanilla at K = 4 (paired 95 % interval above 0)"]
    k16 = got["- PARA-GRPO not below vanilla at K = 16 (paired interval's upper end ≥ 0)"]
    assert k16.endswith("not measured yet (–)")
    assert [r for r in paradox.campaign.status(a) if r[0] == "eval cells"][0][1] == "3/21"  # 4 models × 3 K and block C


def test_the_follow_up_run_trains_last_and_is_evaluated_without_the_prefix(paradox, tmp_path):
    a = args(tmp_path, cold=tmp_path / "cold", train=tmp_path / "train")
    outs = [next(x for x in cmd if x.startswith("out=")).rsplit("/", 1)[1] for cmd, _, _ in paradox.campaign.train_jobs(a)]
    assert outs[-1] == "para_no_prefix_s1" and outs[:3] == ["vanilla_s1", "para_s1", "no_tool_s1"]
    assert outs.index("para_s2") < outs.index("para_no_prefix_s1")
    assert not paradox.campaign.think_prefix("para_no_prefix_s1") and not paradox.campaign.think_prefix("vanilla_s2")
    assert paradox.campaign.think_prefix("gating_only_s1") and paradox.campaign.think_prefix("cold")


def test_the_gap_testbed_is_vanilla_from_two_cold_starts_under_two_rewards(paradox, tmp_path):
    """--testbed gap: four vanilla runs, {cold_400, the skip cold start} × {paravt's reward, the release's},
    every model evaluated without the think prefix, the tables under their own markers."""
    a = args(tmp_path, testbed="gap", skip_cold=tmp_path / "skip", train=tmp_path / "train",
             out=tmp_path / "paradox_gap")
    jobs = {next(x for x in cmd if x.startswith("out=")).rsplit("/", 1)[1]: cmd for cmd, _, _ in paradox.campaign.train_jobs(a)}
    assert sorted(jobs) == ["van_cold_rel_s1", "van_cold_s1", "van_skip_rel_s1", "van_skip_s1"]
    for rid, cmd in jobs.items():
        sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "-o"]
        assert set(paradox.campaign.RUNS["vanilla"][1]) <= set(sets)
        assert ("reward.release_compat=true" in sets) == ("_rel" in rid)
        starts = [x for x in sets if x.startswith("model=")]
        assert starts == [f"model={tmp_path / ('skip' if 'skip' in rid else 'cold')}"]
        assert not paradox.campaign.think_prefix(rid)
    write_run(a, "van_skip_s1", (2, 0.5), (0.3, 0.4))
    assert set(paradox.campaign.models(a)) == {"base", "cold", "skip_cold", "van_skip_s1"}
    a.docs.mkdir()
    (a.docs / "paradox_log.md").write_text(f"intro\n{paradox.page.START}\nTable 2\n{paradox.page.END}\n")
    paradox.page.write_doc(a)
    doc = (a.docs / "paradox_log.md").read_text()
    assert "Table 2" in doc and doc.index(paradox.page.END) < doc.index(paradox.page.GAP_START)
    assert "| vanilla GRPO, skip cold start, paravt reward | 1 | 10 |" in doc
    assert "skip cold start, paravt reward, seed 1: κ 2.00 → 0.50 (last/first 0.25): does not collapse" in doc
    write_run(a, "van_skip_rel_s1", (2, 0.1), (0.3, 0.4))
    write_run(a, "van_cold_s1", (3, 0.1), (0.3, 0.4), steps=6, checkpoint=False)
    paradox.page.write_doc(a)
    doc = (a.docs / "paradox_log.md").read_text()
    assert "skip cold start, release reward, seed 1: κ 2.00 → 0.10 (last/first 0.05): **collapses**" in doc
    write_run(a, "van_cold_rel_s1", (1.0, 0.1012), (0.3, 0.4))  # 0.1012 / 1.0: just above the line
    got = paradox.tables.collapse_lines(a, {
        "van_cold_rel_s1": paradox.read.run_summary(a, "van_cold_rel_s1")})
    assert any("(last/first 0.101): does not collapse" in x for x in got), got
    assert "cold_400, paravt reward, seed 1: κ 3.00 → 0.10 at step 6 of 10: still training, no verdict" in doc
    assert (a.docs / "paradox_gap_curves.png").exists()

    # another skip cold start's 2×2 (its own --out): its own section, labels and figures; the first's stays
    b = args(tmp_path, testbed="gap", skip_cold=tmp_path / "oncold", train=tmp_path / "train",
             out=tmp_path / "paradox_gap_oncold", runs=["van_skip", "van_skip_rel"], skip_label="skip-on-cold start",
             docs=a.docs)
    write_run(b, "van_skip_rel_s1", (2, 0.1), (0.3, 0.4))
    paradox.page.write_doc(b)
    doc2 = (a.docs / "paradox_log.md").read_text()
    assert doc2.startswith(doc)  # the first 2×2's section untouched, the second's after it
    second = doc2[len(doc):]
    assert "<!-- gap 2x2 (paradox_gap_oncold):" in second and "<!-- end of gap 2x2 (paradox_gap_oncold) -->" in second
    assert "vanilla GRPO, skip-on-cold start, release reward, seed 1: κ 2.00 → 0.10" in second
    assert "| skip-on-cold start | – |" in second and "cold_400, paravt" not in second
    assert "| model | K=4: event colour / other / calls |" in second
    assert "![curves](paradox_gap_oncold_curves.png)" in second and (a.docs / "paradox_gap_oncold_curves.png").exists()
    paradox.page.write_doc(b)  # rewritten in place
    assert (a.docs / "paradox_log.md").read_text() == doc2
    assert "every run also" not in second
    b.set = ["episode.on_bad_call=end"]  # the runs' own overrides are named
    assert "`reward.release_compat` (every run also: `episode.on_bad_call=end`); held-out" in paradox.page.write_doc(b)


def test_the_collapse_testbed_is_table_2_a_and_b_from_the_chosen_start_under_the_chosen_reward(paradox, tmp_path):
    """--testbed collapse: blocks A and B (eight runs, no block C) from --cold with --set on every run, its
    section under its own markers beside Table 2's and the 2×2's, with the anchoring-only κ claim."""
    a = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", set=["reward.release_compat=true"],
             train=tmp_path / "train", out=tmp_path / "paradox_collapse")
    jobs = {next(x for x in cmd if x.startswith("out=")).rsplit("/", 1)[1]: cmd for cmd, _, _ in paradox.campaign.train_jobs(a)}
    # gating only and − γ differ from PARA-GRPO only in anchor terms, which the release's reward never fires
    assert sorted(jobs) == sorted(["vanilla_s1", "vanilla_s2", "para_s1", "para_s2", "anchoring_only_s1",
                                   "no_tool_s1"])
    named = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", set=["reward.release_compat=true"],
                 train=tmp_path / "train", runs=["gating_only_s1", "no_gamma"])
    assert sorted(next(x for x in cmd if x.startswith("out=")).rsplit("/", 1)[1]
                  for cmd, _, _ in paradox.campaign.train_jobs(named)) == ["gating_only_s1", "no_gamma_s1"]
    paravt_reward = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", train=tmp_path / "train")
    assert len(paradox.campaign.train_jobs(paravt_reward)) == 8  # under paravt's reward the anchor terms fire
    no_prefix = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", train=tmp_path / "train",
                     set=["reward.release_compat=true", "episode.think_prefix=false"])
    assert len(paradox.campaign.train_jobs(no_prefix)) == 8  # a think the model opens itself is scored
    for cmd in jobs.values():
        sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "-o"]
        assert "reward.release_compat=true" in sets and f"model={tmp_path / 'skip'}" in sets
    for rid, kappa in (("vanilla_s1", (2, 0.1)), ("vanilla_s2", (2, 0.1)), ("para_s1", (2, 1.0)),
                       ("para_s2", (2, 1.0)), ("anchoring_only_s1", (2, 0.4)), ("gating_only_s1", (2, 1.2))):
        write_run(a, rid, kappa, (0.5, 0.9))
    assert {m for m, mode, _ in paradox.campaign.eval_cells(a, paradox.campaign.models(a))} >= {"para_s1"}
    assert {mode for _, mode, _ in paradox.campaign.eval_cells(a, paradox.campaign.models(a))} == {"parallel"}  # no block C
    a.docs.mkdir()
    (a.docs / "paradox_log.md").write_text(f"{paradox.page.START}\nTable 2\n{paradox.page.END}\n{paradox.page.GAP_START}\n2x2\n"
                                       f"{paradox.page.GAP_END}\n")
    paradox.page.write_doc(a)
    doc = (a.docs / "paradox_log.md").read_text()
    assert "Table 2\n" in doc and "2x2" in doc and doc.index(paradox.page.GAP_END) < doc.index(paradox.page.COL_START)
    assert "every run also: `reward.release_compat=true`" in doc
    assert "- vanilla GRPO loses the tools: κ last ≤ 0.1 × κ first (> 0): reproduced (κ 2.00 → 0.10)" in doc
    assert "- gating only keeps more of the tools than vanilla: κ last ≥ 3 × vanilla's (and > 0): reproduced" in doc
    assert "- anchoring only keeps fewer of the tools than PARA-GRPO: κ last below PARA-GRPO's: reproduced " \
           "(0.40 vs 1.00)" in doc
    assert "block C" not in doc and "no think prefix repairs" not in doc  # neither is this testbed's
    assert (a.docs / "paradox_collapse_curves.png").exists()
    # a campaign on another condition (its own --out): its own section after the first, its own figures
    b = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", train=tmp_path / "train", docs=a.docs,
             set=["reward.release_compat=true", "episode.on_bad_call=end"], out=tmp_path / "paradox_collapse_end")
    write_run(b, "vanilla_s1", (1, 0.05), (0.5, 0.6))
    paradox.page.write_doc(b)
    doc2 = (a.docs / "paradox_log.md").read_text()
    assert doc2.startswith(doc) and "<!-- end of collapse table 2 (paradox_collapse_end) -->" in doc2[len(doc):]
    assert "every run also: `reward.release_compat=true`, `episode.on_bad_call=end`" in doc2[len(doc):]
    assert "![curves](paradox_collapse_end_curves.png)" in doc2 and (a.docs / "paradox_collapse_end_curves.png").exists()
    # a campaign of one family (--runs vanilla) claims only what vanilla's runs measure
    c = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", train=tmp_path / "train", docs=a.docs,
             set=["reward.release_compat=true"], out=tmp_path / "paradox_collapse_long", runs=["vanilla"], steps=20)
    write_run(c, "vanilla_s1", (1, 0.05), (0.5, 0.6), steps=12)  # still training
    assert "- none yet: no selected run has finished" in paradox.page.write_doc(c).split("What reproduced")[1]
    write_run(c, "vanilla_s2", (1, 0.2), (0.5, 0.6), steps=20)
    said = paradox.page.write_doc(c).split("What reproduced")[1]
    assert said.count("\n- ") == 2 and "not measured yet" not in said and "PARA-GRPO" not in said
    assert "- vanilla GRPO loses the tools: κ last ≤ 0.1 × κ first (> 0): **not reproduced**" in said


def test_the_task_table_tells_a_model_that_reads_its_crops_from_one_that_answers_the_background(paradox, tmp_path):
    """Both models score 50 % overall; the table splits them by kind of question (issue #37's skip cold
    start called at K = 4 and still answered every event question with the background's colour)."""
    a = args(tmp_path, testbed="collapse", ks=[4])  # limit=2 questions a cell
    write_run(a, "para_s1", (4, 4), (0.8, 0.9))
    write_run(a, "vanilla_s1", (4, 4), (0.2, 0.3))
    for model, event_score, other_score, calls in (("para_s1", 0.0, 1.0, 5), ("vanilla_s1", 1.0, 0.0, 0)):
        d = paradox.read.eval_dir(a, model, "parallel", 4)
        d.mkdir(parents=True)
        rows = [{"id": "q1", "score": event_score, "n_calls": calls, "extras": {"needs_event": True}},
                {"id": "q2", "score": other_score, "n_calls": calls, "extras": {"needs_event": False}}]
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = paradox.tables.task_table(a)
    assert lines[0] == "| model | K=4: event colour / other / calls |"
    assert "| PARA-GRPO 1 | 0.0 / 100.0 / 5.0 |" in lines and "| vanilla GRPO 1 | 100.0 / 0.0 / 0.0 |" in lines
    assert "| base | – |" in lines  # not evaluated: no figure


def test_a_third_seed_joins_the_runs_and_the_seed_mean(paradox, tmp_path):
    """--seeds vanilla=1,2,3: the third seed is trained with seed=3, shown in the table and averaged into the
    claims, where one collapsing seed of three no longer reads as a family's collapse."""
    a = args(tmp_path, testbed="collapse", cold=tmp_path / "skip", set=["reward.release_compat=true"],
             train=tmp_path / "train", out=tmp_path / "paradox_collapse", seeds=[paradox.campaign.family_seeds("vanilla=1,2,3")])
    jobs = {next(x for x in cmd if x.startswith("out=")).rsplit("/", 1)[1]: cmd for cmd, _, _ in paradox.campaign.train_jobs(a)}
    assert "seed=3" in jobs["vanilla_s3"] and "episode.think_prefix=false" in jobs["vanilla_s3"]
    assert "para_s3" not in jobs
    for rid, kappa in (("vanilla_s1", (1.0, 0.05)), ("vanilla_s2", (1.0, 0.05)), ("vanilla_s3", (1.0, 0.8))):
        write_run(a, rid, kappa, (0.5, 0.6))
    summaries = {rid: paradox.read.run_summary(a, rid) for rid in ("vanilla_s1", "vanilla_s2", "vanilla_s3")}
    line = paradox.tables.claims(a, summaries)[0]
    assert "**not reproduced**" in line and "→ 0.30)" in line  # (0.05 + 0.05 + 0.8) / 3, linear logs' last tenth
    a.docs.mkdir()
    doc = paradox.page.write_doc(a)
    assert "| vanilla GRPO | 3 | 10 |" in doc and "; vanilla GRPO seeds 1, 2, 3)" in doc
    with pytest.raises(Exception, match="FAMILY"):
        paradox.campaign.family_seeds("vanila=1,2,3")
    with pytest.raises(Exception, match="integers"):
        paradox.campaign.family_seeds("vanilla=1,two")


def test_a_packed_campaign_reads_the_same_after_unpacking(paradox, tmp_path):
    spec = importlib.util.spec_from_file_location("paradox_archive", ROOT / "scripts" / "paradox_archive.py")
    archive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(archive)
    a = args(tmp_path / "campaign" / "runs" / "collapse")
    d = write_run(a, "vanilla_s1", (3.0, 0.1), (0.2, 0.3))
    rolls = [{**json.loads(line), "main_texts": ["<think>x" * 50]} for line in (d / "rollouts.jsonl").read_text().splitlines()]
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rolls) + '{"step": 11, "gro')  # appending
    cell = paradox.read.eval_dir(a, "vanilla_s1", "parallel", 4)
    cell.mkdir(parents=True)
    (cell / "results.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "score": i % 2, "episode": {"turns": ["t"] * 99}})
                                                + "\n" for i in range(2)))
    packs = archive.pack(a.out, tmp_path / "store")
    assert [p.name for p in packs] == ["vanilla_s1.tar.gz"]

    b = args(tmp_path / "elsewhere" / "runs" / "collapse")  # a fresh machine: only the records
    written, kept = archive.unpack(b.out, tmp_path / "store")
    assert len(written) == 3 and not kept and not (b.out / "rl" / "vanilla_s1" / "checkpoint").exists()
    assert (b.out / "rl" / "vanilla_s1" / "log.jsonl").read_bytes() == (d / "log.jsonl").read_bytes()
    back = paradox.read.read_jsonl(b.out / "rl" / "vanilla_s1" / "rollouts.jsonl")
    assert back == [{k: v for k, v in r.items() if k != "main_texts"} for r in rolls]  # texts out, the torn line too
    assert paradox.read.run_summary(b, "vanilla_s1") == paradox.read.run_summary(a, "vanilla_s1")
    assert paradox.tables.call_vs_skip(b) == paradox.tables.call_vs_skip(a)
    assert paradox.read.scores(b, "vanilla_s1", "parallel", 4) == {"q0": 0.0, "q1": 1.0}
    assert "vanilla_s1" in paradox.campaign.models(b)  # no checkpoint, but its cells: a row of the per-task table
    assert paradox.tables.task_table(b) == paradox.tables.task_table(a)

    (b.out / "rl" / "vanilla_s1" / "log.jsonl").write_text("newer\n")  # a run folder that went on is kept
    written, kept = archive.unpack(b.out, tmp_path / "store")
    assert not written and len(kept) == 3 and (b.out / "rl" / "vanilla_s1" / "log.jsonl").read_text() == "newer\n"

    (d / "config.json").write_text(json.dumps({"model": str(tmp_path / "campaign" / "runs" / "cold")}))
    archive.pack(a.out, tmp_path / "store")  # written as the page's commands give it, from the checkout
    archive.unpack(c := tmp_path / "third" / "runs" / "collapse", tmp_path / "store")
    assert json.loads((c / "rl" / "vanilla_s1" / "config.json").read_text()) == {"model": "runs/cold"}
    (d / "config.json").write_text(json.dumps({"model": str(tmp_path / "campaign")}))
    with pytest.raises(SystemExit, match="a machine path"):  # never committed with the machine's folders in it
        archive.pack(a.out, tmp_path / "store")
    with pytest.raises(SystemExit, match="runs/<campaign>"):  # no checkout to make its paths relative to
        archive.pack(tmp_path / "campaign" / "runs", tmp_path / "store")


def _hostile_pack(store: Path, campaign: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    (store / campaign).mkdir(parents=True, exist_ok=True)
    with tarfile.open(store / campaign / "x.tar.gz", "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_unpacking_a_crafted_pack_writes_nothing_outside_the_campaign(tmp_path):
    """Records are shared, so a pack is hostile input: links (a chain of one-letter links past
    PATH_MAX escapes the "data" filter of the Pythons before the 2025 tarfile fixes), '..', absolute
    names, devices and files of another shape are refused before anything is written, and a gzip bomb
    is refused by its declared size."""
    spec = importlib.util.spec_from_file_location("paradox_archive", ROOT / "scripts" / "paradox_archive.py")
    archive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(archive)
    store, out = tmp_path / "store", tmp_path / "runs" / "c"
    cases = {
        "link chain": [(_entry(f"rl/r{i}", tarfile.SYMTYPE, "../" * 3), None) for i in range(3)]
                      + [(_entry("rl/r0/log.jsonl"), b"x")],
        "symlink record": [(_entry("rl/r/log.jsonl", tarfile.SYMTYPE, "/etc/passwd"), None)],
        "hard link": [(_entry("rl/r/log.jsonl", tarfile.LNKTYPE, "../../../escape"), None)],
        "dot dot": [(_entry("rl/../../escape.pth"), b"import os")],
        "absolute": [(_entry(str(tmp_path / "escape.pth")), b"import os")],
        "other file": [(_entry("rl/r/sitecustomize.py"), b"import os")],
        "device": [(_entry("rl/r/log.jsonl", tarfile.CHRTYPE), None)],
        "folder entry": [(_entry("rl/r", tarfile.DIRTYPE), None)],
    }
    for why, members in cases.items():
        _hostile_pack(store, out.name, members)
        with pytest.raises(SystemExit, match="not a run record"):
            archive.unpack(out, store)
        assert not any(tmp_path.rglob("escape*")) and not any(out.rglob("*.jsonl")), why

    archive.MAX_FILE_BYTES = 1000  # a bomb: a small pack that declares more than any record holds
    _hostile_pack(store, out.name, [(_entry("rl/r/log.jsonl"), b"\0" * 5000)])
    with pytest.raises(SystemExit, match="more than a run record holds"):
        archive.unpack(out, store)
    assert not (out / "rl" / "r" / "log.jsonl").exists()

    (tmp_path / "elsewhere").mkdir()
    (out / "rl").symlink_to(tmp_path / "elsewhere")  # a link already in the folder is never written through
    _hostile_pack(store, out.name, [(_entry("rl/r/log.jsonl"), b"{}\n")])
    with pytest.raises(SystemExit, match="is a link"):
        archive.unpack(out, store)
    assert not any((tmp_path / "elsewhere").iterdir())


def test_a_pack_of_many_members_is_refused_before_it_is_read_through(tmp_path):
    """Members are counted as they are read: a pack holding more than a model's records is refused at
    the first member past the bound (here the stream after it is broken, so reading on would fail
    otherwise), so a pack of 300 k empty members costs what MAX_MEMBERS headers cost; a wrong first
    member refuses the pack at once; a pax header declaring megabytes is refused by its size, unread."""
    archive = _load_archive()
    archive.MAX_MEMBERS = 100
    store, out = tmp_path / "store", tmp_path / "runs" / "c"
    (store / "c").mkdir(parents=True)
    heads = b"".join(tarfile.TarInfo(f"rl/r{i:04d}/log.jsonl").tobuf(tarfile.USTAR_FORMAT) for i in range(150))
    broken = gzip.compress(b"\0" * 4096)[:-20]  # a gzip stream cut short: EOFError if read
    (store / "c" / "x.tar.gz").write_bytes(gzip.compress(heads) + broken)
    with pytest.raises(SystemExit, match="more than 100 members"):
        archive.unpack(out, store)
    bad = tarfile.TarInfo("rl/r/sitecustomize.py").tobuf(tarfile.USTAR_FORMAT)
    (store / "c" / "x.tar.gz").write_bytes(gzip.compress(bad + heads) + broken)
    with pytest.raises(SystemExit, match="not a run record"):
        archive.unpack(out, store)
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, 16 << 20
    (store / "c" / "x.tar.gz").write_bytes(gzip.compress(pax.tobuf(tarfile.USTAR_FORMAT) + b"\0" * (16 << 20)))
    with pytest.raises(SystemExit, match="an extended header of 16777216 bytes"):
        archive.unpack(out, store)
    (store / "c" / "x.tar.gz").write_bytes(gzip.compress(heads[:512] * 2 + b"\0" * 1024))
    with pytest.raises(SystemExit, match="in the pack twice"):
        archive.unpack(out, store)
    assert not out.exists() or not any(out.rglob("*.jsonl"))


def _load_archive():
    spec = importlib.util.spec_from_file_location("paradox_archive", ROOT / "scripts" / "paradox_archive.py")
    archive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(archive)
    return archive


def _nobonus_args(out: Path, docs: Path, **kw) -> Namespace:
    """The doc stage's arguments for the no-bonus condition, as docs/paradox_log.md gives its command."""
    base = dict(testbed="collapse", out=out, docs=docs, steps=300, runs=[], seeds=[], ks=[4, 16, 64],
                k_choices=[4, 8, 16, 32, 64], limit=200, smooth=10, skip_label="skip cold start",
                cold=Path("runs/paradox_testbed/skipcold_400"), base=ROOT / "src/paravt/assets/paradox-base",
                config=ROOT / "src/paravt/configs/grpo_tiny.yaml", train=Path("data/paradox_skip_train"),
                test=Path("data/paradox_test"),
                set=["reward.release_compat=true", "episode.on_bad_call=end", "reward.tool_correct_bonus=0"])
    return Namespace(**{**base, **kw})


def test_the_log_page_regenerates_from_the_kept_records(paradox, tmp_path):
    """docs/paradox_log.md's generated sections are the records': the 600-step campaign's section comes back byte
    for byte from docs/paradox_runs alone, and the no-bonus campaign's rows that have records (anchoring only's
    second attempt, the base) come back as the page shows them; that campaign's other runs predate the records."""
    archive, store = _load_archive(), ROOT / "docs" / "paradox_runs"
    page = (ROOT / "docs" / "paradox_log.md").read_text()
    runs = tmp_path / "runs"
    for campaign in ("paradox_collapse_nobonus600", "paradox_collapse_nobonus"):
        written, kept = archive.unpack(runs / campaign, store)
        assert written and not kept

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "paradox_log.md").write_text(page)
    six = _nobonus_args(runs / "paradox_collapse_nobonus600", docs, steps=600, runs=["vanilla"])
    paradox.page.write_doc(six)
    assert (docs / "paradox_log.md").read_text() == page
    assert (docs / "paradox_collapse_nobonus600_curves.png").stat().st_size > 0

    start, end = paradox.page.collapse_markers(_nobonus_args(runs / "paradox_collapse_nobonus", docs))
    shown = page.split(start, 1)[1].split(end, 1)[0]
    again = paradox.page.write_doc(_nobonus_args(runs / "paradox_collapse_nobonus", tmp_path / "scratch",
                                                 runs=["anchoring_only"]))
    rows = [x for x in again.splitlines() if x.startswith(("| anchoring only", "| base |"))]
    assert len(rows) == 6 and all(x in shown.splitlines() for x in rows), rows  # anchoring only in 4 tables, base in 2
    # the cold start's cells recorded with anchoring only are the rebuilt cold start's, which the page quotes
    assert "| SFT cold start | – | – | – | – | – | – | – | 11.5 [8, 17] | 17.5 [13, 23] | 23.2 [18, 29] |" in again
    assert "11.5 / 17.5 / 23.2 %" in page


@pytest.mark.parametrize("script", ["paradox.py", "paradox_testbed.py", "paradox_synthvt.py", "paradox_archive.py"])
def test_the_scripts_the_docs_name_still_start(script):
    """The command lines docs/paradox.md and docs/paradox_log.md give run the files they name (the modules beside
    scripts/paradox.py are found from any working folder)."""
    import subprocess

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True, text=True,
                       cwd=ROOT.parent, timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
