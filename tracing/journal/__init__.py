"""The journal's file format: the run directory's layout, the records writers make, the writer, the
schema readers check records against, and the reader. Writers (every traced process) import
``layout``, ``records`` and ``writer`` only; ``schema`` and ``reader`` are the readers' side."""
