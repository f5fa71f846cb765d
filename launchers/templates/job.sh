#!/bin/bash
${directives}
#
# ${description}
# Written by the suite (`make sweep`). Each point's ranks start in `run_point`; they leave their results
# in the point's directory, and the point is then recorded in MLflow (or later by `make collect`).
set -u
cd ${workdir}
${setup}
${exports}

# SIGTERM to this script means the scheduler is ending the job (time limit, preemption, cancel). The
# ranks get it too and save the epochs they completed; no further point starts, and `make collect`
# records the point with the scheduler's verdict, which only the scheduler knows.
stopping=0
trap 'stopping=1; echo "suite: SIGTERM: the scheduler is ending this job"' TERM

run_point() {  # <point dir> <label> <threads per rank> <command that starts the ranks ...>
    local dir=$$1 label=$$2 threads=$$3 started code
    shift 3
    if (( stopping )); then
        echo "suite: $$label not started: the job is ending"
        return
    fi
    started=$$(date +%s)
    echo "suite: $$label starting ($$(date))"
    OMP_NUM_THREADS=$$threads SUITE_POINT_LABEL="[$$label]" "$$@" > "$$dir/launcher.log" 2>&1
    code=$$?
    echo "suite: $$label ranks ended with exit code $$code ($$(date))"
    if (( stopping )); then
        echo "suite: $$label is left to make collect"
        return
    fi
    ${python} -m suite.records.record "$$dir" --exit-code "$$code" --started "$$started"
    # 3: the ranks were stopped by SIGTERM (a time-limit warning or a preemption): start nothing more
    if (( $$? == 3 )); then stopping=1; fi
}

${steps}
