"""What each dashboard page shows, read through the Client: its live tables
(`Part`s, which the page's script refreshes from the same function) and the
rest of its body.

The fire-lag distribution samples, at bounded cost per request: the last run
of each of the first `LAG_JOBS` jobs (one `last_runs` read) plus the recent
history (`LAG_HISTORY` runs each) of the `LAG_RECENT_JOBS` jobs whose last
run left most recently. So a busy job weighs more than an idle one, and a
store of many jobs costs one bulk read and a few small ones, not a scan.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

from pysched import recurrence
from pysched.api.ui.html import Cell, Html, Part, Post, part_html, tag
from pysched.catchup import count_missed
from pysched.client import Client, PartitionLeader, RunKey, coming_fires, led_together
from pysched.model import CronSchedule, OnceSchedule
from pysched.protocols import JobNotFound, JobRecord, MissedRuns, RunRecord, shows_an_earlier_dispatch
from pysched.views import iso, job_json

DEFAULT_WINDOW_MIN = 60
MAX_WINDOW_MIN = 24 * 60
# Bounds on one overview: jobs listed, recurring jobs previewed and fires
# listed per job (a once-a-minute job has 60 in an hour, all counted).
MAX_UPCOMING = 200
MAX_PREVIEWED_JOBS = 50
MAX_FIRES_PER_JOB = 24
# The lag sample (see the module docstring) and the recent runs shown.
LAG_JOBS = 1000
LAG_RECENT_JOBS = 20
LAG_HISTORY = 50
RECENT_RUNS = 25
HISTORY_RUNS = 50
PREVIEW_FIRES = 10
DEAD_LETTERS = 500
# Upper bounds of the lag buckets, in ms; below 0 is a run handed on early.
LAG_BOUNDS_MS = (0, 10, 50, 100, 250, 500, 1_000, 5_000, 30_000)


@dataclass(frozen=True, slots=True)
class Page:
    title: str
    body: Html
    parts: dict[str, Part] = field(default_factory=dict)


def job_href(job_id: str) -> str:
    return f"/ui/jobs/{quote(job_id, safe='')}"


def clock(ms: int | None) -> str:
    """A stored time in the machine's zone, to the second, with the zone."""
    if ms is None:
        return ""
    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (ValueError, OverflowError, OSError):
        return iso(ms) or ""


def span(ms: int | None) -> str:
    """A duration: 12 ms, 3.40 s, 5 min 2 s, 2 h 5 min."""
    if ms is None:
        return ""
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1_000:
        return f"{sign}{ms} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.2f} s"
    if ms < 3_600_000:
        return f"{sign}{ms // 60_000} min {ms % 60_000 // 1000} s"
    return f"{sign}{ms // 3_600_000} h {ms % 3_600_000 // 60_000} min"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def relative(ms: int, now_ms: int) -> str:
    return f"in {span(ms - now_ms)}" if ms >= now_ms else f"{span(now_ms - ms)} ago"


def fire_lag_ms(run: RunRecord) -> int | None:
    """How late the run left the scheduler against its jittered due time."""
    if run.dispatched_at_ms is None or shows_an_earlier_dispatch(run):
        return None
    return run.dispatched_at_ms - run.due_ms


def _state(state: str) -> Cell:
    return Cell(state, cls=f"state state-{state}")


def _error(message: str | None) -> Cell:
    if not message:
        return Cell("")
    first = message.strip().splitlines()[0] if message.strip() else message
    short = first if len(first) <= 120 else first[:119] + "…"
    return Cell(short, cls="error", title=message if short != message else None)


def _duration(run: RunRecord) -> str:
    if run.started_at_ms is None or run.ended_at_ms is None or shows_an_earlier_dispatch(run):
        return ""
    return span(run.ended_at_ms - run.started_at_ms)


# -- the overview -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upcoming:
    job_id: str
    at_ms: int
    due_ms: int
    partition: int
    dst: str | None


@dataclass(frozen=True, slots=True)
class JobFires:
    """One job's fires in the window: all counted, the first few listed."""

    job_id: str
    partition: int
    count: int
    fires: list[Upcoming]  # soonest first; the first is the job's next run


