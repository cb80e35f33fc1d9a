"""Private key (partition) selection for continual release.

When the set of keys is not public, a key seen in the data may only be
released (as a key with its own statistic stream) once it is *admitted*: its
noisy running count of distinct privacy units reaches a public threshold.
This module is the engine-free part: :class:`KeySelection` holds the public
parameters (thresholds, cost) and :class:`KeyCounter` is one key's counter.

Derivation (the claims the code relies on)
-------------------------------------------
Steps are counted from the public start: ``t = step − start_step + 1``.

1. **Counter input and sensitivity.** For a key K, ``x_K(t)`` is the number
   of units whose *first* contribution to K falls in step t, so
   ``c_K(t) = Σ_{s<=t} x_K(s)`` is the number of distinct units seen for K.
   A unit counts at most once per key and contributes to at most
   ``m = max_keys_per_unit`` keys, so adding or removing one unit u changes
   at most m counters, each by a single 1 at one step: per counter, L1 = L2
   sensitivity 1 over the whole stream; the counters of other keys are
   unchanged.

2. **Counters.** Each counter is a
   :class:`~dp_beam.mechanisms.tree.BinaryTreeMechanism` with sensitivity 1
   and the selection's horizon (an int T, or None for an unbounded stream),
   aligned to the public start. Laplace: each counter is (ε/m)-DP, so the m
   counters a unit touches are ε-DP together (basic composition; their
   noises are independent). Gaussian: ``ρ = rho_from_eps_delta(ε, δ/2)``,
   each counter is (ρ/m)-zCDP, the m counters compose to ρ-zCDP and hence
   (ε, δ/2)-DP. The tree is used rather than BLT or Toeplitz factorisations
   because its state after zeros is a handful of independent node noises: a
   key first seen at step s starts in O(log s) draws
   (:meth:`~dp_beam.mechanisms.tree.BinaryTreeMechanism.skip`), where a
   factorisation mechanism's noise is correlated across all past steps.

3. **Threshold.** K is admitted at the first t with noisy ``c_K(t) >= τ_t``,
   ``τ_t = 1 + q_t``, where ``P(Z_t >= q_t) <= δ₁·w_t``, ``Z_t`` is the
   counter's noise at t (independent node noises with scales
   ``noise_scales(t)``) and ``Σ_t w_t <= 1``. Bounded horizon T:
   ``w_t = 1/T``. Unbounded: t in epoch ``j = ⌊log2 t⌋`` (``t ∈ [2^j,
   2^{j+1})``, also the tree's epoch) gets ``w_t = 2^{−(j+1)} / 2^j``, so
   epoch j's share is ``2^{−(j+1)}`` and the shares sum to 1. ``τ_t`` is
   public: it depends on t and the parameters only.

4. **A one-unit key is rarely admitted.** If ``c_K(t) <= 1`` at every t,
   admission at t needs ``Z_t >= τ_t − c_K(t) >= q_t``, so by the union
   bound ``P(ever admitted) <= Σ_t δ₁ w_t <= δ₁``, over the whole unbounded
   run. A key with no data (count 0) is admitted by a counter run from the
   start with probability ``δ₀ := P(∃t: Z_t >= 1 + q_t) <= δ₁``.

5. **Tail of Z_t.** Gaussian: ``Z_t ~ N(0, Σσ_i²)`` exactly, so ``q_t =
   std·Φ⁻¹(1 − δ₁w_t)`` (``scipy.stats.norm.isf``, accurate for tiny
   probabilities). Laplace: ``Z_t = Σ Lap(b_i)``; the Chernoff bound
   ``log P(Z >= q) <= −s·q − Σ log(1 − s²b_i²)`` for ``0 < s < 1/max b_i``
   holds for every such s, and :func:`laplace_tail_quantile` returns the
   smallest q it certifies. With a single node the exact tail
   ``½·exp(−q/b)`` is used instead.

6. **Lazy start.** Only keys with data get a counter, started at the key's
   first data step s by ``skip(s − 1)``: its state then has exactly the
   distribution of a counter run from t = 1 on zeros (the tree's ``skip``).
   Coupling: with that shared state and the same later noises, the lazy
   counter admits K at the same step as the counter run from the start,
   unless the latter crossed ``τ`` before s, on a true count of 0, which has
   probability at most ``δ₀ <= δ₁``. So for every dataset the lazy output
   for K (including "no counter, never admitted" for a key without data) is
   within total variation ``δ₀`` of the from-the-start output ``M*_K``.

7. **Privacy.** Let D, D' differ in one unit u and S be the keys u touches
   (``|S| <= m``). Outputs of different keys are independent, and keys
   outside S see identical data. Hybrid H: the from-the-start counters on S,
   the lazy ones elsewhere. By claim 6, ``TV(M(D), H(D)) <= m·δ₀``, and the
   same for D'. H(D) and H(D') differ only on S, where claim 2 gives ε-DP
   (Laplace) or (ε, δ/2)-DP (Gaussian). For every event E,
   ``P[M(D) ∈ E] <= P[H(D) ∈ E] + mδ₀ <= e^ε P[H(D') ∈ E] (+ δ/2) + mδ₀
   <= e^ε P[M(D') ∈ E] + mδ₀(1 + e^ε) (+ δ/2)``, and symmetrically. The
   whole selection (all keys, all time, the admission steps being all it
   releases) is therefore (ε, δ)-DP with ``δ = m·δ₁·(1 + e^ε)`` (Laplace) or
   ``δ = δ/2 + m·δ₁·(1 + e^ε)`` (Gaussian), using ``δ₀ <= δ₁``. Both are
   conservative: ``δ₀ < δ₁`` (the +1 margin of ``τ``), and for Laplace with
   m > 1 composing per key would give ``1 + e^{ε/m}``; the uniform form is
   kept for both noises.

8. **Parameters.** Given the user's (ε, δ): ``δ₁ = δ / (m(1 + e^ε))``
   (Laplace) and ``δ₁ = (δ/2) / (m(1 + e^ε))`` (Gaussian).

9. **Once.** Admission happens once: the counter stops and drops its state
   (further steps raise). Until then it must consume every step, with 0 new
   units when there are none, because ``M*`` tests at every step; testing
   only at steps with data would make the test times depend on the data.
   The noisy counts themselves are never released (claim 7 covers the
   admission steps only), and a counter's state holds exact counts: store it
   like the data.

Example (``ZeroNoise`` switches noise off to show the mechanics; it is not
private, and production code leaves ``rng=None``):

>>> from dp_beam.mechanisms import KeySelection, ZeroNoise
>>> sel = KeySelection(epsilon=1.0, delta=1e-6, horizon=365)
>>> round(sel.threshold(1), 1), round(sel.threshold(255), 1)   # 1 node vs 8 nodes of Lap(9)
(184.0, 329.5)
>>> round(sel.threshold(3), 1), round(sel.threshold(4), 1)     # 2 nodes vs 1
(243.2, 184.0)
>>> c = sel.new_counter(3, rng=ZeroNoise())   # first data at step 3: skips 2 steps
>>> c.t, c.step(200), c.step(0), c.admitted   # admitted at a step without new units
(2, False, True, 4)
"""

