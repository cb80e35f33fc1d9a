"""A stable hash of any picklable value: the same on every worker, process and run.

Python's ``hash()`` is salted per process, so anything that must agree across
Beam workers and reruns (the per-key noise seeds of the release DoFn, the
public user hash of seed 003's withhold-release schedule,
``docs/privacy/mean.md`` M-2, whose parts compose in parallel,
``docs/privacy/accounting.md`` AC-3) hashes the protocol-4
pickle of the value with SHA-256 instead.
"""

import hashlib
import pickle
from typing import Any

__all__ = ["stable_hash"]


def stable_hash(value: Any) -> int:
    """The first 8 bytes of ``SHA-256(pickle.dumps(value, protocol=4))`` as an unsigned 64-bit int.

    >>> stable_hash(("key", 1)) == stable_hash(("key", 1))
    True
    >>> 0 <= stable_hash("user") < 2 ** 64
    True
    """
    return int.from_bytes(hashlib.sha256(pickle.dumps(value, protocol=4)).digest()[:8], "big")
