"""The wire format of every mechanism family's ``to_state`` is pinned.

States live in Beam state cells and checkpoints (``docs/design.md`` D1.1): a
state written by one version must restore in the next. Each case below runs
one mechanism deterministically (seeded test noise, fixed data) for a few
steps and pins the SHA-256 of ``pickle.dumps(to_state(), protocol=4)``: the
same keys, in the same order, with the same value types give the same bytes,
so any change of the format fails here. The digests were recorded from the
hand-written ``to_state`` methods before they moved to the generic records
of :mod:`dp_beam.mechanisms.state`; those of the BLT states (and of the
mean and regression states that hold BLTs) again when BLT's float values
stopped depending on the CPU's BLAS kernels (the same format, other floats);
those of the ERM states, whose models come from a solver that runs on BLAS, are
taken of the state with its floats rounded to 10 significant digits (the same
structure and types), as the last bits of a solved model differ between
OpenBLAS's kernels; and again when the solver's first stage became Newton's
method (other models within the certified radius; the structure, checked with
every float zeroed, unchanged).
Each case also restores the state with a
noise source positioned where the original's was and checks that both
continue with the same releases.
"""

import copy
import dataclasses
import hashlib
import pickle

import numpy as np
import pytest

from dp_beam.mechanisms import KeySelection, get_mechanism
from dp_beam.mechanisms.continual_mean import (
    ContinualMeanCore,
    ContinualMeanMechanism,
    MeanAggregate,
    UserState,
    contribution,
)
from dp_beam.mechanisms.counting.parameters import CounterConfig, CounterState
from dp_beam.mechanisms.counting.postprocess import MonotoneRelease
from dp_beam.mechanisms.erm import (
    ContinualERMMechanism,
    MultiResolutionERMMechanism,
    SlidingWindowERMMechanism,
)
from dp_beam.mechanisms.erm.log import BlockLog, MemoryBlockLog
from dp_beam.mechanisms.growing import BBImprover, BBScheduler, LaplaceHistogram, PMWG, PMWGParams
from dp_beam.mechanisms.regression import (
    L1Ball,
    PrivIncERM,
    PrivIncERMParams,
    PrivIncReg1,
    PrivIncReg1Params,
    PrivIncReg2,
    PrivIncReg2Params,
)
from dp_beam.transforms.mean_aggregates import MedianStoreInLog

from .erm.helpers import UNIT, data
from .regression.helpers import unit_points


def _twin(gen):
    """A generator in the same position as ``gen``: the restored mechanism's noise."""
    twin = np.random.default_rng()
    twin.bit_generator.state = gen.bit_generator.state
    return twin


class Case:
    """One mechanism: how to make it, drive it for a phase, and restore it. ``solved``: its
    state holds models from a numerical solver (SciPy's L-BFGS-B, through BLAS), whose last
    bits depend on the CPU's BLAS kernel, so its digest is taken of :func:`_rounded` values."""

    def __init__(self, make, drive, restore, solved=False):
        self.make, self.drive, self.restore, self.solved = make, drive, restore, solved


# -- continual counters --------------------------------------------------------------------


def _counter(name, horizon, dim=1, **kw):
    if name in ("blt", "sqrt_toeplitz"):
        kw = {"noise": "gaussian", "delta": 1e-6, **kw}

    def make(gen):
        return get_mechanism(name)(epsilon=1.0, horizon=horizon, dim=dim, rng=gen, **kw)

    def drive(mech, phase):
        xs = np.arange(1.0, 5.0 * dim + 1).reshape(5, dim) * (1 if phase == 0 else -0.5)
        return [mech.step(x if dim > 1 else float(x[0])) for x in xs]

    return Case(make, drive, lambda state, gen: get_mechanism(name).from_state(state, rng=gen))


