//! A second, secured broker for the security tests: SASL_SSL (SCRAM-SHA-512) and mutual
//! TLS listeners, ACLs enforced, and a plaintext listener for the tests' own set-up.
//!
//! ```text
//!  host 127.0.0.1:<a> ─► SASL_SSL  :9092  SCRAM users alice, nowrite, notxn; PLAIN plainuser
//!                                         (random passwords)
//!  host 127.0.0.1:<b> ─► SSL       :9095  client certificate required (User:CN=onceflow-client)
//!  host 127.0.0.1:<c> ─► ADMIN     :9096  plaintext, User:ANONYMOUS, a super user: the tests' set-up
//!                        BROKER    :9094  plaintext, inside the container only
//! ```
//!
//! The certificates are generated per test binary ([`TestPki`]); the users and ACLs are
//! created after start through Kafka's Admin API by `SecureSetup.java`, run in the container.
//! Every user's rights are prefixed ACLs, so each test names its topics and group after
//! what it wants to be allowed:
//!
//! | principal | `sec-` topics and groups | `sec-` transactional IDs | `locked-` topics |
//! | --- | --- | --- | --- |
//! | `User:alice`, `User:plainuser`, `User:CN=onceflow-client` | all | all | none |
//! | `User:nowrite` | all | all | describe only |
//! | `User:notxn` | all | none | none |

use std::path::{Path, PathBuf};

use testcontainers::ImageExt;
use testcontainers::core::ContainerPort;
use tokio::sync::OnceCell;

use super::broker::{self, Broker, DOCKER};
use super::pki::TestPki;
use super::{Kafka, unique_name};
use crate::client::ClientOptions;
use crate::{Error, Result};

/// Prefix of the topics, groups and transactional IDs the test users may use.
pub const ALLOWED_PREFIX: &str = "sec-";
/// Prefix of topics `nowrite` may describe but not write.
pub const LOCKED_PREFIX: &str = "locked-";

/// A SASL user of the secured broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestUser {
    /// Everything on `sec-` topics, groups and transactional IDs.
    Alice,
    /// Like alice, but a SASL/PLAIN user (configured in the broker's JAAS settings).
    Plain,
    /// Like alice, plus describe (but not write) on `locked-` topics.
    NoWrite,
    /// Everything on `sec-` topics and groups, but no transactional-ID ACL.
    NoTransactionalId,
}

impl TestUser {
    const ALL: [TestUser; 4] = [
        TestUser::Alice,
        TestUser::Plain,
        TestUser::NoWrite,
        TestUser::NoTransactionalId,
    ];

    /// The user name (`sasl.username`); the principal is `User:<name>`.
    pub fn name(self) -> &'static str {
        match self {
            TestUser::Alice => "alice",
            TestUser::Plain => "plainuser",
            TestUser::NoWrite => "nowrite",
            TestUser::NoTransactionalId => "notxn",
        }
    }

    /// Its `sasl.mechanism`.
    pub fn mechanism(self) -> &'static str {
        match self {
            TestUser::Plain => "PLAIN",
            _ => "SCRAM-SHA-512",
        }
    }
}

/// The secured broker (see the module docs).
pub struct SecureKafka {
    admin: Kafka,
    sasl_ssl_port: u16,
    mtls_port: u16,
    pki: TestPki,
    files: PathBuf,
    passwords: Vec<(TestUser, String)>,
}

impl std::fmt::Debug for SecureKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureKafka")
            .field("admin", &self.admin)
            .field("sasl_ssl_port", &self.sasl_ssl_port)
            .field("mtls_port", &self.mtls_port)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl SecureKafka {
    /// The broker through its plaintext super-user listener: to create topics, produce
    /// input and read results, whatever the test users may do.
    pub fn admin(&self) -> &Kafka {
        &self.admin
    }

    /// `bootstrap.servers` of the SASL_SSL listener.
    pub fn sasl_ssl_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.sasl_ssl_port)
    }

    /// `bootstrap.servers` of the mutual-TLS listener.
    pub fn mtls_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.mtls_port)
    }

    /// The certificates (the CA, the broker's, the clients').
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }

    /// `user`'s password.
    pub fn password(&self, user: TestUser) -> &str {
        self.passwords
            .iter()
            .find(|(u, _)| *u == user)
            .map(|(_, password)| password.as_str())
            .expect("every test user has a password")
    }

    /// The CA certificate as a file (`ssl.ca.location`).
    pub fn ca_file(&self) -> PathBuf {
        self.files.join("ca.pem")
    }

    /// The trusted client certificate and key as files (`ssl.certificate.location`,
    /// `ssl.key.location`).
    pub fn client_files(&self) -> (PathBuf, PathBuf) {
        (self.files.join("client.pem"), self.files.join("client.key"))
    }

    /// The untrusted client certificate and key as files.
    pub fn untrusted_client_files(&self) -> (PathBuf, PathBuf) {
        (
            self.files.join("untrusted.pem"),
            self.files.join("untrusted.key"),
        )
    }

    /// The properties of a mutual-TLS client presenting `certificate` (its key is left
    /// to the caller: `ssl.key.location` or `ssl.key.pem`).
    pub fn mtls_properties(&self, certificate: &Path) -> Vec<(String, String)> {
        vec![
            ("security.protocol".into(), "SSL".into()),
            (
                "ssl.ca.location".into(),
                self.ca_file().display().to_string(),
            ),
            (
                "ssl.certificate.location".into(),
                certificate.display().to_string(),
            ),
        ]
    }

    /// The properties of a SASL client (SCRAM-SHA-512, or PLAIN for [`TestUser::Plain`])
    /// over SASL_SSL, as `user` with `password`.
    pub fn sasl_properties(&self, user: TestUser, password: &str) -> Vec<(String, String)> {
        vec![
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanism".into(), user.mechanism().into()),
            ("sasl.username".into(), user.name().into()),
            ("sasl.password".into(), password.into()),
            (
                "ssl.ca.location".into(),
                self.ca_file().display().to_string(),
            ),
        ]
    }
}

