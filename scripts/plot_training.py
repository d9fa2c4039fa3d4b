"""Loss curves of the tiny model's SFT runs (log.jsonl of each run dir) in one figure.

    python scripts/plot_training.py --out docs/tiny_sft.png LABEL=RUN_DIR[@OFFSET] ...

OFFSET shifts a run's steps, so a continuation (a new run dir started from another's
checkpoint) is drawn after the run it continues.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="LABEL=RUN_DIR[@OFFSET]")
    p.add_argument("--out", type=Path, default=Path("docs/tiny_sft.png"))
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for item in a.runs:
        label, run = item.split("=", 1)
        run, _, offset = run.partition("@")
        log = [json.loads(line) for line in (Path(run) / "log.jsonl").read_text().splitlines() if line.strip()]
        ax.plot([r["step"] + int(offset or 0) for r in log], [r["loss"] for r in log], label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per assistant token)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Tiny Qwen3-VL SFT on SynthVT-mini")
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    main()
