"""Checkpoints shared by SFT and GRPO: OUT/checkpoint holds the consolidated model (safetensors,
config, processor: loadable by `paravt.models.load_model`, `paravt serve` and vLLM as is), the
model and optimizer state as a torch.distributed.checkpoint directory `dcp/` (sharded: a run
resumes from it on the same or another number of processes, see train.engine), and
`trainer_state.pt` (scheduler, step, config). Checkpoints of earlier versions keep the optimizer
in trainer_state.pt instead of dcp/; they still resume (on one process).

A save writes OUT/checkpoint.tmp, ends it with a marker file (COMPLETE_FILE, written last), then
swaps it in by two renames: checkpoint -> checkpoint.old, checkpoint.tmp -> checkpoint. A crash at
any point leaves a complete checkpoint to resume from: `find_checkpoint` takes OUT/checkpoint,
else a complete checkpoint.tmp (a crash between the renames), else checkpoint.old; and a save never
deletes the only complete one before its own is complete."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.pt"
COMPLETE_FILE = "checkpoint_complete"
SHARDS_DIR = "dcp"
OURS_FILE = "paravt_checkpoint"  # in every checkpoint and snapshot directory a run writes, first
RUN_FILE = "paravt_run.json"  # in OUT: a paravt run lives here (written before anything else)


def claim_run_dir(out: str | Path, kind: str, main: bool = True) -> None:
    """Make OUT a paravt run directory, or refuse before anything in it is touched: a run rotates,
    prunes and overwrites what it finds there (checkpoint*, step_*, config.json, log.jsonl), so a
    folder that holds something and is not a paravt run (no RUN_FILE, no checkpoint of an earlier
    paravt) is refused with CheckpointError, and nothing is written or deleted. Log files (*.log) are
    not counted: the run never writes one, and a user's `| tee OUT/train.log` creates it first."""
    import json

    out = Path(out)
    marker = out / RUN_FILE
    # listed before the marker is read: the main rank writes its marker before any other file, so a rank
    # whose listing caught the main rank's first files finds the marker below (torchrun's race)
    # a *.log beside the run (`| tee OUT/train.log`, the campaign scripts' logs) is never touched by it
    theirs = [p for p in out.iterdir() if not (p.is_file() and p.suffix == ".log")] if out.is_dir() else []
    if marker.is_file():
        try:
            was = json.loads(marker.read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            was = None
        if was not in (None, kind):
            raise CheckpointError(f"{out} holds a paravt {was} run; write the {kind} run to another folder")
        return
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"out: {out} is a file, not a folder")
    earlier = find_checkpoint(out) is not None  # a run of a paravt that wrote no RUN_FILE yet
    if theirs and not earlier:
        shown = ", ".join(sorted(p.name for p in theirs)[:5])
        raise CheckpointError(f"out: {out} is not empty ({shown}, ...) and is not a paravt run (it has no {RUN_FILE}); "
                              "a run rotates and deletes checkpoint folders and overwrites config.json and log.jsonl "
                              "there, so it refuses to start: pick a new or empty folder")
    if main:
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"kind": kind}) + "\n")


_MODEL_SUFFIXES = (".json", ".safetensors", ".jinja")
_MODEL_NAMES = ("merges.txt", "vocab.txt", "tokenizer.model", SHARDS_DIR)


def _ours(d: Path) -> bool:
    """Whether `d` is a checkpoint or snapshot a paravt run wrote: its marker or state file, or (from an
    earlier version, or a delete of one cut short) config.json beside only the files a model
    directory holds."""
    if (d / OURS_FILE).is_file() or (d / STATE_FILE).is_file() or (d / COMPLETE_FILE).is_file():
        return True
    names = [p.name for p in d.iterdir()]
    return "config.json" in names and all(n.endswith(_MODEL_SUFFIXES) or n in _MODEL_NAMES for n in names)


def _foreign(d: Path) -> str | None:
    """Why the run must not replace or delete `d` (it exists and the run did not write it), or None."""
    if d.exists() and not _ours(d):
        return f"refusing to replace {d}: it is not a checkpoint a paravt run wrote (move it away)"
    return None


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoint"


def _leftovers(out: str | Path) -> tuple[Path, Path, Path]:
    final = checkpoint_dir(out)
    return final, final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")


