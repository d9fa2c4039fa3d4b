"""paravt's tools for any agent: an MCP server (`paravt mcp`, on the official `mcp` SDK 2.x, serving
clients of both protocol eras: 2026-07-28's and the `initialize` handshake of mcp 1.x clients).

Tools (names and arguments of `crop_video` as lmms-eval's LongVT example server has them, so this
server can stand in for it as `mcp_server_path=`):
- `crop_video(video_path, start_time, end_time[, num_frames])`: the window's frames as PNG images,
  each after a text with its time, sampled and sized as the episode samples a crop for its sub-agent
  (1 frame per second, at most 16, at most 224x224 pixels); the end is clamped to the video's end.
- `watch_window(video_path, start_time, end_time, question)`: a sub-agent's summary of the window
  (the episode's sub-agent prompt, sampling and budgets) on the configured model.
- `ask_video(video_path, question[, frames, mode])`: the whole episode's answer, with its calls and
  summaries as structured content.

Bounds: every tool call has a deadline (`--timeout`, as a model call's), and a call that ends stops
its reads (`tools.within`); a crop returns at most 16 frames of at most 224x224; ask_video's K is at
most `--max-frames`. A call that goes wrong is a tool error (is_error, one line), never the server's
end; the server ends with its client (stdin closed), whatever its threads wait on.

Safety: a tool opens only files under `--media-root` (`paravt app`'s rule, `paravt.app.media`: no
`..`, no link out of the root; an absolute path is accepted when it lies inside the root); no URL is
fetched without `--allow-urls`; the HTTP transport binds loopback only and refuses what a web page
could send (`paravt.webguard`, as `paravt serve`: a non-loopback Host, a foreign Origin, a non-JSON
POST), bounds each body's time and size, and answers CORS preflights for `--allow-origin`.

Start-up: lmms-eval starts a new server process for every tool call, so crop_video imports no model
code (no torch, no transformers): a model is loaded, or a server client made, on the first
watch_window or ask_video call of a process. Modules: `settings` (options, the media-root check, the
written script), `tools` (the tools' bodies over paravt.agent and paravt.video), `server` (MCPServer,
stdio, the process's start and end), `web` (streamable HTTP), `wire` (requests answered before the SDK
reads them), `command` (`paravt mcp`). See docs/mcp.md.

This package imports nothing itself: `paravt.cli` imports `command` (typer only) for every command.
"""
