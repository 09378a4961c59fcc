//! A three-node KRaft cluster on its own Docker network, from the same image as the single
//! broker, with the faults a test can cause: kill a node (SIGKILL) and start it again with
//! its data, restart it cleanly, pause it, cut it off the network or off its peers only;
//! and where to aim them:
//! the leader of a partition, the transaction coordinator of a transactional ID, the
//! group coordinator of a group.
//!
//! Every node is broker and controller; each has its host port mapped and advertised, so
//! clients on the host reach every node. Topics default to three replicas and
//! `min.insync.replicas=2`, the transaction state log likewise: one node down is a fault
//! the cluster survives, as production clusters do.

use std::time::{Duration, Instant};

use testcontainers::ImageExt;
use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{NetworkConnectRequest, NetworkDisconnectRequest};
use testcontainers::bollard::query_parameters::{
    InspectContainerOptions, KillContainerOptions, LogsOptionsBuilder, StartContainerOptions,
    StopContainerOptions,
};
use testcontainers::core::ContainerPort;
use tokio::sync::OnceCell;

use super::Kafka;
use super::broker::{self, Broker, DOCKER};
use crate::client::{self, ClientOptions};
use crate::{Error, Result};

/// Partitions of `__transaction_state` and `__consumer_offsets` in the cluster (the
/// coordinator of an ID is the leader of the partition its hash picks).
const COORDINATOR_PARTITIONS: i32 = 4;
/// How long a node may take to come back or the cluster to heal.
const HEAL_TIMEOUT: Duration = Duration::from_secs(120);

/// One node of a [`Cluster`].
#[derive(Debug, Clone)]
struct Node {
    id: i32,
    container: String,
    port: u16,
}

/// A cluster of Kafka nodes the tests can break.
#[derive(Debug)]
pub struct Cluster {
    kafka: Kafka,
    nodes: Vec<Node>,
    network: String,
    /// How long the cluster took to start and answer on every node.
    pub started_in: Duration,
}

static SHARED: OnceCell<std::result::Result<Cluster, String>> = OnceCell::const_new();

/// The three-node cluster shared by every test of this binary, started on first use.
///
/// # Panics
/// When the cluster cannot be started; the message says why.
pub async fn cluster() -> &'static Cluster {
    broker::shared(
        &SHARED,
        || Cluster::start(3),
        "no Kafka cluster for the tests",
    )
    .await
}

