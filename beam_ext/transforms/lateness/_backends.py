"""Where :class:`~beam_ext.transforms.lateness._engine._LateEngine` keeps window values.

A backend stores the encoded values of each (key, window) and is told what
the engine is about to do with them, so that a spilling backend can move
them between memory and disk ahead of need (Aion, sections 3.1-3.2).
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol

Window = tuple[float, float]


class _Backend(Protocol):
    """Values per (key, window), in insertion order.

    A backend may also offer ``staging_seconds(key, window)``: the engine
    then pre-stages that much earlier (see ``_LateEngine._lead``).
    """

    def add(self, key: bytes, window: Window, value: bytes) -> None: ...

    def read(self, key: bytes, window: Window) -> Iterator[bytes]: ...

    def expire(self, key: bytes, window: Window) -> None: ...

    def flush(self) -> None: ...

    def prestage(self, key: bytes, window: Window, deadline: float | None = None) -> None: ...

    def release(self, key: bytes, window: Window) -> None: ...

    def purge(self, key: bytes, window: Window) -> None: ...

    def close(self) -> None: ...


class _MemoryBackend:
    """Everything in a dict: the in-memory baseline of the benchmark."""

    def __init__(self) -> None:
        self._data: dict[tuple[bytes, Window], list[bytes]] = {}

    def add(self, key: bytes, window: Window, value: bytes) -> None:
        try:
            self._data[key, window].append(value)
        except KeyError:
            self._data[key, window] = [value]

    def read(self, key: bytes, window: Window) -> Iterator[bytes]:
        return iter(list(self._data.get((key, window), ())))

    def expire(self, key: bytes, window: Window) -> None:
        pass

    def flush(self) -> None:
        pass

    def prestage(self, key: bytes, window: Window, deadline: float | None = None) -> None:
        pass

    def release(self, key: bytes, window: Window) -> None:
        pass

    def purge(self, key: bytes, window: Window) -> None:
        self._data.pop((key, window), None)

    def close(self) -> None:
        self._data.clear()


class _SpillBackend:
    """Window values in a :class:`~beam_ext.state.SpillStore` (Aion's standard policy).

    Appends collect in per-window lists before they reach the store, which
    takes a lock and accounts bytes per call: the store sees them every
    ``_FLUSH_VALUES`` values and at every watermark advance. Every other
    operation on a window hands over its list first, so the store always sees
    values in order.
    """

    _FLUSH_VALUES = 1024  # bounds the values held outside the store's accounting

    def __init__(self, store: Any) -> None:
        self.store = store
        self._handles: dict[tuple[bytes, Window], Any] = {}
        self._pending: dict[tuple[bytes, Window], list[bytes]] = {}
        self._room = self._FLUSH_VALUES  # a countdown is the cheapest per-value check

    def _w(self, key: bytes, window: Window) -> Any:
        kw = (key, window)
        h = self._handles.get(kw)
        if h is None:
            h = self._handles[kw] = self.store.window(key, window)
        pending = self._pending.pop(kw, None)
        if pending:
            h._extend(pending)
        return h

    def add(self, key: bytes, window: Window, value: bytes) -> None:
        try:
            self._pending[key, window].append(value)
        except KeyError:
            self._pending[key, window] = [value]
        self._room -= 1
        if not self._room:
            self.flush()

    def flush(self) -> None:
        for kw in list(self._pending):
            self._w(*kw)
        self._room = self._FLUSH_VALUES

    def read(self, key: bytes, window: Window) -> Iterator[bytes]:
        return self._w(key, window).iter()

    def expire(self, key: bytes, window: Window) -> None:
        self._w(key, window).expire()

    def prestage(self, key: bytes, window: Window, deadline: float | None = None) -> None:
        self._w(key, window).prestage(deadline)

    def release(self, key: bytes, window: Window) -> None:
        self._w(key, window).release()

    def staging_seconds(self, key: bytes, window: Window) -> float:
        return self._w(key, window).staging_seconds()

    def purge(self, key: bytes, window: Window) -> None:
        self._w(key, window).purge()
        del self._handles[(key, window)]

    def close(self) -> None:
        self.flush()
        self.store.close()
