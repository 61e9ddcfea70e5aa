"""Human units shared by every table: durations and byte sizes, short and unambiguous."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """``12.3 s``, ``1.23 s``, ``123 ms``, ``75 µs``; blank for unknown."""
    if seconds is None:
        return ""
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s >= 10:
        return f"{sign}{s:.1f} s"
    if s >= 1:
        return f"{sign}{s:.2f} s"
    if s >= 1e-3:
        return f"{sign}{s * 1e3:.3g} ms"
    return f"{sign}{s * 1e6:.3g} µs"


def signed(seconds: float | None) -> str:
    """A change: ``+1.20 s``, ``-35 ms``."""
    if seconds is None:
        return ""
    return ("+" if seconds >= 0 else "") + duration(seconds)


def size(n: float | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""
