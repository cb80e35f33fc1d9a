"""The binary (tree) mechanism for continual release of prefix sums.

Spec withhold_release_and_composition.md §1 (CSS10 Alg. 2 / DNPR10), with the
unbounded-stream construction U2 of §1.6.
"""

import functools
import math
import numbers

import numpy as np

from .calibration import CALIBRATIONS, gaussian_sigma, laplace_scale, rho_from_eps, rho_from_eps_delta
from .checks import check_step_index
from .noise import gaussian_halfwidth, laplace_sum_halfwidth, make_noise
from .noise_key import grid_padded_scale, round_to_grid

__all__ = ["BinaryTreeMechanism", "restore_parameters"]

NOISE_KINDS = ("laplace", "gaussian")


def _trailing_zeros(c):
    return (c & -c).bit_length() - 1


def restore_parameters(cls, state, rng, fields):
    """The common start of a continual mechanism's ``from_state``.

    Checks the state's type, mechanism name and version, rebuilds ``cls``
    from the constructor parameters the state stores (so every parameter is
    validated again), and returns ``(mechanism, t, [state[f] for f in fields])``
    with the step count ``t`` checked.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict, got {type(state).__name__}")
    if state.get("mechanism") != cls.name:
        raise ValueError(f"state is not a {cls.name!r} state: mechanism={state.get('mechanism')!r}")
    if state.get("version") != cls.STATE_VERSION:
        raise ValueError(f"unsupported state version {state.get('version')!r}, expected {cls.STATE_VERSION}")
    try:
        mech = cls(
            epsilon=state["epsilon"],
            sensitivity=state["sensitivity"],
            horizon=state["horizon"],
            noise=state["noise"],
            delta=state["delta"],
            dim=state["dim"],
            rng=rng,
            calibration=state["calibration"],
        )
        t = state["t"]
        values = [state[name] for name in fields]
    except KeyError as err:
        raise ValueError(f"state is missing field {err.args[0]!r}") from None
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        raise ValueError(f"state t must be an int >= 0, got {t!r}")
    return mech, int(t), values


@functools.lru_cache(maxsize=4096)
def _laplace_halfwidth(scales, level):
    # A release's node scales repeat across steps and keys (they depend on
    # popcount(t) and the epoch only), so each pattern is inverted once.
    return laplace_sum_halfwidth(scales, level)


@functools.lru_cache(maxsize=1024)
def _node_scale(noise, levels, sensitivity, epsilon, delta, calibration):
    # Calibrated for the node sensitivity padded by one grid step: with an
    # exact-grid source every node is rounded to the noise grid before it is
    # noised (BinaryTreeMechanism._noised). Cached across instances because a
    # release DoFn restores a fresh mechanism at every step.
    if noise == "laplace":
        return grid_padded_scale(sensitivity, lambda s: laplace_scale(levels * s, epsilon))
    return grid_padded_scale(sensitivity,
                             lambda s: gaussian_sigma(math.sqrt(levels) * s, epsilon, delta, calibration))


class BinaryTreeMechanism:
    """Noisy running sums (prefix sums) of a stream of scalars or vectors.

    After the t-th :meth:`step` it releases ``Σ_{s<=t} x_s + noise``, where the
    noise is the sum of the noises of the ``popcount(t)`` dyadic nodes that
    tile ``[1, t]`` (spec withhold_release_and_composition.md §1.1). Every node
    draws its noise exactly once, when it is created, and keeps it; reading a
    release again never draws new noise (§4 R7). All releases are
    post-processing of the vector of noisy nodes, so calibrating that vector
    covers the whole output sequence (§1.2).

    Parameters
    ----------
    epsilon:
        Privacy parameter ε > 0 of the whole output sequence.
    sensitivity:
        Bound Δ on the total change a privacy unit can cause to the input,
        summed over all steps: ``Σ_t ‖x_t − x'_t‖₁ <= Δ`` for Laplace,
        ``Σ_t ‖x_t − x'_t‖₂ <= Δ`` for Gaussian. The spec's ``c_u·Δ1`` (§1.2,
        §1.5) is folded in here by the caller. The nodes of one level cover
        disjoint steps and each node's change is the sum of the unit's changes
        at its steps, so one level moves by at most Δ in L1 (resp. in the
        Euclidean norm, as √(Σ‖·‖²) <= Σ‖·‖); over h levels the node vector
        moves by at most ``h·Δ`` in L1 and ``√h·Δ`` in L2.
    horizon:
        Number of steps T (an int >= 1), giving ``h = T.bit_length()`` levels
        (spec §0.2, §6 A3); step T+1 raises. ``None`` means an unbounded stream
        (construction U2 below).
    noise:
        ``"laplace"``: pure ε-DP, node noise ``Lap(h·Δ/ε)`` (§1.2); ``delta``
        must be None or 0. ``"gaussian"``: (ε, δ)-DP, node noise ``N(0, σ²)``
        with σ calibrated for the node vector's L2 sensitivity ``√h·Δ`` by
        :func:`~dp_beam.mechanisms.calibration.gaussian_sigma`.
    delta:
        δ in (0, 1), required for Gaussian noise.
    dim:
        Length of each input vector (coordinates share nodes but get
        independent noise; Δ bounds the norm of the whole vector).
    rng:
        ``None`` for secure noise (production); an int seed, a NumPy
        ``Generator`` or a :class:`~dp_beam.mechanisms.noise.NoiseSource` for
        tests (see :func:`~dp_beam.mechanisms.noise.make_noise`).
    calibration:
        For Gaussian noise, ``"zcdp"`` (σ from ρ-zCDP, §1.2 (a)) or
        ``"analytic"`` (Balle–Wang, §1.2 (c)). The accountant reads it back
        from :meth:`to_state`.

    Unbounded streams (spec §1.6 U2, doubling with complete trees)
        Epoch k covers steps ``2^k … 2^{k+1}−1`` (exactly ``2^k`` steps) with
        its own tree of horizon ``2^k``, ``h_k = k+1`` levels and node scale
        ``(k+1)·Δ/ε`` (Laplace) or σ for L2 sensitivity ``√(k+1)·Δ``
        (Gaussian). The release at step t in epoch k is the sum of the noisy
        roots of epochs ``0..k−1`` plus the current epoch tree's release.
        Each epoch is ε-DP for a unit that spends its whole Δ in it; epochs see
        disjoint steps, so by parallel composition the whole sequence is ε-DP
        when a unit's contributions fall into one epoch. They may also spread
        over several epochs: if the unit changes epoch k by ``D_k`` with
        ``Σ_k D_k <= Δ``, epoch k costs ``(D_k/Δ)·ε`` under Laplace noise and
        ``(D_k/Δ)²·ρ`` under zCDP, and both sums stay within ε and ρ. For the
        analytic Gaussian, epoch k is a Gaussian mechanism with
        ``μ_k = (D_k/Δ)·μ``; Gaussian mechanisms compose to ``μ = √(Σ μ_k²) <=
        μ``, and the (ε, δ) curve is monotone in μ. Hence every epoch is
        calibrated for the whole unit and no budget is split (the spec's
        user-level caveat of U2). This beats the hybrid U1 for this use because
        it needs no ε/2 split.

    State (spec §1.4)
        The spec's CSS10 state keeps an exact and a noisy p-sum per level
        (``2·h`` vectors). Only ``h`` vectors are needed: for each level ``i``
        the state holds one vector ``v[i]``,

        * if bit i of the count c is 1: the noisy node ``â[i]`` (what releases
          read);
        * if bit i of c is 0: the exact sum of the nodes at the set bits below
          i — the part of the next level-i node already seen (what node
          creation needs).

        At step c with ``i = ν2(c)`` the bits below i of c−1 are all 1 and bit i
        is 0, so the new node's exact value is ``x + v[i]``; every 0 bit above i
        gains x; bits below i become 0 with nothing below them. The exact
        values of the set-bit nodes are never needed on their own, only these
        partial sums. A bounded mechanism therefore holds ``h·dim`` floats; an
        unbounded one at step t holds ``(⌊log2 t⌋ + 2)·dim`` (the current
        epoch's ``k+1`` levels plus the running sum of noisy roots). The state
        contains exact partial sums and must be stored like the data it came
        from; only releases are public.

    Privacy cost: ε-DP (Laplace), or (ε, δ)-DP and ρ-zCDP (Gaussian), for
    the whole output sequence; :meth:`privacy_cost` states it.

    Exact releases: with the transforms' keyed source
    (:class:`~dp_beam.mechanisms.noise_key.KeyedNoise`) every node is rounded
    to the grid of its noise before the noise is added, so the node is the
    integer output of a discrete Laplace (Gaussian) mechanism times the grid
    step, computed without floating-point rounding, and a release is its
    post-processing. Rounding can move a node's sensitivity by one grid step
    (``<= 2^-29`` of the scale), so node scales are calibrated for ``Δ`` plus
    that pad (:func:`~dp_beam.mechanisms.noise_key.grid_padded_scale`): they
    exceed ``levels·Δ/ε`` by a relative ``2^-29·scale/Δ`` at most.

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
    >>> m = BinaryTreeMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise())
    >>> [m.step(x) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> m.levels, [round(b, 6) for b in m.noise_scales(3)]   # t = 3 = 0b11: two nodes of Lap(4·1/1)
    (4, [4.0, 4.0])
    >>> round(m.noise_std(3), 6)      # √(2·2)·4
    8.0
    >>> m.privacy_cost()
    {'epsilon': 1.0, 'delta': 0.0, 'rho': 0.5}
    """

    name = "tree"
    STATE_VERSION = 1

    def __init__(
        self,
        epsilon,
        sensitivity=1.0,
        horizon=None,
        noise="laplace",
        delta=None,
        dim=1,
        rng=None,
        calibration="zcdp",
    ):
        self._epsilon = self._check_epsilon(epsilon)
        self._sensitivity = self._check_sensitivity(sensitivity)
        self._horizon = self._check_horizon(horizon)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        self._noise = noise
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        self._calibration = calibration
        self._delta = self._check_delta(delta, noise)
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        self._dim = int(dim)
        self._source = make_noise(rng)

        if noise == "laplace":
            self._rho = rho_from_eps(self._epsilon)
        elif calibration == "zcdp":
            self._rho = rho_from_eps_delta(self._epsilon, self._delta)
        else:
            # A Gaussian mechanism with L2 sensitivity s and std σ is
            # s²/(2σ²)-zCDP; σ is proportional to s, so the ratio is the same
            # for every tree depth and equals that of the unit-sensitivity σ.
            unit_sigma = gaussian_sigma(1.0, self._epsilon, self._delta, "analytic")
            self._rho = 1.0 / (2.0 * unit_sigma * unit_sigma)

        self._scales = {}
        self._last_scales = None  # (t, scales) of the last noise_scales call
        self._t = 0
        if self._horizon is not None:
            self._nodes = np.zeros((self._horizon.bit_length(), self._dim), dtype=np.float64)
            self._roots = None
        else:
            # The tree of an epoch is allocated by its first step, so that
            # between epochs only the running sum of roots is held.
            self._nodes = None
            self._roots = np.zeros(self._dim, dtype=np.float64)

    # -- validation -----------------------------------------------------------

    @staticmethod
    def _check_epsilon(epsilon):
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        epsilon = float(epsilon)
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        return epsilon

    @staticmethod
    def _check_sensitivity(sensitivity):
        if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real):
            raise ValueError(f"sensitivity must be a finite number >= 0, got {sensitivity!r}")
        sensitivity = float(sensitivity)
        if not math.isfinite(sensitivity) or sensitivity < 0:
            raise ValueError(f"sensitivity must be a finite number >= 0, got {sensitivity!r}")
        return sensitivity

    @staticmethod
    def _check_horizon(horizon):
        if horizon is None:
            return None
        if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
            raise ValueError(f"horizon must be an int >= 1 or None, got {horizon!r}")
        return int(horizon)

    @staticmethod
    def _check_delta(delta, noise):
        if noise == "laplace":
            if delta is None:
                return None
            if isinstance(delta, numbers.Real) and not isinstance(delta, bool) and float(delta) == 0.0:
                return None
            raise ValueError(f"delta must be None or 0 for Laplace noise (pure epsilon-DP), got {delta!r}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
            raise ValueError(f"delta must be a number in (0, 1) for Gaussian noise, got {delta!r}")
        delta = float(delta)
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a number in (0, 1) for Gaussian noise, got {delta!r}")
        return delta

    def _check_t(self, t):
        t = check_step_index(t)
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"t must be <= horizon ({self._horizon}), got {t}")
        return t

    def _check_x(self, x):
        if type(x) is float and self._dim == 1:
            # The common case (a step total), without NumPy's parsing.
            if not math.isfinite(x):
                raise ValueError(f"x must be finite, got {x!r}")
            return np.array([x])
        if isinstance(x, (str, bytes)):
            # NumPy would parse "3" as 3.0; a string is a caller bug here.
            raise ValueError(f"x must be a number or an array of {self._dim} numbers, got {x!r}")
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"x must be a number or an array of {self._dim} numbers, got {x!r}") from None
        if self._dim == 1 and arr.shape in ((), (1,)):
            arr = arr.reshape(1)
        elif arr.shape != (self._dim,):
            raise ValueError(f"x must have shape ({self._dim},), got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"x must be finite, got {x!r}")
        return arr

    # -- public parameters ----------------------------------------------------

    @property
    def epsilon(self):
        return self._epsilon

    @property
    def sensitivity(self):
        return self._sensitivity

    @property
    def horizon(self):
        return self._horizon

    @property
    def noise(self):
        return self._noise

    @property
    def delta(self):
        return self._delta

    @property
    def dim(self):
        return self._dim

    @property
    def calibration(self):
        return self._calibration

    @property
    def noise_source(self):
        """The :class:`~dp_beam.mechanisms.noise.NoiseSource` nodes draw from."""
        return self._source

    @property
    def rho(self):
        """ρ such that the whole output sequence is ρ-zCDP (spec §1.2)."""
        return self._rho

    @property
    def t(self):
        """Number of steps consumed."""
        return self._t

    @property
    def levels(self):
        """Tree depth h: ``horizon.bit_length()``, or for an unbounded stream
        the depth of the epoch tree that holds the current (or, before any
        step, the first) step."""
        if self._horizon is not None:
            return self._horizon.bit_length()
        return max(self._t, 1).bit_length()

    # -- noise bookkeeping ----------------------------------------------------

    def _node_scale(self, levels):
        """Scale (Laplace b or Gaussian σ) of a node in a tree of ``levels`` levels (spec §1.2)."""
        scale = self._scales.get(levels)
        if scale is None:
            scale = _node_scale(self._noise, levels, self._sensitivity, self._epsilon, self._delta,
                                self._calibration)
            self._scales[levels] = scale
        return scale

    def set_noise_source(self, rng):
        """Draw all later noise from ``rng`` (resolved like the constructor's).

        The state is unchanged, so this equals ``from_state(to_state(), rng)``
        without the round trip; a release DoFn gives every step its own keyed
        source this way.
        """
        self._source = make_noise(rng)

    def _draw(self, scale):
        if self._noise == "laplace":
            return self._source.laplace(scale, self._dim)
        return self._source.gaussian(scale, self._dim)

    def _noised(self, exact, scale):
        """A node's noisy value: ``exact`` plus one noise vector of ``scale``.

        With an exact-grid source (:class:`~dp_beam.mechanisms.noise_key.KeyedNoise`)
        the exact value is first rounded to the noise's grid, so the sum is a
        multiple of the grid computed without rounding (below 2^53 grid
        steps): the node is the output of the discrete mechanism itself and
        its low-order bits carry nothing about the data (Mironov 2012).
        Without the rounding, a value off the grid would show through as the
        sum's offset from it. The one grid step this can add to the node
        sensitivity is in the calibration (:meth:`_node_scale`).
        """
        if self._source.exact_grid:
            exact = round_to_grid(exact, scale)
        return exact + self._draw(scale)

    def release_nodes(self, t):
        """Nodes summed in the release at step t, as ``(first, last, level)`` step intervals.

        Bounded: the ``popcount(t)`` nodes ``(i, ⌊t/2^i⌋)`` for the set bits i
        of t, highest level first (spec §1.1, BM-2). Unbounded: the roots of
        the completed epochs, then the nodes of the current epoch's tree
        (§1.6 U2). A node is created, and its noise drawn, at step ``last``.
        The order matches :meth:`noise_scales`. Public: depends only on t.
        """
        t = self._check_t(t)
        if self._horizon is not None:
            offset, count, roots = 0, t, []
        else:
            k = t.bit_length() - 1
            offset, count = (1 << k) - 1, t - (1 << k) + 1
            roots = [((1 << j), (1 << (j + 1)) - 1, j) for j in range(k)]
        nodes = []
        for i in range(count.bit_length() - 1, -1, -1):
            if (count >> i) & 1:
                last = (count >> i) << i
                nodes.append((offset + last - (1 << i) + 1, offset + last, i))
        return roots + nodes

    def noise_scales(self, t):
        """Scales (Laplace b or Gaussian σ) of the independent noises in the release at step t.

        One entry per node of :meth:`release_nodes` (spec §1.3: the error is a
        sum of ``popcount`` independent noises; §1.6 U2 adds one root per
        completed epoch). Public: depends only on t and the parameters.
        """
        t = self._check_t(t)
        last = self._last_scales
        if last is not None and last[0] == t:
            # A release asks twice per step (noise_std and ci_halfwidth).
            return list(last[1])
        if self._horizon is not None:
            scales = [self._node_scale(self._horizon.bit_length())] * bin(t).count("1")
        else:
            k = t.bit_length() - 1
            count = t - (1 << k) + 1
            scales = [self._node_scale(j + 1) for j in range(k)]
            scales += [self._node_scale(k + 1)] * bin(count).count("1")
        self._last_scales = (t, tuple(scales))
        return scales

    def noise_std(self, t):
        """Standard deviation of each coordinate of the release at step t (1-based).

        Laplace: ``√(Σ 2 b_j²)`` (``√(2·popcount(t))·b`` for a bounded tree);
        Gaussian: ``√(Σ σ_j²)`` (``σ·√popcount(t)``); spec §1.3.
        """
        scales = self.noise_scales(t)
        factor = 2.0 if self._noise == "laplace" else 1.0
        return math.sqrt(factor * sum(s * s for s in scales))

    def ci_halfwidth(self, t, level=0.95):
        """Half-width x with ``P(|noise| <= x) = level`` for each coordinate at step t.

        Exact, not a tail bound: the Laplace case inverts the distribution of
        the sum of the node noises (:func:`~dp_beam.mechanisms.noise.laplace_sum_halfwidth`),
        the Gaussian case uses the normal quantile (spec §1.3).
        """
        if self._noise == "laplace":
            return _laplace_halfwidth(tuple(self.noise_scales(t)), float(level))
        return gaussian_halfwidth(self.noise_std(t), level)

    def privacy_cost(self):
        """Privacy of the whole (unbounded or horizon-long) output sequence.

        ``{"epsilon": ε, "delta": δ (0 for Laplace), "rho": ρ}``: Laplace is
        ε-DP and hence ε²/2-zCDP; Gaussian is (ε, δ)-DP and ρ-zCDP, ρ as in
        :attr:`rho` (spec §1.2). Charged once for the mechanism; reads are free.
        """
        return {
            "epsilon": self._epsilon,
            "delta": 0.0 if self._delta is None else self._delta,
            "rho": self._rho,
        }

    def state_size(self):
        """Number of floats in the state (spec §1.4, BM-5): ``h·dim`` bounded,
        ``(⌊log2 t⌋ + 2)·dim`` at most when unbounded."""
        size = 0 if self._nodes is None else self._nodes.size
        if self._roots is not None:
            size += self._roots.size
        return int(size)

    # -- the mechanism --------------------------------------------------------

    @staticmethod
    def _tree_sum(nodes, count):
        levels = np.arange(nodes.shape[0])
        live = ((count >> levels) & 1).astype(bool)
        return nodes[live].sum(axis=0)

    def _tree_add(self, nodes, count, x, scale):
        """Add the count-th element x to a tree (spec §1.1 ``add``, in the h-vector form)."""
        i = _trailing_zeros(count)
        exact = x + nodes[i]
        # Bits above i are the same in count−1 and count; each open (0) level
        # there will create a node that contains x. (A loop: the trees are a
        # few dozen levels at most, and NumPy's index arrays cost more.)
        for level in range(i + 1, nodes.shape[0]):
            if not (count >> level) & 1:
                nodes[level] += x
        nodes[:i] = 0.0
        nodes[i] = self._noised(exact, scale)

    def step(self, x):
        """Consume the next element x and return the noisy prefix sum through it.

        x is a number (dim 1) or an array of shape ``(dim,)``, finite. Returns
        a float when ``dim == 1``, else a new array of shape ``(dim,)``.
        Exactly one node is created per step, so one noise vector is drawn.
        """
        arr = self._check_x(x)
        t = self._t + 1
        if self._horizon is not None:
            if t > self._horizon:
                raise ValueError(f"horizon exceeded: horizon is {self._horizon}, step {t} requested")
            self._tree_add(self._nodes, t, arr, self._node_scale(self._nodes.shape[0]))
            self._t = t
            return self._output(self._tree_sum(self._nodes, t))

        k = t.bit_length() - 1
        count = t - (1 << k) + 1
        if count == 1:
            self._nodes = np.zeros((k + 1, self._dim), dtype=np.float64)
        self._tree_add(self._nodes, count, arr, self._node_scale(k + 1))
        self._t = t
        if count == 1 << k:
            # The epoch's root is its only live node; folding it into the
            # running sum of roots frees the tree until the next epoch.
            self._roots = self._roots + self._nodes[k]
            self._nodes = None
            return self._output(self._roots)
        return self._output(self._roots + self._tree_sum(self._nodes, count))

    def _tree_skip(self, nodes, c0, c1, scale):
        """Move a tree's h-vector state from count c0 to c1 over zero inputs.

        Level i changes only if ``c0 >> i != c1 >> i``. Then, if bit i of c1
        is set, the live level-i node at c1 was created during the skip; its
        exact value is the part of it seen by c0, which the state holds at
        level i when that node began by c0 (``c0 >> i == (c1 >> i) − 1``: bit
        i of c0 is then 0, so ``nodes[i]`` is that partial sum), and 0 when it
        lies wholly in the skipped steps. If bit i of c1 is 0, the partial sum
        of the next level-i node covers skipped steps only: 0. Levels that do
        not change keep their noisy node or partial sum, exactly as ``step``
        with zeros would (adding 0 to an open level changes nothing).
        """
        for i in range(nodes.shape[0]):
            a, b = c0 >> i, c1 >> i
            if a == b:
                continue
            if b & 1:
                partial = nodes[i] if a == b - 1 else 0.0
                nodes[i] = self._noised(partial, scale)
            else:
                nodes[i] = 0.0

    def skip(self, n):
        """Advance by n steps whose inputs are all zero, drawing O(log t) noises.

        The state afterwards has exactly the distribution it would have after
        ``n`` calls of ``step(0)``, so every future release does too; only the
        releases of the skipped steps are not produced. Use: a counter that
        must be aligned to a public start although its data began later (it
        is the counter run from the start on zeros).

        Why it is exact: the state holds, per level, either a live noisy node
        or the exact partial sum of the next node (class docstring, "State").
        A node created during the skip holds the inputs before the skip that
        it covers (read from the partial sum) plus one fresh noise of the
        same scale that ``step`` would have drawn; a level whose next node
        lies in the skipped steps holds 0. Nodes created and superseded within
        the skip are read by no later release and are never drawn. Unbounded
        streams finish each epoch as ``step`` does: its root (partial sum plus
        noise) is folded into the running sum of roots and the tree freed; an
        epoch skipped whole contributes one fresh root noise of its scale.

        Draws: at most one per level of each epoch the skip touches, i.e. at
        most ``h`` (bounded) or ``⌊log2 t⌋ + 1`` plus one root per completed
        epoch (unbounded), instead of ``n``. Works at any ``t``, before or
        after steps; ``n = 0`` does nothing. Raises ``ValueError`` if ``n`` is
        not an int >= 0 or ``t + n`` exceeds the horizon (the state is then
        unchanged). Returns None; :meth:`current` reads the release at the
        new ``t``.

        >>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
        >>> m = BinaryTreeMechanism(epsilon=1.0, horizon=16, rng=ZeroNoise())
        >>> m.step(2.0)
        2.0
        >>> m.skip(5)
        >>> m.t, m.current(), m.step(1.0)
        (6, 2.0, 3.0)
        """
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        n = int(n)
        t0, t1 = self._t, self._t + n
        if self._horizon is not None and t1 > self._horizon:
            raise ValueError(f"horizon exceeded: horizon is {self._horizon}, skip to step {t1} requested")
        if self._horizon is not None:
            self._tree_skip(self._nodes, t0, t1, self._node_scale(self._nodes.shape[0]))
            self._t = t1
            return None

        t = t0
        while t < t1:
            # Epoch k holds the next step t+1; the skip runs to its end or to t1.
            k = (t + 1).bit_length() - 1
            first, last = 1 << k, (1 << (k + 1)) - 1
            stop = min(t1, last)
            if self._nodes is None:
                self._nodes = np.zeros((k + 1, self._dim), dtype=np.float64)
            self._tree_skip(self._nodes, t - first + 1, stop - first + 1, self._node_scale(k + 1))
            if stop == last:
                # As in step: the epoch's root is its only live node.
                self._roots = self._roots + self._nodes[k]
                self._nodes = None
            t = stop
            self._t = t
        return None

    def current(self):
        """The current release (the spec's ``sum()``), without consuming input.

        Pure post-processing of stored noisy nodes: no noise is drawn and
        repeated calls return identical values. 0 before the first step.
        """
        t = self._t
        if self._horizon is not None:
            value = self._tree_sum(self._nodes, t) if t else np.zeros(self._dim)
        elif self._nodes is None:
            value = self._roots
        else:
            k = t.bit_length() - 1
            value = self._roots + self._tree_sum(self._nodes, t - (1 << k) + 1)
        return self._output(value)

    def _output(self, value):
        if self._dim == 1:
            return float(value[0])
        return np.array(value, dtype=np.float64, copy=True)

    # -- serialisation --------------------------------------------------------

    def to_state(self):
        """Plain dict (ints, floats, strings, lists, None) holding everything
        needed to continue; JSON- and pickle-friendly. The noise source is not
        included: a restored mechanism gets its own (:meth:`from_state`)."""
        return {
            "mechanism": self.name,
            "version": self.STATE_VERSION,
            "epsilon": self._epsilon,
            "sensitivity": self._sensitivity,
            "horizon": self._horizon,
            "noise": self._noise,
            "delta": self._delta,
            "dim": self._dim,
            "calibration": self._calibration,
            "t": self._t,
            "nodes": None if self._nodes is None else self._nodes.tolist(),
            "roots": None if self._roots is None else self._roots.tolist(),
        }

    @classmethod
    def from_state(cls, state, rng=None):
        """Rebuild a mechanism from :meth:`to_state` output.

        ``rng`` is resolved like the constructor's (None → secure noise). With
        a noise source positioned where the original's was, the restored
        mechanism releases exactly what the original would have.
        """
        mech, t, (nodes, roots) = restore_parameters(cls, state, rng, ("nodes", "roots"))
        dim = mech._dim
        if mech._horizon is not None:
            if t > mech._horizon:
                raise ValueError(f"state t={t} exceeds horizon {mech._horizon}")
            expected = (mech._horizon.bit_length(), dim)
            if nodes is None or roots is not None:
                raise ValueError("state of a bounded tree needs nodes and no roots")
        else:
            if roots is None:
                raise ValueError("state of an unbounded tree needs roots")
            k = t.bit_length() - 1
            epoch_done = t == 0 or t == (1 << (k + 1)) - 1
            expected = None if epoch_done else (k + 1, dim)
            if (nodes is None) != (expected is None):
                raise ValueError(f"state nodes do not match t={t} of an unbounded tree")
            roots_arr = np.asarray(roots, dtype=np.float64)
            if roots_arr.shape != (dim,) or not np.all(np.isfinite(roots_arr)):
                raise ValueError(f"state roots must be {dim} finite floats")
            mech._roots = roots_arr.copy()
        if expected is not None:
            nodes_arr = np.asarray(nodes, dtype=np.float64)
            if nodes_arr.shape != expected or not np.all(np.isfinite(nodes_arr)):
                raise ValueError(f"state nodes must be finite floats of shape {expected}")
            mech._nodes = nodes_arr.copy()
        else:
            mech._nodes = None
        mech._t = t
        return mech

    def __repr__(self):
        return (
            f"BinaryTreeMechanism(epsilon={self._epsilon!r}, sensitivity={self._sensitivity!r}, "
            f"horizon={self._horizon!r}, noise={self._noise!r}, delta={self._delta!r}, "
            f"dim={self._dim!r}, calibration={self._calibration!r}, t={self._t})"
        )
