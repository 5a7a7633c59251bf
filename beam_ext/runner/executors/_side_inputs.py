"""Side inputs: materialised in the driver, broadcast, served as Fn API state."""
from __future__ import annotations

import collections
import struct
from typing import Iterable

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner.execution import WindowGroupingBuffer

from beam_ext.runner.planning import SideInputSpec
from beam_ext.runner.worker._task import side_input_token


class SideInputState(dict):
    """A stage's side-input state entries, with a digest of their content (``token``).

    A Python worker reuses a stage's bundle processors from task to task, and
    Beam's DoFn invoker reads side inputs in the global window once, when the
    processor is built. A processor is therefore reused only for the same
    side-input content: the same stage run again in one session, with new
    side inputs, must not see the old ones.
    """

    token: bytes = b""

    @classmethod
    def sealed(cls, entries: dict[bytes, bytes]) -> SideInputState:
        state = cls(entries)
        state.token = side_input_token(state)
        return state


def side_input_state(spec: SideInputSpec, chunks: Iterable[bytes]) -> dict[bytes, bytes]:
    """State entries (serialized StateKey -> encoded values) for one side input.

    Mirrors how Beam's FnApiRunner commits side inputs to its state servicer,
    so the SDK's side-input views read them unchanged.
    """
    grouped = WindowGroupingBuffer(spec.access_pattern, spec.coder)
    for chunk in chunks:
        grouped.append(chunk)
    state: dict[bytes, list[bytes]] = collections.defaultdict(list)
    StateKey = beam_fn_api_pb2.StateKey
    urn = spec.access_pattern.urn
    for key, window, data, count in grouped.encoded_items():
        if urn == common_urns.side_inputs.ITERABLE.urn:
            state[StateKey(iterable_side_input=StateKey.IterableSideInput(
                transform_id=spec.transform_id, side_input_id=spec.tag,
                window=window)).SerializeToString()].append(data)
        elif urn == common_urns.side_inputs.MULTIMAP.urn:
            state[StateKey(multimap_side_input=StateKey.MultimapSideInput(
                transform_id=spec.transform_id, side_input_id=spec.tag,
                window=window, key=key)).SerializeToString()].append(data)
            state[StateKey(multimap_keys_side_input=StateKey.MultimapKeysSideInput(
                transform_id=spec.transform_id, side_input_id=spec.tag,
                window=window)).SerializeToString()].append(key)
            state[StateKey(multimap_keys_values_side_input=StateKey.MultimapKeysValuesSideInput(
                transform_id=spec.transform_id, side_input_id=spec.tag,
                window=window)).SerializeToString()].append(
                    key + struct.pack(">i", count) + data)  # KV<K, Iterable<V>>
        else:
            raise NotImplementedError(f"side input access pattern {urn!r}")
    return {k: b"".join(v) for k, v in state.items()}
