"""Tests of dp_beam.mechanisms.continual_mean.lockstep: many mean streams stepped together give
each stream's own releases, states and draws, bit for bit."""

import random

import numpy as np
import pytest

from dp_beam.mechanisms import counting
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanAggregate, MeanLockstep,
                                               MeanParams, MeanStep, UserState, contribution)
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

KEY = NoiseKey.from_bytes(bytes(range(32)))


def _source(stream, step):
    return KeyedNoise(KEY, ("lockstep-mean", stream, step))


def _aggregates(params, streams, steps, seed, dim=1):
    """Per stream, per step, the merged aggregate of its users' samples (None: an empty step);
    the streams differ in users and values, so their levels activate at different steps."""
    rnd = random.Random(seed)
    out = []
    for j in range(streams):
        users = {}
        n_users = rnd.randint(3, 40)
        means = [rnd.uniform(0.1, 0.9) for _ in range(n_users)]
        per_step = []
        for t in range(steps):
            agg = None
            for u in range(n_users):
                for _ in range(rnd.choice((0, 0, 1, 2, 3))):
                    x = [min(max(rnd.gauss(means[u], 0.2), 0.0), 1.0) for _ in range(dim)]
                    state = users.setdefault(u, UserState(uhash=1000 * j + u))
                    c = contribution(params, state, x[0] if dim == 1 else np.array(x), step=t + 1)
                    agg = c if agg is None else agg.merge(c)
            per_step.append(agg)
        out.append(per_step)
    return out


def _fields(out):
    return tuple(repr(np.ravel(v).tolist()) if isinstance(v, (np.ndarray, float)) else repr(v)
                 for v in (getattr(out, f) for f in MeanStep.__slots__))


CONFIGS = {
    "tuned-participation": dict(max_users=60, max_samples_per_user=64, epsilon=20.0),
    "tuned-values": dict(max_users=60, max_samples_per_user=64, epsilon=20.0,
                         neighbours="values"),
    "tuned-query": dict(max_users=40, max_samples_per_user=64, epsilon=5.0, neighbours="values",
                        prior_query=True),
    "tuned-gaussian": dict(max_users=60, max_samples_per_user=64, epsilon=20.0,
                           noise="gaussian", delta=1e-6),
    "paper-medians": dict(max_users=40, max_samples_per_user=32, epsilon=40.0, preset="paper"),
    "tuned-vector": dict(max_users=60, max_samples_per_user=16, epsilon=20.0, dim=2),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("horizon", [None, 32])
def test_lockstep_equals_each_stream_alone(name, horizon):
    config = CONFIGS[name]
    params = MeanParams(**config)
    streams, steps = 5, 30
    aggs = _aggregates(params, streams, steps, seed=7, dim=config.get("dim", 1))
    alone = [ContinualMeanCore(params, 0.0, 4.0, horizon, _source(j, -1)) for j in range(streams)]
    lock = MeanLockstep([ContinualMeanCore(params, 0.0, 4.0, horizon, _source(j, -1))
                         for j in range(streams)])
    activations = set()
    for t in range(steps):
        mine = []
        for j, core in enumerate(alone):
            core.set_noise_source(_source(j, t))
            mine.append(core.step(aggs[j][t]))
        theirs = lock.step([aggs[j][t] for j in range(streams)],
                           [_source(j, t) for j in range(streams)])
        assert [_fields(o) for o in theirs] == [_fields(o) for o in mine], t
        activations.add(tuple(tuple(o.active) for o in mine))
        # Between steps the trees already hold their step counts (read by activation margins).
        assert all(tree.t == t + 1 for core in lock.cores
                   for tree in core.tree_list + [core.count_tree] if tree is not None)
    lock.write_back()
    for a, b in zip(alone, lock.cores):
        assert repr(a.to_state()) == repr(b.to_state())
        # Each stream drew from its own last source as often as alone.
        assert a.source.draws == b.source.draws
    if params.prior_levels:
        # The streams' levels activated at different steps: their active sets differed.
        assert len(activations) > 2
        # Priors were set: by medians (paper), else from the release or the query's answer.
        assert any(core.prior for core in alone)
    if params.query:
        assert any(core.query is not None for core in alone)


def test_lockstep_steps_scalar_trees_as_one_and_vectors_one_by_one(monkeypatch):
    calls = []
    for name in ("LockstepTrees", "LockstepBLT", "LockstepStreams"):
        cls = getattr(counting, name)
        monkeypatch.setattr(cls, "step", lambda self, x, sources, name=name, step=cls.step:
                            calls.append((name, len(x))) or step(self, x, sources))
    scalar = MeanParams(max_users=60, max_samples_per_user=64, epsilon=20.0)
    lock = MeanLockstep([ContinualMeanCore(scalar, rng=_source(j, -1)) for j in range(4)])
    lock.step([None] * 4, [_source(j, 0) for j in range(4)])
    # The count tree, then each value tree, for all four streams at once.
    assert calls == [("LockstepTrees", 4)] * (1 + len(scalar.tree_groups))
    calls.clear()
    gaussian = MeanParams(max_users=60, max_samples_per_user=64, epsilon=20.0,
                          noise="gaussian", delta=1e-6)
    lock = MeanLockstep([ContinualMeanCore(gaussian, horizon=16, rng=_source(j, -1))
                         for j in range(3)])
    lock.step([None] * 3, [_source(j, 0) for j in range(3)])
    assert {name for name, _ in calls} == {"LockstepBLT"} and all(n == 3 for _, n in calls)
    calls.clear()
    vector = MeanParams(max_users=60, max_samples_per_user=16, epsilon=20.0, dim=2)
    lock = MeanLockstep([ContinualMeanCore(vector, rng=_source(j, -1)) for j in range(3)])
    out = lock.step([None] * 3, [_source(j, 0) for j in range(3)])
    # The scalar count tree together; the d = 2 value trees each by its own mechanism.
    assert calls == [("LockstepTrees", 3)] and len(out) == 3


def test_lockstep_refuses_streams_that_differ():
    params = MeanParams(max_users=60, max_samples_per_user=64, epsilon=20.0)
    other = MeanParams(max_users=60, max_samples_per_user=64, epsilon=20.0)

    def core(p=params, **kw):
        return ContinualMeanCore(p, rng=_source(0, -1), **kw)

    assert MeanLockstep.eligible([core(), core()])
    assert not MeanLockstep.eligible([])
    assert not MeanLockstep.eligible([core(), core(other)])                 # parameter objects
    assert not MeanLockstep.eligible([core(), core(upper=2.0)])             # bounds
    assert not MeanLockstep.eligible([core(), core(horizon=8)])             # horizons
    ahead = core()
    ahead.step(MeanAggregate())
    assert not MeanLockstep.eligible([core(), ahead])                       # step counts
    with pytest.raises(ValueError, match="same parameters"):
        MeanLockstep([core(), ahead])
    lock = MeanLockstep([core(), core()])
    with pytest.raises(ValueError, match="one entry per stream"):
        lock.step([None], [_source(0, 0), _source(1, 0)])