def _monotone():
    def make(gen):
        return MonotoneRelease(get_mechanism("tree")(epsilon=1.0, horizon=16, rng=gen))

    def drive(mech, phase):
        return [mech.step(x) for x in ([3.0, -1.0, 2.0] if phase == 0 else [0.0, 4.0, -2.0])]

    return Case(make, drive, lambda state, gen: MonotoneRelease.from_state(
        state, get_mechanism("tree"), rng=gen))


# -- key selection -------------------------------------------------------------------------


def _keys(method):
    selection = KeySelection(epsilon=1.0, delta=1e-6, horizon=40, method=method)

    def make(gen):
        return selection.new_counter(3, rng=gen)

    def drive(mech, phase):
        out = []
        for units in ([0, 1, 0] if phase == 0 else [1, 0, 2]):
            out.append(mech.step(units) if mech.admitted is None else "admitted")
        return out

    return Case(make, drive, lambda state, gen: selection.restore(state, rng=gen))


def _admitted_key():
    selection = KeySelection(epsilon=50.0, delta=0.5, horizon=40, max_keys_per_unit=1)

    def make(gen):
        return selection.new_counter(1, rng=gen)

    def drive(mech, phase):
        out = []
        for _ in range(3 if phase == 0 else 0):
            if mech.admitted is None:
                out.append(mech.step(1000))
        return out + [mech.admitted]

    return Case(make, drive, lambda state, gen: selection.restore(state, rng=gen))


# -- regression ----------------------------------------------------------------------------

_PROJECTION = np.array([[1.0, 0.5, -0.2], [0.1, -1.0, 0.4]])
_REGRESSION = {
    "reg1": (PrivIncReg1, lambda: PrivIncReg1Params(dim=3, epsilon=1.0, delta=1e-6, horizon=24)),
    "reg1-tree": (PrivIncReg1, lambda: PrivIncReg1Params(
        dim=3, epsilon=1.0, delta=1e-6, horizon=24, counter="tree", solver="noisy_proj_grad")),
    "reg1-unbounded": (PrivIncReg1, lambda: PrivIncReg1Params(dim=2, epsilon=1.0, delta=1e-6)),
    "reg2": (PrivIncReg2, lambda: PrivIncReg2Params(dim=3, epsilon=1.0, delta=1e-6, horizon=24,
                                                    projection_dim=2, constraint=L1Ball(1.0))),
    "erm": (PrivIncERM, lambda: PrivIncERMParams(dim=3, epsilon=1.0, delta=1e-6, horizon=24, tau=2)),
}


def _regression(name):
    cls, params = _REGRESSION[name]

    def make(gen):
        if cls is PrivIncReg2:
            return cls(params(), rng=gen, projection=_PROJECTION)
        return cls(params(), rng=gen)

    def drive(mech, phase):
        rng = np.random.default_rng(10 + phase)
        out = []
        for _ in range(3):
            X = unit_points(rng, 4, mech.params.dim)
            out.append(mech.step_points(X, rng.uniform(-1, 1, 4)))
        return out

    return Case(make, drive, lambda state, gen: cls.from_state(state, rng=gen))


# -- ERM streams ---------------------------------------------------------------------------

_ERM = {
    "multi_resolution": lambda gen, **kw: MultiResolutionERMMechanism(
        1.0, 3, lam=0.5, max_scale=1, rng=gen, **UNIT, **kw),
    "continual": lambda gen, **kw: ContinualERMMechanism(1.0, 2, 4, lam=0.5, rng=gen, **UNIT, **kw),
    "sliding_window": lambda gen, **kw: SlidingWindowERMMechanism(
        1.0, 2, 6, lam=0.5, rng=gen, **UNIT, **kw),
}


class _EngineLog(BlockLog):
    """An engine's log in miniature: the stream keeps its blocks out of the state."""

    def __init__(self, blocks=None):
        self.blocks = dict(blocks or {})

    def append(self, index, block):
        self.blocks[index] = block

    def read(self, lo, hi):
        return [self.blocks[b] for b in range(lo + 1, hi + 1)]

    def release_before(self, keep):
        self.blocks = {b: v for b, v in self.blocks.items() if b >= keep}


