"""`paravt ask`: one episode on one video, printed as it happens."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from paravt import DEFAULT_MODEL  # the shipped checkpoint; $PARAVT_MODEL overrides it
from paravt.agent import Episode, EpisodeConfig, run_episode
from paravt.aio import run


def default_model() -> str | None:
    """The model used when none is given: $PARAVT_MODEL, else the shipped checkpoint, else None."""
    env = os.environ.get("PARAVT_MODEL")
    if env:
        return env
    return str(DEFAULT_MODEL) if (DEFAULT_MODEL / "config.json").exists() else None


TOY_NOTE = (
    "note: no --model given, so this runs paravt's shipped toy model: 1.4 M parameters trained only on synthetic "
    "videos of coloured shapes (SynthVT). On a real video its answers mean nothing. For a real model pass "
    "--model Qwen/Qwen3-VL-8B-Instruct (or ParaVT/ParaVT-8B, a local checkpoint directory), or the URL of a "
    "server (vLLM, SGLang, paravt serve): --model http://127.0.0.1:8000"
)


def make_backend(model: str | None, *, api_key: str | None = None, console: Console | None = None,
                 timeout_s: float = 600.0):
    """A URL gives the OpenAI-compatible client (`timeout_s` bounds each call); a path or hub id
    loads the model in-process. Without a model, the shipped toy is used, with a note saying what it
    is and how to use a real model. Raises ModelLoadError (bad path) or BackendError (bad URL) with
    a one-line reason."""
    console = console or Console(stderr=True)
    if not model and not os.environ.get("PARAVT_MODEL") and default_model():
        console.print(f"[yellow]{TOY_NOTE}[/yellow]")
    model = model or default_model()
    if model and model.startswith(("http://", "https://")):
        from paravt.backends.openai import OpenAIBackend

        return OpenAIBackend(model, api_key=api_key, timeout_s=timeout_s)
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    if model is None:
        from paravt.models.tiny import build_tiny

        console.print("[yellow]warning: no --model given and no shipped model found: using an untrained tiny "
                      "Qwen3-VL, whose output is noise[/yellow]")
        return HFBackend(*build_tiny())
    return HFBackend(*load_model(model))


def _window(args: dict | None) -> str:
    if not isinstance(args, dict):
        return "?"
    s, e = args.get("start_time", args.get("start", "?")), args.get("end_time", args.get("end", "?"))
    return f"{s}–{e} s"


def live_printer(console: Console, status=None) -> Callable[[str, dict], None]:
    """An on_event hook that prints the episode as it happens (and updates a rich Status line)."""

    def say(text: str) -> None:
        if status is not None:
            status.update(text)

    def on_event(name: str, p: dict) -> None:
        if name == "overview":
            console.print(f"[dim]overview: {len(p['times'])} frames over {p['duration']:.1f} s[/dim]")
        elif name == "turn_started":
            console.rule(f"turn {p['turn'] + 1}" + (" · answer now" if p["forced_answer"] else ""), style="dim")
            say(f"turn {p['turn'] + 1}: the main agent is thinking…")
        elif name == "think":
            console.print(Panel(escape(p["text"]), title=f"turn {p['turn'] + 1} · think", border_style="blue"))
        elif name == "generated":
            if not p.get("think") and p.get("text") and p.get("answer") is None and not p.get("calls"):
                console.print(Panel(escape(p["text"][:1000]), title=f"turn {p['turn'] + 1} · output",
                                    border_style="blue"))
            for prob in p.get("problems", []):
                console.print(f"[yellow]  format problem: {prob}[/yellow]")
        elif name == "calls_dispatched":
            calls = p["calls"]
            run = [c for c in calls if c["status"] == "run"]
            if run:
                console.print(f"[cyan]→ {len(run)} crop(s) dispatched at once: "
                              + ", ".join(_window(c["arguments"]) for c in run) + "[/cyan]")
                say(f"turn {p['turn'] + 1}: {len(run)} sub-agent(s) watching their windows…")
            for c in calls:
                if c["status"] != "run":
                    console.print(f"[yellow]  call {c['index'] + 1} {c['status']}: {escape(str(c['error']))}[/yellow]")
        elif name == "subcall_finished":
            if not p.get("ran", True):
                return  # skipped or unreadable: already reported at dispatch
            style = "green" if p["status"] == "ok" else "red"
            span = f"{p['start']:.1f}–{p['end']:.1f} s" if p["start"] is not None else "?"
            console.print(f"  [{style}]sub-agent {p['index'] + 1} ({span}, {p['seconds']:.1f} s):[/{style}] "
                          + escape(p["response"][:400]))
        elif name == "answer":
            text = "(no answer)" if p["answer"] is None else str(p["answer"])
            if p.get("error"):
                console.print(f"[red]{escape(p['error'])}[/red]")
            console.print(Panel(escape(text), title=f"answer · {p['wall_time']:.1f} s", border_style="green"))

    return on_event


def question_type_of(question: str, question_type: str = "auto") -> str:
    """`auto` reads the question: options ("A. …", "(A) …", "A) …"), one a line or inline, make it
    multiple choice, anything else open-ended (a grounding question must say `tvg`); the grammar is
    the mcq scorer's (`protocol.options`). An open question answered under the letter prompt gets a
    different, usually wrong, answer."""
    from paravt import protocol as P

    if question_type == "auto":
        return "mcq" if P.options_from_question(question) else "oe"
    if question_type not in P.QUESTION_TYPES:
        raise ValueError(f"--question-type must be auto or one of {', '.join(P.QUESTION_TYPES)}, got {question_type!r}")
    return question_type


def ask(video: str, question: str, *, model: str | None, config: EpisodeConfig, question_type: str = "auto",
        json_path: str | None = None, timeline_path: str | None = None, api_key: str | None = None,
        subtitles: str | None = None, console: Console | None = None, backend=None, tokens: bool = True) -> Episode:
    """Run one episode, print it live, optionally write its JSON trace and timeline picture.
    The video is opened first so that a bad file fails before a model is loaded. `backend`
    replaces the one `model` names (tests, embedding). `tokens=False` writes the trace without
    token ids and logprobs (the form eval rows take; a fraction of the size)."""
    from paravt.video import VideoReader

    console = console or Console()
    if not question.strip():
        raise ValueError("the question is empty")
    asked = question_type
    question_type = question_type_of(question, question_type)
    if asked == "auto":
        console.print(f"[dim]question type: {question_type} ("
                      + ("options found in the question" if question_type == "mcq" else
                         "no 'A. …' / '(A) …' options found; --question-type mcq or tvg to override") + ")[/dim]")
    reader = VideoReader(video, timeout_s=config.model_timeout_s)  # a URL's reads: the model calls' deadline
    try:
        backend = backend or make_backend(model, api_key=api_key, console=Console(stderr=True),
                                          timeout_s=config.model_timeout_s)

        async def go() -> Episode:
            from paravt.backends.reachable import check_servers

            try:
                await check_servers(backend)  # a dead server is said at once, not after the client's retries
                with console.status("reading the video…") as status:
                    return await run_episode(backend, reader, question, config, question_type=question_type,
                                             subtitles=subtitles, on_event=live_printer(console, status))
            finally:
                await backend.aclose()

        ep = run(go())
    finally:
        reader.close()
    if ep.substituted_frames:
        where = sorted({s["where"] for s in ep.substituted_frames})
        console.print(f"[yellow]warning: {len(ep.substituted_frames)} frame(s) could not be decoded (damaged video) and "
                      f"were replaced by the nearest decodable frame, with its own time ({', '.join(where)}); the "
                      "trace lists them under substituted_frames[/yellow]")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(ep.to_dict(tokens=tokens), indent=1))
        console.print(f"[dim]trace written to {json_path}[/dim]")
    if timeline_path:
        from paravt.timeline import draw_timeline

        draw_timeline(ep, timeline_path)
        console.print(f"[dim]timeline written to {timeline_path}[/dim]")
    return ep
