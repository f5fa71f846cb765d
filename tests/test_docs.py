"""The documentation, README.md and docs/*.md, against the repository it describes.

1. Links: every relative link resolves to a file of the repository, and its `#anchor` to a heading of that file, by
   GitHub's rule for heading ids (lowercase; every character that is not a letter, a digit, `-`, `_` or a space
   dropped; spaces to `-`; a repeated heading gets `-1`, `-2`, ...).
2. README.md has at most 300 lines.
3. Commands. Every fenced code block names its language, so that no command hides in a block of no kind: `sh`
   (`bash`, `shell`, `console`) for commands, `text` (or any other) for what is not one. Each line of a shell block
   is one command, after joining a line that ends in `\\` with the next and dropping a trailing comment (`#` after
   a space) and comment-only lines. Every such command, on every page, is covered in one of three ways:
   (a) `TESTED`: a pattern that matches it, mapped to the tests that run it (each named test must exist);
   (b) checked here, in the slow tier, when that is cheap: a driver command, `.venv/bin/python -m suite ...` or the
       `make sweep` / `make status` that the Makefile turns into one (`make -n` shows which), is composed and
       validated as the driver does it, launching nothing (`suite.sweep.plan.plan`, then a batch cluster's site rules
       as a dry run checks them): for a sweep file, the first point of each of its lines with the command's
       overrides (only its first line when an earlier command composed the file's lines); a command for a GPU
       machine (`ON_A_GPU`) with the overrides given there (its GPUs taken for CPUs); `make predict` and `make
       recommend` plan their points as those tools do; a `--help` command is run;
   (c) `NOT_HERE`: a pattern mapped to the reason it cannot run in a test (a path on a remote site).
   A command none of these covers fails the fast tier, naming it and its page. Besides, every shell-block `make`
   command goes through `make -n` (its target exists, its variables expand; slow tier), and every `make ...` shown
   anywhere, code spans included, must name Makefile targets and only variables the Makefile reads (fast tier).
   Placeholders such as `<account>` are replaced from `PLACEHOLDERS` before anything is checked.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_make
from suite.cli import resolve, take_config_dirs
from suite.paths import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
SHELL = ("sh", "bash", "shell", "console")

# What a placeholder of the docs stands for when a command is checked here.
PLACEHOLDERS = {
    "<account>": "acct", "<project>": "proj", "<bank>": "bank", "<partition>": "batch", "<sweep>": "smoke",
    "<wheelhouse>": "wheelhouse", "<user>": "user", "$(hostname)": "login1",
}

# (a) Commands that the tests run, or whose every part they run: pattern (re.match on the command) -> test node ids.
TESTED: dict[str, tuple[str, ...]] = {
    r"ls results/points/adhoc/\*/traces/": (
        "tests/test_profile.py::test_profiled_points_leave_a_trace_per_rank_and_measure_communication",),
    r"make mlflow-server HOST=0\.0\.0\.0": (
        "tests/test_tracking_server.py::test_make_mlflow_server_refuses_requests_without_its_credentials",
        "tests/test_tracking_server.py::test_the_server_answers_its_own_host_names_beyond_loopback_not_every_host"),
    r"make sweep SWEEP=layouts_3d": (
        "tests/test_layouts_3d.py::test_every_layout_of_the_sweep_trains_to_singles_losses",),
    r"make report SWEEP=": (
        "tests/test_predict_commands.py::test_bench_model_prints_its_scores",
        "tests/test_store_faults.py::test_make_report_of_an_unknown_sweep_names_the_known_ones_and_creates_nothing"),
    r"make calibrate( ARGS=|$)": (
        "tests/test_calibration.py::test_make_calibrate_records_a_bus_bandwidth_curve_that_rises",
        "tests/test_calibration.py::test_make_calibrate_measures_the_library_overhead_on_probe_networks"),
    r"make calibrate CLUSTER=\S+ ACCOUNT=\S+ NODES=": (
        "tests/test_calibration.py::test_a_batch_calibration_takes_every_gpu_of_its_nodes",
        "tests/test_calibration.py::test_make_calibrate_on_a_batch_cluster_writes_its_job_script"),
    r"make calibrate CLUSTER=\S+ ACCOUNT=\S+ DRY_RUN=1": (
        "tests/test_calibration.py::test_make_calibrate_on_a_batch_cluster_writes_its_job_script",),
    r"make calibrate CLUSTER=\S+ APPLY=1": (
        "tests/test_calibration.py::test_apply_copies_the_records_bandwidths_and_latencies_into_the_cluster_config",
        "tests/test_calibration.py::test_apply_adds_a_hardware_block_where_there_is_none"),
    r"make wheelhouse ": (
        "tests/test_wheelhouse.py::test_the_machines_stack_and_what_it_has_are_not_carried_but_nvml_is",
        "tests/test_compat.py::test_a_wheelhouse_for_power9_asks_for_ppc64le_wheels"),
    r"make test-gpu$": ("tests/test_gpu.py::test_every_point_finishes_on_cuda",
                        "tests/test_gpu.py::test_contract_metrics_and_cuda_event_phase_times",
                        "tests/test_gpu_sweeps.py::test_every_point_of_the_one_gpu_checks_plans"),
    r"make test-gpu-multi$": (
        "tests/test_gpu_multi.py::test_every_point_finishes_on_two_gpus",
        "tests/test_gpu_sweeps.py::test_every_point_of_the_multi_gpu_checks_plans_and_its_pipelines_send_megabytes"),
    r"make sweep SWEEP=gpu_single CLUSTER=h100": ("tests/test_gpu.py::test_every_point_finishes_on_cuda",),
    r"make (sweep|status) CLUSTER=slurm ": (
        "tests/test_slurm.py::test_sweep_runs_as_slurm_jobs_records_their_ids_and_resumes",
        "tests/test_jobscripts.py::test_slurm_script_and_packing_points_into_one_job"),
    r"make (sweep|status) CLUSTER=lassen ": (
        "tests/test_makefile.py::test_sweep_variables_combine",
        "tests/test_jobscripts.py::test_lassen_scripts_start_one_jsrun_resource_set_per_node_with_its_gpus"),
    r"make (sweep|status) CLUSTER=(polaris|sophia) ": (
        "tests/test_site_rules.py::test_polaris_scripts_ask_for_their_queue_whole_nodes_and_alcfs_nccl_network",
        "tests/test_site_rules.py::test_sophia_scripts_ask_for_gpus_or_whole_nodes_and_forward_the_rendezvous_to_every_rank",
        "tests/test_jobscripts.py::test_sophia_and_polaris_scripts_ask_qsub_for_nodes_and_start_ranks_with_mpiexec"),
    r"make predict ": ("tests/test_predict_commands.py::test_predict_prints_each_points_prediction",),
    r"make predict FORMAT=json ARGS=\"dataset=tokens network=gpt2_medium cluster=lassen": (
        "tests/test_datasheet_pricing.py::test_make_predict_answers_for_lassen_on_a_fresh_clone_with_nothing_"
        "calibrated",),
    r"make validate-published": (
        "tests/test_validate_published.py::test_validate_published_prices_each_record_in_its_units_and_keeps_the_"
        "rest_with_their_reason",),
    r"make recommend ": ("tests/test_predict_commands.py::test_recommend_ranks_the_strategies_of_a_cell",),
    r"make plan-pipedream ": (
        "tests/test_pipedream_plan.py::test_make_plan_pipedream_prints_the_chosen_configuration_and_every_stage_counts_"
        "best",),
    r"\.venv/bin/python -m suite .*profile\.steps=": (
        "tests/test_profile.py::test_profiled_points_leave_a_trace_per_rank_and_measure_communication",),
}

# (c) Commands that no test can run, and why.
NOT_HERE: dict[str, str] = {
    r"make test$": "the test suite itself (CI runs it: .ci/run)",
    r"make setup-offline ": "makes .venv over a machine's own python3 and torch from a wheelhouse: on the GPU machine "
                            "or a cluster's login node, not inside a checkout's tests (`make -n` checks its recipe)",
    r"cd /eagle/": "a directory on ALCF's file systems",
}

# Commands for a GPU machine: composed here with the GPUs taken for CPUs (the rest of the point is checked as written).
ON_A_GPU = {r"make sweep SWEEP=gpu_single CLUSTER=h100": ["cluster.device=cpu"]}

# (b) Commands this test checks itself, by their form.
DRIVER = re.compile(r"\.venv/bin/(python -m suite|suite)(\s|$)")
MAKE_DRIVER = re.compile(r"make (sweep|status)(\s|$)")
MAKE_TOOL = re.compile(r"make (predict|recommend)(\s|$)")
HELP = re.compile(r".*\s--help$")


@dataclass(frozen=True)
class Command:
    page: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}: {self.text}"


@dataclass(frozen=True)
class Block:
    page: str
    info: str
    lines: tuple[str, ...]


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def split_page(path: Path) -> tuple[list[str], list[Block]]:
    """The page's lines outside fenced blocks, and its fenced blocks."""
    prose, blocks, block, info = [], [], None, ""
    for line in path.read_text().splitlines():
        fence = re.match(r" {0,3}(```+|~~~+)\s*(\S*)", line)
        if block is None and fence:
            block, info = [], fence.group(2)
        elif block is not None and fence and not fence.group(2):
            blocks.append(Block(page_name(path), info, tuple(block)))
            block = None
        elif block is not None:
            block.append(line)
        else:
            prose.append(line)
    assert block is None, f"{page_name(path)}: a fenced block is not closed"
    return prose, blocks


