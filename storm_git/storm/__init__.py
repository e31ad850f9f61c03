"""Storm mode (STORM): one shared workspace on ``refs/storm/workspace``; every
write is validated against the agent's read set and lands by compare-and-swap.

``workspace`` holds the verbs and ``write`` the validated write; ``tracking``
records what commands and editors change on disk (exec, adopt); ``commit`` is the
manager's commit of the shared tree.
"""
