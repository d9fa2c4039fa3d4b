import json
import math

import pytest
import torch

from paravt import protocol as P
from paravt.backends.base import Message
from paravt.backends.hf import Renderer
from paravt.models import load_model
from paravt.synth.dataset import SynthConfig, build_split
from paravt.train.checkpoint import CheckpointError, load_state
from paravt.train.config import ConfigError
from paravt.train.logging import read_log
from paravt.train.sft import SFTConfig, encode_row, sample_index, train_sft
from paravt.video import VideoReader
from trainlogs import steps_in
from videotools import make_test_video


@pytest.fixture(scope="module")
def renderer(tiny_dir):
    _, processor = load_model(str(tiny_dir), device="cpu")
    return Renderer(processor)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "train"
    build_split(out, SynthConfig(n=4, seed=4, split="train", min_len=40, max_len=50, oracle_k=(4,)))
    return out


def _row(video: str) -> dict:
    return {"id": "r", "video": video, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "text", "text": "<1.0 seconds>"}, {"type": "frame", "time": 1.0},
                                     {"type": "text", "text": "Q?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": P.THINK_PREFIX + "look.</think>\n"
                                           + P.format_tool_call(2, 5)}]},
        {"role": "user", "content": P.format_tool_response("a red circle at 3 s")},
        {"role": "assistant", "content": [{"type": "text", "text": P.THINK_PREFIX + "red.</think><answer>A</answer>"}]},
    ]}


def test_mask_covers_assistant_tokens_only_and_ids_match_inference(tmp_path, renderer):
    r = renderer
    make_test_video(tmp_path / "v.mp4", seconds=10, fps=2)
    ex = encode_row(_row("v.mp4"), r, tmp_path)
    trained = [t for t, m in zip(ex.ids, ex.mask) if m]
    first = r.encode("look.</think>\n" + P.format_tool_call(2, 5)) + [r.im_end]
    second = r.encode("red.</think><answer>A</answer>") + [r.im_end]
    assert trained == first + second
    # everything else is masked: headers, system, frame, timestamps, tool response, the forced prefixes
    untrained = [t for t, m in zip(ex.ids, ex.mask) if not m]
    assert untrained.count(r.image_pad) == r.image_tokens(ex.images[0]) and len(ex.images) == 1
    assert sum(1 for t in untrained if t == r.encode(P.THINK_PREFIX)[0]) == 2
    # the context before the first target is exactly what the episode feeds the model at inference
    frame = VideoReader(tmp_path / "v.mp4").frames_at([1.0])[0]
    from paravt.backends.base import ImagePart, TextPart

    msgs = [Message("system", "sys"), Message("user", [TextPart("<1.0 seconds>"), ImagePart(frame.image, 1.0), TextPart("Q?")])]
    prompt = r.render(msgs, prefix=P.THINK_PREFIX).ids
    assert ex.ids[: len(prompt)] == prompt and ex.mask[len(prompt)] == 1 and not any(ex.mask[: len(prompt)])


def test_video_placeholder_becomes_timestamped_overview(tmp_path, renderer):
    make_test_video(tmp_path / "v.mp4", seconds=10, fps=2)
    row = {"videos": [{"video": "v.mp4"}], "messages": [
        {"role": "user", "content": "<video>\nWhat colour?"}, {"role": "assistant", "content": "red"}]}
    ex = encode_row(row, renderer, tmp_path, max_frames=4)
    assert len(ex.images) == 4
    text = renderer.tok.decode(ex.ids)
    assert text.count("seconds>") == 4 and "What colour?" in text
    assert [t for t, m in zip(ex.ids, ex.mask) if m] == renderer.encode("red") + [renderer.im_end]


