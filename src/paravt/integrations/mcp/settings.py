"""What `paravt mcp` is set to (McpSettings), which video a tool may open (`resolve_video`: the media
root rule of `paravt app`, paravt.video.media), and the server script lmms-eval can start (`write_script`).

lmms-eval's MCP client starts `python SERVER_PATH` with no arguments, and the MCP SDK's stdio
client hands the child only HOME, LOGNAME, PATH, SHELL, TERM and USER: no $PARAVT_MODEL, no virtual
environment, no options. So the settings travel inside the script itself, with the interpreter
that has paravt installed (the script re-executes itself under it when `python` is another one).
"""

from __future__ import annotations

import os
import pprint
import re
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from paravt.video import is_url

MODES = ("parallel", "sequential", "inline", "none")
MAX_OVERVIEW = 256  # ask_video's frames at most, unless --max-frames says otherwise
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


class ToolInputError(ValueError):
    """A tool call the server refuses or cannot serve; the message is what the client reads."""


@dataclass
class McpSettings:
    """The server's options (`paravt mcp --help` says what each does)."""

    media_root: str | None = None  # the only folder whose files a tool may open
    allow_urls: bool = False  # read http(s) video URLs (range requests); off: no URL is fetched
    model: str | None = None  # watch_window / ask_video: checkpoint dir, hub id or server URL; None: the default
    api_key: str | None = None  # bearer key for a model URL
    frames: int = 64  # ask_video's overview K when the call gives none
    max_frames: int = MAX_OVERVIEW  # ask_video's K at most
    mode: str = "parallel"  # ask_video's dispatch mode when the call gives none
    prompts: str = "paravt"  # prompt profile: paravt | official
    timeout_s: float = 600.0  # seconds one tool call may take (decoding and model calls together)
    # the one video every call reads, whatever video_path it names (paravt's rule: the model never
    # chooses the file); for a model that writes no path (paravt's own); its folder is the default root
    video: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")
        if not 1 <= self.frames <= self.max_frames:
            raise ValueError(f"frames must be from 1 to max_frames ({self.max_frames}), got {self.frames}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout_s}")
        if self.video is not None:
            video = Path(self.video).expanduser()
            if not video.is_file():
                raise ValueError(f"video {self.video}: not a file")
            self.video = str(video.absolute())
            self.media_root = self.media_root or str(video.absolute().parent)
        if self.media_root is not None:
            root = Path(self.media_root).expanduser()
            if not root.is_dir():
                raise ValueError(f"media root {self.media_root}: not a directory")
            self.media_root = str(root.absolute())
        self.episode_config()  # checks prompts (and frames) as the episode reads them

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "McpSettings":
        """Settings from a mapping (a written script's, a config file's); an unknown key is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown MCP setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def episode_config(self, **overrides: Any):
        """The EpisodeConfig the tools run with: the episode's own defaults (a crop's fps, frames and
        call budget are the sub-agent's), the profile, and the tool's deadline for each model call."""
        from paravt.agent.config import EpisodeConfig

        kw: dict[str, Any] = {"prompts": self.prompts, "model_timeout_s": self.timeout_s, "mode": self.mode,
                              "frames": self.frames}
        kw.update(overrides)
        return EpisodeConfig(**kw)


def resolve_video(settings: McpSettings, video_path: Any) -> Path | str:
    """The file (or URL) a tool call may open: an http(s) URL only with allow_urls; else a file under
    the media root by the rule `paravt app` uses too (paravt.video.media.resolve_media: no `..`, no
    link out of the root; an absolute path when it names a place under the root, as lmms-eval hands
    them out). The reader then holds the file to the root as opened (open_video)."""
    if not isinstance(video_path, str) or not video_path.strip() or "\x00" in video_path:
        raise ToolInputError("video_path must be a non-empty path to a video file")
    if is_url(video_path):
        if not settings.allow_urls:
            raise ToolInputError(f"{video_path[:200]!r}: this server reads no URLs (start it with --allow-urls)")
        return video_path
    path = video_path[len("file://"):] if video_path.startswith("file://") else video_path
    if _SCHEME.match(path):
        raise ToolInputError(f"{video_path[:200]!r}: only files under the media root (and http(s) URLs with "
                             "--allow-urls) are read")
    if settings.media_root is None:
        raise ToolInputError("this server has no media root: no file can be opened (start it with --media-root DIR)")
    from paravt.video.media import MediaRootError, resolve_media

    root = Path(settings.media_root)
    try:
        return resolve_media(root, path, absolute=True)
    except MediaRootError as e:
        where = "outside the media root" if e.outside else "not a video file under the media root"
        raise ToolInputError(f"{video_path[:200]!r} is {where} ({root}); give a path relative to it, or an "
                             "absolute path inside it") from None


SCRIPT = '''#!/usr/bin/env python
"""paravt's MCP server (crop_video, watch_window, ask_video), bound to the settings below.

Written by `paravt mcp --write-script`; an MCP client starts it as `python {name}` (lmms-eval's
`mcp_server_path=`), with no arguments and a minimal environment. When that `python` is not the
interpreter paravt is installed in, the script runs itself again under that one.
"""
import os
import sys

PYTHON = {python!r}
PREFIX = {prefix!r}
SETTINGS = {settings}

if sys.prefix != PREFIX and not os.environ.get("PARAVT_MCP_REEXEC") and os.path.exists(PYTHON):
    os.environ["PARAVT_MCP_REEXEC"] = "1"
    os.execv(PYTHON, [PYTHON, os.path.abspath(__file__), *sys.argv[1:]])

from paravt.integrations.mcp.server import main  # noqa: E402

main(SETTINGS)
'''


def write_script(path: str | Path, settings: McpSettings) -> Path:
    """Write a server script bound to `settings` and to this interpreter; returns its path. The model
    is pinned now (no model given: $PARAVT_MODEL or the shipped one, as read here), since the client
    passes no environment. A script holding an API key is readable by its owner only."""
    from paravt.ask import default_model

    d = settings.to_dict()
    if not d["model"]:
        d["model"] = default_model()
    elif not is_url(d["model"]) and Path(d["model"]).expanduser().exists():
        d["model"] = str(Path(d["model"]).expanduser().resolve())
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    text = SCRIPT.format(name=out.name, python=sys.executable, prefix=sys.prefix,
                         settings=pprint.pformat(d, sort_dicts=False))
    out.write_text(text)
    os.chmod(out, 0o700 if settings.api_key else 0o755)
    return out


def client_config(settings: McpSettings, name: str = "paravt") -> dict[str, Any]:
    """The `mcpServers` entry a desktop agent (Claude Desktop, Cursor, VS Code, ...) reads to start this
    server over stdio: this interpreter, `-m paravt mcp`, and the options that differ from the defaults."""
    args = ["-m", "paravt", "mcp"]
    default = McpSettings()
    flags = {"media_root": "--media-root", "model": "--model", "frames": "--frames", "max_frames": "--max-frames",
             "mode": "--mode", "prompts": "--prompts", "timeout_s": "--timeout", "video": "--video"}
    for key, flag in flags.items():
        value = getattr(settings, key)
        if value is not None and value != getattr(default, key):
            args += [flag, str(value)]
    if settings.allow_urls:
        args.append("--allow-urls")
    entry: dict[str, Any] = {"command": sys.executable, "args": args}
    if settings.api_key:  # the environment, not the command line (which `ps` shows)
        entry["env"] = {"PARAVT_API_KEY": settings.api_key}
    return {"mcpServers": {name: entry}}
