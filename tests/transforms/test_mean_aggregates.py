"""Per-step aggregates of ``ContinualMean``: packing, merging, output form."""

import itertools
import pickle

import numpy as np
import pytest
from apache_beam import coders

from dp_beam.mechanisms.continual_mean import MeanAggregate, MeanParams, mean_config
from dp_beam.mechanisms.continual_mean import UserState, contribution, user_hash
from dp_beam.transforms.mean_aggregates import (MergeAggregates, PackedSamples, accumulator,
                                                merge_into, plain)


def _triples(n, first=0, d=2):
    return [((first + i % 3, 100 + i), i + 1, np.arange(d, dtype=np.float64) + i / 8)
            for i in range(n)]


def _as_lists(samples):
    return [(k, i, np.asarray(x).tolist()) for k, i, x in samples]


def test_packed_samples_round_trip_through_pickle_in_order():
    loose = _triples(5)
    packed = PackedSamples(loose)
    back = pickle.loads(pickle.dumps(packed))
    assert _as_lists(back) == _as_lists(loose)
    assert len(back) == 5 and bool(back)
    # Keys come back as Python ints and values as float64 vectors, as the core expects.
    (key, index, x) = next(iter(back))
    assert all(type(v) is int for v in key) and type(index) is int
    assert x.dtype == np.float64 and x.shape == (2,)


def test_packed_samples_concatenate_like_lists_and_ship_one_chunk():
    a, b, c = _triples(3), _triples(4, first=5), _triples(2, first=9)
    left = pickle.loads(pickle.dumps(PackedSamples(a)))    # packed chunk
    left.extend(pickle.loads(pickle.dumps(PackedSamples(b))))
    left.extend(c)                                           # loose triples
    assert _as_lists(left) == _as_lists(a + b + c)
    assert len(left) == 9
    # Two chunks and loose samples leave as one chunk, order kept.
    chunks = left.__reduce__()[1][1]
    assert len(chunks) == 1 and len(chunks[0][1]) == 9
    assert _as_lists(pickle.loads(pickle.dumps(left))) == _as_lists(a + b + c)
    # `+` and the reflected `+` with a list, as the list form of MeanAggregate.samples.
    assert _as_lists(PackedSamples(a) + b) == _as_lists(a + b)
    assert _as_lists(a + PackedSamples(b)) == _as_lists(a + b)


def test_empty_packed_samples_are_false_and_survive_pickling():
    empty = PackedSamples()
    assert not empty and len(empty) == 0 and list(empty) == []
    again = pickle.loads(pickle.dumps(empty))
    assert not again and list(again) == []


def _params(**kw):
    args = dict(max_users=50, max_samples_per_user=8, epsilon=1.0, dim=2, neighbours="values",
                preset="paper")
    args.update(kw)
    return MeanParams(mean_config("test", **args))


def _user_aggregates(params, users=6, samples=8, seed=3):
    """The per-sample aggregates of a few users (dyadic values: sums are exact in any order)."""
    rnd = np.random.default_rng(seed)
    out = []
    for u in range(users):
        state = UserState(uhash=user_hash(f"u{u}"))
        for _ in range(samples):
            x = rnd.integers(0, 16, size=params.dim) / 16.0
            out.append(contribution(params, state, x, step=0))
    return out


