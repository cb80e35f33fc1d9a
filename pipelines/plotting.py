"""Plots of continual releases read back from a JSON-lines release file.

matplotlib is imported inside :func:`plot_releases`, so that workers and
anything else importing the pipelines need neither the plotting extra nor a
display.
"""

import json
from collections import defaultdict
from datetime import datetime, timezone


def read_releases(releases_jsonl) -> dict:
    """Releases grouped by ``(transform, key)``, each group sorted by step."""
    streams = defaultdict(list)
    with open(releases_jsonl) as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("record", "Release") != "Release":
                continue
            key = rec.get("key")
            streams[(rec.get("transform", ""), json.dumps(key))].append(rec)
    return {k: sorted(v, key=lambda r: r["step"]) for k, v in streams.items()}


def _utc(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


ZOOM_STEPS = 72


def _zoom_inset(ax, x, value, lo, hi, truth, since):
    """The last steps, enlarged: over a long stream the band is thinner than the line."""
    inset = ax.inset_axes([0.58, 0.08, 0.4, 0.42])
    n = ZOOM_STEPS
    inset.fill_between(x[-n:], lo[-n:], hi[-n:], step="post", color="tab:blue", alpha=0.25,
                       linewidth=0)
    inset.step(x[-n:], value[-n:], where="post", color="tab:blue", linewidth=1.0)
    if truth:
        kept = [(t, v) for t, v in truth if t >= since]
        if kept:
            tx, tv = zip(*kept)
            inset.step([_utc(t) for t in tx], tv, where="post", color="black",
                       linewidth=0.8, linestyle="--")
    inset.set_title(f"last {n} steps", fontsize=7)
    inset.tick_params(labelsize=6)
    inset.ticklabel_format(axis="y", style="plain", useOffset=False)
    inset.xaxis.set_major_formatter(_concise_dates(inset, show_offset=False))
    inset.grid(True, alpha=0.3)


def _concise_dates(ax, show_offset=True):
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    ax.xaxis.set_major_locator(locator)
    return mdates.ConciseDateFormatter(locator, show_offset=show_offset)


def plot_releases(releases_jsonl, out_png, truth=None, titles=None):
    """Draw one panel per released stream: noisy running value and its 95 % band.

    ``truth`` optionally maps a transform name to ``[(window_end, value), ...]``,
    the non-private running value of that transform's stream. Only pass it for
    public data: a plot of the truth is not differentially private.
    ``titles`` optionally maps a transform name to a panel title.
    Returns the path written.
    """
    import matplotlib

    # Agg works without a display (CI, containers, remote workers).
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = read_releases(releases_jsonl)
    if not streams:
        raise ValueError(f"no releases in {releases_jsonl}")
    titles = titles or {}
    truth = truth or {}

    fig, axes = plt.subplots(len(streams), 1, figsize=(11, 3.6 * len(streams)),
                             sharex=True, squeeze=False)
    for ax, ((transform, key_json), recs) in zip(axes[:, 0], streams.items()):
        x = [_utc(r["window_end"]) for r in recs]
        value = [r["value"] for r in recs]
        lo = [r["value"] - r["ci95"] for r in recs]
        hi = [r["value"] + r["ci95"] for r in recs]
        last = recs[-1]
        ax.fill_between(x, lo, hi, step="post", color="tab:blue", alpha=0.25, linewidth=0,
                        label=f"95 % band (± {last['ci95']:.3g} at the last step)")
        ax.step(x, value, where="post", color="tab:blue", linewidth=1.0,
                label=f"private release ({last['mechanism']})")
        if transform in truth and truth[transform]:
            tx, tv = zip(*truth[transform])
            ax.step([_utc(t) for t in tx], tv, where="post", color="black", linewidth=0.8,
                    linestyle="--", label="non-private truth (public demo data)")
        if len(recs) > 2 * ZOOM_STEPS:
            _zoom_inset(ax, x, value, lo, hi, truth.get(transform), recs[-ZOOM_STEPS]["window_end"])
        title = titles.get(transform, transform or "release")
        if key_json != "null":
            title += f" — key {json.loads(key_json)}"
        ax.set_title(f"{title}   ({len(recs)} steps)", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))

    bottom = axes[-1, 0]
    bottom.xaxis.set_major_formatter(_concise_dates(bottom))
    bottom.set_xlabel("end of step window (UTC)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
