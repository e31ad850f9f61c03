"""The one libgit2 layer (storm_git.core.store), answering as libgit2 does."""
from __future__ import annotations

import itertools

import pygit2

from helpers import git, make_repo, rev
from storm_git.core.store import Store


def test_store_descends_answers_as_libgit2_on_chains_branches_merges_and_roots(tmp_path):
    """Store.descends walks first parents through the object cache (the remote write
    path asks it several times a write); it must answer exactly as descendant_of."""
    repo_dir = make_repo(tmp_path / "r", init_storm=False)

    def commit(*parents: str, msg: str) -> str:
        tree = git(repo_dir, "rev-parse", "HEAD^{tree}").stdout.decode().strip()
        args = [a for p in parents for a in ("-p", p)]
        return git(repo_dir, "commit-tree", *args, "-m", msg, tree).stdout.decode().strip()

    root = rev(repo_dir, "HEAD")
    chain = [root]
    for i in range(12):
        chain.append(commit(chain[-1], msg=f"c{i}"))
    side = [commit(chain[4], msg="s0")]  # a sibling of chain[5]
    side.append(commit(side[-1], msg="s1"))
    merged = commit(chain[-1], side[-1], msg="merge")  # a merge: handed over to libgit2
    after = commit(merged, msg="after")
    other_root = git(repo_dir, "commit-tree", "-m", "root2",
                     git(repo_dir, "rev-parse", "HEAD^{tree}").stdout.decode().strip()).stdout.decode().strip()
    every = chain + side + [merged, after, other_root]
    store = Store.discover(str(repo_dir))
    r = pygit2.Repository(str(repo_dir))
    for a, b in itertools.product(every, repeat=2):
        ta, tb = pygit2.Oid(hex=a), pygit2.Oid(hex=b)
        assert store.descends(ta, tb) == r.descendant_of(ta, tb), (every.index(a), every.index(b))
    # the answers that matter, spelled out
    o = lambda h: pygit2.Oid(hex=h)  # noqa: E731
    assert store.descends(o(chain[9]), o(chain[3])) and not store.descends(o(chain[3]), o(chain[9]))
    assert not store.descends(o(chain[9]), o(side[0])) and not store.descends(o(side[1]), o(chain[5]))
    assert store.descends(o(after), o(side[0])) and not store.descends(o(chain[7]), o(chain[7]))