def test_two_steps_change_parameters_then_resume(split, tiny_dir, tmp_path):
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(tmp_path / "run"), steps=2,
                    batch_size=2, micro_batch_size=2, log_every=1, save_every=2, lr=1e-3, warmup_steps=0, device="cpu",
                    threads=1)
    last = train_sft(cfg)
    assert last["step"] == 2 and torch.isfinite(torch.tensor(last["loss"])) and last["target_tokens"] > 0
    before, _ = load_model(str(tiny_dir), device="cpu")
    after, _ = load_model(str(tmp_path / "run" / "checkpoint"), device="cpu")
    b = before.state_dict()
    changed = [n for n, t in after.state_dict().items() if not torch.equal(t, b[n])]
    assert len(changed) > 10
    cfg.steps = 3
    assert train_sft(cfg)["step"] == 3  # resumed at step 2, one more step
    assert load_state(tmp_path / "run")["step"] == 3
    assert [rec["step"] for rec in read_log(tmp_path / "run")] == [1, 2, 3]
    assert list((tmp_path / "run" / "tb").glob("events.*"))
    json.loads((tmp_path / "run" / "config.json").read_text())


def test_ctrl_c_before_the_first_checkpoint_says_so_and_the_rerun_keeps_the_log(split, tiny_dir, tmp_path, ctrl_c):
    """`paravt train sft` stopped before its first checkpoint: the message says there is none and that a
    rerun starts over, and the rerun keeps the stopped run's log.jsonl beside its own."""
    from typer.testing import CliRunner

    from paravt.cli import app

    out = tmp_path / "run"
    base = ["train", "sft", "-o", f"model={tiny_dir}", "-o", f"data={split / 'sft.parquet'}", "-o", f"out={out}",
            "-o", "steps=2", "-o", "batch_size=1", "-o", "micro_batch_size=1", "-o", "log_every=1", "-o", "save_every=10",
            "-o", "warmup_steps=0", "-o", "device=cpu", "-o", "threads=1"]
    ctrl_c["step"] = 1
    r = CliRunner().invoke(app, base)
    said = " ".join(r.output.split())
    assert r.exit_code == 130 and "no checkpoint was written yet" in said and "starts over at step 1" in said, said
    before = (out / "log.jsonl").read_text()
    assert steps_in(out / "log.jsonl") == [1]
    ctrl_c["step"] = None
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0, r.output
    assert steps_in(out / "log.jsonl") == [1, 2] and (out / "log.1.jsonl").read_text() == before


def test_a_resume_keeps_a_log_whole_whatever_it_holds(tmp_path):
    """Steps past the checkpoint and a line cut by a crash go from log.jsonl, into the kept copy; a log that
    ends at the checkpoint is appended to as it is."""
    from paravt.train.logging import resume_jsonl

    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n')
    assert resume_jsonl(log, 2) is None and steps_in(log) == [1, 2]
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"st')
    kept = resume_jsonl(log, 2)
    assert kept == tmp_path / "log.1.jsonl" and kept.read_text().endswith('{"st') and steps_in(log) == [1, 2]
    log.write_text('{"step": 1}\n{"step": 2}\n')
    assert resume_jsonl(log, 0) == tmp_path / "log.2.jsonl" and log.read_text() == ""


