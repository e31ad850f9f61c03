"""The shared workspace on a git remote, with the server doing the compare-and-swap.

A clone configured with ``storm.remote=NAME`` keeps local copies of the storm
refs; the remote's ``refs/storm/workspace`` is the truth. A write fetches the
storm refs (never branches), runs the local validated write against the
fetched head ``H`` (:class:`storm_git.storm.workspace.SharedWorkspace`, unchanged), and
publishes it with one ``git push --atomic --force-with-lease=…:<H>`` carrying
the commit (its provenance in its trailers) and the agent's notes (the read set
and journal those trailers name): both land or neither does.
A stale lease means another machine wrote: fetch, re-validate, retry.

* :mod:`.transport` — the ``git`` subprocesses (fetch of the storm refs, atomic push);
* :mod:`.client` — :class:`RemoteWorkspace`, init/join/sync/push-reads;
* :mod:`.server_hook` — the pre-receive guard installed in the bare repository.
"""
