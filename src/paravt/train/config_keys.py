"""Every key a trainer's config accepts, with its default and one line on what it sets, read from the
config dataclasses themselves: the fields give the keys (dotted for nested sections), the types and
the defaults; each field's own comment (on its line, else the comment block just above it) gives the
line. So `paravt train grpo --show-config` cannot drift from what the loader accepts, and a field
added without a comment fails tests/test_train_config_keys.py."""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_FIELD_LINE = re.compile(r"^\s+([A-Za-z_]\w*)\s*:")


@dataclass(frozen=True)
class ConfigKey:
    key: str  # dotted: episode.max_turns
    type: str
    default: Any
    value: Any  # the loaded config's (equal to default when none was given)
    help: str


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """{field name: its comment} from the class's source: the comment on the field's line, else the
    contiguous comment lines just above it, joined."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    for no, line in enumerate(lines, start=1):
        m = _FIELD_LINE.match(line)
        if not m or m.group(1) not in names or m.group(1) in out:
            continue
        if no in comments and not line.lstrip().startswith("#"):
            out[m.group(1)] = comments[no]
            continue
        above = []
        prev = no - 1
        while prev >= 1 and lines[prev - 1].lstrip().startswith("#"):
            above.insert(0, comments.get(prev, ""))
            prev -= 1
        if above:
            out[m.group(1)] = " ".join(above)
    return out


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
    return name or str(tp).replace("typing.", "").replace("NoneType", "None")


def config_keys(cls: type, instance: Any = None, prefix: str = "", defaults: Any = None) -> list[ConfigKey]:
    """The keys of dataclass `cls` that a config can set, nested sections flattened in field order;
    values from `instance`, defaults from `defaults` (a section's default is its parent's)."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    defaults = cls() if defaults is None else defaults
    out: list[ConfigKey] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if not f.init or "Callable" in str(tp):  # a function is set in code, never from a file
            continue
        default = getattr(defaults, f.name)
        value = getattr(instance, f.name) if instance is not None else default
        if dataclasses.is_dataclass(tp):
            out += config_keys(tp, value, prefix + f.name + ".", default)
            continue
        out.append(ConfigKey(prefix + f.name, _type_name(tp), default, value, comments.get(f.name, "")))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str):
        return value if value else '""'
    if callable(value):
        return "(set in code)"
    return str(value)


def show_config(cls: type, instance: Any = None, title: str = "") -> str:
    """Plain text, one key a line: key, value, what it sets (and the default where the config changed it)."""
    keys = config_keys(cls, instance)
    width = max(len(k.key) for k in keys)
    vwidth = min(max(len(_shown(k.value)) for k in keys), 28)
    lines = [title] if title else []
    for k in keys:
        changed = "" if k.value == k.default else f" [default: {_shown(k.default)}]"
        lines.append(f"{k.key:<{width}}  {_shown(k.value):<{vwidth}}  {k.help}{changed}".rstrip())
    return "\n".join(lines) + "\n"