def test_stop_at_ends_the_run_early_on_the_full_schedule(split, tiny_dir, tmp_path):
    """A run cut into pieces (a preemptible job, a time-limited machine) keeps the lr schedule of the
    whole run: stopping at step 1 of 4 leaves the cosine lr at cos-schedule(1/4), not at its end."""
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(tmp_path / "run"), steps=4, stop_at=1,
                    batch_size=1, micro_batch_size=1, save_every=10, lr=1e-3, warmup_steps=0, device="cpu", threads=1)
    last = train_sft(cfg)
    assert last["step"] == 1 and load_state(tmp_path / "run")["step"] == 1
    assert last["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    cfg.stop_at = 2
    assert train_sft(cfg)["step"] == 2
    with pytest.raises(ValueError, match="stop_at"):
        SFTConfig(steps=4, stop_at=5)


def test_sample_order_is_a_seeded_permutation_per_epoch():
    n = 7
    epoch0 = [sample_index(0, j, n, n, seed=3) for j in range(n)]
    assert sorted(epoch0) == list(range(n))
    assert epoch0 == [sample_index(0, j, n, n, seed=3) for j in range(n)]
    assert epoch0 != [sample_index(0, j, n, n, seed=4) for j in range(n)]
    assert sorted(sample_index(1, j, n, n, seed=3) for j in range(n)) == list(range(n))


def test_config_from_yaml_with_overrides_and_clear_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 5\nlr: 1.0e-4\n")
    cfg = SFTConfig.load(p, ["steps=7", "include_subagents=false", "betas=[0.9, 0.95]"])
    assert cfg.steps == 7 and cfg.lr == 1e-4 and cfg.include_subagents is False and cfg.betas == (0.9, 0.95)
    with pytest.raises(ConfigError, match="unknown config key.*stepz"):
        SFTConfig.load(None, ["stepz=3"])
    with pytest.raises(ConfigError, match="steps: expected an integer"):
        SFTConfig.load(None, ["steps=many"])
    with pytest.raises(ConfigError, match="lr must be > 0"):
        SFTConfig.load(None, ["lr=0"])
    with pytest.raises(ConfigError, match="lr_schedule must be one of"):
        SFTConfig.load(None, ["lr_schedule=linear"])
    with pytest.raises(ConfigError, match="does not exist"):
        SFTConfig.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        SFTConfig.load(None, ["steps"])


def test_shipped_sft_configs_load():
    from pathlib import Path

    import paravt

    for p in sorted((Path(paravt.__file__).parent / "configs").glob("sft_*.yaml")):
        SFTConfig.load(p)


def test_one_process_can_train_with_different_precisions():
    import torch

    from paravt.train.engine import init_engine

    engines = [init_engine("single", "cpu", mp) for mp in ("no", "bf16", "no")]
    assert [e.mixed_precision for e in engines] == ["no", "bf16", "no"]
    with engines[1].autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with engines[0].autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("tmp_complete", [True, False])
def test_resume_after_a_crash_between_the_checkpoint_renames(split, tiny_dir, tmp_path, monkeypatch, tmp_complete):
    """The step-2 save dies between checkpoint -> checkpoint.old and checkpoint.tmp -> checkpoint.
    The next run resumes from the complete .tmp (step 2), or from .old (step 1) when .tmp is not
    marked complete, instead of starting over and deleting both."""
    import pathlib

    from rich.console import Console

    from paravt.train.checkpoint import COMPLETE_FILE

    out = tmp_path / "run"
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(out), steps=2, batch_size=1,
                    micro_batch_size=1, log_every=1, save_every=1, lr=1e-3, warmup_steps=0, device="cpu", threads=1)
    real_rename, swaps = pathlib.Path.rename, []

    def rename(self, target):
        if self.name == "checkpoint.tmp":
            swaps.append(self)
            if len(swaps) == 2:
                raise KeyboardInterrupt("killed between the renames")
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        train_sft(cfg)
    monkeypatch.undo()
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint.old", "checkpoint.tmp"]
    if not tmp_complete:
        (out / "checkpoint.tmp" / COMPLETE_FILE).unlink()
    cfg.steps = 3
    console = Console(record=True, width=200)
    assert train_sft(cfg, console=console)["step"] == 3
    want = ("checkpoint.tmp", 2) if tmp_complete else ("checkpoint.old", 1)
    assert f"resuming from {out / want[0]} at step {want[1]}" in console.export_text()
    assert load_state(out)["step"] == 3
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint"]
    assert [rec["step"] for rec in read_log(out)] == [1, 2, 3]


