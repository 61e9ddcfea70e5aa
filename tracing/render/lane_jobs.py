"""Renderers' work on a split run's lanes where their spans are: a forked helper holds some
processes whole (``reader.load.Split``) and has laid their lanes out (``lanes.Part``); ``lanes_map``
runs a renderer's per-lane function there for those and here for the rest, at the same time, and
``lanes_held`` leaves a large export's pieces there (``Held``) for ``resolve`` to fetch or
``write_pieces`` to have written into the output file where they go. Whatever the helper does not
answer (it failed or died) is made here from the lanes read again (``Part.lanes_here``): the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from ..files import pwrite_all
from ..reader import forked_helper
from ..reader.forked_helper import HelperLost, named, ref
from ..reader.view import ProcessRec
from .lanes import PART_LANES, Lane, Layout, Part


@forked_helper.job
def _part_job(procs: dict[str, ProcessRec], arg: tuple) -> list[tuple[int, Any]]:
    """In the helper (``reader.load.Child.call``): ``fn(lane, arg)`` for each of its lanes."""
    token, fn, fn_arg = arg
    fn = named(fn)
    return [(lane.index, fn(lane, fn_arg)) for lane in PART_LANES[token]]


def lanes_map(lay: Layout, fn: Callable[[Lane, Any], Any], arg: Any = None) -> list[Any]:
    """``[fn(lane, arg) for lane in lay.lanes]``, with all of each lane's bars: the lanes a split
    run's helper holds are done there, at the same time as the others here. ``fn`` is a
    ``forked_helper.job``; ``arg`` and its results are pickled."""
    return _lanes_map(lay, fn, arg, None)


def lanes_held(lay: Layout, fn: Callable[[Lane, Any], list[tuple[Any, bytes]]], arg: Any = None) -> list[Any]:
    """``lanes_map`` of an ``fn`` that makes (key, bytes) pieces of a document (a large export),
    where the helper keeps the bytes of its lanes' pieces: a ``Held`` (their size) stands for each,
    and ``write_pieces`` has the helper write them into the output file where they go."""
    return _lanes_map(lay, fn, arg, _Held(lay.split, fn, arg) if lay.split is not None else None)


def _lanes_map(lay: Layout, fn: Callable[[Lane, Any], Any], arg: Any, held: _Held | None) -> list[Any]:
    part = lay.split
    if part is None:
        return [fn(lane, arg) for lane in lay.lanes]
    asked_for = (part.ctx["token"], ref(fn), arg)
    asked = part.here is None and (
        part.split.call(_part_job, asked_for) if held is None else part.split.call(_part_hold, (*asked_for, held.token))
    )
    out: list[Any] = [fn(lane, arg) if lane.index not in part.indices else None for lane in lay.lanes]
    theirs: list[tuple[int, Any]] | None = None
    if asked:
        try:
            if part.pending:
                part.pending = False
                part.split.reply()  # its lanes laid out
            theirs = part.split.reply()
        except HelperLost:
            theirs = None
    if theirs is None:
        theirs = [(index, fn(lane, arg)) for index, lane in part.lanes_here().items()]
    elif held is not None:
        theirs = [(i, [(key, Held(held, i, n, size)) for n, (key, size) in enumerate(sizes)]) for i, sizes in theirs]
    for index, value in theirs:
        out[index] = value
    return out


class _Held:
    """The pieces one ``lanes_held`` left in the helper (``_HELD`` there), and how to make them here."""

    _TOKENS = itertools.count(1)

    def __init__(self, part: Part, fn: Callable[[Lane, Any], list[tuple[Any, bytes]]], arg: Any) -> None:
        self.part, self.fn, self.arg, self.token = part, fn, arg, next(self._TOKENS)

    def here(self, pieces: list[Held]) -> list[bytes]:
        """The bytes of ``pieces``, made here (the helper was lost): the same, laid out the same way."""
        lanes = self.part.lanes_here()
        made = {index: self.fn(lanes[index], self.arg) for index in {p.index for p in pieces}}
        out = [made[p.index][p.n][1] for p in pieces]
        if any(len(data) != p.size for data, p in zip(out, pieces, strict=True)):
            raise RuntimeError("a lane's output made again differs from the helper's")  # a bug: never written
        return out


class Held:
    """A piece of output a split run's child made and keeps (``lanes_held``): its size here."""

    __slots__ = ("index", "job", "n", "size")

    def __init__(self, job: _Held, index: int, n: int, size: int) -> None:
        self.job, self.index, self.n, self.size = job, index, n, size

    def __len__(self) -> int:
        return self.size


