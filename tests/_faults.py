"""Faults caused for real, on real processes, for the tests of issue 49 (imported, not collected).

Every cluster here freezes (SIGSTOP), thaws (SIGCONT) and kills (SIGKILL, several at once)
worker processes by address, and waits for the nannies to restart killed ones.
:class:`ClientFaults` does it on the workers of any client whose workers have nannies (a
worker's pid is asked of its nanny, which still answers while its worker is stopped);
:class:`LocalFaultCluster` starts a ``LocalCluster`` for it.

:class:`NetnsCluster`: a ``dask scheduler`` in the root network namespace and one ``dask
worker`` (with its nanny) in a network namespace of its own per worker, each joined to the
root namespace by a veth pair (``10.77.<n>.2`` inside, ``10.77.<n>.1`` outside) and routed
through it, so that the link between two workers can be cut while both still reach the
scheduler and the driver: :meth:`NetnsCluster.partition` drops their packets silently in
the root namespace (``ip rule ... blackhole``), as a real partition does; the senders'
TCP connections time out (``distributed.comm.timeouts.tcp``, TCP_USER_TIMEOUT). Needs root
and iproute2's ``ip``; the tests skip, saying why, where namespaces cannot be made.
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _nanny_pid(dask_worker):
    """Run on a nanny: its worker process's pid."""
    return dask_worker.process.pid if dask_worker.process is not None else None


def worker_pids(client) -> dict[str, int]:
    """Each worker's process id, by worker address, asked of the nannies (a stopped worker
    does not answer; its nanny does)."""
    workers = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    nannies = {info["nanny"]: addr for addr, info in workers.items() if info.get("nanny")}
    pids = client.run(_nanny_pid, nanny=True, on_error="ignore")
    found = {nannies[n]: pid for n, pid in pids.items() if n in nannies and pid}
    missing = [w for w in workers if w not in found]
    if missing:     # no nanny: ask the workers themselves
        found.update(client.run(os.getpid, workers=missing))
    return found


def thaw(pid: int) -> None:
    """SIGCONT a stopped process (by pid: a stopped worker may have left the scheduler)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian: apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"slbprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _free_subnets(n: int) -> list[int]:
    """``n`` third octets of 10.77.x.0/24 no interface of the root namespace uses, from one
    that depends on the pid (two clusters made at once by two processes start apart)."""
    used = _ip("-4", "-o", "addr").stdout
    free = [x for x in range(1, 255) if f" 10.77.{x}." not in used]
    if len(free) < n:
        raise RuntimeError("no free 10.77.x.0/24 subnets")
    at = os.getpid() % len(free)
    return (free[at:] + free[:at])[:n]


_made = itertools.count()


class _Faults:
    """The faults every cluster here causes, by worker address: a subclass has ``client``,
    ``n`` (its workers) and :meth:`pid`."""

    client = None
    n = 0

    def __init__(self) -> None:
        self.killed: set[str] = set()

    @property
    def workers(self) -> list[str]:
        """The scheduler's workers now, by address."""
        from streamlb._placement import cluster_workers

        return sorted(cluster_workers(self.client))

    def wait_for_workers(self, n: int | None = None, timeout: float = 60.0) -> list[str]:
        """Wait until ``n`` (all) workers are there and none of them is one :meth:`kill`
        killed (nannies restart killed ones, at new ports); their addresses."""
        deadline = time.time() + timeout
        while True:
            workers = self.workers
            if len(workers) >= (n or self.n) and not set(workers) & self.killed:
                return workers
            if time.time() > deadline:
                raise TimeoutError(f"{len(workers)} workers after {timeout} s: {workers} (killed: {self.killed})")
            time.sleep(0.1)

    def pid(self, worker: str) -> int:
        raise NotImplementedError

    def freeze(self, worker: str) -> int:
        """SIGSTOP the worker process (its nanny goes on); its pid, for :meth:`thaw`."""
        pid = self.pid(worker)
        os.kill(pid, signal.SIGSTOP)
        return pid

    def thaw(self, pid: int) -> None:
        """SIGCONT a process :meth:`freeze` stopped."""
        thaw(pid)

    def close(self) -> None:
        raise NotImplementedError

    def kill(self, *workers: str) -> list[int]:
        """SIGKILL the processes of ``workers`` at once (pids looked up first); their nannies
        start them again, at new ports."""
        pids = [self.pid(w) for w in workers]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self.killed.update(workers)
        return pids

    def partition(self, a: str, b: str) -> None:
        pytest.skip(f"{type(self).__name__} cannot cut a link (NetnsCluster can)")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClientFaults(_Faults):
    """The faults of :class:`_Faults` on the workers of any ``client`` whose workers have
    nannies (a ``LocalCluster`` of processes, ``dask worker`` processes): no partition."""

    def __init__(self, client, n_workers: int | None = None) -> None:
        super().__init__()
        self.client = client
        self.n = n_workers or len(self.workers)

    def pid(self, worker: str) -> int:
        return worker_pids(self.client)[worker]

    def close(self) -> None:
        pass


class LocalFaultCluster(ClientFaults):
    """A ``LocalCluster`` of ``n_workers`` worker processes with nannies, and its client."""

    def __init__(self, n_workers: int = 3) -> None:
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        self.address = self.cluster.scheduler_address
        super().__init__(Client(self.cluster), n_workers)

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