@pytest.mark.filterwarnings("error:Detected call of:UserWarning")  # a skipped first update still moves the lr on, silently
def test_non_finite_updates_are_skipped_then_the_run_stops_in_one_line(split, tiny_dir, tmp_path, monkeypatch):
    """From the third step on the loss is NaN: those updates are skipped (the weights stay finite and
    every checkpoint holds them), and the third skip in a row stops the run naming the step."""
    import paravt.train.logprobs as seqmod
    from paravt.train.grpo import TrainingDiverged

    real, calls = seqmod.token_logprobs, {"n": 0}

    def poisoned(model, batch, **kw):
        logp, ent = real(model, batch, **kw)
        calls["n"] += 1
        return (logp * float("nan"), ent) if calls["n"] > 2 else (logp, ent)

    monkeypatch.setattr(seqmod, "token_logprobs", poisoned)
    out = tmp_path / "run"
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(out), steps=10, batch_size=2,
                    micro_batch_size=2, save_every=1, lr=1e-3, warmup_steps=0, device="cpu", threads=1)
    with pytest.raises(TrainingDiverged, match=r"step 5: the update was skipped 3 steps in a row because the loss"):
        train_sft(cfg)
    assert load_state(out)["step"] == 4
    after, _ = load_model(str(out / "checkpoint"), device="cpu")
    assert all(torch.isfinite(p).all() for p in after.parameters())


def test_non_finite_settings_are_refused():
    with pytest.raises(ConfigError, match="lr: must be a finite number"):
        SFTConfig.load(None, ["lr=.inf"])


def test_activation_checkpointing_gives_the_gradients_of_a_plain_backward(tiny_dir):
    """`activation_checkpointing: true` (the 8B configs') recomputes the decoder layers' activations in
    the backward pass: the same gradients, through the current transformers' API (its argument was
    renamed, and the call failed with a TypeError)."""
    from paravt.train.engine import init_engine

    ids = torch.randint(10, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    grads = []
    for checkpointing in (False, True):
        model, _ = load_model(str(tiny_dir), device="cpu")
        model = init_engine("single", "cpu", activation_checkpointing=checkpointing).prepare(model)
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5)


def test_out_at_a_folder_that_is_not_a_run_is_refused_and_left_as_it_was(split, tiny_dir, tmp_path):
    """`out:` at a user's folder: refused before anything is touched (it used to rotate away and delete
    checkpoint/ and checkpoint.old/, and overwrite config.json and log.jsonl)."""
    from paravt.train.checkpoint import CheckpointError

    out = tmp_path / "mine"
    files = {"checkpoint/thesis.txt": "chapter 1", "checkpoint.old/photo.txt": "jpeg", "config.json": '{"mine": 1}',
             "log.jsonl": "my notes\n"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(out), steps=1, batch_size=1,
                    micro_batch_size=1, save_every=1, device="cpu", threads=1)
    with pytest.raises(CheckpointError, match="not a paravt run"):
        train_sft(cfg)
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == files


