"""Which kernel sources recorded data came from, and whether they are today's.

A page that puts recorded data beside what today's code gives (an offline compile, a prediction, a re-plot next to
a live computation) compares like with like only when both come from the same kernel sources. A data file's JSON
sidecar names the code that measured it: ``code_commit`` (set where the measuring machine's ``.git`` lagged behind
its files) or else ``git_commit``; older sidecars name none, only their UTC ``timestamp_utc``.

:func:`compare_code` answers from the repository's history (``git``): the kernel sources (``kernels/`` by default)
at the recorded commit against the working tree, or, without a commit, whether any commit touched them after the
recorded time. :func:`code_note` turns the answer into the sentence a page prints (a :class:`CodeNote`, shown as a
marked paragraph in a notebook), so that no page compares data of other kernel sources without saying so.

A sidecar that also records ``kernel_sources`` (:func:`perfutils.data.metadata.sources_digest`, written since
2026-11-29) is compared by that digest, the kernels' files themselves, whatever its commit says; its commit is then
named by the history's commit whose kernels hash the same, where one does.

A data file written over several processes (``vocab_sweep.csv``: stages measured again over days) names each
process in its sidecar's ``sessions``; :func:`row_sessions` finds the process that recorded each row,
:func:`row_commits` its code, and :func:`rows_code_note` says, row by row, which recorded rows come from today's
kernel sources and which from other ones; :func:`where_rows_ran` says, provider by provider, in which processes and on
which GPUs the rows were timed (a ratio of two providers is a same-process one only where they shared a process).
"""

from __future__ import annotations

import functools
import html
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .data.metadata import KERNEL_SOURCES, TWO_GPU_FILES, git_sources_digest, git_sources_digests, sources_digest

__all__ = ["KERNEL_SOURCES", "CodeMatch", "CodeNote", "CodeNotes", "recorded_code", "compare_code", "code_note",
           "code_notes", "sessions", "row_sessions", "row_commits", "row_kernel_sources", "rows_sources",
           "rows_code_note", "shared_runs", "source_match", "where_rows_ran", "one_gpu_data", "one_gpu_sources",
           "TWO_GPU_STUDIES"]

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTE_CLASS = "code-version"  # the HTML class of a note on a page (tests/test_report_pages.py looks for it)
# Studies that run the vocabulary split over GPUs: their data is compared on every file of kernels/; the data of any
# other known study on the kernels less metadata.TWO_GPU_FILES, which one GPU never runs (a change to the split alone
# leaves one-GPU data of today's kernels).
TWO_GPU_STUDIES = frozenset({"tensor_parallel", "nvlink", "exchange_steps"})
ONE_GPU_ASIDE = "its vocab-parallel files aside, which one GPU never runs"  # said where leaving them out decided


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
    excluded: tuple[str, ...] = ()  # files left out of the comparison (metadata.TWO_GPU_FILES for one-GPU data)

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
    ``against``, with those of another sidecar's data)? One-GPU data (:func:`one_gpu_data`) are compared on the
    kernels less their vocab-parallel files; ``excluded`` names those files where leaving them out decided it."""
    paths = tuple(paths)
    dirty = bool(meta.get("git_dirty")) and not meta.get("code_commit")
    exclude = TWO_GPU_FILES if paths == KERNEL_SOURCES and one_gpu_data(meta) else ()
    digest = meta.get("kernel_sources")
    # The kernels' own files decide where the sidecar recorded them: the working tree's (or the other sidecar's),
    # whatever the commits say; git's history then only names the commit that holds them.
    other = None
    if digest and paths == KERNEL_SOURCES:
        other = sources_digest(paths, root) if against is None else against.get("kernel_sources")
    found = commit_with_sources(digest, root) if other is not None else None
    if found is not None:
        _, stamp = recorded_code(meta)
        same, aside = digest == other, ()
        if exclude and not same:  # the same kernels for one GPU where only the vocab-parallel files differ
            mine, theirs = one_gpu_sources(digest, root), one_gpu_sources(other, root)
            if mine is not None and theirs is not None:
                same, aside = mine == theirs, exclude
        return CodeMatch(same, found, stamp[:10] if stamp else None,
                         _count_since(found, against, _pathspecs(paths, aside), root), paths, excluded=aside)
    match = _compare(meta, against, paths, root)
    if exclude and other is None and match.same is False:  # perhaps only the vocab-parallel files differ
        narrowed = _compare(meta, against, _pathspecs(paths, exclude), root)
        if narrowed.same:
            return CodeMatch(True, match.commit, match.date, narrowed.changes, paths, dirty=dirty, excluded=exclude)
    same = match.same if other is None else digest == other
    return CodeMatch(same, match.commit, match.date, match.changes, paths, dirty=dirty)


def one_gpu_data(meta: dict) -> bool:
    """Whether a sidecar (or one of its sessions) is of a known study that runs on one GPU (not TWO_GPU_STUDIES)."""
    study = meta.get("study") or (meta.get("parameters") or {}).get("study")
    return bool(study) and study not in TWO_GPU_STUDIES


def _pathspecs(paths: tuple, exclude) -> tuple:
    """``paths`` with git's exclusion pathspecs for ``exclude``."""
    return (*paths, *(f":(exclude){pattern}" for pattern in exclude))


