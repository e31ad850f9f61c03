"""Storm mode (STORM): one shared workspace on ``refs/storm/workspace``; every
write is validated against the agent's read set and lands by compare-and-swap.

``workspace`` holds the verbs and ``write`` the validated write; ``snapshot``
finds what differs on disk, ``commands`` records what a command changes
(``begin_exec``/``finish_exec``), ``edits`` what a harness's own file tool
changes (``begin_edit``/``finish_edit``), ``adopt`` what editors changed;
``commit`` is the manager's commit of the shared tree.
"""
