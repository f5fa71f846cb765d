"""The one job script of every batch scheduler: its options, the cluster's setup lines, then one step per point.

Only the option lines (#SBATCH, #BSUB, #PBS) and the command that starts a step's ranks (srun, jsrun,
mpiexec) differ between schedulers; the rest, `launchers/templates/job.sh`, is shared.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from string import Template

from launchers.batch import Job, Scheduler

TEMPLATE = Path(__file__).with_name("templates") / "job.sh"
TIMER_SIGNAL = "USR1"  # what the script's own timer sends it where the scheduler sends no warning


def render(job: Job, scheduler: Scheduler) -> str:
    options = [*scheduler.directives(job), *job.cluster.job.directives]
    python = shlex.quote(job.python)
    steps = [
        f"run_point {index} {scheduler.stop_signal(step)} {shlex.quote(str(step.point_dir))} {shlex.quote(step.label)} "
        f"{step.threads} "
        f"{scheduler.launch_command(job, step)} {python} -m suite.worker {shlex.quote(str(step.point_dir))}"
        for index, step in enumerate(job.steps)
    ]
    points = ", ".join(step.label for step in job.steps)
    margin = job.cluster.job.stop_margin_s
    if scheduler.warning_signal:
        warning, warned_by, timer = scheduler.warning_signal, f"from {scheduler.name}", ""
    else:  # the scheduler warns nobody: a timer started with the script does, `margin` before the limit
        warning, warned_by = TIMER_SIGNAL, "from this script's own timer"
        timer = (f"{{ sleep {60 * job.cluster.job.time_limit_min - margin} && kill -{TIMER_SIGNAL} $$; }} "
                 "> /dev/null 2>&1 &\ntimer=$!\ntrap 'kill $timer 2>/dev/null' EXIT\n")
    return Template(TEMPLATE.read_text()).substitute(
        directives="\n".join(f"{scheduler.directive} {option}" for option in options),
        description=f"{scheduler.name} job {job.name}: {len(job.steps)} point(s) on cluster {job.cluster.name}: "
                    f"{points}",
        workdir=shlex.quote(str(job.workdir)),
        setup="\n".join(job.cluster.job.setup),
        exports="export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(job.env.items())),
        warning_signal=warning,
        warned_by=warned_by,
        stop_margin_s=margin,
        ending_signals=" ".join(scheduler.ending_signals),
        ending_names=" or ".join(f"SIG{name}" for name in scheduler.ending_signals),
        timer=timer,
        python=python,
        steps="\n".join(steps),
    )


def write(job: Job, scheduler: Scheduler) -> Path:
    job.script.parent.mkdir(parents=True, exist_ok=True)
    job.script.write_text(render(job, scheduler))
    job.script.chmod(0o755)
    return job.script
