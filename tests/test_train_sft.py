import json

import pytest
import torch

from paravt import protocol as P
from paravt.backends.hf import Renderer
from paravt.models.tiny import build_tiny
from paravt.synth.dataset import SynthConfig, build_split
from paravt.train.sft import IGNORE, SFTConfig, encode_row, train_sft
from videotools import make_test_video


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "train"
    build_split(out, SynthConfig(n=6, seed=4, split="train", min_len=60, max_len=80, oracle_k=(4,)))
    return out


def test_labels_cover_assistant_tokens_only(tmp_path):
    _, processor = build_tiny()
    r = Renderer(processor)
    make_test_video(tmp_path / "v.mp4", seconds=10, fps=2)
    row = {"video": "v.mp4", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "text", "text": "<1.0 seconds>"}, {"type": "frame", "time": 1.0},
                                     {"type": "text", "text": "Q?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": P.THINK_PREFIX + "red.</think><answer>A</answer>"}]},
    ]}
    ex = encode_row(row, r, tmp_path)
    trained = [t for t, l in zip(ex.ids, ex.labels) if l != IGNORE]
    assert trained == r.encode("red.</think><answer>A</answer>") + [r.im_end]
    assert len(ex.images) == 1 and ex.ids.count(r.image_pad) == r.image_tokens(ex.images[0])
    # the forced prefix is present in the input but not a target
    think = r.encode(P.THINK_PREFIX)
    i = ex.ids.index(think[0])
    assert all(l == IGNORE for l in ex.labels[i:i + len(think)])


def test_two_steps_change_parameters_and_resume(split, tmp_path):
    cfg = SFTConfig(model="tiny", data=str(split / "sft.parquet"), out=str(tmp_path / "run"), steps=2, log_every=1,
                    save_every=2, lr=1e-3, warmup_steps=0)
    before, _ = build_tiny(seed=0)
    last = train_sft(cfg)
    assert last["step"] == 2 and torch.isfinite(torch.tensor(last["loss"])) and last["target_tokens"] > 0
    from paravt.models import load_model

    after, _ = load_model(str(tmp_path / "run" / "checkpoint"))
    changed = [n for (n, a), (_, b) in zip(before.state_dict().items(), after.state_dict().items()) if not torch.equal(a, b)]
    assert changed
    cfg.steps = 3
    assert train_sft(cfg)["step"] == 3  # resumed from step 2, one more step
    lines = [json.loads(l) for l in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3]
    assert list((tmp_path / "run" / "tb").glob("events.*"))


def test_config_from_yaml_with_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 5\nlr: 1.0e-4\n")
    cfg = SFTConfig.load(p, ["steps=7", "include_subagents=false"])
    assert cfg.steps == 7 and cfg.lr == 1e-4 and cfg.include_subagents is False
    with pytest.raises(ValueError, match="unknown SFT config keys: stepz"):
        SFTConfig.load(None, ["stepz=3"])
    with pytest.raises(ValueError, match="lr"):
        SFTConfig(lr=0)
