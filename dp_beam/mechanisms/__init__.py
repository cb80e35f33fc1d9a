"""Engine-free differential-privacy mechanisms (NumPy/SciPy/OpenDP only, no Beam).

See ``docs/design.md`` D1.1: each mechanism has explicit, serialisable state, a
``step`` that consumes one time step and returns one release, and public
methods stating its noise and privacy cost.
"""

from .calibration import (
    CALIBRATIONS,
    eps_from_rho_delta,
    gaussian_sigma,
    laplace_scale,
    rho_from_eps,
    rho_from_eps_delta,
)
from .noise import (
    NoiseSource,
    SecureNoise,
    SeededNoise,
    ZeroNoise,
    gaussian_halfwidth,
    laplace_sum_halfwidth,
    make_noise,
)
from .counting import BinaryTreeMechanism

__all__ = [
    "BinaryTreeMechanism",
    "NoiseSource",
    "SecureNoise",
    "SeededNoise",
    "ZeroNoise",
    "make_noise",
    "laplace_sum_halfwidth",
    "gaussian_halfwidth",
    "CALIBRATIONS",
    "rho_from_eps_delta",
    "eps_from_rho_delta",
    "rho_from_eps",
    "gaussian_sigma",
    "laplace_scale",
]

# Near-optimal continual counting: factorisation mechanisms with the tree's interface.
from .counting import (
    MECHANISMS,
    BLTMechanism,
    CounterConfig,
    HonakerTreeMechanism,
    SmoothBinaryMechanism,
    SqrtToeplitzMechanism,
    get_mechanism,
    participation_norm,
    participation_sensitivity,
    prefix_sum_lower_bound,
)

__all__ += [
    "CounterConfig",
    "HonakerTreeMechanism",
    "SmoothBinaryMechanism",
    "BLTMechanism",
    "SqrtToeplitzMechanism",
    "MECHANISMS",
    "get_mechanism",
    "participation_norm",
    "participation_sensitivity",
    "prefix_sum_lower_bound",
]

# Private key selection for continual release (counters of distinct units per key).
from .key_selection import KeyCounter, KeySelection, KeySparseVector

__all__ += [
    "KeySelection",
    "KeyCounter",
    "KeySparseVector",
]

# Keyed noise: the same secret key and draw identity give the same exact,
# grid-valued noise in every process, so retried bundles re-release, not redraw.
from .noise_grid import grid_exponent, round_to_grid
from .noise_key import KeyedNoise, NoiseKey

__all__ += [
    "NoiseKey",
    "KeyedNoise",
    "round_to_grid",
    "grid_exponent",
]
