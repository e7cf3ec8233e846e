"""Where a study keeps its things by default, how a URL is shown, and which source made it.

One home for the default locations (``./mlruns``), the password redactor used in every
message and log, and the git revision recorded with each launch and each MLflow run.
"""

from __future__ import annotations

import os
import re
import subprocess
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
    """(commit of the CrossFlow source tree or ``"unknown"``, whether it has local changes
    or None when unknown).  Installed from a wheel, there is no tree: ``("unknown", None)``."""
    src = Path(__file__).resolve().parents[2]
    if not (src / ".git").exists():
        return "unknown", None
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
