"""What the history says while a start runs: how long a phase usually takes, and when the start
will likely be ready. Cheap enough for every watchdog pass: the database is read once per
fingerprint per process (``forget`` drops it when a start of that fingerprint is recorded), then
each answer is a dictionary lookup. A history that cannot be read answers None, with one warning."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from .store import Dsn, Fleet, History, HistoryError, Usual, _warn, location, memory, parse


def usuals(
    fingerprint_id: str, path: str | Path | Dsn | None = None, exclude: Collection[str] = ()
) -> dict[str, Usual]:
    """Every phase of the fingerprint's earlier starts (``History.usuals``), in the order they
    begin; ``exclude``: run ids left out (the start in progress, once it is recorded early)."""
    return fleet(fingerprint_id, path, exclude).usuals


def fleet(
    fingerprint_id: str, path: str | Path | Dsn | None = None, exclude: Collection[str] = (), host: str | None = None
) -> Fleet:
    """``usuals``, and each phase's times per host (``History.fleet``: ``host``'s own newest starts
    too), read once per process and fingerprint."""
    try:
        where = location() if path is None else path if isinstance(path, Dsn | Path) else parse(str(path))
    except HistoryError as exc:  # a setting that is neither a path nor a DSN: said once
        _warn(exc, "phases are judged without it")
        return Fleet()
    if where is None:
        return Fleet()
    key = (str(where), fingerprint_id, frozenset(exclude), host)
    mem = memory()
    with mem.lock:
        hit = mem.usuals.get(key)
        if hit is None:
            hit = mem.usuals[key] = _read(where, fingerprint_id, key[2], host)
    return hit


def _read(where: Path | Dsn, fingerprint_id: str, exclude: Collection[str], host: str | None) -> Fleet:
    """A PostgreSQL history is read within ``postgres.READ_WAIT_S`` (libpq cannot bound a connect
    below 2 s): a database that does not answer costs the watchdog's pass that, said once."""

    def read() -> Fleet:
        with History.open(where) as history:
            return history.fleet(fingerprint_id, exclude, host)

    try:
        if isinstance(where, Dsn):
            from . import postgres

            return postgres.within(postgres.READ_WAIT_S, f"the database at {where.host}", read)
        return read()
    except HistoryError as exc:
        if exc.kind != "missing":  # no history yet: nothing to say
            _warn(exc, "phases are judged without it")
    except Exception as exc:  # a bug of ours must not reach the watchdog
        _warn(HistoryError(f"reading {where} failed ({exc!r})", "bug"), "phases are judged without it")
    return Fleet()


def usual(
    fingerprint_id: str, phase: str, path: str | Path | Dsn | None = None, exclude: Collection[str] = ()
) -> Usual | None:
    """``phase`` (a phase key: ``model.load_weights [draft]``) in the fingerprint's earlier starts:
    n, median, p95, max (its slowest process's time in each); None when none of them ended it."""
    return usuals(fingerprint_id, path, exclude).get(phase)


@dataclass
class Eta:
    remaining_s: float  # expected seconds until the ranks are ready
    starts: int  # earlier starts it is made from (the most any step ended in)
    p95_s: float = 0.0  # the same with each step's p95: seconds within which it is ready in most starts


def eta(
    fingerprint_id: str,
    open_phases: Mapping[str, float],
    ended: Collection[str] = (),
    path: str | Path | Dsn | None = None,
    exclude: Collection[str] = (),
) -> Eta | None:
    """The expected remaining time of a start in progress. Its steps are the phases a rank runs
    one after another (depth 1: the children of the rank's root), in the order they usually begin;
    ``open_phases``: phase key -> seconds it has run so far (the slowest rank's), ``ended``: phase
    keys that ended. Remaining = each open step's median minus its elapsed time (never below 0),
    plus the median of every step not begun yet (``p95_s``: the same with each step's p95, a bound
    that a sum of p95s overstates rather than understates). A step that usually begins before the furthest
    step this start has reached and is in neither is behind it (skipped this time). None without
    history, or when nothing given is one of the steps (the start cannot be placed)."""
    return eta_of(usuals(fingerprint_id, path, exclude), open_phases, ended)


def eta_of(known: Mapping[str, Usual], open_phases: Mapping[str, float], ended: Collection[str] = ()) -> Eta | None:
    """``eta`` from the fingerprint's phases already looked up."""
    steps = [u for u in known.values() if u.depth == 1 and u.role == "rank"]
    steps = steps or [u for u in known.values() if u.depth == 1]
    reached = [i for i, u in enumerate(steps) if u.phase in open_phases or u.phase in ended]
    if not reached:
        return None
    remaining = p95 = 0.0
    for i, step in enumerate(steps):
        if step.phase in open_phases:
            remaining += max(0.0, step.median - open_phases[step.phase])
            p95 += max(0.0, step.p95 - open_phases[step.phase])
        elif step.phase not in ended and i > reached[-1]:
            remaining += step.median
            p95 += step.p95
    return Eta(remaining, max(u.n for u in steps), max(p95, remaining))