import math
import numbers

from scipy import optimize, stats

from .calibration import eps_from_rho_delta, rho_from_eps_delta
from .noise import ZeroNoise
from .tree import NOISE_KINDS, BinaryTreeMechanism

__all__ = ["KeySelection", "KeyCounter", "laplace_tail_quantile"]


def _chernoff_exponent_gap(u, ratios, log_inv_p):
    # Stationarity of f(u) = (L + G(u))/u with G(u) = −Σ log(1 − u²r²): the
    # minimiser solves u·G'(u) − G(u) = L, and the left side increases from 0.
    total = 0.0
    for r in ratios:
        a = (u * r) ** 2
        total += 2.0 * a / (1.0 - a) + math.log1p(-a)
    return total - log_inv_p


def _chernoff_q(u, ratios, log_inv_p):
    return (log_inv_p - sum(math.log1p(-((u * r) ** 2)) for r in ratios)) / u


def laplace_tail_quantile(scales, probability):
    """A q with ``P(Σ Z_i >= q) <= probability`` for independent ``Z_i ~ Lap(scales[i])``.

    One term: the exact quantile ``b·ln(1/(2p))`` (``−b·ln(2(1−p))`` for
    p > 1/2). Several: the smallest q certified by the Chernoff bound
    ``log P(Z >= q) <= −s·q − Σ log(1 − s²b_i²)``, ``0 < s < 1/max b_i``,
    i.e. ``q = min_s (ln(1/p) − Σ log(1 − s²b_i²))/s``. With ``u = s·max b``
    and ``r_i = b_i / max b`` the objective is ``max b·f(u)`` on ``(0, 1)``;
    ``f`` has a single stationary point, where ``u·G'(u) − G(u) = ln(1/p)``
    (G the log-sum, the left side increasing from 0), which Brent's method
    finds inside a bracket that is widened until it holds the root. The bound
    holds at every u, so an inexact root only loosens q slightly; it is never
    below the true quantile.

    >>> round(laplace_tail_quantile([2.0], 0.05), 6)        # exact: 2·ln 10
    4.60517
    >>> round(laplace_tail_quantile([1.0, 1.0, 1.0], 1e-6), 2)
    20.76
    """
    values = []
    for b in list(scales):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b) or b <= 0:
            raise ValueError(f"scales must be finite numbers > 0, got {b!r}")
        values.append(float(b))
    if not values:
        raise ValueError("scales must not be empty")
    if isinstance(probability, bool) or not isinstance(probability, numbers.Real):
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    p = float(probability)
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    bmax = max(values)
    if len(values) == 1:
        if p <= 0.5:
            return bmax * math.log(1.0 / (2.0 * p))
        return -bmax * math.log(2.0 * (1.0 - p))
    ratios = [b / bmax for b in values]
    log_inv_p = -math.log(p)
    hi = 0.5
    # The gap tends to +∞ as u → 1; halving the distance to 1 reaches any
    # log(1/p) a float can hold within a few dozen widenings.
    for _ in range(60):
        if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
            break
        hi = 1.0 - (1.0 - hi) / 2.0
    if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
        u = optimize.brentq(_chernoff_exponent_gap, 1e-300, hi, args=(ratios, log_inv_p),
                            xtol=1e-15, rtol=1e-13, maxiter=200)
    else:
        u = hi
    return bmax * _chernoff_q(u, ratios, log_inv_p)


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class KeySelection:
    """Public parameters of a continual private key selection: thresholds and cost.

    Immutable; validates eagerly and raises ``ValueError`` naming the
    parameter. The module docstring derives the thresholds and the cost.

    Parameters
    ----------
    epsilon:
        ε > 0 of the whole selection (all keys, all steps).
    delta:
        δ in (0, 1) of the whole selection. It bounds, among other things,
        the probability that a key only one unit contributed to is ever
        admitted (claim 4 with δ₁ <= δ).
    max_keys_per_unit:
        m >= 1, the number of keys one unit may contribute to (the caller
        enforces it); each counter gets 1/m of the budget.
    noise:
        ``"laplace"`` (default): counters at ε/m each. ``"gaussian"``:
        counters at ρ/m-zCDP each with ``ρ = rho_from_eps_delta(ε, δ/2)``.
    horizon:
        Number of steps T (an int >= 1) from the public start, or ``None``
        for an unbounded stream.

    >>> sel = KeySelection(epsilon=1.0, delta=1e-6)            # unbounded, Laplace
    >>> [round(sel.threshold(t), 1) for t in (1, 100, 10_000)]
    [16.1, 243.0, 727.3]
    >>> g = KeySelection(epsilon=1.0, delta=1e-6, noise="gaussian", horizon=365)
    >>> round(g.delta_per_key, 12), round(g.threshold(1), 1)
    (1.34471e-07, 102.2)
    """

    # The parameters a counter's state records, so that only the selection
    # that made it can restore it.
    _PARAMS = ("epsilon", "delta", "max_keys_per_unit", "noise", "horizon")

    def __init__(self, epsilon, delta, max_keys_per_unit=1, noise="laplace", horizon=None):
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        self._m = _check_int("max_keys_per_unit", max_keys_per_unit, 1)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        if horizon is not None:
            horizon = _check_int("horizon", horizon, 1)
        self._epsilon = float(epsilon)
        self._delta = float(delta)
        self._noise = noise
        self._horizon = horizon

        if noise == "laplace":
            self._rho = None
            self._counter_epsilon = self._epsilon / self._m
            self._counter_delta = None
            selection_delta = self._delta
        else:
            # Half of δ pays for the zCDP → (ε, δ) conversion of the counters,
            # the other half for thresholding (claim 7).
            half = self._delta / 2.0
            self._rho = rho_from_eps_delta(self._epsilon, half)
            target = self._rho / self._m
            counter_epsilon = eps_from_rho_delta(target, half)
            # The tree derives its ρ from (ε, δ) again; a last-bit excess over
            # ρ/m would break the composition to ρ, so step down until none.
            while rho_from_eps_delta(counter_epsilon, half) > target:
                counter_epsilon = math.nextafter(counter_epsilon, 0.0)
            self._counter_epsilon = counter_epsilon
            self._counter_delta = half
            selection_delta = half
        # 1/(1 + e^ε) as e^{−ε}/(1 + e^{−ε}): no overflow for large ε.
        self._delta_per_key = selection_delta * math.exp(-self._epsilon) / (
            self._m * (1.0 + math.exp(-self._epsilon)))
        if not self._delta_per_key > 0.0:
            raise ValueError(f"epsilon is too large for the per-key delta to be representable, got {epsilon!r}")
        # Noise-free twin of every counter: it answers the public questions
        # (node scales at t) and is never stepped.
        self._probe = BinaryTreeMechanism(rng=ZeroNoise(), **self._counter_args())
        self._quantiles = {}

    def _counter_args(self):
        return dict(epsilon=self._counter_epsilon, sensitivity=1.0, horizon=self._horizon,
                    noise=self._noise, delta=self._counter_delta)

    # -- public parameters ----------------------------------------------------

    @property
    def epsilon(self):
        return self._epsilon

    @property
    def delta(self):
        return self._delta

    @property
    def max_keys_per_unit(self):
        return self._m

    @property
    def noise(self):
        return self._noise

    @property
    def horizon(self):
        return self._horizon

    @property
    def delta_per_key(self):
        """δ₁: the bound on a one-unit key's admission probability (claims 4, 8)."""
        return self._delta_per_key

    @property
    def counter_epsilon(self):
        """ε of each key's tree: ε/m (Laplace), or the ε that gives ρ/m at δ/2 (Gaussian)."""
        return self._counter_epsilon

    def _check_t(self, t):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
            raise ValueError(f"t must be an int >= 1, got {t!r}")
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"t must be <= horizon ({self._horizon}), got {t}")
        return int(t)

    def _pattern(self, t):
        """(cache key, w_t): the node-scale multiset at t depends only on the key."""
        if self._horizon is not None:
            return (None, bin(t).count("1")), 1.0 / self._horizon
        j = t.bit_length() - 1
        return (j, bin(t - (1 << j) + 1).count("1")), math.ldexp(1.0, -(2 * j + 1))

    def weight(self, t):
        """``w_t`` (claim 3): ``1/T`` bounded, ``2^{−(2j+1)}`` for t in epoch j unbounded."""
        return self._pattern(self._check_t(t))[1]

    def tail_probability(self, t):
        """``δ₁·w_t``, the bound on ``P(Z_t >= q_t)``."""
        return self._delta_per_key * self.weight(t)

    def noise_scales(self, t):
        """Scales of the independent node noises in a counter's release at t."""
        return self._probe.noise_scales(self._check_t(t))

    def noise_std(self, t):
        """Standard deviation of a counter's noise ``Z_t`` at t."""
        return self._probe.noise_std(self._check_t(t))

    def threshold(self, t):
        """``τ_t = 1 + q_t`` at step index t (1-based from the public start; claim 3).

        Public. Computed once per pattern of node scales (bounded: the
        popcount of t; unbounded: its epoch and the popcount within it) and
        cached, since most steps share one.
        """
        t = self._check_t(t)
        key, w = self._pattern(t)
        q = self._quantiles.get(key)
        if q is None:
            p = self._delta_per_key * w
            if self._noise == "gaussian":
                q = self._probe.noise_std(t) * float(stats.norm.isf(p))
            else:
                q = laplace_tail_quantile(self._probe.noise_scales(t), p)
            self._quantiles[key] = q
        return 1.0 + q

    def privacy_cost(self):
        """Cost of the whole selection under add/remove of one unit.

        ``{"epsilon": ε, "delta": δ, "rho": ρ}``: the selection is (ε, δ)-DP
        (claim 7). ``rho`` is the zCDP cost of the m counters a unit touches,
        as the tree states it: ``m·(ε/m)²/2`` for Laplace, ρ for Gaussian. It
        does **not** cover the thresholding part of δ (``m·δ₁·(1 + e^ε)``),
        which no zCDP bound does; an accountant composing in zCDP must add
        that δ separately.
        """
        if self._noise == "laplace":
            rho = self._m * self._probe.rho
        else:
            rho = self._rho
        return {"epsilon": self._epsilon, "delta": self._delta, "rho": rho}

    def counter_cost(self):
        """Privacy cost of one key's counter, as its tree states it (ε/m, or ρ/m-zCDP)."""
        return self._probe.privacy_cost()

    # -- counters -------------------------------------------------------------

    def new_counter(self, first_t, rng=None):
        """A :class:`KeyCounter` for a key whose first data is at step index ``first_t`` (>= 1).

        The counter is aligned to the public start: it has consumed
        ``first_t − 1`` zero steps (by ``skip``, claim 6), so its next
        :meth:`KeyCounter.step` is step ``first_t``. ``rng``: ``None`` for
        secure noise; an int seed, a NumPy ``Generator`` or a
        :class:`~dp_beam.mechanisms.noise.NoiseSource` for tests. Many
        counters may share one source.
        """
        first_t = _check_int("first_t", first_t, 1)
        if self._horizon is not None and first_t > self._horizon:
            raise ValueError(f"first_t must be <= horizon ({self._horizon}), got {first_t}")
        tree = BinaryTreeMechanism(rng=rng, **self._counter_args())
        tree.skip(first_t - 1)
        return KeyCounter(self, tree)

    def restore(self, state, rng=None):
        """Rebuild a :class:`KeyCounter` from :meth:`KeyCounter.to_state` output.

        The state must come from a selection with the same parameters.
        ``rng`` as in :meth:`new_counter`; with a source positioned where the
        original's was, the restored counter admits exactly where the
        original would have.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        if state.get("mechanism") != KeyCounter.name:
            raise ValueError(f"state is not a {KeyCounter.name!r} state: mechanism={state.get('mechanism')!r}")
        if state.get("version") != KeyCounter.STATE_VERSION:
            raise ValueError(
                f"unsupported state version {state.get('version')!r}, expected {KeyCounter.STATE_VERSION}")
        try:
            params = {name: state[name] for name in self._PARAMS}
            t, admitted, tree_state = state["t"], state["admitted"], state["tree"]
        except KeyError as err:
            raise ValueError(f"state is missing field {err.args[0]!r}") from None
        mine = {name: getattr(self, name) for name in self._PARAMS}
        if params != mine:
            raise ValueError(f"state was made by a different selection: {params} != {mine}")
        t = _check_int("state t", t, 0)
        if admitted is not None:
            # A counter stops at admission, so its t is the admission step.
            if isinstance(admitted, bool) or not isinstance(admitted, numbers.Integral) or admitted != t or t < 1:
                raise ValueError(f"state admitted must be None or equal to t={t}, got {admitted!r}")
            if tree_state is not None:
                raise ValueError("state of an admitted key must not hold a tree")
            return KeyCounter(self, None, t=t, admitted=int(admitted))
        if not isinstance(tree_state, dict):
            raise ValueError("state tree must be a tree state (dict) before admission")
        expected = self._probe.to_state()
        for name in ("mechanism", "epsilon", "sensitivity", "horizon", "noise", "delta", "dim", "calibration"):
            if tree_state.get(name) != expected[name]:
                raise ValueError(
                    f"state tree {name}={tree_state.get(name)!r} does not match the selection's {expected[name]!r}")
        tree = BinaryTreeMechanism.from_state(tree_state, rng=rng)
        if tree.t != t:
            raise ValueError(f"state t={t} does not match its tree's t={tree.t}")
        return KeyCounter(self, tree)

    def __repr__(self):
        return (f"KeySelection(epsilon={self._epsilon!r}, delta={self._delta!r}, "
                f"max_keys_per_unit={self._m!r}, noise={self._noise!r}, horizon={self._horizon!r})")


class KeyCounter:
    """One candidate key's counter of distinct units; made by :class:`KeySelection`.

    :meth:`step` consumes one step's number of *new* distinct units and says
    whether the key is admitted at that step. Admission happens once: the
    counter then drops its tree, and any further :meth:`step` raises
    ``ValueError`` (a caller stepping an admitted key has lost track of it;
    failing loudly beats a silent no-op). Before admission the state holds
    exact counts and must be stored like the data; only admissions are
    public.
    """

    name = "key_selection"
    STATE_VERSION = 1

    def __init__(self, selection, tree, t=None, admitted=None):
        self._selection = selection
        self._tree = tree
        self._t = tree.t if tree is not None else t
        self._admitted = admitted

    @property
    def selection(self):
        return self._selection

    @property
    def t(self):
        """Steps consumed, counted from the public start (skipped ones included)."""
        return self._t

    @property
    def admitted(self):
        """Step index t at which the key was admitted, or None."""
        return self._admitted

    def step(self, new_units):
        """Consume one step: ``new_units`` (an int >= 0) units contributed to the key for the first time.

        Returns True iff the key is admitted at this step (noisy count >=
        ``threshold(t)``). Raises ``ValueError`` after admission, past the
        horizon, or for a bad count (the state is then unchanged).
        """
        if self._admitted is not None:
            raise ValueError(f"key already admitted at t={self._admitted}; its counter has stopped")
        new_units = _check_int("new_units", new_units, 0)
        horizon = self._selection.horizon
        if horizon is not None and self._t + 1 > horizon:
            raise ValueError(f"horizon exceeded: horizon is {horizon}, step {self._t + 1} requested")
        noisy = self._tree.step(float(new_units))
        self._t = self._tree.t
        if noisy >= self._selection.threshold(self._t):
            self._admitted = self._t
            # Nothing reads the counter again; its exact counts need not be kept.
            self._tree = None
            return True
        return False

    def to_state(self):
        """Plain dict (JSON- and pickle-friendly); restore with :meth:`KeySelection.restore`."""
        sel = self._selection
        return {
            "mechanism": self.name,
            "version": self.STATE_VERSION,
            "epsilon": sel.epsilon,
            "delta": sel.delta,
            "max_keys_per_unit": sel.max_keys_per_unit,
            "noise": sel.noise,
            "horizon": sel.horizon,
            "t": self._t,
            "admitted": self._admitted,
            "tree": None if self._tree is None else self._tree.to_state(),
        }

    def __repr__(self):
        return f"KeyCounter(t={self._t}, admitted={self._admitted!r}, selection={self._selection!r})"
