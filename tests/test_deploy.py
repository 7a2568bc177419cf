"""docker-compose.yml is valid Compose and everything it names (commands, ports, env vars, files) exists in code:
checked with Debian's ``docker-compose config -q`` (installed by .ci/run) and against the CLI parser and the code,
in seconds. The stack itself is built and run by tests/deploy/test_compose_stack.py (slow)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from labeldp.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env_example(name: str) -> dict[str, str]:
    pairs = {}
    for line in (ROOT / "deploy" / f"{name}.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            pairs[key] = value
    return pairs


def _compose_checkout(tmp_path: Path) -> str:
    """docker-compose (skipped without it here; CI must have it), and the compose file and deploy/ copied to
    ``tmp_path`` with the example env files in place of the real ones."""
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose must be installed in CI (.ci/run installs Debian's package)")
        pytest.skip("docker-compose not installed (CI installs it)")
    shutil.copy(ROOT / "docker-compose.yml", tmp_path)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    for example in (tmp_path / "deploy").glob("*.env.example"):
        shutil.copy(example, example.with_suffix(""))
    return binary


def test_compose_config_validates(tmp_path):
    binary = _compose_checkout(tmp_path)
    done = subprocess.run([binary, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(broken.read_text().replace("services:", "servicez:", 1))
    assert subprocess.run([binary, "-f", str(broken), "config", "-q"], capture_output=True,
                          cwd=tmp_path).returncode != 0


def test_the_gpu_override_builds_the_gpu_extra_and_reserves_one_gpu_for_the_trainer(tmp_path):
    """deploy/compose.gpu.yml (issue 43), merged by docker-compose itself: both trainer services build the image
    with the "gpu" extra (JAX for CUDA 12, which pyproject.toml declares) besides Spark's under another tag, and the
    trainer reserves
    one NVIDIA GPU; nothing else changes."""
    binary = _compose_checkout(tmp_path)
    merged = {}
    for files in (["docker-compose.yml"], ["docker-compose.yml", "deploy/compose.gpu.yml"]):
        done = subprocess.run([binary, *[a for f in files for a in ("-f", str(tmp_path / f))], "config"],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        merged[len(files)] = yaml.safe_load(done.stdout)["services"]
    plain, gpu = merged[1], merged[2]
    for name in ("trainer-init", "features"):
        assert gpu[name]["build"]["args"]["EXTRAS"] == "features,spark,gpu"
        assert gpu[name]["image"] == "labeldp/features:gpu"
        assert plain[name]["build"]["args"]["EXTRAS"] == "features,spark"  # Spark for "engine": "spark" jobs
    assert gpu["features"]["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    def others(services: dict) -> dict:  # the other services, their volumes as sets (compose orders them freely)
        return {name: {**service, "volumes": sorted(map(str, service.get("volumes", [])))}
                for name, service in services.items() if name not in ("trainer-init", "features")}

    assert others(gpu) == others(plain)
    dockerfile = (ROOT / "deploy" / "features.Dockerfile").read_text()
    assert "ARG EXTRAS=features" in dockerfile and '".[${EXTRAS}]"' in dockerfile
    assert "jax[cuda12]" in (ROOT / "pyproject.toml").read_text()


SPARK = {"spark-master", "spark-worker-1", "spark-worker-2", "trainer-spark-master", "trainer-spark-worker-1",
         "trainer-spark-worker-2"}  # the labels party's cluster and the trainer's own (profile spark)
SERVICES = {"postgres", "labels-init", "labels-a", "labels-b", "gateway", "trainer-init", "features", *SPARK}
REPLICAS = ("labels-a", "labels-b")


def test_the_services_their_health_checks_and_env_files():
    services = COMPOSE["services"]
    assert set(services) == SERVICES
    for name in ("postgres", *REPLICAS, "features"):  # what the stack waits for, and compose's depends_on
        assert "healthcheck" in services[name], name
    for name in ("labels-init", *REPLICAS, "trainer-init", "features"):
        assert (ROOT / (services[name]["env_file"] + ".example")).exists(), name
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert {name for name, service in services.items() if "spark" in service.get("profiles", [])} == SPARK


def test_only_the_gateway_is_published_and_secrets_live_in_volumes():
    services = COMPOSE["services"]
    assert [name for name, service in services.items() if service.get("ports")] == ["gateway"]
    for name in REPLICAS:  # the shared keys: made once by labels-init, read-only in the replicas
        environment, volumes = services[name]["environment"], services[name]["volumes"]
        assert environment["LABELDP_SECRET_KEY_FILE"].startswith("/keys/") and "labels-keys:/keys:ro" in volumes
        assert environment["LABELDP_SPARK_SECRET_FILE"].startswith("/spark-keys/")
        assert "spark-keys:/spark-keys:ro" in volumes
    assert services["features"]["environment"]["LABELDP_TRAINER_SECRET_KEY_FILE"].startswith("/keys/")
    init = " ".join(services["labels-init"]["command"])
    for made in ("secret-key --key-file /keys/secret.key", "audit-key --key-file /keys/audit.pem",
                 "secret-key --key-file /spark-keys/spark.secret", "upgrade-db"):
        assert made in init, made
    assert "test -e /keys/secret.key ||" in init  # never overwritten: a re-run keeps the keys
    # the build context carries the code only: no env file, key or database reaches an image
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[[line.startswith("#") for line in ignored].index(False)] == "*"
    assert {line for line in ignored if line.startswith("!")} == {
        "!pyproject.toml", "!README.md", "!shared/", "!labeldp/", "!labels_party/", "!features_party/"}


@pytest.mark.parametrize("dockerfile", ["labels.Dockerfile", "features.Dockerfile", "images/postgres.Dockerfile",
                                        "images/gateway.Dockerfile"])
def test_every_image_runs_as_an_unprivileged_user(dockerfile):
    users = re.findall(r"^USER (\S+)$", (ROOT / "deploy" / dockerfile).read_text(), re.M)
    assert users and users[-1] not in ("root", "0")


@pytest.mark.parametrize("name,party", [("labels-a", "labels"), ("labels-b", "labels"), ("features", "features")])
def test_commands_ports_and_dockerfiles_match_the_code(name, party):
    service = COMPOSE["services"][name]
    command = service["command"]
    assert command[0] == "labeldp"
    args = build_parser().parse_args(command[1:])  # raises on an unknown subcommand or option
    assert args.host == "0.0.0.0"  # inside its container; what leaves the compose network is the gateway
    assert not args.upgrade_db  # the init service migrates, once, before any replica starts
    assert f"127.0.0.1:{args.port}/readyz" in " ".join(service["healthcheck"]["test"])
    dockerfile = (ROOT / service["build"]["dockerfile"]).read_text()
    assert f"EXPOSE {args.port}" in dockerfile
    copied = re.findall(r"^COPY (\S+)", dockerfile, re.M)
    assert all((ROOT / path).exists() for path in copied), copied
    package = f"{party}_party"  # one party's code and its own extra, nothing of the other party
    assert set(copied) == {"pyproject.toml", "README.md", "shared", "labeldp", package}
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile  # the registry's base by default
    gateway = (ROOT / "deploy" / "images" / "gateway.cfg").read_text()
    if party == "labels":
        assert f"server {name} {name}:{args.port}" in gateway


def test_every_env_var_is_a_setting_and_credentials_agree():
    from labels_party.runtime.settings import LabelsSettings

    for key in _env_example("labels"):  # the labels party reads LABELDP_<field> into its settings object
        assert key.startswith("LABELDP_") and key[len("LABELDP_"):].lower() in LabelsSettings.model_fields, key
    from features_party.settings import TrainerSettings

    for key in _env_example("features"):
        assert key.startswith("LABELDP_TRAINER_"), key
        assert key[len("LABELDP_TRAINER_"):].lower() in TrainerSettings.model_fields, key
    postgres = _env_example("postgres")
    url = _env_example("labels")["LABELDP_DATABASE_URL"]
    assert url == (f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/"
                   f"{postgres['POSTGRES_DB']}")
    trainer = _env_example("features")
    assert trainer["LABELDP_TRAINER_DATABASE_URL"] == (
        f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/trainer")
    assert "CREATE DATABASE trainer" in (ROOT / "deploy" / "postgres-init.sql").read_text()
    settings = TrainerSettings.model_validate({"labels_parties": json.loads(trainer["LABELDP_TRAINER_LABELS_PARTIES"])})
    assert settings.labels_party_url(None) == ("office", "http://gateway:8700")  # the replicas' gateway
