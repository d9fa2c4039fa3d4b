"""What ties an eval folder's rows to the data they scored, and to the one run writing them.

The manifest pins the settings; this pins each sample's inputs: a digest of its question, options,
answer, type, subtitles and video file (path, size, modification time) goes into its row, and a
resumed run redoes a sample whose digest changed (an annotation corrected, a video replaced) instead
of keeping a stale score. Rows of earlier versions carry no digest: their answer, question type and
video path are compared instead. A lock (`lockf` on OUT/.lock) keeps a second process off a folder
that one is writing to: two writers would append the same samples twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paravt.eval.benchmarks import Sample

LOCK = ".lock"


def input_digest(s: "Sample") -> str:
    """A digest of everything a sample's score depends on besides the settings."""
    try:
        st = os.stat(s.video_path)
        video = [s.video_path, st.st_size, st.st_mtime_ns]
    except OSError:
        video = [s.video_path, None, None]
    subtitles = asdict(s.subtitles) if s.subtitles is not None else None
    what = {"question": s.question, "options": s.options, "answer": s.answer, "type": s.question_type,
            "subtitles": subtitles, "video": video}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def inputs_changed(row: dict, s: "Sample") -> bool:
    """Whether the sample `row` scored is not the sample `s` any more."""
    if "inputs" in row:
        return row["inputs"] != input_digest(s)
    return (row.get("answer"), row.get("question_type"), row.get("video_path")) != (s.answer, s.question_type,
                                                                                  s.video_path)


class RunLock:
    """An exclusive lock on an eval folder for the life of a run (released by the OS if it dies)."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:  # a POSIX record lock: held per process, so a run of this process that was cut short
            # (KeyboardInterrupt leaves its task pending, its lock unreleased until collected) does
            # not lock the next one out; another process is refused
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirBusy(f"{self.path.parent} is in use by another paravt eval (pid {holder}); wait for it to "
                             "end, or write to another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunDirBusy(RuntimeError):
    pass