def _fields(agg):
    def norm(v):
        return np.asarray(v).tolist() if isinstance(v, np.ndarray) else v
    out = {name: {k: norm(v) for k, v in getattr(agg, name).items()}
           for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc")}
    out["events"], out["max_count"] = agg.events, agg.max_count
    out["samples"] = sorted(_as_lists(agg.samples))
    return out


@pytest.mark.parametrize("preset", ["paper", "tuned"])
def test_merging_in_any_order_gives_the_same_aggregate(preset):
    params = _params(preset=preset)
    aggs = _user_aggregates(params)
    reference = MeanAggregate()
    for a in aggs:
        reference = reference.merge(a)
    assert reference.events == len(aggs) and reference.counts
    rnd = np.random.default_rng(0)
    for _ in range(5):
        order = rnd.permutation(len(aggs))
        acc = accumulator()
        for i in order:
            merge_into(acc, aggs[i])
        assert _fields(acc) == _fields(reference)


def test_merge_into_leaves_its_input_unchanged():
    params = _params()
    aggs = _user_aggregates(params, users=2)
    before = [pickle.dumps(a) for a in aggs]
    acc = accumulator()
    for a in aggs:
        merge_into(acc, a)
    merge_into(acc, aggs[0])     # a second time: the first merge must not alias into acc
    assert [pickle.dumps(a) for a in aggs] == before


def test_combine_fn_splits_and_merges_like_one_accumulator():
    params = _params()
    aggs = _user_aggregates(params)
    fn = MergeAggregates()
    whole = fn.create_accumulator()
    for a in aggs:
        whole = fn.add_input(whole, a)
    parts = []
    for chunk in (aggs[:7], aggs[7:20], aggs[20:]):
        acc = fn.create_accumulator()
        for a in chunk:
            acc = fn.add_input(acc, a)
        parts.append(pickle.loads(pickle.dumps(acc)))     # as a runner ships them
    for perm in itertools.permutations(parts):
        merged = fn.extract_output(fn.merge_accumulators(list(perm)))
        assert _fields(merged) == _fields(whole)
    assert isinstance(whole.samples, PackedSamples)


@pytest.mark.parametrize("dim,preset", [(1, "tuned"), (2, "paper")])
def test_compacted_accumulators_cross_the_runners_coder_and_merge_as_the_objects(dim, preset):
    params = _params(dim=dim, preset=preset, neighbours="participation")
    aggs = _user_aggregates(params, users=4)
    if dim == 1:
        # The transform's scalar contributions: floats, not 1-vectors.
        aggs = [contribution(params, UserState(uhash=user_hash(f"v{u}")), float(k) / 16.0)
                for u in range(4) for k in range(8)]
    fn = MergeAggregates()
    parts = []
    for chunk in (aggs[:5], aggs[5:]):
        acc = fn.create_accumulator()
        for a in chunk:
            acc = fn.add_input(acc, a)
        parts.append(acc)
    coder = coders.FastPrimitivesCoder()
    wire = [coder.decode(coder.encode(fn.compact(p))) for p in parts]
    assert _fields(fn.extract_output(fn.merge_accumulators(wire))) == _fields(
        fn.extract_output(fn.merge_accumulators(parts)))
    # Mixed forms, and one compacted partial alone (a (key, step) that one bundle held).
    assert _fields(fn.extract_output(fn.merge_accumulators([parts[0], wire[1]]))) == _fields(
        fn.extract_output(fn.merge_accumulators(parts)))
    assert _fields(fn.extract_output(wire[0])) == _fields(parts[0])
    if dim == 1:
        # Nothing the coder has to pickle: ints, floats, dicts of them, the empty tuple.
        def plain_only(v):
            if isinstance(v, dict):
                return all(type(k) is int and plain_only(x) for k, x in v.items())
            if type(v) is tuple:
                return all(plain_only(x) for x in v)
            return type(v) in (int, float)
        assert all(plain_only(w) for w in wire)


def test_merged_aggregates_pickle_and_load_as_mean_aggregates():
    params = _params()
    acc = accumulator()
    for a in _user_aggregates(params, users=3):
        merge_into(acc, a)
    back = pickle.loads(pickle.dumps(acc))
    assert isinstance(back, MeanAggregate)
    assert _fields(back) == _fields(acc)


def test_plain_turns_core_outputs_into_json_numbers():
    assert plain(np.float64(0.25)) == 0.25 and type(plain(np.float64(0.25))) is float
    assert plain(3) == 3.0 and type(plain(3)) is float
    out = plain(np.array([[0.5], [1.5]]))
    assert out == [0.5, 1.5] and all(type(v) is float for v in out)


def test_aggregates_without_samples_hold_the_empty_tuple_and_merge_with_any_form():
    params = _params()
    with_samples = [a for a in _user_aggregates(params, users=2) if a.samples]
    bare = MeanAggregate()
    assert bare.samples == () and accumulator().samples == ()
    for other in (with_samples[0], MeanAggregate()):
        for a, b in ((bare, other), (other, bare)):
            merged = a.merge(b)
            assert _as_lists(merged.samples) == _as_lists(other.samples)
            assert type(merged.samples) is not tuple
    # merge_into: the first samples give an accumulator a PackedSamples of its own.
    acc = accumulator()
    merge_into(acc, MeanAggregate())
    assert acc.samples == ()
    for a in with_samples:
        merge_into(acc, a)
    assert isinstance(acc.samples, PackedSamples)
    assert _as_lists(acc.samples) == [t for a in with_samples for t in _as_lists(a.samples)]
    packed = accumulator()
    merge_into(packed, acc)
    assert _as_lists(packed.samples) == _as_lists(acc.samples)
    assert _as_lists(pickle.loads(pickle.dumps(MeanAggregate())).samples) == []
