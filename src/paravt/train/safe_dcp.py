"""Load a torch.distributed.checkpoint directory without running code from it.

torch's FileSystemReader reads `.metadata` with plain `pickle.load`, and its DefaultLoadPlanner
loads every non-tensor value (the optimizer's param groups) with `torch.load(weights_only=False)`:
a run folder someone sent would run its author's code on resume. torch has no switch for either,
so this module narrows both: the metadata is unpickled with an allowlist of the classes DCP itself
writes (dataclasses, enums, dtypes, sizes, paths), and byte items go through `weights_only=True`.
A storage entry that points outside the checkpoint directory is refused too, so a resume reads
only the folder it was given.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path, PurePath
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import default_planner as _planner
from torch.distributed.checkpoint import filesystem as _fs
from torch.distributed.checkpoint import metadata as _md

from .checkpoint import CheckpointError


class UnsafeCheckpointError(CheckpointError):
    """A DCP directory holds something a checkpoint written by torch does not."""


def _allowed(module: str, name: str) -> Any:
    """The object `module.name` if DCP's own metadata may name it, else None."""
    if module == _md.__name__:
        obj = getattr(_md, name, None)
        ok = isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
        return obj if ok else None
    if (module, name) == (_fs.__name__, "_StorageInfo"):
        return _fs._StorageInfo
    if module == "torch":
        obj = getattr(torch, name, None)
        return obj if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) else None
    if (module, name) == ("torch.serialization", "_get_layout"):
        return torch.serialization._get_layout
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"):
        return PurePath  # a pure path: constructing it touches nothing
    if (module, name) == ("collections", "OrderedDict"):
        import collections

        return collections.OrderedDict
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed(module, name)
        if obj is None:
            raise UnsafeCheckpointError(
                f"the checkpoint's .metadata names {module}.{name}, which a DCP checkpoint never holds; "
                "paravt does not unpickle it, since loading such a file can run code")
        return obj


def read_metadata(file: str | Path) -> _md.Metadata:
    """The DCP Metadata in `file` (`.metadata`, or DCP's per-rank `__N.metadata`), unpickled
    through the allowlist; its storage entries must name files inside the same directory."""
    file = Path(file)
    try:
        with open(file, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except UnsafeCheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
        raise UnsafeCheckpointError(f"{file} is not a DCP checkpoint's metadata: {e}") from None
    if not isinstance(meta, _md.Metadata):
        raise UnsafeCheckpointError(f"{file} holds a {type(meta).__name__}, not DCP Metadata")
    for info in (meta.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or rel in ("", ".", "..") or "/" in rel or "\\" in rel:
            raise UnsafeCheckpointError(f"{file} points at {rel!r}, outside the checkpoint directory")
    return meta


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata comes through `read_metadata` (torch's own read_data
    already loads tensors with weights_only=True)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> _md.Metadata:
        meta = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = _md.StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads non-tensor values as plain values only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"the checkpoint's value {read_item.dest_index.fqn} is not a plain value; paravt does not "
                f"unpickle it, since loading such a value can run code ({str(e).splitlines()[0]})") from None
        if self.flatten_state_dict:
            _planner.set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load(state: dict, path: str | Path) -> None:
    """`dcp.load(state, checkpoint_id=path)` reading the directory as data only. The metadata is
    checked first and a refusal inside DCP's own loop is raised as itself, so the user sees one
    line saying what was refused rather than DCP's per-rank traceback dump."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_metadata(Path(path) / ".metadata")
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafePlanner())
    except CheckpointException as e:
        for exc, _trace in e.failures.values():
            if isinstance(exc, UnsafeCheckpointError):
                raise exc from None
        raise

