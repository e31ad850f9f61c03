"""The shared core of both modes: the repository and its refs (store, locks,
notes, trailers), agents' read sets and reservations, the recorded working tree
(disk), assignments (scope), events, payloads and errors.

Nothing here imports the modes (:mod:`storm_git.storm`, :mod:`storm_git.worktree`),
the integrations or the admin commands: they build on it.
"""
