"""A paradox campaign's section of the log page, docs/paradox_log.md, and its two figures (scripts/paradox.py
--stage doc): each campaign's tables between its own markers, the prose around them left as it is.
"""

from __future__ import annotations

from pathlib import Path

from paradox_campaign import RUNS, ROOT, families, run_ids, run_label, testbed, think_prefix
from paradox_read import advantage_gap, mean, read_jsonl
from paradox_tables import block_c, call_vs_skip, claims, collapse_lines, gap_lines, main_table, task_table

LOG = "paradox_log.md"  # the page under --docs that holds every campaign's generated section
# each testbed's first campaign's markers; a campaign in another folder gets its own (own_markers)
START, END = "<!-- table 2: scripts/paradox.py --stage doc -->", "<!-- end of table 2 -->"
GAP_START, GAP_END = "<!-- gap 2x2: scripts/paradox.py --testbed gap --stage doc -->", "<!-- end of gap 2x2 -->"
COL_START = "<!-- collapse table 2: scripts/paradox.py --testbed collapse --stage doc -->"
COL_END = "<!-- end of collapse table 2 -->"


def own_markers(a, first_out: str, first: tuple[str, str], title: str) -> tuple[str, str]:
    """A testbed's section markers: the first campaign's (in `first_out`) as they were; one run into another
    folder (`--out`: another cold start or condition) gets its own, named after that folder."""
    if a.out.name == first_out:
        return first
    return (f"<!-- {title} ({a.out.name}): scripts/paradox.py --testbed {testbed(a)} --stage doc -->",
            f"<!-- end of {title} ({a.out.name}) -->")


def gap_markers(a) -> tuple[str, str]:
    return own_markers(a, "paradox_gap", (GAP_START, GAP_END), "gap 2x2")


def collapse_markers(a) -> tuple[str, str]:
    return own_markers(a, "paradox_collapse", (COL_START, COL_END), "collapse table 2")


def plot(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kmax = max(a.k_choices)
    keys = [("reward", "reward"), ("f_tau", "fτ"), ("kappa", "κ (calls per rollout)"), ("k_max", f"κ at K = {kmax}"),
            ("entropy", "entropy (nats/token)"), ("kl", "KL to the reference")]
    colors = {rid: f"C{i}" for i, (rid, _, _) in enumerate(run_ids(a))}  # one colour a run in both figures
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for rid, name, _ in run_ids(a):
        log = [r for r in read_jsonl(a.out / "rl" / rid / "log.jsonl") if "f_tau" in r]
        if not log:
            continue
        by_step: dict[int, list[int]] = {}
        for r in read_jsonl(a.out / "rl" / rid / "rollouts.jsonl"):
            if r.get("k") == kmax:
                by_step.setdefault(r["step"], []).append(r["n_parsed_calls"])
        for ax, (key, title) in zip(axes.flat, keys):
            if key == "k_max":
                xs = sorted(by_step)
                ys = [mean(by_step[x]) for x in xs]
            else:
                xs, ys = [r["step"] for r in log], [r.get(key) for r in log]
            ax.plot(xs, smooth(ys, a.smooth), label=rid, color=colors[rid], linestyle="--" if name == "vanilla" else "-")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("RL step")
    axes.flat[0].legend(fontsize=7)
    what = {"gap": f"The gap 2×2 ({a.skip_label})",  # each collapse campaign names its run folder
            "collapse": f"Table 2 A–B, skip cold start ({a.out.name})"}.get(testbed(a), "Table 2")
    fig.suptitle(f"{what}: RL runs on the paradox testbed (moving average over {a.smooth} steps)")
    fig.tight_layout()
    fig.savefig(a.docs / f"{figure_prefix(a)}_curves.png", dpi=100)
    plt.close(fig)

    gaps = {rid: advantage_gap(a, rid) for rid, _, _ in run_ids(a)}
    ks = sorted({k for g in gaps.values() for k in g})
    if ks:
        fig, axes = plt.subplots(1, len(ks), figsize=(3.2 * len(ks), 3.2), squeeze=False)
        for ax, k in zip(axes[0], ks):
            for rid, g in gaps.items():
                if k in g:
                    ax.plot(range(1, 11), [float("nan") if v is None else v for v in g[k]], marker=".", label=rid,
                            color=colors[rid])
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_title(f"K = {k}", fontsize=10)
            ax.set_xlabel("tenth of the run")
            ax.set_xlim(0.5, 10.5)
        axes[0][0].set_ylabel("advantage: called − skipped")
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(a.docs / f"{figure_prefix(a)}_advantage.png", dpi=100)
        plt.close(fig)


def smooth(xs: list, w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - w + 1):i + 1] if x is not None]
        out.append(sum(win) / len(win) if win else float("nan"))
    return out


def shown(path: Path) -> str:
    """A path as the doc shows it: relative to the repository, never this machine's."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def figure_prefix(a) -> str:
    return a.out.name if testbed(a) in ("gap", "collapse") else "paradox"


def sets_list(a) -> str:
    """The runs' own overrides (`--set`), as the docs name them."""
    return ", ".join(f"`{x}`" for x in a.set)


def seeds_note(a) -> str:
    """The seeds `--seeds` gave a family beyond its default ones, as the section's run line names them."""
    given = getattr(a, "seeds", None) or []
    more = [f"{run_label(a, name)} seeds {', '.join(map(str, seeds))}" for name, seeds in given if name in families(a)]
    return f"; {'; '.join(more)}" if more else ""