def _erm(name, external=False):
    X, y = data(40, seed=11)
    logs = {}

    def make(gen):
        if not external:
            return _ERM[name](gen)
        logs["log"] = _EngineLog()
        return _ERM[name](gen, log=logs["log"])

    def drive(mech, phase):
        lo, hi = (0, 21) if phase == 0 else (21, 33)
        return mech.extend(X[lo:hi], y[lo:hi])

    def restore(state, gen):
        cls = type(_ERM[name](np.random.default_rng(0)))
        log = _EngineLog(logs["log"].blocks) if external else None
        return cls.from_state(state, rng=gen, log=log)

    return Case(make, drive, restore, solved=True)


# -- growing databases ---------------------------------------------------------------------


def _growing(kind):
    box = LaplaceHistogram(5)

    def make(gen):
        if kind == "pmwg":
            return PMWG(PMWGParams(epsilon=1.0, alpha=0.3, n=30, universe_size=5), rng=gen)
        if kind == "scheduler":
            return BBScheduler(box, epsilon=1.0, n=30, gamma=0.3, rng=gen)
        return BBImprover(box, epsilon=1.0, delta=1e-6, n=30, rng=gen)

    def drive(mech, phase):
        rng = np.random.default_rng(40 + phase)
        out = []
        for _ in range(8):
            out.append(mech.extend(rng.multinomial(10, np.ones(5) / 5)))
            if kind == "pmwg":
                out.append(mech.query(np.eye(5)[int(rng.integers(5))]))
        return out

    def restore(state, gen):
        if kind == "pmwg":
            return PMWG.from_state(state, rng=gen)
        cls = BBScheduler if kind == "scheduler" else BBImprover
        return cls.from_state(state, box, rng=gen)

    return Case(make, drive, restore)


# -- continual mean ------------------------------------------------------------------------


def _mean(preset, noise="laplace", logged=False):
    rng = np.random.default_rng(12)
    users = {u: rng.uniform(0, 1, size=8) for u in range(60)}
    delta = 1e-6 if noise == "gaussian" else None
    driver = ContinualMeanMechanism(0, 1, 8, 2.0, max_users=100, rng=0, preset=preset,
                                    noise=noise, delta=delta)
    params = driver.params
    aggregates = []
    for i in range(8):
        agg = MeanAggregate()
        for u in users:
            user = driver.users.setdefault(u, UserState())
            agg = agg.merge(contribution(params, user, driver.rescale(users[u][i]), step=i + 1))
        aggregates.append(agg)
    logs = {}

    def make(gen):
        core = ContinualMeanCore(params, horizon=8, rng=gen)
        if not logged:
            return core
        logs["log"] = MemoryBlockLog()
        return MedianStoreInLog(core, logs["log"])

    def drive(mech, phase):
        steps = [mech.step(copy.deepcopy(agg)) for agg in aggregates[4 * phase:4 * phase + 4]]
        return [{k: getattr(step, k) for k in step.__slots__} for step in steps]

    def restore(state, gen):
        if not logged:
            return ContinualMeanCore.from_state(params, state, rng=gen)
        state = dict(state)
        stored = state.pop("store_entries", 0)
        core = ContinualMeanCore.from_state(params, state, rng=gen)
        return MedianStoreInLog(core, logs["log"], stored)

    return Case(make, drive, restore)


