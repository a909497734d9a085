"""N replicas of ``python -m service`` on free loopback ports behind a real nginx.

nginx runs from deploy/nginx/nginx.conf.template as a foreground process (``daemon off``) with its
prefix, pid file, logs and temporary files in a fresh directory, listening on a free loopback
port. Each replica is one ``python -m service --workers 1`` with its own metrics directory and
log file in that directory; it can be killed (SIGKILL), stopped (SIGTERM, in-flight answers
finish) and started again on the same port.

    with Replicas(3) as r:
        http_json(r.url + "/attention", body)
        r.kill(0)
        r.stop(1)
        r.start(1)
        r.served(2)  # its /metrics' count of 200s for POST /attention
"""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from harness.live import free_port, http_json

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "deploy" / "nginx" / "nginx.conf.template"
SERVER_PARAMS = "max_fails=3 fail_timeout=5s max_conns=512"  # as the template says
STARTUP_SECONDS = 30.0


def nginx_binary() -> str | None:
    """The nginx executable (PATH, then /usr/sbin), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def render_config(
    servers: list[str],
    listen: str,
    access_log: str = "access.log",
    resolver: str = "",
    template: Path = TEMPLATE,
) -> str:
    """The template with its ``${...}`` placeholders filled: ``servers`` are host:port addresses,
    each given SERVER_PARAMS."""
    lines = " ".join(f"server {s} {SERVER_PARAMS};" for s in servers)
    values = {
        "NGINX_LISTEN": listen,
        "NGINX_RESOLVER": resolver,
        "ATTENTION_SERVERS": lines,
        "NGINX_ACCESS_LOG": access_log,
    }
    text = template.read_text()
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    left = re.findall(r"\$\{[A-Z_]+\}", text)
    if left:
        raise ValueError(f"{template} has placeholders nobody fills: {sorted(set(left))}")
    return text


def wait_until_up(url: str, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    """Poll ``url`` until it answers 200; raise with ``log``'s text if ``proc`` exits first or
    STARTUP_SECONDS pass."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            if http_json(url)[0] == 200:
                return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            text = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(f"{what} did not start:\n{text}")
        time.sleep(0.1)


@dataclass
class Replica:
    """One ``python -m service --workers 1`` on a fixed loopback port."""

    port: int
    home: Path  # its logs and metrics directories live here
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start it on its port, with a fresh metrics directory (its counts start at 0), and
        return once /healthz answers."""
        assert not self.running, f"replica on port {self.port} is already running"
        self.starts += 1
        metrics = self.home / f"metrics-{self.starts}"
        metrics.mkdir(parents=True)
        log = self.home / f"replica-{self.starts}.log"
        self.logs.append(log)
        env = {**os.environ, **self.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
        cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", "1"]  # fmt: skip
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_until_up(self.base + "/healthz", self.proc, log, f"replica on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no answer in flight finishes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM and wait: uvicorn stops accepting, finishes the answers in flight, exits.
        Returns the exit status (0: nothing was cut)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def metrics(self) -> str:
        """Its /metrics text."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            return str(r.read().decode())

    def served(
        self, endpoint: str = "/attention", status: str = "200", method: str = "POST"
    ) -> int:
        """How many requests to ``endpoint`` it answered with ``status``, by its /metrics (since
        its last start)."""
        return requests_total(self.metrics(), endpoint, status, method)


def requests_total(text: str, endpoint: str, status: str = "200", method: str = "POST") -> int:
    """``attention_requests_total{method, endpoint, status}`` from a /metrics text (0 if absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith("attention_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if labels == {"method": method, "endpoint": endpoint, "status": status}:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


class Replicas:
    """``n`` replicas behind one nginx; ``url`` is nginx's. A context manager: everything started
    is stopped on exit (replicas SIGTERM, nginx SIGQUIT)."""

    def __init__(
        self,
        n: int,
        env: dict[str, str] | None = None,
        keep: bool = False,
        template: Path = TEMPLATE,
    ) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        self.nginx_bin = binary
        self.home = Path(tempfile.mkdtemp(prefix="nginx_replicas_"))
        # nginx's workers run as "nobody" when it starts as root: they must reach the temp paths
        self.home.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        self.keep = keep  # leave the directory (logs) behind
        self.template = template
        self.replicas = [
            Replica(port=free_port(), home=self.home / f"r{i}", env=dict(env or {}))
            for i in range(n)
        ]
        self.port = free_port()
        self.nginx: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.home / "nginx" / "access.log"

    @property
    def error_log(self) -> Path:
        return self.home / "nginx" / "error.log"

    def start_all(self) -> "Replicas":
        """Every replica, then nginx; returns once nginx answers /healthz."""
        try:
            for r in self.replicas:
                r.start()
            self.start_nginx()
        except BaseException:
            self.close()
            raise
        return self

    def start_nginx(self) -> None:
        prefix = self.home / "nginx"
        prefix.mkdir(exist_ok=True)
        prefix.chmod(0o755)
        conf = prefix / "nginx.conf"
        conf.write_text(
            render_config(
                [f"127.0.0.1:{r.port}" for r in self.replicas],
                f"127.0.0.1:{self.port}",
                template=self.template,
            )
        )
        out = prefix / "stderr.log"
        cmd = [self.nginx_bin, "-p", f"{prefix}/", "-c", str(conf), "-e", str(self.error_log),
               "-g", f"daemon off; pid {prefix / 'nginx.pid'};"]  # fmt: skip
        with out.open("wb") as f:
            self.nginx = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        wait_until_up(self.url + "/healthz", self.nginx, self.error_log, "nginx")

    def kill(self, i: int) -> None:
        self.replicas[i].kill()

    def stop(self, i: int) -> int | None:
        return self.replicas[i].stop()

    def start(self, i: int) -> None:
        self.replicas[i].start()

    def served(self, i: int, endpoint: str = "/attention") -> int:
        return self.replicas[i].served(endpoint)

    def upstream_attempts(self) -> list[list[str]]:
        """Per request in nginx's access log, the statuses of its attempts ("-" for one that got
        no answer: refused, reset), e.g. ["502", "200"] for a retried one."""
        attempts = []
        if self.access_log.exists():
            for line in self.access_log.read_text(errors="replace").splitlines():
                m = re.search(r'ustatus="([^"]*)"', line)
                if m:
                    attempts.append([s.strip() for s in m.group(1).split(",")])
        return attempts

    def close(self) -> None:
        for r in self.replicas:
            if r.running and r.proc is not None:
                r.proc.send_signal(signal.SIGTERM)
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                try:
                    r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait()
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGQUIT)  # graceful: finish what is in flight
            try:
                self.nginx.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
                self.nginx.wait()
        if not self.keep:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> "Replicas":
        return self.start_all()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
