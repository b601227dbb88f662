"""A local Pokémon Showdown battle server as a service: start on a free loopback port, wait until it answers,
stop with every process it started (VGC-Bench, seed 000-90).

VGC-Bench (Angliss et al., *VGC-Bench: Towards Mastering Diverse Team Strategies in Competitive Pokémon*,
arXiv:2506.10326, seed 000-90) plays its battles through poke-env against a locally hosted Showdown server,
started as ``node pokemon-showdown start <port> --no-security`` (the authors keep the server as a git submodule,
their fork of smogon/pokemon-showdown). Here the server is the npm package ``pokemon-showdown`` (pinned to 0.11.11
by the Makefile, installed by ``make install-dev`` into ``.cache/showdown``, a folder git ignores).

:class:`ShowdownServer` is a context manager::

    with ShowdownServer() as server:
        player = RandomPlayer(server_configuration=server.server_configuration, battle_format="gen9vgc2025regi",
                              team=...)

- **where**: ``GRPOLAB_SHOWDOWN_DIR`` (the package folder, the one holding the ``pokemon-showdown`` script), else
  ``<repository>/.cache/showdown/node_modules/pokemon-showdown``, else the same under the working directory;
- **config**: the package reads ``config/config.js`` from its own folder; the service writes one that takes the
  package's ``config-example.js`` and overrides what a local test server needs (bind 127.0.0.1 only, no REPL
  sockets, no file writing, no throttling, no worker processes: ``subprocesses = 0`` runs the simulator, the
  validator and the sockets in the one process, which starts with 6.5 CPU-seconds instead of 10.5 across 10
  processes), and starts with ``--skip-build`` (the npm package ships its compiled
  ``dist/``; the build step would need esbuild's install script, which ``--ignore-scripts`` does not run);
- **port**: a free loopback port chosen by the kernel (bind to port 0), retried when the server loses the race;
- **ready**: when a WebSocket handshake on ``/showdown/websocket`` succeeds and the server sends its first
  message (the port opens seconds before the server answers: it loads its formats and chat plugins after it
  starts listening);
- **stop**: the server runs in its own process group (it forks worker processes); ``stop`` sends SIGTERM to the
  group, then SIGKILL after ``stop_timeout`` seconds; an ``atexit`` hook stops any server still running, so a
  failing test leaves no process behind.

Errors name what is missing: no ``node`` on PATH, or no package ("run make install-dev").
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ..errors import ConfigError

#: The npm package and version the Makefile installs (``make install-dev``).
PACKAGE_VERSION = "0.11.11"
_CONFIG_MARK = "// written by grpolab.experiments.showdown"
_CONFIG = _CONFIG_MARK + """: the package's example config plus what a local test server needs
Object.assign(exports, require('./config-example.js'));
exports.bindaddress = '127.0.0.1';
exports.repl = false;
exports.nofswriting = true;
exports.nothrottle = true;
exports.noipchecks = true;
exports.reportbattles = false;
exports.reportjoins = false;
exports.crashguardemail = null;
exports.subprocesses = 0;
"""
_RUNNING: set["ShowdownServer"] = set()


def find_showdown(path: str | os.PathLike | None = None) -> Path:
    """The ``pokemon-showdown`` package folder, or :class:`ConfigError` saying what is missing and how to get it."""
    if shutil.which("node") is None:
        raise ConfigError("showdown: `node` (Node.js >= 18) is not on PATH; the Pokémon Showdown server needs it "
                          "(Debian: apt-get install nodejs npm), then run make install-dev")
    candidates = [Path(path)] if path else []
    if not candidates and os.environ.get("GRPOLAB_SHOWDOWN_DIR"):
        candidates = [Path(os.environ["GRPOLAB_SHOWDOWN_DIR"])]
    if not candidates:
        rel = Path(".cache/showdown/node_modules/pokemon-showdown")
        candidates = [Path(__file__).resolve().parents[3] / rel, Path.cwd() / rel]
    for c in candidates:
        if (c / "pokemon-showdown").is_file() and (c / "dist" / "server" / "index.js").is_file():
            return c
    raise ConfigError(f"showdown: the npm package pokemon-showdown@{PACKAGE_VERSION} is not installed (looked in "
                      f"{', '.join(str(c) for c in candidates)}): run make install-dev, or set "
                      "GRPOLAB_SHOWDOWN_DIR to a pokemon-showdown package folder")


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still alive."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShowdownServer:
    """A local Showdown server on ``127.0.0.1:<port>`` (see the module docstring); a context manager.

    ``ready_timeout``: seconds to wait for the first answer (a loaded 2-core machine took up to 30 s; an idle one
    about 3 s); ``port``: a fixed port instead of a free one; ``path``: the package folder.
    """

    def __init__(self, *, port: int | None = None, path: str | os.PathLike | None = None,
                 ready_timeout: float = 120.0, stop_timeout: float = 10.0):
        self.path = find_showdown(path)
        self.fixed_port = port
        self.port: int | None = None
        self.ready_timeout = float(ready_timeout)
        self.stop_timeout = float(stop_timeout)
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self._log: Path | None = None

    # ------------------------------------------------------------------ life cycle
    def _write_config(self) -> None:
        cfg = self.path / "config" / "config.js"
        if not cfg.is_file() or not cfg.read_text().startswith(_CONFIG_MARK) or cfg.read_text() != _CONFIG:
            if cfg.is_file() and not cfg.read_text().startswith(_CONFIG_MARK):
                cfg.rename(cfg.with_name("config.js.before-grpolab"))
            tmp = cfg.with_name(f"config.js.{os.getpid()}.tmp")
            tmp.write_text(_CONFIG)
            os.replace(tmp, cfg)

    def start(self) -> "ShowdownServer":
        """Start the server and wait until it answers a WebSocket handshake; returns self."""
        if self.proc is not None:
            return self
        self._write_config()
        t0 = time.perf_counter()
        for _attempt in range(3):
            self.port = self.fixed_port or _free_port()
            self._log = Path(os.environ.get("TMPDIR", "/tmp")) / f"grpolab-showdown-{os.getpid()}-{self.port}.log"
            log = open(self._log, "wb")
            self.proc = subprocess.Popen(
                ["node", "pokemon-showdown", "start", "--no-security", "--skip-build", str(self.port)],
                cwd=self.path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
            log.close()
            _RUNNING.add(self)
            if self._wait_ready(t0):
                self.start_seconds = time.perf_counter() - t0
                return self
            tail = self.log_tail()
            self.stop()
            if "EADDRINUSE" not in tail or self.fixed_port:
                raise ConfigError(f"showdown: the server in {self.path} did not answer on port {self.port} within "
                                  f"{self.ready_timeout:.0f} s; its output ends:\n{tail}")
        raise ConfigError("showdown: no free port after 3 tries")

    def _wait_ready(self, t0: float) -> bool:
        from websockets.sync.client import connect  # poke-env's own WebSocket client library

        url = f"ws://127.0.0.1:{self.port}/showdown/websocket"
        while time.perf_counter() - t0 < self.ready_timeout:
            if self.proc.poll() is not None:
                return False
            left = max(1.0, self.ready_timeout - (time.perf_counter() - t0))
            try:
                with connect(url, open_timeout=left, close_timeout=1) as ws:
                    ws.recv(timeout=left)
                return True
            except (OSError, TimeoutError):
                time.sleep(0.1)
            except Exception:  # a handshake refused while the server is still starting
                time.sleep(0.2)
        return False

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's output (its log file in $TMPDIR)."""
        try:
            return self._log.read_text(errors="replace")[-chars:] if self._log else ""
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``stop_timeout`` s; idempotent."""
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; its workers share the group: make sure none is left (killed children stay
            # zombies until the init process reaps them, so wait for the group to empty)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10.0
            while group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            break
        if self._log is not None:
            self._log.unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def websocket_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/showdown/websocket"

    @property
    def server_configuration(self):
        """poke-env's ``ServerConfiguration`` for this server (authentication is off: ``--no-security``)."""
        from poke_env.ps_client import ServerConfiguration

        return ServerConfiguration(self.websocket_url, "https://play.pokemonshowdown.com/action.php?")

    def __enter__(self) -> "ShowdownServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()
