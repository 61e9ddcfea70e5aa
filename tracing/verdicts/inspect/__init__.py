"""``phasetrace inspect``'s judgement: an SGLang launch started without the hook, read from outside.

One module per job: ``launch`` (its processes, from ``/proc`` and the titles SGLang sets),
``sample`` (``/proc`` counters and py-spy dumps over a short window, in parallel), ``frames`` (a
stack's phase, through the patch tables' targets, and the collective it waits in), ``extras`` (what a
person checks by hand: the log's silence, ``/health``, GPU, whether the launch is traced after all),
``judge`` (each process's state and the verdict, in the watchdog's words and voice).
"""
