"""Several "machines" on one host: network namespaces joined by veth pairs, each with its own address and
host name, for tests of ``overdrive launch --num_machines N`` across a real network link.

``Cluster(n)`` makes namespaces ``od<id>m0 .. od<id>m<n-1>``; machine 0 is the hub: machine ``i > 0`` is joined
to it by its own veth pair ``od<id>a<i>`` (in machine 0, address ``198.18.<net>.1`` of subnet ``i``) and
``od<id>b<i>`` (in machine ``i``, ``.2``). The addresses are in 198.18.0.0/15, the range set aside for network
tests (RFC 2544), picked per cluster so that concurrent tests do not meet; a machine's processes reach only
the other namespaces of its own cluster (no route out). ``cut(i)`` takes machine ``i``'s link down (its side:
every packet between it and the hub is dropped silently, no reset reaches either side).

Processes start through ``ip netns exec NS unshare --uts`` with the machine's own host name; every machine's
``/etc/hosts`` (``/etc/netns/NS/hosts``, which ``ip netns exec`` mounts in place) resolves the cluster's names. ``close()``
kills every process left in the namespaces (whatever the test did) and deletes them, which deletes the
links; use the class as a context manager or the ``cluster`` fixture of this folder's conftest.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``, no ``unshare``), or None."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, as CI does)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install -y iproute2 util-linux)"
    name = f"odprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Cluster:
    """``n`` machines as network namespaces (see the module docstring)."""

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.id = f"{os.getpid() % 100000}{random.randrange(100):02d}"
        self.net = random.randrange(0, 512 - n)  # the first of the n-1 /24s of 198.18.0.0/15 it uses
        self.namespaces = [f"od{self.id}m{i}" for i in range(n)]
        self.hosts = [f"machine{i}-{self.id}" for i in range(n)]
        self.addresses: list[str] = []
        self.procs: list[subprocess.Popen] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _subnet(self, i: int) -> str:
        third = self.net + i - 1
        return f"198.{18 + third // 256}.{third % 256}"

    def _build(self) -> None:
        for ns in self.namespaces:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        hub = self.namespaces[0]
        self.addresses = [f"{self._subnet(1)}.1"] + [f"{self._subnet(i)}.2" for i in range(1, self.n)]
        for i in range(1, self.n):
            a, b = f"od{self.id}a{i}", f"od{self.id}b{i}"
            _ip("link", "add", a, "netns", hub, "type", "veth", "peer", "name", b, "netns", self.namespaces[i])
            _ip("-n", hub, "addr", "add", f"{self._subnet(i)}.1/24", "dev", a)
            _ip("-n", self.namespaces[i], "addr", "add", f"{self._subnet(i)}.2/24", "dev", b)
            _ip("-n", hub, "link", "set", a, "up")
            _ip("-n", self.namespaces[i], "link", "set", b, "up")
        # spokes reach each other through the hub only if it routes; they talk to the hub (the main
        # process) and gloo connects every pair, so give the hub forwarding and the spokes a default route
        if self.n > 2:
            subprocess.run(["ip", "netns", "exec", hub, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True,
                           timeout=20)
            for i in range(1, self.n):
                _ip("-n", self.namespaces[i], "route", "add", "198.18.0.0/15", "via", f"{self._subnet(i)}.1")
        # each machine's host names resolve as DNS would resolve them (gloo binds to its host name's
        # address): ``ip netns exec`` mounts /etc/netns/NS/hosts over /etc/hosts
        names = "".join(f"{addr} {host}\n" for addr, host in zip(self.addresses, self.hosts))
        for ns in self.namespaces:
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("127.0.0.1 localhost\n" + names)

    def address(self, i: int) -> str:
        """Machine ``i``'s address (the one the others reach it at)."""
        return self.addresses[i]

    def start(self, i: int, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path | None = None) -> subprocess.Popen:
        """Run ``argv`` on machine ``i`` (its namespace and host name), output to the two files."""
        shell = f'hostname "{self.hosts[i]}" && exec "$@"'
        cmd = ["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts", "sh", "-c", shell, "sh", *argv]
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def pids(self, i: int) -> list[int]:
        """Every process in machine ``i``'s namespace."""
        found = _ip("netns", "pids", self.namespaces[i], check=False).stdout.split()
        return [int(p) for p in found if p.isdigit()]

    def kill_machine(self, i: int) -> list[int]:
        """SIGKILL every process of machine ``i`` (a machine lost at once); return their pids."""
        pids = self.pids(i)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def cut(self, i: int) -> None:
        """Take machine ``i``'s link to the hub down: from now on its packets are dropped, silently."""
        _ip("-n", self.namespaces[i], "link", "set", f"od{self.id}b{i}", "down")

    def close(self) -> None:
        """Kill every process of every machine, then delete the namespaces (and with them the links)."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for i in range(len(self.namespaces)):
            self.kill_machine(i)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while any(self.pids(i) for i in range(len(self.namespaces))) and time.monotonic() < deadline:
            for i in range(len(self.namespaces)):
                self.kill_machine(i)
            time.sleep(0.1)
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        # a veth whose namespace is gone is gone too; one left in the root namespace (a failed build) is not
        for i in range(1, self.n):
            _ip("link", "del", f"od{self.id}a{i}", check=False)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
