"""One node against the fleet: where a host's earlier starts of a launch are the outlier in a phase
(its median past the other hosts' median by ``RATIO`` and ``MIN_S``, from ``MIN_STARTS`` starts
there). A node's disk or network is a common cause of slow starts; the launch is not to blame
then, and the fleet's history is what shows it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .store import Usual

RATIO, MIN_S, MIN_STARTS = 1.5, 1.0, 2
EXPLAINS = 0.8  # as ``store.grew``: a phase slower by this share of the most accounts for it


@dataclass
class Outlier:
    host: str
    phase: str
    n: int  # starts on this host that ended the phase
    median_s: float  # on this host
    fleet_s: float  # the other hosts' median of their medians
    hosts: int  # other hosts that ran it
    depth: int = 0

    @property
    def ratio(self) -> float:
        return self.median_s / max(self.fleet_s, 1e-9)


def outlier(medians: dict[str, tuple[int, float]], host: str, phase: str, depth: int = 0) -> Outlier | None:
    """``host`` in ``phase``, if it is the outlier; ``medians``: host -> (starts, median) in it."""
    here = medians.get(host)
    others = [m for h, (_, m) in medians.items() if h and h != host]
    if here is None or here[0] < MIN_STARTS or not others:
        return None
    fleet = statistics.median(others)
    if here[1] < fleet * RATIO or here[1] - fleet < MIN_S:
        return None
    return Outlier(host, phase, here[0], here[1], fleet, len(others), depth)


def of_seconds(seconds: dict[str, list[float]]) -> dict[str, tuple[int, float]]:
    """host -> (starts, median) from host -> the phase's times (``store.Fleet.seconds[phase]``)."""
    return {h: (len(s), statistics.median(s)) for h, s in seconds.items() if s}


def outliers(by_host: dict[str, dict[str, Usual]]) -> list[Outlier]:
    """Each host's outlying phase (``by_host``: ``History.by_host``), the largest ratio first: of
    those it is the outlier in, the deepest of those slower by nearly the most (``EXPLAINS``), since
    a phase's excess is its parents' too — the step that is slow there, not the launch around it."""
    phases = {phase for h, us in by_host.items() if h for phase in us}
    medians = {p: {h: (us[p].n, us[p].median) for h, us in by_host.items() if h and p in us} for p in phases}
    depth = {p: u.depth for us in by_host.values() for p, u in us.items()}
    out = []
    for host in (h for h in by_host if h):
        found = [o for o in (outlier(medians[p], host, p, depth[p]) for p in sorted(phases)) if o is not None]
        if found:
            most = max(o.median_s - o.fleet_s for o in found)
            near = [o for o in found if o.median_s - o.fleet_s >= EXPLAINS * most]
            out.append(max(near, key=lambda o: (o.depth, o.ratio)))
    return sorted(out, key=lambda o: (-o.ratio, o.host))
