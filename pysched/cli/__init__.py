"""The `pysched` command: a module per command group."""

from __future__ import annotations

import os
import signal
import sys

import typer

try:
    # Typer (0.29 on) carries its own click: the exceptions its commands raise.
    from typer._click import exceptions as click_errors
except ImportError:  # an earlier typer, on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from pysched.cli import api, breakers, catchup, deadletters, jobs, node, preview, slo, sync

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # Docstrings are paragraphs: their line breaks are not the terminal's.
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    help="pysched: a job scheduler for Python.",
)
jobs.register_commands(app)
node.register_commands(app)
preview.register_commands(app)
deadletters.register_commands(app)
breakers.register_commands(app)
catchup.register_commands(app)
sync.register_commands(app)
api.register_commands(app)
slo.register_commands(app)


def main() -> None:
    """Exit 0 when done, 2 on bad input, 3 for no such job (the commands say
    so themselves), 1 on anything unexpected: one line, and the traceback only
    with PYSCHED_DEBUG=1."""
    # A reader that goes away (`pysched ls | head`) ends the command quietly,
    # as it ends `cat`; `up` and `worker` keep Python's default, ignoring it.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        # Not standalone: typer would box a usage error in a panel under the
        # usage line; a refusal here is one line, as the commands' own are.
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        # The help is already printed; only its exit code is left.
        sys.exit(exc.exit_code)
    except click_errors.UsageError as exc:
        print(f"error: {usage_error(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click_errors.ClickException as exc:
        # Any other refusal typer raises (a file it cannot open): one line too.
        print(f"error: {_one_line(exc.format_message())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        if os.environ.get("PYSCHED_DEBUG") == "1":
            raise
        print(f"error: unexpected {type(exc).__name__}: {exc} (PYSCHED_DEBUG=1 shows where)", file=sys.stderr)
        sys.exit(1)
    # An Exit (--help, a refusal, Ctrl-C's 130) comes back as its code; a
    # command that returns comes back as None.
    sys.exit(code if isinstance(code, int) else 0)


def usage_error(exc: click_errors.UsageError) -> str:
    """A usage error in one line, led by the flag or argument at fault:
    '--limit: Input should be ...', 'no such option: --bogus'."""
    if isinstance(exc, click_errors.MissingParameter) and exc.param is not None:
        return f"missing {exc.param.param_type_name} {_param_name(exc)}"
    if isinstance(exc, click_errors.BadParameter) and exc.param is not None:
        return f"{_param_name(exc)}: {_one_line(exc.message)}"
    if isinstance(exc, click_errors.NoSuchOption):
        maybe = f"; did you mean {' or '.join(sorted(exc.possibilities))}?" if exc.possibilities else ""
        return f"no such option: {exc.option_name}{maybe}"
    if isinstance(exc, click_errors.BadOptionUsage) and exc.message.endswith("requires an argument."):
        return f"{exc.option_name}: requires a value"
    message = _one_line(exc.format_message()).rstrip(".")
    return message[:1].lower() + message[1:]


def _param_name(exc: click_errors.BadParameter) -> str:
    """The flag as typed (its first spelling), or an argument as --help
    shows it."""
    param = exc.param
    assert param is not None
    if param.param_type_name == "option" and param.opts:
        return str(param.opts[0])
    return param.display_name_raw


def _one_line(text: str) -> str:
    return " ".join(text.split())
