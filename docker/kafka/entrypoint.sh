#!/bin/sh
# Formats KRaft storage and starts the broker in the foreground, logging to stdout.
#
# Configuration follows the official apache/kafka image: every environment variable
# KAFKA_FOO_BAR becomes the property foo.bar (`___` stands for `-`, `__` for `_`), and
# CLUSTER_ID names the cluster. Without any KAFKA_* setting, a single combined
# broker+controller on localhost:9092 starts, as the official image does.
set -eu

config=/opt/kafka/config/server.properties
data_dir=/var/lib/kafka/data

# Variables the image's own launcher reads rather than the broker.
is_launcher_var() {
  case "$1" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_GC_LOG_OPTS|KAFKA_LOG4J_OPTS|KAFKA_JMX_OPTS|KAFKA_LOG_LEVEL|KAFKA_VERSION) return 0 ;;
    *) return 1 ;;
  esac
}

: > "$config"
seen_any=no
# `env` output may contain multi-line values; only NAME=... lines of KAFKA_ vars matter.
for name in $(env | sed -n 's/^\(KAFKA_[A-Z0-9_]*\)=.*/\1/p' | sort -u); do
  is_launcher_var "$name" && continue
  value=$(printenv "$name")
  key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
  printf '%s=%s\n' "$key" "$value" >> "$config"
  seen_any=yes
done

if [ "$seen_any" = no ]; then
  cat > "$config" <<PROPS
node.id=1
process.roles=broker,controller
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
advertised.listeners=PLAINTEXT://localhost:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.quorum.voters=1@localhost:9093
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
fi
grep -q '^log\.dirs=' "$config" || printf 'log.dirs=%s\n' "$data_dir" >> "$config"

echo "onceflow-kafka: broker configuration:"
sed 's/^\(.*password.*=\).*/\1[redacted]/' "$config"

cluster_id=${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}
classpath='/opt/kafka/libs/*'
log4j="-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties"
heap=${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m}

# With a static quorum (controller.quorum.voters) the storage is formatted as is; with
# only bootstrap servers it is a standalone dynamic quorum.
format_mode=""
grep -q '^controller\.quorum\.voters=' "$config" || format_mode="--standalone"
if [ ! -f "$data_dir/meta.properties" ]; then
  # shellcheck disable=SC2086
  java $heap $log4j -cp "$classpath" kafka.tools.StorageTool format \
    --config "$config" --cluster-id "$cluster_id" --ignore-formatted $format_mode
fi

# shellcheck disable=SC2086
exec java $heap ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true} \
  $log4j ${KAFKA_OPTS:-} -cp "$classpath" kafka.Kafka "$config"
