"""Typed reading of a YAML mapping whose every error names the file and the field path (``clusters[1].max_mhz``).

A missing field, a wrong type (a YAML ``yes`` is no number) or an unknown key raises
:class:`~edgesdk.errors.ProfileError`; :meth:`Fields.done` catches the unknown keys once a
mapping's known ones were read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgesdk.errors import ProfileError

__all__ = ["Fields"]


class Fields:
    """Reads one YAML mapping, naming the file and field path in every error (a ProfileError)."""

    def __init__(self, data: Any, where: str, origin: str) -> None:
        self.where, self.origin = where, origin
        if not isinstance(data, Mapping):
            self.fail(f"must be a mapping, got {type(data).__name__}")
        self.data = data
        self.seen: set[str] = set()

    def fail(self, message: str) -> None:
        """Raise a ProfileError naming the file and this mapping's path."""
        raise ProfileError(f"{self.origin}: {self.where or 'top level'}: {message}")

    def path(self, key: str) -> str:
        """The field path of ``key`` in this mapping (``clusters[1].max_mhz``)."""
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        """Field ``key`` checked to be of ``kind`` (a bool is never a number); ``default`` when it is absent, else
        a ProfileError."""
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise ProfileError(f"{self.origin}: missing field {self.path(key)!r}")
            return default
        value = self.data[key]
        # bool is an int subclass; a YAML `yes` must not pass as a number.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            value_ok = False
        else:
            value_ok = isinstance(value, kind)
        if not value_ok:
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ProfileError(
                f"{self.origin}: field {self.path(key)!r} must be {names}, got {type(value).__name__} {value!r}"
            )
        return value

    def sub(self, key: str, data: Any) -> Fields:
        """A reader of the mapping ``data`` found at ``key``."""
        return Fields(data, self.path(key), self.origin)

    def strings(self, key: str, default: Any = ...) -> tuple[str, ...]:
        """Field ``key`` as a list of strings (numbers are taken as their text)."""
        items = self.get(key, list, default=[] if default is not ... else ...)
        for i, item in enumerate(items):
            if not isinstance(item, (str, int)) or isinstance(item, bool):
                self.fail(f"{self.path(key)}[{i}] must be a string, got {type(item).__name__}")
        return tuple(str(item) for item in items)

    def done(self) -> None:
        """Refuse the keys of this mapping that were never read, listing the allowed ones."""
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise ProfileError(
                f"{self.origin}: unknown field(s) {[self.path(k) for k in unknown]}; "
                f"allowed here: {sorted(self.seen)}"
            )
