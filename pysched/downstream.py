"""The downstream a job's runs call: what their failures have in common with
other jobs', for the circuit breaker and the retry budget they share."""

from __future__ import annotations

from urllib.parse import urlsplit

from pysched.model import HttpTarget, Job, TemporalTarget


def downstream_of(job: Job) -> str:
    """The job's own ``downstream`` if it names one (a database, a queue, a
    service its code calls); else ``http:HOST[:PORT]`` for an HTTP target,
    ``temporal:NAMESPACE/TASK_QUEUE`` for a workflow, and ``job:ID`` for a
    Python or shell target. A module or a program is no downstream: the
    functions of one module, or every ``python script.py`` job, call
    unrelated things, and one failing must not park or refuse the retries
    of the others."""
    if job.downstream is not None:
        return job.downstream
    target = job.target
    if isinstance(target, HttpTarget):
        return f"http:{urlsplit(target.url).netloc.rpartition('@')[2].lower()}"
    if isinstance(target, TemporalTarget):
        # A workflow's failures are those of the workers polling its task
        # queue, not of its type alone; and a queue belongs to a namespace:
        # the same name in two namespaces is polled by two sets of workers.
        return f"temporal:{target.namespace}/{target.task_queue}"
    return f"job:{job.id}"
