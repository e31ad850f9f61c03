"""``git storm simulate``: the same work in storm mode and in worktree mode, measured.

Research tooling, off the user's path: the command line imports it only when
``simulate`` runs, and nothing in the hooks or the write path imports it
(tests/test_layering.py). Its plots need the ``sim`` extra (matplotlib).
"""
