"""Judgement, in whoever watches a launch (the launcher, ``phasetrace run``/``watch``, the CLI):
stalls, deaths and failures and their root cause, ranks that never started, what a rank waits on,
known-fix hints, stack requests, the cross-node channel, and the one place findings are assembled."""
