"""What `paravt app`'s options set and the errors it answers with: one place for its limits."""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from paravt.backends.base import Backend

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")
ASSETS = ("app.html", "app.js", "app.css", "episode.js", "episode.css")  # in paravt/report/assets
MAX_UPLOAD_MB = 512
UPLOAD_IDLE_S = 60.0  # an upload that sends nothing for this long is given up (408): a slow one goes on
MAX_ASK_BYTES = 256 * 1024  # a question is text; anything larger is not one
KEEP_UPLOADS = 16  # uploaded videos kept on disk; the oldest goes first
KEEP_EPISODES = 32  # finished traces kept for GET /api/episodes/ID
MAX_MEDIA_FILES = 5000  # files /api/media lists (a huge tree is cut, and says so)
MAX_EPISODES = 2  # episodes at once: each one holds a decoder and a share of the model's batch
THUMBS = 16  # overview thumbnails per episode, as the report's default
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# (model name or None for the default) -> Backend; runs in a worker thread (loading takes a while)
BackendFactory = Callable[[Optional[str]], Backend]


class AppError(Exception):
    """A request the app refuses, with its HTTP status and a message for the page."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class AppSettings:
    """What `paravt app`'s options set (paravt.app's docstring says what each guards)."""

    media_root: Optional[Path] = None
    max_upload_bytes: int = MAX_UPLOAD_MB * 1024 * 1024
    upload_idle_s: float = UPLOAD_IDLE_S
    api_key: Optional[str] = None
    default_model: Optional[str] = None  # None: $PARAVT_MODEL, else the shipped model (as paravt ask)
    default_frames: int = 64
    max_episodes: int = MAX_EPISODES
    loopback_hosts_only: bool = False  # refuse a Host header that is not a loopback name (DNS rebinding)

