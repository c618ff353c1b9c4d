"""Errors a user can act on. Each carries the fix and the exit code; the CLI catches only the base."""

from __future__ import annotations

from hangwatch.model.vocabulary import USAGE_EXIT_CODE

PTRACE_HELP = (
    "hangwatch needs the same permission as a debugger to read another user's /proc/PID/io and stacks: "
    "run it as the user that owns the server, or as root; or allow it with "
    "`sudo sysctl kernel.yama.ptrace_scope=0`, or give hangwatch CAP_SYS_PTRACE "
    "(in a container: `--cap-add SYS_PTRACE`)."
)


class HangwatchError(Exception):
    """Base of every error hangwatch reports to the user instead of a traceback."""

    exit_code = USAGE_EXIT_CODE
    help_text = ""

    def __init__(self, message: str, help_text: str | None = None) -> None:
        super().__init__(message)
        if help_text is not None:
            self.help_text = help_text

    def describe(self) -> str:
        message = str(self)
        return f"{message}\n{self.help_text}" if self.help_text else message


class UsageError(HangwatchError):
    """The command line asks for something that cannot work."""


class CommandNotFound(HangwatchError):
    help_text = (
        "Check the command after `--`: give its full path, or activate the environment that provides it."
    )


class NoSuchProcess(HangwatchError):
    help_text = "Check the PID with `ps -ef`; give the PID of the server's main (launcher) process."


class NoTargets(HangwatchError):
    """A transport's discovery named no node to collect from (kubectl refused, no pod matched)."""

    exit_code = 1