def write_between(path: Path, start: str, end: str, text: str) -> None:
    """`text` (which opens with `start` and closes with `end`) in place of the page's section between
    those markers, or at the page's end."""
    doc = path.read_text() if path.exists() else ""
    if start in doc:
        head, rest = doc.split(start, 1)
        doc = head + text + rest.split(end, 1)[1]
    else:
        doc += "\n" + text + "\n"
    path.write_text(doc)


def write_gap_doc(a) -> str:
    """The 2×2's tables between their own markers (Table 2's section is left as it is)."""
    plot(a)
    table, summaries = main_table(a)
    start, end = gap_markers(a)
    body = [start, f"Vanilla GRPO runs of {a.steps} steps (config `{shown(a.config)}`, vanilla's overrides: no "
            f"gating, no anchoring, no think prefix, no answer suffix), from `{shown(a.cold)}` (cold_400) and "
            f"`{shown(a.skip_cold)}` ({a.skip_label}), under paravt's reward and under `reward.release_compat`"
            + (f" (every run also: {sets_list(a)})" if a.set else "") + f"; held-out accuracy on the first {a.limit} "
            f"questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson interval (the runs and "
            "the base without the think prefix, the cold starts with it, as each was trained). fτ, κ: means over the "
            "first and the last tenth of the steps (τ = 0.7 rollouts).", "", *table, "",
            "Held-out accuracy per kind of question (event colour / the background's colour) and calls per question:",
            "", *task_table(a), "", "Which conditions collapse:", "",
            *collapse_lines(a, summaries), "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps: the rollouts that call "
            "against those that skip (R: the episode's reward before shaping, under the run's own reward).", "",
            *call_vs_skip(a), "", "The same over the first tenth of each run's steps, where the cold start has "
            "barely moved:", "", *call_vs_skip(a, first=True), "", *gap_lines(a), "",
            f"![curves]({figure_prefix(a)}_curves.png)", "", f"![advantage gap]({figure_prefix(a)}_advantage.png)", end]
    text = "\n".join(body)
    write_between(a.docs / LOG, start, end, text)
    return text


def write_collapse_doc(a) -> str:
    """Table 2 A–B on the collapse: its table, curves and claims between their own markers."""
    plot(a)
    table, summaries = main_table(a)
    sets = sets_list(a) or "none"
    start, end = collapse_markers(a)
    prefix = figure_prefix(a)
    said = claims(a, {rid: s for rid, s in summaries.items() if s["steps"] >= a.steps})
    if a.runs:  # a campaign of some families (e.g. a longer vanilla pair): only the claims its runs measure
        said = [c for c in said if "not measured yet" not in c] or ["- none yet: no selected run has finished"]
    body = [start, f"Runs of {a.steps} steps from `{shown(a.cold)}` (config `{shown(a.config)}`, RL rows "
            f"`{shown(a.train)}`; every run also: {sets}{seeds_note(a)}); held-out accuracy on the first {a.limit} "
            f"questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson interval; vanilla "
            "evaluated without the think prefix, as it was trained. fτ, κ: means over the first and the last tenth of "
            "the steps (τ = 0.7 rollouts).", "", *table, "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps (τ = 0.7): the rollouts "
            "that call against those that skip (R: the episode's reward before shaping).", "", *call_vs_skip(a), "",
            *gap_lines(a), "", "Held-out accuracy per kind of question (event colour: what colour was the shape; "
            "other: the background's colour), and tool calls per question, parallel dispatch:", "", *task_table(a), "",
            f"![curves]({prefix}_curves.png)", "",
            f"![advantage gap]({prefix}_advantage.png)", "",
            "What reproduced (finished runs only, seed means where a family has more than one):", "",
            *said, end]
    text = "\n".join(body)
    write_between(a.docs / LOG, start, end, text)
    return text


def write_doc(a) -> str:
    a.docs.mkdir(parents=True, exist_ok=True)  # --docs may name a folder to try the page in first
    if testbed(a) == "gap":
        return write_gap_doc(a)
    if testbed(a) == "collapse":
        return write_collapse_doc(a)
    plot(a)
    table, summaries = main_table(a)
    bare = "the base and the runs " + " and ".join(f"“{RUNS[n][0]}”" for n in RUNS if not think_prefix(f"{n}_s1"))
    body = [START, f"Runs of {a.steps} steps from `{shown(a.cold)}` (config `{shown(a.config)}`); held-out accuracy on "
            f"the first {a.limit} questions of `{shown(a.test)}`, greedy, parallel dispatch, with the 95 % Wilson "
            f"interval; {bare} are evaluated without the think prefix, as they were trained. "
            "fτ, κ: means over the first and the last tenth of the steps (τ = 0.7 rollouts).", "", *table, "",
            "Block C, the first PARA-GRPO seed's checkpoint by dispatch mode:", "", *block_c(a), "",
            f"In training at K = {max(a.k_choices)}, over the last third of each run's steps (τ = 0.7): the rollouts "
            "that call against those that skip (R: the episode's reward before shaping).", "", *call_vs_skip(a), "",
            "![curves](paradox_curves.png)", "", "![advantage gap](paradox_advantage.png)", "",
            "What reproduced (finished runs only, seed means where a family has more than one; claims on a run still "
            "training read \"not measured yet\"):", "",
            *claims(a, {rid: s for rid, s in summaries.items() if s["steps"] >= a.steps}), END]
    text = "\n".join(body)
    write_between(a.docs / LOG, START, END, text)
    return text
