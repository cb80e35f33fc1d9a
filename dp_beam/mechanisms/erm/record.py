"""The released model of private ERM and what it predicts.

``docs/privacy/erm.md`` E-5 (seed 004: Watson et
al., *Continual and Sliding Window Release for Private ERM*):
:class:`ModelRelease` is one release of a stream, with the record intervals
it was trained on and depends on and the noise and budget share of its call;
:func:`predict_proba` and :func:`predict` are post-processing of a release.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from .loss import LogisticLoss, sigmoid

__all__ = ["ModelRelease", "predict_proba", "predict"]


@dataclass(frozen=True)
class ModelRelease:
    """One released model (erm.md E-5). Intervals are half-open record ranges ``(a, b]``.

    ``kind``/``level``: ``"scale"`` k (Alg. 2); ``"base"`` k, ``"doubling"`` j,
    ``"single"`` 0 (Alg. 4); ``"base"`` ⌊log₂P⌋, ``"right"``/``"left"`` bucket
    level i (Alg. 5). ``t``: points consumed when it was released.
    ``trained_on``: the data of this training call; ``regulariser``: the
    ``trained_on`` of the model it was regularised toward (None: from scratch);
    ``depends_on``: every record the model is a function of, through its
    regulariser chain (the lineage, E-6, E-1); ``window``: the data
    window the release stands for. ``noise_scale``/``noise_std`` describe the
    noise of this call; ``fraction`` is the share of the component's budget the
    call costs for each of its records and ``call_epsilon``/``call_rho`` the
    resulting cost. Releasing the same model again (a reused bucket) costs
    nothing: it is post-processing.
    """

    t: int
    kind: str
    level: int
    trained_on: tuple
    regulariser: object
    depends_on: tuple
    window: tuple
    params: np.ndarray = field(repr=False, compare=False)
    classes: tuple
    n_features: int
    fit_intercept: bool
    noise: str
    noise_scale: float
    noise_std: float
    fraction: float
    call_epsilon: float
    call_rho: float

    @property
    def weights(self) -> np.ndarray:
        """``(d,)`` (binary: the weight of ``classes[1]``) or ``(K, d)`` (softmax)."""
        return self._shape().unpack(self.params)[0]

    @property
    def intercept(self) -> Union[float, np.ndarray]:
        """A float (binary) or ``(K,)``; 0 without ``fit_intercept``."""
        return self._shape().unpack(self.params)[1]

    def _shape(self):
        # Only the shape matters for unpacking; the bound is not used.
        return LogisticLoss(self.n_features, self.classes, 1.0, self.fit_intercept)

    def to_dict(self) -> Dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["params"] = [float(v) for v in self.params]
        out["trained_on"] = list(self.trained_on)
        out["regulariser"] = None if self.regulariser is None else list(self.regulariser)
        out["depends_on"] = [list(iv) for iv in self.depends_on]
        out["window"] = list(self.window)
        out["classes"] = list(self.classes)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelRelease":
        d = dict(d)
        d["params"] = np.asarray(d["params"], dtype=np.float64)
        d["trained_on"] = tuple(d["trained_on"])
        d["regulariser"] = None if d["regulariser"] is None else tuple(d["regulariser"])
        d["depends_on"] = tuple(tuple(iv) for iv in d["depends_on"])
        d["window"] = tuple(d["window"])
        d["classes"] = tuple(d["classes"])
        return cls(**d)


def predict_proba(release: "ModelRelease", X: ArrayLike) -> np.ndarray:
    """Class probabilities of a released model on X (post-processing, free).

    ``release`` is anything with ``weights``, ``intercept`` and ``classes``
    (a :class:`ModelRelease`, or the ``ModelRecord`` of the Beam transforms).
    Rows of X are used as given (clipping is a training-time contribution
    bound, not part of the model). Returns shape ``(n, K)`` in the order of
    ``classes``.
    """
    W = np.asarray(release.weights, dtype=np.float64)
    b = np.asarray(release.intercept, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    d = W.shape[-1]
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"X must have shape (n, {d}), got {X.shape}")
    if W.ndim == 1:
        p1 = sigmoid(X @ W + float(b))
        return np.column_stack([1.0 - p1, p1])
    Z = X @ W.T + b
    Z = Z - Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


def predict(release: "ModelRelease", X: ArrayLike) -> list:
    """Most probable class label for each row of X (post-processing, free)."""
    idx = np.argmax(predict_proba(release, X), axis=1)
    return [release.classes[i] for i in idx]


def model_to_state(m: Optional["ModelRelease"]) -> Optional[Dict[str, Any]]:
    return None if m is None else m.to_dict()


def model_from_state(d: Optional[Mapping[str, Any]]) -> Optional["ModelRelease"]:
    return None if d is None else ModelRelease.from_dict(d)
