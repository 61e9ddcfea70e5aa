"""The main thread of a ``py-spy dump --native`` text, classified in words: the native call it sits in
(``flock``, a ``futex`` under NCCL, a CUDA call, ``poll``…), the library, the innermost Python frame.
The text is what the watchdog already took (``stack_requests.py_spy``): nothing is attached here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...redact import printable
from .values import KINDS

_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: \"(.*)\")?")
_FRAME = re.compile(r"^\s{2,}(.+?)(?: \((.*)\))?\s*$")
_PY_WHERE = re.compile(r"(\.py|>):\d+$")
_NATIVE_KIND = {
    "flock": "flock", "fcntl": "lock", "lockf": "lock", "poll": "poll", "ppoll": "poll", "select": "poll",
    "pselect": "poll", "pselect6": "poll", "epoll_wait": "epoll", "epoll_pwait": "epoll", "epoll_pwait2": "epoll",
    "connect": "connect", "accept": "accept", "accept4": "accept", "recv": "recv", "recvfrom": "recv",
    "recvmsg": "recv", "recvmmsg": "recv", "libc_recv": "recv", "read": "read", "libc_read": "read", "pread": "read",
    "readv": "read", "nanosleep": "sleep", "clock_nanosleep": "sleep", "usleep": "sleep", "sleep": "sleep",
    "thrd_sleep": "sleep", "wait4": "wait_child", "waitpid": "wait_child", "waitid": "wait_child",
    "libc_wait": "wait_child", "ioctl": "ioctl", "sched_yield": "yield", "syscall": "futex",
}  # fmt: skip
_FUTEX = re.compile(
    r"^(futex|lll_|pthread_cond_|pthread_mutex_lock|sem_|new_sem_wait|do_futex|pthread_(clock|timed)?join)"
)
_MEANING = (  # a frame below the top that says what the futex is
    (re.compile(r"^take_gil$|^PyEval_RestoreThread$|^PyEval_AcquireThread$"), "gil"),
    (re.compile(r"pthread_(clock|timed)?join"), "join"),
    (re.compile(r"PyThread_acquire_lock|^acquire_timed$|^lock_PyThread"), "pylock"),
)
_LIBS = (  # (name, frame test), in the order a match is preferred
    ("NCCL", lambda f, w: "libnccl" in w or f.startswith("nccl")),
    ("gloo", lambda f, w: "gloo" in w or "gloo::" in f),
    ("CUDA", lambda f, w: "libcuda" in w or "libcudart" in w or re.match(r"^cu(da)?[A-Z]", f) is not None),
    ("torch.distributed", lambda f, w: "c10d::" in f),
)
LIB_KIND = {"NCCL": "nccl", "gloo": "gloo", "CUDA": "cuda"}
_CALL = {"futex": "futex", "yield": "sched_yield", "ioctl": "ioctl", "poll": "poll", "sleep": "nanosleep"}
_POLLED_LOCK = re.compile(r"filelock|file_baton|FileLock|FileBaton|_lock\.py|lockfile", re.IGNORECASE)


@dataclass(frozen=True)
class Native:
    """The main thread of a py-spy ``--native`` dump, classified."""

    kind: str
    words: str
    frame: str | None  # the top frame as py-spy wrote it
    library: str | None = None
    python: str | None = None


def _normal(func: str) -> str:
    func = re.sub(r"^__GI_", "", func).lstrip("_")
    return re.sub(r"(_nocancel|_time64|64)$", "", func.split("@", 1)[0])


def main_thread_frames(dump: str, pid: int | None = None) -> list[tuple[str, str]]:
    """``(function, where)`` of the main thread, innermost first, from py-spy ``dump`` text (its
    ``--native`` section when the text holds both, as ``stacks.py_spy`` writes them)."""
    marker = dump.find("with native frames ===")
    if marker >= 0:
        dump = dump[marker:]
    frames: list[tuple[str, str]] | None = None
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            if frames is not None:
                break
            tid, name = head.group(1), head.group(3)
            if name == "MainThread" or (pid is not None and tid == str(pid)):
                frames = []
            continue
        if frames is not None:
            m = _FRAME.match(line)
            if m is not None:
                frames.append((m.group(1), m.group(2) or ""))
            elif line.strip() and not line.startswith(" "):
                break
    return frames or []


def native_frame(dump: str, pid: int | None = None) -> Native | None:
    """The main thread's native call, classified in words (``flock``, ``futex`` under NCCL, a CUDA
    call, ``poll``…); None when the dump has no main thread. Dumps without native frames still give
    the innermost Python frame (kind ``unknown``)."""
    frames = main_thread_frames(dump, pid)
    if not frames:
        return None
    py_at = next((i for i, (_, w) in enumerate(frames) if _PY_WHERE.search(w)), len(frames))
    native = frames[:py_at]
    python = f"{frames[py_at][0]} ({frames[py_at][1]})" if py_at < len(frames) else None
    kind = "unknown"
    for func, _ in native[:4]:
        name = _normal(func)
        if name in _NATIVE_KIND:
            kind = _NATIVE_KIND[name]
            break
        if _FUTEX.match(name):
            kind = "futex"
            break
    if kind == "futex":
        for func, _ in native:
            hit = next((k for pattern, k in _MEANING if pattern.search(func)), None)
            if hit is not None:
                kind = hit
                break
    library, words = None, ""
    for lib, test in _LIBS:
        hits = [f for f, w in native if test(f, w)]
        if hits:
            entry = hits[-1].split("(")[0]  # its outermost frame: the call the program made
            library = f"{lib} ({entry})"
            if kind in ("unknown", "futex", "yield", "ioctl", "poll", "sleep") and lib in LIB_KIND:
                at = f", in `{_CALL[kind]}`" if kind in _CALL else ""
                kind, words = LIB_KIND[lib], f"{KINDS[LIB_KIND[lib]]} (`{entry}`{at})"
            break
    if kind in ("sleep", "poll", "futex", "unknown") and any(_POLLED_LOCK.search(w) for _, w in frames[py_at:][:4]):
        kind = "lock_poll"
    words = words or KINDS.get(kind, KINDS["other"]) + (f" in {library}" if library else "")
    top = f"{frames[0][0]} ({frames[0][1]})" if frames[0][1] else frames[0][0]
    return Native(kind, printable(words), printable(top), printable(library) if library else None, _short(python))


def _short(text: str | None) -> str | None:
    """A frame ``f (/long/path/to/x.py:12)`` as ``f (to/x.py:12)``, redacted."""
    if text is None:
        return None
    m = re.match(r"^(.*) \((.*)\)$", text)
    if m and "/" in m.group(2):
        text = f"{m.group(1)} ({'/'.join(m.group(2).split('/')[-2:])})"
    return printable(text)
