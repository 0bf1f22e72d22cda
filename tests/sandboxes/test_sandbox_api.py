"""The public surface, config checks, and imports that must stay light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agentgym.sandboxes as sandboxes
from agentgym._errors import ConfigError, InfraError, SandboxError
from agentgym.sandboxes import DockerSandboxConfig, ExecResult, ExecStatus, Sandbox


def test_public_names_are_pinned():
    assert sorted(sandboxes.__all__) == sorted([
        "DEFAULT_IMAGE", "DockerHost", "DockerSandbox", "DockerSandboxConfig", "ExecResult",
        "ExecStatus", "HostStats", "LocalSandbox", "LocalSandboxConfig", "PoolStats", "Sandbox",
        "SandboxLease", "SandboxPool", "SandboxToolEnv", "Snapshot", "TestResult",
        "VerifyResult", "averify", "build_image", "close_shared_pools",
        "closing_new_shared_pools", "reap_leaked", "verify",
    ])
    for name in sandboxes.__all__:
        assert getattr(sandboxes, name) is not None


def test_import_does_not_import_docker():
    code = "import sys, agentgym.sandboxes; print('docker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_one_infra_error_vocabulary():
    assert [s.value for s in ExecStatus] == [
        "ok", "error", "timeout", "oom", "output_limit", "infra_error"]
    bad = ExecResult.infra_failure("daemon gone\n")
    assert (bad.status, bad.infra_error, bad.ok, bad.exit_code) == (
        "infra_error", "daemon gone", False, None)
    assert ExecResult("", "boom", 1, 0.1, ExecStatus.ERROR).infra_error is None
    assert issubclass(SandboxError, InfraError)


def test_backends_satisfy_protocol():
    from agentgym.sandboxes import DockerSandbox, LocalSandbox

    assert isinstance(DockerSandbox(), Sandbox)  # not started: no container yet
    with pytest.warns(UserWarning, match="NOT a security boundary"):
        import agentgym.sandboxes._local as local

        local._warned.clear()
        sb = LocalSandbox()
    assert isinstance(sb, Sandbox)
    sb.close()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"code_uid": 1001}, "must differ"),
    ({"code_uid": 0}, "non-root"),
    ({"mem_limit_mb": 0}, "mem_limit_mb"),
    ({"workdir": "tmp"}, "absolute"),
    ({"workdir": "/"}, "absolute"),
    ({"cpus": -1}, "cpus"),
    ({"environment": {"PYTHONPATH": "/opt/lib:/work"}}, "PYTHONPATH entry '/work' is a folder"),
    ({"environment": {"PYTHONPATH": "/tmp/x/../mods"}}, "the code can write"),
])
def test_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        DockerSandboxConfig(**kwargs)


def test_an_import_path_of_the_image_is_allowed():
    DockerSandboxConfig(environment={"PYTHONPATH": "/opt/helpers:relative"})


def test_loosening_is_named():
    assert DockerSandboxConfig().loosened() == []
    cfg = DockerSandboxConfig(network_mode="bridge", mem_limit_mb=4096, pids_limit=32)
    assert cfg.loosened() == ["network_mode='bridge' (default 'none')",
                              "mem_limit_mb=4096 (default 512)"]


def test_hardened_container_options():
    from agentgym.sandboxes._docker import container_options

    opts = container_options(DockerSandboxConfig(), {})
    assert opts["network_mode"] == "none" and opts["read_only"] is True
    assert opts["mem_limit"] == opts["memswap_limit"] == 512 * 1024 * 1024
    assert opts["cap_drop"] == ["ALL"] and opts["security_opt"] == ["no-new-privileges"]
    assert opts["pids_limit"] == 64 and opts["nano_cpus"] == 10**9
    assert opts["user"] == "1001:1001"
    assert "noexec" in opts["tmpfs"]["/tmp"] and "uid=1000" in opts["tmpfs"]["/work"]
    assert {u["Name"] for u in opts["ulimits"]} == {"nofile", "fsize", "core"}
    assert opts["labels"]["agentgym.managed"] == "1"