class NetnsCluster(_Faults):
    """A ``dask scheduler`` and ``n_workers`` ``dask worker`` processes (with nannies), each
    worker in a network namespace of its own. Use as a context manager; :meth:`close` undoes
    everything (also on failure). ``env``: more environment for the workers (e.g.
    ``DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP``)."""

    def __init__(self, n_workers: int = 2, env: dict | None = None, start_timeout: float = 90.0) -> None:
        reason = netns_unavailable()
        if reason:
            pytest.skip(reason)
        super().__init__()
        self.n = n_workers
        self.tag = f"s{os.getpid() % 100000}n{next(_made)}"
        self.nets: list[tuple[str, str, int]] = []     # (namespace, root-side veth, third octet)
        self.rules: list[tuple[str, str]] = []
        self.procs: list[subprocess.Popen] = []
        self.nannies: dict[str, subprocess.Popen] = {}  # worker host -> its nanny
        self.client = None
        self._forward = None
        try:
            self._start(env or {}, start_timeout)
        except BaseException:
            self.close()
            raise

    # -- setup ------------------------------------------------------------------------------
    def _start(self, env: dict, start_timeout: float) -> None:
        from distributed import Client

        with open("/proc/sys/net/ipv4/ip_forward") as f:
            self._forward = f.read().strip()
        for i, octet in enumerate(_free_subnets(self.n)):
            ns, veth = f"{self.tag}w{i}", f"{self.tag}r{i}"
            _ip("netns", "add", ns)
            self.nets.append((ns, veth, octet))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("addr", "add", f"10.77.{octet}.1/24", "dev", veth)
            _ip("link", "set", veth, "up")
            for args in (("addr", "add", f"10.77.{octet}.2/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                         ("link", "set", "lo", "up"), ("route", "add", "default", "via", f"10.77.{octet}.1")):
                _ip(*args, ns=ns)
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1")
        dask = shutil.which("dask") or os.path.join(os.path.dirname(sys.executable), "dask")
        host = f"10.77.{self.nets[0][2]}.1"          # every namespace routes to it
        self.address = f"tcp://{host}:{_free_port(host)}"
        penv = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
        logs = os.environ.get("STREAMLB_CLUSTER_LOGS")
        self.procs.append(subprocess.Popen(
            [dask, "scheduler", "--host", host, "--port", self.address.rsplit(":", 1)[1],
             "--dashboard-address", ":0"], env=penv, start_new_session=True, **_out(logs, f"{self.tag}-scheduler")))
        for i, (ns, _, octet) in enumerate(self.nets):
            # `ip netns exec` execs the command: the Popen's pid is the nanny's
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, dask, "worker", self.address, "--nthreads", "1",
                 "--host", f"10.77.{octet}.2", "--no-dashboard"],
                env=dict(penv, **env), start_new_session=True, **_out(logs, f"{self.tag}-worker{i}"))
            self.procs.append(p)
            self.nannies[f"10.77.{octet}.2"] = p
        deadline = time.time() + start_timeout
        while True:
            try:
                self.client = Client(self.address, timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        while len(self.workers) < self.n:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"{len(self.workers)} of {self.n} workers joined; exited: {dead} "
                                   f"(set STREAMLB_CLUSTER_LOGS to a directory for their output)")
            time.sleep(0.2)

    # -- what is there ----------------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        """The scheduler's workers now, by address, in namespace order."""
        order = {f"10.77.{o}.2": i for i, (_, _, o) in enumerate(self.nets)}
        return sorted(super().workers, key=lambda w: order.get(_host(w), -1))

    def pid(self, worker: str) -> int:
        """The process id of ``worker`` (not its nanny), found as its nanny's child: it needs
        no answer from the worker, and stays right after a restart."""
        nanny = self.nannies[_host(worker)]
        for child in _children(nanny.pid):
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    return child
        raise ProcessLookupError(f"worker {worker} has no process (its nanny {nanny.pid} has no worker child)")

    # -- faults -----------------------------------------------------------------------------
    def partition(self, a: str, b: str) -> None:
        """Drop every packet between workers ``a`` and ``b`` silently (both ways); both keep
        reaching the scheduler, the driver and every other worker."""
        ha, hb = _host(a), _host(b)
        for src, dst in ((ha, hb), (hb, ha)):
            _ip("rule", "add", "from", src, "to", dst, "blackhole")
            self.rules.append((src, dst))

    def heal(self) -> None:
        """Undo every :meth:`partition`."""
        while self.rules:
            src, dst = self.rules.pop()
            _ip("rule", "del", "from", src, "to", dst, "blackhole", check=False)

    # -- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process, remove the rules, veths and namespaces, put ip_forward back."""
        self.heal()
        if self.client is not None:
            try:
                self.client.close(timeout=5)
            except Exception:
                pass
            self.client = None
        for p in self.procs:
            try:
                for child in _children(p.pid, deep=True):
                    os.kill(child, signal.SIGCONT)      # a stopped process dies only once continued
                    os.kill(child, signal.SIGKILL)
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for ns, veth, _ in self.nets:
            _ip("link", "del", veth, check=False)
            _ip("netns", "del", ns, check=False)
        self.nets = []
        if self._forward is not None and not _ip("-o", "link", "show", "type", "veth").stdout.strip():
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
                f.write(self._forward)      # only when no other namespaced cluster needs it
        self._forward = None


def _host(address: str) -> str:
    return address.split("://")[-1].rsplit(":", 1)[0]


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _out(logs: str | None, name: str) -> dict:
    if not logs:
        return {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    os.makedirs(logs, exist_ok=True)
    return {"stdout": open(os.path.join(logs, f"{name}.log"), "ab"), "stderr": subprocess.STDOUT}


def _children(pid: int, deep: bool = False) -> list[int]:
    """The child processes of ``pid`` (all descendants with ``deep``), from /proc."""
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:      # a child belongs to the thread that started it
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
        except OSError:
            pass
    if deep:
        kids += [g for k in kids for g in _children(k, deep=True)]
    return kids
