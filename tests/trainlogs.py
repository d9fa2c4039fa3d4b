"""Reading a training run's JSONL logs in tests."""

import json
from pathlib import Path


def steps_in(path: Path) -> list[int]:
    """The steps of a JSONL log's entries, in file order."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]
