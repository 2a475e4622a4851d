"""Which kernel sources recorded data came from, and whether they are today's.

A page that puts recorded data beside what today's code gives (an offline compile, a prediction, a re-plot next to
a live computation) compares like with like only when both come from the same kernel sources. A data file's JSON
sidecar names the code that measured it: ``code_commit`` (set where the measuring machine's ``.git`` lagged behind
its files) or else ``git_commit``; older sidecars name none, only their UTC ``timestamp_utc``.

:func:`compare_code` answers from the repository's history (``git``): the kernel sources (``kernels/`` by default)
at the recorded commit against the working tree, or, without a commit, whether any commit touched them after the
recorded time. :func:`code_note` turns the answer into the sentence a page prints (a :class:`CodeNote`, shown as a
marked paragraph in a notebook), so that no page compares data of other kernel sources without saying so.
"""

from __future__ import annotations

import html
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KERNEL_SOURCES", "CodeMatch", "CodeNote", "recorded_code", "compare_code", "code_note"]

KERNEL_SOURCES = ("kernels",)  # what "the same code" means for a measurement: the kernels' sources
REPO_ROOT = Path(__file__).resolve().parent.parent
NOTE_CLASS = "code-version"  # the HTML class of a note on a page (tests/test_report_pages.py looks for it)


def recorded_code(meta: dict) -> tuple[str | None, str | None]:
    """(commit, UTC date) a sidecar records for the code that measured it; either may be None."""
    commit = meta.get("code_commit") or meta.get("git_commit")
    stamp = meta.get("timestamp_utc") or meta.get("time_utc")
    return (str(commit) if commit else None), (str(stamp) if stamp else None)


def _git(*args: str, root: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True)
class CodeMatch:
    """The answer of :func:`compare_code`: ``same`` is True (identical kernel sources), False (they differ) or None
    (the history cannot tell: no git, or a commit it does not hold)."""

    same: bool | None
    commit: str | None  # the recorded commit, as the sidecar spells it
    date: str | None  # the recorded UTC date, YYYY-MM-DD
    changes: int | None  # commits that touched the kernel sources since then
    paths: tuple[str, ...]

    dirty: bool = False  # the sidecar names git's commit of a tree with uncommitted changes

    @property
    def recorded(self) -> str:
        """'commit 09afec4 (2026-11-23)', or 'an unrecorded commit of 2026-11-22'."""
        if self.commit and self.dirty:
            return f"commit {self.commit[:7]} with uncommitted changes" + (f" ({self.date})" if self.date else "")
        if self.commit:
            return f"commit {self.commit[:7]}" + (f" ({self.date})" if self.date else "")
        return f"an unrecorded commit of {self.date}" if self.date else "an unrecorded commit"


def compare_code(meta: dict, against: dict | None = None, paths=KERNEL_SOURCES, root: Path = REPO_ROOT) -> CodeMatch:
    """Were the data of sidecar ``meta`` recorded with the kernel sources of today's working tree (or, with
    ``against``, with those of another sidecar's data)?"""
    match = _compare(meta, against, tuple(paths), root)
    dirty = bool(meta.get("git_dirty")) and not meta.get("code_commit")
    return CodeMatch(match.same, match.commit, match.date, match.changes, match.paths, dirty=dirty)


def _compare(meta: dict, against: dict | None, paths: tuple[str, ...], root: Path) -> CodeMatch:
    commit, stamp = recorded_code(meta)
    date = stamp[:10] if stamp else None
    if _git("rev-parse", "--git-dir", root=root) is None:
        return CodeMatch(None, commit, date, None, paths)
    full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", root=root) if commit else None
    if against is not None:
        other_commit, other_stamp = recorded_code(against)
        other = (_git("rev-parse", "--verify", "--quiet", f"{other_commit}^{{commit}}", root=root)
                 if other_commit else None)
        if full and other:
            differ = _git("diff", "--name-only", full, other, "--", *paths, root=root)
            count = _git("rev-list", "--count", f"{full}...{other}", "--", *paths, root=root)
            return CodeMatch(None if differ is None else differ == "", commit, date,
                             int(count) if count else None, paths)
        if not commit and stamp and other:  # recorded before ``against``'s commit: did the sources change between?
            count = _git("rev-list", "--count", f"--since={stamp}", other, "--", *paths, root=root)
            if count is not None:
                return CodeMatch(int(count) == 0, commit, date, int(count), paths)
        return CodeMatch(None, commit, date, None, paths)
    if full:
        differ = _git("diff", "--name-only", full, "--", *paths, root=root)  # the working tree against the commit
        count = _git("rev-list", "--count", f"{full}..HEAD", "--", *paths, root=root)
        return CodeMatch(None if differ is None else differ == "", commit, date, int(count) if count else None, paths)
    if commit or not stamp:  # a commit this history does not hold, or no clue at all
        return CodeMatch(None, commit, date, None, paths)
    count = _git("rev-list", "--count", f"--since={stamp}", "HEAD", "--", *paths, root=root)
    if count is None:
        return CodeMatch(None, commit, date, None, paths)
    return CodeMatch(int(count) == 0, commit, date, int(count), paths)


class CodeNote(str):
    """The sentence of :func:`code_note`; in a notebook it shows as a marked paragraph."""

    same: bool | None

    def _repr_html_(self) -> str:
        return f'<p class="{NOTE_CLASS} report-note">{html.escape(str(self))}</p>'

    def _repr_markdown_(self) -> str:  # JupyterLab prefers HTML; this is for renderers without it
        return str(self)


def code_note(recorded: str, meta: dict, current: str = "today's kernels", against: dict | None = None,
              against_what: str = "", paths=KERNEL_SOURCES, root: Path = REPO_ROOT) -> CodeNote:
    """One sentence for a page: were ``recorded`` (data of sidecar ``meta``) measured with the kernel sources
    (``paths``) of ``current`` (today's, or with ``against``/``against_what``, another recording's)?"""
    match = compare_code(meta, against=against, paths=paths, root=root)
    where = "/".join(f"{p}/" for p in match.paths)
    other = against_what if against is not None else current
    if against is not None:
        other += f" ({compare_code(against, paths=paths, root=root).recorded})"
    if match.same:
        text = f"Same kernel sources: {recorded} ({match.recorded}) and {other} come from identical {where}."
    elif match.same is False:
        since = (f"; {match.changes} commit{'s' if match.changes != 1 else ''} changed {where} since"
                 if match.changes else "")
        text = (f"Other kernel sources: {recorded} were recorded with {match.recorded}, {other} come from "
                f"different {where}{since}. Where they disagree, the code changed; they are not expected to match.")
    else:
        text = (f"Kernel sources unknown: {recorded} were recorded with {match.recorded}, which this checkout's "
                f"history cannot compare with {other}; read any agreement or difference with that in mind.")
    note = CodeNote(text)
    note.same = match.same
    return note
