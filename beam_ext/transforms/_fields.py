"""Field accessors: a field is a dict key, an attribute name, or a callable."""
from __future__ import annotations

from typing import Any, Callable

from beam_ext.errors import BeamExtError

FieldSpec = str | Callable[[Any], Any]


class MissingFieldError(BeamExtError, KeyError):
    """An event lacks a field a transform needs; the message shows the event."""

    def __str__(self) -> str:  # KeyError would repr() the whole message
        return str(self.args[0])


def field_getter(spec: FieldSpec, role: str) -> Callable[[Any], Any]:
    """A function reading ``spec`` from an event.

    ``role`` names the argument in errors (``"timestamp"``, ``"sum('amount')"``).
    A string is looked up as a mapping key first, then as an attribute; a
    missing field raises :class:`MissingFieldError` naming the field and
    showing the event.

    >>> field_getter("amount", "value")({"amount": 3})
    3
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{role}: a field must be a str or a callable, got {spec!r}")
    name = spec

    def get(event: Any) -> Any:
        try:
            return event[name]
        except (KeyError, TypeError, IndexError):
            pass
        try:
            return getattr(event, name)
        except AttributeError:
            raise MissingFieldError(
                f"{role}: event has no field {name!r}: {event!r:.500}") from None

    get.__name__ = f"get_{name}"
    return get
