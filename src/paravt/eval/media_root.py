"""What a data row may make `paravt eval` open. Annotation files come from elsewhere and name their
videos themselves (an id, a relative path, an absolute one, `..` included), so with `--media-root DIR`
a row's video is opened only when it is a file under DIR, by the media-root rule `paravt app` and
`paravt mcp` share; a row naming anything else is that sample's error row and the others run
(docs/data.md)."""

from __future__ import annotations

from pathlib import Path

from paravt.video import VideoError


def relative_to_root(root: Path, video_path: str) -> str | None:
    """The part of `video_path` (absolute, or relative to the working folder) below `root` as given or
    with its links resolved, or None where the name leaves it (elsewhere, or a `..`). Only the names
    are compared: whether the file may be opened (a link out, say) is the media-root rule's call."""
    path = Path(video_path)
    if not path.is_absolute():
        path = Path.cwd() / path  # no normalising: a `..` stays for the rule to refuse
    for base in (root.absolute(), root.resolve()):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        if rel.parts and ".." not in rel.parts:
            return rel.as_posix()
    return None


def held_video(root: Path | None, video_path: str) -> str:
    """The file a sample's episode opens for the row's `video_path`: the path itself without a media
    root; with one, the file the media-root rule resolves it to under `root`, or VideoError naming the
    row's path (every row so refused reads alike, so the summary counts them as one cause). The
    sample's reader then opens it with the root held (VideoReader's media_root), so a link swapped in
    after this check is refused too."""
    if root is None:
        return video_path
    refused = VideoError(f"{video_path} is outside --media-root {root}: a data row may name only files under it")
    rel = relative_to_root(root, video_path)
    if rel is None:
        raise refused
    from paravt.video.media import MediaRootError, resolve_media

    try:
        return str(resolve_media(root, rel))  # the shared media-root rule: the one check of a row's name
    except MediaRootError as e:
        if e.outside:
            raise refused from None
        raise VideoError(f"{video_path}: no video file there under --media-root {root}") from None
