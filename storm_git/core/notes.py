"""Git notes trees that storm builds itself, with 2/38 fanout, moved by CAS.

``create_note``/``git notes add`` update the notes ref without a CAS
and libgit2 writes notes trees flat (cost grows linearly with the number of
notes). So storm writes notes commits itself: one TreeBuilder per fanout level,
then a compare-and-swap of the notes ref. The layout is the one ``git notes``
uses for large notes trees, so ``git notes --ref=… show`` and ``git log
--notes=…`` read them unchanged.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import pygit2

from .store import MODE_BLOB, MODE_TREE, Store, ref_oid


def _split(target: str) -> tuple[str, str]:
    return target[:2], target[2:]


def notes_tree(store: Store, ref: pygit2.Reference | None) -> pygit2.Tree | None:
    if ref is None:
        return None
    return store.commit(ref_oid(ref)).tree


def read_note(store: Store, tree: pygit2.Tree | None, target: str) -> bytes | None:
    """The note on object ``target`` (hex), in fanout or flat layout."""
    if tree is None:
        return None
    a, b = _split(target)
    for path in (f"{a}/{b}", target):
        try:
            blob = tree[path].id
        except KeyError:
            continue
        return store.blob_bytes(blob)  # a blob missing here is fetched or reported, never "no note"
    return None


def iter_notes(store: Store, tree: pygit2.Tree | None, _prefix: str = "") -> Iterator[tuple[str, pygit2.Oid]]:
    """(annotated object hex, note blob id) for every note, whatever the fanout."""
    if tree is None:
        return
    for entry in tree:
        name = _prefix + str(entry.name)
        if entry.filemode == MODE_TREE:
            yield from iter_notes(store, store.tree(entry.id), name)
        elif len(name) == 40:
            yield name, entry.id


def update_notes(
    store: Store,
    refname: str,
    changes: Mapping[str, bytes | None],
    *,
    agent: str,
    message: str,
) -> pygit2.Oid | None:
    """Apply ``changes`` (object hex → note text, None removes) in one notes commit.

    Retries when the ref moved underneath (only writers outside storm's locks
    can do that). Returns the new notes commit, or None when nothing changed.
    """
    blobs = {t: (store.write_blob(v) if v is not None else None) for t, v in changes.items()}
    while True:
        ref = store.ref(refname)
        tree = notes_tree(store, ref)
        root = store.repo.TreeBuilder(tree) if tree is not None else store.repo.TreeBuilder()
        groups: dict[str, dict[str, pygit2.Oid | None]] = {}
        for target, blob in blobs.items():
            a, b = _split(target)
            groups.setdefault(a, {})[b] = blob
            if root.get(target) is not None:  # a flat note written by git notes
                root.remove(target)
        for a, items in groups.items():
            existing = root.get(a)
            sub_tree = store.tree(existing.id) if existing is not None and existing.filemode == MODE_TREE else None
            sub = store.repo.TreeBuilder(sub_tree) if sub_tree is not None else store.repo.TreeBuilder()
            for b, blob in items.items():
                if blob is None:
                    if sub.get(b) is not None:
                        sub.remove(b)
                else:
                    sub.insert(b, blob, MODE_BLOB)
            if len(sub):
                root.insert(a, store.write_tree(sub), MODE_TREE)
            elif existing is not None:
                root.remove(a)
        new_tree = store.write_tree(root)
        if tree is not None and new_tree == tree.id:
            return None
        parents = [ref_oid(ref)] if ref is not None else []
        commit = store.make_commit(new_tree, parents, agent, message)
        if store.cas(ref, refname, commit, message):
            return commit
