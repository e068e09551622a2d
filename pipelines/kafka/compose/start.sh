#!/bin/bash
# Start Kafka in docker-compose.yml with SASL_SSL + SCRAM: the passwords come from Docker secrets and never
# reach a command line or the log (a java argument file and the runtime properties are 0600 in /tmp).
set -euo pipefail
umask 077
secret() { tr -d '\n' < "/run/secrets/$1"; }
runtime=/tmp/server.properties
cp /etc/kafka/fleetsight/server.properties "$runtime"
{
  echo "advertised.listeners=INTERNAL://kafka:9092,EXTERNAL://${FLEETSIGHT_KAFKA_EXTERNAL_HOST}:19092"
  # The broker's own SCRAM login on the inter-broker listener.
  echo "listener.name.internal.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"fleetsight-admin\" password=\"$(secret kafka-admin-password)\";"
} >> "$runtime"
# The healthcheck's client: the admin over the internal listener.
cat > /tmp/admin-client.properties <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
ssl.truststore.type=PEM
ssl.truststore.location=/run/secrets/kafka-ca.pem
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="fleetsight-admin" password="$(secret kafka-admin-password)";
PROPS
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  # First start: the KRaft storage, with the three SCRAM users (pipelines/kafka/acls.yaml says what each may do).
  {
    for user in admin node shipper; do
      echo "--add-scram"
      echo "\"SCRAM-SHA-512=[name=fleetsight-$user,password=$(secret kafka-$user-password)]\""
    done
  } > /tmp/scram.args
  /opt/kafka/bin/kafka-storage.sh format -t "$CLUSTER_ID" -c "$runtime" @/tmp/scram.args
  rm -f /tmp/scram.args
fi
exec /opt/kafka/bin/kafka-server-start.sh "$runtime"
