"""The `sparseditto` command line (also `python -m sparseditto`).

`app` parses the arguments and decides how the process ends (exit codes, Ctrl-C, closed pipes);
`commands` holds one thin handler per subcommand over the library; `views` renders tables and
reports for people (rich, never truncated); `story` tells the demo's run in ten lines.
"""
from sparseditto.cli.app import build_parser, main
from sparseditto.cli.commands import (check_output_path, check_positive, cmd_analyze, cmd_bench, cmd_demo,
                                      cmd_memory, cmd_run, cmd_targets)

__all__ = ["build_parser", "main", "check_output_path", "check_positive", "cmd_analyze", "cmd_bench", "cmd_demo",
           "cmd_memory", "cmd_run", "cmd_targets"]