def upcoming(client: Client, records: list[JobRecord], now_ms: int, window_ms: int) -> tuple[list[JobFires], int, int]:
    """The jobs with fires due before now + window, the soonest first, at
    most `MAX_UPCOMING`: each with its next run, and the fires after it
    (coming_fires) if it is among the soonest `MAX_PREVIEWED_JOBS`; and how
    many fires and jobs there are in all."""
    end = now_ms + window_ms
    soon = sorted(
        (r for r in records if r.state == "active" and r.next_run is not None and r.next_run.run_at_ms <= end),
        key=lambda r: (r.next_run.due_ms if r.next_run else 0, r.job.id),
    )
    jobs: list[JobFires] = []
    total = 0
    for n, rec in enumerate(soon):
        assert rec.next_run is not None
        schedule = rec.job.schedule
        first = rec.next_run
        dst = recurrence.dst_note(schedule, first.run_at_ms) if recurrence.is_recurring(schedule) else None
        fires = [Upcoming(rec.job.id, first.run_at_ms, first.due_ms, rec.partition, dst)]
        # Counted whole, whatever is listed: a job firing every 5 s fires
        # 720 times an hour, though 24 are listed.
        within = fires_within(rec, end) if recurrence.is_recurring(schedule) else 1
        if n >= MAX_UPCOMING:
            total += within
            continue
        if recurrence.is_recurring(schedule) and n < MAX_PREVIEWED_JOBS:
            # From the record in hand: no read of the job again.
            after = coming_fires(schedule, first.run_at_ms, MAX_FIRES_PER_JOB - 1, rec.jitter_ms)
            for fire in after:
                if fire.at_ms > end:
                    break
                fires.append(Upcoming(rec.job.id, fire.at_ms, fire.due_ms or fire.at_ms, rec.partition, fire.dst))
        # Never fewer than listed (the count stops at the window's end by
        # due time, the list by nominal time).
        jobs.append(JobFires(rec.job.id, rec.partition, max(within, len(fires)), fires))
        total += jobs[-1].count
    return jobs, total, len(soon)


def fires_within(rec: JobRecord, end_ms: int) -> int:
    """How many fires of a recurring job are due from its next run to ``end_ms``
    (estimated past ten thousand, as missed times are counted)."""
    assert rec.next_run is not None
    span = MissedRuns(rec.job.id, rec.next_run.run_at_ms, end_ms - rec.jitter_ms + 1, "")
    return count_missed(rec.job, span) if span.end_ms > span.first_ms else 0


