//! Starting (or finding) the broker, proving it ready, and removing it at exit.
//!
//! All Docker calls run on one small runtime owned by this module: each `#[tokio::test]`
//! has its own runtime, which is gone when that test ends, while the container is shared
//! by every test of the binary and must outlive any one of them.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use testcontainers::bollard::errors::Error::DockerResponseServerError;
use testcontainers::bollard::query_parameters::RenameContainerOptionsBuilder;
use testcontainers::core::{ContainerPort, ExecCommand, IntoContainerPort};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};
use tokio::sync::{Mutex, OnceCell};

use crate::DEFAULT_TIMEOUT;
use crate::client::{self, ClientOptions};
use crate::{Error, Isolation, OutgoingRecord, Record, Result};

/// A broker the tests can talk to.
#[derive(Debug)]
pub struct Kafka {
    pub(super) options: ClientOptions,
    pub(super) broker: Broker,
}

impl Kafka {
    /// A handle on a broker that is already running (nothing is started or checked).
    pub fn connect(bootstrap_servers: impl Into<String>) -> Kafka {
        Kafka::connect_with(bootstrap_servers, &[])
    }

    /// A handle on a broker that is already running whose clients (the producer of
    /// [`Kafka::produce`], the readers) are given `properties`, `compression.type` for one.
    pub fn connect_with(
        bootstrap_servers: impl Into<String>,
        properties: &[(&str, &str)],
    ) -> Kafka {
        let properties: Vec<(String, String)> = properties
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        Kafka {
            options: ClientOptions::with_properties(bootstrap_servers, &properties),
            broker: Broker::External,
        }
    }

    /// Whether `topic` exists.
    pub async fn topic_exists(&self, topic: &str) -> Result<bool> {
        Ok(
            client::partition_count(&self.options, topic, DEFAULT_TIMEOUT)
                .await?
                .is_some(),
        )
    }

    /// `host:port` to give clients as `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> &str {
        &self.options.bootstrap_servers
    }

    /// Creates a topic with `partitions` partitions and waits until each has a leader.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        self.create_topic_with(name, partitions, &[]).await
    }

    /// Creates a topic with topic-level `configs` (e.g. `("cleanup.policy", "compact")`).
    pub async fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> Result<()> {
        client::create_topic(&self.options, name, partitions, configs, DEFAULT_TIMEOUT).await
    }

    /// Sets topic-level configuration `name` = `value` on an existing topic (e.g. lower
    /// `max.message.bytes` under a running processor).
    pub async fn alter_topic_config(&self, topic: &str, name: &str, value: &str) -> Result<()> {
        client::alter_topic_config(&self.options, topic, name, value, DEFAULT_TIMEOUT).await
    }

    /// Writes records with an idempotent producer and returns where each landed
    /// (`(partition, offset)`, in order).
    pub async fn produce(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = OutgoingRecord>,
    ) -> Result<Vec<(i32, i64)>> {
        crate::write::produce(
            &self.options,
            topic,
            records.into_iter().collect(),
            DEFAULT_TIMEOUT,
        )
        .await
    }

    /// Reads `topic` from the beginning to its current end under `isolation`, in
    /// partition then offset order.
    pub async fn read_to_end(&self, topic: &str, isolation: Isolation) -> Result<Vec<Record>> {
        crate::read::read_to_end(&self.options, topic, isolation, DEFAULT_TIMEOUT).await
    }

    /// Each partition of `topic` with its last stable offset and high watermark: one
    /// whose last stable offset stays below its high watermark has a transaction open
    /// (or hanging) that every `read_committed` reader stops at.
    pub async fn stable_ends(&self, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>> {
        crate::read::stable_ends(&self.options, topic, DEFAULT_TIMEOUT).await
    }

    /// The offsets `group` has committed on each partition of `topic`.
    pub async fn committed_offsets(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<BTreeMap<i32, Option<i64>>> {
        crate::read::committed_offsets(&self.options, group, topic, DEFAULT_TIMEOUT).await
    }

    /// Bit rot on the broker's disk: overwrites the first byte of the first stored copy of
    /// `needle` (letters, digits, `-`, `_`, `.`) in the log of `topic`'s `partition`, so
    /// the batch holding it fails its CRC when read. Returns the byte's position in its
    /// segment. Only possible on a broker the testkit started.
    pub async fn corrupt(&self, topic: &str, partition: i32, needle: &str) -> Result<u64> {
        self.broker.corrupt(topic, partition, needle).await
    }

    /// Freezes the broker (every client request goes unanswered) until [`Kafka::unpause`].
    /// Only possible on a broker the testkit started.
    pub async fn pause(&self) -> Result<()> {
        self.broker.pause().await
    }

    /// Lets a paused broker go on.
    pub async fn unpause(&self) -> Result<()> {
        self.broker.unpause().await
    }

    /// `true` when the testkit started this broker (and so can pause it).
    pub fn is_managed(&self) -> bool {
        self.broker.is_managed()
    }

    /// The last `lines` lines the broker logged, for failure messages.
    pub async fn log_tail(&self, lines: usize) -> String {
        self.broker.log_tail(lines).await
    }

    /// Leaves the broker running when this process exits, instead of removing its
    /// container, so that later programs can use it (the quickstart's `--keep-broker`).
    /// The container is named `name`, and whoever keeps it removes it:
    /// `docker rm -f <name>`. It goes on advertising [`Kafka::bootstrap_servers`], a
    /// port on this machine. `Ok(None)` when the testkit did not start the broker.
    ///
    /// # Errors
    /// When the container cannot be named `name` (a container of that name exists, a
    /// broker kept earlier perhaps); it is then removed at exit as usual.
    pub async fn keep_running(&self, name: &str) -> Result<Option<KeptBroker>> {
        self.broker
            .keep_running(name, self.bootstrap_servers())
            .await
    }
}

/// The Apache Kafka version the tests run against.
pub const KAFKA_VERSION: &str = "4.1.1";
/// The official image of [`KAFKA_VERSION`].
pub const OFFICIAL_IMAGE: &str = "apache/kafka:4.1.1";
/// The equivalent image `docker/kafka/build.sh` builds where images cannot be pulled.
pub const LOCAL_IMAGE: &str = "onceflow/kafka:4.1.1-local";

/// Port the broker listens on for clients, inside the container.
const CLIENT_PORT: u16 = 9092;
/// Port of the inter-broker listener, advertised as `localhost` and so usable only inside
/// the container.
const INTER_BROKER_PORT: u16 = 9094;
/// Topic the readiness probe writes to.
const PROBE_TOPIC: &str = "__onceflow_ready";
/// How long a started broker may take to answer, unless `ONCEFLOW_TEST_BROKER_TIMEOUT`
/// (seconds) says otherwise.
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(120);

pub(super) static DOCKER: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("onceflow-testkit-docker")
        .enable_all()
        .build()
        .expect("the testkit's Docker runtime could not be built")
});

