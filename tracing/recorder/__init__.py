"""What runs inside every traced process: the runtime, phases as spans, the journal's writer side,
heartbeats, evidence of activity, GPU figures, init collectives, OTLP export, launch identity, and
the stack-dump arming. Nothing here reads another process's journal or judges anything: that is
``reader`` and ``verdicts``, which a traced rank never imports."""
