"""``keys=dpb.PrivateKeys(...)``: keys admitted by a private, continual selection."""

import apache_beam as beam
import pytest
from apache_beam.testing import test_stream

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.records import KeyAdmitted
from tests.beam_util import batch_options, collect, streaming_options

# A generous δ keeps the public threshold small enough for a handful of users:
# these tests check the plumbing; tests/mechanisms/test_key_selection.py checks
# the admission probabilities.
SELECT = dict(epsilon=5.0, delta=0.5)
STEP, START, END = 10, 0, 100


def _events():
    events = []
    # "busy": 30 distinct users, 10 in each of steps 1, 2 and 3; "rare": one user.
    for step in (1, 2, 3):
        events += [{"ts": step * STEP + 1.0 + i / 100, "k": "busy", "u": f"b{step}-{i}", "v": 0.5}
                   for i in range(10)]
    events.append({"ts": 15.0, "k": "rare", "u": "r", "v": 0.5})
    return events


def _threshold_step(selection, counts):
    """First step index t (1-based) whose noise-free distinct count reaches the threshold."""
    total = 0
    for t, n in enumerate(counts, start=1):
        total += n
        if total >= selection.threshold(t):
            return t
    return None


def _count(privacy_unit="event", method="sparse_vector", **kw):
    user = dict(privacy_unit="user", user_fn=lambda e: e["u"], max_contributions=5) \
        if privacy_unit == "user" else {}
    return dpb.ContinualCount(epsilon=1.0, step=STEP, start=START, end=END,
                              key_fn=lambda e: e["k"], keys=dpb.PrivateKeys(**SELECT, method=method),
                              timestamp_fn=lambda e: e["ts"], rng=ZeroNoise(), **user, **kw)


def _run(transform, events, options=None, stream=None):
    def build(p):
        res = (p | (stream if stream is not None else beam.Create(events))) | transform
        return {"releases": res.releases, "ledger": res.accounting, "invalid": res.invalid}
    return collect(options or batch_options(), build)


