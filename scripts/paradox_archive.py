"""A paradox campaign's run records, small enough to keep in the repository, and back under runs/.

runs/ is not part of the repository, and a machine that loses it loses every run docs/paradox_log.md's
generated tables are read from: the doc stage (scripts/paradox.py --stage doc) can then only blank
their rows, and a later seed cannot join the seed means. `pack` keeps what the doc stage reads, one
gzipped tar per model: the RL run's config, log and rollouts (without the generated texts, which are
most of their bytes) and each eval cell's rows (without the episode trace), 0.2–0.3 MB a run.
Checkpoints stay out: they are rebuilt by training, not needed to read a run. `unpack` puts the
records back under the campaign's folder and never writes over a file that is there.

    python scripts/paradox_archive.py pack runs/paradox_collapse_nobonus600     # -> docs/paradox_runs/...
    python scripts/paradox_archive.py unpack runs/paradox_collapse_nobonus600   # then --stage doc as before
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paradox_read import read_jsonl  # noqa: E402  (the reader that skips a half-written line)

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "docs" / "paradox_runs"
# file name -> the fields dropped from each of its JSON lines
KEPT = {"config.json": (), "log.jsonl": (), "rollouts.jsonl": ("main_texts",), "results.jsonl": ("episode",),
        "summary.json": (), "manifest.json": ()}


def model_files(out: Path, model: str) -> list[Path]:
    """The files of one model's records: its RL run (if trained) and its eval cells."""
    dirs = [out / "rl" / model] + sorted((out / "eval").glob(f"{model}__*"))
    return [d / name for d in dirs for name in KEPT if (d / name).is_file()]


def slim(path: Path) -> bytes:
    """The file's bytes with the dropped fields taken out of each line; a half-written last line (a run
    still appending) is left out rather than kept broken."""
    drop = KEPT[path.name]
    if not drop:
        return path.read_bytes()
    return "".join(json.dumps({k: v for k, v in row.items() if k not in drop}) + "\n"
                   for row in read_jsonl(path)).encode()


def models_in(out: Path) -> list[str]:
    names = {d.name for d in (out / "rl").glob("*") if d.is_dir()}
    names |= {d.name.split("__")[0] for d in (out / "eval").glob("*__*") if d.is_dir()}
    return sorted(names)


def pack(out: Path, store: Path, models: list[str] | None = None) -> list[Path]:
    """One `<store>/<campaign>/<model>.tar.gz` per model, written anew (a pack after more steps replaces
    the earlier one); paths inside are relative to the campaign's folder. Paths under the checkout the runs
    came from are written relative to it, as the page's commands give them; any other mention of that
    folder is refused: a machine's paths are not to be committed."""
    if out.resolve().parent.name != "runs":  # the checkout is what its paths are made relative to
        raise SystemExit(f"{out}: a campaign's folder is <checkout>/runs/<campaign>")
    machine = str(out.resolve().parents[1]).encode()  # the checkout holding runs/<campaign>
    dest = store / out.name
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for model in models or models_in(out):
        files = model_files(out, model)
        if not files:
            raise SystemExit(f"{out}: nothing recorded for {model!r}")
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for f in files:
                data = slim(f).replace(machine + b"/", b"")
                if machine in data:
                    raise SystemExit(f"{f} names {machine.decode()}: a machine path, not packed")
                info = tarfile.TarInfo(str(f.relative_to(out)))
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        path = dest / f"{model}.tar.gz"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)  # a full disk leaves the earlier pack whole
        written.append(path)
    return written


# a pack holds regular files at <rl|eval>/<run or cell>/<one of KEPT>, and nothing else
FOLDERS = ("rl", "eval")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
MAX_FILE_BYTES = 64 << 20  # the largest record kept so far is a 4 MB rollouts.jsonl
MAX_PACK_BYTES = 256 << 20
MAX_MEMBERS = 4096  # a model's RL run (3 records) and its eval cells (3 each): 12 in the packs kept so far
MAX_HEADER_BYTES = 64 << 10  # a pax or GNU long-name header: a long file name, not megabytes
BROKEN = (tarfile.TarError, EOFError, OSError)  # gzip's and tarfile's own complaints of a broken pack


