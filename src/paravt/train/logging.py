"""Run logs of the trainers: an append-only JSONL file (one object per logged step) and
TensorBoard event files with the same scalars, so a run can be read with `jq`, pandas or
TensorBoard alike. On resume, log.jsonl goes on from the restored step (a run that died between
logging and checkpointing would otherwise log those steps twice), and TensorBoard shows it so; the
entries a resume leaves behind are never lost: the whole earlier file is kept beside it first, as
log.1.jsonl (then log.2.jsonl, ...), and a run that starts over (no checkpoint) keeps it the same
way. rollouts.jsonl is resumed by the same rule (resume_jsonl)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _step_of(line: str) -> int | None:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:  # a line cut by a crash
        return None
    return int(rec.get("step", 0)) if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) else None


def resume_jsonl(path: Path, step: int) -> Path | None:
    """Leave in `path` only its entries of steps up to `step` (the checkpoint a run resumes from; 0 for a
    run that starts over), losing none: when any other line is there (a step after the checkpoint, a line
    cut by a crash), the whole file is first kept as `<stem>.<n><suffix>` (the first n free), which is
    returned; None when nothing had to go."""
    if not path.exists():
        return None
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    kept = [line for line in lines if (s := _step_of(line)) is not None and s <= step]
    if len(kept) == len(lines):
        return None
    n = 1
    while (keep := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    os.replace(path, keep)  # the earlier file whole, before anything is written
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return keep


def resume_note(path: Path, kept_in: Path, step: int) -> str:
    """What resume_jsonl did, for the run's console."""
    if step == 0:
        return (f"{path.name}: the earlier run's entries (it left no checkpoint) are kept in {kept_in.name}; this run "
                "starts over at step 1")
    return (f"{path.name}: its entries after step {step} (no checkpoint holds them) are kept with the rest in "
            f"{kept_in.name}; {path.name} goes on from step {step}")


def _scalar(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


class RunLogger:
    """Writes `metrics` per step to OUT/log.jsonl and OUT/tb (scalars as `<namespace>/<key>`)."""

    def __init__(self, out: str | Path, namespace: str, resume_step: int = 0, enabled: bool = True, console=None):
        self.out = Path(out)
        self.namespace = namespace
        self.enabled = enabled
        self.path = self.out / "log.jsonl"
        self._writer = None
        self._file = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.out.mkdir(parents=True, exist_ok=True)
        kept_in = resume_jsonl(self.path, resume_step)
        if kept_in is not None and console is not None:
            console.print(f"[dim]{resume_note(self.path, kept_in, resume_step)}[/dim]", highlight=False)
        self._file = open(self.path, "a")
        earlier = (self.out / "tb").is_dir() and any((self.out / "tb").iterdir())  # a run starting over, too
        self._writer = SummaryWriter(str(self.out / "tb"), purge_step=resume_step + 1 if resume_step or earlier else None)

    def log(self, step: int, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None) -> None:
        if not self.enabled:
            return
        record = {"step": step, **metrics}
        self._file.write(json.dumps(record, default=float) + "\n")
        self._file.flush()
        for k, v in metrics.items():
            s = _scalar(v)
            if s is not None:
                self._writer.add_scalar(f"{self.namespace}/{k}", s, step)
        for k, values in (histograms or {}).items():
            if values:
                import numpy as np

                self._writer.add_histogram(f"{self.namespace}/{k}", np.asarray(values, dtype=float), step)
        self._writer.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        if self._writer:
            self._writer.close()
            self._writer = None


def read_log(out: str | Path) -> list[dict]:
    """The JSONL records of a run directory."""
    path = Path(out) / "log.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
