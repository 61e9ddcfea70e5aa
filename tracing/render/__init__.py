"""Turning a run directory into pictures and files: terminal tables, timelines, HTML, exports."""