@pytest.mark.parametrize("method", ["sparse_vector", "counter"])
@pytest.mark.parametrize("unit", ["event", "user"])
def test_busy_key_is_admitted_and_its_stream_starts_with_everything_before(unit, method):
    transform = _count(unit, method)
    selection = dpb.PrivateKeys(**SELECT, method=method).selection(END // STEP)
    assert selection.method == method
    admit_t = _threshold_step(selection, [0, 10, 10, 10] + [0] * 6)
    assert admit_t is not None, "the test's parameters must let 'busy' in"
    out = _run(transform, _events())
    admitted = [r for r in out["releases"] if isinstance(r, KeyAdmitted)]
    assert [(a.key, a.step) for a in admitted] == [("busy", admit_t - 1)]
    assert admitted[0].threshold == pytest.approx(selection.threshold(admit_t))
    counts = sorted((r.step, r.value, r.t) for r in out["releases"]
                    if not isinstance(r, KeyAdmitted))
    a = admit_t - 1
    # One release per step from the admission to the end; the first covers
    # every earlier event (noise off).
    assert [s for s, _, _ in counts] == list(range(a, END // STEP))
    assert counts[0] == (a, 10.0 * min(a, 3), 1)
    assert counts[-1][1] == 30.0
    # The rare key is never admitted: its event is dead-lettered at the end.
    assert [r.reason for r in out["invalid"]] == ["key not admitted by private key selection"]
    ledger = sorted(out["ledger"], key=lambda e: e.transform)
    assert [(e.transform, e.key, e.scope) for e in ledger] == [
        ("ContinualCount", "busy", "key"), ("ContinualCount/keys", None, "stream")]
    assert ledger[1].unit == unit
    assert ledger[1].epsilon == SELECT["epsilon"] and ledger[1].delta == SELECT["delta"]
    assert ledger[1].mechanism == {"sparse_vector": "key_selection+sparse_vector(laplace)",
                                   "counter": "key_selection+tree(laplace)"}[method]


def test_plan_shows_the_selection_and_the_statistic():
    import apache_beam as beam_
    with beam_.Pipeline(options=batch_options()) as p:
        res = p | beam_.Create(_events()) | _count()
        (report,) = dpb.plan(res.accounting)
    assert report.transforms == ("ContinualCount", "ContinualCount/keys")
    assert report.epsilon == pytest.approx(1.0 + SELECT["epsilon"])
    assert report.delta == pytest.approx(SELECT["delta"])


def test_user_keys_beyond_max_keys_per_unit_go_to_invalid():
    events = [{"ts": 11.0, "k": "busy", "u": "x", "v": 0.5},
              {"ts": 12.0, "k": "other", "u": "x", "v": 0.5}]
    out = _run(_count("user"), events)
    reasons = sorted(r.reason for r in out["invalid"])
    assert reasons == ["key not admitted by private key selection",
                       "max_keys_per_unit (1) exceeded for user"]


def test_streaming_admission_matches_batch():
    stream = test_stream.TestStream().advance_watermark_to(0)
    for e in sorted(_events(), key=lambda e: e["ts"]):
        stream = stream.add_elements([beam.window.TimestampedValue(e, e["ts"])])
    stream = stream.advance_watermark_to_infinity()
    streamed = _run(_count(), None, streaming_options(), stream)
    batch = _run(_count(), _events())
    key = lambda r: (type(r).__name__, r.key, r.step)  # noqa: E731
    assert sorted(map(key, streamed["releases"])) == sorted(map(key, batch["releases"]))
    assert sorted(r.value for r in streamed["releases"] if not isinstance(r, KeyAdmitted)) == \
        sorted(r.value for r in batch["releases"] if not isinstance(r, KeyAdmitted))
    assert [r.reason for r in streamed["invalid"]] == [r.reason for r in batch["invalid"]]


def test_mean_with_private_keys():
    transform = dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=2, epsilon=1.0, step=STEP, start=START, end=END,
        key_fn=lambda e: e["k"], keys=dpb.PrivateKeys(**SELECT), neighbours="values",
        max_users=100, timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
    out = _run(transform, _events())
    admitted = [(r.key, r.step) for r in out["releases"] if isinstance(r, KeyAdmitted)]
    assert [k for k, _ in admitted] == ["busy"]
    means = [r for r in out["releases"] if not isinstance(r, KeyAdmitted)]
    assert {r.key for r in means} == {"busy"}
    assert sorted(r.step for r in means) == list(range(admitted[0][1], END // STEP))
    assert [r.reason for r in out["invalid"]] == ["key not admitted by private key selection"]


def test_private_keys_validation():
    with pytest.raises(ValueError, match="epsilon"):
        dpb.PrivateKeys(epsilon=0, delta=1e-6)
    with pytest.raises(ValueError, match="delta"):
        dpb.PrivateKeys(epsilon=1, delta=0)
    with pytest.raises(ValueError, match="max_keys_per_unit"):
        dpb.PrivateKeys(epsilon=1, delta=1e-6, max_keys_per_unit=0)
    with pytest.raises(ValueError, match="method"):
        dpb.PrivateKeys(epsilon=1, delta=1e-6, method="tree")
    # The default method is the sparse vector, Laplace only; Gaussian noise needs the counter.
    assert dpb.PrivateKeys(epsilon=1, delta=1e-6).method == "sparse_vector"
    with pytest.raises(ValueError, match="noise must be 'laplace' with method='sparse_vector'"):
        dpb.PrivateKeys(epsilon=1, delta=1e-6, noise="gaussian")
    gaussian = dpb.PrivateKeys(epsilon=1, delta=1e-6, noise="gaussian", method="counter")
    assert gaussian.ledger_entry("c", "user", 10).mechanism == "key_selection+tree(gaussian)"
    with pytest.raises(ValueError, match="max_keys_per_unit must equal max_keys_per_user"):
        dpb.ContinualMean(user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
                          max_samples_per_user=2, epsilon=1.0, step=STEP, start=START, end=END,
                          key_fn=lambda e: e["k"],
                          keys=dpb.PrivateKeys(1.0, 1e-6, max_keys_per_unit=2))
    with pytest.raises(ValueError, match="not available for ERM streams"):
        dpb.ContinualERM(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1),
                         n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=2,
                         base_size=4, step=STEP, start=START, end=END, key_fn=lambda e: e["k"],
                         keys=dpb.PrivateKeys(1.0, 1e-6))
