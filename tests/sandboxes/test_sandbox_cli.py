"""`agentgym sandbox ...` commands and the offline image-build helpers."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentgym._errors import ConfigError
from agentgym.sandboxes._cli import app
from agentgym.sandboxes._image import apt_mirror

runner = CliRunner()


def test_apt_mirror_reads_deb822_and_legacy_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: x\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert apt_mirror(str(tmp_path)) == "http://mirror.example/debian"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "sources.list").write_text(
        "deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert apt_mirror(str(legacy)) == "http://old.example/debian"
    with pytest.raises(ConfigError, match="no apt mirror"):
        apt_mirror(str(tmp_path / "missing"))


def test_build_rejects_unknown_method():
    result = runner.invoke(app, ["build", "--method", "nope"])
    assert result.exit_code != 0 and "nope" in result.output


@pytest.mark.docker
def test_ls_and_prune(pool):
    with pool.lease() as sb:
        listed = runner.invoke(app, ["ls"])
        assert listed.exit_code == 0, listed.output
        assert sb._container.short_id in listed.output
        pruned = runner.invoke(app, ["prune"])
        assert pruned.exit_code == 0 and "removed 0" in pruned.output
        assert sb.run("print(1)").ok, "prune must leave live owners' containers alone"
