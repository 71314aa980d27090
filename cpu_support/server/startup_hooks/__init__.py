"""Start-up hooks of the CPU server: each folder holds a ``sitecustomize.py``
that ``cpu_server`` puts on the server's ``PYTHONPATH``; `post_import` is
what they share (standard library only)."""
