"""Noise sources (the exact confidence-interval widths of sums of noises are in
:mod:`~dp_beam.mechanisms.halfwidths`, re-exported here).

Every mechanism in :mod:`dp_beam.mechanisms` draws its randomness through a
:class:`NoiseSource`, so production code and tests differ only in the source
that is injected (``docs/privacy/counting.md`` C-4: the noise of a node is
drawn once, at creation, from an injected source; ``docs/design.md`` D5).

* :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` (module ``noise_key``)
  is the production source and the default (``rng=None``, with a fresh key
  from the OS per mechanism): its draws are a function of a secret
  :class:`~dp_beam.mechanisms.noise_key.NoiseKey` and a public draw
  identity, so a bundle that a runner retries re-releases the noise of its
  first attempt instead of a second, independent one (which would be an
  uncounted extra release), and its exact discrete samplers on a
  power-of-two grid, with the mechanisms rounding what they noise to that
  grid, make the released float itself covered by the guarantee.
* :class:`SecureNoise` is private too, an explicit option: OpenDP's float
  samplers on the OS CSPRNG, snapped to a power-of-two grid. The mechanisms
  add its noise to their statistic in floating point, so the released float
  is not covered by OpenDP's floating-point guarantee, and its draws are not
  reproducible (a retried bundle re-draws). It is kept for comparison and
  for callers that want OpenDP's samplers.
* :class:`SeededNoise` and :class:`ZeroNoise` exist for tests only.
"""

import math
import numbers
from typing import List, Optional, Union

import numpy as np

from .checks import check_dim, check_scale, check_size
from .halfwidths import gaussian_halfwidth, laplace_sum_halfwidth

__all__ = [
    "NoiseSource",
    "RngLike",
    "SecureNoise",
    "SeededNoise",
    "ZeroNoise",
    "make_noise",
    "laplace_sum_halfwidth",
    "gaussian_halfwidth",
]


class NoiseSource:
    """Interface of a source of i.i.d. additive noise.

    ``laplace(scale, size)`` returns ``size`` independent draws of
    ``Lap(scale)`` (density ``exp(-|z|/scale)/(2 scale)``, variance
    ``2 scale²``) and ``gaussian(sigma, size)`` independent draws of
    ``N(0, sigma²)``; both as float64 arrays of shape ``(size,)``. A scale of 0
    yields zeros. ``secure`` tells whether the source is fit for production.
    """

    secure = False
    #: True when every draw is an exact multiple of ``2^grid_exponent(scale)``
    #: (:class:`~dp_beam.mechanisms.noise_key.KeyedNoise`): a mechanism then
    #: rounds the values it noises to that grid, so that the released float is
    #: a function of the discrete mechanism's integer output alone.
    exact_grid = False

    def integer_noise(self, kind: str, scale: float, exponent: int, size: int) -> List[int]:
        """``size`` Python ints Z with ``Z·2^exponent`` distributed as noise of ``scale``.

        ``kind`` is ``"laplace"`` or ``"gaussian"``. For the mechanisms that
        compute their noised vector in integer units of ``2^exponent`` (BLT and
        the square-root Toeplitz factorisation). This default draws float
        noise and rounds it to the grid, which is post-processing of the
        noise; :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` draws the
        exact discrete Laplace or Gaussian of scale ``scale/2^exponent``
        instead.
        """
        if kind not in ("laplace", "gaussian"):
            raise ValueError(f"kind must be 'laplace' or 'gaussian', got {kind!r}")
        values = self.laplace(scale, size) if kind == "laplace" else self.gaussian(scale, size)
        # ldexp scales by a power of two exactly; round() is half to even.
        return [int(round(math.ldexp(float(v), -exponent))) for v in values]

    def float_noise(self, kind: str, scale: float, size: int) -> List[float]:
        """The next call of :meth:`laplace` (``kind`` ``"laplace"``) or :meth:`gaussian`
        (``"gaussian"``), as a list of Python floats: the same values, from the same
        position of the source.

        For mechanisms that keep a short vector in Python floats between steps
        (the tree's scalar and short-vector paths); :class:`~dp_beam.mechanisms.noise_key.KeyedNoise`
        answers it without building an array.
        """
        if kind == "laplace":
            return self.laplace(scale, size).tolist()
        if kind == "gaussian":
            return self.gaussian(scale, size).tolist()
        raise ValueError(f"kind must be 'laplace' or 'gaussian', got {kind!r}")

    def direction(self, dim: int) -> np.ndarray:
        """A unit vector uniform on the sphere in R^dim: the direction of a rotation-invariant
        noise (the L2-Laplace of :func:`~dp_beam.mechanisms.l2_laplace.l2_laplace_noise`).

        ``g/‖g‖`` for ``g`` the next :meth:`gaussian` call of scale 1 (uniform on the sphere:
        a standard normal vector is rotation invariant); a zero ``g``, possible only by
        rounding, is drawn again, at most 64 times. A float computation in every source;
        :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` draws its own ``g``.
        """
        dim = check_dim(dim)
        for _ in range(64):
            g = self.gaussian(1.0, dim)
            norm = float(np.linalg.norm(g))
            if norm > 0.0:
                return g / norm
        raise RuntimeError("noise source returned 64 zero Gaussian vectors; it cannot supply a direction")

    def laplace(self, scale: float, size: int) -> np.ndarray:
        scale = check_scale("scale", scale)
        size = check_size(size)
        if scale == 0.0 or size == 0:
            return np.zeros(size, dtype=np.float64)
        return np.asarray(self._laplace(scale, size), dtype=np.float64).reshape(size)

    def gaussian(self, sigma: float, size: int) -> np.ndarray:
        sigma = check_scale("sigma", sigma)
        size = check_size(size)
        if sigma == 0.0 or size == 0:
            return np.zeros(size, dtype=np.float64)
        return np.asarray(self._gaussian(sigma, size), dtype=np.float64).reshape(size)

    def _laplace(self, scale, size):
        raise NotImplementedError(f"{type(self).__name__} does not implement _laplace")

    def _gaussian(self, sigma, size):
        raise NotImplementedError(f"{type(self).__name__} does not implement _gaussian")


