"""Body of `paravt synth`: write a split with a progress bar, then print the dial."""

from __future__ import annotations

from paravt.synth.dataset import K_VALUES, SplitSummary, SynthConfig, build_split


def parse_ks(text: str) -> tuple[int, ...]:
    """'4,8,16' -> (4, 8, 16), with a clear error."""
    try:
        ks = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"--k-for-oracle must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"--k-for-oracle must list positive frame counts, got {text!r}")
    return ks


def visibility_table(summary: SplitSummary, title: str):
    """The tool-necessity dial as a rich table."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("K", justify="right")
    t.add_column("event Qs visible", justify="right")
    t.add_column("≈ min(1, K·d/L)", justify="right")
    t.add_column("controls visible", justify="right")
    for k in K_VALUES:
        t.add_row(str(k), f"{summary.visible[k]:.1%}", f"{summary.predicted[k]:.1%}", f"{summary.control_visible[k]:.1%}")
    return t


def oracle_table(summary: SplitSummary, title: str):
    """The oracle's tool use by the K each episode was written for: its direct-answer share and
    crop calls per episode (the cold start's tool prior, kappa at the start of RL)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("K", justify="right")
    t.add_column("episodes", justify="right")
    t.add_column("answer directly", justify="right")
    t.add_column("calls / episode", justify="right")
    for k, n in summary.oracle_episodes_at_k.items():
        t.add_row(str(k), str(n), f"{summary.oracle_direct_at_k[k]:.1%}", f"{summary.oracle_calls_at_k[k]:.2f}")
    return t


def synth_command(out: str, cfg: SynthConfig) -> SplitSummary:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("questions"),
                  TimeElapsedColumn(), console=console) as progress:
        s = build_split(out, cfg, progress)
    console.print(visibility_table(
        s, f"SynthVT {cfg.split}: questions whose evidence shows in K uniform overview frames "
           f"({s.n_event_questions} event questions, {s.n_questions - s.n_event_questions} controls)"))
    at_k = "".join(f", {v:g} at K = {k}" for k, v in sorted(cfg.tool_prior_at_k.items()))
    console.print(oracle_table(s, f"Oracle trajectories by their K (tool prior {cfg.tool_prior:g}{at_k})"))
    mix = ", ".join(f"{n} {t}" for t, n in s.question_types.items())
    mix += "; " + ", ".join(f"{n} {k}" for k, n in s.question_kinds.items())
    console.print(f"{s.n_questions} questions ({mix}) over {s.n_videos} videos; oracle: "
                  f"{s.oracle_direct:.0%} answer from the overview, the rest call {s.oracle_mean_calls:.2f} crops on "
                  f"average ({s.oracle_redundant:.0%} of all episodes crop although the overview shows the evidence, "
                  f"{s.oracle_two_rounds:.0%} use two rounds); "
                  f"SFT rows: {s.sft_rows.get('main', 0)} main + {s.sft_rows.get('sub', 0)} sub-agent")
    console.print(f"wrote {out}/rl.parquet, sft.parquet, oracle.jsonl, annotations.jsonl, visibility.json, videos/")
    return s
