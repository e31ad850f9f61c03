"""`git storm --help` runs `man git-storm`: the shipped page must match the CLI."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

PAGE = ROOT / "man" / "git-storm.1"


def test_shipped_man_page_is_up_to_date():
    from storm_git.cli.main import cli
    from storm_git.cli.manpage import render

    assert PAGE.read_text() == render(cli), "regenerate: python3 -m storm_git.cli.manpage > man/git-storm.1"


def test_man_page_renders_every_command():
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    out = subprocess.run(["man", "-l", str(PAGE)], capture_output=True, text=True,
                         env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}).stdout
    from storm_git.cli.main import cli

    for name in cli.list_commands(None):
        assert f"git storm {name}" in out, name


@pytest.mark.slow
def test_wheel_maps_cli_and_hooks_under_storm_git(tmp_path):
    """No top-level `cli` or `hooks` module may land in site-packages; the hook shims
    ship as data, and setuptools has nothing to warn about ("would be ignored")."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                        str(PAGE.parent.parent), "-w", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    import zipfile

    [wheel] = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"storm_git"}
    # every module of the source tree, under its installed name
    sources = {f"storm_git/{p.relative_to(ROOT / 'storm_git')}" for p in (ROOT / "storm_git").rglob("*.py")}
    sources |= {f"storm_git/{top}/{p.relative_to(ROOT / top)}"
                for top in ("cli", "hooks") for p in (ROOT / top).rglob("*.py")}
    assert sources - set(names) == set()
    assert any(n.endswith("share/man/man1/git-storm.1") for n in names)
    assert "storm_git/hooks/shims/pre-commit" in names
    assert "would be ignored" not in r.stdout + r.stderr


@pytest.mark.slow
def test_git_storm_help_finds_the_page_after_an_editable_install(tmp_path):
    """The README installs with `pip install -e`; git turns `git storm --help` into
    `man git-storm`, which must find the page in the environment (through its bin/ on PATH)."""
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-e", str(PAGE.parent.parent)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (venv / "share" / "man" / "man1" / "git-storm.1").read_text() == PAGE.read_text()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "MANPAGER": "cat",
           "MANWIDTH": "100", "GIT_CONFIG_NOSYSTEM": "1"}
    for argv in (["git", "storm", "--help"], ["git", "help", "storm"]):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert "No manual entry" not in out.stderr, argv
        assert out.stdout.startswith("GIT-STORM(1)"), (argv, out.stdout[:200], out.stderr)
        assert "git storm init" in out.stdout