def is_complete(d: Path, need_marker: bool = True) -> bool:
    """Whether `d` holds a whole checkpoint. OUT/checkpoint and .old only ever come from renaming a
    finished one, so their state file is enough (and checkpoints of earlier versions have no marker);
    a .tmp must carry the marker, which its save writes last."""
    return (d / STATE_FILE).is_file() and (not need_marker or (d / COMPLETE_FILE).is_file())


def find_checkpoint(out: str | Path) -> Path | None:
    """The complete checkpoint a run resumes from (see the module docstring), or None."""
    final, tmp, old = _leftovers(out)
    for d, need_marker in ((final, False), (tmp, True), (old, False)):
        if is_complete(d, need_marker):
            return d
    return None


def has_checkpoint(out: str | Path) -> bool:
    return find_checkpoint(out) is not None


def rerun_note(out: str | Path) -> str:
    """What rerunning the command of a stopped run does, said as it is: resume from the checkpoint
    there, or start over where none was written yet."""
    found = find_checkpoint(out)
    if found is None:
        log = Path(out) / "log.jsonl"
        kept = (" (the log so far is kept beside the new one, as log.1.jsonl or the next free number)"
                if log.is_file() and log.stat().st_size else "")
        return f"no checkpoint was written yet, so a rerun of the same command starts over at step 1{kept}"
    try:
        step = int((found / COMPLETE_FILE).read_text().strip())
    except (OSError, ValueError):  # a checkpoint of an earlier version: no marker to read the step from
        return f"its last checkpoint is kept ({found}): rerun the same command to resume from it"
    return (f"its checkpoint of step {step} is kept ({found}): rerun the same command to resume from step {step} "
            "(the steps after it run again)")


