"""dp_beam: differentially private continual release over event streams, as Beam transforms.

Engine-free mechanisms live in :mod:`dp_beam.mechanisms`; the Beam transforms
(:class:`ContinualCount`, :class:`ContinualSum`, :class:`CombineAccounting`)
are thin adapters around them.

The names below are imported on first use (PEP 562), so that importing the
package, or ``dp_beam.cli`` for ``dp-beam --help``, does not import Apache
Beam (about 1.7 s, and a warning about BigQuery client libraries) until a
transform is needed.
"""

import importlib

__version__ = "0.1.0"

# name -> module that defines it (a submodule's own name maps to itself)
_LAZY = {
    "accounting": "dp_beam.accounting", "io": "dp_beam.io",
    "mechanisms": "dp_beam.mechanisms", "records": "dp_beam.records",
    "Budget": "dp_beam.accounting",
    "NoiseKey": "dp_beam.mechanisms.noise_key",
    "AccountingReport": "dp_beam.records", "InvalidElement": "dp_beam.records",
    "KeyAdmitted": "dp_beam.records", "LedgerEntry": "dp_beam.records",
    "Release": "dp_beam.records",
    "MeanRelease": "dp_beam.records_mean",
    **{name: "dp_beam.records_growing" for name in (
        "HISTOGRAM", "HistogramRelease", "QueryAnswer", "SyntheticRelease", "answer_linear_query")},
    "GrowingQueries": "dp_beam.transforms.growing", "GrowingSynthetic": "dp_beam.transforms.growing",
    **{name: "dp_beam.transforms.growing_names" for name in ("BBImprover", "BBScheduler", "PMWG")},
    "IncrementalRegression": "dp_beam.transforms.incremental_regression",
    **{name: "dp_beam.transforms" for name in (
        "CombineAccounting", "ContinualCount", "ContinualERM", "ContinualMean",
        "ContinualResult", "ContinualSum", "MultiResolutionERM", "PrivateKeys",
        "SlidingWindowERM", "Stability", "plan")},
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dp_beam' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module == f"dp_beam.{name}" else getattr(loaded, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["AccountingReport", "Budget", "CombineAccounting", "ContinualCount", "ContinualERM",
           "ContinualMean", "IncrementalRegression", "KeyAdmitted", "MultiResolutionERM", "NoiseKey", "PrivateKeys", "SlidingWindowERM",
           "ContinualResult", "ContinualSum", "InvalidElement", "LedgerEntry", "MeanRelease",
           "Release", "Stability", "accounting", "io", "mechanisms", "plan", "records",
           "BBImprover", "BBScheduler", "PMWG",
           "GrowingQueries", "GrowingSynthetic", "HISTOGRAM", "HistogramRelease", "QueryAnswer",
           "SyntheticRelease", "answer_linear_query"]