impl Cluster {
    /// Starts `nodes` combined broker-and-controller nodes on a new Docker network and
    /// waits until every one answers and a topic with three in-sync replicas takes writes.
    pub async fn start(nodes: usize) -> Result<Cluster> {
        let started = Instant::now();
        let image = broker::choose_image().await;
        let network = super::unique_name("onceflow-cluster");
        let names: Vec<String> = (1..=nodes).map(|i| format!("{network}-{i}")).collect();
        let voters = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{}@{name}:9093", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let replication = nodes.min(3).to_string();
        let min_isr = if nodes >= 3 { "2" } else { "1" };
        let mut started_nodes = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let id = i as i32 + 1;
            let (image, network, name, voters, replication) = (
                image.clone(),
                network.clone(),
                name.clone(),
                voters.clone(),
                replication.clone(),
            );
            let image_name = image.clone();
            let request = move |[port]: [u16; 1]| {
                broker::single_node(&image, "cluster")
                    .with_network(network.clone())
                    .with_container_name(name.clone())
                    .with_mapped_port(port, ContainerPort::Tcp(9092))
                    .with_env_var("KAFKA_NODE_ID", id.to_string())
                    .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", voters.clone())
                    .with_env_var(
                        "KAFKA_LISTENERS",
                        "PLAINTEXT://:9092,CONTROLLER://:9093,BROKER://:9094",
                    )
                    .with_env_var(
                        "KAFKA_ADVERTISED_LISTENERS",
                        format!("PLAINTEXT://127.0.0.1:{port},BROKER://{name}:9094"),
                    )
                    .with_env_var(
                        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,BROKER:PLAINTEXT",
                    )
                    .with_env_var("KAFKA_DEFAULT_REPLICATION_FACTOR", replication.clone())
                    .with_env_var("KAFKA_MIN_INSYNC_REPLICAS", min_isr)
                    .with_env_var(
                        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                        replication.clone(),
                    )
                    .with_env_var(
                        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                        replication.clone(),
                    )
                    .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", min_isr)
                    .with_env_var(
                        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS",
                        COORDINATOR_PARTITIONS.to_string(),
                    )
                    .with_env_var(
                        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS",
                        COORDINATOR_PARTITIONS.to_string(),
                    )
                    .with_env_var("KAFKA_HEAP_OPTS", "-Xmx512m -Xms256m")
            };
            let spawned = DOCKER
                .spawn(async move { broker::start_with_ports(&image_name, request).await })
                .await
                .map_err(|e| Error::Environment(format!("starting node {id}: {e}")))?;
            let (container, [port]) = spawned.map_err(|e| {
                Error::Environment(format!("could not start cluster node {id}: {e}"))
            })?;
            started_nodes.push(Node {
                id,
                container,
                port,
            });
        }
        let bootstrap = started_nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = Cluster {
            kafka: Kafka {
                options: ClientOptions::new(bootstrap),
                broker: Broker::External,
            },
            nodes: started_nodes,
            network,
            started_in: Duration::ZERO,
        };
        cluster.wait_healthy(broker::ready_timeout()?).await?;
        let started_in = started.elapsed();
        tracing::info!(
            nodes,
            ?started_in,
            bootstrap = cluster.bootstrap_servers(),
            "test cluster ready"
        );
        Ok(Cluster {
            started_in,
            ..cluster
        })
    }

    /// The cluster as a [`Kafka`] (topics, produce, read, offsets), bootstrapping from
    /// every node.
    pub fn kafka(&self) -> &Kafka {
        &self.kafka
    }

    /// `host:port,…` of every node.
    pub fn bootstrap_servers(&self) -> &str {
        self.kafka.bootstrap_servers()
    }

    /// The IDs of the nodes (1, 2, 3).
    pub fn node_ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Waits until every node answers for itself, lists every other one, and a topic
    /// with a replica on every node takes an `acks=all` write.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let replication = self.nodes.len().min(3).to_string();
        let mut last = String::new();
        // Nodes the last attempt found missing from a listing, or that did not answer at
        // all: their logs say why.
        let mut missing: Vec<i32> = Vec::new();
        while started.elapsed() < timeout {
            missing.clear();
            let attempt = async {
                for node in &self.nodes {
                    let options = ClientOptions::new(format!("127.0.0.1:{}", node.port));
                    let listed: Vec<i32> = match client::with_metadata(&options, None, |m| {
                        m.brokers().iter().map(|b| b.id()).collect()
                    })
                    .await
                    {
                        Ok(listed) => listed,
                        Err(error) => {
                            missing = vec![node.id];
                            return Err(Error::Environment(format!(
                                "node {} does not answer: {error}",
                                node.id
                            )));
                        }
                    };
                    if listed.len() < self.nodes.len() {
                        missing = self
                            .node_ids()
                            .into_iter()
                            .filter(|id| !listed.contains(id))
                            .collect();
                        return Err(Error::Environment(format!(
                            "node {} lists {} of {} nodes ({listed:?})",
                            node.id,
                            listed.len(),
                            self.nodes.len()
                        )));
                    }
                }
                let probe = "__onceflow_cluster_ready";
                let configs = [("replication.factor", replication.as_str())];
                match client::create_topic(
                    &self.kafka.options,
                    probe,
                    1,
                    &configs,
                    Duration::from_secs(10),
                )
                .await
                {
                    Err(error)
                        if error.code()
                            == Some(rdkafka::error::RDKafkaErrorCode::TopicAlreadyExists) => {}
                    other => other?,
                }
                let isr = self.in_sync(probe, 0).await?;
                if isr.len() < self.nodes.len() {
                    return Err(Error::Environment(format!(
                        "probe topic in sync on {isr:?} only"
                    )));
                }
                client::probe(&self.kafka.options, probe, Duration::from_secs(10)).await
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(error) => last = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // What the nodes that do not answer, or that the others do not list, were doing
        // (a restart still recovering its logs, a registration the controller refused, a
        // JVM starved of CPU): the next time this happens on a loaded machine, the failure
        // says why.
        let mut logs = String::new();
        for id in missing {
            logs.push_str(&format!(
                "\n--- node {id} ({}): its log, last 40 lines ---\n{}",
                self.container_state(id).await,
                self.log_tail(id, 40).await
            ));
        }
        logs.push_str(&format!("\n(load average: {})", load_average()));
        Err(Error::Environment(format!(
            "the cluster did not become healthy within {timeout:?}: {last}{logs}"
        )))
    }

    /// The node that leads partition `partition` of `topic`.
    pub async fn leader(&self, topic: &str, partition: i32) -> Result<i32> {
        let topic_name = topic.to_owned();
        let leader = client::with_metadata(&self.kafka.options, Some(topic), move |m| {
            m.topics()
                .iter()
                .find(|t| t.name() == topic_name)
                .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
                .map(|p| p.leader())
        })
        .await?;
        leader
            .filter(|id| *id >= 0)
            .ok_or_else(|| Error::Environment(format!("`{topic}` [{partition}] has no leader now")))
    }

    /// The nodes that hold a replica of partition `partition` of `topic` (in sync or not:
    /// its replication factor).
    pub async fn replicas(&self, topic: &str, partition: i32) -> Result<Vec<i32>> {
        self.nodes_of(topic, partition, |p| p.replicas().to_vec())
            .await
    }

    /// The nodes in sync for partition `partition` of `topic`.
    pub async fn in_sync(&self, topic: &str, partition: i32) -> Result<Vec<i32>> {
        self.nodes_of(topic, partition, |p| p.isr().to_vec()).await
    }

    /// Nodes `which` picks from the metadata of partition `partition` of `topic` (none
    /// when the partition is unknown).
    async fn nodes_of(
        &self,
        topic: &str,
        partition: i32,
        which: fn(&rdkafka::metadata::MetadataPartition) -> Vec<i32>,
    ) -> Result<Vec<i32>> {
        let topic_name = topic.to_owned();
        client::with_metadata(&self.kafka.options, Some(topic), move |m| {
            m.topics()
                .iter()
                .find(|t| t.name() == topic_name)
                .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
                .map(which)
                .unwrap_or_default()
        })
        .await
    }

    /// The node that coordinates the transactions of `transactional_id`.
    pub async fn transaction_coordinator(&self, transactional_id: &str) -> Result<i32> {
        self.leader(
            "__transaction_state",
            coordinator_partition(transactional_id),
        )
        .await
    }

    /// The node that coordinates consumer group `group`.
    pub async fn group_coordinator(&self, group: &str) -> Result<i32> {
        self.leader("__consumer_offsets", coordinator_partition(group))
            .await
    }

    /// Kills node `id` at once (SIGKILL: no shutdown, no flush); its data stays.
    pub async fn kill(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        docker("kill", move |docker| async move {
            let options = KillContainerOptions {
                signal: "SIGKILL".into(),
            };
            docker.kill_container(&container, Some(options)).await
        })
        .await
    }

    /// Starts a killed or stopped node `id` again, with its data.
    pub async fn start_node(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        docker("start", move |docker| async move {
            docker
                .start_container(&container, None::<StartContainerOptions>)
                .await
        })
        .await
    }

    /// The last `lines` lines node `id` wrote (its broker's log), or why there are none.
    pub async fn log_tail(&self, id: i32, lines: usize) -> String {
        let container = match self.container(id) {
            Ok(container) => container,
            Err(error) => return format!("(no log: {error})"),
        };
        let read = docker("read the log of", move |docker| async move {
            use futures_util::StreamExt;
            let options = LogsOptionsBuilder::new()
                .stdout(true)
                .stderr(true)
                .tail(&lines.to_string())
                .build();
            let mut stream = docker.logs(&container, Some(options));
            let mut text = String::new();
            while let Some(chunk) = stream.next().await {
                text.push_str(&chunk?.to_string());
            }
            Ok(text)
        })
        .await;
        read.unwrap_or_else(|error| format!("(no log: {error})"))
    }

    /// Stops node `id` cleanly (SIGTERM; it moves its leaderships away) and starts it
    /// again.
    pub async fn restart(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        docker("stop", move |docker| async move {
            let options = StopContainerOptions {
                t: Some(60),
                signal: None,
            };
            docker.stop_container(&container, Some(options)).await
        })
        .await?;
        self.start_node(id).await
    }

    /// Freezes node `id` (every request to it goes unanswered) until
    /// [`Cluster::unpause`].
    pub async fn pause(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        docker("pause", move |docker| async move {
            super::pause_with_retries(
                || docker.pause_container(&container),
                || docker.unpause_container(&container),
            )
            .await
        })
        .await
    }

    /// Lets a paused node go on.
    pub async fn unpause(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        docker("unpause", move |docker| async move {
            docker.unpause_container(&container).await
        })
        .await
    }

    /// Cuts node `id` off the cluster's network: from the other nodes and from clients
    /// (its host port goes through the same network) until [`Cluster::reconnect`].
    pub async fn disconnect(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        let network = self.network.clone();
        docker("disconnect", move |docker| async move {
            let request = NetworkDisconnectRequest {
                container,
                force: Some(true),
            };
            docker.disconnect_network(&network, request).await
        })
        .await
    }

    /// Puts a disconnected node back on the network (its name resolves again).
    pub async fn reconnect(&self, id: i32) -> Result<()> {
        let container = self.container(id)?;
        let network = self.network.clone();
        docker("reconnect", move |docker| async move {
            let request = NetworkConnectRequest {
                container,
                endpoint_config: None,
            };
            docker.connect_network(&network, request).await
        })
        .await
    }

    /// Cuts node `id` off the other nodes (replication, the controller quorum) while
    /// clients still reach it: every packet between it and a peer's address on the
    /// cluster's network is dropped, in its own network namespace, until
    /// [`Cluster::rejoin`]. The node goes on answering clients for partitions it can no
    /// longer replicate, as a broker behind a broken switch port does.
    pub async fn isolate(&self, id: i32) -> Result<()> {
        self.peer_rules(id, "-I").await
    }

    /// Lets an isolated node talk to its peers again.
    pub async fn rejoin(&self, id: i32) -> Result<()> {
        self.peer_rules(id, "-D").await
    }

    /// Adds (`-I`) or deletes (`-D`) the rules that drop traffic between node `id` and
    /// every other node.
    async fn peer_rules(&self, id: i32, action: &str) -> Result<()> {
        let (pid, _) = self.inspect(id).await?;
        for peer in self.nodes.iter().filter(|n| n.id != id) {
            let (_, address) = self.inspect(peer.id).await?;
            for (chain, direction) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
                let args = [action, chain, direction, address.as_str(), "-j", "DROP"];
                iptables_in(pid, args.iter().map(|a| (*a).to_owned()).collect()).await?;
            }
        }
        Ok(())
    }

    /// The process ID of node `id`'s container and its address on the cluster's network.
    async fn inspect(&self, id: i32) -> Result<(i64, String)> {
        let container = self.container(id)?;
        let network = self.network.clone();
        let inspected = docker("inspect", move |docker| async move {
            docker
                .inspect_container(&container, None::<InspectContainerOptions>)
                .await
        })
        .await?;
        let pid = inspected
            .state
            .and_then(|s| s.pid)
            .filter(|pid| *pid > 0)
            .ok_or_else(|| Error::Environment(format!("node {id} is not running")))?;
        let address = inspected
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut networks| networks.remove(&network))
            .and_then(|endpoint| endpoint.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| Error::Environment(format!("node {id} has no address on {network}")))?;
        Ok((pid, address))
    }

    /// What Docker says of node `id`'s container: its status and when it last started.
    async fn container_state(&self, id: i32) -> String {
        let container = match self.container(id) {
            Ok(container) => container,
            Err(error) => return format!("no state: {error}"),
        };
        let inspected = docker("inspect", move |docker| async move {
            docker
                .inspect_container(&container, None::<InspectContainerOptions>)
                .await
        })
        .await;
        match inspected.map(|i| i.state) {
            Ok(Some(state)) => format!(
                "{}, started at {}",
                state
                    .status
                    .map_or_else(|| "status unknown".to_owned(), |s| s.to_string()),
                state.started_at.unwrap_or_default()
            ),
            Ok(None) => "no state".to_owned(),
            Err(error) => format!("no state: {error}"),
        }
    }

    fn container(&self, id: i32) -> Result<String> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.container.clone())
            .ok_or_else(|| Error::Environment(format!("the cluster has no node {id}")))
    }

    /// [`Cluster::wait_healthy`] with the default healing time.
    pub async fn heal(&self) -> Result<()> {
        self.wait_healthy(HEAL_TIMEOUT).await
    }
}

