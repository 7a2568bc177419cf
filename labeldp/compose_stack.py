"""``make compose-demo`` (``labeldp compose-demo``): the docker-compose deployment built and run for real, and the
two-party demo against its containers.

1. **An engine**: the one ``DOCKER_HOST`` (or ``/var/run/docker.sock``) reaches; else, as root, Debian's ``dockerd``
   (installed with apt when missing) started with its own data root and socket, and stopped at the end.
2. **Configuration**: ``deploy/{postgres,labels,features}.env`` from their examples with one generated database
   password (mode 0600), when none exist; existing ones are used as they are.
3. **Images**: ``deploy/images/build.sh`` — the registry's bases when they can be pulled, else a Debian base
   bootstrapped from the host's mirror (cached) and the Python and PostgreSQL bases built on it.
4. **Up**: ``docker-compose up -d`` with the ``spark`` profile and the labels replicas on the Spark master, waiting
   for every health check (the replicas' and the trainer's ``/readyz``, ``pg_isready``).
5. **Keys** through ``docker-compose exec``: the office's admin and the publisher's keys, valid for a day and
   revoked at the end, so a re-run makes its own (the key volumes and databases are kept).
6. **The demo** (:func:`labeldp.demo.run_demo`) against the gateway's and the trainer's ports, with one source
   dataset released on the Spark cluster; ``verify-audit`` runs in a labels container.
7. **Down**: containers and networks removed; volumes kept unless asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from labeldp.local_services import stop_process
from shared.errors import ErrorCode, LabelDPError

ROOT = Path(__file__).resolve().parent.parent  # the checkout: docker-compose.yml, deploy/
PROJECT = "labeldp"
OWN_ENGINE = Path("/run/labeldp-docker")  # the socket, pid file and exec root of a dockerd started here
OWN_DATA_ROOT = Path("/var/lib/labeldp-docker")
ENV_FILES = ("postgres", "labels", "features")
HEALTHY_SECONDS = 600.0


def _run(command: Sequence[str], *, env: dict[str, str] | None = None, check: bool = True,
         input: bytes | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(command), env=env, input=input, capture_output=True, timeout=timeout, cwd=ROOT)
    if check and done.returncode != 0:
        last = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
        raise LabelDPError(f"{' '.join(command[:4])} failed: {last[-1] if last else f'exit {done.returncode}'}",
                           code=ErrorCode.COMPOSE_FAILED)
    return done


def _engine_answers(env: dict[str, str]) -> bool:
    try:
        return _run(["docker", "info", "--format", "{{.ServerVersion}}"], env=env, check=False,
                    timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0:
        raise LabelDPError(f"{', '.join(packages)} missing; install Debian's packages (as root) or run as root",
                           code=ErrorCode.DOCKER_UNAVAILABLE)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env=env)
    _run(["apt-get", "install", "-y", "-qq", *packages], env=env)


@contextlib.contextmanager
def docker_engine(log: Path) -> Iterator[dict[str, str]]:
    """The environment (``DOCKER_HOST``) of an engine that answers: the caller's, else one started here as root
    with Debian's ``dockerd`` (overlay2, its own data root and socket), stopped on exit."""
    if shutil.which("docker-compose") is None or shutil.which("docker") is None:
        _apt_install("docker.io", "docker-compose")
    env = dict(os.environ)
    if _engine_answers(env):
        yield env
        return
    own = {**env, "DOCKER_HOST": f"unix://{OWN_ENGINE / 'docker.sock'}"}
    if _engine_answers(own):  # left running by an interrupted run: used, and stopped as if started here
        try:
            yield own
        finally:
            _stop_own_engine()
        return
    if os.geteuid() != 0:
        raise LabelDPError("no Docker engine answers (DOCKER_HOST, /var/run/docker.sock); start one, or run as "
                           "root to let compose-demo start Debian's dockerd", code=ErrorCode.DOCKER_UNAVAILABLE)
    if shutil.which("dockerd") is None:
        _apt_install("docker.io")
    OWN_ENGINE.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        daemon = subprocess.Popen(
            ["dockerd", "--data-root", str(OWN_DATA_ROOT), "--exec-root", str(OWN_ENGINE / "exec"),
             "--pidfile", str(OWN_ENGINE / "docker.pid"), "-H", own["DOCKER_HOST"]],
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _engine_answers(own):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise LabelDPError(f"dockerd did not start; see {log}", code=ErrorCode.DOCKER_UNAVAILABLE)
            time.sleep(0.5)
        print(f"engine: started dockerd (data root {OWN_DATA_ROOT}, log {log})", flush=True)
        yield own
    finally:
        stop_process(daemon, 60)


def _stop_own_engine() -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((OWN_ENGINE / "docker.pid").read_text()), 15)


