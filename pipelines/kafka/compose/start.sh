#!/bin/bash
# Start Kafka in docker-compose.yml with SASL_SSL + SCRAM: the passwords come from Docker secrets and never
# reach a command line or the log (a java argument file and the runtime properties are 0600 in /tmp).
set -euo pipefail
umask 077
# Where the image has things; overridable so that tests/pipelines/test_production_security.py runs this
# script for real against the Kafka jars of `fleetsight setup`.
home=${FLEETSIGHT_KAFKA_HOME:-/opt/kafka}
secrets=${FLEETSIGHT_KAFKA_SECRETS:-/run/secrets}
conf=${FLEETSIGHT_KAFKA_CONF:-/etc/kafka/fleetsight}
tmp=${FLEETSIGHT_KAFKA_TMP:-/tmp}
secret() { tr -d '\n' < "$secrets/$1"; }
runtime=$tmp/server.properties
sed "s|/run/secrets/|$secrets/|g" "$conf/server.properties" > "$runtime"
data=$(sed -n 's/^log.dirs=//p' "$runtime")
{
  echo "advertised.listeners=INTERNAL://kafka:9092,EXTERNAL://${FLEETSIGHT_KAFKA_EXTERNAL_HOST}:19092"
  # The broker's own SCRAM login on the inter-broker listener.
  echo "listener.name.internal.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"fleetsight-admin\" password=\"$(secret kafka-admin-password)\";"
} >> "$runtime"
# The healthcheck's client: the admin over the internal listener.
cat > "$tmp/admin-client.properties" <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
ssl.truststore.type=PEM
ssl.truststore.location=$secrets/kafka-ca.pem
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="fleetsight-admin" password="$(secret kafka-admin-password)";
PROPS
if [ ! -f "$data/meta.properties" ]; then
  # First start: the KRaft storage, with the three SCRAM users (pipelines/kafka/acls.yaml says what each
  # may do). StorageTool reads "@FILE" itself, one argument per line, quotes kept: so none here.
  {
    for user in admin node shipper; do
      echo "--add-scram"
      echo "SCRAM-SHA-512=[name=fleetsight-$user,password=$(secret kafka-$user-password)]"
    done
  } > "$tmp/scram.args"
  "$home/bin/kafka-storage.sh" format -t "$CLUSTER_ID" -c "$runtime" "@$tmp/scram.args"
  rm -f "$tmp/scram.args"
fi
exec "$home/bin/kafka-server-start.sh" "$runtime"
