"""perfutils.provenance: which kernel sources recorded data came from, file by file and row by row (a throwaway git
repository with a kernels/ folder stands for the project's history)."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from perfutils import provenance
from perfutils.data.metadata import KERNEL_SOURCES, git_sources_digest


def git(root, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def new_repo(tmp_path):
    """An empty git repository with kernels/loss.py (not yet committed)."""
    root = tmp_path / "repo"
    (root / "kernels").mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    (root / "kernels" / "loss.py").write_text("A = 1\n")
    return root


@pytest.fixture()
def history(tmp_path):
    """A repository whose kernels/ changed once: (root, commit before the change, commit after it)."""
    root = new_repo(tmp_path)
    (root / "notes.md").write_text("x\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    old = git(root, "rev-parse", "HEAD")
    (root / "kernels" / "loss.py").write_text("A = 2\n")
    git(root, "commit", "-q", "-am", "kernels change")
    new = git(root, "rev-parse", "HEAD")
    (root / "notes.md").write_text("y\n")
    git(root, "commit", "-q", "-am", "notes only")
    return root, old, new


def sidecar() -> dict:
    """A sidecar of three processes: the file's first (old code), a peers' stage and a later stage (new code)."""
    return {"timestamp_utc": "2026-11-23T10:00:00Z", "code_commit": "OLD",
            "parameters": {"cases": [["public", None, None]], "tokens": [4096]},
            "sessions": [{"timestamp_utc": "2026-11-23T11:00:00Z", "code_commit": "OLD",
                          "parameters": {"cases": [["fast_llm", None, None]], "tokens": [4096]}},
                         {"timestamp_utc": "2026-11-27T09:00:00Z", "code_commit": "NEW",
                          "parameters": {"cases": [["public", None, None]], "tokens": [1024]}}]}


def rows() -> pd.DataFrame:
    return pd.DataFrame([
        dict(variant="public", tokens=4096, timestamp_utc="2026-11-23T10:05:00Z"),  # the first process
        dict(variant="public", tokens=4096, timestamp_utc="2026-11-27T09:05:00Z"),  # after the last start: not its
        dict(variant="fast_llm", tokens=4096, timestamp_utc="2026-11-23T11:01:00Z"),  # the peers' stage
        dict(variant="public", tokens=1024, timestamp_utc="2026-11-27T09:01:00Z"),  # the last stage
        dict(variant="public", tokens=1024, timestamp_utc=None),  # no time: no session
    ])


def with_commits(meta: dict, old: str, new: str) -> dict:
    text = repr(meta).replace("'OLD'", repr(old)).replace("'NEW'", repr(new))
    return eval(text)  # noqa: S307 (a literal built above)


def test_where_rows_ran_names_each_providers_processes_and_gpus():
    """Per provider: its rows, days, processes, GPUs and code; then which providers shared a process or a GPU."""
    meta = sidecar()
    meta["gpu_uuid"] = "aaaaaaaa-1111"
    meta["sessions"][0]["gpu_uuid"] = "aaaaaaaa-1111"  # the peers' stage: the first process's GPU
    meta["sessions"][1]["gpu_uuid"] = "bbbbbbbb-2222"
    lines = provenance.where_rows_ran(rows(), meta)
    assert lines[0] == "fast_llm: 1 rows, 2026-11-23, 1 process on GPU aaaaaaaa (code OLD)"
    assert lines[1] == ("public: 4 rows, 2026-11-23 to 2026-11-27, 2 processes on GPU aaaaaaaa, bbbbbbbb "
                        "(code NEW, OLD); 1 rows without a session")
    assert lines[2] == "Timed in one process: no two of them; on one GPU: fast_llm with public."


def test_sessions_of_one_process_count_as_one():
    """A process that recorded two stages (two sessions naming the same ``process``) is one process, and the providers
    of its two stages were timed in one process; sessions that name no process count one each, as before."""
    meta = sidecar()
    meta["process"] = "host:1:t"
    meta["sessions"][0]["process"] = "host:1:t"  # the peers' stage, in the first stage's process
    lines = provenance.where_rows_ran(rows(), meta)
    assert lines[0] == "fast_llm: 1 rows, 2026-11-23, 1 process on GPU ? (code OLD)"
    assert lines[1].startswith("public: 4 rows, 2026-11-23 to 2026-11-27, 2 processes on GPU ?")
    assert lines[2].startswith("Timed in one process: fast_llm with public;")
    from perfutils.data.metadata import collect_metadata, process_id

    assert collect_metadata()["process"] == process_id() == collect_metadata()["process"]


def test_row_kernel_sources_names_the_kernels_each_row_ran(tmp_path, history):
    """Through its study's sidecar: a session's recorded digest wins, else its commit's sources; a dirty tree's
    git_commit and a row without a session give None."""
    root, old, new = history
    meta = with_commits(sidecar(), old, new)
    meta["sessions"][0]["kernel_sources"] = "recorded-digest"
    meta["git_dirty"] = True
    meta["code_commit"] = None
    meta["git_commit"] = old
    (tmp_path / "vocab_sweep.csv").write_text("x\n")
    (tmp_path / "vocab_sweep.json").write_text(json.dumps(meta))
    frame = rows().assign(study="vocab_sweep")
    got = provenance.row_kernel_sources(frame, tmp_path, root=root).tolist()
    assert got == [None, None, "recorded-digest", git_sources_digest(new, KERNEL_SOURCES, root), None]


def test_rows_find_the_process_that_recorded_them():
    """The latest process that started before a row and measured its variant at its token count."""
    meta = sidecar()
    assert provenance.row_sessions(rows(), meta).tolist() == [0, 0, 1, 2, -1]
    assert provenance.row_commits(rows(), meta).tolist() == ["OLD", "OLD", "OLD", "NEW", None]


def test_rows_of_processes_side_by_side_find_their_own():
    """Processes that ran at once on several GPUs, each over its own vocabularies (and one in another dtype): a row
    belongs to the one whose parameters cover its vocabulary and dtype, not to the latest that started."""
    meta = {"timestamp_utc": "2026-11-29T19:27:20Z", "gpu_uuid": "gpu-0",
            "parameters": {"cases": [["public", None, None]], "tokens": [4096], "vocab": [32000, 128256],
                           "dtype": "bf16"},
            "sessions": [{"timestamp_utc": "2026-11-29T19:27:22Z", "gpu_uuid": "gpu-1",
                          "parameters": {"cases": [["public", None, None]], "tokens": [4096], "vocab": [32768],
                                         "dtype": "bf16"}},
                         {"timestamp_utc": "2026-11-29T19:27:24Z", "gpu_uuid": "gpu-0",
                          "parameters": {"cases": [["public", None, None]], "tokens": [4096], "vocab": [32000],
                                         "dtype": "fp32"}}]}
    frame = pd.DataFrame([
        dict(variant="public", tokens=4096, vocab=32000, dtype="bf16", timestamp_utc="2026-11-29T19:28:00Z"),
        dict(variant="public", tokens=4096, vocab=32768, dtype="bf16", timestamp_utc="2026-11-29T19:28:01Z"),
        dict(variant="public", tokens=4096, vocab=32000, dtype="fp32", timestamp_utc="2026-11-29T19:28:02Z"),
        dict(variant="public", tokens=4096, vocab=50257, dtype="bf16", timestamp_utc="2026-11-29T19:28:03Z"),
    ])
    assert provenance.row_sessions(frame, meta).tolist() == [0, 1, 2, -1]


def test_code_note_of_a_file_says_whether_its_kernels_are_todays(history):
    root, old, new = history
    same = provenance.code_note("the counts", {"code_commit": new[:7], "timestamp_utc": "2026-11-27T00:00:00Z"},
                                root=root)
    assert same.same is True and same.startswith("Same kernel sources") and "kernels/" in same
    other = provenance.code_note("the counts", {"code_commit": old}, root=root)
    assert other.same is False and "1 commit changed kernels/ since" in other
    unknown = provenance.code_note("the counts", {"code_commit": "0" * 40}, root=root)
    assert unknown.same is None and unknown.startswith("Kernel sources unknown")
    against = provenance.code_note("the compiles", {"code_commit": old}, against={"code_commit": new},
                                   against_what="the timed runs", root=root)
    assert against.same is False and "the timed runs (commit " in against
    files = provenance.code_note("the counts", {"code_commit": old}, paths=("kernels/loss.py",), root=root)
    assert "kernels/loss.py;" in files and "kernels/loss.py/" not in files  # a file is named as a file


def test_sources_digest_names_the_kernels_on_disk_as_git_holds_them(history):
    """The digest of the files equals the one git gives for the commit that holds them, ignores Python's caches, and
    moves with any change of a kernel file."""
    from perfutils.data.metadata import git_sources_digest, sources_digest

    root, old, new = history
    today = sources_digest(root=root)
    assert today == git_sources_digest(new, root=root) != git_sources_digest(old, root=root)
    (root / "kernels" / "__pycache__").mkdir()
    (root / "kernels" / "__pycache__" / "loss.cpython-312.pyc").write_bytes(b"\0cache")
    assert sources_digest(root=root) == today
    (root / "kernels" / "loss.py").write_text("A = 3\n")
    assert sources_digest(root=root) != today
    assert git_sources_digest("0" * 40, root=root) is None


def test_a_recorded_digest_outweighs_a_stale_commit(history):
    """A machine whose .git lagged behind its files names an old commit (and dirty): the kernels' digest it also
    recorded says which kernels measured, and names their commit."""
    from perfutils.data.metadata import git_sources_digest

    root, old, new = history
    provenance.commit_with_sources.cache_clear()
    stale = {"git_commit": old, "git_dirty": True, "timestamp_utc": "2026-11-29T01:00:00Z"}
    today = provenance.code_note("the counts", {**stale, "kernel_sources": git_sources_digest(new, root=root)},
                                 root=root)
    assert today.same is True and f"commit {new[:7]} (2026-11-29)" in today and "uncommitted" not in today
    older = provenance.compare_code({**stale, "kernel_sources": git_sources_digest(old, root=root)}, root=root)
    assert older.same is False and older.commit == old[:7] and older.changes == 1 and not older.dirty
    edited = provenance.compare_code({**stale, "kernel_sources": "0" * 16}, root=root)  # kernels never committed
    assert edited.same is False and edited.dirty and edited.commit == old
    both = provenance.compare_code({"kernel_sources": "ab" * 8}, against={"kernel_sources": "ab" * 8}, root=root)
    assert both.same is True


def test_rows_code_note_counts_rows_of_todays_and_of_other_sources(history):
    root, old, new = history
    meta = with_commits(sidecar(), old, new)
    data = rows().iloc[:4]
    note = provenance.rows_code_note("recorded rows", data, meta, root=root)
    assert note.same is False
    assert note.startswith("Kernel sources by row: of the 4 recorded rows, 1 (commit ")
    assert f"commit {new[:7]}, 2026-11-27) were measured with the same kernels/ as today's kernels" in note
    assert f"3 (commit {old[:7]}, 2026-11-23 to 2026-11-27) with different kernels/" in note
    latest = provenance.rows_code_note("recorded rows", data.iloc[[3]], meta, root=root)
    assert latest.same is True and latest.startswith("Same kernel sources: all 1 recorded rows")
    single = provenance.rows_code_note("rows", data, {"code_commit": new}, root=root)  # no sessions: the file's
    assert single.same is True and single.startswith("Same kernel sources")


def test_rows_code_note_of_rows_all_from_other_sources(history):
    root, old, new = history
    meta = with_commits(sidecar(), old, new)
    note = provenance.rows_code_note("rows", rows().iloc[:3], meta, root=root)
    assert note.same is False
    assert note.startswith(f"Other kernel sources: all 3 rows were recorded with commit {old[:7]}, 2026-11-23 to")


def test_one_gpu_data_is_compared_without_the_vocab_parallel_files(tmp_path):
    """A change to the vocabulary split's files alone leaves one-GPU data (a known study other than the two-GPU ones)
    of today's kernels, and says that it left those files aside; two-GPU data, or a change elsewhere, differ. The same
    holds for a sidecar that names only its commit, and for rows compared by digest (source_match)."""
    from perfutils.data.metadata import sources_digest

    root = new_repo(tmp_path)
    (root / "kernels" / "vocab_parallel_exchange.py").write_text("B = 1\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    old = git(root, "rev-parse", "HEAD")
    old_digest = sources_digest(KERNEL_SOURCES, root)
    (root / "kernels" / "vocab_parallel_exchange.py").write_text("B = 2\n")
    git(root, "commit", "-q", "-am", "the split's kernel only")
    one_gpu = {"study": "vocab_sweep", "code_commit": old, "kernel_sources": old_digest,
               "timestamp_utc": "2026-11-29T10:00:00Z"}
    match = provenance.compare_code(one_gpu, root=root)
    assert match.same is True and match.excluded
    note = provenance.code_note("rows", one_gpu, root=root)
    assert note.startswith("Same kernel sources") and "vocab-parallel files aside" in note
    assert provenance.compare_code({**one_gpu, "study": "tensor_parallel"}, root=root).same is False
    assert provenance.compare_code({**one_gpu, "study": None}, root=root).same is False  # unknown study: every file
    by_commit = {"parameters": {"study": "vocab_sweep"}, "code_commit": old, "timestamp_utc": "2026-11-29T10:00:00Z"}
    assert provenance.compare_code(by_commit, root=root).same is True
    new_digest = sources_digest(KERNEL_SOURCES, root)
    same, different, _ = provenance.source_match(pd.Series([old_digest]), pd.Series([new_digest]), root=root)
    assert same.tolist() == [True]
    same, different, _ = provenance.source_match(pd.Series([old_digest]), pd.Series([new_digest]), one_gpu=False,
                                                 root=root)
    assert different.tolist() == [True]
    (root / "kernels" / "loss.py").write_text("A = 2\n")  # a one-GPU kernel changes: other sources
    git(root, "commit", "-q", "-am", "loss")
    provenance._one_gpu_digests.cache_clear()
    assert provenance.compare_code(one_gpu, root=root).same is False
    assert provenance.compare_code(by_commit, root=root).same is False
