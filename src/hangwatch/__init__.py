"""hangwatch: tell a warming-up inference server from a wedged one, and say why.

The package is laid out as the pipeline it runs:

    collect/   one boundary module per external system (/proc, NVML, HTTP, the log pipe)
    model/     frozen, typed samples and the report they add up to
    analyse/   pure functions and small state machines over the model (phases, progress, causes)
    render/    terminal, live view and JSON, each depending only on the model
    supervise/ owning a launched process tree: launch, guard, clean up
    cli/       the commands on top
"""

__version__ = "0.1.0"
