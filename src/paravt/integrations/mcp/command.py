"""`paravt mcp`: serve the tools (stdio, or streamable HTTP on loopback), or write a server script
bound to these options (`--write-script`), or print a desktop agent's client entry (`--print-config`).
Imports only typer here: the CLI's `--help` stays instant."""

from __future__ import annotations

import json

import typer


def mcp_command(
    media_root: str = typer.Option(None, help="The folder whose videos the tools may open (paths relative to it, or "
                                   "absolute inside it; nothing outside it, no `..`, no link out). Without it no file "
                                   "can be opened."),
    video: str = typer.Option(None, help="The one video every call reads, whatever video_path it names (a model "
                              "that writes no path, as paravt's own; its folder is the default --media-root)."),
    allow_urls: bool = typer.Option(False, help="Also read http(s) video URLs (range requests). Off: nothing is "
                                    "fetched."),
    model: str = typer.Option(None, help="watch_window and ask_video's model: a checkpoint dir, hub id, or the URL "
                              "of an OpenAI-compatible server (paravt serve, vLLM). Default: $PARAVT_MODEL, else the "
                              "shipped tiny model."),
    api_key: str = typer.Option(None, envvar="PARAVT_API_KEY", help="Bearer key for a model URL."),
    frames: int = typer.Option(64, help="ask_video's overview K when a call gives none."),
    max_frames: int = typer.Option(256, help="ask_video's K at most."),
    mode: str = typer.Option("parallel", help="ask_video's mode when a call gives none: parallel | sequential | "
                             "inline | none."),
    prompts: str = typer.Option("paravt", help="Prompt profile: paravt | official."),
    timeout: float = typer.Option(600.0, help="Seconds one tool call may take (decoding and model calls)."),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio."),
    host: str = typer.Option("127.0.0.1", help="--http: bind address (loopback only)."),
    port: int = typer.Option(8765, help="--http: port."),
    allow_origin: list[str] = typer.Option([], help="--http: a browser origin whose pages may call the server "
                                           "(its CORS preflights answered; other cross-origin requests are "
                                           "refused). Repeatable."),
    write_script: str = typer.Option(None, help="Write a server script bound to these options and this Python to "
                                     "PATH and exit (lmms-eval's mcp_server_path=PATH runs it as `python PATH`)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the mcpServers JSON entry a desktop "
                                      "agent uses to start this server over stdio, and exit."),
) -> None:
    """Serve crop_video, watch_window and ask_video to any MCP client (an agent, lmms-eval)."""
    from paravt.integrations.mcp.settings import McpSettings, client_config
    from paravt.integrations.mcp.settings import write_script as write

    try:
        settings = McpSettings(media_root=media_root, allow_urls=allow_urls, model=model, api_key=api_key,
                               frames=frames, max_frames=max_frames, mode=mode, prompts=prompts, timeout_s=timeout,
                               video=video)
        if write_script:
            typer.echo(f"wrote {write(write_script, settings)}", err=True)
            return
        if print_config:
            typer.echo(json.dumps(client_config(settings), indent=2))
            return
        if http:  # a refused --host or --allow-origin is said before the SDK is imported (about a second)
            from paravt.integrations.mcp.web import check_http_options

            check_http_options(host, tuple(allow_origin))
        try:
            from paravt.integrations.mcp.server import run
        except ImportError as e:
            from paravt.extras import missing_extra

            raise ValueError(missing_extra("the MCP server", "mcp", e)) from None
        run(settings, "http" if http else "stdio", host=host, port=port, allowed_origins=tuple(allow_origin))
    except (ValueError, OSError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
