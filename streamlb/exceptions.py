"""One exception hierarchy for streamlb.

Every message names the thing involved (operator, column, key group, file, address) and says
what would be valid.
"""
from __future__ import annotations

__all__ = [
    "StreamlbError",
    "PipelineError",
    "SchemaError",
    "UnknownOperatorError",
    "KeyTypeError",
    "UnpicklableFunctionError",
    "InputPathError",
    "SchedulerUnreachableError",
    "BrokerUnreachableError",
    "JavaNotFoundError",
    "UserFunctionError",
    "JobFailedError",
    "JobServiceError",
    "JobReleasedError",
    "MigrationError",
    "ReconfigurationError",
    "CommandError",
    "CheckpointError",
    "PeerUnreachableError",
    "InstanceUnresponsiveError",
    "SinkWriteError",
    "StateTooLargeError",
    "StreamlbWarning",
]


class StreamlbError(Exception):
    """Base class of every error streamlb raises on purpose."""


class PipelineError(StreamlbError, ValueError):
    """The streamz graph cannot be planned (unsupported node, bad spec, bad wiring)."""


class SchemaError(StreamlbError, KeyError):
    """A column the pipeline needs is not in the data."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownOperatorError(StreamlbError, KeyError):
    """A job has no operator of that name; the message lists the operators it has. Also a
    ``KeyError``, which :meth:`Job.state` and the other lookups by name raised before."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class KeyTypeError(StreamlbError, TypeError):
    """A key has a type the stable hash cannot take."""


class UnpicklableFunctionError(StreamlbError, TypeError):
    """A user function cannot be sent to the workers."""


class InputPathError(StreamlbError, FileNotFoundError):
    """An input path is absent or holds no data files, or one of its files does not open
    as Parquet (corrupt, cut short, not Parquet at all)."""


class SchedulerUnreachableError(StreamlbError, OSError):
    """No Dask scheduler answered at the given address."""


class BrokerUnreachableError(StreamlbError, ConnectionError):
    """A Kafka source's broker did not answer a metadata or offset look-up within the
    setting ``streamlb.kafka.timeout`` (or refused it); the message names the bootstrap
    address, the look-up and librdkafka's reason."""


class JavaNotFoundError(StreamlbError, RuntimeError):
    """PySpark needs a Java runtime (17 or newer) and none was found."""


class UserFunctionError(StreamlbError, RuntimeError):
    """A user function raised while processing a record.

    Attributes name the operator, the function and the offending record.
    """

    def __init__(self, message: str, operator: str = "", function: str = "", record: object = None):
        super().__init__(message)
        self.operator = operator
        self.function = function
        self.record = record

    def __reduce__(self):
        return (type(self), (self.args[0], self.operator, self.function, self.record))


class JobFailedError(StreamlbError, RuntimeError):
    """The job stopped because an instance failed; the cause is chained."""


class JobReleasedError(StreamlbError, RuntimeError):
    """The job's instances, and the state they held, are gone: their workers retired or
    the cluster closed after the job finished (see docs/reconfiguration.md)."""


class MigrationError(StreamlbError, ValueError):
    """A move of key groups was refused (bad instance or key group, job not running) or
    could not complete; the job keeps running on its current routing."""


class ReconfigurationError(MigrationError):
    """A rescale, move, update or worker drain was refused (bad operator, instance,
    parallelism, worker or function, or another reconfiguration of the operator running);
    the job runs on as it was."""


class CommandError(MigrationError):
    """A command sent to the balancer plugin was refused before it did anything: an unknown
    job or operator, a missing or unexpected argument, a value of the wrong type or out of
    range. The message names the command, the argument and what would be valid; the plugin
    and every job run on as they were."""


class CheckpointError(StreamlbError, RuntimeError):
    """A checkpoint or savepoint cannot be written or restored: the path is not writable,
    the checkpoint is partial or corrupt (no manifest, a missing file, a checksum mismatch),
    or the graph restored into does not match it. The message names the file or the
    mismatch."""


class PeerUnreachableError(StreamlbError, ConnectionError):
    """An instance could not deliver to another instance (a network partition between their
    workers, a connect or write timeout) while both workers are still listed by the
    scheduler. A fault like a lost worker: a checkpointed job recovers from it on workers
    that reach each other. Attributes: ``sender`` and ``receiver`` (instance labels),
    ``address`` (the receiver's worker)."""

    def __init__(self, message: str, sender: str = "", receiver: str = "", address: str = ""):
        super().__init__(message)
        self.sender, self.receiver, self.address = sender, receiver, address

    def __reduce__(self):
        return (type(self), (self.args[0], self.sender, self.receiver, self.address))


class InstanceUnresponsiveError(StreamlbError, TimeoutError):
    """An instance answered none of the driver's polls for ``streamlb.fault.heartbeat-timeout``
    (its worker frozen, stopped or stuck). A fault like a lost worker: a checkpointed job
    recovers without that worker. Attributes: ``instance``, ``address``, ``silent`` (seconds)."""

    def __init__(self, message: str, instance: str = "", address: str = "", silent: float = 0.0):
        super().__init__(message)
        self.instance, self.address, self.silent = instance, address, silent

    def __reduce__(self):
        return (type(self), (self.args[0], self.instance, self.address, self.silent))


class SinkWriteError(StreamlbError, OSError):
    """A sink could not write its output (a full disk, a read-only or missing directory, no
    permission). The message names the sink, the path and the cause (``errno``/``strerror``
    of the ``OSError``, chained), never a traceback. Attributes: ``sink``, ``path``,
    ``errno_name`` (e.g. ``"ENOSPC"``), ``permanent`` (retrying cannot help: no space, no
    permission, read-only: the job fails at once rather than spend its restart attempts)."""

    def __init__(self, message: str, sink: str = "", path: str = "", errno_name: str = "",
                 permanent: bool = True):
        super().__init__(message)
        self.sink, self.path, self.errno_name, self.permanent = sink, path, errno_name, permanent

    def __reduce__(self):
        return (type(self), (self.args[0], self.sink, self.path, self.errno_name, self.permanent))


class StateTooLargeError(StreamlbError, MemoryError):
    """A read of keyed state (``job.state``) refused before it started: the DataFrame it
    would build does not fit in the memory left on an instance's worker or in the driver.
    The message names the operator, the instance and its worker, the estimate and the memory
    free, and how many key groups a read with ``key_groups=`` could take. Nothing changed:
    the state is intact. Attributes: ``operator``, ``nbytes`` (the estimate), ``free``,
    ``groups_per_read``."""

    def __init__(self, message: str, operator: str = "", nbytes: int = 0, free: int = 0, groups_per_read: int = 0):
        super().__init__(message)
        self.operator, self.nbytes, self.free, self.groups_per_read = operator, nbytes, free, groups_per_read

    def __reduce__(self):
        return (type(self), (self.args[0], self.operator, self.nbytes, self.free, self.groups_per_read))


class JobServiceError(StreamlbError, RuntimeError):
    """A request to a cluster's job service was refused before it changed anything (an
    unknown job name, a name a running job holds, a pipeline whose results only a client
    could receive, no service on the scheduler), or a submitted job's driver could not carry
    it out. The message names the job and says what would be valid."""


class StreamlbWarning(UserWarning):
    """Something that runs but probably not as meant, said when the job is planned: e.g. a
    ``sink`` whose function changes a list, dict, set or deque of the driver, which stays
    unchanged there (the function runs on a worker, on its own copy). Silence it with
    ``warnings.filterwarnings("ignore", category=streamlb.StreamlbWarning)``."""
