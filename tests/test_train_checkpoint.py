"""Checkpoint save/resume (shared by SFT and GRPO) across crashes at every point of a save: a
resumed run starts from a complete checkpoint whenever one exists, and no save ever deletes the
only complete checkpoint before a newer one is complete."""

import pathlib
import shutil

import pytest
import torch

import paravt.models.tiny
import paravt.train.checkpoint as ck
from paravt.train.checkpoint import COMPLETE_FILE, STATE_FILE, find_checkpoint, has_checkpoint, load_state


def build(d: pathlib.Path, step: int, marker: bool = True, state: bool = True) -> pathlib.Path:
    """A checkpoint directory as a save leaves it (marker=False, state=False: a save cut short)."""
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if state:
        torch.save({"step": step}, d / STATE_FILE)
    if marker:
        (d / COMPLETE_FILE).write_text(str(step))
    return d


# (which leftovers exist) -> the directory a resume must use, and its step
STATES = {
    "nothing": ({}, None),
    "only checkpoint": ({"checkpoint": 2}, "checkpoint"),
    "checkpoint of an older version (no marker)": ({"checkpoint": (2, False)}, "checkpoint"),
    "crash while writing tmp": ({"checkpoint": 2, "checkpoint.tmp": (3, False)}, "checkpoint"),
    "crash before the first rename": ({"checkpoint": 2, "checkpoint.tmp": 3}, "checkpoint"),
    "crash between the renames": ({"checkpoint.old": 2, "checkpoint.tmp": 3}, "checkpoint.tmp"),
    "crash between the renames, tmp without marker (older version)": (
        {"checkpoint.old": 2, "checkpoint.tmp": (3, False)}, "checkpoint.old"),
    "crash after the second rename": ({"checkpoint": 3, "checkpoint.old": 2}, "checkpoint"),
    "only old": ({"checkpoint.old": 2}, "checkpoint.old"),
    "only an incomplete tmp": ({"checkpoint.tmp": (1, False)}, None),
    "tmp alone, complete": ({"checkpoint.tmp": 1}, "checkpoint.tmp"),
    "checkpoint without its state": ({"checkpoint": (3, False, False), "checkpoint.old": 2}, "checkpoint.old"),
}


def make_state(out: pathlib.Path, spec: dict) -> None:
    for name, v in spec.items():
        step, marker, state = (v, True, True) if isinstance(v, int) else (*v, True)[:3]
        build(out / name, step, marker=marker, state=state)


@pytest.mark.parametrize("name", list(STATES))
def test_resume_picks_the_complete_checkpoint(tmp_path, name):
    spec, want = STATES[name]
    make_state(tmp_path, spec)
    assert find_checkpoint(tmp_path) == (tmp_path / want if want else None)
    assert has_checkpoint(tmp_path) == (want is not None)
    if want:
        step = spec[want] if isinstance(spec[want], int) else spec[want][0]
        assert load_state(tmp_path)["step"] == step
    else:
        with pytest.raises(FileNotFoundError):
            load_state(tmp_path)


class Crash(Exception):
    pass


@pytest.fixture
def crashing(monkeypatch):
    """save_checkpoint with a stand-in model writer, whose n-th file-system step (a write, rename or
    delete) raises Crash: returns a function (out, step, crash_at) -> crashed?"""
    calls = {"n": 0, "at": None}

    def tick():
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise Crash(f"crash at step {calls['n']}")

    def fake_save_pretrained(model, processor, path):
        path = pathlib.Path(path)
        path.mkdir(parents=True, exist_ok=True)  # as the real one: the save made it, with its marker
        tick()
        (path / "config.json").write_text("{}")
        tick()
        (path / "model.safetensors").write_bytes(b"w" * 100)
        return path

    real_rename, real_rmtree, real_save = pathlib.Path.rename, shutil.rmtree, torch.save

    def rename(self, target):
        tick()
        return real_rename(self, target)

    def rmtree(path, *a, **k):
        if pathlib.Path(path).exists():
            tick()
        return real_rmtree(path, *a, **k)

    def save(obj, f, *a, **k):
        tick()
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(paravt.models.tiny, "save_pretrained", fake_save_pretrained)
    monkeypatch.setattr(pathlib.Path, "rename", rename)
    monkeypatch.setattr(ck.shutil, "rmtree", rmtree)
    monkeypatch.setattr(torch, "save", save)

    def run(out, step, crash_at=None) -> bool:
        calls["n"], calls["at"] = 0, crash_at
        try:
            ck.save_checkpoint(out, None, None, {"step": step})
        except Crash:
            return True
        return False

    return run


