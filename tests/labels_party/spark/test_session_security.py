"""The attack an outside review ran on the labels service's Spark driver: with no credentials, it fetched the
broadcast block holding a release's task closure — its secret — from the driver's block manager, which listened
unauthenticated on the host's external address, and recovered every true label from the released ones. The
service's sessions (shared/spark/session.py) authenticate and encrypt Spark's RPC and bind a local driver to
loopback: the same fetch gets nothing. The fetch is first shown to work against an unsecured driver (a separate
process: one SparkContext per process), so its failure here is the defense, not a broken attack.

Runtime: about 20 s (one extra JVM for the unsecured driver)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from shared.errors import LabelDPError
from shared.spark.security import security_conf
from tests.support.spark_blocks import fetch_block

SECRET = b"release-secret-0123456789abcdef!"  # 32 bytes, as a release's secret

UNSECURED_DRIVER = textwrap.dedent(f"""
    import json, sys
    from pyspark.sql import SparkSession
    from tests.support.spark_blocks import fetch_block
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    sc = spark.sparkContext
    shared = sc.broadcast({SECRET!r})
    sc.parallelize([0]).map(lambda _: len(shared.value)).collect()
    driver = sc._jsc.sc().statusTracker().getExecutorInfos()[0]  # local mode: the driver's block manager
    block = fetch_block(driver.host(), driver.port(), sc.applicationId, f"broadcast_{{shared._jbroadcast.id()}}_piece0")
    print(json.dumps({{"found": {SECRET!r} in block}}))
    spark.stop()
""")


def _block_manager(spark):
    """The driver's block manager (local mode: the only entry of the status tracker's executors)."""
    return spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()[0]


def test_the_fetch_reads_a_secret_off_an_unsecured_driver():
    done = subprocess.run([sys.executable, "-c", UNSECURED_DRIVER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"found": True}


def test_the_services_driver_hands_nothing_to_an_unauthenticated_fetch(spark):
    context = spark.sparkContext
    shared = context.broadcast(SECRET)
    assert context.parallelize([0]).map(lambda _: len(shared.value)).collect() == [32]
    manager = _block_manager(spark)
    assert manager.host() == "127.0.0.1"  # a local driver listens on loopback only
    block = f"broadcast_{shared._jbroadcast.id()}_piece0"
    with pytest.raises((EOFError, OSError, ValueError)):
        fetch_block(manager.host(), manager.port(), context.applicationId, block)
    conf = context.getConf()
    assert conf.get("spark.authenticate") == "true" and conf.get("spark.network.crypto.enabled") == "true"
    assert conf.get("spark.ui.enabled") == "false"


def test_a_cluster_master_without_the_shared_secret_is_refused():
    with pytest.raises(LabelDPError) as refused:
        security_conf("spark://spark-master:7077", None)
    assert refused.value.code == "spark_not_secured"
    assert security_conf("spark://spark-master:7077", "s3cret")["spark.authenticate.secret"] == "s3cret"
