"""The release record of ``IncrementalRegression`` (``docs/privacy/regression.md``).

Kept apart from :mod:`dp_beam.records` so that the shared schemas stay
unchanged; it follows the same conventions (NamedTuple, epoch seconds,
``to_json`` from :mod:`dp_beam.records` works on it).
"""

from typing import Any, NamedTuple, Optional

__all__ = ["RegressionRecord"]


class RegressionRecord(NamedTuple):
    """The private linear model of one stream at one step (seed 002: one model per step).

    ``theta`` (a list of d floats) lies in the constraint set named by
    ``constraint`` (e.g. ``"l2_ball(4)"``); predictions are ``⟨x, θ⟩`` on
    features scaled as the transform's ``features_fn`` returns them (clipped
    to ‖x‖ <= 1). ``t`` is the 1-based index of the step in its stream and
    ``n`` the number of records through it (public under replace-one
    neighbours). ``covers`` is the range of steps ``(first, last)`` whose
    records the model is a function of (``None`` before PrivIncERM's first
    batch run). ``noise_std_gram`` / ``noise_std_xy``: per-coordinate std of
    the noisy running sums behind the model (diagonal of the Gram matrix;
    off-diagonal entries have ``1/√2`` of it); ``noise_std_model``: std per
    coordinate of PrivIncERM's output perturbation; ``alpha``: the bound on the
    error of the private gradient (regression.md R-2 to R-5). All noise figures are public.
    The stream's privacy cost is on ``.accounting``.

    >>> from dp_beam.records import to_json
    >>> r = RegressionRecord("JFK", 5, 18000.0, 21600.0, 6, 1240, [0.9, -0.1], "l2_ball(4)",
    ...                      "privincreg1", "exact", (0, 5), 43.4, 61.4, 0.0, 5104.2,
    ...                      "privincreg1(blt)", "arrival delay")
    >>> to_json(r)["record"], to_json(r)["theta"], r.covers
    ('RegressionRecord', [0.9, -0.1], (0, 5))
    """
    key: Any
    step: int
    window_start: float
    window_end: float
    t: int
    n: int
    theta: list
    constraint: str
    method: str
    solver: str
    covers: Optional[tuple]
    noise_std_gram: float
    noise_std_xy: float
    noise_std_model: float
    alpha: float
    mechanism: str
    transform: str = ""