/// Runs a Docker call on the testkit's runtime (the containers outlive any one test's).
async fn docker<T, F, Fut>(what: &'static str, call: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(Docker) -> Fut + Send + 'static,
    Fut: Future<Output = std::result::Result<T, testcontainers::bollard::errors::Error>> + Send,
{
    DOCKER
        .spawn(async move {
            let docker = Docker::connect_with_defaults()
                .map_err(|e| Error::Environment(format!("{what}: no Docker engine: {e}")))?;
            call(docker)
                .await
                .map_err(|e| Error::Environment(format!("{what} a cluster node: {e}")))
        })
        .await
        .map_err(|e| Error::Environment(format!("{what}: {e}")))?
}

/// Runs `iptables ARGS` in the network namespace of the process `pid` (a node's
/// container): the host's own `iptables`, entered with `nsenter`, so the image needs
/// neither the tool nor a capability. Needs root, as Docker itself does.
async fn iptables_in(pid: i64, args: Vec<String>) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new("nsenter")
            .arg("--target")
            .arg(pid.to_string())
            .arg("--net")
            .arg("iptables")
            .args(&args)
            .output()
            .map_err(|e| {
                Error::Environment(format!(
                    "nsenter iptables: {e} (needs util-linux and iptables)"
                ))
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Environment(format!(
                "iptables {} in the netns of {pid}: {} (cutting a node off its peers needs root)",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    })
    .await
    .map_err(|e| Error::Environment(format!("iptables: {e}")))?
}

/// The partition of `__transaction_state` or `__consumer_offsets` whose leader
/// coordinates `id`: Kafka's `Utils.abs(id.hashCode()) % partitions`, with Java's
/// `String.hashCode` over UTF-16 code units.
fn coordinator_partition(id: &str) -> i32 {
    let hash = id.encode_utf16().fold(0i32, |hash, unit| {
        hash.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % COORDINATOR_PARTITIONS
}

/// The machine's one-minute load average, as `/proc/loadavg` gives it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinators_are_found_by_javas_string_hash() {
        // What jshell (Java 17) prints for "billing".hashCode() and for a non-ASCII ID.
        assert_eq!(coordinator_partition("billing"), 109_829_509 % 4);
        assert_eq!(coordinator_partition("onceflow-txn-é"), 90_996_184 % 4);
        assert_eq!(coordinator_partition(""), 0);
    }
}
