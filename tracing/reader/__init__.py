"""A run directory read back: processes, their phases as span records, heartbeats and diagnoses
(``run``), and loading a whole run for the CLI, on two cores when it pays (``load``)."""
