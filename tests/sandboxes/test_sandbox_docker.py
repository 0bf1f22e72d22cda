"""DockerSandbox on the real daemon: calls, sessions, timeouts, snapshots, recovery."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.sandboxes import DockerSandbox, DockerSandboxConfig, ExecStatus

pytestmark = pytest.mark.docker


PS = ("import os\nfor p in os.listdir('/proc'):\n    try:\n"
      "        print(open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ').strip())\n"
      "    except OSError:\n        pass")


def process_list(sb) -> str:
    """Command lines of every process visible in the sandbox (procps is not in the image)."""
    return sb.run(PS, session=False).stdout


def test_run_exec_stdin_files(sb):
    r = sb.run("import sys; print(open('d/in.txt').read() + sys.stdin.read())",
               stdin="!", files={"d/in.txt": "hello"})
    assert (r.status, r.stdout, r.exit_code) == (ExecStatus.OK, "hello!\n", 0)
    r = sb.exec(["cat", "d/in.txt"])
    assert r.stdout == "hello" and r.ok
    r = sb.run("echo $HOME; id -u", language="bash")
    assert r.stdout == "/work\n1000\n"


def test_errors_and_exit_codes(sb):
    r = sb.run("raise ValueError('boom')")
    assert r.status is ExecStatus.ERROR and r.exit_code == 1
    assert "ValueError: boom" in r.stderr and "_server" not in r.stderr
    assert sb.run("import sys; sys.exit(3)").exit_code == 3
    assert sb.exec(["sh", "-c", "exit 7"]).exit_code == 7
    r = sb.exec(["no-such-binary"])
    assert r.exit_code == 127 and "no-such-binary" in r.stderr


def test_python_session_persists_and_rolls_back(sb):
    assert sb.run("x = 41").ok
    assert sb.run("x += 1").ok
    assert sb.run("print(x)").stdout == "42\n"
    r = sb.run("x = 0\nimport time\ntime.sleep(10)", timeout=0.5)
    assert r.status is ExecStatus.TIMEOUT
    assert sb.run("print(x)").stdout == "42\n", "a killed cell must roll the session back"
    assert sb.run("print('x' in globals())", session=False).stdout == "False\n"


def test_timeout_is_enforced_in_container(sb):
    # code runs in a fork of the server, so its text never shows in a command line: the cell
    # records its own pid, and that process must be gone once the call times out
    r = sb.run("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)",
               timeout=1)
    assert r.status is ExecStatus.TIMEOUT and r.exit_code == -9
    assert 0.9 < r.duration < 3
    pid = sb.exec(["cat", "pid"]).stdout
    assert pid.isdigit(), pid
    assert sb.exec(["test", "-e", f"/proc/{pid}"]).exit_code == 1, f"pid {pid} survived"


def test_async_twins(sb):
    async def main():
        a = await sb.arun("print('a')")
        b = await sb.aexec(["echo", "b"])
        return a.stdout + b.stdout

    assert asyncio.run(main()) == "a\nb\n"


def test_reset_clears_files_processes_and_session(sb):
    sb.run("y = 1\nopen('keep.txt', 'w').write('x')\nopen('/tmp/t', 'w').write('x')")
    sb.reset()
    assert sb.exec(["ls", "-A", "/work", "/tmp"]).stdout.split() == ["/tmp:", "/work:"]
    assert "NameError" in sb.run("y").stderr


def nested(depth: int, name: str = "a", locked: bool = False) -> str:
    """Code that makes ``depth`` nested folders under /work, a file at the bottom (in a
    folder it then makes unreadable, with ``locked``)."""
    return ("import os\nos.chdir('/work')\n"
            f"for _ in range({depth}):\n    os.mkdir({name!r}); os.chdir({name!r})\n"
            "open('bottom.txt', 'w').write('deep')\n"
            + ("os.mkdir('x'); open('x/f', 'w').write('1'); os.chmod('x', 0)\n" if locked else ""))


@pytest.mark.parametrize(("depth", "name"), [(1_900, "a"), (2_500, "aa")])
def test_reset_empties_a_tree_deeper_than_python_recurses_or_a_path_reaches(sb, depth, name):
    """1,900 folders made ``rmtree`` raise RecursionError; 2,500 of "aa" are past PATH_MAX.
    The reset failed and the container was replaced: a policy could cost one container a
    lease. Now the same container comes back empty."""
    made = sb.run(nested(depth, name, locked=True), timeout=60)
    assert made.exit_code == 0, made.stderr
    container = sb.container_id
    sb.reset()
    assert (sb.container_id, sb.needs_recycle) == (container, False)
    assert sb.exec(["ls", "-A", "/work"]).stdout == ""


def test_snapshot_keeps_a_tree_deeper_than_python_recurses(pool):
    with pool.lease() as prepared:
        assert prepared.run(nested(1_200), timeout=60).exit_code == 0
        snap = prepared.snapshot()
    with pool.lease(snapshot=snap) as restored:
        found = restored.run("import os\nos.chdir('/work')\nfor _ in range(1200): os.chdir('a')\n"
                             "print(open('bottom.txt').read())", timeout=60)  # fmt: skip
        assert found.stdout == "deep\n", found.stderr


def test_hard_reset_restarts_server(sb):
    sb.run("open('f', 'w').write('x')")
    sb.reset(hard=True)
    assert sb.exec(["ls", "-A"]).stdout == "" and sb.run("print(1)").stdout == "1\n"


def test_snapshot_forks_state(pool):
    with pool.lease() as prepared:
        prepared.run("import os; os.makedirs('repo'); open('repo/a.py', 'w').write('A = 1')")
        snap = prepared.snapshot()
    assert snap.size > 0
    with pool.lease(snapshot=snap) as s1, pool.lease(snapshot=snap) as s2:
        s1.run("open('repo/a.py', 'w').write('A = 2')")
        assert s1.exec(["cat", "repo/a.py"]).stdout == "A = 2"
        assert s2.exec(["cat", "repo/a.py"]).stdout == "A = 1"


def test_snapshot_for_verifier_has_no_agent_processes(pool):
    with pool.lease() as agent:
        agent.run("import subprocess; subprocess.Popen(['sleep', '100'], start_new_session=True)"
                  "\nopen('answer.txt', 'w').write('42')", timeout=2)
        final = agent.snapshot()
        with pool.lease(snapshot=final) as judge:
            assert judge.exec(["cat", "answer.txt"]).stdout == "42"
            assert "sleep 100" not in process_list(judge)
        assert "sleep 100" not in process_list(agent), "a setsid child outlived its call"


def test_container_removed_externally_is_infra_error(docker_ready):
    with DockerSandbox(config=DockerSandboxConfig(host_grace_s=2)) as sb:
        sb._client.containers.get(sb.container_id).remove(force=True)
        r = sb.run("print(1)")
        assert r.status is ExecStatus.INFRA_ERROR and "container lost" in r.infra_error
        assert "the container is gone (stopped and removed)" in r.infra_error, r.infra_error
        assert "404" not in r.infra_error  # docker-py's own text tells the user nothing more
        assert sb.needs_recycle
        assert sb.run("print(1)").stdout == "1\n", "the sandbox replaced its container"


def test_a_container_the_daemon_is_removing_already_is_not_left_behind(
    docker_ready, monkeypatch
):
    """With auto_remove the daemon removes a stopped container itself; a ``remove`` meanwhile
    is refused with a 409 ("removal already in progress"), which marked it left behind."""
    import docker.errors
    import docker.models.containers as containers
    import requests

    remove = containers.Container.remove

    def removal_in_progress(container, **kwargs):
        remove(container, **kwargs)  # the daemon's own removal, which this call raced
        conflict = requests.Response()
        conflict.status_code = 409
        raise docker.errors.APIError("removal of container is already in progress",
                                     response=conflict)

    sb = DockerSandbox()
    sb.run("print(1)")
    monkeypatch.setattr(containers.Container, "remove", removal_in_progress)
    sb.close()
    assert sb.left_behind is None


def test_server_frozen_hits_host_deadline(docker_ready):
    cfg = DockerSandboxConfig(host_grace_s=1)
    with DockerSandbox(config=cfg) as sb:
        pid = sb._channel.server_pid
        r = sb.run(f"import os, signal; os.kill({pid}, signal.SIGSTOP)", timeout=1)
        assert r.status is ExecStatus.TIMEOUT and "from outside" in r.stderr
        assert sb.run("print(2)").stdout == "2\n"


def test_snapshot_with_a_frozen_server_raises_sandbox_error(docker_ready):
    from agentgym._errors import SandboxError

    with DockerSandbox() as sb:
        uid = sb.config.code_uid
        stop = f"kill -STOP {sb._channel.server_pid}"
        assert sb._container.exec_run(["sh", "-c", stop], user=f"{uid}:{uid}").exit_code == 0
        with pytest.raises(SandboxError, match="snapshot failed"):
            sb.snapshot(timeout=1)
        assert sb.needs_recycle
        assert sb.run("print(3)").stdout == "3\n", "the server was restarted"


def test_missing_image_names_the_fix(docker_ready):
    from agentgym._errors import SandboxError

    with pytest.raises(SandboxError, match="agentgym sandbox build"):
        DockerSandbox(image="agentgym-sandbox:does-not-exist").start()


def test_hardening_is_visible_from_inside(sb):
    r = sb.run("grep -E 'CapEff|NoNewPrivs' /proc/self/status; id -u; ulimit -n",
               language="bash")
    assert r.stdout.split() == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1", "1000", "256"]
    r = sb.run("printf '#!/bin/sh\\necho ran\\n' > s.sh; chmod +x s.sh; ./s.sh; "
               "cp s.sh /tmp/s.sh; /tmp/s.sh", language="bash")
    assert r.stdout == "ran\n" and "Permission denied" in r.stderr, "work dir exec, /tmp noexec"
    r = sb.run("import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    assert r.stdout == "0\n", "code must inherit the server's non-dumpable flag"


@pytest.mark.parametrize("path", ["/etc/x", "../x", "a/../../x"])
def test_files_must_stay_in_the_work_dir(sb, path):
    from agentgym._errors import ConfigError

    with pytest.raises(ConfigError, match="leaves the work directory"):
        sb.run("pass", files={path: "x"})


def test_files_that_do_not_fit_are_the_callers_error_not_infra(sb):
    filled = sb.run("open('fill.bin', 'wb').write(b'x' * (63 << 20))")
    assert filled.ok, filled.stderr
    res = sb.run("print('not reached')", files={"more.bin": b"y" * (2 << 20)})
    assert res.status == "error" and not res.infra_error
    assert "cannot write 'more.bin'" in res.stderr and "No space left" in res.stderr
    assert sb.run("import os; os.remove('fill.bin'); print('ok')").stdout == "ok\n"


@pytest.mark.parametrize("session", [True, False])
def test_code_that_is_not_unicode_is_the_callers_error_not_infra(sb, session):
    # JSON can spell a lone surrogate ("\ud800"); the server cannot encode it as UTF-8
    res = sb.run("x = 1\nprint('\ud800')", session=session)
    assert not res.infra_error and res.status == "error", res
    assert "not Unicode" in res.stderr or "surrogate" in res.stderr
    assert sb.run("print(2)", session=session).stdout == "2\n"  # the server serves on
