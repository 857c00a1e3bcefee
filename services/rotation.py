"""When the supervisor replaces which gateway (`serve --gateway-recycle-s`).

One gateway at a time, in turn, so the others always hold the public port: each retires on
SIGUSR2 (services/gateway/retire.py), exits 0, is started again in place, and the next one's turn
comes `period_s / gateways` after it serves again. Every gateway is thus replaced about once a
period, however long each replacement takes.
"""

from __future__ import annotations


class GatewayRotation:
    """The schedule's state; the supervisor sends the signals and starts the processes."""

    def __init__(self, names: list[str], period_s: float, now: float) -> None:
        if len(names) < 2 or period_s <= 0:
            raise ValueError("a rotation needs 2 or more gateways and a period > 0")
        self._names = names
        self._every_s = period_s / len(names)
        self._next_s = now + self._every_s
        self._turn = 0
        self.retiring: str | None = None  # sent SIGUSR2, not exited yet
        self.starting: str | None = None  # started again, not serving yet

    def due(self, now: float) -> str | None:
        """The gateway to retire now, if its turn has come (it is then `retiring`)."""
        if self.retiring or self.starting or now < self._next_s:
            return None
        self.retiring = self._names[self._turn % len(self._names)]
        self._turn += 1
        return self.retiring

    def retired(self, name: str, code: int) -> bool:
        """Whether `name`'s exit with `code` ends its retirement (then it is `starting`); any
        other exit is a death like any other."""
        if name != self.retiring or code != 0:
            return False
        self.retiring, self.starting = None, name
        return True

    def serving(self, now: float) -> None:
        """The `starting` gateway answers SERVING: the next turn counts from now."""
        self.starting = None
        self._next_s = now + self._every_s
