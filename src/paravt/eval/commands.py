"""`paravt eval`: the typer sub-app and the bodies of its commands.

    paravt eval --bench NAME --data DIR --out DIR [--model PATH_OR_URL] [--endpoints URL,URL] ...
    paravt eval run --bench NAME ...          (the same, spelled as a subcommand)
    paravt eval report RUN_DIR RUN_DIR ...    (runs side by side: table, Markdown, bar plot, HTML report)
    paravt eval list                          (the benchmarks and what each reads)

Only typer is imported at module level so `paravt --help` stays fast.
"""

from __future__ import annotations

import typer

eval_app = typer.Typer(
    help="Evaluate on a benchmark (paravt eval --bench ... or paravt eval run --bench ...), compare runs "
         "(paravt eval report DIR...), list benchmarks (paravt eval list).",
    invoke_without_command=True, no_args_is_help=True)


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def make_backends(model: str | None, endpoints: str | None, api_key: str | None, served_model: str | None = None,
                  image_format: str = "png", console=None, timeout_s: float = 600.0):
    """Model resolution as in `paravt ask`: URLs (--model URL and/or --endpoints) give one
    OpenAIBackend spread over all of them; a path (or nothing) loads the model in-process."""
    urls = [u.strip() for u in (endpoints or "").split(",") if u.strip()]
    if model and model.startswith(("http://", "https://")):
        urls = [model] + [u for u in urls if u != model]
    elif model and urls:
        raise ValueError("--endpoints are servers: give --model as one of their URLs, or leave --model out")
    if urls:
        from paravt.backends.openai import OpenAIBackend

        return OpenAIBackend(urls[0], model=served_model, api_key=api_key, endpoints=urls, image_format=image_format,
                             timeout_s=timeout_s)
    from paravt.ask import make_backend

    return make_backend(model, api_key=api_key, console=console, timeout_s=timeout_s)


def error_report(summary: dict) -> list[str]:
    """The end of a run with errors: how many, and the most common causes, most frequent first."""
    if not summary.get("errors"):
        return []
    lines = [f"{summary['errors']} of {summary['n']} samples failed ({summary['error_rate']:.1f}%); most common "
             "causes:"]
    lines += [f"  {n} x {cause}" for cause, n in (summary.get("error_causes") or {}).items()]
    return lines


def run_failed(summary: dict, max_error_rate: float) -> str | None:
    """Why a finished run counts as failed (the CLI exits 1), else None: nothing was evaluated, or
    more than `max_error_rate` (a fraction) of the samples failed. A score over failures is not a
    result: a dead model must not look like a model that answers wrong."""
    if not summary.get("n"):
        return "no sample was evaluated (n = 0)"
    rate = summary["errors"] / summary["n"]
    if rate > max_error_rate:
        return (f"{summary['errors']} of {summary['n']} samples failed ({100 * rate:.1f}%), more than "
                f"--max-error-rate {max_error_rate:g}")
    return None


def _print_summary(console, summary: dict, title: str, out: str) -> None:
    from paravt.eval.metrics import endpoint_lines, score_line, summary_tables

    for t in summary_tables(summary, title):
        console.print(t)
    console.print(score_line(summary), style="bold", markup=False, highlight=False)
    for line in endpoint_lines(summary):
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    console.print(f"[dim]{out}/results.jsonl, summary.json, summary.md[/dim]")
    for line in error_report(summary):
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)


def _check_run_args(concurrency: int, limit: int | None, max_error_rate: float) -> None:
    if concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}" + (" (0 evaluates nothing)" if limit == 0 else ""))
    if not 0 <= max_error_rate <= 1:
        raise ValueError(f"--max-error-rate must be a fraction from 0 to 1, got {max_error_rate}")


def _media_root(media_root: str | None, videos: str | None):
    """The --media-root folder (checked before anything loads), or None."""
    from pathlib import Path

    if media_root is None:
        return None
    root = Path(media_root).expanduser()
    if not root.is_dir():
        raise ValueError(f"--media-root {media_root}: not a folder")
    if videos is not None and not Path(videos).expanduser().resolve().is_relative_to(root.resolve()):
        raise ValueError(f"--videos {videos} is outside --media-root {media_root}: no sample's video could be opened")
    return root