CASES = {
    **{f"counter-{name}-{horizon}": _counter(name, horizon)
       for name in ("tree", "honaker", "smooth_binary", "blt", "sqrt_toeplitz")
       for horizon in (16, None)},
    "counter-tree-dim2": _counter("tree", 16, dim=2),
    "counter-blt-gaussian": _counter("blt", None, dim=2, noise="gaussian", delta=1e-6),
    "counter-tree-at-epoch-end": Case(
        lambda gen: get_mechanism("tree")(epsilon=1.0, rng=gen),
        lambda mech, phase: [mech.step(1.0) for _ in range(3 if phase == 0 else 2)],
        lambda state, gen: get_mechanism("tree").from_state(state, rng=gen)),
    "monotone": _monotone(),
    "key-counter": _keys("counter"),
    "key-sparse-vector": _keys("sparse_vector"),
    "key-admitted": _admitted_key(),
    **{f"regression-{name}": _regression(name) for name in _REGRESSION},
    **{f"erm-{name}": _erm(name) for name in _ERM},
    "erm-external": _erm("continual", external=True),
    **{f"growing-{kind}": _growing(kind) for kind in ("pmwg", "scheduler", "improver")},
    "mean-tuned": _mean("tuned"),
    "mean-tuned-gaussian": _mean("tuned", "gaussian"),
    "mean-paper": _mean("paper"),
    "mean-paper-logged": _mean("paper", logged=True),
}

# Recorded from the hand-written to_state methods (see the module docstring).
DIGESTS = {
    'counter-blt-16': 'c4de2045a305ba5b3853ad15dd18fc5abe623f345c95da9afa587ea715676dbf',
    'counter-blt-None': 'b36c943525130fda28dd669f2b24d6c0d08f218d5e8884c6804bb795824c321e',
    'counter-blt-gaussian': 'a46e0fd07fdb32ee5f4c2973479e9dcd386866a66e8182d64b015f4ef529f78c',
    'counter-honaker-16': '88202c9f35201eba8852b14f70d9a174ae2e2f45967c6e146b362b2d02945e53',
    'counter-honaker-None': 'f5a7b974afe7f84a2369c2daac534bc11fe28f608f32e2de6131c9629f015acf',
    'counter-smooth_binary-16': '12ef1f8b8ae3fa26c7de2f8d5d785b4340ef62eab204505f9fea7df893daef9d',
    'counter-smooth_binary-None': '647578e496ddccdee7507cef42a75860458d3b2185c3e4931ded846b6be7e97e',
    'counter-sqrt_toeplitz-16': '97f657e5b69169a5b37fc89f3e6b8d2af3d6efe36476b8e2b78a47cae1e22046',
    'counter-sqrt_toeplitz-None': 'f03afe8a1189347463476c10d59822f4b4ee802f0c478ccd2ce61d8648561e2d',
    'counter-tree-16': '1491ad9e15b8675b517b9fac502b95bfe28a037c0004b38bc1e64d132173bc81',
    'counter-tree-None': '7414821aa5a9b8bdcbeed8ce845757e256a504d4d5248c48f7c07af15db849af',
    'counter-tree-at-epoch-end': 'e8ba8a1fc164b519bf60ae06c6f98f23959a80fbc9e35a6053d12ff5c0ea3746',
    'counter-tree-dim2': '5f25fbadc42c49ddc5574ef223342b6e46c39dfa498d6b3ad63689de1c981a73',
    'erm-continual': '753a2c0ab863c3f1b8b8493b7f683f5ae57a88d1c2b89e31ce2e543bc139a329',
    'erm-external': '4de2aa19850c1cac00f419dc7cf39723b0df50c3429db935fa18dc4f800ddc90',
    'erm-multi_resolution': 'b0497a1a0864d155436261bf3dec9e8687aa67d61b2bf207ab37c931b99b5904',
    'erm-sliding_window': '6af93a383c0247dd2c909a94361745e9f87245ed0259583169834cbf0ab53a55',
    'growing-improver': '1ac517ec56e5b72e1b101243fb565d8ebbc151aff1915e669650dcf0f354c210',
    'growing-pmwg': '7c4cbedd62d30da51a0eac3b16af6ec082004ae62d09a10d0deeb1f5389d87e8',
    'growing-scheduler': '23277232f76a798b2624597c7fd7db96f07465c25b1451505cef1d46e8ade35b',
    'key-admitted': 'f1d20e555abe5491e436019e87dd79735bd595485700654e3dc95c8ddeb4b15c',
    'key-counter': '6f74145207d59e904a74431a57c3781d2bd15f19110abe94e7324d3ba599c19c',
    'key-sparse-vector': 'd85fba2d3a9b25ebff5bf7826261788f7fcb821e51b492c8490e5c2f61339aea',
    'mean-paper': '5373517ab8de2be9ad77f5df47658fa0dca73c2ba845312a62c3db8095622bae',
    'mean-paper-logged': 'd18d6047da8125fcdcbd89d8928bf02e46c4b59f641d2b804a414b942dc21812',
    'mean-tuned': '1ddbade9b45c90c9ddebfc05685dba3d5ae870a7983646a77a1d29625dcb4c89',
    'mean-tuned-gaussian': '065827c3dad31d98ae24a40f1b10eb5c0a76463936695908161d0e627eef0d0a',
    'monotone': 'a02b69df343c00d8e07b4663920801cd48c66235e16969ef447f2b364d6afb36',
    'regression-erm': '8a131b6adae70d6e5173573d5b3e8efcf0e97b3f0b900102182d8bb6a98acdb3',
    'regression-reg1': '20356b44364a49a11843aaefb89048c17fccf7794cbaef1218360692c32c008c',
    'regression-reg1-tree': '8e1281f36ebca09bf47030e1c99e19aaabafabe4a0642e98084cd2a869b9dd7d',
    'regression-reg1-unbounded': 'c76bd6134d39ff1a8693f7637320c4880340d6793872ffbf53f5801fb1d92c29',
    'regression-reg2': '2366a328d4310504d50daaa83dc7c6c70ab29f54dafddecdd6afdc71200ebbfc',
}


