"""The paper's Table 2 (arXiv 2605.20342) on the paradox testbeds (docs/paradox.md), end to end and resumable.

From a testbed's cold start (scripts/paradox_testbed.py: a base with its own tool habit, then a short SFT onto
paravt's format), the RL runs of the paper's Table 2:

    block A  vanilla GRPO (the release's: no gating, no anchoring, think prefix and answer suffix off),
             PARA-GRPO                                                      two seeds each
    block B  anchoring only (PARA-GRPO without gating), gating only (without anchoring),
             PARA-GRPO − R_tool (reward.w_tool=0), PARA-GRPO − γ (reward.gamma=0)     one seed each
    block C  the first PARA-GRPO seed's checkpoint dispatched parallel, sequential, inline, none
    after    PARA-GRPO under vanilla's prompt settings (no think prefix, no answer suffix)   one seed

Every block B run differs from PARA-GRPO in the component it names and nothing else: its prompt keeps the think
prefix and the answer suffix. Vanilla differs from PARA-GRPO in gating, anchoring and those two prompt settings,
as the public release's baseline does.

    python scripts/paradox.py --stage train --jobs 2        # the RL runs, two at a time
    python scripts/paradox.py --stage eval                  # held-out accuracy of each model
    python scripts/paradox.py --stage doc                   # tables, curves, claims -> docs/paradox_log.md
    python scripts/paradox.py --stage status                # where each run and eval cell stands

`--testbed gap` runs the second testbed's 2×2 instead (issue #37): 100-step vanilla GRPO runs from {cold_400
(`paradox-cold`), the skip cold start (`--skip-cold`)} × {paravt's reward, the release's
(`reward.release_compat=true`)}, into runs/paradox_gap. `--testbed collapse` runs blocks A and B from `--cold`
under `--set` into runs/paradox_collapse. A campaign on another cold start or condition goes into its own folder,
section and figures (`--out`), e.g. the condition the page's newest rows come from:

    python scripts/paradox.py --testbed collapse --cold runs/paradox_testbed/skipcold_400 \
        --set reward.release_compat=true --set episode.on_bad_call=end --set reward.tool_correct_bonus=0 \
        --out runs/paradox_collapse_nobonus --stage train --jobs 2          # then --stage eval, --stage doc

Each campaign's section of docs/paradox_log.md lies between its own markers; `--stage doc` rewrites that section
and its two figures and nothing else. Each train and eval stage is a `paravt` command per cell (printed before it
runs, so any cell can be rerun by hand); all of them resume. The held-out cells run `paravt eval run`'s own
episode settings (greedy, `episode.on_bad_call: respond`, 320 new tokens a turn), whatever `--set` gave the runs.

The code: paradox_campaign.py (the run families and their commands), paradox_read.py (the records read back),
paradox_tables.py (the tables and claims), paradox_page.py (the log page and figures); scripts/paradox_archive.py
keeps a campaign's records in docs/paradox_runs.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the modules beside this file, however it is loaded
from paradox_campaign import (ROOT, eval_jobs, family_seeds, print_status, run,  # noqa: E402
                              silent_twins, train_jobs)
from paradox_page import smooth, write_doc  # noqa: E402,F401  (smooth: for scripts/rl_proof.py)
from paradox_read import read_jsonl  # noqa: E402,F401  (for scripts/rl_proof.py)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, default=ROOT / "src/paravt/assets/paradox-base")
    p.add_argument("--cold", type=Path, default=ROOT / "src/paravt/assets/paradox-cold")
    p.add_argument("--testbed", choices=["table2", "gap", "collapse"], default="table2",
                   help="table2: the first testbed's Table 2 runs; gap: the second testbed's vanilla 2×2 (issue #37); "
                        "collapse: Table 2 A–B from --cold under --set, the 2×2's condition whose tools collapse")
    p.add_argument("--skip-cold", type=Path, default=Path("runs/paradox_testbed/skipcold_400"),
                   help="the skip cold start (scripts/paradox_testbed.py --stage skip), for --testbed gap")
    p.add_argument("--skip-label", default="skip cold start",
                   help="--testbed gap: how the tables name --skip-cold and its runs")
    p.add_argument("--train", type=Path, default=None,
                   help="RL rows (default: data/paradox_train; gap: data/paradox_skip_train, the same questions)")
    p.add_argument("--test", type=Path, default=Path("data/paradox_test"))
    p.add_argument("--out", type=Path, default=None,
                   help="default: runs/paradox (gap: runs/paradox_gap, collapse: runs/paradox_collapse)")
    p.add_argument("--docs", type=Path, default=ROOT / "docs",
                   help="the folder of the log page (paradox_log.md) and its figures")
    p.add_argument("--config", type=Path, default=ROOT / "src/paravt/configs/grpo_tiny.yaml")
    p.add_argument("--steps", type=int, default=None, help="RL steps a run (default 300; gap: 100)")
    p.add_argument("--set", action="append", default=[], help="an override for every RL run (KEY=VALUE)")
    p.add_argument("--runs", type=lambda s: s.split(","), default=[], help="run ids or families (default: all)")
    p.add_argument("--seeds", type=family_seeds, action="append", default=[],
                   help="FAMILY=1,2,3: that family's seeds (default: the testbed's own)")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    p.add_argument("--k-choices", dest="k_choices", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4, 8, 16, 32, 64])
    p.add_argument("--limit", type=int, default=200, help="held-out questions per accuracy cell")
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--jobs", type=int, default=2, help="commands at once (one torch thread each)")
    p.add_argument("--smooth", type=int, default=10)
    p.add_argument("--stage", choices=["all", "train", "eval", "doc", "status"], default="all")
    a = p.parse_args()
    second = a.testbed in ("gap", "collapse")  # the second testbed's questions, the skip oracle's rows
    a.train = a.train or Path("data/paradox_skip_train" if second else "data/paradox_train")
    a.out = a.out or Path({"gap": "runs/paradox_gap", "collapse": "runs/paradox_collapse"}.get(a.testbed, "runs/paradox"))
    a.steps = a.steps or (100 if a.testbed == "gap" else 300)
    script = Path(sys.executable).parent / "paravt"
    a.paravt = [str(script)] if script.exists() else [sys.executable, "-m", "paravt"]
    if a.stage == "status":
        return print_status(a)
    failed = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        if a.stage in ("all", "train"):
            for name in sorted(silent_twins(a)):
                print(f"not training {name}: under the release's reward no anchor term fires (docs/rewards.md), so it "
                      "would be PARA-GRPO again (--runs names it to train it anyway)", flush=True)
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), train_jobs(a)))
        if a.stage in ("all", "eval"):
            failed += sum(rc != 0 for rc in pool.map(lambda j: run(*j), eval_jobs(a)))
    if a.stage in ("all", "doc"):
        print(write_doc(a))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