def _check_rows_under(console, root, samples) -> None:
    """Before the model loads: refuse a run none of whose rows names a file under the media root (a
    wrong --media-root), and say how many will be error rows. By the names only: what is opened is
    decided sample by sample, when its episode opens the video (eval.media_root.held_video)."""
    from paravt.eval.media_root import relative_to_root

    outside = [s for s in samples if relative_to_root(root, s.video_path) is None]
    if samples and len(outside) == len(samples):
        raise ValueError(f"no sample's video is under --media-root {root} (first: {outside[0].video_path}): "
                         "point --media-root at the folder holding the videos (docs/data.md)")
    if outside:
        console.print(f"{len(outside)} sample(s) name a video outside --media-root {root} (first: {outside[0].id} "
                      f"-> {outside[0].video_path}): each is an error row, the others run", style="yellow",
                      markup=False, highlight=False, soft_wrap=True)


def eval_command(*, bench: str, data: str, videos: str | None, model: str | None, endpoints: str | None, mode: str,
                 out: str, limit: int | None, concurrency: int, frames: int, max_turns: int, max_parallel: int,
                 max_new_tokens: int, api_key: str | None, force: bool, retry_errors: bool = True,
                 keep_token_ids: bool = False, served_model: str | None = None, image_format: str = "png",
                 oe_metric: str = "f1", sample_timeout_s: float | None = 1800.0, progress: bool = True,
                 prompts: str = "paravt", timeout_s: float = 600.0, final_turn_think: bool = True,
                 max_error_rate: float = 0.5, think_prefix: bool = True, media_root: str | None = None,
                 tool_calls: str = "text") -> dict:
    """Load the benchmark, build the backend(s), run, print the summary and the errors' causes.
    Returns the summary; exits 1 (typer.Exit) when the run failed (see run_failed): the rows
    written stay, and a rerun retries the failed samples."""
    import asyncio
    from contextlib import nullcontext
    from pathlib import Path

    from rich.console import Console

    from paravt.backends.base import BackendError
    from paravt.eval.benchmarks import BenchmarkError, load_benchmark
    from paravt.eval.run_dir import LOCK, RunDirBusy, RunLock
    from paravt.eval.runner import EvalAborted, ManifestMismatch, OutputError, eval_config, run_eval_async
    from paravt.models import ModelLoadError
    from paravt.rewards import RewardConfig

    console = Console()
    try:
        # the arguments first: a typo must not cost a model load or a benchmark scan
        cfg = eval_config(mode=mode, frames=frames, max_turns=max_turns, max_parallel=max_parallel,
                          max_new_tokens=max_new_tokens, prompts=prompts, model_timeout_s=timeout_s,
                          final_turn_think=final_turn_think, think_prefix=think_prefix, tool_calls=tool_calls)
        reward_cfg = RewardConfig(oe_metric=oe_metric)
        _check_run_args(concurrency, limit, max_error_rate)
        root = _media_root(media_root, videos)
        loaded = load_benchmark(bench, data, videos)
        console.print(f"[bold]{bench}[/bold]: {len(loaded.samples)} samples with their video")
        if root is not None:
            _check_rows_under(console, root, loaded.samples)
        if loaded.missing:
            console.print(f"[yellow]{len(loaded.missing)} sample(s) skipped, video missing (first: "
                          f"{loaded.missing[0].id} -> {loaded.missing[0].looked_for}); list in "
                          f"{out}/missing_videos.jsonl[/yellow]")
        for reason, n in loaded.skipped.items():
            console.print(f"[dim]{n} row(s) not part of this split's protocol: {reason}[/dim]")
        for reason, n in loaded.notes.items():
            console.print(f"[yellow]{n} row(s) kept as the official scoring keeps them: {reason}[/yellow]")
        if not loaded.samples:
            raise BenchmarkError(f"no {bench} sample has its video: point --videos at the video directory")
        # a folder another eval is writing is refused before the model loads (minutes at 8B); held
        # until the run (which takes the same per-process lock) is over
        with RunLock(out) if (Path(out) / LOCK).exists() else nullcontext():
            backend = make_backends(model, endpoints, api_key, served_model, image_format, console, timeout_s)
            model_id = model or endpoints or "default"

            async def go() -> dict:
                try:
                    return await run_eval_async(
                        loaded.samples, backend, cfg, out, concurrency=concurrency, limit=limit, progress=progress,
                        model=model_id, force=force, missing=loaded.missing, retry_errors=retry_errors,
                        reward_cfg=reward_cfg, keep_token_ids=keep_token_ids, sample_timeout_s=sample_timeout_s,
                        manifest={"info": {"endpoints": endpoints, "data": str(data), "videos": videos,
                                           **({"media_root": str(root)} if root is not None else {})}},
                        media_root=root)
                finally:
                    await backend.aclose()

            summary = asyncio.run(go())
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: every finished sample is in {out}/results.jsonl; rerun the same "
                      "command to resume[/yellow]")
        raise typer.Exit(130) from None
    except (BenchmarkError, ManifestMismatch, EvalAborted, OutputError, ModelLoadError, BackendError, ValueError,
            RunDirBusy) as e:
        _fail(str(e))  # OutputError: "<path>: <cause>"; every row written so far is kept
    _print_summary(console, summary, f"{bench} · {mode} · {out}", out)
    failed = run_failed(summary, max_error_rate)
    if failed:
        _fail(f"{failed}; the rows are in {out}/results.jsonl (rerun the same command to retry the failed "
              "samples)", code=1)
    return summary


