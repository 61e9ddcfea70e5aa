"""The PYTHONPATH entry: ``sitecustomize.py`` here arms tracing in every process started under it."""