@functools.lru_cache(maxsize=4)
def _one_gpu_digests(root: Path) -> dict:
    """{kernel-sources digest: the digest of the same files less TWO_GPU_FILES} over every commit of this history
    that touched the kernels, and the working tree."""
    table = {sources_digest(KERNEL_SOURCES, root): sources_digest(KERNEL_SOURCES, root, TWO_GPU_FILES)}
    for commit in (_git("rev-list", "HEAD", "--", *KERNEL_SOURCES, root=root) or "").split():
        digests = git_sources_digests(commit, KERNEL_SOURCES, root, ((), TWO_GPU_FILES))
        if digests is not None:
            table.setdefault(digests[0], digests[1])
    return table


def one_gpu_sources(digest: str | None, root: Path = REPO_ROOT) -> str | None:
    """The digest of the one-GPU kernels (less metadata.TWO_GPU_FILES) of the kernels whose digest is ``digest``
    (:func:`perfutils.data.metadata.sources_digest`): from the working tree or this history's commits; None where
    neither holds those kernels."""
    return None if not digest else _one_gpu_digests(root).get(str(digest))


@functools.lru_cache(maxsize=64)
def commit_with_sources(digest: str, root: Path = REPO_ROOT) -> str | None:
    """The newest commit of this history whose kernel sources hash to ``digest`` (None: none does)."""
    commits = _git("rev-list", "HEAD", "--", *KERNEL_SOURCES, root=root)
    for commit in (commits or "").split():
        if git_sources_digest(commit, KERNEL_SOURCES, root) == digest:
            return commit[:7]
    return None


def _count_since(commit: str, against: dict | None, paths: tuple[str, ...], root: Path) -> int | None:
    """Commits that touched ``paths`` after ``commit``, up to HEAD (None with ``against``: not counted)."""
    if against is not None:
        return None
    count = _git("rev-list", "--count", f"{commit}..HEAD", "--", *paths, root=root)
    return int(count) if count else None


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


def _where(paths, excluded=()) -> str:
    """'kernels/' for a folder, 'perfutils/lab_kernels/teaching/softmax.py' for a file, joined with ', '; with
    ``excluded``, the files left out said."""
    where = ", ".join(p if Path(p).suffix else f"{p.rstrip('/')}/" for p in paths)
    return f"{where} ({ONE_GPU_ASIDE})" if excluded else where


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
    where = _where(match.paths, match.excluded)
    other = against_what if against is not None else current
    if against is not None:
        other += f" ({compare_code(against, paths=paths, root=root).recorded})"
    if match.same:
        text = f"Same kernel sources: {recorded} ({match.recorded}) and {other} come from identical {where}."
    elif match.same is False:
        when = " between the two" if against is not None else " since"
        since = (f"; {match.changes} commit{'s' if match.changes != 1 else ''} changed {where}{when}"
                 if match.changes else "")
        text = (f"Other kernel sources: {recorded} were recorded with {match.recorded}, {other} come from "
                f"different {where}{since}. Where they disagree, the code changed; they are not expected to match.")
    else:
        text = (f"Kernel sources unknown: {recorded} were recorded with {match.recorded}, which this checkout's "
                f"history cannot compare with {other}; read any agreement or difference with that in mind.")
    note = CodeNote(text)
    note.same = match.same
    return note


class CodeNotes(CodeNote):
    """The merged note of :func:`code_notes`: a sentence and one line per recorded code, in one marked block."""

    lines: list

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines)
        head = html.escape(str(self).split("\n", 1)[0])
        return f'<div class="{NOTE_CLASS} report-note"><p>{head}</p><ul>{items}</ul></div>'

    def _repr_markdown_(self) -> str:
        return str(self)


