"""``git storm team``: a manager and its engineers in one command.

A plan (:mod:`.plan`) splits a task into subtasks with disjoint primary files and
a dependency graph; a run (:mod:`.runner`) starts one engineer session per subtask
(:mod:`.launcher`), watches them (:mod:`.progress`), lands their work
(:mod:`.land`) and reports (:mod:`.report`). Everything a run knows is kept in
``.git/storm/team/<run>/`` (:mod:`.state`), so a killed run loses nothing.
"""
