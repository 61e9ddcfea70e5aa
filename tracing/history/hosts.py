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
    here: Usual  # the phase in this host's starts
    fleet_s: float  # the other hosts' median of their medians
    hosts: int  # other hosts that ran it

    @property
    def ratio(self) -> float:
        return self.here.median / max(self.fleet_s, 1e-9)


def outlier(by_host: dict[str, dict[str, Usual]], host: str, phase: str) -> Outlier | None:
    """``host`` in ``phase``, if it is the outlier (``by_host``: ``History.by_host``)."""
    here = by_host.get(host, {}).get(phase)
    others = [us[phase].median for h, us in by_host.items() if h and h != host and phase in us]
    if here is None or here.n < MIN_STARTS or not others:
        return None
    fleet = statistics.median(others)
    if here.median < fleet * RATIO or here.median - fleet < MIN_S:
        return None
    return Outlier(host, phase, here, fleet, len(others))


def outliers(by_host: dict[str, dict[str, Usual]]) -> list[Outlier]:
    """Each host's outlying phase, the largest ratio first: of those it is the outlier in, the
    deepest of those slower by nearly the most (``EXPLAINS``), since a phase's excess is its
    parents' too — the step that is slow there, not the launch around it."""
    out = []
    for host, us in by_host.items():
        found = [o for o in (outlier(by_host, host, phase) for phase in us) if host and o is not None]
        if found:
            most = max(o.here.median - o.fleet_s for o in found)
            near = [o for o in found if o.here.median - o.fleet_s >= EXPLAINS * most]
            out.append(max(near, key=lambda o: (o.here.depth, o.ratio)))
    return sorted(out, key=lambda o: (-o.ratio, o.host))
