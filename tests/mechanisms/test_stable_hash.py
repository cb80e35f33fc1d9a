"""The stable hash (dp_beam.mechanisms.stable_hash): the first 8 bytes of
SHA-256(pickle protocol 4) as an unsigned 64-bit int, the same in every process
whatever its hash seed."""

import pathlib
import subprocess
import sys

import pytest

from dp_beam.mechanisms.stable_hash import stable_hash

#: Computed once from the definition in the docstring,
#: int.from_bytes(sha256(pickle.dumps(v, protocol=4)).digest()[:8], "big").
EXPECTED = {("key", 1): 8275357155797173818, "user": 6528094411718190179, 0: 12418629027612652267}

ROOT = pathlib.Path(__file__).resolve().parents[2]
_CHILD = ("from dp_beam.mechanisms.stable_hash import stable_hash; "
          "print(stable_hash(('key', 1)), stable_hash('user'), stable_hash(0))")


@pytest.mark.parametrize("value", list(EXPECTED), ids=repr)
def test_known_values(value):
    assert stable_hash(value) == EXPECTED[value]


@pytest.mark.parametrize("seed", ["0", "1", "12345"])
def test_the_same_in_other_processes_whatever_their_hash_seed(seed):
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": seed}, cwd=ROOT)
    assert [int(v) for v in out.stdout.split()] == [EXPECTED[("key", 1)], EXPECTED["user"],
                                                   EXPECTED[0]]
    # Python's own hash of a str is salted by the seed, which is why it cannot be used.
    salted = subprocess.run([sys.executable, "-c", "print(hash('user'))"], capture_output=True,
                            text=True, check=True, env={"PYTHONHASHSEED": seed}).stdout
    assert int(salted) != stable_hash("user")


def test_range_and_distinct_values():
    values = [stable_hash(("key", i)) for i in range(1000)]
    assert all(isinstance(v, int) and 0 <= v < 2 ** 64 for v in values)
    # 1000 values in 2^64: a collision has probability below 1000²/2^65 ≈ 3e-14.
    assert len(set(values)) == 1000
    assert stable_hash(("key", 1)) != stable_hash(("key", 2))
    assert stable_hash(1) != stable_hash(1.0)   # pickled differently
