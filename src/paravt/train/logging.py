"""Run logs of the trainers: an append-only JSONL file (one object per logged step) and
TensorBoard event files with the same scalars, so a run can be read with `jq`, pandas or
TensorBoard alike. On resume, entries past the restored step are dropped from both (a run that
died between logging and checkpointing would otherwise log those steps twice)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _scalar(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


class RunLogger:
    """Writes `metrics` per step to OUT/log.jsonl and OUT/tb (scalars as `<namespace>/<key>`)."""

    def __init__(self, out: str | Path, namespace: str, resume_step: int = 0, enabled: bool = True):
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
        if self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:  # a line cut by a crash
                    continue
            self.path.write_text("".join(k + "\n" for k in kept))
        self._file = open(self.path, "a")
        self._writer = SummaryWriter(str(self.out / "tb"), purge_step=resume_step + 1 if resume_step else None)

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
