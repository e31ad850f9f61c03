"""git storm simulate: the same work in storm mode and in worktree mode, measured."""
