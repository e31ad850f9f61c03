"""Which untracked files look like secrets (credentials, private keys, env files).

An untracked file that is not ignored shows up among the unmediated edits; the
one-flag way to record them all (``commit --adopt``) would put a ``.env`` into the
branch's history, where removing it means rewriting history and rotating the
secret. Files named like the usual secret holders are left out of that flag and
pointed at ``.gitignore`` instead; ``git storm adopt PATH`` still records one on
purpose. The names follow what secret scanners and GitHub's gitignore templates
treat as secrets; a template of one (``.env.example``) is not.
"""
from __future__ import annotations

import fnmatch
import posixpath

NAMES = frozenset({
    ".env", ".envrc", ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials", ".htpasswd",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "credentials", "credentials.json", "secrets.json",
    "secrets.yml", "secrets.yaml", "secrets.toml", "terraform.tfstate", "terraform.tfvars",
})
PATTERNS = (".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.tfvars",
            "*.tfstate", "*.tfstate.*", "*_rsa", "*_ed25519", "*.ovpn")
TEMPLATES = ("example", "sample", "template", "dist", "defaults")  # .env.example, config.key.sample…


def likely_secret(path: str) -> bool:
    """Is ``path`` (repository-relative, '/'-separated) named like a file holding secrets?"""
    name = posixpath.basename(path).lower()
    if any(name.endswith("." + t) or name.endswith("-" + t) or name.endswith("_" + t) for t in TEMPLATES):
        return False
    return name in NAMES or any(fnmatch.fnmatchcase(name, p) for p in PATTERNS)


def gitignore_line(path: str) -> str:
    """The .gitignore line that ignores exactly ``path`` (anchored at the top)."""
    escaped = "".join("\\" + c if c in "*?[]!#\\ " else c for c in path)
    return "/" + escaped
