"""The ``git-storm`` command line (installed as ``storm_git.cli``)."""
