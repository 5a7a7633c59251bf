"""The one hash of grouping keys: equal for equal keys in every process.

Python's ``hash()`` cannot place keys across Spark's Python workers: str and
bytes hashes are salted per process, and those of ``None`` (before Python
3.12) and NaN come from the object's address. Workers that hash one key
differently send its elements to different partitions, and per-key results
come out wrong without any error. So every partitioning by key (the runner's
GroupByKey shuffle, the Spark-native paths) and every per-key seed hashes the
key's encoding with its Beam coder: the bytes GroupByKey itself groups by.

>>> key_hash(untyped_key_coder("doc").encode(None)) == key_hash(b"\\x00")
True
"""
from __future__ import annotations

import functools
import zlib
from typing import Callable

from apache_beam import coders

#: ``key_hash(encoded_key) -> int``: a non-negative 32-bit hash of an encoded
#: key (CRC-32: fixed, unsalted). Partition ``key_hash(k) % n``; cost
#: O(len(encoded_key)). The C function itself, not a Python wrapper: the
#: shuffle calls it for every element.
key_hash: Callable[[bytes], int] = zlib.crc32


@functools.cache
def untyped_key_coder(step_label: str) -> coders.Coder:
    """The key coder GroupByKey uses for keys without a type hint.

    Beam's deterministic ``FastPrimitivesCoder``, so keys group as in
    GroupByKey: by encoding, not by Python equality (NaN keys with equal bits
    are one key; ``1``, ``1.0`` and ``True`` are three). A key it cannot encode
    deterministically raises ``TypeError`` naming ``step_label``.
    """
    return coders.FastPrimitivesCoder().as_deterministic_coder(step_label)
