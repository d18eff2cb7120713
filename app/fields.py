"""Settings generated from dataclass fields: how each reads from text (a command-line
flag) and from JSON (a saved run's config.json), and the flag that gives it.

A field whose metadata has a ``help`` is a flag ``--field-name`` (``flag`` in the
metadata renames it, ``choices`` restricts its values). The field's type decides how
the flag reads its text (``kind_of``):

=============================  ==========================================================
``int``                        a whole number, also written ``5e5`` or ``500_000``
``float``, ``str``             as Python reads them
``bool``                       ``--name`` / ``--no-name``
``tuple[int, ...]``            comma-separated, ``64,64``; also of ``float`` or ``str``, and
                               of a fixed length (``tuple[float, float]``: exactly two)
``Literal[...]``, an ``Enum``  one of its values (an ``Enum``'s member names)
``X | None``                   what ``X`` reads, or the word ``none``
=============================  ==========================================================

A value saved in a run's config.json is read back through the same ``Kind``
(``Kind.load``), so that a resumed run gets what the flag would have given.
"""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import enum
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal


def parse_int(text: str) -> int:
    """An integer, also written as ``5e5`` or ``500_000`` (exactly: ``1e30`` is 10**30)."""
    try:
        value = decimal.Decimal(text.replace("_", ""))
    except decimal.InvalidOperation:
        value = decimal.Decimal("nan")
    if not (value.is_finite() and value == value.to_integral_value()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value.adjusted() > 308:  # beyond float's range: refused before it is expanded digit by digit
        raise argparse.ArgumentTypeError(f"{text!r} is too large for any setting")
    return int(value)


class _None:
    """An optional setting set to none on the command line (``--name none``), told apart
    from one not given (``None``, which leaves the recipe's default)."""

    def __repr__(self) -> str:
        return "none"


NONE = _None()


def given(value: Any) -> Any:
    """The value a flag gave: ``None`` for ``NONE``."""
    return None if value is NONE else value


class _Choices:
    """argparse's ``choices`` for a kind: listed (in ``--help`` and errors) as ``names``,
    holding ``values`` (compared by type and value, so ``True`` is not ``1``)."""

    def __init__(self, names: Iterable[str], values: Iterable[Any]):
        self.names, self.values = tuple(names), tuple(values)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, value: Any) -> bool:
        return any(value is v or (type(value) is type(v) and value == v) for v in self.values)


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a flag reads: ``parse`` its text (argparse's ``type``), ``load`` a value saved
    as JSON (``ValueError`` where the flag could not have given it), ``dump`` a value
    for JSON; ``choices`` where only some values are allowed, ``boolean`` for an
    on/off flag, ``optional`` where ``none`` is a value."""

    label: str
    parse: Callable[[str], Any]
    load: Callable[[Any], Any]
    dump: Callable[[Any], Any] = _same
    choices: _Choices | None = None
    boolean: bool = False
    optional: bool = False

    @property
    def signature(self) -> tuple[str, tuple[str, ...] | None]:
        """What two kinds share when they read alike (a flag shared by several dataclasses)."""
        return self.label, None if self.choices is None else self.choices.names


def _loader(test: Callable[[Any], bool]) -> Callable[[Any], Any]:
    def load(value: Any) -> Any:
        if not test(value):
            raise ValueError(value)
        return value

    return load


def _parse_bool(text: str) -> bool:
    words = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}
    if text.strip().lower() not in words:
        raise argparse.ArgumentTypeError(f"{text!r} is not on or off")
    return words[text.strip().lower()]


INT = Kind("a whole number", parse_int, _loader(lambda v: type(v) is int))
FLOAT = Kind("a number", float, _loader(lambda v: type(v) in (int, float)))  # argparse: "invalid float value"
STR = Kind("text", str, _loader(lambda v: type(v) is str))
BOOL = Kind("on or off", _parse_bool, _loader(lambda v: type(v) is bool), boolean=True)
TEXTS = Kind("texts", str, _loader(lambda v: isinstance(v, list) and all(type(x) is str for x in v)))  # repeatable

_SCALARS = {int: INT, float: FLOAT, str: STR, bool: BOOL}
_NOUNS = {int: ("whole numbers", "64"), float: ("numbers", "0.5"), str: ("words", "a")}


def one_of(values: Iterable[Any], kind: Kind = STR) -> Kind:
    """``kind`` restricted to ``values``."""
    values = tuple(values)
    choices = _Choices(map(str, values), values)

    def load(value: Any) -> Any:
        if value not in choices:
            raise ValueError(value)
        return kind.load(value)

    return Kind(f"one of {', '.join(choices.names)}", kind.parse, load, kind.dump, choices)


def literal(values: Iterable[Any]) -> Kind:
    """One of ``values`` (a ``Literal``'s), read from its text."""
    values = tuple(values)
    choices = _Choices(map(str, values), values)

    def parse(text: str) -> Any:
        for value in values:
            if str(value) == text:
                return value
        return text  # argparse reports it as an invalid choice

    def load(value: Any) -> Any:
        if value not in choices:
            raise ValueError(value)
        return value

    return Kind(f"one of {', '.join(choices.names)}", parse, load, choices=choices)


def enumeration(cls: type[enum.Enum]) -> Kind:
    """A member of enum ``cls``, by its name (or its value's text); saved by name."""
    members = list(cls)
    choices = _Choices((m.name for m in members), members)

    def parse(text: str) -> Any:
        for member in members:
            if text == member.name:
                return member
        for member in members:
            if text == str(member.value):
                return member
        return text  # argparse reports it as an invalid choice

    def load(value: Any) -> Any:
        if not (isinstance(value, str) and value in cls.__members__):
            raise ValueError(value)
        return cls[value]

    return Kind(f"one of {', '.join(choices.names)}", parse, load, lambda member: member.name, choices)


def sequence(element: type, length: int | None = None) -> Kind:
    """Comma-separated ``element``s (int, float or str): any number of them but none, or
    exactly ``length``; a tuple."""
    if element not in _NOUNS:
        raise TypeError(f"tuple[{getattr(element, '__name__', element)}, ...]: the elements must be int, float or str")
    item, (noun, sample) = _SCALARS[element], _NOUNS[element]
    example = "64,64" if element is int and length is None else ",".join([sample] * (length or 2))
    what = f"a comma-separated list of {noun}" if length is None else f"{length} comma-separated {noun}"

    def parse(text: str) -> tuple[Any, ...]:
        parts = [p.strip() for p in text.split(",")]
        try:  # an empty element (``64,,64``, ``64,``) is a typo, not a separator to skip
            items = () if not all(parts) else tuple(p if element is str else item.parse(p) for p in parts)
        except (ValueError, argparse.ArgumentTypeError):
            items = ()
        if not items or (length is not None and len(items) != length):
            empty = " (an element is empty)" if text.strip() and not all(parts) else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}{empty}, e.g. {example}")
        return items

    def load(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple) or not value or (length is not None and len(value) != length):
            raise ValueError(value)
        return tuple(item.load(v) for v in value)

    return Kind(what, parse, load, list)


def optional(kind: Kind, none: Any = NONE) -> Kind:
    """``kind``, or ``none`` read from the word ``none`` (and from a saved ``null``)."""

    def parse(text: str) -> Any:
        return none if text.strip().lower() == "none" else kind.parse(text)

    parse.__name__ = getattr(kind.parse, "__name__", "value")  # argparse names it: "invalid float value: 'x'"

    def load(value: Any) -> Any:
        return none if value is None else kind.load(value)

    def dump(value: Any) -> Any:
        return None if value is None or value is NONE else kind.dump(value)

    choices = None if kind.choices is None else _Choices(
        (*kind.choices.names, "none"), (*kind.choices.values, none))
    return Kind(f"{kind.label} or none", parse, load, dump, choices, kind.boolean, optional=True)


def kind_of(hint: Any, choices: Iterable[Any] | None = None, none: Any = NONE) -> Kind:
    """How a flag for a field of type ``hint`` reads (module docstring); ``choices``
    restrict it, ``none`` is what the word ``none`` gives for an optional type.
    ``TypeError`` for a type no flag reads."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return optional(kind_of(rest[0], choices), none)
        raise TypeError(f"{hint}: a union other than X | None")
    if choices is not None:
        return one_of(choices, kind_of(hint))
    if hint in _SCALARS:
        return _SCALARS[hint]
    if origin is Literal:
        return literal(args)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return enumeration(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return sequence(args[0])
        if args and Ellipsis not in args and len(set(args)) == 1:
            return sequence(args[0], len(args))
        raise TypeError(f"{hint}: a tuple of one element type, tuple[T, ...] or tuple[T, T]")
    raise TypeError(f"{hint}: not int, float, str, bool, a tuple of them, a Literal, an Enum or one of these | None")


class UnsupportedField(TypeError):
    """A dataclass field of a type that no flag reads (``kind_of``)."""


def type_hints(cls: type) -> dict[str, Any]:
    """The field types of dataclass ``cls``, resolved where they can be (a field whose
    annotation does not resolve keeps it as written)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a name only imported under TYPE_CHECKING, say
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _hint(cls: type, field: dataclasses.Field, hints: dict[str, Any]) -> Any:
    hint = hints.get(field.name, field.type)
    if isinstance(hint, str) and type(field.default) in _SCALARS:  # unresolved: the default's type
        return type(field.default)
    return hint


def option_of(field: dataclasses.Field) -> str:
    """The flag of a field: ``--`` and its metadata's ``flag``, or its name, with dashes."""
    return "--" + field.metadata.get("flag", field.name).lstrip("-").replace("_", "-")


def _shown(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else repr(value)


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line flag: its option, the attribute its value goes to (and the
    setting's name in config.json), how it reads, its help and default."""

    option: str
    dest: str
    kind: Kind
    help: str
    default: Any = None
    metavar: str | None = None

    def add_to(self, parser: Any) -> argparse.Action:
        """Add the flag to ``parser`` (or an argument group)."""
        text = self.help.replace("%", "%%")  # argparse formats help with %
        if self.kind.boolean:
            return parser.add_argument(self.option, dest=self.dest, action=argparse.BooleanOptionalAction,
                                       default=self.default, help=text)
        metavar = None if self.kind.choices is not None else self.metavar
        return parser.add_argument(self.option, dest=self.dest, type=self.kind.parse, choices=self.kind.choices,
                                   default=self.default, metavar=metavar, help=text)


def field_flag(cls: type, field: dataclasses.Field, hints: dict[str, Any] | None = None, *, dest: str | None = None,
               none: Any = NONE) -> Flag:
    """The flag of ``field`` of dataclass ``cls``: unset by default (``None``: the
    dataclass's own default applies), its help ending with that default. ``TypeError``
    (``UnsupportedField``) naming the field where its type is one no flag reads."""
    hint = _hint(cls, field, type_hints(cls) if hints is None else hints)
    try:
        kind = kind_of(hint, field.metadata.get("choices"), none)
    except TypeError as error:
        raise UnsupportedField(f"{cls.__name__}.{field.name} cannot be a command-line flag: {error}") from None
    default = field.default if field.default is not dataclasses.MISSING else None
    help_text = f"{field.metadata.get('help', '')} (default {_shown(default)}"
    help_text += "; or none)" if kind.optional and default is not None else ")"
    return Flag(option_of(field), dest or field.name, kind, help_text, None, field.name.upper())


def settings_of(cls: type, skip: Iterable[str] = ()) -> list[dataclasses.Field]:
    """The fields of dataclass ``cls`` that are command-line settings: those with a
    ``help`` in their metadata, but ``skip``."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata and f.name not in set(skip)]
