"""Spans, journal, heartbeats, watchdog, exporters and the CLI of sglang-phasetrace."""
