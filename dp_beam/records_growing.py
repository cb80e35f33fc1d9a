"""Release records of the growing-database transforms (``docs/privacy/growing.md``; seed 000).

Kept apart from :mod:`dp_beam.records` so that the shared schemas stay
unchanged; same conventions (NamedTuple, epoch seconds, ``to_json`` of
:mod:`dp_beam.records` works on them). ``t`` is the database size, which is
public for these transforms (their neighbours replace one record's cell).

:func:`answer_linear_query` answers any linear query from a released
synthetic histogram: post-processing, free.
"""

import collections
from typing import Any, List, Optional, Tuple

import numpy as np

__all__ = ["SyntheticRelease", "QueryAnswer", "HistogramRelease", "answer_linear_query",
           "HISTOGRAM"]

#: A query element for which ``query_fn`` returns this string asks ``GrowingQueries`` for
#: the current public histogram (a :class:`HistogramRelease`).
HISTOGRAM = "histogram"

#: The fields every release starts with: where in the stream it was made (the key, the step
#: and its event-time window, the database size).
_WHERE = [("key", Any), ("step", int), ("window_start", float), ("window_end", float), ("t", int)]
#: The fields every release ends with: what made it.
_MADE_BY = [("mechanism", str), ("transform", str)]


def _release_record(name: str, fields: List[Tuple[str, Any]]) -> type:
    """A NamedTuple base with the fields ``_WHERE + fields + _MADE_BY`` (``transform``
    defaults to ""): one place for the layout the three releases share, so their field order
    and ``to_json`` form stay the same."""
    types = dict([*_WHERE, *fields, *_MADE_BY])
    # What ``class X(NamedTuple)`` builds, so the field types stay visible to type hints.
    base = collections.namedtuple(name, list(types), defaults=("",), module=__name__)
    base.__annotations__ = base.__new__.__annotations__ = types

    def init_subclass(cls):
        # A subclass body without annotations would otherwise read as having no fields
        # to schema inference (Beam reads ``__annotations__`` of the record type).
        cls.__annotations__ = dict(types)

    base.__init_subclass__ = classmethod(init_subclass)
    return base


class SyntheticRelease(_release_record("SyntheticRelease", [
        ("run", int), ("epoch", int), ("epsilon", float), ("beta", float), ("alpha", float),
        ("pooled", int), ("kind", str), ("output", tuple)])):
    """One black-box run of ``GrowingSynthetic``: a synthetic histogram (or model) of the database.

    ``t`` is the size of the database it was computed on, ``epoch`` the
    BBScheduler epoch (or ``t`` for BBImprover), ``run`` its index;
    ``epsilon``/``beta``/``alpha`` the run's privacy parameter, failure
    probability and the accuracy asked of the black box, ``pooled`` how many
    scheduled runs it stands for (runs inside one step are pooled). ``output``
    is a tuple: the N cell weights (``kind="histogram"``) or the model's
    parameters (``kind="model"``).

    >>> r = SyntheticRelease(None, 3, 30.0, 40.0, 120, 2, 2, 0.1, 0.01, 0.2, 1, "histogram",
    ...                      (0.5, 0.25, 0.25), "bbscheduler(mwem)", "synth")
    >>> r.answer([1, 1, 0])
    0.75
    """

    __slots__ = ()

    def answer(self, query) -> float:
        """f(y) for a linear query f (a vector or a predicate on cell indices): free."""
        return answer_linear_query(self, query)


class QueryAnswer(_release_record("QueryAnswer", [
        ("query_id", Any), ("query_time", float), ("kind", str), ("value", Optional[float]),
        ("noise_std", float), ("hard", int), ("cap", int), ("within_budget", bool),
        ("alpha", Optional[float])])):
    """The answer to one query of ``GrowingQueries`` (PMWG) or ``GrowingSynthetic``.

    ``kind``: ``"easy"`` (``value`` = f(y) from the public histogram, exact),
    ``"hard"`` (f(x_t) plus Laplace noise of std ``noise_std``), ``"abort"``
    (PMWG exceeded its hard-query cap: permanent), ``"refused"`` (the database
    is smaller than n, or the query is over the enforced budget) or
    ``"synthetic"`` (f of the latest ``GrowingSynthetic`` release). ``hard`` and
    ``cap`` are PMWG's hard-query count and its cap H_cap(t) after the query;
    ``within_budget`` whether the cumulative number of queries is within
    Budget(t) (accuracy precondition, G-9). ``alpha`` is the accuracy target: PMWG's α,
    or for ``"synthetic"`` answers the α asked of the black box in the latest run (the
    staleness error γ/(1+γ) of Lemma 11 comes on top); ``None`` when refused by
    ``GrowingSynthetic``.
    """

    __slots__ = ()


class HistogramRelease(_release_record("HistogramRelease", [("query_id", Any),
                                                             ("weights", tuple)])):
    """PMWG's public histogram y (N weights summing to 1) at size ``t``, released on request."""

    __slots__ = ()


def answer_linear_query(release, query) -> float:
    """f(y) for a linear query on a released histogram: post-processing (no privacy cost).

    ``release`` is a :class:`SyntheticRelease` of kind ``"histogram"``, a
    :class:`HistogramRelease`, or a weight vector; ``query`` a vector in
    [0, 1]^N or a predicate on cell indices.

    >>> answer_linear_query((0.5, 0.25, 0.25), lambda i: i != 1)
    0.75
    """
    if isinstance(release, SyntheticRelease):
        if release.kind != "histogram":
            raise ValueError(f"a {release.kind} release does not answer linear queries")
        weights = release.output
    elif isinstance(release, HistogramRelease):
        weights = release.weights
    else:
        weights = release
    y = np.asarray(weights, dtype=np.float64)
    if callable(query):
        query = [float(query(i)) for i in range(y.shape[0])]
    f = np.asarray(query, dtype=np.float64)
    if f.shape != y.shape:
        raise ValueError(f"query must have N = {y.shape[0]} entries, got shape {f.shape}")
    return float(f @ y)