def shell_commands(block: Block) -> list[Command]:
    joined, pending = [], ""
    for line in block.lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    commands = []
    for line in joined:
        text = re.sub(r"\s+#(\s.*)?$", "", line).strip()
        if text and not text.startswith("#"):
            commands.append(Command(block.page, " ".join(text.split())))
    return commands


def all_blocks() -> list[Block]:
    return [block for path in PAGES for block in split_page(path)[1]]


def all_commands() -> list[Command]:
    return [c for block in all_blocks() if block.info in SHELL for c in shell_commands(block)]


def substituted(command: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    left = re.findall(r"<[^<>\s]+>", command)
    assert not left, f"{command}: add {left} to PLACEHOLDERS"
    return command


def checked_here(command: str) -> str | None:
    """How this test checks a command itself (b), or None."""
    if HELP.match(command):
        return "help"
    if DRIVER.match(command):
        return "driver"
    if MAKE_DRIVER.match(command):
        return "make driver"
    if MAKE_TOOL.match(command):
        return "make tool"
    return None


def coverage(command: str) -> list[str]:
    found = [f"tests {', '.join(ids)}" for pattern, ids in TESTED.items() if re.match(pattern, command)]
    found += [f"not here: {why}" for pattern, why in NOT_HERE.items() if re.match(pattern, command)]
    how = checked_here(command)
    return found + ([f"checked here ({how})"] if how else [])


# -- 1. links ----------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in split_page(path)[0]:
        heading = re.match(r" {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = "\n".join(split_page(path)[0])
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def test_every_relative_link_resolves_to_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists() or not path.is_relative_to(REPO_ROOT):
                broken.append(f"{page_name(page)}: {target} (no such file)")
            elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                broken.append(f"{page_name(page)}: {target} (no heading #{anchor} in {page_name(path)})")
    assert not broken, "\n".join(broken)


def test_slugs_follow_githubs_rule():
    assert slug("The site's environment") == "the-sites-environment"
    assert slug("PBS at ALCF (Polaris, Sophia; ThetaGPU retired)") == "pbs-at-alcf-polaris-sophia-thetagpu-retired"
    assert slug("One GPU: `make test-gpu`") == "one-gpu-make-test-gpu"
    assert slug("FLOPs, MFU and calibration") == "flops-mfu-and-calibration"


# -- 2. the README's length --------------------------------------------------------------------------------------

def test_readme_is_at_most_300_lines():
    lines = len((REPO_ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


# -- 3. commands -------------------------------------------------------------------------------------------------

def test_every_fenced_block_names_its_language():
    unnamed = [f"{b.page}: ```{b.info} block starting {b.lines[:1]}" for b in all_blocks() if not b.info]
    assert not unnamed, "name the language of each block (sh for commands, text otherwise):\n" + "\n".join(unnamed)


def test_the_docs_show_commands():
    pages = {c.page for c in all_commands()}
    assert "README.md" in pages and len(all_commands()) >= 20


def test_every_command_is_run_by_a_test_or_checked_here_or_says_why_not():
    uncovered = [str(c) for c in all_commands() if not coverage(c.text)]
    assert not uncovered, (
        "commands of the docs that no test runs: add each to TESTED (the tests that run it) or NOT_HERE (why none can) "
        "in tests/test_docs.py, or make it a form the docs test checks itself:\n" + "\n".join(uncovered))


def test_a_command_no_test_runs_is_not_covered():
    assert coverage("make sweep CLUSTER=lassen SWEEP=smoke ACCOUNT=bank")  # tested, and composed here
    assert not coverage("rm -rf results/")
    assert not coverage("make bench-overhead")  # make -n alone does not run it


def test_every_table_entry_matches_a_command_of_the_docs():
    commands = [c.text for c in all_commands()]
    stale = [p for p in [*TESTED, *NOT_HERE] if not any(re.match(p, c) for c in commands)]
    assert not stale, f"entries that match no command of the docs (remove them): {stale}"


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            names.add(node.name)
    return names


def test_every_named_test_exists():
    missing = []
    for ids in TESTED.values():
        for node_id in ids:
            file, _, name = node_id.partition("::")
            path = REPO_ROOT / file
            if not path.exists() or name.split("[")[0] not in defined_tests(path):
                missing.append(node_id)
    assert not missing, f"TESTED names tests that do not exist: {missing}"


def makefile() -> tuple[set[str], set[str]]:
    """The Makefile's targets, and the variables it reads."""
    text = (REPO_ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", text))
    variables |= set(re.findall(r"\(origin ([A-Z][A-Z0-9_]*)\)", text))
    variables |= set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[?:]?=", text, re.M))
    return targets, variables


def make_commands_anywhere() -> list[Command]:
    """Every `make ...` of the pages: shell-block commands, and code spans in the prose (tables included)."""
    found = [c for c in all_commands() if c.text.startswith("make ")]
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", "\n".join(split_page(page)[0])):
            if span.startswith("make "):
                found.append(Command(page_name(page), span))
    return found


def test_every_make_command_names_targets_and_variables_of_the_makefile():
    targets, variables = makefile()
    wrong = []
    for command in make_commands_anywhere():
        text = re.sub(r"<[^<>]+>", "x", command.text).replace("...", "")  # placeholders, elisions
        try:
            words = shlex.split(text)[1:]
        except ValueError:  # an unclosed quote in a shortened span (`ARGS="dataset=...`)
            words = text.split()[1:]
        named = [w for w in words if "=" not in w and not w.startswith("-") and w != "/"]
        unknown = [w for w in named if w not in targets] + [
            w.split("=")[0] for w in words if re.match(r"[A-Z][A-Z0-9_]*=", w) and w.split("=")[0] not in variables]
        if not named or unknown:
            wrong.append(f"{command} ({', '.join(unknown) or 'no target'})")
    assert not wrong, "make commands of the docs that the Makefile does not have:\n" + "\n".join(wrong)


@pytest.mark.slow  # make -n for each command (about 0.1 s each)
def test_every_make_command_of_a_shell_block_expands():
    failed = []
    for command in (c for c in all_commands() if c.text.startswith("make ")):
        made = run_make("-n", *shlex.split(substituted(command.text))[1:])
        if made.returncode != 0:
            failed.append(f"{command}: {made.stderr.strip()[-300:]}")
    assert not failed, "\n".join(failed)


def driver_argv(command: str) -> tuple[str, list[str]]:
    """The Python module a command runs and its arguments: as written, or as `make -n` shows the Makefile runs it."""
    words = shlex.split(substituted(command))
    if words[0] == "make":
        made = run_make("-n", *words[1:])
        assert made.returncode == 0, f"{command}: {made.stderr.strip()[-300:]}"
        recipe = made.stdout.replace("\\\n", " ").splitlines()  # a recipe line continued with a backslash is one
        runs = [shlex.split(line) for line in recipe if re.search(r"/bin/suite |/python -m suite", line)]
        assert len(runs) == 1, f"{command}: make -n ran {len(runs)} suite commands:\n{made.stdout}"
        words = runs[0]
    if words[0].endswith("/suite"):  # the `suite` command: the module its subcommand runs
        module, argv = resolve(take_config_dirs(words[1:]))
        return module.removesuffix(".__main__"), argv
    return words[2], words[3:]  # .venv/bin/python -m <module> ...


def compose_driver(argv: list[str], sweeps_seen: set[str]) -> int:
    """Plan what `python -m suite <argv>` would run, as the driver plans it, launching nothing: for a sweep file the
    first point of each of its lines, or, for a sweep file an earlier command composed so, of its first line only
    (the command's own overrides are what is left to check). Returns the number of points planned."""
    from suite.__main__ import parse_args
    from suite.sweep.jobs import check_submittable
    from suite.sweep.plan import plan
    from suite.sweep.sweep_files import expand, repeat_overrides, sweep_file, sweep_lines

    args = parse_args(argv)
    invalid = None
    if args.sweep:
        lines = sweep_lines(args.sweep, args.repeats)
        jobs = [expand(line + args.overrides, multirun=True)[0] for line in
                (lines[:1] if args.sweep in sweeps_seen else lines)]
        sweeps_seen.add(args.sweep)
        invalid = [] if sweep_file(args.sweep).get("invalid_points") == "record" else None
    else:
        repeats = args.repeats or 1
        jobs = expand(repeat_overrides(repeats) + args.overrides, args.multirun or repeats > 1)
    points = plan(jobs, experiment=args.sweep, invalid=invalid)
    assert points, f"none of the points can run: {[p.error for p in invalid or []][:3]}"
    check_submittable(points, dry_run=True)
    return len(points)


def compose_tool(module: str, argv: list[str]) -> int:
    from suite.sweep.plan import plan
    from suite.tools.predict import NOTHING_SUBMITTED, parse_args, plan_points
    from suite.tools.recommend import worker_counts

    args = parse_args(argv, module)
    if module == "suite.tools.predict":
        points = plan_points(args.overrides, invalid=[])
    else:  # a recommendation's cell, as one data-parallel point per worker count
        rest, counts = worker_counts(args.overrides)
        points = plan([[*rest, f"workers={n}", "strategy=ddp", *NOTHING_SUBMITTED] for n in counts],
                      experiment="recommend")
    assert points, "no point of it can run"
    return len(points)


@pytest.mark.slow  # composes a few dozen points (Hydra), imports torch
def test_every_driver_command_composes_and_validates(results):
    from suite.errors import ConfigError

    done, failed, sweeps_seen = set(), [], set()
    for command in all_commands():
        how = checked_here(command.text)
        if how not in ("driver", "make driver", "make tool"):
            continue
        try:
            module, argv = driver_argv(command.text)
            key = (module, tuple(a for a in argv if a not in ("--dry-run", "--status", "--force", "--retry-failed")))
            if key in done:
                continue
            done.add(key)
            argv += [o for pattern, more in ON_A_GPU.items() if re.match(pattern, command.text) for o in more]
            (compose_driver(argv, sweeps_seen) if module == "suite" else compose_tool(module, argv))
        except (ConfigError, AssertionError) as e:
            failed.append(f"{command}: {e}")
    assert not failed, "\n".join(failed)


@pytest.mark.slow  # starts the commands
def test_every_help_command_runs():
    for command in (c for c in all_commands() if checked_here(c.text) == "help"):
        words = shlex.split(substituted(command.text))
        done = subprocess.run([sys.executable, *words[1:]] if words[0].endswith("python") else words, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith("usage:"), f"{command}: {done.stderr[-500:]}"
