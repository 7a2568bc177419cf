"""docker-compose.yml is valid Compose and everything it names (commands, ports, env vars, files) exists in code.

Docker cannot run here, so the file is checked with Debian's ``docker-compose config -q`` (installed by .ci/run)
and by cross-checking it against the CLI parser and the code."""

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


def test_compose_config_validates(tmp_path):
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose must be installed in CI (.ci/run installs Debian's package)")
        pytest.skip("docker-compose not installed (CI installs it)")
    shutil.copy(ROOT / "docker-compose.yml", tmp_path)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    for example in (tmp_path / "deploy").glob("*.env.example"):
        shutil.copy(example, example.with_suffix(""))
    done = subprocess.run([binary, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(broken.read_text().replace("services:", "servicez:", 1))
    assert subprocess.run([binary, "-f", str(broken), "config", "-q"], capture_output=True,
                          cwd=tmp_path).returncode != 0


def test_three_services_with_health_checks_and_env_files():
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "labels", "features"}
    for name, service in services.items():
        assert "healthcheck" in service, name
        assert (ROOT / service["env_file"]).with_suffix(".env.example").exists() or \
            (ROOT / (service["env_file"] + ".example")).exists()
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]


@pytest.mark.parametrize("name", ["labels", "features"])
def test_commands_ports_and_dockerfiles_match_the_code(name):
    service = COMPOSE["services"][name]
    command = service["command"]
    assert command[0] == "labeldp"
    args = build_parser().parse_args(command[1:])  # raises on an unknown subcommand or option
    assert args.host == "0.0.0.0"  # inside its container; what leaves the compose network is "ports"
    # the labels party is published; the trainer is not unless the operator opts in (an override file)
    assert service.get("ports") == ([f"{args.port}:{args.port}"] if name == "labels" else None)
    assert args.upgrade_db
    assert f"127.0.0.1:{args.port}/healthz" in " ".join(service["healthcheck"]["test"])
    dockerfile = (ROOT / service["build"]["dockerfile"]).read_text()
    assert f"EXPOSE {args.port}" in dockerfile
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1)
    assert yaml.safe_load(cmd) == command
    copied = re.findall(r"^COPY (\S+)", dockerfile, re.M)
    assert all((ROOT / path).exists() for path in copied), copied
    party = f"{name}_party"  # one party's code and its own extra, nothing of the other party
    assert set(copied) == {"pyproject.toml", "shared", "labeldp", party}
    assert f'pip install --no-cache-dir ".[{name}]"' in dockerfile or (  # by default; the labels image may add spark
        f"ARG EXTRAS={name}\n" in dockerfile and 'pip install --no-cache-dir ".[$EXTRAS]"' in dockerfile)


def test_every_env_var_is_a_setting_and_credentials_agree():
    from labels_party.settings import LabelsSettings

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
    assert settings.labels_party_url(None) == ("labels", "http://labels:8700")  # the compose service
