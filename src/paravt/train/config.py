"""Typed YAML configs for the trainers: dataclasses filled from YAML plus `key=value` overrides.

Nested dataclasses (the episode and reward settings of a GRPO run) are addressed with dotted
keys (`episode.max_turns=2`, `reward.w_fmt=0.5`). Every value is checked against the field's
annotation so a typo or a wrong type fails at load time with the key's name, not hours later.
Hand-written because the checks we need (dataclass annotations, nested dataclasses with their
own `__post_init__` validation, dotted overrides) are a few dozen lines; pulling in a config
framework for them would add a dependency and a second schema language.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that does not fit the config's schema; the message names the key."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """`value` checked (and where lossless, converted) to annotation `tp`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:  # X | None: the X error says it best
            raise errors[0]
        raise ConfigError(f"{key}: {value!r} fits none of {' | '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} settings, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin in (list, tuple):
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        out = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):  # lr=inf, kl_coef=nan: NaN compares false, so `kl_coef > 0` would turn the KL off
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool):  # YAML 1.1 reads off/on (and no/yes) as booleans: `anchoring: off`
            return "on" if value else "off"
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is collections.abc.Callable or tp is collections.abc.Callable:
        raise ConfigError(f"{key}: a function cannot be set from a config file")
    return value


def from_dict(cls: type[T], data: dict, prefix: str = "") -> T:
    """An instance of dataclass `cls` from a plain mapping, with unknown keys and wrong types
    reported by their dotted name. The dataclass's own `__post_init__` checks still run."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    odd = [k for k in data if not isinstance(k, str)]
    if odd:  # `1: x` or `~: x` in a file: YAML reads such a key as a number or null, never a setting's name
        raise ConfigError(f"{prefix or 'config'}: {odd[0]!r} is not a setting's name (keys are names such as steps)")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)} "
                          f"(known: {', '.join(sorted(known))})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from None


def check_finite(cfg: Any) -> None:
    """Raise ValueError naming the first float setting of a config (nested ones too) that is NaN or
    infinite; for configs built in code, which skip the YAML loader's check."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        values = v if isinstance(v, (list, tuple)) else [v]
        if any(isinstance(x, float) and not math.isfinite(x) for x in values):
            raise ValueError(f"{f.name} must be finite, got {v!r}")
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            check_finite(v)


def check_trainer(cfg: Any) -> None:
    """Raise ValueError for settings both trainers share that would load and fail only once the run
    starts: AdamW's betas outside [0, 1), a negative thread count."""
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ValueError(f"betas must be two numbers in [0, 1) (AdamW's), got {list(cfg.betas)}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's default), got {cfg.threads}")


def check_switches(cfg: Any) -> None:
    """Raise ValueError for a bad value of the update's speed switches both trainers share
    (activation checkpointing's part, the packed attention, Liger's parts); GRPO's `vision_cache`
    needs a frozen vision tower."""
    from paravt.train.attention import CHOICES
    from paravt.train.kernels import check_parts

    if cfg.checkpoint_part not in ("layer", "attention"):
        raise ValueError(f"checkpoint_part must be layer or attention, got {cfg.checkpoint_part!r}")
    if cfg.packed_attention not in CHOICES:
        raise ValueError(f"packed_attention must be one of {', '.join(CHOICES)}, got {cfg.packed_attention!r}")
    if isinstance(cfg.liger, str):
        raise ValueError(f"liger is a list of parts (say [rms_norm, swiglu, rope, logprob] or [all]), got {cfg.liger!r}")
    cfg.liger = check_parts(cfg.liger)
    if getattr(cfg, "vision_cache", False) and not cfg.freeze_vision:
        raise ValueError("vision_cache reuses a frozen vision tower's features: it needs freeze_vision: true")


def to_dict(cfg: Any) -> dict:
    """JSON/YAML-friendly dict of a config (callables and other non-data values dropped)."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        elif callable(v):
            continue
        out[f.name] = v
    return out


def read_yaml(text: str, where: str) -> Any:
    """`text` parsed as YAML for a config: as yaml.safe_load, but a key given twice and an integer that
    YAML 1.1 reads other than it looks (`010` is 8, `1:30` is 90) are ConfigErrors naming `where`, not
    silently the last value or another number."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, collections.abc.Hashable) and key in seen:
                    raise ConfigError(f"{where}: {key!r} is given twice (lines {seen[key]} and "
                                      f"{key_node.start_mark.line + 1}); say it once")
                if isinstance(key, collections.abc.Hashable):
                    seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep)

        def construct_yaml_int(self, node):
            text = str(node.value).replace("_", "").lstrip("+-")
            if ":" in text or (len(text) > 1 and text[0] == "0" and text[1].isdigit()):
                raise ConfigError(f"{where}: {node.value!r} (line {node.start_mark.line + 1}) is read by YAML as "
                                  f"{super().construct_yaml_int(node)}; write the number without a leading zero "
                                  "or colon, or quote it")
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None


def apply_overrides(data: dict, overrides: list[str] | None) -> dict:
    """`key=value` strings (values parsed as YAML, keys dotted for nested sections) merged into `data`."""
    data = dict(data)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. steps=10, episode.max_turns=2)")
        key, raw = item.split("=", 1)
        key = key.strip()
        value = read_yaml(raw, f"override {item!r}")
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            sub = node.get(p)
            if sub is None:
                sub = {}
            elif dataclasses.is_dataclass(sub):
                sub = to_dict(sub)
            elif not isinstance(sub, dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
            node[p] = dict(sub)
            node = node[p]
        node[parts[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Config `cls` from a YAML file (optional) and `key=value` overrides, validated."""
    data: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        data = read_yaml(p.read_text(), str(p)) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of settings")
    return from_dict(cls, apply_overrides(data, overrides))