def resolve(chunks: Iterable[bytes | Held]) -> list[bytes]:
    """``chunks`` with each ``Held`` piece's bytes, sent back by the helper (made here if it is lost)."""
    chunks = list(chunks)
    held = [c for c in chunks if isinstance(c, Held)]
    got: dict[int, bytes] = {}
    for job, pieces in _by_job(held).items():
        data = None
        if job.part.split.call(_part_fetch, (job.token, [(p.index, p.n) for p in pieces])):
            try:
                data = job.part.split.reply()
            except HelperLost:
                pass
        got.update(zip(map(id, pieces), data if data is not None else job.here(pieces), strict=True))
    return [bytes(got[id(c)] if isinstance(c, Held) else c) for c in chunks]


def write_pieces(fd: int, chunks: Iterable[bytes | Held]) -> None:
    """``chunks`` one after the other into ``fd`` (a regular file opened for writing, at its start):
    the helper writes the ``Held`` ones at their offsets while this process writes the rest; what
    the helper could not write (it failed or died) is then made and written here."""
    mine, theirs, offset = [], [], 0
    for chunk in chunks:
        (theirs if isinstance(chunk, Held) else mine).append((offset, chunk))
        offset += len(chunk)
    places = {id(p): off for off, p in theirs}
    jobs = _by_job([p for _, p in theirs])
    asked = {
        job: job.part.split.call(_part_write, (job.token, [(p.index, p.n, places[id(p)]) for p in pieces]), fd)
        for job, pieces in jobs.items()
    }
    for off, data in mine:
        pwrite_all(fd, data, off)
    for job, pieces in jobs.items():
        if asked[job]:
            try:
                job.part.split.reply()
                continue
            except HelperLost:
                pass
        for p, data in zip(pieces, job.here(pieces), strict=True):  # what the helper did not write
            pwrite_all(fd, data, places[id(p)])


def _by_job(pieces: list[Held]) -> dict[_Held, list[Held]]:
    out: dict[_Held, list[Held]] = {}
    for p in pieces:
        out.setdefault(p.job, []).append(p)
    return out


_HELD: dict[int, dict[int, list[bytes]]] = {}  # in the helper: ``lanes_held`` token -> lane index -> its pieces


@forked_helper.job
def _part_hold(procs: dict[str, ProcessRec], arg: tuple) -> list[tuple[int, list[tuple[Any, int]]]]:
    """In the helper: ``_part_job``, keeping the pieces' bytes (``_HELD``) and sending their sizes."""
    *job, token = arg
    held = _HELD[token] = {}
    out = []
    for index, pieces in _part_job(procs, tuple(job)):
        held[index] = [data for _, data in pieces]
        out.append((index, [(key, len(data)) for key, data in pieces]))
    return out


@forked_helper.job
def _part_fetch(procs: dict[str, ProcessRec], arg: tuple) -> list[bytes]:
    token, wanted = arg
    held = _HELD[token]
    return [bytes(held[index][n]) for index, n in wanted]


@forked_helper.job
def _part_write(procs: dict[str, ProcessRec], arg: tuple, fd: int) -> int:
    """In the helper: write held pieces into the parent's file (``fd``, its copy) at their offsets."""
    token, places = arg
    held = _HELD.pop(token)
    for index, n, offset in places:
        pwrite_all(fd, held[index][n], offset)
    return len(places)