/// The started containers (the plain broker, and the secured one of `secure.rs` when a
/// test asks for it), removed at process exit.
static CONTAINERS: Mutex<Vec<ContainerAsync<GenericImage>>> = Mutex::const_new(Vec::new());

fn find<'a>(
    containers: &'a [ContainerAsync<GenericImage>],
    id: &str,
) -> Option<&'a ContainerAsync<GenericImage>> {
    containers.iter().find(|container| container.id() == id)
}

/// The IDs of started containers to leave running at exit ([`Kafka::keep_running`]).
static KEPT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A broker the testkit started and leaves running when the process exits (see
/// [`Kafka::keep_running`]): where to reach it and how to remove it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeptBroker {
    /// The container's name: `docker rm -f <container>` removes it.
    pub container: String,
    /// `host:port` for clients on this machine, which the broker advertises to them.
    pub bootstrap_servers: String,
    /// `host:port` for clients inside the container (`docker exec <container> …`), such as
    /// the command-line tools of the official image: the host's port does not answer there.
    pub inside_bootstrap_servers: String,
}

static SHARED: OnceCell<std::result::Result<Kafka, String>> = OnceCell::const_new();

/// The broker shared by every test of this binary, started on first use.
///
/// # Panics
/// When no broker can be started or reached; the message says why and, for a started
/// container, ends with its log.
pub async fn kafka() -> &'static Kafka {
    shared(&SHARED, start, "no Kafka broker for the tests").await
}

/// The value in `cell`, made by `start` on first use; a failure is kept (so every test of
/// the binary fails the same way, at once) and panics with `what` and the reason.
pub(super) async fn shared<T, F>(
    cell: &'static OnceCell<std::result::Result<T, String>>,
    start: impl FnOnce() -> F,
    what: &str,
) -> &'static T
where
    F: Future<Output = Result<T>>,
{
    let result = cell
        .get_or_init(|| async { start().await.map_err(|e| e.to_string()) })
        .await;
    match result {
        Ok(value) => value,
        Err(message) => panic!("{what}: {message}"),
    }
}

