"""A picture of an episode: where on the video's time axis the agent looked, and when."""

from __future__ import annotations

from pathlib import Path

from paravt.agent import Episode

_TURN_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]


def draw_timeline(ep: Episode, path: str | Path, truth: list[tuple[float, float]] | None = None) -> Path:
    """Top: the video's time axis with the overview frames and each turn's crops (failed calls
    hatched grey), and where the evidence really was (`truth` spans, green) when it is known. Bottom: wall-clock time of the main turns and of every call of a turn (its
    whole span light, the sub-agent's generation dark), so concurrency shows as overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    rows = []  # (label, call span or None, generation span or None, colour)
    for t in ep.turns:
        g = t.generation
        rows.append((f"main {t.index + 1}" + (" (answer now)" if t.forced_answer else ""), None,
                     (g.started, g.finished), "tab:blue"))
        for c in t.calls:
            if c.status == "skipped" or c.start is None:
                continue
            gen = (c.generation.started, c.generation.finished) if c.generation else None
            rows.append((f"  call {t.index + 1}.{c.index + 1}", (c.started, c.finished), gen,
                         "tab:orange" if c.status == "ok" else "tab:gray"))
    fig, (ax, aw) = plt.subplots(2, 1, figsize=(10, 3.2 + 0.18 * (len(ep.turns) + len(rows))),
                                 gridspec_kw={"height_ratios": [1.1 + 0.2 * len(ep.turns), 1 + 0.1 * len(rows)]})

    ax.vlines(ep.overview_times, 0, 0.6, color="0.45", lw=1)
    for i, (s, e) in enumerate(truth or []):
        ax.axvspan(s, e, facecolor="tab:green", alpha=0.35, edgecolor="darkgreen", lw=1.2, zorder=3,
                   label="evidence (truth)" if i == 0 else None)
    if truth:
        ax.legend(loc="upper right", fontsize=7)
    for t in ep.turns:
        y = 1 + t.index
        for c in t.calls:
            if c.start is None or c.end is None:
                continue
            ok = c.status == "ok"
            ax.barh(y, c.end - c.start, left=c.start, height=0.6, alpha=0.85,
                    color=_TURN_COLOURS[t.index % len(_TURN_COLOURS)] if ok else "0.8",
                    hatch=None if ok else "//", edgecolor="k" if ok else "0.4", lw=0.5)
            ax.text(c.start, y + 0.36, f"{c.start:g}-{c.end:g}s", fontsize=7)
    ax.set_xlim(0, max(ep.duration, 1e-6))
    ax.set_ylim(-0.2, len(ep.turns) + 1)
    ax.set_yticks([0.3] + [1 + t.index for t in ep.turns])
    ax.set_yticklabels([f"overview (K={len(ep.overview_times)})"] + [f"turn {t.index + 1} crops" for t in ep.turns],
                       fontsize=8)
    ax.set_xlabel("video time (s)")
    ax.set_title(f"{Path(ep.video).name} · mode {ep.config.mode} · answer {ep.answer!r} · "
                 f"{ep.n_executed_calls}/{ep.n_parsed_calls} calls run · {ep.wall_time:.1f} s", fontsize=9)

    for y, (_, span, gen, colour) in enumerate(reversed(rows)):
        if span is not None:
            aw.barh(y, max(span[1] - span[0], 1e-3), left=span[0], color=colour, alpha=0.35, height=0.7)
        if gen is not None:
            aw.barh(y, max(gen[1] - gen[0], 1e-3), left=gen[0], color=colour, height=0.45)
    aw.set_yticks(range(len(rows)))
    aw.set_yticklabels([r[0] for r in reversed(rows)], fontsize=7)
    aw.set_xlim(left=0)
    aw.set_xlabel("wall clock since the episode started (s): light = whole call incl. decoding, dark = generation")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