START = {"fresh": {}, "after a save": {"checkpoint": 1}, **{k: v[0] for k, v in STATES.items() if v[1]}}


@pytest.mark.parametrize("start", list(START))
def test_a_crash_anywhere_in_a_save_leaves_a_complete_checkpoint(tmp_path, crashing, start):
    """From each leftover state, crash the next save at each of its steps in turn: a complete
    checkpoint is always there to resume from (the one before, or the new one), and the save
    after the crash completes and cleans up."""
    for at in range(1, 40):
        out = tmp_path / f"at{at}"
        make_state(out, START[start])
        before = load_state(out)["step"] if find_checkpoint(out) else None
        if not crashing(out, 9, crash_at=at):
            break  # this save has fewer steps: every crash point was covered
        found = find_checkpoint(out)
        if before is not None:
            assert found is not None, f"crash at step {at} left no complete checkpoint"
        if found is not None:
            assert load_state(out)["step"] in (before, 9)
        assert not crashing(out, 10)  # the next save works from whatever was left
        assert find_checkpoint(out) == out / "checkpoint" and load_state(out)["step"] == 10
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]
    else:
        raise AssertionError("save never completed")
    assert at > 4  # the save had at least: two model files, the state, a rename


def test_snapshots_hold_the_model_only(tmp_path, tiny_dir):
    from paravt.models import load_model

    model, processor = load_model(str(tiny_dir), device="cpu")
    ck.save_checkpoint(tmp_path, model, processor, {"step": 4}, keep_as="step_000004")
    assert (tmp_path / "checkpoint" / COMPLETE_FILE).is_file() and (tmp_path / "checkpoint" / STATE_FILE).is_file()
    snap = {p.name for p in (tmp_path / "step_000004").iterdir()}
    assert STATE_FILE not in snap and COMPLETE_FILE not in snap and "config.json" in snap
    load_model(str(tmp_path / "step_000004"), device="cpu")


def _tmpfs(path, size: str) -> bool:
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_full_disk_fails_the_save_in_one_line_and_keeps_the_last_checkpoint(tmp_path, tiny_dir, monkeypatch):
    """On a real full file system (a small tmpfs): the save fails with CheckpointError naming the
    directory and 'no space left on device' (torch reports it as 'unexpected pos ...'), the partial
    checkpoint.tmp is removed, the previous checkpoint is intact; with the space check on, the save
    is refused before writing anything."""
    import subprocess

    from paravt.models import load_model

    disk = tmp_path / "disk"
    if not _tmpfs(disk, "40m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        model, processor = load_model(str(tiny_dir), device="cpu")
        opt = torch.optim.AdamW(model.parameters())
        from paravt.train.engine import init_engine

        engine = init_engine("single", "cpu")
        ck.save_checkpoint(disk, model, processor, {"step": 1}, engine=engine, optimizer=opt)
        free = ck.shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * (free - 3_000_000))  # room for part of a checkpoint only
        with pytest.raises(ck.CheckpointError, match="not enough free space"):
            ck.save_checkpoint(disk, model, processor, {"step": 2}, engine=engine, optimizer=opt)
        monkeypatch.setattr(ck, "_needed_bytes", lambda *a: 0)  # past the check: the write itself fails
        with pytest.raises(ck.CheckpointError) as e:
            ck.save_checkpoint(disk, model, processor, {"step": 2}, engine=engine, optimizer=opt)
        msg = str(e.value)
        assert "no space left on device" in msg and str(disk / "checkpoint.tmp") in msg and "\n" not in msg, msg
        assert not (disk / "checkpoint.tmp").exists()
        assert load_state(disk)["step"] == 1 and find_checkpoint(disk) == disk / "checkpoint"
        load_model(str(disk / "checkpoint"), device="cpu")
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_non_finite_weights_are_never_saved(tmp_path, tiny_dir):
    from paravt.models import load_model

    model, processor = load_model(str(tiny_dir), device="cpu")
    ck.save_checkpoint(tmp_path, model, processor, {"step": 1})
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    with pytest.raises(ck.CheckpointError, match=r"refusing to save \d+ non-finite weights"):
        ck.save_checkpoint(tmp_path, model, processor, {"step": 2})
    assert load_state(tmp_path)["step"] == 1
    again, _ = load_model(str(tmp_path / "checkpoint"), device="cpu")
    assert all(torch.isfinite(p).all() for p in again.parameters())