#[derive(Debug)]
pub(super) enum Broker {
    /// Reached through `ONCEFLOW_TEST_BOOTSTRAP`; not ours to pause or stop.
    External,
    /// Started by the testkit.
    Container { id: String },
}

impl Broker {
    pub(super) fn is_managed(&self) -> bool {
        matches!(self, Broker::Container { .. })
    }

    pub(super) async fn pause(&self) -> Result<()> {
        self.set_paused(true).await
    }

    pub(super) async fn unpause(&self) -> Result<()> {
        self.set_paused(false).await
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        let what = if paused { "pause" } else { "unpause" };
        let Broker::Container { id } = self else {
            return Err(Error::Environment(format!(
                "cannot {what} a broker reached through ONCEFLOW_TEST_BOOTSTRAP"
            )));
        };
        let id = id.clone();
        DOCKER
            .spawn(async move {
                let guard = CONTAINERS.lock().await;
                let container = find(&guard, &id)
                    .ok_or_else(|| Error::Environment(format!("{what}: the container is gone")))?;
                let result = if paused {
                    super::pause_with_retries(|| container.pause(), || container.unpause()).await
                } else {
                    container.unpause().await
                };
                result.map_err(|e| Error::Environment(format!("{what}: {e}")))
            })
            .await
            .map_err(|e| Error::Environment(format!("{what}: {e}")))?
    }

    /// Overwrites the first byte of the first stored copy of `needle` in `topic`'s
    /// `partition` log on the broker's disk (through the page cache the broker reads and
    /// sends from), and returns that byte's position in the segment.
    pub(super) async fn corrupt(&self, topic: &str, partition: i32, needle: &str) -> Result<u64> {
        let Broker::Container { id } = self else {
            return Err(Error::Environment(
                "cannot corrupt the log of a broker reached through ONCEFLOW_TEST_BOOTSTRAP".into(),
            ));
        };
        let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if !topic.chars().all(ok) || needle.is_empty() || !needle.chars().all(ok) {
            return Err(Error::Environment(format!(
                "corrupt: `{topic}` and `{needle}` must be letters, digits, `-`, `_`, `.`"
            )));
        }
        // The segment holding the first copy; a byte that differs from the needle's first.
        let script = format!(
            "set -e; for f in /var/lib/kafka/data/{topic}-{partition}/*.log; do \
               at=$(grep -obUa -m1 '{needle}' \"$f\" | head -n1 | cut -d: -f1); \
               if [ -n \"$at\" ]; then \
                 printf '#' | dd of=\"$f\" bs=1 seek=\"$at\" count=1 conv=notrunc 2>/dev/null; \
                 echo \"onceflow-corrupted=$at\"; exit 0; \
               fi; \
             done; echo onceflow-not-found"
        );
        let command = vec!["sh".to_owned(), "-c".to_owned(), script];
        let id = id.clone();
        let output = DOCKER
            .spawn(async move { exec(&id, command).await })
            .await
            .map_err(|e| Error::Environment(format!("corrupt: {e}")))??;
        output
            .lines()
            .find_map(|line| line.strip_prefix("onceflow-corrupted="))
            .and_then(|at| at.trim().parse().ok())
            .ok_or_else(|| {
                Error::Environment(format!(
                    "corrupt: `{needle}` not found in the log of `{topic}` [{partition}]: {output}"
                ))
            })
    }

    /// Names the container `name` and leaves it running at exit; `None` for a broker
    /// reached through `ONCEFLOW_TEST_BOOTSTRAP`, which was never ours to remove.
    pub(super) async fn keep_running(
        &self,
        name: &str,
        bootstrap_servers: &str,
    ) -> Result<Option<KeptBroker>> {
        let Broker::Container { id } = self else {
            return Ok(None);
        };
        let (id, new_name) = (id.clone(), name.to_owned());
        DOCKER
            .spawn(async move {
                let guard = CONTAINERS.lock().await;
                find(&guard, &id).ok_or_else(|| {
                    Error::Environment(format!("keep running: container {id} is gone"))
                })?;
                let docker =
                    testcontainers::bollard::Docker::connect_with_defaults().map_err(|e| {
                        Error::Environment(format!("keep running: no Docker engine: {e}"))
                    })?;
                let options = RenameContainerOptionsBuilder::new().name(&new_name).build();
                docker
                    .rename_container(&id, options)
                    .await
                    .map_err(|error| match error {
                        DockerResponseServerError {
                            status_code: 409, ..
                        } => Error::Environment(format!(
                            "keep running: a container named `{new_name}` exists already (a \
                             broker kept earlier?): use it, or remove it with `docker rm -f \
                             {new_name}`"
                        )),
                        error => Error::Environment(format!(
                            "keep running: cannot name container {id} `{new_name}`: {error}"
                        )),
                    })?;
                KEPT.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(id);
                Ok::<(), Error>(())
            })
            .await
            .map_err(|e| Error::Environment(format!("keep running: {e}")))??;
        Ok(Some(KeptBroker {
            container: name.to_owned(),
            bootstrap_servers: bootstrap_servers.to_owned(),
            // The inter-broker listener of `single_node`, advertised as itself.
            inside_bootstrap_servers: format!("localhost:{INTER_BROKER_PORT}"),
        }))
    }

