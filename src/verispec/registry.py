"""The one registry type: rules, drafters, verifiers, target backends and tasks are each a :class:`Registry` of
entries by name, every entry carrying its capabilities as data, and an unknown name gets one message everywhere:
"unknown KIND 'name'; available: a, b, c"."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

__all__ = ["Registry", "UnknownName"]

T = TypeVar("T")


class UnknownName(ValueError, KeyError):
    """A name no entry of a registry has. A ValueError (bad input) and a KeyError (a failed look-up), so that
    callers catching either see it; its text is the message, not KeyError's quoted repr."""

    def __init__(self, kind: str, name: object, available: Iterable[str]) -> None:
        self.kind, self.name, self.available = kind, name, list(available)
        super().__init__(f"unknown {kind} {name!r}; available: {', '.join(self.available)}")

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Mapping[str, T]):
    """Entries of one kind by name, in registration order: a read-only mapping whose look-up of a bad name raises
    :class:`UnknownName`."""

    def __init__(self, kind: str, entries: Iterable[tuple[str, T]] = ()) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        for name, entry in entries:
            self.register(name, entry)

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` as ``name`` (ValueError if the name is taken); returns the entry (usable as a decorator's
        body)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(self.kind, name, self._entries) from None

    def check(self, name: str) -> str:
        """``name`` if it is registered, else :class:`UnknownName`."""
        self[name]
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
