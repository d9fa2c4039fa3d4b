"""A run directory's files as they are written: results.jsonl, one row per finished sample, each
fsynced before it counts, and read back by a resume however a crash left it; any other file whole or
not at all. A file that cannot be read or written raises OutputError naming it."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import contextmanager
from pathlib import Path

RESULTS = "results.jsonl"


class OutputError(RuntimeError):
    """A file of the run directory could not be read or written; the message is `<path>: <cause>`."""

    def __init__(self, path: str | Path, err: OSError):
        self.path, self.err = Path(path), err
        super().__init__(f"{path}: {err.strerror or err}")


@contextmanager
def disk_errors(path: str | Path):
    """Turn an OSError on `path` (ENOSPC, EFBIG, EACCES, EROFS, ...) into an OutputError naming it."""
    try:
        yield
    except OSError as e:
        raise OutputError(path, e) from None


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` whole or not at all (a manifest cut short would block the resume)."""
    tmp = path.with_name(path.name + ".tmp")
    with disk_errors(path):
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    with disk_errors(path):
        path.write_text(text)


# ----------------------------------------------------------------------------------------------
# results.jsonl


def read_results(path: str | Path, repair: bool = True) -> list[dict]:
    """Every complete row of results.jsonl, in file order.

    A last line without its newline is the trace of a crash mid-write: cut off (repair=True) so
    the next append starts on a fresh line; if it happens to be complete JSON it is kept and its
    newline restored. A garbled line inside the file is skipped, never a reason to drop the rows
    after it."""
    path = Path(path)
    if not path.exists():
        return []
    with disk_errors(path):
        data = path.read_bytes()
    rows: list[dict] = []
    cut = len(data) if not data or data.endswith(b"\n") else data.rfind(b"\n") + 1
    body, tail = data[:cut], data[cut:]
    for line in body.split(b"\n"):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if tail:
        try:
            rows.append(json.loads(tail))
            fix = "newline"
        except json.JSONDecodeError:
            fix = "truncate"
        if repair:
            with disk_errors(path), open(path, "r+b") as f:
                if fix == "truncate":
                    f.truncate(len(data) - len(tail))
                else:
                    f.seek(0, os.SEEK_END)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
    return [r for r in rows if isinstance(r, dict) and "id" in r]


def latest_rows(rows: list[dict]) -> dict[str, dict]:
    """One row per sample id: the last one written (a retried sample's newest result)."""
    out: dict[str, dict] = {}
    for r in rows:
        out[str(r["id"])] = r
    return out


class ResultWriter:
    """Appends rows to results.jsonl, each fsynced before `write` returns. A failed write is cut
    back off the file (when the file system allows) and every later write raises the same
    OutputError: after a failure nothing more is written."""

    def __init__(self, path: Path):
        self.path = path
        with disk_errors(path):
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = asyncio.Lock()
        self.failed: OutputError | None = None

    def _write(self, data: bytes) -> None:
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:  # unbuffered: nothing is left in a buffer to be flushed (or fail) later
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as e:
            try:
                os.ftruncate(self._fd, end)  # no torn row (a resume would also cut it off)
            except OSError:
                pass
            raise OutputError(self.path, e) from None

    async def write(self, row: dict) -> None:
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        async with self._lock:  # one writer at a time; the fsync runs off the event loop
            if self.failed is not None:
                raise self.failed
            try:
                await asyncio.to_thread(self._write, data)
            except OutputError as e:
                self.failed = e
                raise

    def close(self) -> None:
        os.close(self._fd)