def code_notes(files: dict, current: str = "today's kernels", paths=KERNEL_SOURCES,
               root: Path = REPO_ROOT) -> CodeNotes:
    """One note for a page that reads several data files (``{file name: sidecar}``), instead of one
    :func:`code_note` each: the files grouped by the code that recorded them, one line per group."""
    groups: dict = {}
    for name, meta in files.items():
        match = compare_code(meta, paths=paths, root=root)
        groups.setdefault((match.date or "", match.recorded, match.same, match.changes, match.excluded),
                          []).append(name)
    lines = []
    for (_, recorded, same, changes, excluded), names in sorted(groups.items()):  # oldest first
        where = _where(tuple(paths), excluded)
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        if same is False:
            how = f"{changes} commit{'s' if changes != 1 else ''} changed {where} since" if changes else \
                f"other {where} than {current}"
        else:
            how = f"the same {where} as {current}" if same else "not comparable with this checkout's history"
        lines.append(f"{listed}: {recorded}; {how}")
    sames = {key[2] for key in groups}
    where = _where(tuple(paths), next((key[4] for key in groups if key[4]), ()))
    if sames == {True}:
        head = f"Same kernel sources: every data file below and {current} come from identical {where}."
    else:
        head = (f"Kernel sources: the code that recorded each data file. Where it is not {current}, the code changed "
                "since; where the two disagree, they are not expected to match.")
    note = CodeNotes(head + "\n" + "\n".join(f"- {line}" for line in lines))
    note.same = True if sames == {True} else (False if False in sames else None)
    note.lines = lines
    return note


# ---- data written by several processes: which process (and code) recorded each row --------------------------------

def sessions(meta: dict) -> list[dict]:
    """The processes that wrote a data file: the sidecar itself (the first) and its ``sessions``, in that order."""
    return [meta, *(meta.get("sessions") or [])]


def _in_list(listed, value) -> bool:
    """Whether ``value`` is among a session parameter's list (a parameter not recorded, or not a list, allows any)."""
    if not listed or value is None or isinstance(listed, (str, int)):
        return True
    try:
        return int(value) in {int(item) for item in listed}
    except (TypeError, ValueError):
        return True


def _covers(session: dict, variant, tokens, vocab=None, dtype=None) -> bool:
    """Whether ``session``'s parameters allow a row of ``variant`` at ``tokens`` × ``vocab`` in ``dtype`` (unknown
    parameters allow any). The vocabularies and dtype tell apart processes that ran side by side on several GPUs,
    each over its own part of the grid."""
    parameters = session.get("parameters") or {}
    cases = parameters.get("cases")
    if cases and variant is not None and str(variant) not in {str(c[0] if isinstance(c, (list, tuple)) else c)
                                                             for c in cases}:
        return False
    if dtype is not None and isinstance(parameters.get("dtype"), str) and parameters["dtype"] != str(dtype):
        return False
    return _in_list(parameters.get("tokens"), tokens) and _in_list(parameters.get("vocab"), vocab)


def row_sessions(df, meta: dict):
    """For each row of ``df``, the index into :func:`sessions` of the process that recorded it: the latest that
    started at or before the row's ``timestamp_utc`` and whose parameters cover the row's variant, token count,
    vocabulary and dtype; -1 where none does (or the row has no time). A pandas Series aligned with ``df``."""
    import pandas as pd

    starts = [(str(s.get("timestamp_utc") or s.get("time_utc") or ""), i) for i, s in enumerate(sessions(meta))]
    starts = sorted((t, i) for t, i in starts if t)
    found = []
    stamps = df["timestamp_utc"] if "timestamp_utc" in df else pd.Series([None] * len(df), index=df.index)
    variants = df["variant"] if "variant" in df else pd.Series([None] * len(df), index=df.index)
    tokens = df["tokens"] if "tokens" in df else pd.Series([None] * len(df), index=df.index)
    vocabs = df["vocab"] if "vocab" in df else pd.Series([None] * len(df), index=df.index)
    dtypes = df["dtype"] if "dtype" in df else pd.Series([None] * len(df), index=df.index)
    all_sessions = sessions(meta)
    for stamp, variant, count, vocab, dtype in zip(stamps, variants, tokens, vocabs, dtypes):
        index = -1
        if isinstance(stamp, str) and stamp:
            for start, i in reversed(starts):
                if start <= stamp and _covers(all_sessions[i], variant, count, vocab, dtype):
                    index = i
                    break
        found.append(index)
    return pd.Series(found, index=df.index, name="session", dtype=int)


def row_commits(df, meta: dict):
    """For each row of ``df``, the commit of the code that recorded it (its session's ``code_commit`` or
    ``git_commit``, short), None where unknown. A pandas Series aligned with ``df``."""
    import pandas as pd

    all_sessions = sessions(meta)
    commits = []
    for index in row_sessions(df, meta):
        commit = recorded_code(all_sessions[index])[0] if index >= 0 else None
        commits.append(commit[:7] if commit else None)
    return pd.Series(commits, index=df.index, name="code_commit", dtype=object)


