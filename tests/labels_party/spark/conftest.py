"""One SparkSession for the Spark tests: master ``local[2,4]`` — two cores, and a task may fail up to 4 times before
its job fails (in local mode only the master string sets task retries; a cluster retries 4 times by default), which
the retry test needs. One JVM for the whole run: a second SparkContext cannot start while one is running."""

from __future__ import annotations

import os
import shutil

import pytest
from pyspark import cloudpickle

from shared.spark.session import spark_session
from tests.labels_party.spark import samplers


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs a Java runtime: `make java` installs Debian's openjdk-17-jre-headless")
    cloudpickle.register_pickle_by_value(samplers)
    session = spark_session("local[2,4]", app_name="labeldp-tests", conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"})
    yield session
    session.stop()
