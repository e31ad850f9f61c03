"""``python -m storm_git`` runs the git-storm command line."""
from storm_git.entry import main

main()
