"""A second Docker daemon on loopback, reached over mutual TLS: the tests' "remote" host.

Used by the multi-host tests (``tests/sandboxes/test_sandbox_hosts.py``) and by
``bench/sandbox_hosts_bench.py``, so both measure the same setup. Why here and not in the
package: it starts a root ``dockerd`` with throwaway, passphrase-less certificates and this
machine's quirks (no bridge, no iptables); that is test scaffolding, not something agentgym
should ship or support as a way to set up a real TLS host (docs/sandboxes.md shows that).

Needs root, ``dockerd``, ``docker`` and ``openssl``; `TlsDaemon.start` raises `Unavailable`
when one is missing so callers can skip (or fail under ``AGENTGYM_STRICT_DEPS=1``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from agentgym.engine._serve import free_port
from agentgym.sandboxes import DockerHost

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class Unavailable(RuntimeError):
    """This machine cannot run a second daemon (not root, or a binary is missing)."""


def _run(argv: list[str], cwd: Path | None = None, stdin: IO[bytes] | None = None) -> None:
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd, stdin=stdin)


def make_certs(out: Path) -> None:
    """A CA, a server cert for IP 127.0.0.1 and a client cert, with ``openssl``.

    The client's files use Docker's names (``ca.pem``, ``cert.pem``, ``key.pem``) so ``out``
    works as ``DOCKER_CERT_PATH`` and with `DockerHost.from_cert_dir`.
    """
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run(["openssl", "req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca.pem",
          "-days", "2", "-subj", "/CN=agentgym test CA"], cwd=out)
    for name, cn, ext in (("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\n"
                           "extendedKeyUsage=serverAuth\n"),
                          ("client", "agentgym test client", "extendedKeyUsage=clientAuth\n")):
        (out / f"{name}.ext").write_text(ext)
        _run(["openssl", "req", *ec, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr",
              "-subj", f"/CN={cn}"], cwd=out)
        _run(["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey",
              "ca-key.pem", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
              "-out", f"{name}-cert.pem"], cwd=out)
    os.replace(out / "client-cert.pem", out / "cert.pem")
    os.replace(out / "client-key.pem", out / "key.pem")


class TlsDaemon:
    """``dockerd --tlsverify`` on ``tcp://127.0.0.1:<port>`` with its own data and exec roots.

    `start` may be called again after `stop` (same port, certificates and images), so a test
    can stop the daemon mid-run and a later one can have it back. `remove` stops it and
    deletes everything it wrote.
    """

    def __init__(self) -> None:
        missing = [b for b in ("dockerd", "docker", "openssl") if shutil.which(b) is None]
        if missing:
            raise Unavailable(f"a second dockerd needs {', '.join(missing)} on PATH")
        if os.geteuid() != 0:
            raise Unavailable("a second dockerd needs root")
        self.root = Path(tempfile.mkdtemp(prefix="agentgym-tlsd-"))  # short: socket paths
        self.certs = self.root / "certs"
        self.certs.mkdir()
        try:
            make_certs(self.certs)
        except BaseException:
            shutil.rmtree(self.root)
            raise
        self.url = f"tcp://127.0.0.1:{free_port()}"
        self.socket_url = f"unix://{self.root}/docker.sock"
        self._process: subprocess.Popen[bytes] | None = None

    def host(self, name: str = "tls", timeout: float = 30.0) -> DockerHost:
        """This daemon as a pool host (mutual TLS, client files in ``certs``)."""
        return DockerHost.from_cert_dir(self.url, self.certs, name=name, timeout=timeout)

    @property
    def running(self) -> bool:
        """True while the dockerd process runs."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start dockerd and return once it answers ``docker version`` (deadline: 60 s)."""
        if self.running:
            return
        c = self.certs
        argv = ["dockerd", "--tlsverify", f"--tlscacert={c}/ca.pem",
                f"--tlscert={c}/server-cert.pem", f"--tlskey={c}/server-key.pem",
                f"-H={self.url}", f"-H={self.socket_url}", f"--data-root={self.root}/data",
                f"--exec-root={self.root}/exec", f"--pidfile={self.root}/docker.pid",
                "--bridge=none", "--iptables=false", "--ip6tables=false"]
        with open(self.root / "dockerd.log", "ab") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                             start_new_session=True)  # its own process group
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if not self.running or time.monotonic() > deadline:
                self.stop()
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the TLS dockerd did not come up: {tail}")
            time.sleep(0.1)  # polling a daemon that is starting, under a deadline

    def _answers(self) -> bool:
        probe = subprocess.run(["docker", "-H", self.socket_url, "version"],
                               capture_output=True, check=False)
        return probe.returncode == 0

    def load_image(self, image: str) -> None:
        """Copy ``image`` from the machine's main daemon (``docker save | docker load``)."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        try:
            _run(["docker", "-H", self.socket_url, "load", "-q"], stdin=save.stdout)
        finally:
            assert save.stdout is not None
            save.stdout.close()
            if save.wait() != 0:
                raise RuntimeError(f"docker save {image} failed")

    def stop(self) -> None:
        """SIGTERM dockerd's process group, SIGKILL it after 20 s; wait until it is gone."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def remove(self) -> None:
        """Stop the daemon, unmount what it left mounted and delete its directory."""
        self.stop()
        self._kill_leftovers()
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{self.root}/")),
                            key=len, reverse=True):  # the deepest first
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """SIGKILL processes still running from our exec root (shims of a killed dockerd)."""
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if str(self.root).encode() in cmdline:
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except ProcessLookupError:
                    continue
