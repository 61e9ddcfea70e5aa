"""What the history says while a start runs: how long a phase usually takes, and when the start
will likely be ready. Cheap enough for every watchdog pass: the database is read once per
fingerprint per process (``forget`` drops it when a start of that fingerprint is recorded), then
each answer is a dictionary lookup. A history that cannot be read answers None, with one warning."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from .store import _CACHE, _LOCK, History, HistoryError, Usual, _warn, location


def usuals(fingerprint_id: str, path: str | Path | None = None) -> dict[str, Usual]:
    """Every phase of the fingerprint's earlier starts (``History.usuals``), in the order they begin."""
    where = Path(path) if path is not None else location()
    if where is None:
        return {}
    key = (str(where), fingerprint_id)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            hit = _CACHE[key] = _read(where, fingerprint_id)
    return hit


def _read(path: Path, fingerprint_id: str) -> dict[str, Usual]:
    try:
        with History.open(path) as history:
            return history.usuals(fingerprint_id)
    except HistoryError as exc:
        if exc.kind != "missing":  # no history yet: nothing to say
            _warn(f"read-{exc.kind}", f"history: {exc}; phases are judged without it")
    except Exception as exc:  # a bug of ours must not reach the watchdog
        _warn("read-bug", f"history: reading {path} failed ({exc!r}); phases are judged without it")
    return {}


def usual(fingerprint_id: str, phase: str, path: str | Path | None = None) -> Usual | None:
    """``phase`` (a phase key: ``model.load_weights [draft]``) in the fingerprint's earlier starts:
    n, median, p95, max (its slowest process's time in each); None when none of them ended it."""
    return usuals(fingerprint_id, path).get(phase)


@dataclass
class Eta:
    remaining_s: float  # expected seconds until the ranks are ready
    starts: int  # earlier starts it is made from (the most any step ended in)


def eta(
    fingerprint_id: str,
    open_phases: Mapping[str, float],
    ended: Collection[str] = (),
    path: str | Path | None = None,
) -> Eta | None:
    """The expected remaining time of a start in progress. Its steps are the phases a rank runs
    one after another (depth 1: the children of the rank's root), in the order they usually begin;
    ``open_phases``: phase key -> seconds it has run so far (the slowest rank's), ``ended``: phase
    keys that ended. Remaining = each open step's median minus its elapsed time (never below 0),
    plus the median of every step not begun yet. A step that usually begins before the furthest
    step this start has reached and is in neither is behind it (skipped this time). None without
    history, or when nothing given is one of the steps (the start cannot be placed)."""
    known = usuals(fingerprint_id, path)
    steps = [u for u in known.values() if u.depth == 1 and u.role == "rank"]
    steps = steps or [u for u in known.values() if u.depth == 1]
    reached = [i for i, u in enumerate(steps) if u.phase in open_phases or u.phase in ended]
    if not reached:
        return None
    remaining = 0.0
    for i, step in enumerate(steps):
        if step.phase in open_phases:
            remaining += max(0.0, step.median - open_phases[step.phase])
        elif step.phase not in ended and i > reached[-1]:
            remaining += step.median
    return Eta(remaining, max(u.n for u in steps))
