"""A picture of an episode: where on the video's time axis the agent looked, and when."""

from __future__ import annotations

from pathlib import Path

from paravt.agent import Episode


def draw_timeline(ep: Episode, path: str | Path) -> Path:
    """Top: the video's time axis with overview frames and each turn's crops.
    Bottom: wall-clock time of the main turns and the sub-agents (concurrency shows as overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax, aw) = plt.subplots(2, 1, figsize=(10, 4.8), gridspec_kw={"height_ratios": [1.2, 1]})
    ax.vlines(ep.overview_times, 0, 0.6, color="0.55", lw=1, label=f"overview frames (K={len(ep.overview_times)})")
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for t in ep.turns:
        for c in t.calls:
            if c.start is None or c.end is None:
                continue
            y = 1 + t.index
            col = colours[t.index % len(colours)] if c.status == "ok" else "tab:gray"
            ax.barh(y, c.end - c.start, left=c.start, height=0.6, color=col, alpha=0.8)
            ax.text(c.start, y + 0.35, f"{c.start:.0f}-{c.end:.0f}s", fontsize=7)
    ax.set_xlim(0, ep.duration)
    ax.set_ylim(-0.2, max(2, len(ep.turns) + 1))
    ax.set_yticks([0.3] + [1 + t.index for t in ep.turns])
    ax.set_yticklabels(["overview"] + [f"turn {t.index + 1} crops" for t in ep.turns])
    ax.set_xlabel("video time (s)")
    ax.set_title(f"{Path(ep.video).name} — answer: {ep.answer!r} — mode {ep.config.mode}", fontsize=10)

    rows = []
    for t in ep.turns:
        g = t.generation
        rows.append((f"main {t.index + 1}", g.started, g.finished, "tab:blue"))
        for c in t.calls:
            if c.generation is not None:
                rows.append((f"  sub {t.index + 1}.{c.index + 1}", c.generation.started, c.generation.finished, "tab:orange"))
    for y, (label, s, e, col) in enumerate(reversed(rows)):
        aw.barh(y, max(e - s, 1e-3), left=s, color=col, height=0.6)
    aw.set_yticks(range(len(rows)))
    aw.set_yticklabels([r[0] for r in reversed(rows)], fontsize=7)
    aw.set_xlim(left=0)
    aw.set_xlabel("wall clock (s) since the episode started (the gap before main 1 is overview decoding)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
