"""How the labels service's Spark is secured, without importing PySpark (the service checks it at start; the
session applies it: :mod:`labels_party.spark.session` says why each setting is there)."""

from __future__ import annotations

from shared.errors import ErrorCode, LabelDPError


def security_conf(master: str, secret: str | None) -> dict[str, str]:
    """The settings that keep a release's secret on the driver and its executors: authenticated, encrypted RPC and
    spill files, no driver UI, a local driver on loopback; a cluster master needs the deployment's shared secret
    (``spark_not_secured`` otherwise)."""
    conf = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true",
            "spark.io.encryption.enabled": "true", "spark.ui.enabled": "false"}
    if master.startswith("local"):
        conf |= {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    elif not secret:
        raise LabelDPError(f"the Spark master {master} needs the deployment's shared authentication secret "
                           "(LABELDP_SPARK_SECRET_FILE, also read by the master and workers): without it a "
                           "release's secret would cross the network unauthenticated", code=ErrorCode.SPARK_NOT_SECURED)
    if secret:
        conf["spark.authenticate.secret"] = secret
    return conf