static SECURE: OnceCell<std::result::Result<SecureKafka, String>> = OnceCell::const_new();

/// The secured broker shared by every test of this binary, started on first use (it is
/// always a container: `ONCEFLOW_TEST_BOOTSTRAP` does not apply).
///
/// # Panics
/// When it cannot be started; the message says why and ends with its log.
pub async fn secure_kafka() -> &'static SecureKafka {
    broker::shared(&SECURE, start, "no secured Kafka broker for the tests").await
}

async fn start() -> Result<SecureKafka> {
    let timeout = broker::ready_timeout()?;
    let pki = TestPki::generate()?;
    let files = write_files(&pki)?;
    broker::remove_at_exit(files.clone()).await;
    let passwords: Vec<(TestUser, String)> = TestUser::ALL
        .iter()
        .map(|user| (*user, unique_name("pw").replace('-', "")))
        .collect();
    let container_pki = pki.clone();
    let plain = passwords
        .iter()
        .find(|(user, _)| *user == TestUser::Plain)
        .map(|(_, password)| password.clone())
        .unwrap_or_default();
    let (id, [sasl_ssl_port, mtls_port, admin_port]) = DOCKER
        .spawn(async move { start_container(&container_pki, &plain).await })
        .await
        .map_err(|e| Error::Environment(format!("starting the secured container: {e}")))??;
    let admin = Kafka {
        options: ClientOptions::new(format!("127.0.0.1:{admin_port}")),
        broker: Broker::Container { id: id.clone() },
    };
    broker::wait_ready(&admin, timeout).await?;
    let setup_id = id.clone();
    let setup_passwords = passwords.clone();
    let output = DOCKER
        .spawn(async move { create_users_and_acls(&setup_id, &setup_passwords).await })
        .await
        .map_err(|e| Error::Environment(format!("setting up users and ACLs: {e}")))?;
    if let Err(error) = output {
        return Err(Error::Environment(format!(
            "{error}\n--- broker log (last 40 lines) ---\n{}",
            admin.log_tail(40).await
        )));
    }
    Ok(SecureKafka {
        admin,
        sasl_ssl_port,
        mtls_port,
        pki,
        files,
        passwords,
    })
}

/// The PEM files clients use, in a fresh directory only this user can read.
fn write_files(pki: &TestPki) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = std::env::temp_dir().join(unique_name("onceflow-test-pki"));
    let io =
        |path: &Path, e: std::io::Error| Error::Environment(format!("{}: {e}", path.display()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| io(&dir, e))?;
    let contents = [
        ("ca.pem", &pki.ca_certificate),
        ("client.pem", &pki.client.certificate),
        ("client.key", &pki.client.private_key),
        ("untrusted.pem", &pki.untrusted_client.certificate),
        ("untrusted.key", &pki.untrusted_client.private_key),
    ];
    for (name, text) in contents {
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|e| io(&path, e))?;
    }
    Ok(dir)
}

const CERTS: &str = "/etc/onceflow-tls";
const SETUP: &str = "/opt/kafka/SecureSetup.java";