def _remove(d: Path) -> None:
    """Delete a checkpoint directory, its state and marker first, so a delete cut short never
    leaves something that looks complete. A directory a run did not write is never deleted."""
    if not d.exists():
        return
    why = _foreign(d)
    if why:
        raise CheckpointError(why)
    (d / OURS_FILE).touch()  # a delete cut short leaves it known as ours, to be deleted next time
    for name in (COMPLETE_FILE, STATE_FILE):
        (d / name).unlink(missing_ok=True)
    shutil.rmtree(d, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(d: Path, step: Any) -> None:
    """Flush every file of `d` to disk, then write the marker: a marked directory is whole even
    after a power loss."""
    for f in d.rglob("*"):
        if f.is_file():
            _fsync(f)
    with open(d / COMPLETE_FILE, "w") as fh:
        fh.write(f"{step}\n")
        fh.flush()
        os.fsync(fh.fileno())
    _fsync(d)


class CheckpointError(RuntimeError):
    """A checkpoint that was not written (no room, unwritable directory, non-finite weights); the
    previous checkpoint is intact."""


class TrainingDiverged(RuntimeError):
    """Updates were skipped (non-finite loss or gradient) too many steps in a row."""


def diverged(step: int, streak: int, loss: float, grad_norm: float, lr: float, out: str | Path) -> TrainingDiverged:
    """The one-line error that ends a run whose last `streak` updates were all skipped."""
    import math

    what = "loss" if not math.isfinite(loss) else "gradient norm"
    return TrainingDiverged(f"step {step}: the update was skipped {streak} steps in a row because the {what} was not "
                            f"finite (loss {loss}, grad_norm {grad_norm}); lower lr (now {lr:g}). The last checkpoint "
                            f"in {Path(out)} holds the weights of before (none were saved non-finite)")


def nonfinite_weights(model, engine=None) -> int:
    """How many parameter values are NaN or infinite (all processes' shards under an engine)."""
    import torch

    bad = 0
    with torch.no_grad():
        for p in model.parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            bad += int((~torch.isfinite(t)).sum())
    return int(engine.all_sum(bad)) if engine is not None else bad


def _needed_bytes(model, optimizer) -> int:
    """A bound on what a save writes: the consolidated weights, plus the sharded model and the
    optimizer's state (AdamW: two moments of every trained parameter, fp32) when it is saved."""
    n = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + (n * 4 * 3 if optimizer is not None else 0) + (1 << 20)


def snapshot(checkpoint: Path, dest: Path) -> None:
    """A model-only copy of a checkpoint (what `paravt eval --model` and `paravt serve` load)."""
    why = _foreign(dest)
    if why:
        raise CheckpointError(why)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(checkpoint, dest, ignore=shutil.ignore_patterns(STATE_FILE, COMPLETE_FILE, SHARDS_DIR))


def prune_snapshots(out: str | Path, keep: int) -> None:
    """Keep the newest `keep` OUT/step_<n> snapshots (0 keeps none)."""
    snaps = sorted(d for d in Path(out).glob("step_*") if d.is_dir() and d.name[5:].isdigit() and _ours(d))
    for d in snaps[: max(len(snaps) - keep, 0)]:
        shutil.rmtree(d, ignore_errors=True)


def save_checkpoint(out: str | Path, model, processor, state: dict[str, Any], keep_as: str | None = None, *,
                    engine=None, optimizer=None) -> Path:
    """`_save_checkpoint` behind two guards: weights with a NaN or infinity are never written (they
    would replace the last good checkpoint), and a failed write (a full disk, say) removes its partial
    directory and raises CheckpointError naming the directory and the cause, the previous
    checkpoint left as it was."""
    main = engine is None or engine.main
    plain = engine.unwrap(model) if engine is not None and model is not None else model
    bad = nonfinite_weights(plain, engine) if plain is not None else 0
    if bad:
        raise CheckpointError(f"step {state.get('step')}: refusing to save {bad} non-finite weights over the "
                              f"checkpoint in {Path(out)} (it still holds the last finite ones)")
    error = None
    if main:
        # before anything moves: a folder the run did not write stays as it is
        error = next(filter(None, map(_foreign, _leftovers(out))), None)
        Path(out).mkdir(parents=True, exist_ok=True)
        need = _needed_bytes(plain, optimizer) if plain is not None else 0
        free = shutil.disk_usage(Path(out)).free
        if free < need and error is None:
            error = f"{Path(out)}: not enough free space for a checkpoint ({free / 1e6:.0f} MB free, ~{need / 1e6:.0f} MB needed)"
    if engine is not None:
        error = engine.broadcast(error)
    if error:
        raise CheckpointError(error)
    from safetensors import SafetensorError

    _, tmp, _ = _leftovers(out)
    try:
        return _save_checkpoint(out, model, processor, state, keep_as, engine=engine, optimizer=optimizer)
    except (OSError, RuntimeError, SafetensorError) as e:  # what torch, DCP and safetensors raise on a failed write
        if main:
            _remove(tmp)
        raise CheckpointError(f"{tmp}: the checkpoint could not be written ({_cause(e, Path(out))}); "
                              "the previous checkpoint is intact") from e


def _cause(e: BaseException, where: Path) -> str:
    """The reason of a failed save in words: torch's serializer reports a full disk as
    'unexpected pos ...', so ENOSPC is recognised from the free space left too."""
    import errno

    text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left" in str(e):
        return "no space left on device"
    try:
        if shutil.disk_usage(where).free < (1 << 20):
            return "no space left on device"
    except OSError:
        pass
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return text[:200]


def _save_checkpoint(out: str | Path, model, processor, state: dict[str, Any], keep_as: str | None = None, *,
                     engine=None, optimizer=None) -> Path:
    """Write the model (+ processor) and trainer state to OUT/checkpoint (crash-safe, see the module
    docstring); with `optimizer`, the model and optimizer state also go to dcp/ (sharded). With an
    `engine` every process must call this: the consolidated model and the shards are gathered and
    written collectively, the directory swaps are rank 0's. With `keep_as`, also keep a copy of the
    model at OUT/<keep_as> (e.g. step-numbered snapshots)."""
    from paravt.procs import signals_held

    with signals_held():  # a stop signal waits for the checkpoint to be whole
        return _write_checkpoint(out, model, processor, state, keep_as, engine=engine, optimizer=optimizer)


def _write_checkpoint(out: str | Path, model, processor, state: dict[str, Any], keep_as: str | None = None, *,
                      engine=None, optimizer=None) -> Path:
    import torch

    from paravt.models.tiny import save_pretrained

    main = engine is None or engine.main
    final, tmp, old = _leftovers(out)
    if main:
        if find_checkpoint(out) == tmp:  # a crash between the renames: finish that swap before reusing .tmp
            _remove(final)
            tmp.rename(final)
        _remove(tmp)  # a save cut short (or none): the complete checkpoint is elsewhere
    if main:
        tmp.mkdir(parents=True)  # before the other processes write their shards into it
        (tmp / OURS_FILE).touch()  # first: a save cut short leaves a directory known as ours
    if engine is not None:
        engine.barrier()
        full = engine.full_state_dict(model)  # collective
        if main:
            save_pretrained(engine.unwrap(model), processor, tmp, state_dict=full)
        if optimizer is not None:
            engine.save_sharded(model, optimizer, tmp / SHARDS_DIR)  # collective
        engine.barrier()
    else:
        save_pretrained(model, processor, tmp)
    if main:
        torch.save(state, tmp / STATE_FILE)
        _seal(tmp, state.get("step"))
        if final.exists():
            _remove(old)  # tmp is complete now, so the previous checkpoint may go
            final.rename(old)
        tmp.rename(final)
        _fsync(final.parent)
        _remove(old)
        if keep_as:
            snapshot(final, Path(out) / keep_as)
    if engine is not None:
        engine.barrier()
    return final


def load_state(out: str | Path) -> dict[str, Any]:
    """The trainer state of the checkpoint `find_checkpoint` picks."""
    import torch

    found = find_checkpoint(out)
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint in {Path(out)} (looked for checkpoint, checkpoint.tmp, "
                                "checkpoint.old)")
    import pickle

    try:  # tensors and plain values only: a pickled object in a run directory could run code
        return torch.load(found / STATE_FILE, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{found / STATE_FILE} holds Python objects beyond tensors and plain values ({why}); paravt never "
            "unpickles them, since loading such a file can run code. If you wrote this run yourself with an "
            f"older paravt, convert it once: python -m paravt.train.checkpoint convert {Path(out)}") from None


def load_policy(model: str, *, seed: int = 0, tiny_size: str = "tiny", device: str = "cpu", dtype: str = "fp32"):
    """(model, processor) for training: "tiny" builds a fresh tiny Qwen3-VL (seeded), anything
    else is a checkpoint directory or a cached hub id (paravt.models.load_model)."""
    import torch

    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
    if model == "tiny":
        from paravt.models.tiny import build_tiny

        m, processor = build_tiny(seed=seed, size=tiny_size)
        m.to(device=device, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
        return m, processor
    from paravt.models import load_model

    return load_model(model, device=device, dtype=dtype)


def make_optimizer(model, cfg, freeze_vision: bool = False):
    """(trainable params, AdamW, lr schedule) from a trainer config's lr, betas, weight_decay,
    lr_schedule (cosine | constant), warmup_steps and steps; the vision tower is left out when frozen."""
    import torch
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    if freeze_vision:
        model.model.visual.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    sched = (get_cosine_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps) if cfg.lr_schedule == "cosine"
             else get_constant_schedule_with_warmup(opt, cfg.warmup_steps))
    return params, opt, sched


def step_schedule(sched) -> None:
    """Move the lr schedule one step on. The schedule counts steps, not updates: a skipped
    (non-finite) update moves it on too. torch warns when a schedule's first step comes before any
    optimizer step, which is exactly a skipped first update: that warning is silenced here."""
    import re
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"),
                                category=UserWarning)
        sched.step()


