import os

import pytest


def pytest_configure(config):
    """Under pytest-xdist (three workers, see pyproject.toml) each worker computes on one core:
    torch's intra-op threads at 1, and so do the processes a test starts. The opt-in runs
    (`-m vllm`, `-m lmms_eval`) keep their threads: a vLLM server on one thread is needlessly slow."""
    opt_in = "not vllm" not in (config.option.markexpr or "")
    if os.environ.get("PYTEST_XDIST_WORKER") and not opt_in:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)


def pytest_sessionstart(session):
    """At exit (after pytest's own last collection) the collector is kept off what is still alive, as
    paravt's CLI does (`paravt.cli._freeze_at_exit`): a worker holds ~400 k objects once it has loaded a
    model, and interpreter finalisation spent ~1.4 CPU-s collecting them."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def pytest_collection_modifyitems(config, items):
    """The files that hold `slow` tests (processes, servers, training runs: a minute or more each) run
    first. xdist hands whole files to its workers in collection order (`--dist loadfile
    --no-loadscope-reorder`, pyproject.toml); its own order, by test count, started these last, and the
    run ended with one worker finishing a long file alone while the other core idled."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each file is kept


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A freshly built tiny Qwen3-VL saved with save_pretrained (seed 0); tests only read it."""
    from paravt.models.tiny import build_tiny, save_pretrained

    model, processor = build_tiny(seed=0)
    return save_pretrained(model, processor, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def mini_split(tmp_path_factory):
    """A small SynthVT-mini train split (8 questions, seed 0) written by the CLI, as a user makes one."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("mini") / "data"
    subprocess.run([sys.executable, "-m", "paravt", "synth", "--preset", "mini", "--out", str(out), "--n", "8",
                    "--split", "train", "--seed", "0"], check=True, capture_output=True)
    return out


@pytest.fixture
def ctrl_c(monkeypatch):
    """A real SIGINT (the terminal's Ctrl-C) right after a training run has logged the step that the
    returned dict's "step" names (None: never)."""
    import signal

    from paravt.train.logging import RunLogger

    log, when = RunLogger.log, {"step": None}

    def logged(self, at, *a, **k):
        log(self, at, *a, **k)
        if at == when["step"]:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(RunLogger, "log", logged)
    return when


CHROMIUM = "/usr/bin/chromium"  # Debian's; Playwright never downloads a browser here
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright, or a skip that says what is missing."""
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                                                 "(pip install -e '.[test]')")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# What a skip needs to run instead, by a phrase of its reason: printed under the skips at the end.
SKIP_HINTS = (
    ("no chromium", "`make test` installs Debian's chromium where it runs as root (or with sudo) and apt is "
                    "there; elsewhere: sudo apt-get install chromium"),
    ("playwright", "pip install -e '.[test]'"),
    ("vLLM", "opt-in: build .venv-vllm (see tests/test_vllm.py), then pytest -m vllm"),
    ("root writes", "run the suite as a user other than root"),
)


@pytest.hookimpl(trylast=True)  # after --durations: the last lines before the totals
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """At the end of the run, what was skipped and why: one line per reason with its count and the
    files it hit, and what would run it (SKIP_HINTS), so a green run says what it did not prove."""
    from collections import defaultdict

    groups: dict[str, list[str]] = defaultdict(list)
    for rep in terminalreporter.stats.get("skipped", []):
        if getattr(rep, "wasxfail", None) is not None:
            continue
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        groups[reason.removeprefix("Skipped: ")].append(rep.nodeid.split("::")[0])
    if not groups:
        return
    total = sum(len(v) for v in groups.values())
    terminalreporter.section(f"skipped: {total} test{'s' if total != 1 else ''}, and why", sep="-")
    for reason, where in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        files = ", ".join(f"{f} ({where.count(f)})" for f in dict.fromkeys(where))
        terminalreporter.write_line(f"{len(where):3d}  {reason}  [{files}]")
        hint = next((h for phrase, h in SKIP_HINTS if phrase in reason), None)
        if hint:
            terminalreporter.write_line(f"     to run them: {hint}")
