"""What a new job must satisfy beyond its shape, checked once, when it is
registered or rescheduled.

The model (pysched.model) says what a job looks like and is also used to read
stored jobs back; these checks are kept apart so that tightening them never
makes a job already stored unreadable. Each failure names the field and says
what would be accepted, so every face (CLI, Python, HTTP) can show it as is.
"""

from __future__ import annotations

import json
import re

from pydantic import HttpUrl, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from pysched.model import HttpTarget, IntervalSchedule, Job, OnceSchedule, Schedule, ShellTarget

# Far enough for any real plan; near enough that every run time can be shown
# as a date (Python's datetime ends at year 9999).
MAX_AHEAD_YEARS = 100
MAX_AHEAD_MS = MAX_AHEAD_YEARS * 36_525 * 86_400_000 // 100
# A payload is stored with the job and read by the worker at every run.
PAYLOAD_LIMIT_BYTES = 1024 * 1024
# Linux refuses to start a process with one argument or environment string
# longer than 128 KiB (MAX_ARG_STRLEN, counting its NUL). A shell command is
# one argument of `sh -c`; the payload reaches it as PYSCHED_PAYLOAD.
SHELL_STRING_LIMIT_BYTES = 128 * 1024 - len("PYSCHED_PAYLOAD=") - 1

_HTTP_URL: TypeAdapter[HttpUrl] = TypeAdapter(HttpUrl)
_UNSAFE_IN_URL = re.compile(r"[\s\x00-\x1f\x7f]")


class JobRejected(ValueError):
    """A job that cannot be accepted; ``field`` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# Made once: json.dumps with separators builds an encoder per call, a third
# of a bulk registration's admission time.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def payload_bytes(payload: object) -> int:
    """Its size as JSON; JobRejected for what JSON cannot hold (a Python
    object, NaN), which a Python caller can pass where the CLI cannot."""
    try:
        # ASCII (non-ASCII is escaped), so its characters are its bytes.
        return len(_COMPACT_JSON.encode(payload))
    except (TypeError, ValueError) as exc:
        raise JobRejected("payload", f"not JSON: {exc}") from None


def _storable(job: Job) -> None:
    """Its JSON form can be stored: a text holding a lone surrogate (what
    Python makes of a byte that is not UTF-8 in a command line) cannot."""
    try:
        job.model_dump_json()
    except PydanticSerializationError:
        try:
            json.dumps(job.payload, ensure_ascii=False).encode()
            field = "job"
        except UnicodeEncodeError:
            field = "payload"
        raise JobRejected(field, "holds text that is not valid Unicode (a byte that is not UTF-8?)") from None


def admit(job: Job, now_ms: int) -> None:
    """Raise JobRejected when ``job`` cannot be registered at ``now_ms``."""
    check_schedule(job.schedule, now_ms)
    if job.critical and job.jitter_window_s:
        raise JobRejected("jitter_window_s", "a critical job has no jitter; give one or the other")
    size = payload_bytes(job.payload)
    _storable(job)
    if size > PAYLOAD_LIMIT_BYTES:
        raise JobRejected("payload", f"{size:,} bytes as JSON; the limit is {PAYLOAD_LIMIT_BYTES:,}")
    target = job.target
    if isinstance(target, ShellTarget):
        command_size = len(target.command.encode())
        if command_size > SHELL_STRING_LIMIT_BYTES:
            raise JobRejected(
                "target.command", f"{command_size:,} bytes; a shell command may have {SHELL_STRING_LIMIT_BYTES:,}"
            )
        if size > SHELL_STRING_LIMIT_BYTES:
            raise JobRejected(
                "payload",
                f"{size:,} bytes as JSON; a shell target receives it in an environment variable,"
                f" which may have {SHELL_STRING_LIMIT_BYTES:,} bytes",
            )
    elif isinstance(target, HttpTarget):
        check_url(target.url)


def check_schedule(schedule: Schedule, now_ms: int) -> None:
    if isinstance(schedule, OnceSchedule) and schedule.run_at_ms > now_ms + MAX_AHEAD_MS:
        raise JobRejected("schedule.run_at_ms", f"more than {MAX_AHEAD_YEARS} years ahead")
    if isinstance(schedule, IntervalSchedule) and (schedule.start_ms or 0) > now_ms + MAX_AHEAD_MS:
        raise JobRejected("schedule.start_ms", f"more than {MAX_AHEAD_YEARS} years ahead")


def check_url(url: str) -> None:
    """An http(s) URL that urllib can send as it is: no spaces or control
    characters, a host, a port in range."""
    if _UNSAFE_IN_URL.search(url):
        raise JobRejected("target.url", f"{url!r} contains spaces or control characters; percent-encode them")
    try:
        _HTTP_URL.validate_python(url)
    except ValidationError as exc:
        reason = str(exc.errors()[0]["msg"]).removeprefix("Input should be a valid URL, ")
        raise JobRejected("target.url", f"{url!r} is not a valid http(s) URL: {reason}") from None
