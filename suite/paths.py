"""Where the suite keeps its configs and results.

From a checkout (an editable install, `make setup`) both are the repository's: conf/ and results/, whatever the
working directory. From a wheel the configs are the package's data (suite/conf, which in the checkout links to
conf/) and results go to results/ under the working directory. $SUITE_RESULTS_DIR overrides either (e.g. a shared
filesystem on a cluster); $SUITE_CONFIG_DIR (`suite --config-dir`) adds a directory of site configs
(conf/cluster/<site>.yaml and the like, laid out as conf/ is) that Hydra searches after the suite's own.
"""

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE.parent  # the checkout; site-packages under a wheel
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "conf").is_dir()
CONF_DIR = REPO_ROOT / "conf" if IN_CHECKOUT else PACKAGE / "conf"
SITE_CONFIG_ENV = "SUITE_CONFIG_DIR"


def results_dir() -> Path:
    """results/ of the checkout (else of the working directory), or $SUITE_RESULTS_DIR."""
    default = REPO_ROOT / "results" if IN_CHECKOUT else Path.cwd() / "results"
    return Path(os.environ.get("SUITE_RESULTS_DIR", default))


def site_config_dirs() -> list[Path]:
    """The site config directories of $SUITE_CONFIG_DIR (os.pathsep-separated), searched after CONF_DIR."""
    return [Path(d).resolve() for d in os.environ.get(SITE_CONFIG_ENV, "").split(os.pathsep) if d]


def searchpath_overrides() -> list[str]:
    """Hydra's override that adds the site config directories to its search path (none without them); passed to
    compose beside a point's overrides, never part of them: they say where files are, not what runs."""
    site = [f"file://{d}" for d in site_config_dirs()]
    return [f"hydra.searchpath=[{','.join(site)}]"] if site else []


def config_file(relative: str) -> Path:
    """conf/<relative> (e.g. `cluster/lassen.yaml`), else the first site directory's; the conf/ path when neither
    has it (Hydra's order: the suite's own configs first)."""
    for directory in (CONF_DIR, *site_config_dirs()):
        if (directory / relative).exists():
            return directory / relative
    return CONF_DIR / relative


def config_names(group: str) -> list[str]:
    """The configs of a group (conf/<group>/*.yaml and the site directories'), by name."""
    names = {path.stem for directory in (CONF_DIR, *site_config_dirs()) for path in (directory / group).glob("*.yaml")}
    return sorted(names - {"cluster_schema"})


# A name becomes one directory or file under the results directory (points/<experiment>/, reports/<sweep>/,
# calibration/<cluster>.yaml): with room left in the file system's 255 bytes for the suffixes the suite adds.
NAME_MAX_BYTES = 200


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a directory of its own under the results directory (a separator or `..` would put it
    elsewhere), or None."""
    if not name or name in (".", ".."):
        return "is empty or a relative directory"
    if "/" in name or "\\" in name or "\0" in name:
        return "holds a path separator (it names one directory under the results directory)"
    if len(name.encode()) > NAME_MAX_BYTES:
        return f"is {len(name.encode())} bytes long, over the {NAME_MAX_BYTES} a name may have"
    return None