    pub(super) async fn log_tail(&self, lines: usize) -> String {
        match self {
            Broker::External => "(the broker was not started by the testkit: no log)".into(),
            Broker::Container { id } => {
                let id = id.clone();
                DOCKER
                    .spawn(async move {
                        let guard = CONTAINERS.lock().await;
                        match find(&guard, &id) {
                            Some(container) => container_log_tail(container, lines).await,
                            None => format!("(container {id} is gone)"),
                        }
                    })
                    .await
                    .unwrap_or_else(|e| format!("(log not available: {e})"))
            }
        }
    }
}

async fn start() -> Result<Kafka> {
    let timeout = ready_timeout()?;
    if let Ok(bootstrap) = std::env::var("ONCEFLOW_TEST_BOOTSTRAP") {
        let kafka = Kafka {
            options: ClientOptions::new(bootstrap),
            broker: Broker::External,
        };
        wait_ready(&kafka, timeout).await?;
        return Ok(kafka);
    }
    let (id, port) = DOCKER
        .spawn(start_container())
        .await
        .map_err(|e| Error::Environment(format!("starting the container: {e}")))??;
    // The container maps the port on every host address; 127.0.0.1 is the one that works
    // everywhere, including inside a container where testcontainers would pick the bridge.
    let kafka = Kafka {
        options: ClientOptions::new(format!("127.0.0.1:{port}")),
        broker: Broker::Container { id },
    };
    wait_ready(&kafka, timeout).await?;
    Ok(kafka)
}

pub(super) fn ready_timeout() -> Result<Duration> {
    match std::env::var("ONCEFLOW_TEST_BROKER_TIMEOUT") {
        Err(_) => Ok(DEFAULT_READY_TIMEOUT),
        Ok(seconds) => seconds
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| {
                Error::Environment(format!(
                    "ONCEFLOW_TEST_BROKER_TIMEOUT=`{seconds}`: a whole number of seconds is needed"
                ))
            }),
    }
}