def session_sources(session: dict, root: Path = REPO_ROOT) -> str | None:
    """A digest of the kernel sources one process ran (:func:`perfutils.data.metadata.sources_digest`): the sidecar's
    own ``kernel_sources`` where it recorded one, else its commit's from git's history (``code_commit``, or a
    ``git_commit`` of a clean tree); None where neither says."""
    if session.get("kernel_sources"):
        return str(session["kernel_sources"])
    commit = session.get("code_commit") or (None if session.get("git_dirty") else session.get("git_commit"))
    return _commit_sources(str(commit), root) if commit else None


@functools.lru_cache(maxsize=256)
def _commit_sources(commit: str, root: Path) -> str | None:
    return git_sources_digest(commit, KERNEL_SOURCES, root)


def row_kernel_sources(df, folder: Path, root: Path = REPO_ROOT):
    """For each row of ``df`` (with ``study``, ``variant``, ``tokens`` and ``timestamp_utc`` columns: a model check's
    frame, say), the digest of the kernel sources its process ran (:func:`session_sources`, through its study's sidecar
    in ``folder``), None where unknown: rows of equal digests were measured with identical kernels. A pandas Series
    aligned with ``df``."""
    import pandas as pd

    from .data.records import load_metadata

    out = pd.Series([None] * len(df), index=df.index, dtype=object)
    for study, part in df.groupby("study"):
        path = Path(folder) / f"{study}.csv"
        if path.is_file():
            out[part.index] = rows_sources(part, load_metadata(path), root)
    return out


def rows_sources(df, meta: dict, root: Path = REPO_ROOT):
    """For each row of ``df`` (``variant``, ``tokens``, ``timestamp_utc``) of the data file whose sidecar is ``meta``,
    the digest of the kernel sources its process ran (:func:`session_sources`), None where unknown."""
    import pandas as pd

    all_sessions = sessions(meta)
    return pd.Series([session_sources(all_sessions[i], root) if i >= 0 else None for i in row_sessions(df, meta)],
                     index=df.index, dtype=object)


def source_match(a, b, one_gpu: bool = True, root: Path = REPO_ROOT):
    """Over two aligned Series of kernel-source digests (:func:`rows_sources`): (same, different, unknown), three
    boolean Series: both known and equal, both known and not, either unknown. ``one_gpu``: rows measured on one GPU,
    whose kernels count as the same where only their vocab-parallel files differ (:func:`one_gpu_sources`)."""
    known = a.notna() & b.notna()
    same = known & (a == b)
    if one_gpu and (known & ~same).any():
        def narrowed(series):
            return series.map(lambda digest: one_gpu_sources(digest, root) or f"whole {digest}")
        same = same | (known & (narrowed(a) == narrowed(b)))
    return same, known & ~same, ~known


def _provider_runs(df, meta: dict, by: str, index) -> dict:
    """Per value of ``by``: (its row mask, the sessions that recorded its rows, their GPUs' UUIDs, first 8
    characters, their processes); ``index``: :func:`row_sessions` of ``df``. A session names its process since
    2026-11-29 (``process``: one process may record several sessions); an older one counts as a process of its own."""
    all_sessions = sessions(meta)
    runs = {}
    for value in sorted(set(df[by])):
        rows = (df[by] == value).to_numpy()
        found = sorted({int(i) for i in index[rows] if i >= 0})
        gpus = {str(all_sessions[i]["gpu_uuid"])[:8] for i in found if all_sessions[i].get("gpu_uuid")}
        processes = {str(all_sessions[i].get("process") or f"session {i}") for i in found}
        runs[value] = (rows, found, gpus, processes)
    return runs


def shared_runs(df, meta: dict, by: str = "variant") -> str | None:
    """"timed in one process: a with b, ...; on one GPU: ..." for the values of ``by`` (providers) that shared a
    process or a GPU; None with fewer than two."""
    return _shared(_provider_runs(df, meta, by, row_sessions(df, meta)))


def _shared(runs: dict) -> str | None:
    names = list(runs)
    if len(names) < 2:
        return None

    def pairs(part: int) -> str:  # part 3: the processes, part 2: the GPUs
        found = [f"{a} with {b}" for i, a in enumerate(names) for b in names[i + 1:]
                 if set(runs[a][part]) & set(runs[b][part])]
        return ", ".join(found) or "no two of them"

    return f"timed in one process: {pairs(3)}; on one GPU: {pairs(2)}"


