"""Replay stability: a recomputed step releases the very same value, never a second noise draw.

A runner retries a failed bundle from the last committed state, but side
effects of the failed attempt (a non-transactional sink fused into the stage,
a Flink replay into a plain file) may already be public. If the retry drew new
noise, the two values of one step would be two releases (averaging them
removes noise). Every draw is therefore a function of the noise key and the
draw's identity; these tests drive the release DoFn as a runner does, and run
a pipeline whose release fails once mid-firing on the retrying
BundleBasedDirectRunner, and compare what the attempts released. Each test
also runs a planted bug (a noise source that keeps drawing where it stood,
as a per-worker generator does) and checks that it is detected.
"""

import copy
import pickle

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

import dp_beam as dpb
from dp_beam.mechanisms import SecureNoise, SeededNoise
from dp_beam.transforms import continual
from dp_beam.transforms.release import OrderedReleaseDoFn
from dp_beam.transforms.schedule import StreamStart
from tests.fake_state import Bag, Cell, Timer


def _state():
    return {"buffer": Bag(), "mech": Cell(), "next": Cell(), "first": Cell(),
            "earliest": Cell(), "timer": Timer()}


def _dofn(**kw):
    transform = dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=100, **kw)
    entry = transform.plan_entry("count")
    spec = continual.CounterReleaseSpec("count", 10.0, transform._mechanism,
                                        transform._config, entry)
    dofn = OrderedReleaseDoFn(spec, bounded=False, seed=transform._seed, end_step=10,
                              noise_key=transform._noise_key)
    dofn.setup()
    return dofn


def _fire(dofn, state, until_step):
    fire = Timestamp(micros=(until_step + 1) * 10 * 10**6)
    out = list(dofn._fire("A", fire, state["buffer"], state["mech"], state["next"],
                          state["first"], state["earliest"], state["timer"]))
    # Releases leave the DoFn as elements of the global window (WindowedValue).
    return [r.value for r in out if isinstance(r, WindowedValue)]


def _retried_step(**kw):
    """The values a step releases on a first attempt whose commit fails and on the retry,
    which runs on another worker (a pickled copy of the DoFn) from the committed state."""
    dofn = _dofn(**kw)
    committed = _state()
    for element in [("A", (0, StreamStart()))] + [("A", (s, (float(s), 1))) for s in range(6)]:
        list(dofn._process(element, committed["buffer"], committed["next"], committed["first"],
                           committed["earliest"], committed["timer"]))
    _fire(dofn, committed, 2)                      # steps 0..2 released and committed
    first_attempt = _fire(dofn, copy.deepcopy(committed), 3)   # published, commit lost
    other_worker = pickle.loads(pickle.dumps(dofn))
    other_worker.setup()
    retry = _fire(other_worker, copy.deepcopy(committed), 3)
    same_worker_retry = _fire(dofn, copy.deepcopy(committed), 3)
    return first_attempt, retry, same_worker_retry


def test_a_retried_firing_releases_identical_values():
    first, retry, again = _retried_step()
    assert len(first) == 1
    assert first == retry == again


def test_retry_check_detects_a_redrawing_noise_source():
    # Planted bug: a noise source that continues its stream (per-worker generator).
    first, retry, again = _retried_step(rng=SeededNoise(7))
    assert first != again


def test_two_constructions_draw_independent_noise_and_a_declared_key_repeats():
    a, b = _dofn(), _dofn()
    state_a, state_b = _state(), _state()
    for dofn, state in ((a, state_a), (b, state_b)):
        list(dofn._process(("A", (0, StreamStart())), state["buffer"], state["next"],
                           state["first"], state["earliest"], state["timer"]))
    assert _fire(a, state_a, 3) != _fire(b, state_b, 3)
    key = dpb.NoiseKey.from_bytes(bytes(range(32)))
    runs = []
    for _ in range(2):
        dofn, state = _dofn(noise_key=key), _state()
        list(dofn._process(("A", (0, StreamStart())), state["buffer"], state["next"],
                           state["first"], state["earliest"], state["timer"]))
        runs.append(_fire(dofn, state, 3))
    assert runs[0] == runs[1]


# -- end to end: a release that fails once, on a runner that retries the bundle ---------------

PUBLISHED = []          # what a non-transactional sink fused into the stage saw
FAILED = {"done": False}


class _FlakyCounterSpec(continual.CounterReleaseSpec):
    """Publishes each record as it is made and fails once, at step 3, mid-firing."""

    def release(self, mechanism, key, step, aggregate):
        for record in super().release(mechanism, key, step, aggregate):
            PUBLISHED.append((record.key, record.step, record.value))
            if step == 3 and not FAILED["done"]:
                FAILED["done"] = True
                raise RuntimeError("transient failure after publishing")
            yield record


def _run_flaky(monkeypatch, **kw):
    PUBLISHED.clear()
    FAILED["done"] = False
    monkeypatch.setattr(continual, "CounterReleaseSpec", _FlakyCounterSpec)
    events = [{"ts": 10.0 * s + 1, "k": "A"} for s in range(6)]
    with beam.Pipeline(options=PipelineOptions(flags=[], runner="BundleBasedDirectRunner")) as p:
        _ = p | beam.Create(events) | dpb.ContinualCount(
            epsilon=1.0, step=10, start=0, end=60, key_fn=lambda e: e["k"], keys=["A"],
            timestamp_fn=lambda e: e["ts"], **kw)
    by_step = {}
    for key, step, value in PUBLISHED:
        by_step.setdefault((key, step), []).append(value)
    assert FAILED["done"], "the failure was not injected"
    assert len(by_step[("A", 3)]) == 2, "step 3 was not recomputed"
    return by_step


def test_end_to_end_retry_publishes_the_same_values(monkeypatch):
    by_step = _run_flaky(monkeypatch)
    assert all(len(set(values)) == 1 for values in by_step.values()), by_step


def test_end_to_end_retry_check_detects_redrawn_noise(monkeypatch):
    # Planted bug: OS-entropy noise per DoFn instance (the earlier production source).
    by_step = _run_flaky(monkeypatch, rng=SecureNoise())
    assert any(len(set(values)) > 1 for values in by_step.values())
