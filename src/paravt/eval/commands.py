"""The body of `paravt eval`."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


def eval_command(*, bench, data, videos, model, endpoints, mode, out, limit, concurrency, frames, max_turns,
                 max_parallel, max_new_tokens, api_key, force) -> dict:
    from paravt.backends.base import BackendError
    from paravt.eval.benchmarks import BenchmarkError, load_benchmark
    from paravt.eval.runner import ManifestMismatch, eval_config, run_eval_async
    from paravt.models import ModelLoadError

    console = Console()
    try:
        loaded = load_benchmark(bench, data, videos)
        if loaded.missing_videos:
            console.print(f"[yellow]{len(loaded.missing_videos)} sample(s) skipped: video missing "
                          f"(first: {loaded.missing_videos[0]})[/yellow]")
        cfg = eval_config(mode=mode, frames=frames, max_turns=max_turns, max_parallel=max_parallel,
                          max_new_tokens=max_new_tokens)
        if endpoints:
            from paravt.backends.openai import OpenAIBackend

            urls = [u.strip() for u in endpoints.split(",") if u.strip()]
            backend = OpenAIBackend(urls[0], endpoints=urls, api_key=api_key)
        else:
            from paravt.ask import make_backend

            backend = make_backend(model, api_key=api_key, console=console)
        manifest = {"bench": bench, "model": model or endpoints or "default", "n_samples": len(loaded.samples)}

        async def go():
            try:
                with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                              TimeRemainingColumn(), console=console) as progress:
                    return await run_eval_async(loaded.samples, backend, cfg, out, concurrency=concurrency, limit=limit,
                                                manifest=manifest, force=force, progress=progress)
            finally:
                await backend.aclose()

        summary = asyncio.run(go())
    except (BenchmarkError, ManifestMismatch, ModelLoadError, BackendError, ValueError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    table = Table(title=f"{bench} · {mode} · {out}")
    table.add_column("metric")
    table.add_column("value")
    for k, v in summary.items():
        if not isinstance(v, dict):
            table.add_row(k, f"{v:.2f}" if isinstance(v, float) else str(v))
    console.print(table)
    for group in ("by_duration", "by_task"):
        if group in summary:
            console.print(group + ": " + ", ".join(f"{g} {d['score']:.1f} (n={d['n']})" for g, d in summary[group].items()))
    return summary
