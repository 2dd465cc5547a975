"""The heliosd under test: one already running (--address), or one started from a YAML config on a
free loopback port and stopped (SIGTERM) afterwards (--config)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from .client import SOURCE_DIR, SyncClient

START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_heliosd() -> str:
    return os.environ.get("HELIOSD") or str(SOURCE_DIR / "build" / "heliosd")


_PATH_KEYS = ("path", "cert", "key", "heads")  # heads: models[].early_exit.heads
_LINE = re.compile(r"^(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def _split_value(rest: str) -> tuple[str, str]:
    """'  "a b" # c' → ('a b', ' # c'); unquoted values end at ' #'."""
    s = rest.strip()
    if s[:1] in ("'", '"'):
        q = s[0]
        end = s.find(q, 1)
        if end > 0:
            return s[1:end], s[end + 1:]
    m = re.search(r"\s#", s)
    return (s[:m.start()].strip(), s[m.start():]) if m else (s, "")


def _quote(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rewrite_config(text: str, config_dir: Path, port: int, http_port: int | None = None) -> str:
    """The config with server.listen = 127.0.0.1:PORT, server.metrics_listen off, server.http_listen
    127.0.0.1:HTTP_PORT or off (no clash with another heliosd) and relative paths (models[].path
    and early_exit.heads, server.tls cert/key) made absolute against the original file's folder.
    Line-based: block-style YAML, as heliosd's configs are written."""
    out, section = [], None
    seen_listen = seen_metrics = seen_http = False
    http_value = _quote(f"127.0.0.1:{http_port}") if http_port else '""'
    server_line = None
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and not m.group("indent") and not m.group("dash"):
            section = m.group("key")
            if section == "server":
                server_line = len(out)
        if m and m.group("indent") or (m and m.group("dash")):
            key = m.group("key")
            value, tail = _split_value(m.group("rest"))
            prefix = m.group("indent") + (m.group("dash") or "") + key + ": "
            if section == "server" and key == "listen":
                line, seen_listen = prefix + _quote(f"127.0.0.1:{port}"), True
            elif section == "server" and key == "metrics_listen":
                line, seen_metrics = prefix + '""', True
            elif section == "server" and key == "http_listen":
                line, seen_http = prefix + http_value, True
            elif key in _PATH_KEYS and value and section in ("models", "server") and not os.path.isabs(value):
                line = prefix + _quote(str((config_dir / value).resolve())) + tail
        out.append(line)
    extra = []
    if not seen_listen:
        extra.append(f'  listen: "127.0.0.1:{port}"')
    if not seen_metrics:
        extra.append('  metrics_listen: ""')
    if not seen_http:
        extra.append(f"  http_listen: {http_value}")
    if extra:
        if server_line is None:
            out += ["server:"] + extra
        else:
            out[server_line + 1:server_line + 1] = extra
    return "\n".join(out) + "\n"


class ManagedServer:
    """A heliosd started from a config (start/stop), or a running one at an address (no-ops), or
    any OpenAI-compatible server at a URL (no-ops). With http, a started heliosd serves its
    OpenAI-compatible HTTP API too, at self.url."""

    def __init__(self, address: str | None = None, config: str | None = None, heliosd: str | None = None,
                 label: str | None = None, model: str = "", metadata=None, url: str | None = None,
                 http: bool = False, api_key: str = ""):
        if sum(x is not None for x in (address, config, url)) != 1:
            raise ValueError("give one of address, config and url")
        self.address = address
        self.url = url
        self.http = http
        self.api_key = api_key
        self.config = config
        self.heliosd = heliosd or default_heliosd()
        self.label = label or (Path(config).stem if config else address or url)
        self.model = model
        self.metadata = metadata
        self.proc = None
        self.workdir = None
        self.log_path = None
        self.config_text = Path(config).read_text() if config else ""
        self.run_config_text = ""
        self.exit_code = None

    @property
    def managed(self) -> bool:
        return self.config is not None

    def start(self, timeout_s: float = START_TIMEOUT_S):
        if self.url is not None and not self.managed:
            from .openai_client import OpenAiSyncClient
            OpenAiSyncClient(self.url, self.model, self.api_key).wait_serving(timeout_s)
            return self
        if not self.managed:
            SyncClient(self.address, self.model, self.metadata).wait_serving(timeout_s)
            return self
        if not os.access(self.heliosd, os.X_OK):
            raise RuntimeError(f"{self.heliosd} is not an executable heliosd "
                               "(build it: cmake --build build --target heliosd, or pass --heliosd PATH)")
        self.workdir = tempfile.mkdtemp(prefix=f"helios-bench-{self.label}-")
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        http_port = free_port() if self.http else None
        if http_port:
            self.url = f"http://127.0.0.1:{http_port}"
        self.run_config_text = rewrite_config(self.config_text, Path(self.config).resolve().parent, port, http_port)
        cfg = os.path.join(self.workdir, "heliosd.yaml")
        with open(cfg, "w") as f:
            f.write(self.run_config_text)
        self.log_path = os.path.join(self.workdir, "heliosd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([self.heliosd, "--config", cfg], stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            SyncClient(self.address, self.model, self.metadata).wait_serving(timeout_s, self.proc)
        except RuntimeError as e:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"{e}; config {self.config}; heliosd log:\n{tail}") from None
        return self

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n_chars:]
        except (OSError, TypeError):
            return ""

    def stop(self, keep_log_to: str | None = None):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                self.exit_code = None
        else:
            self.exit_code = self.proc.returncode
        self._log.close()
        if keep_log_to:
            shutil.copyfile(self.log_path, keep_log_to)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.proc = None
        return self.exit_code