#: What a public ``rng`` argument accepts (see :func:`make_noise`): ``None``
#: for production noise, an int seed or a ``numpy.random.Generator`` for the
#: test-only :class:`SeededNoise`, or a :class:`NoiseSource` used as is.
RngLike = Optional[Union[int, np.random.Generator, NoiseSource]]


class SecureNoise(NoiseSource):
    """Production noise: OpenDP's floating-point-safe Laplace and Gaussian samplers.

    Each draw runs an OpenDP vector Laplace/Gaussian measurement on a zero
    vector, which returns pure noise. OpenDP samples from the OS CSPRNG and
    rounds on a power-of-two grid, which defeats the floating-point attack of
    Mironov (2012) that textbook ``inverse-CDF`` samplers are open to
    (``docs/design.md`` D5). The seed of the stream is never observable, so
    there is nothing to reproduce or to leak.

    Built measurements are cached per ``(kind, scale, size)`` because a
    mechanism asks for the same shape and scale at every step. Draws are made
    ``POOL`` samples at a time per ``(kind, scale)`` and handed out in order,
    each exactly once: one OpenDP call costs ~0.4 ms of overhead, which per
    scalar draw made noise 90 % of a release step's time (measured 463 µs
    per tree step with single draws, 39 µs without noise). Samples are
    independent, so serving them from a batch changes nothing in their
    distribution; an unused remainder is simply discarded. The cache and pool
    hold OpenDP handles and unused noise, neither of which may be pickled or
    shared, so pickling drops both; the restored source draws fresh OS entropy.
    """

    secure = True

    _CACHE_LIMIT = 64
    POOL = 256

    def __init__(self) -> None:
        self._cache = {}
        self._pool = {}

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self._cache = {}
        self._pool = {}

    def _pooled(self, kind, scale, size):
        if size >= self.POOL:
            return np.asarray(self._measurement(kind, scale, size)([0.0] * size), dtype=np.float64)
        samples, used = self._pool.get((kind, scale), (None, self.POOL))
        if used + size > self.POOL:
            if len(self._pool) >= self._CACHE_LIMIT:
                self._pool.clear()
            samples = np.asarray(
                self._measurement(kind, scale, self.POOL)([0.0] * self.POOL), dtype=np.float64)
            used = 0
        self._pool[(kind, scale)] = (samples, used + size)
        return samples[used:used + size].copy()

    def _measurement(self, kind, scale, size):
        key = (kind, scale, size)
        meas = self._cache.get(key)
        if meas is None:
            import opendp.prelude as dp

            # Vector Laplace/Gaussian on floats are "contrib" in OpenDP: proven
            # but not yet vetted; enabling is a global, idempotent switch.
            dp.enable_features("contrib")
            domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
            if kind == "laplace":
                meas = dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)
            else:
                meas = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
            if len(self._cache) >= self._CACHE_LIMIT:
                # Scales are few per mechanism; evicting everything keeps the
                # bookkeeping trivial when a long-lived source sees many.
                self._cache.clear()
            self._cache[key] = meas
        return meas

    def _laplace(self, scale, size):
        return self._pooled("laplace", scale, size)

    def _gaussian(self, sigma, size):
        return self._pooled("gaussian", sigma, size)


