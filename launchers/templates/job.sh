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

# Stopping. SIG${warning_signal} ${warned_by}: the time limit is ${stop_margin_s} s away. The running point's
# ranks are stopped (their launcher gets the signal it hands on to them as a stop: srun SIGUSR2, others SIGTERM),
# save the epochs they completed, and the point ends as `timeout`. ${ending_names}
# means the scheduler is ending the job (a cancel, a preemption, the limit itself): the ranks are stopped too,
# and `make collect` records the point with the scheduler's verdict, which only the scheduler knows. Either
# way no further point starts. The ranks' launcher runs in the background and the script waits for it,
# so that a signal is handled at once (bash runs a trap only after the foreground command has ended).
stopping=0 ending=0 interrupted=0 launcher= launcher_stop=
stop() {  # <why>
    stopping=1 interrupted=1
    echo "suite: $$1 ($$(date))"
    if [[ -n $$launcher ]]; then kill -s "$$launcher_stop" "$$launcher" 2>/dev/null; fi
}
trap 'stop "the time limit is near: stopping"' ${warning_signal}
trap 'ending=1; stop "the scheduler is ending this job"' ${ending_signals}
${timer}
run_point() {  # <step> <signal that stops its launcher> <point dir> <label> <threads per rank> <command ...>
    local step=$$1 dir=$$3 label=$$4 threads=$$5 started code
    launcher_stop=$$2
    shift 5
    if (( stopping )); then
        echo "suite: $$label not started: the job is ending"
        return
    fi
    # Rank 0's host (the allocation's first) and a port of this step's own, for the ranks of any launcher
    read -r MASTER_ADDR MASTER_PORT < <(${python} -m suite.runtime.rendezvous "$$step")
    export MASTER_ADDR MASTER_PORT
    started=$$(date +%s)
    echo "suite: $$label starting ($$(date)), rendezvous at $$MASTER_ADDR:$$MASTER_PORT"
    OMP_NUM_THREADS=$$threads SUITE_POINT_LABEL="[$$label]" "$$@" > "$$dir/launcher.log" 2>&1 &
    launcher=$$!
    interrupted=1
    while (( interrupted )); do  # a trap interrupts `wait`: wait on until the launcher has ended
        interrupted=0
        wait "$$launcher"
        code=$$?
    done
    launcher=
    echo "suite: $$label ranks ended with exit code $$code ($$(date))"
    if (( ending )); then
        echo "suite: $$label is left to make collect"
        return
    fi
    ${python} -m suite.records.record "$$dir" --exit-code "$$code" --started "$$started"
    # 3: the ranks were stopped by SIGTERM that reached only them (e.g. a preemption): start nothing more
    if (( $$? == 3 )); then stopping=1; fi
}

${steps}
