"""The launcher's side: what a traced launching process starts beside SGLang once it knows it is
the launcher (its ``launch`` root begins), and what it does at ready, at teardown and at exit.

``lifecycle`` is the one entry point (``bootstrap`` hands it to ``tracing.phases``, which never
imports it: a rank loads none of this): the watchdog thread, the multi-node channel, the start-up
endpoint (``endpoint``: ``/metrics``, ``/startup``, for orchestrators) and the state file
``phasetrace probe`` reads.
"""
