"""An element's windows as the bytes a shuffle record carries, encoded and decoded once per window set.

A grouping whose pane driver reads of an element only its value and its
windows ships the windows' encoding beside the value, not the whole
windowed value (its timestamp and pane are not read). Consecutive elements
mostly share their windows, or a single interval window equal to one seen
before: each distinct set is encoded, and decoded, once.

Example::

    codec = WindowSetCodec(IntervalWindowCoder())
    data = codec.encode((window,))
    assert codec.decode(data) == (window,)
"""
from __future__ import annotations

from typing import Any, Callable

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.transforms.window import IntervalWindow

# Window sets held at most; the cache is emptied past it.
_CACHED = 4096


class WindowSetCodec:
    """Encodes and decodes window sets with a window coder, each distinct set
    once; ``made``, if given, turns each decoded set into the one kept (the
    streaming grouping's own window objects)."""

    def __init__(self, window_coder: Any, made: Callable[[tuple], tuple] | None = None) -> None:
        self._impl = window_coder.get_impl()
        self._made = made
        # A set by the tuple's identity (the tuple kept, so its id is not
        # reused while the entry lives), and a single interval window by its
        # bounds, as equal windows made apart are.
        self._by_id: dict[int, tuple[tuple, bytes]] = {}
        self._by_bounds: dict[tuple[int, int], bytes] = {}
        self._decoded: dict[bytes, tuple] = {}

    def encode(self, windows: tuple) -> bytes:
        """The count of ``windows``, then each window's nested encoding."""
        found = self._by_id.get(id(windows))
        if found is not None:  # no other tuple has its id while the entry keeps it
            return found[1]
        bounds = None
        if len(windows) == 1 and type(windows[0]) is IntervalWindow:
            bounds = windows[0]._start_micros, windows[0]._end_micros
            encoded = self._by_bounds.get(bounds)
            if encoded is not None:
                return encoded
        out = create_OutputStream()
        out.write_var_int64(len(windows))
        for window in windows:
            self._impl.encode_to_stream(window, out, True)
        encoded = out.get()
        if len(self._by_id) >= _CACHED:
            self._by_id.clear()
        self._by_id[id(windows)] = (windows, encoded)
        if bounds is not None:
            if len(self._by_bounds) >= _CACHED:
                self._by_bounds.clear()
            self._by_bounds[bounds] = encoded
        return encoded

    def decode(self, encoded: bytes) -> tuple:
        """The windows of :meth:`encode`'s bytes; equal bytes give the same tuple."""
        found = self._decoded.get(encoded)
        if found is None:
            stream = create_InputStream(encoded)
            decode = self._impl.decode_from_stream
            if len(self._decoded) >= _CACHED:
                self._decoded.clear()
            found = tuple(decode(stream, True) for _ in range(stream.read_var_int64()))
            if self._made is not None:
                found = self._made(found)
            self._decoded[encoded] = found
        return found
