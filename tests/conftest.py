import pytest


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
