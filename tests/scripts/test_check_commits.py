"""scripts/check_commits.sh on a scratch repository: subjects over 72 characters are listed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_commits.sh"
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_SYSTEM": os.devnull,
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=ENV, check=True, capture_output=True, text=True).stdout


def commit(repo: Path, subject: str) -> str:
    git(repo, "commit", "-q", "--allow-empty", "-m", subject)
    return git(repo, "rev-parse", "--short", "HEAD").strip()


def check(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=repo, env=ENV, capture_output=True, text=True, timeout=60)


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    return tmp_path


def test_subjects_over_72_characters_are_listed_and_fail(repo):
    base = commit(repo, "first")
    commit(repo, "a" * 72)
    long = commit(repo, "b" * 73)
    commit(repo, "é" * 72)  # 72 characters, 144 bytes
    result = check(repo, base)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{long}: 73 characters (at most 72): {'b' * 73}"]
    assert "1 of 3 commit subjects" in result.stderr


def test_only_the_commits_after_the_base_are_checked(repo):
    commit(repo, "c" * 80)
    base = commit(repo, "fine")
    commit(repo, "also fine")
    result = check(repo, base)
    assert result.returncode == 0, result.stdout
    assert "commits checked: 1;" in result.stdout


def test_without_a_base_or_upstream_the_last_commit_is_checked(repo):
    commit(repo, "d" * 80)
    commit(repo, "short")
    assert check(repo).returncode == 0
    commit(repo, "e" * 73)
    assert check(repo).returncode == 1


def test_an_unknown_base_is_refused_in_one_line(repo):
    commit(repo, "first")
    result = check(repo, "no-such-branch")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no-such-branch" in result.stderr