def lag_sample(client: Client, records: list[JobRecord]) -> list[RunRecord]:
    """Recent runs of the store, bounded (see the module docstring)."""
    last = client.last_runs([r.job.id for r in records[:LAG_JOBS]])
    busiest = sorted(last.values(), key=lambda r: r.dispatched_at_ms or r.due_ms, reverse=True)[:LAG_RECENT_JOBS]
    seen: dict[tuple[str, int], RunRecord] = {(r.job_id, r.run_id): r for r in last.values()}
    for run in busiest:
        try:
            for old in client.history(run.job_id, LAG_HISTORY):
                seen.setdefault((old.job_id, old.run_id), old)
        except JobNotFound:
            continue
    return list(seen.values())


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest rank: the smallest value with at least q of the sample at or below it."""
    rank = max(1, -(-len(sorted_values) * q // 1))
    return sorted_values[int(rank) - 1]


def _bucket_label(i: int) -> str:
    if i == 0:
        return "early (< 0)"
    low, high = LAG_BOUNDS_MS[i - 1], LAG_BOUNDS_MS[i] if i < len(LAG_BOUNDS_MS) else None
    return f"≥ {span(low)}" if high is None else f"{span(low)} to {span(high)}"


def lag_part(runs: Iterable[RunRecord]) -> Part:
    lags = sorted(lag for lag in map(fire_lag_ms, runs) if lag is not None)
    counts = [0] * (len(LAG_BOUNDS_MS) + 1)
    for lag in lags:
        counts[bisect_right(LAG_BOUNDS_MS, lag) if lag >= 0 else 0] += 1
    # Bucket i holds lags in [bounds[i-1], bounds[i]); early ones sit in 0.
    most = max(counts) or 1
    rows, below = [], 0
    for i, in_bucket in enumerate(counts):
        below += in_bucket
        rows.append(
            [
                Cell(_bucket_label(i)),
                Cell(str(in_bucket), cls="num"),
                Cell(f"{100 * below / len(lags):.1f} %" if lags else "", cls="num"),
                Cell("", cls="barcell", bar=100 * in_bucket / most),
            ]
        )
    caption = (
        f"{count(len(lags), 'run')} sampled · p50 {span(percentile(lags, 0.5))} · p90 {span(percentile(lags, 0.9))}"
        f" · p99 {span(percentile(lags, 0.99))} · max {span(lags[-1])}"
        if lags
        else "no runs handed on yet"
    )
    return Part(("fire lag", "runs", "cumulative", ""), rows, "no runs", caption)


def overview(client: Client, window_min: int) -> Page:
    now = client.clock.now_ms()
    records = client.ls()
    jobs, total, job_count = upcoming(client, records, now, window_min * 60_000)
    # A row a job, its fires folded under their count: a job firing every
    # few seconds is one row, not the whole table.
    upcoming_part = Part(
        ("job", "fires", "next fire", "due (jittered)", "", "partition", "note"),
        [_upcoming_row(j, now) for j in jobs],
        f"no fires in the next {window_min} minutes",
        f"{count(total, 'fire')} of {count(job_count, 'job')} in the next {window_min} minutes"
        + (f" (the first {len(jobs)} jobs shown)" if job_count > len(jobs) else ""),
    )
    sample = lag_sample(client, records)
    recent = sorted(
        (r for r in sample if r.state != "scheduled"),
        key=lambda r: r.ended_at_ms or r.started_at_ms or r.dispatched_at_ms or r.due_ms,
        reverse=True,
    )[:RECENT_RUNS]
    recent_part = Part(
        ("job", "run at", "state", "attempt", "fire lag", "duration", "error"),
        [
            [
                Cell(r.job_id, href=job_href(r.job_id)),
                Cell(clock(r.run_at_ms)),
                _state(r.state),
                Cell(str(r.attempt), cls="num"),
                Cell(span(fire_lag_ms(r)), cls="num"),
                Cell(_duration(r), cls="num"),
                _error(r.error),
            ]
            for r in recent
        ],
        "no runs yet",
        f"the {len(recent)} latest of the {len(sample)} runs sampled",
    )
    jobs_part = Part(
        ("job", "state", "schedule", "next due", "partition"),
        [
            [
                Cell(r.job.id, href=job_href(r.job.id)),
                _state(r.state),
                Cell(_schedule(r)),
                Cell(clock(r.next_run.due_ms) if r.next_run else ""),
                Cell(str(r.partition), cls="num"),
            ]
            for r in records[:MAX_UPCOMING]
        ],
        "no jobs yet: add one with POST /jobs or `pysched add`",
        count(len(records), "job") + (f" (the first {MAX_UPCOMING} shown)" if len(records) > MAX_UPCOMING else ""),
    )
    parts = {"upcoming": upcoming_part, "lag": lag_part(sample), "recent": recent_part, "jobs": jobs_part}
    body = Html(
        tag("h1", "Overview")
        + tag(
            "form",
            tag(
                "label",
                "window, minutes ",
                tag("input", type="number", name="minutes", min=1, max=MAX_WINDOW_MIN, value=window_min),
            ),
            tag("button", "show", type="submit"),
            method="get",
            action="/",
            class_="inline",
        )
        # What has happened first, then what will: the fires to come are
        # the longest part, and would push the rest out of sight.
        + tag("h2", "Fire lag", tag("span", " (dispatched - due)", class_="muted"))
        + part_html("lag", parts["lag"])
        + tag("h2", "Recent runs")
        + part_html("recent", recent_part)
        + tag("h2", "Jobs")
        + part_html("jobs", jobs_part)
        + tag("h2", "Upcoming fires")
        + part_html("upcoming", upcoming_part)
    )
    return Page("Overview", body, parts)


def _upcoming_row(job: JobFires, now_ms: int) -> list[Cell]:
    first = job.fires[0]
    overdue = first.due_ms < now_ms
    return [
        Cell(job.job_id, href=job_href(job.job_id)),
        Cell(count(job.count, "fire"), details=_fire_lines(job, now_ms)),
        Cell(clock(first.at_ms)),
        Cell(clock(first.due_ms)),
        Cell(relative(first.due_ms, now_ms), cls="overdue" if overdue else "muted"),
        Cell(str(job.partition), cls="num"),
        Cell(first.dst or ("overdue" if overdue else "")),
    ]


def _fire_lines(job: JobFires, now_ms: int) -> tuple[str, ...]:
    """A job's fires listed: nominal time, due time, how soon, DST note."""
    lines = [
        f"{clock(f.at_ms)} · due {clock(f.due_ms)} · {relative(f.due_ms, now_ms)}" + (f" · {f.dst}" if f.dst else "")
        for f in job.fires
    ]
    if job.count > len(job.fires):
        lines.append(f"… and {job.count - len(job.fires)} more")
    return tuple(lines)