def _state_after_first_phase(case):
    gen = np.random.default_rng(2024)
    mech = case.make(gen)
    first = case.drive(mech, 0)
    return mech, gen, first, mech.to_state()


def _rounded(value):
    """``value`` with every float (and float array) rounded to 10 significant digits, its
    structure, key order and types kept: what a solver's model pins across BLAS kernels
    (OpenBLAS's Nehalem and Sandy Bridge kernels changed an ERM state's last bits)."""
    if isinstance(value, float):
        return float(f"{value:.10g}")
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return np.array([_rounded(v) for v in value.ravel().tolist()],
                        dtype=value.dtype).reshape(value.shape)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v) for v in value)
    return value


def _digest(state, solved=False):
    return hashlib.sha256(pickle.dumps(_rounded(state) if solved else state, protocol=4)).hexdigest()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_state_bytes_are_pinned(name):
    _, _, _, state = _state_after_first_phase(CASES[name])
    assert _digest(state, CASES[name].solved) == DIGESTS[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_restored_mechanism_continues_like_the_original(name):
    case = CASES[name]
    mech, gen, _, state = _state_after_first_phase(case)
    restored = case.restore(pickle.loads(pickle.dumps(state, protocol=4)), _twin(gen))
    # By value and type (repr): pickle's bytes also record which objects are shared.
    assert repr(restored.to_state()) == repr(state)
    expected, got = case.drive(mech, 1), case.drive(restored, 1)
    assert repr(got) == repr(expected)
    assert repr(restored.to_state()) == repr(mech.to_state())


def test_every_digest_belongs_to_a_case():
    assert sorted(DIGESTS) == sorted(CASES)


def test_the_counter_record_holds_the_config_fields_in_their_order():
    # CounterState spells the CounterConfig fields out (a record's fields are its keys).
    names = [f.name for f in dataclasses.fields(CounterState)]
    assert names[2:-1] == [f.name for f in dataclasses.fields(CounterConfig)]


if __name__ == "__main__":
    # Prints the digests of the current code (to record them, or to see which changed).
    for name in sorted(CASES):
        print(f"    {name!r}: {_digest(_state_after_first_phase(CASES[name])[3], CASES[name].solved)!r},")
