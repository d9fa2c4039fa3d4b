import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A freshly built tiny Qwen3-VL saved with save_pretrained (seed 0); tests only read it."""
    from paravt.models.tiny import build_tiny, save_pretrained

    model, processor = build_tiny(seed=0)
    return save_pretrained(model, processor, tmp_path_factory.mktemp("tiny") / "model")
