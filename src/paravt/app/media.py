"""Where the page's videos come from: files under --media-root (resolved with their symlinks,
never outside the root) and uploads (a private folder, random ids, the oldest dropped)."""

import os
import uuid
from collections import OrderedDict
from pathlib import Path

from paravt.app.settings import KEEP_UPLOADS, MAX_MEDIA_FILES, VIDEO_SUFFIXES, AppError


def resolve_media(root: Path, rel: str) -> Path:
    """The file `rel` names under `root`, symlinks resolved: paravt.video.media's rule, as an
    AppError (403 outside the root: absolute, `..`, a link out; 404 no such file; 400 no path).
    The page only ever sends what /api/media listed, but the check is here, on the server; the
    episode then opens the file with the root held (VideoReader's media_root), so a link swapped in
    after this check is refused too."""
    from paravt.video.media import MediaRootError
    from paravt.video.media import resolve_media as resolve

    try:
        return resolve(root, rel)
    except MediaRootError as e:
        status = 403 if e.outside else 400 if str(e) == "no media path given" else 404
        raise AppError(status, str(e)) from None


def list_media(root: Path, limit: int = MAX_MEDIA_FILES) -> tuple[list[str], bool]:
    """(relative paths of the video files under `root`, whether the list was cut at `limit`).
    Hidden folders are skipped and folder links are not followed; a file link that points out of
    the root is left out (it could not be opened anyway)."""
    base = root.resolve()
    found: list[str] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(VIDEO_SUFFIXES):
                continue
            path = Path(folder) / name
            if not path.resolve().is_relative_to(base):
                continue
            found.append(path.relative_to(base).as_posix())
            if len(found) >= limit:
                return found, True
    return found, False



def safe_name(name: str) -> str:
    """The uploaded file's own name, for display only (never used as a path)."""
    name = os.path.basename(str(name or "").replace("\\", "/")).strip()
    return "".join(c for c in name if c.isprintable())[:200] or "upload"


class Uploads:
    """Uploaded videos in a private folder, under random ids; at most `keep` of them."""

    def __init__(self, folder: Path, keep: int = KEEP_UPLOADS):
        self.folder = folder
        self.keep = keep
        self.items: "OrderedDict[str, tuple[Path, str]]" = OrderedDict()  # id -> (file, display name)

    def new_path(self, name: str) -> tuple[str, Path]:
        suffix = Path(name).suffix.lower()
        suffix = suffix if suffix in VIDEO_SUFFIXES else ".bin"  # the decoder reads the content, not the name
        uid = uuid.uuid4().hex
        return uid, self.folder / f"{uid}{suffix}"

    def add(self, uid: str, path: Path, name: str) -> None:
        self.items[uid] = (path, name)
        while len(self.items) > self.keep:
            _, (old, _) = self.items.popitem(last=False)
            old.unlink(missing_ok=True)  # an episode still reading it keeps its open file (POSIX)

    def get(self, uid: str) -> tuple[Path, str]:
        if not isinstance(uid, str) or uid not in self.items:
            raise AppError(404, "no such upload (uploads are kept while the app runs, the last "
                           f"{self.keep}): upload the video again")
        return self.items[uid]