def ensure_env_files(deploy: Path = ROOT / "deploy") -> None:
    """The three env files, from their examples with one new database password, unless they exist (an operator's
    own are never touched). Refused when only some exist: their password would not match."""
    present = [name for name in ENV_FILES if (deploy / f"{name}.env").exists()]
    if len(present) == len(ENV_FILES):
        return
    if present:
        raise LabelDPError(f"deploy/{', '.join(present)}.env exist but not all three: create the others from "
                           "their examples with the same database password", code=ErrorCode.COMPOSE_FAILED)
    password = secrets.token_urlsafe(24)
    for name in ENV_FILES:
        text = (deploy / f"{name}.env.example").read_text().replace("change-me", password)
        descriptor = os.open(deploy / f"{name}.env", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
    print("configuration: deploy/postgres.env, labels.env, features.env written (a new database password)")


def build_images(env: dict[str, str], bases: str) -> None:
    started = time.perf_counter()
    done = subprocess.run(["bash", "deploy/images/build.sh", "--bases", bases], env=env, cwd=ROOT)
    if done.returncode != 0:
        raise LabelDPError("building the images failed (deploy/images/build.sh's output above)",
                           code=ErrorCode.COMPOSE_FAILED)
    print(f"images: built in {time.perf_counter() - started:.0f} s", flush=True)


@dataclass(frozen=True)
class Key:
    secret: str = field(repr=False)
    prefix: str


@dataclass(frozen=True)
class Stack:
    """The compose project as ``make compose-demo`` runs it: the spark profile, the replicas on the labels party's
    cluster's master and the trainer on its own, and compose.demo.yml's loopback ports for the trainer and the
    labels party's Spark master's page."""

    env: dict[str, str] = field(repr=False)
    project: str = PROJECT
    # published on the host: the gateway (all interfaces, as an operator's), the trainer and the Spark master's
    # page (compose.demo.yml: loopback only)
    gateway_port: int = 8700
    trainer_port: int = 8701
    spark_ui_port: int = 8080
    files: tuple[str, ...] = ("docker-compose.yml", "deploy/compose.demo.yml")

    def compose(self, *args: str, check: bool = True, input: bytes | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
        files = [part for name in self.files for part in ("-f", name)]
        env = {**self.env, "LABELDP_SPARK_MASTER": "spark://spark-master:7077",
               "LABELDP_TRAINER_SPARK_MASTER": "spark://trainer-spark-master:7077",
               "LABELDP_GATEWAY_PORT": str(self.gateway_port), "LABELDP_TRAINER_PORT": str(self.trainer_port),
               "LABELDP_SPARK_UI_PORT": str(self.spark_ui_port)}
        return _run(["docker-compose", "-p", self.project, "--env-file", "deploy/images.env", "--profile", "spark",
                     *files, *args], env=env, check=check, input=input, timeout=timeout)

    def up(self) -> None:
        started = time.perf_counter()
        self.compose("up", "-d", "--remove-orphans", "--no-build")
        self.wait_healthy()
        print(f"stack: up and healthy in {time.perf_counter() - started:.0f} s", flush=True)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.decode().strip()

    def health(self, service: str) -> str:
        """The container's health (``healthy``, ``starting``, ``unhealthy``), its state when it has no check
        (``running``, ``exited``), or ``missing``."""
        container = self.container(service)
        if not container:
            return "missing"
        shown = _run(["docker", "inspect", "--format",
                      "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}", container],
                     env=self.env, check=False)
        return shown.stdout.decode().strip() or "missing"

    def wait_healthy(self, services: Sequence[str] = ("postgres", "labels-a", "labels-b", "features"),
                     seconds: float = HEALTHY_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while True:
            states = {service: self.health(service) for service in services}
            if all(state == "healthy" for state in states.values()) and self._gateway_ready():
                return
            if time.monotonic() > deadline:
                raise LabelDPError(f"the stack is not healthy after {seconds:g} s: {states}",
                                   code=ErrorCode.COMPOSE_FAILED)
            time.sleep(2)

    def _gateway_ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.labels_url}/readyz", timeout=5).status_code == 200
        return False

    @property
    def labels_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def trainer_url(self) -> str:
        return f"http://127.0.0.1:{self.trainer_port}"

    def exec(self, service: str, *command: str) -> str:
        return self.compose("exec", "-T", service, *command).stdout.decode()

    def create_key(self, party: str, org: str, role: str) -> Key:
        service = "labels-a" if party == "labels" else "features"
        made = json.loads(self.exec(service, "labeldp", party, "create-key", "--org", org, "--role", role,
                                    "--expires-in", "1", "--json"))
        return Key(made["key"], made["prefix"])

    def revoke_key(self, party: str, key: Key) -> None:
        service = "labels-a" if party == "labels" else "features"
        self.exec(service, "labeldp", party, "revoke-key", "--prefix", key.prefix, "--by", "compose-demo")

    def verify_audit(self) -> dict:
        """``verify-audit`` in a labels container, on its database and against every head it exported."""
        checked = self.compose("exec", "-T", "labels-a", "labeldp", "labels", "verify-audit", "--pinned",
                               "/audit/heads.jsonl", check=False)
        return json.loads(checked.stdout.decode())

    def put_source(self, organization: str, name: str, parquet: bytes) -> str:
        """Write a source file into the ``sources`` volume (read-only in the replicas) as the labels image's user,
        under the organization's prefix; the location to register."""
        volume = f"{self.project}_sources"
        directory = f"/sources/{organization}"
        _run(["docker", "run", "--rm", "-i", "--network", "none", "-v", f"{volume}:/sources",
              "labeldp/labels:latest", "sh", "-c", f'mkdir -p "{directory}" && cat > "{directory}/{name}"'],
             env=self.env, input=parquet)
        return f"{directory}/{name}"

    def import_features(self, organization: str, name: str, parts: Sequence[bytes]) -> dict:
        """Parquet files written into the trainer's container (its own /tmp, not a volume) and imported there by
        the operator's command (``labeldp features import-features``) as the organization's table ``name``."""
        directory = f"/tmp/import-{name}"
        for index, part in enumerate(parts):
            self.compose("exec", "-T", "features", "sh", "-c",
                         f'mkdir -p "{directory}" && cat > "{directory}/part-{index}.parquet"', input=part)
        try:
            return json.loads(self.exec("features", "labeldp", "features", "import-features", "--org", organization,
                                        "--name", name, directory, "--json"))
        finally:
            self.exec("features", "rm", "-rf", directory)

    def down(self, *, volumes: bool) -> None:
        self.compose("down", "--remove-orphans", *(["--volumes"] if volumes else []), check=False)


@dataclass(frozen=True)
class StackSources:
    """The office's sources in the stack's volume, and its Spark master's page (compose.demo.yml, loopback)."""

    stack: Stack
    organization: str

    def put(self, name: str, parquet: bytes) -> str:
        return self.stack.put_source(self.organization, name, parquet)

    def spark_master(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.stack.spark_ui_port}/json/", timeout=10).json()


def compose_demo(out: Path, *, bases: str = "auto", quick: bool = False, epsilons: list[float],
                 remove_volumes: bool = False) -> None:
    from labeldp.demo import OFFICE, PUBLISHER, Services, run_demo

    ensure_env_files()
    with docker_engine(out / "dockerd.log") as env:
        build_images(env, bases)
        stack = Stack(env)
        try:
            stack.up()
            keys = {"admin": ("labels", stack.create_key("labels", OFFICE, "admin")),
                    "consumer": ("labels", stack.create_key("labels", PUBLISHER, "consumer")),
                    "trainer": ("features", stack.create_key("features", PUBLISHER, "admin"))}
            print("keys: created through docker-compose exec (valid one day; revoked when the demo ends)")
            try:
                running = Services(stack.labels_url, stack.trainer_url, keys["admin"][1].secret,
                                   keys["consumer"][1].secret, keys["trainer"][1].secret,
                                   verify_audit=stack.verify_audit, sources=StackSources(stack, OFFICE))
                run_demo(out, epsilons, quick=quick, deployment=lambda _out: contextlib.nullcontext(running))
            finally:
                for party, key in keys.values():
                    with contextlib.suppress(LabelDPError):
                        stack.revoke_key(party, key)
        finally:
            save_logs(stack, out)
            stack.down(volumes=remove_volumes)
            print(f"stack: down ({'volumes removed' if remove_volumes else 'volumes kept'})", flush=True)


def save_logs(stack: Stack, out: Path) -> None:
    """Every container's log, to ``out/compose.log`` (kept after the stack is down)."""
    with contextlib.suppress(LabelDPError, OSError):
        out.mkdir(parents=True, exist_ok=True)
        (out / "compose.log").write_bytes(stack.compose("logs", "--no-color", check=False).stdout)
