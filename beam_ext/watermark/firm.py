"""Firm substream bounds: hold back later elements until NEOSS (004 section 3.2)."""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from beam_ext.watermark.agent import LocalAgent


class FirmBound:
    """A mailbox for consecutive integer substreams (epochs) with a firm bound.

    Elements of the current epoch pass; elements of later epochs wait until
    NEOSS of every earlier epoch reached this process. So the end of an
    epoch is observed exactly after its last element and before any element
    of the next one.

    Example::

        gate = FirmBound(agent, first=0, on_end=lambda e: snapshot(e))
        gate.push(element, epoch)
        for element in gate.ready():
            process(element)

    Cost: O(1) per element; held elements are kept in memory.
    """

    def __init__(self, agent: LocalAgent, first: int = 0, on_end: Callable[[int], None] | None = None) -> None:
        if isinstance(first, bool) or not isinstance(first, int):
            raise TypeError(f"first must be an int epoch, got {first!r}")
        self._current = first
        self._ended: set[int] = set()
        self._held: deque[tuple[int, Any]] = deque()
        self._out: deque[Any] = deque()
        self._events: deque[tuple[str, Any]] = deque()
        self._on_end = on_end
        self._lock = threading.Lock()
        agent.on_end_of_substream(self._neoss)

    @property
    def current(self) -> int:
        """The epoch whose elements are being let through."""
        with self._lock:
            return self._current

    def push(self, element: Any, epoch: int) -> None:
        """Offer an element of ``epoch``; an element of a past epoch is let through."""
        with self._lock:
            if epoch <= self._current:
                self._out.append(element)
            else:
                self._held.append((epoch, element))

    def ready(self) -> list[Any]:
        """Elements that may be processed now, in arrival order."""
        with self._lock:
            out = list(self._out)
            self._out.clear()
        return out

    def _neoss(self, substream: object) -> None:
        if not isinstance(substream, int):
            return
        with self._lock:
            self._ended.add(substream)
            ended = []
            e = self._current
            while e in self._ended:
                ended.append(e)
                e += 1
        # The end is observed before anything of the next epoch is let through.
        if self._on_end is not None:
            for e in ended:
                self._on_end(e)
        with self._lock:
            self._current += len(ended)
            still = deque()
            for epoch, element in self._held:
                if epoch <= self._current:
                    self._out.append(element)
                else:
                    still.append((epoch, element))
            self._held = still