/// Starts the container; returns its ID and the host ports of the SASL_SSL, mutual-TLS
/// and admin listeners.
async fn start_container(pki: &TestPki, plain_password: &str) -> Result<(String, [u16; 3])> {
    let image = broker::choose_image().await;
    let broker_pem = format!("{}{}", pki.broker.private_key, pki.broker.certificate);
    broker::start_with_ports(&image, |[sasl_ssl, mtls, admin]| {
        broker::single_node(&image, "secure-broker")
            .with_mapped_port(sasl_ssl, ContainerPort::Tcp(9092))
            .with_mapped_port(mtls, ContainerPort::Tcp(9095))
            .with_mapped_port(admin, ContainerPort::Tcp(9096))
            .with_copy_to(
                format!("{CERTS}/broker.pem"),
                broker_pem.clone().into_bytes(),
            )
            .with_copy_to(
                format!("{CERTS}/ca.pem"),
                pki.ca_certificate.clone().into_bytes(),
            )
            .with_copy_to(SETUP, include_str!("SecureSetup.java").as_bytes().to_vec())
            .with_env_var(
                "KAFKA_LISTENERS",
                "SASL_SSL://:9092,CONTROLLER://:9093,BROKER://:9094,SSL://:9095,ADMIN://:9096",
            )
            .with_env_var(
                "KAFKA_ADVERTISED_LISTENERS",
                format!(
                    "SASL_SSL://127.0.0.1:{sasl_ssl},BROKER://localhost:9094,\
                     SSL://127.0.0.1:{mtls},ADMIN://127.0.0.1:{admin}"
                ),
            )
            .with_env_var(
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,BROKER:PLAINTEXT,SSL:SSL,ADMIN:PLAINTEXT",
            )
            .with_env_var(
                "KAFKA_AUTHORIZER_CLASS_NAME",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            )
            // The plaintext listeners (controller, inter-broker, the tests' set-up) have
            // no authentication, so their principal is ANONYMOUS; nothing else is.
            .with_env_var("KAFKA_SUPER_USERS", "User:ANONYMOUS")
            .with_env_var("KAFKA_SASL_ENABLED_MECHANISMS", "SCRAM-SHA-512,PLAIN")
            .with_env_var(
                "KAFKA_LISTENER_NAME_SASL__SSL_PLAIN_SASL_JAAS_CONFIG",
                format!(
                    "org.apache.kafka.common.security.plain.PlainLoginModule required \
                     user_{}=\"{plain_password}\";",
                    TestUser::Plain.name()
                ),
            )
            .with_env_var(
                "KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG",
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            )
            .with_env_var("KAFKA_SSL_KEYSTORE_TYPE", "PEM")
            .with_env_var("KAFKA_SSL_KEYSTORE_LOCATION", format!("{CERTS}/broker.pem"))
            .with_env_var("KAFKA_SSL_TRUSTSTORE_TYPE", "PEM")
            .with_env_var("KAFKA_SSL_TRUSTSTORE_LOCATION", format!("{CERTS}/ca.pem"))
            .with_env_var("KAFKA_LISTENER_NAME_SSL_SSL_CLIENT_AUTH", "required")
    })
    .await
    .map_err(|last_error| {
        Error::Environment(format!(
            "could not start the secured Kafka container from `{image}`: {last_error}"
        ))
    })
}

/// Runs `SecureSetup.java` in the container: the SCRAM users and the ACLs of the table
/// in the module docs.
async fn create_users_and_acls(id: &str, passwords: &[(TestUser, String)]) -> Result<()> {
    let mut lines: Vec<String> = passwords
        .iter()
        .filter(|(user, _)| user.mechanism().starts_with("SCRAM"))
        .map(|(user, password)| format!("scram {} {password}", user.name()))
        .collect();
    let mtls = format!("User:CN={}", super::pki::CLIENT_COMMON_NAME);
    let everything = [
        "User:alice",
        "User:plainuser",
        mtls.as_str(),
        "User:nowrite",
    ];
    for principal in everything.iter().chain(["User:notxn"].iter()) {
        for resource in ["TOPIC", "GROUP"] {
            lines.push(format!(
                "acl {principal} {resource} {ALLOWED_PREFIX} PREFIXED ALL"
            ));
        }
    }
    for principal in everything {
        lines.push(format!(
            "acl {principal} TRANSACTIONAL_ID {ALLOWED_PREFIX} PREFIXED ALL"
        ));
    }
    for operation in ["DESCRIBE", "DESCRIBE_CONFIGS"] {
        lines.push(format!(
            "acl User:nowrite TOPIC {LOCKED_PREFIX} PREFIXED {operation}"
        ));
    }
    // Through `sh`, so the exit status arrives on stdout (see `broker::exec`).
    let mut command = vec![
        "sh".to_owned(),
        "-c".into(),
        "java -Xmx256m -XX:TieredStopAtLevel=1 \
         -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
         -cp '/opt/kafka/libs/*' \"$0\" \"$@\" 2>&1; echo \"onceflow-setup-exit=$?\""
            .into(),
        SETUP.into(),
        // The inter-broker listener: advertised as localhost:9094, which works in here.
        "localhost:9094".into(),
    ];
    command.extend(lines);
    let output = broker::exec(id, command)
        .await
        .map_err(|e| Error::Environment(format!("running SecureSetup.java: {e}")))?;
    if output.contains("onceflow-setup-exit=0") {
        return Ok(());
    }
    Err(Error::Environment(format!(
        "SecureSetup.java failed:\n{output}"
    )))
}
