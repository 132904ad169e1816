"""cdcd.spark on a Spark standalone cluster (the stack's `spark-cluster`: a master and one worker on 127.0.0.1),
submitted with spark-submit as in production — `--master spark://...`, the jars with `--jars`, cdcd as a zip
with `--py-files` — never in local mode. The job is killed mid-stream after a committed micro-batch and
submitted again; the Delta mirror must then equal the source. Checkpoint and tables live in a local directory:
on one machine that is the cluster's shared storage. PostgreSQL 15 only, a small workload (Spark is slow)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from tests.integration import test_spark
from tests.integration.conftest import ROOT, STACK, cdcd_env
from tests.integration.kafka_harness import Run
from tests.integration.test_spark import assert_mirrors_equal, first_part, second_part, wait_for_commit
from tests.procs import spawn

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]  # one worker: see conftest.py
# test_spark's fixtures: the stack's jars, a local session (only to read the mirror), a cdcd run on its schema
env15, spark, run15 = test_spark.env15, test_spark.spark, test_spark.run15

SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"
LOOPBACK = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}  # executors connect to it
QUICK_JIT = test_spark.QUICK_JIT  # the job's JVMs (each driver, its executor): C1 only


@pytest.fixture(scope="module")
def cluster(env15: dict[str, str]) -> None:
    """The stack's Spark cluster up (the pyspark it runs, and its executors' Python, are this test's)."""
    subprocess.run(
        [str(STACK), "up", "spark-cluster"], check=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable}
    )


def submit(run: Run, tmp_path: Path, log: Path, *job_args: str) -> subprocess.Popen[bytes]:
    """spark-submit of `python -m cdcd.spark`'s script to the cluster (client mode: the driver runs here)."""
    package = tmp_path / "cdcd.zip"
    if not package.exists():
        shutil.make_archive(str(package.with_suffix("")), "zip", ROOT, "cdcd")
    jars = sorted(Path(run.env["CDCD_SPARK_JARS"]).glob("*.jar"))
    loopback = [arg for key, value in LOOPBACK.items() for arg in ("--conf", f"{key}={value}")]
    spark_args = ["--master", run.env["STACK_SPARK_MASTER"], "--deploy-mode", "client", *loopback]
    spark_args += ["--jars", ",".join(map(str, jars)), "--py-files", str(package), "--driver-memory", "1g"]
    spark_args += ["--executor-memory", "1g", "--total-executor-cores", "2", "--conf", "spark.ui.enabled=false"]
    spark_args += ["--conf", "spark.sql.shuffle.partitions=2"]
    for side in ("driver", "executor"):
        spark_args += ["--conf", f"spark.{side}.extraJavaOptions={QUICK_JIT}"]
    job = ["--topic-prefix", run.prefix, "--bootstrap-servers", run.env["CDCD_KAFKA__BOOTSTRAP_SERVERS"]]
    job += ["--registry-url", run.env["CDCD_SCHEMA_REGISTRY__URL"], "--key", "public.audit=id"]
    job += ["--checkpoint", str(tmp_path / "checkpoint"), "--mirror", str(tmp_path / "mirror"), *job_args]
    command = [str(SPARK_SUBMIT), *spark_args, str(ROOT / "cdcd" / "spark" / "__main__.py"), *job]
    # Only spark-submit's settings: no CDCD_SPARK_JARS (spark.jars) nor other cdcd settings from this shell.
    env = cdcd_env()
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    with log.open("ab") as out:
        return spawn(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.usefixtures("cluster")
def test_mirror_on_a_cluster_equals_source_across_a_killed_job(spark: SparkSession, run15: Run, tmp_path: Path) -> None:
    db = run15.db
    run15.start()
    first_part(db)
    second_part(db)  # a schema change and a truncate among them
    events = run15.sync()
    tables = sum(1 for e in events if e.topic.startswith(f"{run15.prefix}.") and e.topic.count(".") == 2)
    logs = [tmp_path / "first-job.log", tmp_path / "second-job.log"]

    # Two micro-batches' worth; killed (driver and all) once the first is committed, while the second runs.
    cap = str(tables // 2 + 1)
    job = submit(run15, tmp_path, logs[0], "--max-offsets-per-trigger", cap, "--trigger-interval", "0 seconds")
    try:
        wait_for_commit(tmp_path / "checkpoint", -1, job, logs[0], timeout=600)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    assert not (tmp_path / "checkpoint" / "commits" / "1").exists(), "killed too late: nothing left to replay"

    # Submitted again: resumes from the checkpoint (the second batch again), processes what Kafka holds, exits.
    job = submit(run15, tmp_path, logs[1], "--available-now")
    try:
        assert job.wait(timeout=600) == 0, logs[1].read_text()[-5000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    for log in logs:
        assert "Granted executor ID" in log.read_text(), f"no executor of the cluster in {log.name}"
    assert_mirrors_equal(spark, db, tmp_path / "mirror")
