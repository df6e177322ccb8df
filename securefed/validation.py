"""Small shared checks for config dataclasses (one message style everywhere)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from securefed.errors import ConfigError


def positive_int(name: str, value: object) -> None:
    """Raise ConfigError unless ``value`` is an int >= 1 (bools are refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _type_kind(annotation: str, value: Any) -> str | None:
    """What a value of a config field annotated ``annotation`` must be (``"a number"``),
    where ``value`` is not one; None where it fits or the annotation is not a plain
    ``bool``/``int``/``float``/``str`` or a tuple of them (``Literal`` values and nested
    configs are left to the dataclass's own checks)."""
    parts = {part.strip() for part in annotation.split("|")}
    if value is None and "None" in parts:
        return None
    base = parts - {"None"}
    if len(base) != 1:
        return None
    (kind,) = base
    if kind.startswith("tuple[") and kind.endswith("]"):
        items = {part.strip() for part in kind[len("tuple[") : -1].split(",")} - {"..."}
        if len(items) != 1:
            return None
        (item,) = items
        phrase = SCALAR_KINDS.get(item)
        if phrase is None:
            return None
        plural = {
            "a number": "numbers",
            "a whole number": "whole numbers",
            "a string": "strings",
            "true or false": "true/false values",
        }.get(phrase[0])
        if plural is None:
            return None
        if isinstance(value, tuple | list) and all(phrase[1](v) for v in value):
            return None
        return f"a list of {plural}"
    scalar = SCALAR_KINDS.get(kind)
    if scalar is None or scalar[1](value):
        return None
    return scalar[0]


def _unquoted(text: str, kind: str) -> bool:
    """Whether ``text`` is a value of ``kind`` written in quotes (``"2"`` for a number)."""
    if kind == "true or false":
        return text.strip().lower() in ("true", "false")
    try:
        number = float(text)
    except ValueError:
        return False
    return kind == "a number" or (
        kind == "a whole number" and number.is_integer() and "." not in text
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: Annotation -> (what a value must be, whether a value is one); read by --param too.
SCALAR_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("a whole number", _is_int),
    "float": ("a number", _is_number),
    "str": ("a string", lambda v: isinstance(v, str)),
}


def check_field_type(f: dataclasses.Field[Any], value: Any, *, where: str = "") -> None:
    """A ConfigError naming ``where`` (``"[privacy] "``), the field, what it must be and
    ``value`` where ``value`` does not fit the field's annotation: a dataclass's own checks
    compare before they look at types (``epsilon = "2"`` in config.toml made
    ``PrivacyConfig`` fail on ``"2" > 0`` with Python's own words). A value equal to the
    field's default passes (``rounds`` is None until resolved)."""
    if f.default is not dataclasses.MISSING and value is f.default:
        return
    kind = _type_kind(str(f.type), value)
    if kind is None:
        return
    hint = ""
    if isinstance(value, str) and _unquoted(value, kind):
        shown = value.strip().lower() if kind == "true or false" else value.strip()
        hint = f"; write {shown} without quotes"
    raise ConfigError(f"{where}{f.name} must be {kind}, got {value!r}{hint}")


def check_field_types(config: Any, *, where: str = "") -> None:
    """:func:`check_field_type` for every field of the dataclass instance ``config`` (its
    ``__post_init__`` calls it first, so the Python API gets the same message)."""
    for f in dataclasses.fields(config):
        check_field_type(f, getattr(config, f.name), where=where)


class KeywordSettings:
    """Base of a keyword-only settings dataclass (:class:`~securefed.config.TrainConfig`,
    :class:`~securefed.config.PrivacyConfig`): an unknown keyword or a positional argument
    is one :class:`~securefed.errors.ConfigError` naming the settings that exist, before
    anything is built (Python's own ``TypeError`` names the bad keyword only, and says
    nothing of the others: ``TrainConfig(epochs=3)``)."""

    __slots__ = ()
    #: Said after the list of settings (where else a setting may belong).
    settings_hint: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            check_keywords(cls, args, kwargs)
        return super().__new__(cls)


def check_keywords(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse positional ``args`` and keywords that are not ``cls``'s init fields.

    Raises:
        ConfigError: one line naming the class, the bad argument and the settings it has.
    """
    import difflib

    names = [f.name for f in dataclasses.fields(cls) if f.init]
    if args:
        raise ConfigError(
            f"{cls.__name__} takes keyword arguments only ({cls.__name__}({names[0]}=...)), "
            f"got {len(args)} positional; its settings: {', '.join(names)}"
        )
    unknown = [key for key in kwargs if key not in names]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        f"{cls.__name__} has no setting {unknown[0]!r}{hint}; its settings: {', '.join(names)}"
        + getattr(cls, "settings_hint", "")
    )