def test_a_folder_holding_only_its_own_log_is_a_new_run(split, tiny_dir, tmp_path):
    """`paravt train sft ... | tee OUT/train.log` (and the campaign scripts) create the log before the
    run starts: the run starts there and leaves the log alone."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("started\n")
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(out), steps=1, batch_size=1,
                    micro_batch_size=1, save_every=1, device="cpu", threads=1)
    assert train_sft(cfg)["step"] == 1
    assert (out / "train.log").read_text() == "started\n" and (out / "paravt_run.json").is_file()


def test_a_rank_that_lists_the_folder_while_the_main_rank_claims_it_goes_on(tmp_path, monkeypatch):
    """torchrun: rank 1 finds no marker, then lists the folder just after rank 0 wrote its marker and its
    first files. That folder is the run's, not a user's: rank 1 goes on (it used to refuse, one run in many)."""
    from pathlib import Path

    from paravt.train import checkpoint as ck

    out = tmp_path / "run"
    out.mkdir()
    listing = Path.iterdir

    def rank0_claims_first(self):
        if self == out and not (out / ck.RUN_FILE).exists():
            (out / ck.RUN_FILE).write_text('{"kind": "grpo"}\n')
            (out / "config.json").write_text("{}")
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", rank0_claims_first)
    ck.claim_run_dir(out, "grpo", main=False)  # no CheckpointError
    monkeypatch.setattr(Path, "iterdir", listing)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    with pytest.raises(ck.CheckpointError, match="not a paravt run"):
        ck.claim_run_dir(mine, "grpo", main=False)


def test_a_run_never_deletes_a_folder_it_did_not_write(split, tiny_dir, tmp_path):
    """Inside a run's own folder, a checkpoint.old or step_N someone else put there survives the
    rotation and the pruning: the save refuses, saying which folder, and the step snapshots that are
    not the run's are never pruned."""
    from paravt.train.checkpoint import CheckpointError

    out = tmp_path / "run"
    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(out), steps=1, batch_size=1,
                    micro_batch_size=1, save_every=1, device="cpu", threads=1, keep_checkpoints=1)
    train_sft(cfg)
    (out / "step_000000").mkdir()
    (out / "step_000000" / "keep.txt").write_text("mine")
    (out / "checkpoint.old").mkdir()
    (out / "checkpoint.old" / "photo.txt").write_text("jpeg")
    cfg.steps = 2
    with pytest.raises(CheckpointError, match="checkpoint.old: it is not a checkpoint a paravt run wrote"):
        train_sft(cfg)
    assert (out / "checkpoint.old" / "photo.txt").read_text() == "jpeg"
    (out / "checkpoint.old" / "photo.txt").unlink()
    (out / "checkpoint.old").rmdir()
    assert train_sft(cfg)["step"] == 2
    assert (out / "step_000000" / "keep.txt").read_text() == "mine"  # not the run's: never pruned
    assert (out / "step_000002").is_dir() and not (out / "step_000001").exists()


@pytest.mark.parametrize("rows,needle", [
    ([{"id": "a", "video": "v.mp4"}], "no 'messages' column (it has id, video)"),
    ([{"id": "a", "messages": "[{not json"}], "row 0: messages is not JSON"),
    ([{"id": "a", "messages": "[]"}], "row 0: no messages"),
])
def test_a_malformed_sft_file_names_the_file_row_and_field(tmp_path, rows, needle):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sft.parquet")
    cfg = SFTConfig(model="tiny", data=str(tmp_path / "sft.parquet"), out=str(tmp_path / "run"), steps=1,
                    device="cpu", threads=1)
    with pytest.raises(ConfigError, match="sft.parquet") as e:
        train_sft(cfg)
    assert needle in str(e.value)
    assert not (tmp_path / "run").exists()


def test_a_pickled_bin_model_is_a_clear_error_and_runs_nothing(tiny_dir, tmp_path):
    import os
    import shutil

    from paravt.models import ModelLoadError

    flag = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {flag}",)

    d = tmp_path / "model"
    shutil.copytree(tiny_dir, d)
    (d / "model.safetensors").unlink()
    torch.save({"lm_head.weight": Payload()}, d / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickled Python objects") as e:
        load_model(str(d), device="cpu")
    assert "weights_only" not in str(e.value) and not flag.exists()


def test_resuming_never_unpickles_code_from_the_sharded_state(split, tiny_dir, tmp_path):
    """A run folder someone sent: its dcp/.metadata is a pickle whose loading runs a command.
    torch's own reader would run it; the resume refuses the file and runs nothing."""
    import pickle

    cfg = SFTConfig(model=str(tiny_dir), data=str(split / "sft.parquet"), out=str(tmp_path / "run"), steps=1,
                    batch_size=1, micro_batch_size=1, save_every=1, lr=1e-3, warmup_steps=0, device="cpu", threads=1)
    train_sft(cfg)
    meta = tmp_path / "run" / "checkpoint" / "dcp" / ".metadata"
    assert meta.is_file()
    flag = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            import os

            return os.system, (f"touch {flag}",)

    meta.write_bytes(pickle.dumps(Payload()))
    cfg.steps = 2
    with pytest.raises(CheckpointError, match="does not unpickle"):
        train_sft(cfg)
    assert not flag.exists()
