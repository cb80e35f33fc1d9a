"""The release record of the private ERM transforms (``docs/privacy/erm.md``).

Kept apart from :mod:`dp_beam.records` so that the shared schemas stay
unchanged; it follows the same conventions (NamedTuple, epoch seconds,
``to_json`` from :mod:`dp_beam.records` works on it).
"""

from typing import Any, NamedTuple, Optional

__all__ = ["ModelRecord"]


class ModelRecord(NamedTuple):
    """One released model of ``ContinualERM`` / ``SlidingWindowERM`` / ``MultiResolutionERM``.

    ``step``/``window_start``/``window_end`` name the event-time step in which
    the block that triggered the release completed. Record ranges are
    half-open ``(a, b]`` over the stream's points in event-time order (1-based:
    ``(0, 8]`` is the first 8 points): ``trained_on`` is this call's training
    data, ``blocks`` the same range in blocks, ``data_window`` the window the
    model stands for (the whole history for cumulative releases),
    ``depends_on`` every range the model is a function of through its chain of
    regularisers. ``weights`` is a list (binary) or a list of per-class lists
    (softmax) in the order of ``classes``; ``intercept`` a float or a list.
    ``noise_std`` is the public per-coordinate standard deviation of the
    output-perturbation noise (``noise_scale`` its Laplace/Gaussian scale);
    ``call_epsilon``/``call_rho`` are what the model's training call cost each
    of its records; a model released again (a reused sliding-window bucket)
    repeats them but is charged only once. The stream's total is on
    ``.accounting``.
    """
    key: Any
    step: int
    window_start: float
    window_end: float
    t: int
    kind: str
    level: int
    weights: Any
    intercept: Any
    classes: tuple
    trained_on: tuple
    blocks: tuple
    data_window: tuple
    depends_on: tuple
    regulariser: Optional[tuple]
    noise: str
    noise_scale: float
    noise_std: float
    call_epsilon: Optional[float]
    call_rho: float
    mechanism: str
    transform: str = ""
