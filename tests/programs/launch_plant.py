"""Plants for tests/test_launch_processes.py: ``PLANT`` = ``WHERE:HOW``: the first call of WHERE
(in the first process that gets there: an exclusive file) waits, HOW: ``socket=HOST,PORT``
(connect, send a request, read the answer), ``flock=PATH`` (an exclusive lock), ``sleep``."""

import os

if os.environ.get("PLANT"):
    import functools

    import wrapt

    WHERE, HOW = os.environ["PLANT"].split(":", 1)
    MODULE, CLASS, METHOD = {
        "tokenizer_manager": ("sglang.srt.managers.tokenizer_manager", "TokenizerManager", "__init__"),
        "detokenizer": ("sglang.srt.managers.detokenizer_manager", "DetokenizerManager", "init_request_dispatcher"),
        "tokenizer_worker": ("sglang.srt.managers.multi_tokenizer_mixin", "TokenizerWorker", "__init__"),
        "dp_controller": ("sglang.srt.managers.data_parallel_controller", "DataParallelController", "__init__"),
    }[WHERE]

    def first():
        try:
            os.close(os.open(os.environ["PLANT_ONCE"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            return False

    def wait():
        what, _, arg = HOW.partition("=")
        if what == "flock":
            import fcntl

            f = open(arg, "a")
            fcntl.flock(f, fcntl.LOCK_EX)
        elif what == "socket":
            import socket

            host, port = arg.split(",")
            s = socket.create_connection((host, int(port)))
            s.sendall(b"GET /api/models/tiny/tokenizer.json HTTP/1.1\r\nHost: hub\r\n\r\n")
            s.recv(1)
        else:
            import time

            time.sleep(600)

    @wrapt.when_imported(MODULE)
    def _plant(module):
        cls = getattr(module, CLASS)
        original = cls.__dict__[METHOD]

        @functools.wraps(original)
        def planted(*args, **kwargs):
            if type(args[0]).__name__ == CLASS and first():
                wait()
            return original(*args, **kwargs)

        setattr(cls, METHOD, planted)
