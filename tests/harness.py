"""Real hamq processes on loopback with ports chosen at run time: the harness behind the
``cluster`` fixtures. Every process is stopped by its PID (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hamq.cli.common import readable
from hamq.config import dump_toml
from helpers import free_port

READY_TIMEOUT_S = 30.0


@dataclass
class Proc:
    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None
    ready: dict = field(default_factory=dict)  # the ready line it printed last

    @property
    def pid(self) -> int:
        return self.popen.pid

    def start(self) -> Proc:
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child process holds it)
        env = dict(os.environ, HAMQ_LOG_LEVEL=os.environ.get("HAMQ_LOG_LEVEL", "INFO"))
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "hamq.cli.main", *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if readable(self.popen.stdout, 0.5):
                line = self.popen.stdout.readline()
                if not line:
                    break
                self.ready = json.loads(line)
                if self.ready.get("event") == "ready":
                    return self
            elif self.popen.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready; log:\n{self.log_path.read_text()}")

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()


@dataclass
class Cluster:
    root: Path
    namesrv_addrs: list[str] = field(default_factory=list)
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def namesrv(self) -> str:
        return ";".join(self.namesrv_addrs)

    def start_namesrv(self, name: str = "namesrv", **settings) -> Proc:
        addr = f"127.0.0.1:{free_port()}"
        cfg = self.root / f"{name}.toml"
        cfg.write_text(dump_toml({"listen": addr, "data_dir": str(self.root / name), **settings}))
        proc = Proc(name, ["namesrv", "-c", str(cfg)], self.root / f"{name}.log").start()
        self.procs[name] = proc
        self.namesrv_addrs.append(addr)
        return proc

    def write_broker_config(self, name: str, **settings) -> Path:
        addr = settings.pop("listen", None) or f"127.0.0.1:{free_port()}"
        values = {
            "cluster_name": "TestCluster",
            "broker_name": "broker-a",
            "broker_id": 0,
            "listen": addr,
            "ha_listen": f"127.0.0.1:{free_port()}",
            "namesrv": self.namesrv_addrs,
            "store_dir": str(self.root / name),
            **settings,
        }
        cfg = self.root / f"{name}.toml"
        cfg.write_text(dump_toml(values))
        return cfg

    def start_broker(self, name: str = "broker", **settings) -> Proc:
        cfg = self.write_broker_config(name, **settings)
        proc = Proc(name, ["broker", "-c", str(cfg)], self.root / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def broker_addr(self, name: str = "broker") -> str:
        text = (self.root / f"{name}.toml").read_text()
        return next(line.split('"')[1] for line in text.splitlines() if line.startswith("listen"))

    def restart(self, name: str) -> Proc:
        proc = self.procs[name]
        proc.stop()
        return proc.start()

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()

    def start_controller(self, name: str, listen: str, **settings) -> Proc:
        """A standalone controller peer (``hamq controller``) on ``listen``: a peer's
        address must be known before it starts, as every peer's config names them all."""
        cfg = self.root / f"{name}.toml"
        cfg.write_text(dump_toml({"listen": listen, "data_dir": str(self.root / name), **settings}))
        proc = Proc(name, ["controller", "-c", str(cfg)], self.root / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def start_embedded_controller(self, name: str, listen: str, **settings) -> Proc:
        """A name server with a controller peer embedded (``enable_controller_in_namesrv``)
        on ``listen``, known before it starts as the peers name each other."""
        cfg = self.root / f"{name}.toml"
        values = {"listen": listen, "data_dir": str(self.root / name), **settings}
        cfg.write_text(dump_toml({**values, "enable_controller_in_namesrv": True}))
        proc = Proc(name, ["namesrv", "-c", str(cfg)], self.root / f"{name}.log").start()
        self.procs[name] = proc
        self.namesrv_addrs.append(listen)
        return proc
