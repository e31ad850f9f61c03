"""The shared workspace on a git remote, with the server doing the compare-and-swap.

A clone configured with ``storm.remote=NAME`` keeps local copies of the storm
refs; the remote's ``refs/storm/workspace`` is the truth. A write runs the local
validated write against the clone's copy of the server's head
(:class:`storm_git.storm.workspace.SharedWorkspace`, unchanged) and queues it; the
queue goes to the server with the agents' notes (the read sets its provenance
names): to the clone's inbox on a server that orders writes (its proc-receive hook
applies them in arrival order and answers per write), elsewhere in one ``git push
--atomic --force-with-lease=…:<H>`` (a stale lease: another machine wrote; fetch,
move the queue, push again).

* :mod:`.transport` — the ``git`` subprocesses (fetch of the storm refs, pushes);
* :mod:`.workspace` — :class:`RemoteWorkspace`: storm's verbs starting from the server's head;
* :mod:`.landing` — its publication: the push that is the compare-and-swap, group commit;
* :mod:`.exchange` — the locks of a fetch or a push, and the fetched values adopted locally;
* :mod:`.clone_sync` — ``git storm sync`` and ``push-reads`` on a clone;
* :mod:`.write_queue` — the clone's queue of writes on its local ref, and its records;
* :mod:`.queue_move` — the rule that moves queued writes onto a newer head (both sides);
* :mod:`.inbox` — a clone's push to its inbox and the server's answers;
* :mod:`.server_hook` — the pre-receive guard installed in the bare repository;
* :mod:`.server_order`, :mod:`.arrival`, :mod:`.pktline` — the proc-receive hook that
  orders clones' writes.
"""
