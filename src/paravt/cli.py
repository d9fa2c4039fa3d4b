"""The `paravt` command line (typer). Commands live in their areas' modules; this file only wires them.

Heavy imports (torch, transformers, av) happen inside the commands, so `paravt --help` is instant.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="paravt",
    help="Parallel agentic long-video understanding: ask, evaluate, train, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _main() -> None:
    """paravt: a video LMM that crops a long video in parallel through sub-agents."""


@app.command()
def version() -> None:
    """Print the paravt version."""
    from paravt import __version__

    typer.echo(__version__)


# --- command registrations (each area adds its own line here) ---
