"""A refused job, field by field: what every face (Python, CLI, HTTP) shows.

pydantic reports a field by its path through the model, with the union's tag
in it (``schedule.cron.expr``) and its own wording; admission (JobRejected)
names one field. Both become `InvalidJob`: a list of problems, each naming a
field by its path in the job's JSON form and saying what would be accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pysched.admission import JobRejected

ID_RULE = "ASCII letters, digits, '.', '_' or '-', at most 128, starting with a letter or digit"

# The tags of the schedule and target unions, which are not fields.
_UNION_TAGS = frozenset({"cron", "every", "once", "shell", "python", "http", "temporal"})

# (field, pydantic error type) -> what would be accepted, in words.
_WORDS = {
    ("id", "string_pattern_mismatch"): ID_RULE,
    ("target.ref", "string_pattern_mismatch"): "module:function, for example myjobs:report",
    ("target.workflow", "string_pattern_mismatch"): "a workflow type name, without surrounding spaces",
    ("target.workflow", "string_too_short"): "a workflow type name, without surrounding spaces",
    ("target.task_queue", "string_pattern_mismatch"): "a task queue name, without surrounding spaces",
    ("target.task_queue", "string_too_short"): "a task queue name, without surrounding spaces",
    ("target.namespace", "string_pattern_mismatch"): "a Temporal namespace: letters, digits, '.', '_' or '-'",
    ("payload", "dict_type"): "must be a JSON object",
    ("jitter_window_s", "finite_number"): "seconds, a number from 0 to 3600",
    ("jitter_window_s", "greater_than_equal"): "seconds, a number from 0 to 3600",
    ("jitter_window_s", "less_than_equal"): "seconds, a number from 0 to 3600",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a job: ``field`` is its path in the job's JSON
    form (``schedule.expr``, ``retry.retries``), empty for the job as a whole."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidJob(ValueError):
    """A job refused before anything was stored."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def in_batch(index: int, exc: InvalidJob) -> InvalidJob:
    """A batch's job at fault named as pydantic names it in the batch's JSON
    (``jobs.1.schedule.every_s``), as POST /jobs/batch does: which of many
    jobs is meant, and the same words on every face."""
    prefix = f"jobs.{index}"
    return InvalidJob(tuple(Problem(f"{prefix}.{p.field}" if p.field else prefix, p.message) for p in exc.problems))


def invalid_from_validation(exc: ValidationError) -> InvalidJob:
    return InvalidJob(problems_from_errors(exc.errors()))


def problems_from_errors(
    errors: Sequence[Mapping[str, Any]], outside: frozenset[str] = frozenset()
) -> tuple[Problem, ...]:
    """pydantic's errors as problems; a first path part in ``outside`` (where
    an HTTP request carried the value: body, query) is not part of the field."""
    problems = []
    for err in errors:
        parts = [str(p) for p in err.get("loc", ())]
        if parts and parts[0] in outside:
            parts = parts[1:]
        # A union's tag names the branch a value was read as, within a
        # field (schedule.cron.expr); alone, it is a field's own name (the
        # query parameter cron).
        field = ".".join(p for p in parts if p not in _UNION_TAGS or len(parts) == 1)
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if message.startswith("expr: "):
            # The schedule's own validator names its expression.
            field, message = f"{field}.expr" if field else "expr", message.removeprefix("expr: ")
        problems.append(Problem(field, _WORDS.get((field, str(err.get("type"))), message)))
    return tuple(problems)


def invalid_from_rejection(exc: JobRejected) -> InvalidJob:
    return InvalidJob((Problem(exc.field, exc.message),))
