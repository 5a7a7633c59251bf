"""The classic punctuation baseline: min of input watermarks, forwarded on every output.

A process keeps the last watermark seen on each input channel; when their
minimum rises it sends the new minimum on every output channel, in band with
the data (so a punctuation never overtakes an element sent before it). A
watermark ``w`` means every substream ``< w`` has ended. Traffic is one
message per output channel per rise: ``O(K |P|^2)`` on a repartitioning
graph. A process on a cycle never sees its own input rise, so punctuations
stall there (004 section 1); trAcker has no such limit.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence


class PunctuationTracker:
    """One process's punctuation state.

    Example::

        pt = PunctuationTracker("mid/0", inputs=["src/0", "src/1"],
                                outputs=["sink/0"], send=channel_send)
        pt.on_punctuation("src/0", 3)   # None: src/1 still at 0
        pt.on_punctuation("src/1", 5)   # 3: sends 3 to sink/0

    Args:
        process_id: this process.
        inputs: processes with a channel into this one.
        outputs: processes this one has a channel to.
        send: ``send(to, watermark)`` puts a punctuation on a data channel.
    """

    def __init__(
        self,
        process_id: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        send: Callable[[str, int], None],
    ) -> None:
        if not isinstance(process_id, str) or not process_id:
            raise ValueError(f"process_id must be a non-empty string, got {process_id!r}")
        if not callable(send):
            raise TypeError(f"send must be callable, got {send!r}")
        self.process_id = process_id
        self._inputs = {p: 0 for p in inputs}
        self._outputs = list(outputs)
        self._send = send
        self._watermark = 0
        self._lock = threading.Lock()
        self.messages_sent = 0

    @property
    def watermark(self) -> int:
        """Substreams below this have ended for this process."""
        return self._watermark

    def emit(self, watermark: int) -> None:
        """For a source: announce that every substream < ``watermark`` ended."""
        if self._inputs:
            raise ValueError(f"{self.process_id!r} has inputs; only a source emits watermarks")
        self._advance(watermark)

    def on_punctuation(self, from_process: str, watermark: int) -> int | None:
        """Record a punctuation from ``from_process``; return the new watermark if it rose."""
        if from_process not in self._inputs:
            raise ValueError(f"{self.process_id!r} has no input channel from {from_process!r}")
        with self._lock:
            if watermark > self._inputs[from_process]:
                self._inputs[from_process] = watermark
            low = min(self._inputs.values())
        return self._advance(low)

    def _advance(self, low: int) -> int | None:
        with self._lock:
            if low <= self._watermark:
                return None
            self._watermark = low
        for out in self._outputs:
            self._send(out, low)
            self.messages_sent += 1
        return low
