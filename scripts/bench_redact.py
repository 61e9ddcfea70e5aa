"""Benchmark ``redact_text`` on adversarial text (not a test: it prints a table of time per character).

    python scripts/bench_redact.py                       # 1k … 256k characters of each shape
    git show HEAD~1:tracing/redact.py > /tmp/old_redact.py
    python scripts/bench_redact.py --baseline /tmp/old_redact.py   # the same sweep on another version

Each shape is a short unit repeated to the size: text anyone who can write a journal or a
rendezvous store can hand the viewers or the watchdog (``a=a=…`` once cost 2.3 s at 16 kB). Each
figure is CPU ns per character (a busy machine changes CPU time least), the best of a few calls
over the whole text (``limit=None``: nothing is cut). Linear code keeps a row flat: the ``ratio``
column is the largest size's figure over the smallest's, in this run (quadratic code would show
about 256x; the plain ``log line`` row is the yardstick). A baseline stops a shape once its next
size would take longer than ``--budget`` seconds if it were quadratic.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import time
from collections.abc import Callable
from pathlib import Path

from sglang_phasetrace.tracing import redact

SHAPES = {
    "a=": "a=",
    "ab://x:": "ab://x:",
    "?a=": "?a=",
    "a. (after x=1)": "a.",
    "-a. (after x=1)": "-a.",
    "-eyJ": "-eyJ",
    "backslashes": "\\",
    "--a b": "--a b ",
    "pw='": "password='",
    '"a": ': '"a": ',
    "?://@tcp(aeyJ": "?://@tcp(aeyJ",
    "@'sk-}0": "@'sk-}0",
    "token aB (prose)": "token aB",
    "log line": "INFO rank tp0 loaded /models/m-00001.safetensors in 2.1 s, max_total_tokens=4096\n",
}
PREFIX = {"a. (after x=1)": "x=1 ", "-a. (after x=1)": "x=1 ", "backslashes": "="}
SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10]


def load(path: str) -> Callable[[str], str]:
    """``redact_text`` of another version of ``tracing/redact.py`` (one file, no relative imports)."""
    spec = importlib.util.spec_from_file_location("baseline_redact", Path(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module.redact_text
    return (lambda text: fn(text, None)) if "limit" in inspect.signature(fn).parameters else fn


def text_of(shape: str, size: int) -> str:
    head, unit = PREFIX.get(shape, ""), SHAPES[shape]
    return head + (unit * (size // len(unit) + 1))[: size - len(head)]


def ns_per_char(fn: Callable[[str], str], text: str, budget: float) -> float:
    best, spent, calls = float("inf"), 0.0, 0
    while (calls < 5 or spent < 0.2) and spent < budget:  # the best of several; one call for a slow one
        tic = time.process_time()
        fn(text)
        took = time.process_time() - tic
        best, spent, calls = min(best, took), spent + took, calls + 1
    return best / len(text) * 1e9


def sweep(name: str, fn: Callable[[str], str], budget: float = float("inf")) -> None:
    print(f"\n{name}: CPU ns per character")
    print(f"{'shape':<18}" + "".join(f"{s >> 10:>9}k" for s in SIZES) + f"{'ratio':>9}")
    for shape in SHAPES:
        row: list[float] = []
        for size in SIZES:
            if row and row[-1] * size * 1e-9 * (size / SIZES[len(row) - 1]) > budget:
                break  # the next size would take longer than the budget (if quadratic)
            row.append(ns_per_char(fn, text_of(shape, size), budget))
        cells = "".join(f"{x:>10.0f}" for x in row) + " " * 10 * (len(SIZES) - len(row))
        ratio = f"{row[-1] / row[0]:>8.1f}x" if len(row) == len(SIZES) else f"{'(stopped)':>9}"
        print(f"{shape:<18}{cells}{ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another redact.py to sweep the same way, for comparison")
    parser.add_argument("--budget", type=float, default=5.0, help="seconds one baseline call may take")
    args = parser.parse_args()
    sweep("this version", lambda text: redact.redact_text(text, None))
    if args.baseline:
        sweep(f"baseline {args.baseline}", load(args.baseline), args.budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
