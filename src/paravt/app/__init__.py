"""`paravt app`: a local web page to ask a video a question and watch the episode unfold.

Pick a video (upload one, or a file under `--media-root`), write the question, choose K, the
dispatch mode and the model (a local checkpoint, by default the shipped one, or the URL of an
OpenAI-compatible server), and the page draws the episode as it runs: the overview frames on the
video's time axis, each crop window when the main agent dispatches it, each sub-agent's summary
when that sub-agent finishes, then the answer.

Why paravt's own FastAPI and not Gradio: the page streams the episode's own events (run_episode's
`on_event` hook, forwarded as Server-Sent Events, one per hook call, as they happen: nothing is
simulated or interpolated), it adds no heavy dependency (FastAPI and uvicorn are already there for
`paravt serve`), it works offline (every script and style ships in the package, no CDN), and it
draws the very same episode view as the HTML report (`paravt/report/assets/episode.js`), so a live
episode and a reported one look alike.

Modules: `routes` (the FastAPI app, the guard, each route), `episodes` (the ask body checked, the
episode run and streamed as events), `media` (--media-root files and uploads), `models` (the
backend per model field), `settings` (options and limits), `command` (`paravt app`).

HTTP interface (JSON errors are `{"error": "message"}`):
- `GET /`: the page; `GET /assets/NAME`: its scripts and styles (a fixed list).
- `GET /api/info`: defaults and limits for the form.
- `GET /api/media`: the video files under --media-root (relative paths; empty without one).
- `PUT /api/upload?name=clip.mp4`: the video as the raw body (no multipart parser needed). Over
  --max-upload-mb: 413, from Content-Length before anything is stored, else while it streams in.
  An upload that stalls (nothing for 60 s, `AppSettings.upload_idle_s`): 408, and nothing is kept.
  A file paravt cannot read as a video: 400 with the decoder's reason. Answers `{id, name, duration}`.
- `POST /api/ask` (JSON `{video: {upload: ID} | {media: REL}, question, frames, mode, model,
  question_type}`): a `text/event-stream` (read with fetch, not EventSource, so that the API key
  travels as a header) of `start`, `loading_model`, `model_ready`, then run_episode's own events
  (`overview`, `turn_started`, `think`, `generated`, `calls_dispatched`, `subcall_finished`,
  `tool_response`, `answer`, payloads as run_episode emits them), `thumbnails` (small JPEGs of the
  overview frames, cut while the model runs, any time after `overview`), then `episode` (the final
  `Episode.to_dict(tokens=False)`), or `error` {message}, and last `done`. A client that goes away
  cancels its episode. A request that is wrong before the episode starts (bad JSON, unknown mode,
  no such video, a file that is not a video) is a plain 4xx instead.
- `GET /api/episodes/ID`: a finished episode's trace (the last few are kept in memory).

Safety, because the page reads files and runs models:
- binds 127.0.0.1 unless told otherwise; bound to loopback, requests whose Host header is not a
  loopback name (localhost, ::1, any 127.0.0.0/8 address) are refused (421), so a web page cannot
  reach the app through DNS rebinding; a request with a foreign Origin is refused (403); a
  connection gets 30 s for each request's headers (`paravt.webguard`);
- `--api-key`: every /api/ request needs `Authorization: Bearer KEY`, as `paravt serve` (compared
  in constant time). The page has a key field, filled from `?key=` or `#key=` in its address (then
  removed from the address bar) and kept in the tab's sessionStorage; the page and its assets need
  no key (they hold no data). A cross-site page cannot send the request either: /api/ask wants
  `application/json` and the upload is a PUT, both of which a browser preflights, and the app
  answers no CORS;
- videos are only ever local files: an upload (stored under a private temporary folder, removed at
  exit, the oldest dropped beyond `KEEP_UPLOADS`) or a path under --media-root, resolved with its
  symlinks and refused (403) when it lands outside the root (`..`, absolute paths, links out);
  without --media-root no server path can be named at all. The rule is paravt.video.media's, as
  `paravt mcp`'s: the episode and its thumbnails open the file once and read the descriptor checked
  (a link swapped in later is refused), and only single-file videos open (no HLS playlist or concat
  list naming other files; frames of at most 8192x4320);
- the model field is trusted input: whoever may use the page may make the server load a local
  checkpoint (safetensors, via transformers) or send the episode's frames to a URL. That is the
  person at the keyboard on loopback; a non-loopback bind without --api-key is warned about. A URL
  model is called without a key (the app's own key is never forwarded to a server someone typed);
- at most `--max-episodes` episodes run at once (503 beyond); one in-process model is kept loaded.
"""

from paravt.app.command import serve_app
from paravt.app.episodes import AskRequest, overview_thumbnails, parse_ask, run_ask, sse, stream_episode
from paravt.app.media import Uploads, list_media, resolve_media
from paravt.app.models import Models, default_backend_factory
from paravt.app.routes import AppState, asset_text, create_app
from paravt.app.settings import (ASSETS, CSP, KEEP_EPISODES, KEEP_UPLOADS, MAX_ASK_BYTES, MAX_EPISODES,
                                 MAX_MEDIA_FILES, MAX_UPLOAD_MB, THUMBS, VIDEO_SUFFIXES, AppError, AppSettings,
                                 BackendFactory)

__all__ = ["ASSETS", "CSP", "KEEP_EPISODES", "KEEP_UPLOADS", "MAX_ASK_BYTES", "MAX_EPISODES",
           "MAX_MEDIA_FILES", "MAX_UPLOAD_MB", "THUMBS", "VIDEO_SUFFIXES", "AppError", "AppSettings", "AppState",
           "AskRequest", "BackendFactory", "Models", "Uploads", "asset_text", "create_app", "default_backend_factory",
           "list_media", "overview_thumbnails", "parse_ask", "resolve_media", "run_ask", "serve_app", "sse",
           "stream_episode"]