def where_rows_ran(df, meta: dict, by: str = "variant") -> list[str]:
    """One line per value of ``by`` (a provider): how many of ``df``'s rows, recorded on which days, in how many
    processes, on which GPUs (the sidecar sessions' ``gpu_uuid``, first 8 characters) and with which code; then
    :func:`shared_runs`. A comparison across processes or machines is then said to be one."""
    index = row_sessions(df, meta)
    all_sessions = sessions(meta)
    stamps = df["timestamp_utc"] if "timestamp_utc" in df else [None] * len(df)
    lines = []
    runs = _provider_runs(df, meta, by, index)
    for value, (rows, found, gpus, processes) in runs.items():
        commits = sorted({str(all_sessions[i].get("code_commit") or all_sessions[i].get("git_commit") or "?")[:7]
                          for i in found})
        days = _days([s for s, r in zip(stamps, rows) if r])
        unknown = int((index[rows] < 0).sum())
        lines.append(f"{value}: {int(rows.sum())} rows, {days or 'undated'}, {len(processes)} "
                     f"process{'es' if len(processes) != 1 else ''} on GPU {', '.join(sorted(gpus)) or '?'} "
                     f"(code {', '.join(commits) or '?'})" + (f"; {unknown} rows without a session" if unknown else ""))
    shared = _shared(runs)
    if shared:
        lines.append(f"{shared[0].upper()}{shared[1:]}.")
    return lines


def _days(stamps) -> str:
    days = sorted({str(s)[:10] for s in stamps if isinstance(s, str) and s})
    return "" if not days else days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"


def rows_code_note(recorded: str, df, meta: dict, current: str = "today's kernels", paths=KERNEL_SOURCES,
                   root: Path = REPO_ROOT) -> CodeNote:
    """One sentence for a page whose recorded rows (``df``, of sidecar ``meta``) came from several processes: how many
    of ``recorded`` come from the kernel sources (``paths``) of ``current`` and how many from other sources. Without
    sessions in the sidecar it is :func:`code_note`'s sentence."""
    if not meta.get("sessions") or len(df) == 0:
        return code_note(recorded, meta, current, paths=paths, root=root)
    all_sessions = sessions(meta)
    index = row_sessions(df, meta)
    verdicts: dict[int, CodeMatch] = {}
    for i in sorted(set(index)):
        session = all_sessions[i] if i >= 0 else {}
        verdicts[i] = compare_code({**session, "sessions": None}, paths=paths, root=root)
    same = index.map(lambda i: verdicts[i].same)
    stamps = df["timestamp_utc"] if "timestamp_utc" in df else [None] * len(df)
    where = _where(tuple(paths), next((v.excluded for v in verdicts.values() if v.excluded), ()))
    groups = {}
    for key, label in ((True, "same"), (False, "other"), (None, "unknown")):
        rows = same.map(lambda v: v is key)
        commits = sorted({verdicts[i].commit[:7] for i in index[rows] if verdicts[i].commit})
        groups[label] = (int(rows.sum()), commits, _days([s for s, r in zip(stamps, rows) if r]))

    def described(label: str) -> str:  # "(commit a362daa, 2026-11-27)"
        _, commits, days = groups[label]
        what = (f"commit {commits[0]}" if len(commits) == 1 else f"{len(commits)} commits" if commits
                else "unrecorded commits")
        return f"({what}{', ' + days if days else ''})"

    parts = [f"{groups[label][0]} {described(label)}{' were measured' if not i else ''} {how}"
             for i, (label, how) in enumerate(
                 (label, how) for label, how in (("same", f"with the same {where} as {current}"),
                                                 ("other", f"with different {where}"),
                                                 ("unknown", "with code this checkout's history cannot compare"))
                 if groups[label][0])]
    if groups["same"][0] == len(df):
        text = f"Same kernel sources: all {len(df)} {recorded} and {current} come from identical {where}."
    elif groups["other"][0] == len(df):
        what = described("other")[1:-1]  # "commit d3d1459, 2026-11-22"
        text = (f"Other kernel sources: all {len(df)} {recorded} were recorded with {what}, {current} come from "
                f"different {where}. Where they disagree, the code changed; they are not expected to match.")
    else:
        listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        text = (f"Kernel sources by row: of the {len(df)} {recorded}, {listed}. Where rows of other sources "
                f"disagree with {current}, the code changed; they are not expected to match.")
    note = CodeNote(text)
    note.same = True if groups["same"][0] == len(df) else False if groups["other"][0] else None
    return note
