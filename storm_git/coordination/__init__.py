"""What both modes know about the agents besides their writes: which paths each is
assigned (``git storm assign``, :mod:`.assignments`) and the intent notes agents
leave on lines (``# agent: why``, :mod:`.intents`). Storm mode flags a write that
crosses them; worktree mode checks commits and orders merges by them."""
