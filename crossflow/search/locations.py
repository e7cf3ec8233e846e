"""Where a study keeps its things by default, how a URL is shown, and which source made it.

One home for the default locations (``./mlruns``), the password redactor used in every
message and log, and the git revision recorded with each launch and each MLflow run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

#: The directory (relative to the working directory) that holds studies and runs.
MLRUNS = "mlruns"


def is_url(location: str) -> bool:
    """Whether a storage location is a database URL (``scheme://``) rather than a path."""
    return "://" in location


def default_storage(name: str, root: str | Path | None = None) -> str:
    """The journal file of study ``name``: ``<root or ./mlruns>/optuna/<name>.journal``."""
    return str(Path(root or MLRUNS) / "optuna" / f"{name}.journal")


def default_tracking_uri(cwd: str | Path | None = None) -> str:
    """``sqlite:///<cwd>/mlruns/mlflow.db``, absolute (a later ``cd`` does not move it)."""
    root = Path(cwd or os.getcwd()).resolve() / MLRUNS
    return f"sqlite:///{root / 'mlflow.db'}"


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs).

    Text that is not a URL, or a URL without a password, comes back unchanged."""
    if not isinstance(url, str) or not is_url(url):
        return url
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed netloc (e.g. a bad port): hide everything before '@'
        head, sep, tail = url.partition("@")
        return f"{head.split('://', 1)[0]}://***@{tail}" if sep else url
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_userinfo(url: str, *, key: str) -> None:
    """A ConfigError unless the user and password of a URL are unambiguous: a raw ``@`` in
    a password makes database drivers read the rest of it as the host name (and print it
    in their errors), so it must be percent-encoded.  The URL is shown redacted."""
    if not isinstance(url, str) or not is_url(url):
        return
    from crossflow.errors import ConfigError

    netloc = url.split("://", 1)[1].split("/", 1)[0]
    if netloc.count("@") > 1:
        raise ConfigError("the URL's user or password holds a raw '@', which a database "
                          "driver would take for the start of the host name", key=key,
                          value=redact(url), allowed="the same URL with '@' in the "
                          "password written as %40 (and ':' as %3A, '/' as %2F)")


_URL = re.compile(r"[A-Za-z][\w+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """Every URL password in a free text (an error message, a logged parameter) hidden."""
    return _URL.sub(lambda m: redact(m.group(0)), text)


def git_revision() -> tuple[str, bool | None]:
    """(commit of the CrossFlow source or ``"unknown"``, whether it has local changes or
    None when unknown).

    Run from a checkout (or installed editable), the package's own folder is asked.
    Installed with ``pip install .`` the package lives in site-packages, which is no git
    tree, so the source is the one pip recorded in the distribution's ``direct_url.json``
    (:func:`revision_of_source`): a git install names its commit; a local folder is
    asked as it is now (it may have moved on since the install).  A wheel or archive from
    elsewhere: ``("unknown", None)``."""
    src = Path(__file__).resolve().parents[2]
    if (src / ".git").exists():
        return _git_state(src)
    recorded = installed_source()
    return revision_of_source(recorded) if recorded is not None else ("unknown", None)


def installed_source() -> dict | None:
    """The ``direct_url.json`` of the installed distribution that holds this package (what
    pip records of where it installed it from), or None (not installed by pip, or this
    package is not the one installed)."""
    import json
    from importlib import metadata

    try:
        dist = metadata.distribution("crossflow")
        text = dist.read_text("direct_url.json")
        here = Path(__file__).resolve()
        installed = Path(str(dist.locate_file("crossflow/search/locations.py"))).resolve()
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None
    if not text or installed != here:  # another copy of CrossFlow is the installed one
        return None
    try:
        recorded = json.loads(text)
    except ValueError:
        return None
    return recorded if isinstance(recorded, dict) else None


def revision_of_source(direct_url: dict) -> tuple[str, bool | None]:
    """(commit, local changes or None) of the source a ``direct_url.json`` names (PEP 610):
    ``vcs_info`` of a git install has the exact commit, with no local changes; a local
    folder (``file://`` with ``dir_info``) is asked with git; anything else is unknown."""
    vcs = direct_url.get("vcs_info")
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id")
        if vcs.get("vcs") == "git" and isinstance(commit, str) and commit:
            return commit, False
        return "unknown", None
    url = direct_url.get("url")
    if "dir_info" not in direct_url or not isinstance(url, str) or not url.startswith("file:"):
        return "unknown", None  # an archive or a wheel: no tree to ask
    from urllib.request import url2pathname

    folder = Path(url2pathname(urlsplit(url).path))
    return _git_state(folder) if folder.is_dir() else ("unknown", None)


def _git_state(src: Path) -> tuple[str, bool | None]:
    """(HEAD of the git tree at ``src`` or ``"unknown"``, whether tracked files changed)."""
    import subprocess  # (not at import: every command's parser imports this module)

    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    try:
        dirty = bool(subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return rev or "unknown", dirty


def git_label() -> str:
    """The revision as one string: the commit, ``-dirty`` with local changes."""
    rev, dirty = git_revision()
    return f"{rev}-dirty" if dirty else rev
