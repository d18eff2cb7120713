"""The docs site's build (``make docs``) fails on a link to a page or a heading that does not exist, naming it.
The site as it is builds: ``make test`` builds it (strict) before it runs the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two builds of the whole site: about 10 s

ROOT = Path(__file__).resolve().parent.parent


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", repo / "docs")
    shutil.copy(ROOT / "mkdocs.yml", repo)
    for entry in ROOT.iterdir():  # the rest as it is: the reference reads the packages, a page pyproject.toml
        if entry.name not in ("docs", "mkdocs.yml", "site", ".git"):
            (repo / entry.name).symlink_to(entry)
    page = repo / "docs" / "quickstart.md"
    text = page.read_text()
    build = [str(ROOT / ".venv" / "bin" / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    for link, named in (("no-such-page.md", "'no-such-page.md'"), ("policies.md#no-such-heading", "'#no-such-heading'")):
        page.write_text(f"{text}\nSee [this]({link}).\n")
        broken = subprocess.run(build, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert broken.returncode == 1 and named in broken.stderr, broken.stderr[-3000:]
