"""The release record of ``ContinualMean`` (docs/privacy/mean.md, M-7).

Kept apart from :mod:`dp_beam.records` so that the shared schemas stay
unchanged; it follows the same conventions (NamedTuple, epoch seconds,
``to_json`` from :mod:`dp_beam.records` works on it).
"""

from typing import Any, NamedTuple

__all__ = ["MeanRelease"]


class MeanRelease(NamedTuple):
    """One release of a continual user-level mean.

    ``value`` is the estimate μ̂_t in the caller's units (a float, or a list
    for vector values); ``diverse`` the public diversity flag Div(t)
    (Definition 3.3 of arXiv:2212.09980): the accuracy guarantee of Theorem 3.4 applies only when it
    is true. ``noise_std``/``ci95`` describe the noise in ``value`` (exact for
    ``neighbours="values"``; a first-order approximation under
    ``"participation"``, whose denominator is noisy too). ``denominator`` is
    N_t, the samples the estimate represents (noisy under participation);
    ``active_levels`` the levels ℓ whose tree B_ℓ is in the estimate.
    For d-dimensional values (M-4, M-6) ``value``, ``noise_std`` and ``ci95``
    are lists of d floats, one per coordinate. ``key`` is the stream's key
    (``None`` without ``key_fn``).

    >>> from dp_beam.records import to_json
    >>> r = MeanRelease("JFK", 3, 259200.0, 345600.0, [12.5, 0.4], [1.5, 0.02], [2.9, 0.04],
    ...                 "withhold_release_mean+tree", "delay", 4, True, 1200.0, (0, 1, 2))
    >>> to_json(r)["value"], to_json(r)["active_levels"]
    ([12.5, 0.4], [0, 1, 2])
    """
    key: Any
    step: int
    window_start: float
    window_end: float
    value: Any
    noise_std: Any
    ci95: Any
    mechanism: str
    transform: str = ""
    t: int = 0
    diverse: bool = False
    denominator: float = 0.0
    active_levels: tuple = ()
    neighbours: str = ""
