"""The cluster-in-a-box behind `dev/stack`: every component the tests need.

Each component module exposes ``up()``, ``down()`` and ``status()``; the
order in ``components.py`` is the order they are brought up.
"""
