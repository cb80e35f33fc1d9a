"""What the per-key methods of key selection share (claims 9 and 17 of :mod:`.counter` and
:mod:`.sparse_vector`; K-8 in ``docs/privacy/key_selection.md``): one admission, then the test
stops; until then every step is consumed."""

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..checks import check_int
from ..state import StateRecord

if TYPE_CHECKING:
    from .selection import KeySelection

__all__ = ["KeyState", "KeyTest"]


@dataclasses.dataclass(frozen=True)
class KeyState(StateRecord):
    """The leading fields of a per-key mechanism's state: its name and state version, the
    parameters of the selection that made it, the steps consumed and the admission step
    (None before admission). Each method's record adds what it holds."""

    mechanism: str
    version: int
    epsilon: float
    delta: float
    max_keys_per_unit: int
    noise: str
    horizon: Optional[int]
    t: int
    admitted: Optional[int]


class KeyTest:
    """What both per-key methods share: the selection, the step counter, the admission step,
    the checks before a step and the parameter part of the state."""

    @property
    def selection(self) -> "KeySelection":
        return self._selection

    @property
    def t(self) -> int:
        """Steps consumed, counted from the public start (those before the key opened included)."""
        return self._t

    @property
    def admitted(self) -> Optional[int]:
        """Step index t at which the key was admitted, or None."""
        return self._admitted

    def _check_step(self, new_units):
        """``new_units`` validated for the next step; raises before anything changes."""
        if self._admitted is not None:
            raise ValueError(f"key already admitted at t={self._admitted}; its test has stopped")
        new_units = check_int("new_units", new_units, 0)
        horizon = self._selection.horizon
        if horizon is not None and self._t + 1 > horizon:
            raise ValueError(f"horizon exceeded: horizon is {horizon}, step {self._t + 1} requested")
        return new_units

    def _state_header(self) -> Dict[str, Any]:
        """The :class:`KeyState` fields of this mechanism."""
        sel = self._selection
        return {"mechanism": self.name, "version": self.STATE_VERSION,
                "epsilon": sel.epsilon, "delta": sel.delta,
                "max_keys_per_unit": sel.max_keys_per_unit, "noise": sel.noise,
                "horizon": sel.horizon, "t": self._t, "admitted": self._admitted}