def restore_optimizer(out: str | Path, opt, sched, *, engine=None, model=None) -> int:
    """Load the optimizer (and, from dcp/, the model's exact weights) and the schedule of the
    checkpoint to resume from; returns its step. A dcp/ directory written by any number of
    processes loads into this run's (every process must call this then)."""
    state = load_state(out)
    shards = find_checkpoint(out) / SHARDS_DIR
    if shards.is_dir():
        if engine is None or model is None:
            raise ValueError(f"{shards} holds sharded state: restoring it needs the engine and the model")
        engine.load_sharded(model, opt, shards)
    else:
        opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return int(state["step"])


@contextmanager
def torch_threads(n: int):
    """Run with `n` torch CPU threads (0: unchanged), restoring the previous count after."""
    import torch

    if n < 0:
        raise ValueError(f"threads must be >= 0, got {n}")
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _plain(value: Any) -> Any:
    """`value` with numpy scalars and arrays as Python numbers and tensors (what weights_only loads)."""
    import numpy as np
    import torch

    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def convert_state(out: str | Path) -> Path:
    """Rewrite an older run's trainer state in the plain form `load_state` reads. This unpickles the
    file: only for a run you wrote yourself."""
    import torch

    found = find_checkpoint(out)
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint in {Path(out)}")
    path = found / STATE_FILE
    state = _plain(torch.load(path, weights_only=False, map_location="cpu"))
    tmp = path.with_suffix(".plain")
    torch.save(state, tmp)
    torch.load(tmp, weights_only=True)  # loads as a resumed run will
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "convert":
        sys.exit("usage: python -m paravt.train.checkpoint convert OUT   (rewrites OUT's trainer state as plain "
                 "values; it unpickles the file, so only for a run you wrote yourself)")
    print(f"converted {convert_state(sys.argv[2])}")
