"""The growing-database transforms under their ``docs/design.md`` (D1) names: ``dpb.BBScheduler``,
``dpb.BBImprover``, ``dpb.PMWG``.

Thin aliases (``docs/privacy/growing.md`` G-3, G-4, G-5, G-8): ``BBScheduler(...)`` is
``GrowingSynthetic(..., scheduler="epochs")``, ``BBImprover(...)`` is
``GrowingSynthetic(..., scheduler="every_step")`` and ``PMWG(...)`` is
``GrowingQueries(...)``; every argument and output is theirs.

>>> import dp_beam as dpb
>>> from dp_beam.mechanisms.growing import LaplaceHistogram
>>> t = dpb.BBImprover(lambda r: r["cell"], 3, black_box=LaplaceHistogram(3), epsilon=1.0,
...                    delta=1e-6, n=10, step=10, start=0)
>>> type(t.params).__name__, t.plan_entry("x").mechanism
('BBImproverParams', 'bbimprover(laplace_histogram)')
"""

from dp_beam.transforms.growing import GrowingQueries, GrowingSynthetic

__all__ = ["BBScheduler", "BBImprover", "PMWG"]


class BBScheduler(GrowingSynthetic):
    """``GrowingSynthetic(..., scheduler="epochs")``: one black-box run per epoch (growing.md G-3, G-4)."""

    def __init__(self, universe_fn, universe_size, **kwargs):
        if "scheduler" in kwargs:
            raise ValueError("scheduler is fixed to 'epochs' for BBScheduler")
        super().__init__(universe_fn, universe_size, scheduler="epochs", **kwargs)


class BBImprover(GrowingSynthetic):
    """``GrowingSynthetic(..., scheduler="every_step")``: a run after every step with arrivals
    (growing.md G-5); needs ``delta`` in (0, 1/e)."""

    def __init__(self, universe_fn, universe_size, **kwargs):
        if "scheduler" in kwargs:
            raise ValueError("scheduler is fixed to 'every_step' for BBImprover")
        super().__init__(universe_fn, universe_size, scheduler="every_step", **kwargs)


class PMWG(GrowingQueries):
    """``GrowingQueries``: Private Multiplicative Weights for Growing databases (growing.md G-8)."""
