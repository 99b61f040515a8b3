"""Serving side of the stack: the tritonserver launcher (``python -m serving serve``) and shared helpers."""