def _schedule(rec: JobRecord) -> str:
    s = rec.job.schedule
    if isinstance(s, OnceSchedule):
        return f"once at {clock(s.run_at_ms)}"
    return recurrence.describe(s, None if isinstance(s, CronSchedule) or s.start_ms is None else clock(s.start_ms))


# -- one job ------------------------------------------------------------------


def runs_part(runs: list[RunRecord]) -> Part:
    return Part(
        ("run at", "due", "state", "attempt", "fire lag", "duration", "worker", "error", "output"),
        [
            [
                Cell(clock(r.run_at_ms)),
                Cell(clock(r.due_ms)),
                _state(r.state),
                Cell(str(r.attempt), cls="num"),
                Cell(span(fire_lag_ms(r)), cls="num"),
                Cell(_duration(r), cls="num"),
                Cell(r.worker or ""),
                _error(r.error),
                _error(r.result),
            ]
            for r in runs
        ],
        "no runs yet",
        f"the last {len(runs)} runs" if len(runs) >= HISTORY_RUNS else count(len(runs), "run"),
    )


def _field_text(value: object) -> str:
    """A field of the job's JSON as that JSON says it (`critical false`),
    as `pysched show` does, not in Python's words (False)."""
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def job_page(client: Client, job_id: str) -> Page:
    """Raises JobNotFound."""
    rec = client.get(job_id)
    now = client.clock.now_ms()
    missed = client.missed([rec])[job_id]
    shown = job_json(rec)
    definition = tag(
        "table",
        tag(
            "tbody",
            *(
                tag("tr", tag("th", key), tag("td", tag("pre", json.dumps(value, indent=2, ensure_ascii=False))))
                if isinstance(value, dict | list)
                else tag("tr", tag("th", key), tag("td", _field_text(value)))
                for key, value in shown.items()
                if key != "id"
            ),
            tag("tr", tag("th", "missed"), tag("td", ", ".join(f"{k}: {v}" for k, v in missed.items()))),
        ),
        class_="definition",
    )
    if recurrence.is_recurring(rec.job.schedule) and rec.state == "active":
        preview = client.preview(job_id, count=PREVIEW_FIRES)
        fire_rows = [
            [
                Cell(clock(f.at_ms)),
                Cell(clock(f.due_ms)),
                Cell(relative(f.due_ms or f.at_ms, now), cls="muted"),
                Cell(f.dst or ""),
            ]
            for f in preview.fires
        ]
    elif rec.next_run is not None:
        n = rec.next_run
        fire_rows = [
            [Cell(clock(n.run_at_ms)), Cell(clock(n.due_ms)), Cell(relative(n.due_ms, now), cls="muted"), Cell("")]
        ]
    else:
        fire_rows = []
    fires = Part(("nominal time", "due (jittered)", "", "DST"), fire_rows, f"no fires to come ({rec.state})")
    history = runs_part(client.history(job_id, HISTORY_RUNS))
    body = Html(
        tag("h1", rec.job.id, " ", tag("span", rec.state, class_=f"state state-{rec.state}"))
        + tag("h2", "Definition")
        + definition
        + tag("h2", "Next fires")
        + part_html("fires", fires)
        + tag("h2", "History")
        + part_html("runs", history)
    )
    return Page(rec.job.id, body, {"fires": fires, "runs": history})