@eval_app.callback()
@eval_app.command("run")
def eval_run(
    ctx: typer.Context,
    bench: str = typer.Option(None, help="videomme | videomme_sub | longvideobench | lvbench | mlvu | mmvu | mmvu_all "
                                         "| charades | synthvt (see `paravt eval list`)"),
    data: str = typer.Option(None, help="Directory with the benchmark's annotation files as published (SynthVT: "
                                        "the split directory)."),
    videos: str = typer.Option(None, help="Video directory (default: --data and its usual subfolders)."),
    model: str = typer.Option(None, help="Checkpoint dir, cached hub id, or URL of an OpenAI-compatible server "
                                         "(default: $PARAVT_MODEL, else the shipped tiny model, tiny-paravt)."),
    endpoints: str = typer.Option(None, help="Comma-separated server URLs used at once (data-parallel servers)."),
    mode: str = typer.Option("parallel", help="parallel | sequential | inline | none"),
    out: str = typer.Option(None, help="Run directory: results.jsonl, manifest.json, summary.json/md."),
    limit: int = typer.Option(None, help="Only the first N samples."),
    concurrency: int = typer.Option(4, help="Episodes in flight."),
    frames: int = typer.Option(64, help="Overview frames K."),
    max_turns: int = typer.Option(3, help="Main-agent generations per episode at most; the last one is told to "
                                          "answer now."),
    max_parallel: int = typer.Option(5, help="Crop calls executed per turn (the rest are answered 'skipped')."),
    max_new_tokens: int = typer.Option(2048, help="New tokens per main-agent turn."),
    api_key: str = typer.Option(None, envvar="PARAVT_API_KEY", help="Bearer key for the server(s) of --model / "
                                                                    "--endpoints."),
    served_model: str = typer.Option(None, help="Model name to request from the server (default: its first)."),
    image_format: str = typer.Option("png", help="Frame encoding sent to servers: png | jpeg."),
    oe_metric: str = typer.Option("f1", help="Open-ended scoring: f1 | exact."),
    sample_timeout: float = typer.Option(1800.0, help="Seconds one episode may take before it is an error row."),
    prompts: str = typer.Option("paravt", help="Prompt profile: paravt | official (the layout ParaVT-8B was trained "
                                               "with)."),
    timeout: float = typer.Option(600.0, help="Seconds one model call may take, retries included."),
    max_error_rate: float = typer.Option(0.5, help="Exit 1 when more than this fraction of the samples failed "
                                                   "(error rows); rows stay written, a rerun retries them."),
    final_turn_think: bool = typer.Option(True, help="The last round's forced answer keeps the think prefix and the "
                                                     "full token budget (--no-final-turn-think: a direct answer in "
                                                     "64 / 128 tokens, as the public evaluation)."),
    think_prefix: bool = typer.Option(True, help="Open each of the model's turns with `<think>` (paravt's prompts and "
                                                 "PARA-GRPO's rollouts); --no-think-prefix lets the model begin "
                                                 "its turns itself, as one trained without it expects (the "
                                                 "release's vanilla GRPO, a base model's own habit)."),
    tool_calls: str = typer.Option("text", help="How a served model (--model URL) is told of the tool and its calls "
                                   "are read: text (the tags, in the messages) | native (OpenAI tool calling: "
                                   "tools, tool_calls, tool messages; for vLLM with --enable-auto-tool-choice "
                                   "--tool-call-parser hermes, or paravt serve). An in-process model sees the "
                                   "same prompt either way."),
    retry_errors: bool = typer.Option(True, help="On resume, rerun samples whose row is an error."),
    keep_token_ids: bool = typer.Option(False, help="Keep token ids / logprobs in the traces (large)."),
    force: bool = typer.Option(False, help="Resume even if the run's settings changed."),
    media_root: str = typer.Option(None, help="Open only videos under this folder: a data row naming any other "
                                              "file (an absolute path, `..`, a link out) is that sample's error "
                                              "row, the others run (docs/data.md)."),
) -> None:
    """Run an evaluation (resumable: rerun the same command to continue)."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [name for name, value in (("--bench", bench), ("--data", data), ("--out", out)) if not value]
    if missing:
        names = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
        _fail(f"{names} {'is' if len(missing) == 1 else 'are'} required "
              "(`paravt eval run --help`; `paravt eval list` names the benchmarks)")
    eval_command(bench=bench, data=data, videos=videos, model=model, endpoints=endpoints, mode=mode, out=out,
                 limit=limit, concurrency=concurrency, frames=frames, max_turns=max_turns, max_parallel=max_parallel,
                 max_new_tokens=max_new_tokens, api_key=api_key, force=force, retry_errors=retry_errors,
                 keep_token_ids=keep_token_ids, served_model=served_model, image_format=image_format,
                 oe_metric=oe_metric, sample_timeout_s=sample_timeout if sample_timeout > 0 else None,
                 prompts=prompts, timeout_s=timeout, final_turn_think=final_turn_think, max_error_rate=max_error_rate,
                 think_prefix=think_prefix, media_root=media_root, tool_calls=tool_calls)


@eval_app.command("report")
def eval_report(
    runs: list[str] = typer.Argument(..., help="Run directories to compare."),
    plot: str = typer.Option(None, help="Also draw a bar plot (PNG) of score and tool calls per run here."),
    md: str = typer.Option(None, help="Also write the comparison as Markdown here."),
    html: str = typer.Option(None, help="Also write an HTML report here (its scripts and thumbnails go in a "
                                        "<name>_files folder beside it; opens from disk, offline): every sample, "
                                        "sortable and filterable, each with what the model did."),
    videos: list[str] = typer.Option(None, help="Where the runs' videos are now, if they moved since the eval "
                                                "(repeatable; for the HTML report's thumbnails)."),
    thumbs: int = typer.Option(16, help="Overview thumbnails per episode in the HTML report (0: none)."),
) -> None:
    """Compare eval runs side by side (e.g. the four dispatch modes); --html for a page of every sample."""
    from rich.console import Console

    from paravt.eval.report import ReportError, compare

    console = Console()
    try:
        tables, _ = compare(runs, plot=plot, md=md)
        for t in tables:
            console.print(t)
        made = None
        if html:
            from paravt.report import build_report

            made = build_report(runs, html, videos=videos, max_thumbs=max(0, thumbs), progress=True)
    except ReportError as e:
        _fail(str(e))
    for note in (made or {}).get("notes", []):
        console.print(note, style="yellow", markup=False, highlight=False, soft_wrap=True)
    written = [f"plot: {plot}"] * bool(plot) + [f"markdown: {md}"] * bool(md)
    if made:
        written.append(f"html: {made['html']} ({made['samples']} samples, {made['thumbnails']} thumbnails in "
                       f"{made['assets']})")
    if written:
        typer.echo("  ".join(written))


@eval_app.command("list")
def eval_list() -> None:
    """The benchmarks `--bench` accepts."""
    from rich.console import Console
    from rich.table import Table

    from paravt.eval.benchmarks import BENCHMARKS

    t = Table(title="benchmarks")
    for c in ("name", "what", "headline metric", "breakdowns"):
        t.add_column(c)
    for b in BENCHMARKS.values():
        t.add_row(b.name, b.description, b.headline, ", ".join(b.breakdowns))
    Console().print(t)
