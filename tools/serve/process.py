"""A `day0 serve` process on 127.0.0.1, as the server tests and `make bench-serve` start it, and
plain HTTP helpers (urllib).

`ServerProcess` starts `python -m day0.tools.serve ARTIFACT --port P ...` (or another launcher
module that ends in the same entry point, found on `path`), waits for /health to say ready, and stops it
with SIGTERM; its JSON log lines are kept in a file that can be read back. Every wait is bounded.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 180
MODEL = "demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        artifact: Path,
        log_path: Path,
        *args: str,
        module: str = "day0.tools.serve",
        path=(),
        env: dict | None = None,
        wait: bool = True,
    ):
        """Start the server; with `wait`, return once /health says ready (RuntimeError with the
        log if it exits or is not ready in time). `env`: extra environment variables."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", module, str(artifact), "--port", str(self.port), "--model-name", MODEL]
        pythonpath = os.pathsep.join([*map(str, path), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})}
        self._log = open(log_path, "w")  # noqa: SIM115 (the server writes it until close())
        self.proc = subprocess.Popen([*cmd, *args], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"day0 serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"day0 serve was not ready within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{")]

    def metrics(self) -> dict[str, float]:
        """The /metrics samples: {'name{labels}': value}."""
        status, body, _ = get(self.url + "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            m = re.fullmatch(r"([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)", line)
            if m and not line.startswith("#"):
                out[m.group(1)] = float(m.group(2))
        return out

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def get(url: str, timeout: float = 30):
    return request("GET", url, None, timeout)


def post(url: str, body, timeout: float = 60, headers: dict | None = None):
    """POST `body` (a dict as JSON, or raw bytes); (status, body bytes, headers)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request("POST", url, data, timeout, {"Content-Type": "application/json", **(headers or {})})


def request(method: str, url: str, data, timeout: float, headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)
