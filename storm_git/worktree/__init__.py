"""Worktree mode (CAID): one git worktree and branch per agent, merged by the
manager at the end (``merge``), brought up to the target by ``sync``.
"""
