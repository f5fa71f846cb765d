"""The `suite` command, installed by the package: `suite [--config-dir DIR] [COMMAND] [ARGS]`.

Each command is one of the suite's tools; its own `--help` gives its options. Without a command, `suite ARGS` runs
points as `suite run ARGS` (`python -m suite ARGS` does the same).
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from dataclasses import fields

from suite.errors import ConfigError
from suite.paths import CONF_DIR, SITE_CONFIG_ENV, config_names, site_config_dirs

# command -> (module with main(argv) -> int, arguments put before the user's, what it does)
COMMANDS = {
    "run": ("suite.__main__", [], "run points: `suite run [-m] [--dry-run] [--cfg job] override ...`"),
    "sweep": ("suite.__main__", ["--sweep"], "run a sweep file's points: `suite sweep NAME [override ...]`"),
    "status": ("suite.__main__", ["--status", "--sweep"], "each point of a sweep and its state: `suite status NAME`"),
    "collect": ("suite.__main__", ["--collect"], "record batch jobs that ended unrecorded: `suite collect [--sweep "
                                                 "NAME]`"),
    "report": ("analysis.report", [], "an experiment's tables, figures and claims: `suite report EXPERIMENT`"),
    "predict": ("suite.tools.predict", [], "the performance model's price of points, nothing launched"),
    "recommend": ("suite.tools.recommend", [], "every strategy ranked for a workload and cluster"),
    "calibrate": ("suite.tools.calibrate", [], "measure a cluster's matmul peak, collectives and send/recv"),
    "ui": ("suite.tools.ui", [], "MLflow's UI on the store, opened on a sweep's runs"),
    "validate-published": ("suite.tools.validate_published", [], "the model against published GPU measurements"),
    "plan-pipedream": ("suite.tools.plan_pipedream", [], "PipeDream's planner: stages, layers and replicas"),
}
GROUPS = ("dataset", "network", "strategy", "cluster")


def help_text() -> str:
    from suite.config import PointConfig

    commands = "\n".join(f"  {name:<19}{what}" for name, (_, _, what) in COMMANDS.items())
    def wrapped(text: str) -> str:
        return textwrap.fill(text, 116, initial_indent="  ", subsequent_indent="    ")
    groups = "\n".join(wrapped(f"{group}: {', '.join(config_names(group))}") for group in GROUPS)
    keys = wrapped(", ".join(f.name for f in fields(PointConfig) if f.name not in GROUPS))
    sweeps = wrapped(", ".join(config_names("sweep")))
    return f"""usage: suite [--config-dir DIR] [COMMAND] [ARGS]

{__doc__.split(chr(10), 2)[2].strip()}

commands:
{commands}

config groups (override as group=option, e.g. `suite run dataset=digits strategy=ddp workers=2`):
{groups}
other keys of a point (key=value; nested ones as optimizer.name=adam):
{keys}
sweeps (`suite sweep NAME`):
{sweeps}

options:
  --config-dir DIR   also search DIR for configs laid out as conf/ is (a site's cluster/<name>.yaml, ...), after the
                     suite's own ({CONF_DIR}); the same as ${SITE_CONFIG_ENV}=DIR, which the ranks and jobs inherit
  -h, --help         this text; `suite COMMAND --help` gives a command's options
"""


def take_config_dirs(argv: list[str]) -> list[str]:
    """argv without its `--config-dir DIR` (or `--config-dir=DIR`) options; each DIR goes into $SUITE_CONFIG_DIR."""
    rest, dirs, args = [], [], iter(argv)
    for arg in args:
        if arg == "--config-dir":
            dirs.append(next(args, ""))
        elif arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    for directory in dirs:
        if not directory or not os.path.isdir(directory):
            print(f"error: --config-dir {directory!r} is not a directory", file=sys.stderr)
            raise SystemExit(2)
    if dirs:
        os.environ[SITE_CONFIG_ENV] = os.pathsep.join([os.path.abspath(d) for d in dirs] + [
            str(d) for d in site_config_dirs()])
    return rest


def resolve(argv: list[str]) -> tuple[str, list[str]]:
    """The module that runs `suite <argv>` (argv without --config-dir) and the arguments its main() gets."""
    first = argv[0]
    if first not in COMMANDS and "=" not in first and not first.startswith("-"):
        raise ConfigError(f"{first!r} is not a command (commands: {', '.join(COMMANDS)}) nor an override "
                          "(key=value); `suite --help` lists them")
    command, rest = (first, argv[1:]) if first in COMMANDS else ("run", argv)
    module, leading, _ = COMMANDS[command]
    return module, leading + rest


def main(argv: list[str] | None = None) -> int:
    argv = take_config_dirs(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0
    try:
        module, args = resolve(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # argparse names a parser without a prog after argv[0]: each command's usage line reads `suite predict ...`
    sys.argv[0] = "suite" if module == COMMANDS["run"][0] else f"suite {argv[0]}"
    return importlib.import_module(module).main(args)


if __name__ == "__main__":
    sys.exit(main())
