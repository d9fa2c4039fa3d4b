"""The tables and claims of a paradox campaign's section, as markdown lines (scripts/paradox.py --stage doc):
the runs' fτ and κ with held-out accuracy, the call-vs-skip split, the advantage of calling, accuracy per kind of
question, block C, and the paper's Table 2 read claim by claim on the runs (arXiv 2605.20342).
"""

from __future__ import annotations

import math

from paradox_campaign import MODES, RUNS, families, models, run_ids, run_label, testbed
from paradox_read import (advantage_gap, cell_rows, done_scores, mean, num, paired_gain, read_jsonl, row_score,
                          run_summary, scores, seed_mean, wilson)


def acc_cell(a, model: str, mode: str, k: int) -> str:
    """A table cell: accuracy with its Wilson interval, or how far an eval still being filled has got."""
    s = scores(a, model, mode, k)
    if not s:
        return "–"
    if len(s) < a.limit:  # still being evaluated: no figure that reads as final
        return f"{len(s)}/{a.limit} scored"
    p = sum(s.values()) / len(s)
    lo, hi = wilson(p, len(s))
    return f"{100 * p:.1f} [{100 * lo:.0f}, {100 * hi:.0f}]"


def main_table(a) -> tuple[list[str], dict]:
    kcols = " | ".join(f"acc K={k}" for k in a.ks)
    kmax = max(a.k_choices)
    lines = [f"| run | seed | steps | fτ first | fτ last | κ first | κ last | κ K={kmax} last | {kcols} |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(a.ks)]
    summaries = {}
    starts = [("base", "base"), ("cold", "SFT cold start")]
    if testbed(a) == "gap":
        starts += [("skip_cold", a.skip_label)]
    for name, label in starts:
        accs = " | ".join(acc_cell(a, name, "parallel", k) for k in a.ks)
        lines.append(f"| {label} | – | – | – | – | – | – | – | {accs} |")
    for rid, name, seed in run_ids(a):
        s = run_summary(a, rid)
        if s is None:
            continue
        summaries[rid] = s
        accs = " | ".join(acc_cell(a, rid, "parallel", k) for k in a.ks)
        lines.append(f"| {run_label(a, name)} | {seed} | {s['steps']} | {num(s['f_first'])} | {num(s['f_last'])} | "
                     f"{num(s['k_first'])} | {num(s['k_last'])} | {num(s['k_max_last'])} | {accs} |")
    return lines, summaries


def task_table(a) -> list[str]:
    """Held-out accuracy per kind of question, and calls per question, of every finished eval cell: the
    event-colour questions need the moment of the event (a crop's summary, or an overview that holds it),
    the others read the background. The overall figure cannot tell a model that reads its crops from one
    that has learnt to answer every question with the background's colour."""
    lines = ["| model | " + " | ".join(f"K={k}: event colour / other / calls" for k in a.ks) + " |",
             "|---|" + "---|" * len(a.ks)]
    labels = {"base": "base", "cold": "SFT cold start", "skip_cold": a.skip_label}
    for name in models(a):
        cells = []
        for k in a.ks:
            rows = cell_rows(a, name, "parallel", k)
            if len(rows) < a.limit:
                cells.append("–")
                continue
            needs_event = [bool((r.get("extras") or {}).get("needs_event")) for r in rows]
            acc = [mean(row_score(r) for r, e in zip(rows, needs_event) if e == want) for want in (True, False)]
            calls = mean(float(r.get("n_calls") or 0) for r in rows)
            cells.append(f"{num(None if acc[0] is None else 100 * acc[0], 1)} / "
                         f"{num(None if acc[1] is None else 100 * acc[1], 1)} / {num(calls, 1)}")
        rid = name.rsplit("_s", 1)
        label = labels.get(name) or f"{run_label(a, rid[0])} {rid[1]}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def block_c(a) -> list[str]:
    lines = ["| dispatch | " + " | ".join(f"acc K={k}" for k in a.ks) + " |", "|---|" + "---|" * len(a.ks)]
    for mode in MODES:
        accs = " | ".join(acc_cell(a, "para_s1", mode, k) for k in a.ks)
        lines.append(f"| {mode} | {accs} |")
    return lines


def call_vs_skip(a, first: bool = False) -> list[str]:
    """At the largest K, over the last third of each run's steps (`first`: its first tenth, the cold start's
    rollouts before RL has moved it far): the rollouts that called against those that skipped, by accuracy,
    format reward, total reward and share with a parse problem. What decides whether GRPO keeps the tools is
    what a skip earns against a call, not the accuracy alone: R_fmt itself pays 0.3 for a think before a
    parseable call, so a call out-earns an equally right, well-formed skip by 0.2 (0.3 with the answer suffix
    off) without any R_tool."""
    kmax = max(a.k_choices)
    rows, stops = [], False
    for rid, name, seed in run_ids(a):
        rolls = read_jsonl(a.out / "rl" / rid / "rollouts.jsonl")
        if not rolls:
            continue
        stops = stops or any(r.get("stopped_on_bad_call") for r in rolls)
        steps = max(r["step"] for r in rolls)
        part = (lambda t: 10 * (t - 1) // steps == 0) if first else (lambda t: 3 * (t - 1) // steps == 2)
        sel = [r for r in rolls if r["k"] == kmax and part(r["step"])]
        if sel:
            rows.append((f"{run_label(a, name)} {seed}", sel))
    # stops (episode.on_bad_call=end): the share of calling rollouts that an unreadable call ended unanswered
    lines = ["| run | rollouts | skip | acc call / skip | R_fmt call / skip | R call / skip | "
             "parse problem call / skip |" + (" calls stopped by a bad call |" if stops else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if stops else "")]
    for label, sel in rows:
        call = [r for r in sel if r["n_parsed_calls"] > 0]
        skip = [r for r in sel if r["n_parsed_calls"] == 0]
        pair = lambda f: " / ".join("–" if not g else f"{mean(f(r) for r in g):.2f}" for g in (call, skip))  # noqa: E731
        stopped = f" {num(mean(float(bool(r.get('stopped_on_bad_call'))) for r in call))} |" if stops else ""
        lines.append(f"| {label} | {len(sel)} | {len(skip) / len(sel):.2f} | "
                     f"{pair(lambda r: r['accuracy'])} | {pair(lambda r: r['format'])} | {pair(lambda r: r['reward'])} | "
                     f"{pair(lambda r: float(r['problem_turns'] > 0))} |{stopped}")
    return lines


def family(summaries: dict, name: str, key: str) -> float | None:
    return mean(s[key] for rid, s in summaries.items() if rid.rsplit("_s", 1)[0] == name)


def claims(a, summaries: dict) -> list[str]:
    """The paper's Table 2 (arXiv 2605.20342), claim by claim, on the runs above (seed means where a family has
    more than one seed)."""
    g = lambda name, key: family(summaries, name, key)  # noqa: E731
    out = []

    def claim(text: str, ok: bool | None, measured: str) -> None:
        mark = "not measured yet" if ok is None else ("reproduced" if ok else "**not reproduced**")
        out.append(f"- {text}: {mark} ({measured})")

    def have(*xs) -> bool:
        return all(x is not None for x in xs)

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{round(100 * x)} %"  # an int: no "-0 %" for a hair below zero

    k0, k1, f0, f1 = (g("vanilla", k) for k in ("k_first", "k_last", "f_first", "f_last"))
    claim("vanilla GRPO loses the tools: κ last ≤ 0.1 × κ first (> 0)",
          k0 > 0 and k1 <= 0.1 * k0 if have(k0, k1) else None,
          f"κ {num(k0)} → {num(k1)}")
    # The format claims compare the share of the gap to fτ = 1 that RL closes, (last − first) / (1 − first):
    # the runs start from different prompts (vanilla without the think prefix at fτ ≈ 0.2, the others
    # with it at ≈ 0.8), so neither levels nor absolute gains compare (a run starting at 0.8 can gain 0.2).
    closed = lambda f0, f1: (f1 - f0) / (1 - f0) if have(f0, f1) and f0 < 1 else None  # noqa: E731
    cv = closed(f0, f1)
    claim("vanilla GRPO does not repair the format: closes < ¼ of its gap to fτ = 1",
          cv < 0.25 if cv is not None else None, f"fτ {num(f0)} → {num(f1)}: {pct(cv)} of the gap")
    for name in (n for n in ("anchoring_only", "para", "para_no_prefix") if n in families(a)):
        a0, a1 = g(name, "f_first"), g(name, "f_last")
        c = closed(a0, a1)
        claim(f"{RUNS[name][0]} repairs the format: closes ≥ ½ of its gap to fτ = 1, and more of it than vanilla",
              c >= 0.5 and c > cv if have(c, cv) else None,
              f"fτ {num(a0)} → {num(a1)}: {pct(c)} of the gap; vanilla {pct(cv)}")
    for name in ("gating_only", "para"):
        x = g(name, "k_last")
        claim(f"{RUNS[name][0]} keeps more of the tools than vanilla: κ last ≥ 3 × vanilla's (and > 0)",
              x > 0 and x >= 3 * k1 if have(x, k1) else None,
              f"{num(x)} vs {num(k1)}")
    go, pa = g("gating_only", "f_last"), g("para", "f_last")
    claim("gating only's fτ last below PARA-GRPO's", go < pa if have(go, pa) else None,
          f"{num(go, 3)} vs {num(pa, 3)}")  # three decimals: the two can agree to two
    nt, pk = g("no_tool", "k_last"), g("para", "k_last")
    claim("PARA-GRPO − R_tool loses the tools: κ last ≤ ½ × PARA-GRPO's (the paper: 0.04 against 0.21)",
          nt <= 0.5 * pk if have(nt, pk) else None, f"{num(nt)} vs {num(pk)}")
    ao = g("anchoring_only", "k_last")
    claim("anchoring only keeps fewer of the tools than PARA-GRPO: κ last below PARA-GRPO's",
          ao < pk if have(ao, pk) else None, f"{num(ao)} vs {num(pk)}")
    for i, k in enumerate(a.ks):
        para = seed_mean([done_scores(a, f"para_s{s}", "parallel", k) for s in families(a)["para"][2]])
        van = seed_mean([done_scores(a, f"vanilla_s{s}", "parallel", k) for s in families(a)["vanilla"][2]])
        d, lo, hi = paired_gain(para, van)
        if i == 0:
            claim(f"PARA-GRPO above vanilla at K = {k} (paired 95 % interval above 0)",
                  lo > 0 if para and van else None,
                  f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points" if para and van else "–")
        else:
            claim(f"PARA-GRPO not below vanilla at K = {k} (paired interval's upper end ≥ 0)",
                  hi >= 0 if para and van else None,
                  f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points" if para and van else "–")
    if testbed(a) != "table2":  # block C is the first testbed's
        return out
    par = [done_scores(a, "para_s1", "parallel", k) for k in a.ks]
    seq = [done_scores(a, "para_s1", "sequential", k) for k in a.ks]
    if all(par) and all(seq):
        vals = [(sum(p.values()) / len(p), sum(q.values()) / len(q)) for p, q in zip(par, seq)]
        claim("block C: parallel ≥ sequential at every K", all(p >= q for p, q in vals),
              ", ".join(f"K={k}: {100 * p:.1f} vs {100 * q:.1f}" for k, (p, q) in zip(a.ks, vals)))
    else:
        claim("block C: parallel ≥ sequential at every K", None, "–")
    return out


def gap_lines(a) -> list[str]:
    """Per run of the 2×2, the advantage of calling over skipping at the largest K (the trainer's own, group
    standard deviations) in the first and the last tenth of the run: the Tool Necessity Gap's own measure."""
    kmax = max(a.k_choices)
    lines = [f"| run | advantage call − skip, K = {kmax}, first tenth | last tenth |", "|---|---|---|"]
    for rid, name, seed in run_ids(a):
        g = advantage_gap(a, rid).get(kmax)
        if g is not None:
            lines.append(f"| {run_label(a, name)} {seed} | {num(g[0])} | {num(g[-1])} |")
    return lines


COLLAPSE = 0.1  # issue #37: vanilla's tools collapse when κ over the last tenth is at most this share of the first's


def collapse_lines(a, summaries: dict) -> list[str]:
    """Per run of the 2×2, whether vanilla's tool use collapsed (κ last ≤ COLLAPSE × κ first): the 2×2's question.
    A run still training says where it is instead of a verdict."""
    lines = []
    for rid, name, seed in run_ids(a):
        s = summaries.get(rid)
        if s is None:
            continue
        what = f"- {run_label(a, name)}, seed {seed}: κ {num(s['k_first'])} → {num(s['k_last'])}"
        if s["steps"] < a.steps:
            lines.append(f"{what} at step {s['steps']} of {a.steps}: still training, no verdict")
            continue
        ratio = s["k_last"] / s["k_first"] if s["k_first"] else math.nan
        verdict = "**collapses**" if s["k_last"] <= COLLAPSE * s["k_first"] else "does not collapse"
        digits = 3 if abs(ratio - COLLAPSE) < 0.005 else 2  # 0.101 is not 0.10: the verdict's own digit shown
        lines.append(f"{what} (last/first {num(ratio, digits)}): {verdict} (κ last ≤ {COLLAPSE:g} × κ first)")
    return lines
