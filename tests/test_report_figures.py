"""The report's figure (report_figures.py): panels per stream, per model stream, the budget."""

import pytest

from dp_beam import report_figures as figures
from dp_beam.report_budget import BudgetRow
from dp_beam.report_reading import ReportError

pytest.importorskip("matplotlib")


def _release(step, value, record="Release"):
    return dict(record=record, transform="t", key=None, step=step, value=value, ci95=0.5,
                window_start=3600.0 * step, window_end=3600.0 * (step + 1), mechanism="tree")


def test_display_range_clips_means_only():
    mean = [_release(s, v, "MeanRelease") for s, v in enumerate([100.0] + [1.0, 3.0] * 10)]
    assert figures.display_range([_release(0, 1.0), _release(1, 2.0)]) is None
    assert figures.display_range(mean, (0, 5)) == (0.0, 5.0)
    # The first tenth (here the outlier 100) is left out, the rest widened by a tenth.
    lo, hi = figures.display_range(mean)
    assert (lo, hi) == pytest.approx((0.8, 3.2))


def test_series_figure_has_a_row_per_stream_and_model_stream_and_one_for_the_budget():
    import matplotlib.pyplot as plt

    long = [_release(s, float(s)) for s in range(10)]
    model = {"t": 5, "window_end": 3600.0, "weights": [0.5, -1.0]}
    row = BudgetRow("event", "add/remove", 1.0, None, None, "", None, None, None,
                    {"t": 1.0}, ("t",), "")
    fig = figures.series_figure({("t", "null"): long, ("u", '"k"'): long[:2]}, zoom=4,
                                models={("erm", "null"): [model]}, rows=[row],
                                consistent={"t"})
    axes = fig.axes
    assert len(axes) == 8
    assert axes[0].get_title() == "t (10 steps)" and axes[1].get_title() == "last 4 steps"
    assert axes[2].get_title() == "u — key k (2 steps)" and not axes[3].axison
    assert axes[4].get_title().startswith("erm (1 models")
    assert "isotonic" in " ".join(t.get_text() for t in axes[0].get_legend().get_texts())
    assert axes[6].get_xlabel() == "ε"
    plt.close(fig)


def test_series_figure_without_anything_to_plot_is_an_error():
    with pytest.raises(ReportError, match="nothing to plot"):
        figures.series_figure({})


def test_plot_series_returns_and_writes_the_png(tmp_path):
    out = tmp_path / "plot.png"
    png = figures.plot_series({("t", "null"): [_release(0, 1.0)]}, str(out), rows=[])
    assert png[:4] == b"\x89PNG" and out.read_bytes() == png
