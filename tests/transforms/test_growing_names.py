"""The design names of the growing-database transforms (dp_beam.transforms.growing_names):
BBScheduler and BBImprover are GrowingSynthetic with the scheduler fixed, PMWG is
GrowingQueries; every argument and output is theirs."""

import pytest

import dp_beam as dpb
from dp_beam.mechanisms.growing import LaplaceHistogram
from dp_beam.transforms import growing_names
from dp_beam.transforms.growing import GrowingQueries, GrowingSynthetic

COMMON = dict(epsilon=1.0, n=10, step=10, start=0)


def cell(r):
    return r["cell"]


def test_the_names_are_the_package_names():
    assert growing_names.__all__ == ["BBScheduler", "BBImprover", "PMWG"]
    for name in growing_names.__all__:
        assert getattr(dpb, name) is getattr(growing_names, name)
    assert issubclass(growing_names.BBScheduler, GrowingSynthetic)
    assert issubclass(growing_names.BBImprover, GrowingSynthetic)
    assert issubclass(growing_names.PMWG, GrowingQueries)


def test_bbscheduler_is_the_epochs_scheduler():
    t = growing_names.BBScheduler(cell, 3, black_box=LaplaceHistogram(3), **COMMON)
    direct = GrowingSynthetic(cell, 3, black_box=LaplaceHistogram(3), scheduler="epochs", **COMMON)
    assert type(t.params).__name__ == "BBSchedulerParams"
    assert t.params == direct.params
    assert t.plan_entry("x").mechanism == "bbscheduler(laplace_histogram)"
    assert t.plan_entry("x").epsilon == direct.plan_entry("x").epsilon == 1.0


def test_bbimprover_is_the_every_step_scheduler():
    t = growing_names.BBImprover(cell, 3, black_box=LaplaceHistogram(3), delta=1e-6, **COMMON)
    assert type(t.params).__name__ == "BBImproverParams"
    assert t.plan_entry("x").mechanism == "bbimprover(laplace_histogram)"


def test_pmwg_is_growing_queries():
    t = growing_names.PMWG(cell, 3, alpha=0.3, **COMMON)
    direct = GrowingQueries(cell, 3, alpha=0.3, **COMMON)
    assert type(t.params).__name__ == "PMWGParams"
    assert t.params == direct.params
    assert t.plan_entry("x").mechanism == direct.plan_entry("x").mechanism == "pmwg"


@pytest.mark.parametrize("cls, other", [(growing_names.BBScheduler, "every_step"),
                                        (growing_names.BBImprover, "epochs")])
def test_the_scheduler_cannot_be_overridden(cls, other):
    with pytest.raises(ValueError, match="scheduler is fixed"):
        cls(cell, 3, black_box=LaplaceHistogram(3), delta=1e-6, scheduler=other, **COMMON)


def test_the_aliases_validate_like_the_transforms_they_name():
    with pytest.raises(ValueError, match="delta"):
        growing_names.BBImprover(cell, 3, black_box=LaplaceHistogram(3), **COMMON)
