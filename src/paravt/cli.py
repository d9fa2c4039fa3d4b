"""The `paravt` command line (typer). Commands live in their areas' modules; this file only wires them.

Heavy imports (torch, transformers, av) happen inside the commands, so `paravt --help` is instant.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import typer

from paravt.demo import DEMO_FRAMES  # a constant; the demo body still imports lazily

app = typer.Typer(
    name="paravt",
    help="Parallel agentic long-video understanding: ask, evaluate, train, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        from paravt import __version__

        typer.echo(f"paravt {__version__}")
        raise typer.Exit()


def _freeze_at_exit() -> None:
    """Keep the collector off what is still alive when the interpreter shuts down.

    Finalisation runs full collections over every live object (~400 k once torch and transformers
    are imported): 1.0-1.3 CPU-s at the end of a `paravt eval` of the shipped model, 0.2 with this.
    The command's garbage is collected here first, so its finalizers run; what is alive then is
    freed by reference counting as the modules are cleared, and cycles among it go with the
    process. Every atexit handler still runs."""
    import gc

    gc.collect()  # garbage made by the command is collected, its finalizers run
    gc.freeze()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """paravt: a video LMM that crops a long video in parallel through sub-agents."""
    import atexit

    atexit.unregister(_freeze_at_exit)  # once per process, however many commands it runs (CliRunner)
    atexit.register(_freeze_at_exit)


@app.command()
def version() -> None:
    """Print the paravt version."""
    from paravt import __version__

    typer.echo(__version__)


# --- command registrations (each area adds its own line here) ---


@app.command()
def demo(
    out: str = typer.Option("outputs/demo", help="Where the video and timeline go."),
    seed: int = typer.Option(None, help="SynthVT seed (default: a fresh one)."),
    model: str = typer.Option(None, help="Model path or URL (default: the shipped tiny model)."),
    frames: int = typer.Option(DEMO_FRAMES, help="Overview frames K (4: the event usually falls between them, so the agent crops)."),
) -> None:
    """Make a synthetic long video and run the whole parallel episode on it, offline, on CPU."""
    from paravt.agent import EpisodeConfig
    from paravt.demo import demo as run_demo

    try:
        EpisodeConfig(frames=frames)  # checks --frames before anything is written or loaded
    except ValueError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    run_demo(out, seed, model, frames)


@app.command()
def ask(
    video: str = typer.Argument(..., help="Video file, or an http(s) URL (read with range requests)."),
    question: str = typer.Argument(..., help="The question (MCQ options in it as 'A. …' lines, or inline: "
                                   "'… A. red B. blue')."),
    model: str = typer.Option(None, help="Checkpoint dir, hub id (cached), or http(s) URL of an OpenAI-compatible server."),
    mode: str = typer.Option("parallel", help="parallel | sequential | inline | none"),
    frames: int = typer.Option(64, help="Overview frames K."),
    max_turns: int = typer.Option(3, help="Main-agent generations at most; the last one is told to answer now."),
    max_parallel: int = typer.Option(5, help="Crop calls executed per turn (the rest are answered 'skipped')."),
    question_type: str = typer.Option("auto", help="auto (mcq when the question lists options, 'A. …' or '(A) …', "
                                      "on lines or inline; else oe) | mcq | tvg (answer 'start - end' seconds) | "
                                      "oe (open-ended)."),
    temperature: float = typer.Option(0.0, help="Sampling temperature (0: greedy, as the paper's evaluation)."),
    max_new_tokens: int = typer.Option(2048, help="New tokens per main-agent turn."),
    json_out: str = typer.Option(None, "--json", help="Write the full episode trace here (prompt text included)."),
    no_tokens: bool = typer.Option(False, "--no-tokens", help="Leave token ids and logprobs out of the --json trace "
                                   "(as eval rows do)."),
    timeline: str = typer.Option(None, help="Draw the episode timeline to this PNG."),
    api_key: str = typer.Option(None, envvar="PARAVT_API_KEY", help="Bearer key for a served model."),
    prompts: str = typer.Option("paravt", help="Prompt profile: paravt | official (the layout ParaVT-8B was trained "
                                               "with)."),
    timeout: float = typer.Option(600.0, help="Seconds one model call may take, retries included."),
    tool_calls: str = typer.Option("text", help="How a served model (--model URL) is told of the tool and its calls "
                                   "are read: text (the tags, in the messages) | native (OpenAI tool calling: "
                                   "tools, tool_calls, tool messages; for vLLM with --enable-auto-tool-choice "
                                   "--tool-call-parser hermes, or paravt serve). An in-process model sees the "
                                   "same prompt either way."),
) -> None:
    """Answer a question about a video with the parallel crop_video episode."""
    from paravt.agent import EpisodeConfig
    from paravt.ask import ask as run_ask
    from paravt.backends.base import BackendError
    from paravt.models import ModelLoadError
    from paravt.video import VideoError

    try:
        cfg = EpisodeConfig(mode=mode, frames=frames, max_turns=max_turns, max_parallel=max_parallel,
                            temperature=temperature, max_new_tokens=max_new_tokens, prompts=prompts,
                            model_timeout_s=timeout, tool_calls=tool_calls)
        run_ask(video, question, model=model, config=cfg, question_type=question_type, json_path=json_out,
                timeline_path=timeline, api_key=api_key, tokens=not no_tokens)
    except (VideoError, ModelLoadError, BackendError, ValueError, OSError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    model: str = typer.Option(None, help="Checkpoint dir or cached hub id (default: $PARAVT_MODEL, else the shipped "
                              "tiny model, as ask, eval and demo)."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000),
    api_key: str = typer.Option(None, envvar="PARAVT_API_KEY", help="Require this bearer key."),
    max_batch: int = typer.Option(16, help="Most concurrent requests merged into one forward pass."),
    max_model_len: int = typer.Option(None, help="Context length in tokens (prompt with its image tokens, plus the "
                                      "generation); a request that cannot fit is refused with 400 (default: the "
                                      "model's own)."),
    # the defaults are paravt.serve's MAX_IMAGES, MAX_TOTAL_PIXELS and MAX_INFLIGHT_PIXELS (spelled out:
    # importing serve here would load numpy for every `paravt --help`; tests/test_serve_limits.py checks they agree)
    max_images: int = typer.Option(256, help="Most images in one request (more: 400)."),
    max_total_pixels: int = typer.Option(256 * 1024 * 1024, help="Most decoded pixels of one request's images "
                                         "together, read from their headers before decoding (more: 413)."),
    max_inflight_pixels: int = typer.Option(512 * 1024 * 1024, help="Most decoded image pixels all requests "
                                            "together may hold; a request that does not fit waits, then gets 503 "
                                            "with Retry-After."),
    rl_api: bool = typer.Option(False, help="Serve the RL weight-sync endpoints (/pause, /resume, /collective_rpc "
                                "reload_weights, /weight_info), as vLLM's dev mode does, for `paravt train grpo` "
                                "with rollout servers."),
    allow_origin: list[str] = typer.Option([], help="A browser origin (e.g. http://localhost:3000) whose pages may "
                                           "call this server (CORS); other cross-origin requests are refused. "
                                           "Repeatable."),
    allow_host: list[str] = typer.Option([], help="Bound beyond loopback without --api-key, a host name besides "
                                         "the machine's own that clients may address it as (IP addresses always "
                                         "work); other names are refused, as a DNS-rebinding page's would be. "
                                         "Repeatable."),
) -> None:
    """Serve a model over an OpenAI-compatible /v1/chat/completions."""
    from paravt.models import ModelLoadError
    from paravt.serve import serve as run_serve

    try:
        run_serve(model, host, port, api_key, max_batch, max_model_len=max_model_len, max_images=max_images,
                  max_total_pixels=max_total_pixels, rl_api=rl_api, max_inflight_pixels=max_inflight_pixels,
                  allow_origins=tuple(allow_origin), allow_hosts=tuple(allow_host))
    except (ModelLoadError, ValueError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


@app.command("app")
def app_cmd(
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8080),
    media_root: str = typer.Option(None, help="A folder whose videos the page may pick (nothing outside it is "
                                   "opened); without it, videos are uploaded."),
    max_upload_mb: float = typer.Option(512, help="Largest upload in MB (more: 413)."),
    api_key: str = typer.Option(None, envvar="PARAVT_API_KEY", help="Require this bearer key on /api/ (the page "
                                "has a key field; or open it as /#key=KEY)."),
    model: str = typer.Option(None, help="The model the page uses when its model field is empty: a checkpoint dir "
                              "or an http(s) URL (default: $PARAVT_MODEL, else the shipped tiny model)."),
    frames: int = typer.Option(64, help="The page's default overview K."),
    max_episodes: int = typer.Option(2, help="Episodes running at once (more: 503)."),
) -> None:
    """A local web page: pick a video, ask, and watch the parallel episode unfold (the report's episode view)."""
    from paravt.app import serve_app

    try:
        serve_app(host=host, port=port, media_root=media_root, max_upload_mb=max_upload_mb, api_key=api_key,
                  model=model, frames=frames, max_episodes=max_episodes)
    except ValueError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


from paravt.integrations.mcp.command import mcp_command  # noqa: E402  (typer only; the server imports lazily)

app.command("mcp")(mcp_command)


def _int_pair(text: str, flag: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be two comma-separated integers like 2,5, got {text!r}") from None
    return lo, hi


def _k_chances(text: str) -> dict[int, float]:
    """'64:0.6,32:0.8' -> {64: 0.6, 32: 0.8} (--tool-prior-at-k)."""
    out = {}
    for item in text.replace(" ", "").split(","):
        try:
            k, p = item.split(":")
            out[int(k)] = float(p)
        except ValueError:
            raise ValueError(f"--tool-prior-at-k must be K:p pairs like 64:0.6,32:0.8, got {text!r}") from None
    return out


@app.command()
def synth(
    out: str = typer.Option(..., help="Output directory."),
    n: int = typer.Option(500, help="Number of questions."),
    seed: int = typer.Option(0),
    split: str = typer.Option("train", help="train | test | val (independent video streams)."),
    min_len: float = typer.Option(60.0, help="Shortest video, seconds."),
    max_len: float = typer.Option(600.0, help="Longest video, seconds."),
    size: int = typer.Option(64, help="Frame side, pixels."),
    fps: int = typer.Option(2, help="Native frame rate."),
    per_video: int = typer.Option(5, help="Questions per video (one is an overview-answerable control)."),
    event_min: float = typer.Option(1.0, help="Shortest event, seconds."),
    event_max: float = typer.Option(8.0, help="Longest event, seconds."),
    k_for_oracle: str = typer.Option("4,8,16,32,64", help="Overview sizes K the oracle trajectories use (one drawn per question)."),
    n_events: str = typer.Option("2,5", help="Events per video, as 'min,max' (inclusive)."),
    # spelled out (importing synth.questions here would load numpy for every `paravt --help`);
    # tests/test_cli.py checks the list is questions.EVENT_KINDS
    kinds: str = typer.Option("", help="Comma-separated event-question kinds to ask: colour, shape, count, order, when, "
                              "name, colour_oe, shape_oe (the default mix, asked when empty) and order_oe, count_oe, "
                              "compare_oe (questions about two or more events, asked only when named). The background "
                              "control is always asked."),
    preset: str = typer.Option("", help="'mini': SynthVT-mini, the shrunk task the shipped tiny model is trained on; "
                               "'hard': SynthVT-hard, 210-300 s videos, several events, questions that need two or "
                               "more windows, a sweep crop policy and a tool prior; 'paradox': the mini task with a "
                               "tool prior of 0.9 and prior.parquet, the same episodes in another tool layout for "
                               "pretraining a base model (docs/paradox.md); 'paradox-skip': the paradox task whose "
                               "oracle answers directly in 30 % of the episodes whose overview shows the event at "
                               "K = 16-64 (the second cold start of docs/paradox.md) (each sets the length, event, kind, "
                               "crop-policy and control options; see synth/dataset.py)."),
    tool_prior: float = typer.Option(None, help="Chance the oracle still crops (to confirm) when the overview already "
                                     "shows the evidence, 0-1 (default: the preset's, else 0: answer directly)."),
    tool_prior_at_k: str = typer.Option("", help="The same chance for the episodes of given K, overriding "
                                        "--tool-prior there, as 'K:p,K:p' (e.g. '64:0.6'; 'paradox-skip' sets "
                                        "16:0.7,32:0.7,64:0.7)."),
    captions: int = typer.Option(0, help="Also write captions.parquet: this many frame-description rows per video "
                                 "(a warm-up SFT stage that teaches a from-scratch model to see)."),
    crop_policy: str = typer.Option("evidence", help="Oracle crop windows: evidence (on the evidence, with decoys) | "
                                    "tile (equal windows covering a short video)."),
    control: str = typer.Option("mcq", help="The background control question: mcq (four options) | oe (name the colour)."),
) -> None:
    """Write a SynthVT split: MP4 videos, ParaVT-Parquet RL rows, oracle SFT rows, annotations."""
    from paravt.synth.commands import parse_ks, synth_command
    from paravt.synth.dataset import SynthConfig

    try:
        if preset not in ("", "mini", "hard", "paradox", "paradox-skip"):
            raise ValueError(f"--preset must be 'mini', 'hard', 'paradox', 'paradox-skip' or empty, got {preset!r}")
        task = dict(min_len=min_len, max_len=max_len, event_min=event_min, event_max=event_max,
                    n_events=_int_pair(n_events, "--n-events"), crop_policy=crop_policy, control=control,
                    kinds=tuple(k for k in kinds.replace(" ", "").split(",") if k))
        if preset:
            from paravt.synth.dataset import PRESETS

            task = dict(PRESETS[preset])
        if tool_prior is not None:
            task["tool_prior"] = tool_prior
        if tool_prior_at_k:
            task["tool_prior_at_k"] = {**task.get("tool_prior_at_k", {}), **_k_chances(tool_prior_at_k)}
        cfg = SynthConfig(n=n, seed=seed, split=split, size=size, fps=fps, per_video=per_video,
                          oracle_k=parse_ks(k_for_oracle), **task)
        synth_command(out, cfg)
        if captions:
            from paravt.synth.captions import write_captions

            typer.echo(f"wrote {write_captions(out, captions, seed)}")
    except (ValueError, OSError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


from paravt.eval.commands import eval_app  # noqa: E402  (typer only; bodies import lazily)

app.add_typer(eval_app, name="eval")


train_app = typer.Typer(help="Training: cold-start SFT and PARA-GRPO (configs in src/paravt/configs/).",
                        no_args_is_help=True)
app.add_typer(train_app, name="train")
_OVERRIDE = typer.Option([], "--override", "--set", "-o",
                         help="Override a config key, dotted for sections: -o steps=10 -o episode.max_turns=2")


_SHOW_CONFIG = typer.Option(False, "--show-config",
                            help="Print every config key (dotted for sections) with its value, its default and one "
                                 "line on what it sets, then exit; with --config / -o, the values they give.")


def _show_config(kind: str, config: str | None, overrides: list[str]) -> None:
    from paravt.train.config import ConfigError
    from paravt.train.config_keys import show_config

    if kind == "sft":
        from paravt.train.sft import SFTConfig as cls
    else:
        from paravt.train.grpo import GRPOConfig as cls
    try:
        loaded = cls.load(config, overrides) if config or overrides else None
    except (ConfigError, ValueError, OSError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    title = f"paravt train {kind}: the keys of a --config YAML file and of -o KEY=VALUE (key, value, what it sets)"
    typer.echo(show_config(cls, loaded, title), nl=False)


TORCHRUN_GRACE_S = 3.0  # a failed rank other than 0 waits this long before it exits (see _train)


def _train(kind: str, config: str | None, overrides: list[str], show: bool = False) -> None:
    from paravt.procs import Stop, stop_on_signals
    from paravt.train import run_training
    from paravt.train.config import ConfigError

    import os

    if show:
        return _show_config(kind, config, overrides)

    single = int(os.environ.get("WORLD_SIZE", "1")) <= 1  # torchrun manages its own processes' signals
    try:
        with stop_on_signals() if single else nullcontext():  # SIGTERM as Ctrl-C, not mid-checkpoint
            last = run_training(kind, config, overrides)
    except (KeyboardInterrupt, Stop) as e:
        why = f"{e.args[0] if isinstance(e, Stop) and e.args else 'SIGINT'}"
        note = getattr(e, "note", None) or "a rerun of the same command resumes from its checkpoint, if one was written"
        typer.secho(f"{why}: the run stopped, and the servers it started with it; {note}", fg=typer.colors.YELLOW,
                    err=True)
        raise typer.Exit(143 if why == "SIGTERM" else 130) from None
    except Exception as e:  # noqa: BLE001 - a long job's failure is one line; PARAVT_TRACEBACK=1 shows the stack
        if os.environ.get("PARAVT_TRACEBACK"):
            raise
        known = isinstance(e, (ValueError, OSError, RuntimeError))
        line = f"error: {e}" if known else f"error: {type(e).__name__}: {e}"
        _tell_torchrun(line)
        if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0's line; each rank's is in torchrun's table
            typer.secho(line, fg=typer.colors.RED, err=True)
            if isinstance(e, ConfigError):
                typer.echo(f"(`paravt train {kind} --show-config` lists every key with its default)", err=True)
        elif not single:  # let rank 0 fail first (torchrun stops the others then): its line is the one printed
            import time

            time.sleep(TORCHRUN_GRACE_S)
        raise typer.Exit(2) from None
    if os.environ.get("RANK", "0") == "0":  # under torchrun: once, not once per process
        typer.echo(json.dumps(last))


def _tell_torchrun(line: str) -> None:
    """Under torchrun, this process's one-line failure in the error file torchrun reads
    (TORCHELASTIC_ERROR_FILE, the format of torch.distributed.elastic's error handler): its failure table
    then gives each rank's cause in one line, not a pointer to its docs."""
    import os
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass  # torchrun then reports the exit code alone


@train_app.command("sft")
def train_sft_cmd(config: str = typer.Option(None, help="YAML config, e.g. src/paravt/configs/sft_tiny.yaml"),
                  override: list[str] = _OVERRIDE, show_config: bool = _SHOW_CONFIG) -> None:
    """Cold-start SFT on trajectory rows (SynthVT oracle rows or ParaVT SFT rows). Resumes from OUT/checkpoint.

    Every config key, its default and what it sets: `paravt train sft --show-config`."""
    _train("sft", config, override, show_config)


@train_app.command("grpo")
def train_grpo_cmd(config: str = typer.Option(None, help="YAML config, e.g. src/paravt/configs/grpo_tiny.yaml"),
                   override: list[str] = _OVERRIDE, show_config: bool = _SHOW_CONFIG) -> None:
    """PARA-GRPO (nFrames gating, Exploration Anchoring; vanilla GRPO with gating=false anchoring=off).
    Resumes from OUT/checkpoint.

    Every config key, its default and what it sets: `paravt train grpo --show-config`."""
    _train("grpo", config, override, show_config)
