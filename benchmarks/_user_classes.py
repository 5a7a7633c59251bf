"""Classes of a user's own, importable by the Python workers (a class defined in
a script's ``__main__`` is not, unless the job passes ``--save_main_session``)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Purchase:
    """A record without a coder of its own: Beam's coder pickles it."""

    user: int
    amount: float
    item: str
