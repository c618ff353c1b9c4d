"""hangwatch: tell a warming-up inference server from a wedged one, and say why.

The package is laid out as the pipeline it runs:

    collect/   one boundary module per external system we read (/proc, NVML, HTTP, the log pipe)
    model/     frozen, typed samples and the report they add up to
    engines/   what each engine is known to do: phase lines, readiness, titles, metric names, toggles
    analyse/   pure functions and small state machines over the model (phases, progress, causes)
    render/    terminal, live view, JSON, HTML, Markdown, each depending only on the model
    supervise/ owning a launched process tree: launch, guard, watch, tear down
    run, attach, stacks, cleanup (modules), doctor/, bench/, isolate/, demo/ (packages): one per command
    cli/       the command line: parses each command's options and calls its module

docs/architecture.md has the map and the import rules.
"""

__version__ = "0.1.0"
