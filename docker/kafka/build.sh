#!/usr/bin/env bash
# Builds the local Apache Kafka image the tests use when images cannot be pulled:
#   1. a Debian base made with `debootstrap --variant=minbase`, imported with `docker import`;
#   2. the pinned Kafka release jars and a log4j2 backend, fetched by Maven (pom.xml);
#   3. `docker build --network host` with a Java runtime from Debian's packages.
# Each step does nothing when its result exists, so a second run returns at once.
#
# Usage: docker/kafka/build.sh            builds onceflow/kafka:$KAFKA_VERSION-local
#        KAFKA_IMAGE_REBUILD=1 build.sh   rebuilds the Kafka image (not the base)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_tag="onceflow/debian-base:$suite"
image_tag="onceflow/kafka:${kafka_version}-local"

log() { printf '[kafka-image] %s\n' "$*" >&2; }

if docker image inspect "$image_tag" >/dev/null 2>&1 && [ -z "${KAFKA_IMAGE_REBUILD:-}" ]; then
  log "$image_tag exists; nothing to do"
  echo "$image_tag"
  exit 0
fi

started=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! docker image inspect "$base_tag" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { log "debootstrap is missing: apt-get install debootstrap"; exit 1; }
  log "debootstrap --variant=minbase $suite (a few minutes)"
  debootstrap --variant=minbase "$suite" "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  # The apt lists and caches only make the image larger.
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . | docker import - "$base_tag" >/dev/null
  rm -rf "$work/rootfs"
  log "imported $base_tag"
fi

log "fetching Apache Kafka $kafka_version jars with Maven"
mkdir -p "$work/context/libs"
mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$work/context/libs"
cp "$here/Dockerfile" "$here/entrypoint.sh" "$here/log4j2.properties" "$work/context/"

log "docker build $image_tag"
docker build --network host --build-arg "BASE_IMAGE=$base_tag" \
  --label "org.apache.kafka.version=$kafka_version" -t "$image_tag" "$work/context" \
  > "$work/docker-build.log" 2>&1 || { tail -n 40 "$work/docker-build.log" >&2; exit 1; }
log "built $image_tag in $(( $(date +%s) - started ))s"
echo "$image_tag"
