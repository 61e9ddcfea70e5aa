"""Tracing starts in this process: the runtime (run directory, journal, provider), then what every
traced process runs beside it: the exit flush, the stack-dump signal and the heartbeat thread.

Its own module, above the runtime and the services it starts, so that none of them imports another
in a circle: ``spans`` and ``bootstrap`` start tracing here, the services only ever import down.
"""

from __future__ import annotations

from . import heartbeat, lifecycle, runtime, stackdump


def start() -> runtime.Runtime:
    """This process's runtime, started with its services; raises ``runtime.TracingOff`` when the
    run directory cannot be written (said once by the runtime)."""
    rt = runtime.current()
    if rt.services_started:
        return rt
    rt.start()
    with rt.lock:
        if rt.services_started:
            return rt
        rt.services_started = True
    lifecycle.install()
    stackdump.arm(rt)
    heartbeat.start(rt)
    return rt
