"""Git servers on 127.0.0.1 for the benchmarks: ``git daemon`` and an sshd of our own.

Both serve the bare repositories under one base directory and are stopped by the
caller (``stop()``), by their own process id. The sshd is never the system's: it
runs in the foreground from a config, a throwaway host key and one authorized key
made under the caller's directory, on a free loopback port; its clients use
``ssh_command`` (also a throwaway ``known_hosts``).
"""
from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
# sshd run as root refuses to start without its privilege-separation directory; the
# openssh-server package makes it when its service starts, which a container without
# an init never does
PRIVSEP_DIR = "/run/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: str | None = None) -> None:
    for _ in range(500):
        if proc.poll() is not None:
            detail = open(log).read().strip()[-500:] if log and os.path.exists(log) else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening: {detail}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


@dataclass
class Server:
    """A server process on loopback and how a clone names a repository on it."""

    name: str
    proc: subprocess.Popen
    port: int
    base: str
    ssh_command: str | None = None  # GIT_SSH_COMMAND for clients (ssh only)

    def url(self, repo: str) -> str:
        """The URL of the bare repository ``repo`` (a path under ``base``)."""
        if self.name == "git":
            return f"git://127.0.0.1:{self.port}/{os.path.relpath(repo, self.base)}"
        return f"ssh://{pwd.getpwuid(os.geteuid()).pw_name}@127.0.0.1:{self.port}{os.path.abspath(repo)}"

    def cpu(self) -> float:
        """CPU seconds of the server process and of every child it has reaped so far (the
        connections it served: upload-pack, receive-pack, the hooks they ran)."""
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in rest[11:15]) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_daemon(base: str) -> Server:
    """``git daemon`` serving every repository under ``base``, pushes enabled."""
    port = free_port()
    # git-daemon itself, not the ``git`` wrapper that would run it as a child: cpu()
    # reads this process's counters, where the connections' processes add up
    daemon = os.path.join(subprocess.run(["git", "--exec-path"], capture_output=True, text=True,
                                         check=True).stdout.strip(), "git-daemon")
    proc = subprocess.Popen([daemon, "--enable=receive-pack", "--export-all", f"--base-path={base}",
                             "--listen=127.0.0.1", f"--port={port}", "--reuseaddr", base],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc, "git daemon")
    return Server("git", proc, port, base)


def sshd_unavailable() -> str | None:
    """Why an sshd of our own cannot run here (None: it can)."""
    if not os.path.exists(SSHD):
        return f"no sshd at {SSHD} (apt-get install openssh-server)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "no ssh client or ssh-keygen on PATH"
    if os.geteuid() == 0 and not os.path.isdir(PRIVSEP_DIR):
        try:
            os.makedirs(PRIVSEP_DIR, mode=0o755)
        except OSError as exc:
            return f"sshd needs {PRIVSEP_DIR} and it cannot be made: {exc}"
    return None


def start_sshd(base: str, home: str, max_startups: str = "100:30:200") -> Server:
    """An sshd on a free loopback port that lets the current user in with a key made
    here, and nothing else (no passwords, no PAM). ``max_startups``: sshd's default
    (10:30:100) drops 30 % of new connections once 10 are unauthenticated, which a
    few clones pushing at once reach on a loaded machine -- a server for a team
    raises it, and so does this one."""
    why = sshd_unavailable()
    if why:
        raise RuntimeError(why)
    os.makedirs(home, exist_ok=True)
    host_key, user_key = os.path.join(home, "host_key"), os.path.join(home, "user_key")
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    authorized = os.path.join(home, "authorized_keys")
    shutil.copy(user_key + ".pub", authorized)
    port = free_port()
    config = os.path.join(home, "sshd_config")
    with open(config, "w") as fh:
        fh.write(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
                 f"AuthorizedKeysFile {authorized}\nPidFile {os.path.join(home, 'sshd.pid')}\n"
                 "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                 "PermitRootLogin prohibit-password\nUsePAM no\n"
                 "StrictModes no\n"  # the key files live in a temporary directory
                 f"MaxStartups {max_startups}\nMaxSessions 100\n")
    log = os.path.join(home, "sshd.log")
    proc = subprocess.Popen([SSHD, "-D", "-f", config, "-E", log], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for_port(port, proc, "sshd", log)
    known = os.path.join(home, "known_hosts")
    command = " ".join(shlex.quote(x) for x in (
        "ssh", "-i", user_key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", f"UserKnownHostsFile={known}", "-o", "LogLevel=ERROR"))
    return Server("ssh", proc, port, base, ssh_command=command)