/// Polls the broker (create the probe topic, read metadata, write a record) until it
/// answers or `timeout` passes; the error then says what was seen and shows the log.
pub(super) async fn wait_ready(kafka: &Kafka, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let attempt_timeout = Duration::from_secs(5);
    let mut last_error;
    loop {
        let attempt = async {
            match client::create_topic(&kafka.options, PROBE_TOPIC, 1, &[], attempt_timeout).await {
                Err(error)
                    if error.code()
                        == Some(rdkafka::error::RDKafkaErrorCode::TopicAlreadyExists) => {}
                other => other?,
            }
            client::probe(&kafka.options, PROBE_TOPIC, attempt_timeout).await
        };
        match attempt.await {
            Ok(()) => {
                tracing::info!(bootstrap = kafka.bootstrap_servers(), after = ?started.elapsed(), "test broker ready");
                return Ok(());
            }
            Err(error) => last_error = error.to_string(),
        }
        if !kafka.broker.is_running().await {
            return Err(Error::Environment(format!(
                "the Kafka container exited before it was ready (last probe: {last_error})\n\
                 --- broker log (last 60 lines) ---\n{}",
                kafka.log_tail(60).await
            )));
        }
        if started.elapsed() >= timeout {
            return Err(Error::Environment(format!(
                "Kafka at {} did not become ready within {timeout:?} (last probe: {last_error})\n\
                 --- broker log (last 60 lines) ---\n{}",
                kafka.bootstrap_servers(),
                kafka.log_tail(60).await
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl Broker {
    /// Whether the broker's container still runs (an external broker is assumed to).
    async fn is_running(&self) -> bool {
        let Broker::Container { id } = self else {
            return true;
        };
        let id = id.clone();
        DOCKER
            .spawn(async move {
                let guard = CONTAINERS.lock().await;
                match find(&guard, &id) {
                    Some(container) => container.is_running().await.unwrap_or(false),
                    None => false,
                }
            })
            .await
            .unwrap_or(false)
    }
}

/// The image to run: `ONCEFLOW_KAFKA_IMAGE`, else the local build if present, else the
/// official image.
pub(super) async fn choose_image() -> String {
    if let Ok(image) = std::env::var("ONCEFLOW_KAFKA_IMAGE") {
        return image;
    }
    let local_exists = match testcontainers::bollard::Docker::connect_with_defaults() {
        Ok(docker) => docker.inspect_image(LOCAL_IMAGE).await.is_ok(),
        Err(_) => false,
    };
    if local_exists {
        LOCAL_IMAGE.to_owned()
    } else {
        OFFICIAL_IMAGE.to_owned()
    }
}

/// Splits `name[:tag]`, where the name may hold a registry port (`host:5000/kafka:4.1.1`).
pub(super) fn split_image(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (image, "latest"),
    }
}

/// Starts the container and returns its ID and the host port clients connect to.
async fn start_container() -> Result<(String, u16)> {
    let image = choose_image().await;
    let started = start_with_ports(&image, |[port]| {
        single_node(&image, "broker")
            .with_mapped_port(port, ContainerPort::Tcp(CLIENT_PORT))
            .with_env_var(
                "KAFKA_LISTENERS",
                "PLAINTEXT://:9092,CONTROLLER://:9093,BROKER://:9094",
            )
            .with_env_var(
                "KAFKA_ADVERTISED_LISTENERS",
                format!("PLAINTEXT://127.0.0.1:{port},BROKER://localhost:9094"),
            )
            .with_env_var(
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,BROKER:PLAINTEXT",
            )
    })
    .await;
    match started {
        Ok((id, [port])) => Ok((id, port)),
        Err(last_error) => Err(Error::Environment(format!(
            "could not start a Kafka container from `{image}`: {last_error}\n\
             Is the Docker engine running? Where images cannot be pulled, build the local one with \
             `docker/kafka/build.sh` (it is then used automatically) or point ONCEFLOW_KAFKA_IMAGE \
             at one you have; ONCEFLOW_TEST_BOOTSTRAP=host:port uses a running broker instead."
        ))),
    }
}

/// A single combined broker and controller (node 1, controller on :9093, inter-broker
/// listener `BROKER` on :9094) with what transactions need on one node; the caller adds
/// its client listeners (the first on :9092, which is exposed). `label` tells the testkit's
/// containers apart; `ONCEFLOW_TEST_RUN`, when set, names the run they belong to (label
/// `dev.onceflow.run`), so a run's clean-up removes its own containers and not those of
/// another run on the same machine.
pub(super) fn single_node(image: &str, label: &str) -> ContainerRequest<GenericImage> {
    let (name, tag) = split_image(image);
    let run = std::env::var("ONCEFLOW_TEST_RUN").unwrap_or_default();
    GenericImage::new(name, tag)
        .with_exposed_port(CLIENT_PORT.tcp())
        .with_label("dev.onceflow.testkit", label)
        .with_label("dev.onceflow.run", run)
        .with_env_var("CLUSTER_ID", "b25jZWZsb3ctdGVzdGtpdA")
        .with_env_var("KAFKA_NODE_ID", "1")
        .with_env_var("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env_var("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env_var("KAFKA_INTER_BROKER_LISTENER_NAME", "BROKER")
        .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env_var("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env_var("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "4")
        // Transactions on a single broker need both of these at 1: the transaction state log
        // cannot be created with more replicas than brokers.
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "4")
        .with_env_var("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        // A frozen broker (`Kafka::pause`, 10 s in the hung-commit test) must come back as
        // the same broker: past the default 9 s session its own controller fenced it on
        // resume ("Fencing broker 1 ... because its session has timed out"), moving every
        // partition's leadership, a second fault the tests did not ask for.
        .with_env_var("KAFKA_BROKER_SESSION_TIMEOUT_MS", "60000")
        // A missing topic must be an error the tests can see, not a silent creation.
        .with_env_var("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_env_var("KAFKA_HEAP_OPTS", "-Xmx768m -Xms256m")
        .with_startup_timeout(Duration::from_secs(300))
}

/// Starts the container `request` builds for `N` free host ports, keeps it until exit, and
/// returns its ID and the ports. The ports must be known before start, because the broker
/// advertises them; a port taken between choosing and binding is retried with others.
pub(super) async fn start_with_ports<const N: usize>(
    image: &str,
    request: impl Fn([u16; N]) -> ContainerRequest<GenericImage>,
) -> std::result::Result<(String, [u16; N]), String> {
    let mut last_error = format!("no attempt to start `{image}`");
    for _ in 0..3 {
        let mut ports = [0; N];
        for port in &mut ports {
            *port = free_port().map_err(|e| e.to_string())?;
        }
        match request(ports).start().await {
            Ok(container) => return Ok((keep_until_exit(container).await, ports)),
            Err(error) => {
                last_error = error.to_string();
                if !last_error.contains("port is already allocated")
                    && !last_error.contains("address already in use")
                {
                    break;
                }
            }
        }
    }
    Err(last_error)
}

/// Directories the testkit made (the secured broker's certificates), removed at exit.
static TEMPORARY_DIRS: Mutex<Vec<std::path::PathBuf>> = Mutex::const_new(Vec::new());

/// Removes `dir` when the process exits.
pub(super) async fn remove_at_exit(dir: std::path::PathBuf) {
    TEMPORARY_DIRS.lock().await.push(dir);
    register_removal_at_exit();
}

/// Runs `command` in the started container `id` and returns its standard output (an exit
/// status is for the command to print: `ExecResult::exit_code` borrows across an await
/// what cannot be shared between threads). Call it on [`DOCKER`].
pub(super) async fn exec(id: &str, command: Vec<String>) -> Result<String> {
    let guard = CONTAINERS.lock().await;
    let container =
        find(&guard, id).ok_or_else(|| Error::Environment(format!("container {id} is gone")))?;
    let mut result = container
        .exec(ExecCommand::new(command))
        .await
        .map_err(|e| Error::Environment(format!("running a command in container {id}: {e}")))?;
    let stdout = result.stdout_to_vec().await.unwrap_or_default();
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// Keeps `container` (so tests can pause it or read its log) and removes it at process
/// exit; returns its ID.
pub(super) async fn keep_until_exit(container: ContainerAsync<GenericImage>) -> String {
    let id = container.id().to_owned();
    CONTAINERS.lock().await.push(container);
    register_removal_at_exit();
    id
}

pub(super) fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Environment(format!("no free local port for the broker: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::Environment(e.to_string()))
}

async fn container_log_tail(container: &ContainerAsync<GenericImage>, lines: usize) -> String {
    let mut text =
        String::from_utf8_lossy(&container.stdout_to_vec().await.unwrap_or_default()).into_owned();
    text.push_str(&String::from_utf8_lossy(
        &container.stderr_to_vec().await.unwrap_or_default(),
    ));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Statics are never dropped, so the containers would outlive the test binary (and the
/// certificates stay in the temporary directory): remove them when the process exits.
fn register_removal_at_exit() {
    extern "C" fn remove_container() {
        // On a thread of its own: when `main` returns (rather than the test harness
        // calling `exit`), the main thread's thread-locals, tokio's among them, are
        // already gone by the time exit handlers run.
        let _ = std::panic::catch_unwind(|| {
            let removal = std::thread::spawn(|| {
                DOCKER.block_on(async {
                    let kept = KEPT
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    let mut containers = CONTAINERS.lock().await;
                    // A kept container's handle stays in the static, which is never dropped:
                    // its drop would remove the container too.
                    let (keep, remove): (Vec<_>, Vec<_>) = std::mem::take(&mut *containers)
                        .into_iter()
                        .partition(|container| kept.iter().any(|id| id == container.id()));
                    *containers = keep;
                    drop(containers);
                    for container in remove {
                        let _ = container.rm().await;
                    }
                    for dir in TEMPORARY_DIRS.lock().await.drain(..) {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                });
            });
            let _ = removal.join();
        });
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `remove_container` is a plain `extern "C" fn()` that catches every panic,
        // as `atexit` requires of its handlers.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(remove_container);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::split_image;

    #[test]
    fn image_references_split_at_the_tag_not_the_registry_port() {
        assert_eq!(split_image("apache/kafka:4.1.1"), ("apache/kafka", "4.1.1"));
        assert_eq!(
            split_image("registry:5000/kafka:4.1.1"),
            ("registry:5000/kafka", "4.1.1")
        );
        assert_eq!(
            split_image("registry:5000/kafka"),
            ("registry:5000/kafka", "latest")
        );
        assert_eq!(split_image("kafka"), ("kafka", "latest"));
    }
}