class SeededNoise(NoiseSource):
    """TEST ONLY: reproducible noise from a NumPy ``Generator``. NOT SECURE.

    NumPy's samplers are neither floating-point safe (Mironov 2012) nor
    unpredictable: anyone who knows the seed knows every noise value. Use it to
    make tests and benchmarks reproducible, never to release data.

    ``seed_or_generator`` is an int seed or a ``numpy.random.Generator``; a
    Generator is used (and advanced) in place, so a caller that keeps a
    reference can continue the same stream elsewhere.
    """

    secure = False

    def __init__(self, seed_or_generator: Union[int, np.random.Generator]) -> None:
        if isinstance(seed_or_generator, np.random.Generator):
            self.generator = seed_or_generator
        elif isinstance(seed_or_generator, numbers.Integral) and not isinstance(
            seed_or_generator, (bool, np.bool_)
        ):
            self.generator = np.random.default_rng(int(seed_or_generator))
        else:
            raise ValueError(
                "seed_or_generator must be an int or a numpy.random.Generator, "
                f"got {seed_or_generator!r}"
            )

    def _laplace(self, scale, size):
        return self.generator.laplace(0.0, scale, size)

    def _gaussian(self, sigma, size):
        return self.generator.normal(0.0, sigma, size)


class ZeroNoise(NoiseSource):
    """TEST ONLY: noise switched off. NEVER PRIVATE.

    Every draw is exactly 0, so a mechanism releases its exact statistic. It
    exists to test exactness of the non-random part of a mechanism (e.g. the
    exact prefix sums of ``docs/privacy/counting.md`` C-7).
    """

    secure = False

    def _laplace(self, scale, size):
        return np.zeros(size, dtype=np.float64)

    def _gaussian(self, sigma, size):
        return np.zeros(size, dtype=np.float64)


def make_noise(rng: RngLike) -> NoiseSource:
    """Resolve the public ``rng`` argument into a :class:`NoiseSource`.

    ``None`` means production noise: a
    :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` under a fresh 256-bit
    key from the OS (so two mechanisms never share noise, and a mechanism is
    exact on its noise grid); an int seed or a
    ``numpy.random.Generator`` means the test-only :class:`SeededNoise`; a
    :class:`NoiseSource` is used as is (``docs/design.md`` D1,
    D5). A bool is refused although it is an int, because
    ``rng=True`` is far more likely a mistake than the seed 1.
    """
    if rng is None:
        # Imported here: noise_key builds on this module.
        from .noise_key import KeyedNoise, NoiseKey

        return KeyedNoise(NoiseKey.generate(), ("mechanism",))
    if isinstance(rng, NoiseSource):
        return rng
    if isinstance(rng, (bool, np.bool_)):
        raise ValueError(f"rng must be None, an int seed, a numpy Generator or a NoiseSource, got {rng!r}")
    if isinstance(rng, (numbers.Integral, np.random.Generator)):
        return SeededNoise(rng)
    raise ValueError(f"rng must be None, an int seed, a numpy Generator or a NoiseSource, got {rng!r}")
