"""Setting a repository up and keeping it healthy: init, mode switches, the
commit hooks and their guard, doctor, and the demonstration.
"""