class _BoundedInfo(tarfile.TarInfo):
    """A member header whose extended header (pax, GNU long name) is refused by its declared size before
    tarfile reads it into memory: a small pack could declare gigabytes of it."""

    def _proc_member(self, tarfile_):
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                         tarfile.GNUTYPE_LONGLINK) and self.size > MAX_HEADER_BYTES:
            raise tarfile.HeaderError(f"an extended header of {self.size} bytes")
        return super()._proc_member(tarfile_)


def _open_pack(p: Path) -> tarfile.TarFile:
    try:  # tarfile reads the first member's header here
        return tarfile.open(p, "r:gz", tarinfo=_BoundedInfo)
    except BROKEN as e:
        raise SystemExit(f"{p}: not a readable records pack ({type(e).__name__}: {e}): nothing unpacked") from None


def _check_member(p: Path, m: tarfile.TarInfo, names: set[str]) -> None:
    parts = m.name.split("/")
    if not (m.isreg() and len(parts) == 3 and parts[0] in FOLDERS and NAME.fullmatch(parts[1]) and parts[2] in KEPT):
        raise SystemExit(f"{p}: {m.name!r} is not a run record (a file at <rl|eval>/<run>/<record>): "
                         "nothing unpacked from this pack")
    if m.name in names:
        raise SystemExit(f"{p}: {m.name} is in the pack twice: nothing unpacked from this pack")
    names.add(m.name)


def _checked(p: Path, tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The pack's members if every one is a file of the records' shape within the size and count
    bounds, read one header at a time so that a pack is refused at its first wrong member, or its
    MAX_MEMBERS + 1st, before it costs memory or minutes. Checked here rather than left to tarfile's
    "data" filter: records are meant to be shared, and the filter of Pythons before 3.11.13 / 3.12.11 /
    3.13.4 lets a crafted chain of links write outside the folder (CVE-2025-4517); a pack that needs no
    link, device or folder entry gets none."""
    members, names, total = [], set(), 0
    try:
        for m in tar:
            if len(members) == MAX_MEMBERS:
                raise SystemExit(f"{p}: more than {MAX_MEMBERS} members, more than a model's records hold: "
                                 "nothing unpacked from this pack")
            _check_member(p, m, names)
            total += m.size
            if m.size > MAX_FILE_BYTES or total > MAX_PACK_BYTES:
                raise SystemExit(f"{p}: {m.name} would unpack to more than a run record holds ({MAX_FILE_BYTES >> 20} "
                                 f"MB a file, {MAX_PACK_BYTES >> 20} MB a pack): nothing unpacked")
            members.append(m)
    except BROKEN as e:
        raise SystemExit(f"{p}: not a readable records pack ({type(e).__name__}: {e}): nothing unpacked") from None
    return members


def unpack(out: Path, store: Path) -> tuple[list[Path], list[Path]]:
    """The records under `<store>/<campaign>` back into `out`; a file already there is kept, not
    overwritten (a run folder with more steps than its record holds is the newer one). Writes only
    regular files below `out`, never through a link."""
    src = store / out.name
    packs = sorted(src.glob("*.tar.gz"))
    if not packs:
        raise SystemExit(f"no records of {out.name} in {src}")
    out.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for p in packs:
        with _open_pack(p) as tar:
            for m in _checked(p, tar):
                target = out / m.name
                if os.path.lexists(target):
                    kept.append(target)
                    continue
                for d in (out / m.name.split("/")[0], target.parent):
                    if d.is_symlink():
                        raise SystemExit(f"{d} is a link: records are written into real folders only")
                    d.mkdir(exist_ok=True)
                data = tar.extractfile(m).read(MAX_FILE_BYTES + 1)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data[: m.size])
                written.append(target)
    return written, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["pack", "unpack"])
    ap.add_argument("out", type=Path, help="the campaign's folder, e.g. runs/paradox_collapse_nobonus")
    ap.add_argument("--models", type=lambda s: s.split(","), default=None, help="pack only these (default: all)")
    ap.add_argument("--store", type=Path, default=STORE)
    a = ap.parse_args(argv)
    if a.action == "pack":
        for p in pack(a.out, a.store, a.models):
            print(f"{p}  {p.stat().st_size / 1e3:.0f} KB")
    else:
        written, kept = unpack(a.out, a.store)
        print(f"{len(written)} files written under {a.out}; {len(kept)} already there, kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
