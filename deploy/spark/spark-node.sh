#!/bin/sh
# Start a Spark standalone daemon (docker-compose.yml's spark-master and spark-workers): `spark-node.sh CLASS ARGS`.
# The daemons and the labels replicas' drivers share one authentication secret (made once by labels-init in the
# spark-keys volume); Spark reads it from spark-defaults.conf, so it is written into a private copy of this
# directory's file (mode 0600, in the container's own /tmp) — never onto a command line, where `ps` would show it.
set -eu
umask 077
secret_file=${LABELDP_SPARK_SECRET_FILE:?the Spark secret file}
conf=$(mktemp -d)
cp /etc/labeldp/spark/spark-defaults.conf "$conf/spark-defaults.conf"
printf 'spark.authenticate.secret %s\n' "$(cat "$secret_file")" >>"$conf/spark-defaults.conf"
export SPARK_CONF_DIR="$conf"
exec spark-class "$@"
