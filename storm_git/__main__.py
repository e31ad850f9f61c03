"""``python -m storm_git`` runs the git-storm command line."""
from storm_git.cli.main import main

main()
