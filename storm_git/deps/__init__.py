"""Which files a Python write can break: the import graph (scope) and the names a change touches (impact)."""
