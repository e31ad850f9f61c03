"""The STORM paper's manager interface on git storm (optional: for the paper's harness).

:mod:`.manager` is a drop-in for ``multiagent_sync``'s ``Manager`` (the in-memory
manager of the paper's OpenHands harness) and :mod:`.versions` numbers the shared
workspace's files with the integers that interface speaks. Nothing in the command
line, the hooks or the write path imports this package (tests/test_layering.py).
"""
