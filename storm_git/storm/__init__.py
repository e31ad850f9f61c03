"""Storm mode (STORM): one shared workspace on ``refs/storm/workspace``; every
write is validated against the agent's read set and lands by compare-and-swap.

``shared`` holds the validated write; ``tracking`` records what commands and
editors change on disk (exec, adopt); ``manager`` commits the shared tree.
"""
