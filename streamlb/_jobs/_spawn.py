"""Start a job's driver as a child process of the scheduler.

The driver is ``python -m streamlb.service._driver JOB_DIR --address ADDRESS``, run by the
scheduler's own interpreter with its output in the job's directory. Importing what a driver
needs (distributed, pandas, streamlb) takes seconds on a busy machine, so the registry keeps
one *standby* driver (``--standby``) that has imported it all and waits for a job on its
standard input (:func:`assign`): a lost driver's job is taken up by it at once. On Linux it is killed
with the scheduler (``PR_SET_PDEATHSIG``): a driver whose scheduler is gone can do nothing
for its job, and the registry of a scheduler started again starts a new one. Where the
cluster uses TLS, the driver gets the scheduler's CA and certificate through the
environment (``DASK_DISTRIBUTED__COMM__TLS__*``), as a client of the cluster needs them.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

__all__ = ["spawn_driver", "spawn_standby", "assign"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:         # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:                     # not Linux: the driver then outlives a killed scheduler
        pass


def _tls_env(security) -> dict:
    """The environment that gives a client the scheduler's TLS settings (none without TLS)."""
    if security is None or not getattr(security, "tls_ca_file", None):
        return {}
    env = {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": security.tls_ca_file,
           "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": str(bool(security.require_encryption))}
    cert = getattr(security, "tls_client_cert", None) or getattr(security, "tls_scheduler_cert", None)
    key = getattr(security, "tls_client_key", None) or getattr(security, "tls_scheduler_key", None)
    if cert:
        env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"] = cert
    if key:
        env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"] = key
    return env


def spawn_driver(job_dir: str, address: str, incarnation: int, security=None) -> tuple[subprocess.Popen, str]:
    """Start the driver of the job in ``job_dir`` for the scheduler at ``address``; return
    the process and the path of its log."""
    log = os.path.join(job_dir, f"driver-{incarnation}.log")
    env = dict(os.environ, **_tls_env(security), STREAMLB_DRIVER_INCARNATION=str(incarnation),
               PYTHONUNBUFFERED="1")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlb.service._driver", job_dir, "--address", address],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent, start_new_session=True, close_fds=True)
    return proc, log


def spawn_standby(root: str, security=None) -> subprocess.Popen:
    """A driver process that imports what a driver needs, then waits for :func:`assign`."""
    env = dict(os.environ, **_tls_env(security), PYTHONUNBUFFERED="1")
    with open(os.path.join(root, "standby-driver.log"), "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "streamlb.service._driver", "--standby"],
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent, start_new_session=True, close_fds=True)


def assign(proc: subprocess.Popen, job_dir: str, address: str, incarnation: int) -> str | None:
    """Give the standby driver ``proc`` the job of ``job_dir``: the path of its log, or None
    if it is gone (a new driver is then spawned)."""
    import json

    if proc.poll() is not None:
        return None
    log = os.path.join(job_dir, f"driver-{incarnation}.log")
    try:
        proc.stdin.write((json.dumps({"job_dir": job_dir, "address": address, "incarnation": incarnation,
                                      "log": log}) + "\n").encode())
        proc.stdin.flush()
        proc.stdin.close()
    except OSError:
        return None
    return log
