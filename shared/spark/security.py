"""How a service's Spark is secured, without importing PySpark (each service checks it at start; the session
applies it: :mod:`shared.spark.session` says why each setting is there)."""

from __future__ import annotations

from pathlib import Path

from shared.errors import ErrorCode, LabelDPError
from shared.service.keyfiles import read_private_file


def security_conf(master: str, secret: str | None) -> dict[str, str]:
    """The settings that keep what a job carries (a release's secret, privatized labels) between the driver and its
    executors: authenticated, encrypted RPC and spill files, no driver UI, a local driver on loopback; a cluster
    master needs the deployment's shared secret (``spark_not_secured`` otherwise)."""
    conf = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true",
            "spark.io.encryption.enabled": "true", "spark.ui.enabled": "false"}
    if master.startswith("local"):
        conf |= {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    elif not secret:
        raise LabelDPError(f"the Spark master {master} needs the deployment's shared authentication secret "
                           "(its spark_secret_file setting, also read by the master and workers): without it "
                           "a job's data would cross the network unauthenticated", code=ErrorCode.SPARK_NOT_SECURED)
    if secret:
        conf["spark.authenticate.secret"] = secret
    return conf


def spark_secret(master: str, secret_file: Path | None) -> str | None:
    """The cluster's shared authentication secret from ``secret_file``; a secret file that others may read, or a
    cluster master without one, is refused at start rather than at a job's first use of Spark."""
    secret = None
    if secret_file is not None:
        data = read_private_file(secret_file, what="the Spark secret file", code=ErrorCode.SPARK_NOT_SECURED)
        secret = data.decode().strip() if data is not None else None
        if not secret:
            raise LabelDPError("the Spark secret file (spark_secret_file) is missing or empty",
                               code=ErrorCode.SPARK_NOT_SECURED)
    security_conf(master, secret)  # the session's own rule
    return secret