def test_only_the_newest_snapshots_are_kept(tmp_path, tiny_dir):
    from paravt.models import load_model

    model, processor = load_model(str(tiny_dir), device="cpu")
    for step in (2, 4, 6, 8):
        ck.save_checkpoint(tmp_path, model, processor, {"step": step}, keep_as=f"step_{step:06d}")
        ck.prune_snapshots(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000006", "step_000008"]


class _Payload:
    """What a hostile trainer_state.pt holds: unpickling it runs a command."""

    def __init__(self, flag: pathlib.Path):
        self.flag = flag

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.flag}",)


def test_resuming_never_unpickles_code_from_the_run_directory(tmp_path):
    flag = tmp_path / "pwned"
    d = build(tmp_path / "run" / "checkpoint", 3)
    torch.save({"step": 3, "scheduler": _Payload(flag)}, d / STATE_FILE)
    with pytest.raises(ck.CheckpointError, match="never unpickles") as e:
        load_state(tmp_path / "run")
    assert "python -m paravt.train.checkpoint convert" in str(e.value)
    assert not flag.exists()


def test_an_older_state_with_numpy_values_converts_once_then_resumes(tmp_path):
    import subprocess
    import sys

    import numpy as np

    d = build(tmp_path / "run" / "checkpoint", 3)
    torch.save({"step": 3, "run": {"best": np.float64(0.5), "seen": np.arange(3)}, "where": pathlib.Path("/x")},
               d / STATE_FILE)
    with pytest.raises(ck.CheckpointError, match="convert"):
        load_state(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "paravt.train.checkpoint", "convert", str(tmp_path / "run")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    state = load_state(tmp_path / "run")
    assert state["step"] == 3 and state["run"]["best"] == 0.5 and state["where"] == "/x"
    assert torch.equal(state["run"]["seen"], torch.arange(3))


def _dcp_round(tmp_path):
    """A small model and optimizer saved as DCP through the engine, and a fresh pair to load into."""
    from paravt.train.engine import init_engine

    def pair(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95))
        m(torch.randn(2, 3)).sum().backward()
        opt.step()
        return m, opt

    engine = init_engine("single", device="cpu")
    m, opt = pair(0)
    engine.save_sharded(m, opt, tmp_path / "dcp")
    return engine, m, opt, pair(1)


def test_a_sharded_state_loads_as_data(tmp_path):
    engine, m, opt, (m2, opt2) = _dcp_round(tmp_path)
    engine.load_sharded(m2, opt2, tmp_path / "dcp")
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    assert opt2.state_dict()["param_groups"][0]["betas"] == (0.9, 0.95)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_a_sharded_state_never_runs_or_reads_what_it_names(tmp_path):
    """Three crafted dcp/ directories: a pickled command in .metadata, one in a non-tensor value (the
    optimizer's lr), and a storage entry naming a file outside the directory. Each is refused in one
    line, nothing runs, and nothing outside dcp/ is opened."""
    import pickle

    from paravt.train.safe_dcp import UnsafeCheckpointError

    engine, m, opt, (m2, opt2) = _dcp_round(tmp_path)
    dcp_dir = tmp_path / "dcp"
    clean = (dcp_dir / ".metadata").read_bytes()
    flag = tmp_path / "pwned"

    (dcp_dir / ".metadata").write_bytes(pickle.dumps(_Payload(flag)))
    with pytest.raises(UnsafeCheckpointError, match="does not unpickle"):
        engine.load_sharded(m2, opt2, dcp_dir)

    meta = pickle.loads(clean)
    lr = next(k for k in meta.storage_data if k.fqn.endswith("param_groups.0.lr"))
    info = meta.storage_data[lr]
    evil = tmp_path / "evil.distcp"
    torch.save(_Payload(flag), evil)
    info.relative_path, info.offset, info.length = "../evil.distcp", 0, evil.stat().st_size
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(UnsafeCheckpointError, match="outside the checkpoint directory"):
        engine.load_sharded(m2, opt2, dcp_dir)

    shutil.copy(evil, dcp_dir / "evil.distcp")
    info.relative_path = "evil.distcp"
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(UnsafeCheckpointError, match="not a plain value"):
        engine.load_sharded(m2, opt2, dcp_dir)
    assert not flag.exists()