# -- dead letters and partitions ------------------------------------------------


REDRIVE_PATH = "/ui/dead-letters/redrive"


def dead_letters_part(client: Client) -> Part:
    dead = client.dead_letters(DEAD_LETTERS)
    rows = []
    for run in dead:
        key = RunKey.of(run)
        last = run.failures[-1] if run.failures else None
        rows.append(
            [
                Cell(run.job_id, href=job_href(run.job_id)),
                Cell(clock(run.run_at_ms), title=str(key)),
                Cell(str(len(run.failures) or run.attempt), cls="num"),
                Cell(last.kind or "" if last else ""),
                Cell(clock(run.ended_at_ms or (last.ended_at_ms if last else None))),
                _error(run.error or (last.error if last else None)),
                Cell(
                    "",
                    post=Post(
                        REDRIVE_PATH,
                        {"job_id": run.job_id, "run_at_ms": str(run.run_at_ms), "group": str(run.attempt_group)},
                        "Redrive",
                    ),
                ),
            ]
        )
    return Part(
        ("job", "run at", "attempts", "failure", "failed at", "error", ""),
        rows,
        "no dead letters",
        f"{count(len(dead), 'run')} failed for good"
        + (f" (the newest {DEAD_LETTERS})" if len(dead) >= DEAD_LETTERS else ""),
    )


def dead_letters_page(client: Client, notice: str | None) -> Page:
    part = dead_letters_part(client)
    body = Html(
        tag("h1", "Dead letters")
        + (tag("p", notice, class_="notice", role="status") if notice else Html(""))
        + tag(
            "p",
            "Redrive runs a dead letter again now, as its next attempt, under the same idempotency key.",
            class_="muted",
        )
        + part_html("dead", part)
    )
    return Page("Dead letters", body, {"dead": part})


def partitions_part(leaders: list[PartitionLeader], standing_by: list[str], now_ms: int) -> Part:
    """A row a node, not a partition: the partitions it leads as ranges,
    their fences (each partition's folded under them where they differ);
    the nodes standing by; the partitions nobody leads."""
    rows = []
    for group in led_together(leaders):
        if group.holder is None:
            rows.append(
                [
                    Cell("none", cls="overdue"),
                    Cell("unled", cls="overdue"),
                    Cell(group.partition_ranges),
                    Cell(str(len(group.partitions)), cls="num"),
                    Cell(""),
                    Cell(""),
                ]
            )
            continue
        each = tuple(f"partition {p}: fence {f}" for p, f in zip(group.partitions, group.fences, strict=True))
        expires = group.expires_at_ms
        rows.append(
            [
                Cell(group.holder),
                Cell("leading"),
                Cell(group.partition_ranges),
                Cell(str(len(group.partitions)), cls="num"),
                Cell(group.fence_span, details=each if len(set(group.fences)) > 1 else None),
                Cell(f"{clock(expires)} ({relative(expires, now_ms)})" if expires else ""),
            ]
        )
    rows += [
        [Cell(holder), Cell("standing by", cls="muted"), Cell(""), Cell("0", cls="num"), Cell(""), Cell("")]
        for holder in standing_by
    ]
    return Part(
        ("node", "state", "partitions", "count", "fence", "lease expires"),
        rows,
        "no partitions",
        f"{sum(p.holder is not None for p in leaders)} of {len(leaders)} partitions led"
        + (f" · {count(len(standing_by), 'node')} standing by" if standing_by else ""),
    )


def partitions_page(client: Client) -> Page:
    part = partitions_part(client.leaders(), client.standing_by(), client.clock.now_ms())
    return Page("Partitions", Html(tag("h1", "Partitions") + part_html("partitions", part)), {"partitions": part})
