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
    mix = ", ".join(f"{n} {t}" for t, n in s.question_types.items())
    console.print(f"{s.n_questions} questions ({mix}) over {s.n_videos} videos; oracle: "
                  f"{s.oracle_direct:.0%} answer from the overview, the rest call {s.oracle_mean_calls:.2f} crops on "
                  f"average; SFT rows: {s.sft_rows.get('main', 0)} main + {s.sft_rows.get('sub', 0)} sub-agent")
    console.print(f"wrote {out}/rl.parquet, sft.parquet, oracle.jsonl, annotations.jsonl, visibility.json, videos/")
    return s
